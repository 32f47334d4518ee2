"""Where a solver iteration's time goes: dslash, halo, reductions and vector updates.

A ``Phases`` cuts one timeline into consecutive segments: ``mark(label)`` ends the running segment and starts
one called ``label``, so the segments add up to the whole time, idle gaps included (a gap belongs to the
phase that caused it: the stream waiting for a halo is halo time). The operator and the solver mark:

=============  ================================================================================================
``dslash``     the hop kernels (interior, exterior and the faces they emit for the next hop)
``halo``       ``start()`` to the interior, and from the interior's end until the ghosts have arrived
               (``wait()``); on the cpu back-end also the projection of faces into the send array
``reduction``  the local parts of dot products and norms and their global sums over ranks
``vector``     the vector updates (x, r, p) and precision conversions
=============  ================================================================================================

The host clock (``HostPhases``) serves the cpu back-end; the cuda module marks with CUDA events on the
stream instead (``_cuda.EventPhases``), so its split is the GPU's timeline, not the host's waits.
"""

from __future__ import annotations

import time

PHASES = ("dslash", "halo", "reduction", "vector")


class NoPhases:
    """What an operator has until someone asks for the split: marks cost nothing."""

    enabled = False

    def mark(self, label: str | None) -> None:
        pass

    def totals(self) -> dict[str, float]:
        return dict.fromkeys(PHASES, 0.0)


NO_PHASES = NoPhases()


class HostPhases:
    """Segments on the host clock (``time.perf_counter``)."""

    enabled = True

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._label: str | None = None
        self._since = 0.0

    def mark(self, label: str | None) -> None:
        now = time.perf_counter()
        if self._label is not None:
            self.seconds[self._label] += now - self._since
        self._label, self._since = label, now

    def totals(self) -> dict[str, float]:
        """Seconds per phase so far (the running segment is closed)."""
        self.mark(None)
        return dict(self.seconds)
