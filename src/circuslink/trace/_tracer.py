"""The host object of the tracer: owns each rank's ring, hands kernels their handle,
synchronises clocks and collects everything into one :class:`~circuslink.trace.Trace`.

What differs by back-end (where the ring lives, who records, how clocks are exchanged) is the
back-end module: ``world.backend_module("circuslink.trace")`` gives ``trace/_cpu.py`` or ``trace/_cuda.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from .._lifecycle import Resource
from .._wait import Deadline
from ..errors import ConfigError
from . import _layout as L
from ._model import Trace, TraceMeta, merge, timer_tick

DEFAULT_CAPACITY = 1 << 16  # records per rank: 1 MiB


class Tracer(Resource):
    """Per-rank event rings plus the clock model that merges them. Collective to create and to close.

    Where kernels run (cuda) they record through :meth:`device_handle` (see
    ``circuslink/trace.cuh``); on the cpu back-end Python code records with
    :meth:`instant`, :meth:`begin` / :meth:`end` or :meth:`span`, with the same event ids
    and the same record layout. :meth:`collect` (collective) returns the merged trace.
    ``close()`` (collective) frees the ring and the clock-sync buffer; ``with`` closes it.

    ``names`` names user events: ``{circuslink.trace.USER + 0: "stencil", ...}``. ``timeout`` bounds
    the clock sync made here (seconds; default CIRCUSLINK_TIMEOUT).
    """

    _kind = "tracer"

    def __init__(
        self,
        world: Any,
        capacity: int = DEFAULT_CAPACITY,
        names: Mapping[int, str] | None = None,
        timeout: float | None = None,
        _clock_ns: Callable[[], int] | None = None,  # tests skew the cpu clock through this
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or not 1 <= capacity <= 1 << 31:
            raise ConfigError(f"Tracer capacity must be an integer in 1..2**31 records, got {capacity!r}")
        for eid, nm in (names or {}).items():
            if not isinstance(eid, int) or not 0 < eid <= L.MAX_EVENT or not isinstance(nm, str) or not nm:
                raise ConfigError(
                    f"Tracer names: {eid!r}: {nm!r} must map an event id in 1..{L.MAX_EVENT} to a name"
                )
        self.world = world
        self.capacity = int(capacity)
        self.names = dict(names or {})
        self.last: Trace | None = None
        self._impl = world.backend_module("circuslink.trace").Recorder(world, self.capacity, _clock_ns)
        try:
            self._samples = [self._impl.sync(Deadline.after(timeout))]
        except BaseException:
            self._impl.release_local()
            raise
        self._register(world)

    # -- device side ------------------------------------------------------------------------
    def device_handle(self) -> np.void:
        """The ``circuslink::trace::Handle`` to pass to a kernel (a 24-byte numpy struct,
        which CuPy passes by value)."""
        self._check_open("device_handle")
        return self._impl.device_handle()

    @staticmethod
    def null_handle() -> np.void:
        """A handle that records nothing (kernels that take a handle run untraced)."""
        return L.HANDLE.pack()

    # -- host side (cpu back-end) -----------------------------------------------------------
    def record(self, event: int, phase: int = L.PHASE_INSTANT, arg: int = 0, block: int = 0) -> None:
        """Record one event now (cpu back-end); drops and counts when the ring is full."""
        self._check_open("record")
        if not 0 < event <= L.MAX_EVENT or phase not in (L.PHASE_INSTANT, L.PHASE_BEGIN, L.PHASE_END):
            raise ConfigError(
                f"trace event {event} / phase {phase} out of range (event 1..{L.MAX_EVENT}, phase 0..2)"
            )
        self._impl.record(event, phase, arg, block)

    def instant(self, event: int, arg: int = 0, block: int = 0) -> None:
        self.record(event, L.PHASE_INSTANT, arg, block)

    def begin(self, event: int, arg: int = 0, block: int = 0) -> None:
        self.record(event, L.PHASE_BEGIN, arg, block)

    def end(self, event: int, arg: int = 0, block: int = 0) -> None:
        self.record(event, L.PHASE_END, arg, block)

    @contextmanager
    def span(self, event: int, arg: int = 0, block: int = 0) -> Iterator[None]:
        """``with tracer.span(circuslink.trace.RECV, channel_id): ...``"""
        self.begin(event, arg, block)
        try:
            yield
        finally:
            self.end(event, arg, block)

    # -- both ---------------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Events of this rank that did not fit in the ring so far."""
        self._check_open("dropped")
        return max(0, self._impl.local()[1] - self.capacity)

    def reset(self) -> None:
        """Forget this rank's recorded events (not collective). Where kernels record, call it
        between kernels, not while one that records is running."""
        self._check_open("reset")
        self._impl.reset()

    def collect(self, timeout: float | None = None) -> Trace:
        """Collective: re-synchronise clocks, gather every rank's events and merge them on
        rank 0's time base. Every rank gets the same :class:`Trace` (also kept in ``last``).
        ``timeout`` bounds every wait of the call together."""
        self._check_open("collect")
        deadline = Deadline.after(timeout)
        self._samples.append(self._impl.sync(deadline))
        raw, attempted = self._impl.local()
        everyone = self.world.allgather_object((raw.tobytes(), attempted, self.names), deadline)
        per_rank = [np.frombuffer(b, dtype=L.RECORD_DTYPE) for b, _, _ in everyone]
        # Each rank's own view of its offset is what counts; samples[0] is rank 0's list
        # computed identically on every rank, so any rank's copy will do.
        clock = {r: [s[r] for s in self._samples] for r in range(self.world.size)}
        names: dict[int, str] = {}
        for _, _, n in everyone:
            names.update(n)
        events, t0 = merge(per_rank, clock)
        meta = TraceMeta(
            nranks=self.world.size,
            dropped={r: max(0, a - self.capacity) for r, (_, a, _) in enumerate(everyone)},
            clock=clock,
            t0_ns=t0,
            tick_ns={r: timer_tick(recs["time_ns"]) for r, recs in enumerate(per_rank)},
        )
        self.last = Trace(events, meta, names)
        return self.last

    def _need_trace(self) -> Trace:
        if self.last is None:
            raise ConfigError(
                "no trace collected yet: call tracer.collect() on every rank first (it is collective)"
            )
        return self.last

    def export_chrome(self, path: str) -> str:
        """Chrome / Perfetto JSON of the last collected trace."""
        return self._need_trace().export_chrome(path)

    def plot_waveform(self, path: str, title: str | None = None) -> str:
        """PNG waveform of the last collected trace."""
        return self._need_trace().plot_waveform(path, title=title)

    def overlap_fraction(self, rank: int, a_events: Any, b_events: Any, gap_ns: int | None = None) -> float:
        """:meth:`Trace.overlap_fraction` of the last collected trace."""
        return self._need_trace().overlap_fraction(rank, a_events, b_events, gap_ns)

    # -- lifecycle (circuslink._lifecycle) ---------------------------------------------------------
    def _close(self, timeout: float | None) -> None:
        self._impl.close(timeout)

    def _release_local(self) -> None:
        self._impl.release_local()
