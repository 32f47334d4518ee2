"""The host object of the tracer: owns each rank's ring, hands kernels their handle,
synchronises clocks and collects everything into one :class:`~circuslink.trace.Trace`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import ConfigError
from . import _layout as L
from ._clock import CpuClockSync, CudaClockSync
from ._model import Trace, TraceMeta, merge, timer_tick

DEFAULT_CAPACITY = 1 << 16  # records per rank: 1 MiB


class Tracer:
    """Per-rank event rings plus the clock model that merges them. Collective to create.

    On the cuda back-end kernels record through :meth:`device_handle` (see
    ``circuslink/trace.cuh``); on the cpu back-end Python code records with
    :meth:`instant`, :meth:`begin` / :meth:`end` or :meth:`span`, with the same event ids
    and the same record layout. :meth:`collect` (collective) returns the merged trace.

    ``names`` names user events: ``{circuslink.trace.USER + 0: "stencil", ...}``.
    """

    def __init__(
        self,
        world: Any,
        capacity: int = DEFAULT_CAPACITY,
        names: Mapping[int, str] | None = None,
        timeout: float | None = None,
        _clock_ns: Callable[[], int] | None = None,  # tests skew the cpu clock through this
    ) -> None:
        if not isinstance(capacity, int | np.integer) or not 1 <= capacity <= 1 << 31:
            raise ConfigError(f"Tracer capacity must be an integer in 1..2**31 records, got {capacity!r}")
        for eid, nm in (names or {}).items():
            if not isinstance(eid, int) or not 0 < eid <= L.MAX_EVENT or not isinstance(nm, str) or not nm:
                raise ConfigError(
                    f"Tracer names: {eid!r}: {nm!r} must map an event id in 1..{L.MAX_EVENT} to a name"
                )
        self.world = world
        self.capacity = int(capacity)
        self.names = dict(names or {})
        self.backend = world.backend.name
        self.last: Trace | None = None
        if self.backend == "cuda":
            import cupy as cp

            self._records = cp.zeros(self.capacity * 2, dtype=cp.uint64)  # 16 B each, 16-B aligned
            self._cursor = cp.zeros(1, dtype=cp.uint64)
            self._clock = CudaClockSync(world)
        else:
            self._records = np.zeros(self.capacity, dtype=L.RECORD_DTYPE)
            self._cursor = 0
            self._clock_ns = _clock_ns or time.perf_counter_ns
            self._clock = CpuClockSync(world, self._clock_ns)
        self._samples = [self._clock.sync(timeout)]

    # -- device side ------------------------------------------------------------------------
    def device_handle(self) -> np.void:
        """The ``circuslink::trace::Handle`` to pass to a kernel (a 24-byte numpy struct,
        which cupy passes by value)."""
        if self.backend != "cuda":
            raise ConfigError(
                "device_handle() is for kernels on the cuda back-end; on cpu record with instant/begin/end"
            )
        h = np.zeros((), dtype=L.HANDLE_DTYPE)
        h["records"] = self._records.data.ptr
        h["cursor"] = self._cursor.data.ptr
        h["capacity"] = self.capacity
        h["rank"] = self.world.rank
        return h[()]

    @staticmethod
    def null_handle() -> np.void:
        """A handle that records nothing (kernels that take a handle run untraced)."""
        return np.zeros((), dtype=L.HANDLE_DTYPE)[()]

    # -- host side (cpu back-end) -----------------------------------------------------------
    def record(self, event: int, phase: int = L.PHASE_INSTANT, arg: int = 0, block: int = 0) -> None:
        """Record one event now (cpu back-end); drops and counts when the ring is full."""
        if self.backend == "cuda":
            raise ConfigError("on the cuda back-end events are recorded by kernels through device_handle()")
        if not 0 < event <= L.MAX_EVENT or phase not in (L.PHASE_INSTANT, L.PHASE_BEGIN, L.PHASE_END):
            raise ConfigError(
                f"trace event {event} / phase {phase} out of range (event 1..{L.MAX_EVENT}, phase 0..2)"
            )
        t = self._clock_ns()
        slot = self._cursor
        self._cursor += 1
        if slot < self.capacity:
            self._records[slot] = (t, event | (phase << L.PHASE_SHIFT), min(block, 0xFFFF), arg & 0xFFFFFFFF)

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
    def _local(self) -> tuple[np.ndarray, int]:
        """This rank's kept records (ring order) and how many were attempted."""
        if self.backend == "cuda":
            self.world.backend.synchronize()
            attempted = int(self._cursor.get()[0])
            kept = min(attempted, self.capacity)
            raw = self._records[: 2 * kept].get().view(L.RECORD_DTYPE)
            return raw.copy(), attempted
        kept = min(self._cursor, self.capacity)
        return self._records[:kept].copy(), self._cursor

    @property
    def dropped(self) -> int:
        """Events of this rank that did not fit in the ring so far."""
        return max(0, self._local()[1] - self.capacity)

    def reset(self) -> None:
        """Forget this rank's recorded events (not collective). On cuda, call it between
        kernels, not while one that records is running."""
        if self.backend == "cuda":
            self.world.backend.synchronize()
            self._cursor.fill(0)
            self.world.backend.synchronize()
        else:
            self._cursor = 0

    def collect(self, timeout: float | None = None) -> Trace:
        """Collective: re-synchronise clocks, gather every rank's events and merge them on
        rank 0's time base. Every rank gets the same :class:`Trace` (also kept in ``last``)."""
        self._samples.append(self._clock.sync(timeout))
        raw, attempted = self._local()
        everyone = self.world.allgather_object((raw.tobytes(), attempted, self.names), timeout)
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

    def close(self) -> None:
        """Collective: free the clock-sync buffer."""
        self._clock.close()
