"""A merged trace of the whole job: events of every rank on one time base.

:class:`Trace` is what :meth:`Tracer.collect` returns. It pairs begin/end records into
spans, turns events into activity intervals (a waveform), measures how much two kinds of
activity overlap, and exports Chrome / Perfetto JSON. It can also be built from synthetic
records (:meth:`Trace.from_records`), which is how the tests pin its behaviour down.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from . import _layout as L

EventSpec = int | str


@dataclass(frozen=True)
class ClockSample:
    """One clock-sync measurement of a rank: at local time ``local_ns`` its clock read
    ``offset_ns`` more than the reference clock (rank 0's), give or take ``residual_ns``."""

    local_ns: int
    offset_ns: int
    residual_ns: int


@dataclass
class _Span:
    rank: int
    event: int
    arg: int
    block: int
    start: int
    end: int  # == start for an instant
    paired: bool  # a begin/end span (possibly shorter than the timer's tick), not an instant


@dataclass
class TraceMeta:
    """What the merge knows about its own accuracy and completeness."""

    nranks: int
    dropped: dict[int, int] = field(default_factory=dict)  # events that did not fit, per rank
    clock: dict[int, list[ClockSample]] = field(default_factory=dict)
    unmatched: int = 0  # begin without end or end without begin (dropped from spans)
    t0_ns: int = 0  # reference-clock time of the earliest event (time 0 of the trace)
    tick_ns: dict[int, int] = field(default_factory=dict)  # timer resolution seen per rank (1 if unknown)

    def tick(self, rank: int) -> int:
        """The resolution of ``rank``'s timestamps: the gcd of the steps between its distinct raw
        timestamps (128 ns or 1 us on GPUs whose %globaltimer is coarse, 1 ns on cpu)."""
        return max(1, int(self.tick_ns.get(rank, 1)))

    def residual_ns(self, rank: int) -> int:
        """Bound on the alignment error of ``rank``'s timestamps (0 for the reference)."""
        samples = self.clock.get(rank) or []
        return max((s.residual_ns for s in samples), default=0)


def _offset_at(samples: Sequence[ClockSample], local: np.ndarray) -> np.ndarray:
    """Offset of a rank's clock at each local time: linear between sync samples, which
    removes a constant drift between them; constant beyond the first and last."""
    if not samples:
        return np.zeros(local.shape, dtype=np.int64)
    xs = np.array([s.local_ns for s in samples], dtype=np.float64)
    ys = np.array([s.offset_ns for s in samples], dtype=np.float64)
    order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    if len(xs) == 1 or np.all(xs == xs[0]):
        return np.full(local.shape, int(round(ys.mean())), dtype=np.int64)
    return np.rint(np.interp(local.astype(np.float64), xs, ys)).astype(np.int64)


def timer_tick(times: np.ndarray) -> int:
    """The timer resolution evident in raw timestamps of one clock: the gcd of the steps between
    distinct values (exact for a quantised timer; 1 when fewer than two distinct values)."""
    steps = np.diff(np.unique(np.asarray(times, dtype=np.int64)))
    return max(1, int(np.gcd.reduce(steps))) if len(steps) else 1


def merge(
    raw: Sequence[np.ndarray], clock: Mapping[int, Sequence[ClockSample]] | None = None
) -> tuple[np.ndarray, int]:
    """Records of every rank (``raw[r]``, :data:`RECORD_DTYPE`, in ring order) -> one array of
    :data:`EVENT_DTYPE` on rank 0's clock, sorted by time, 0 = the earliest event.

    Returns ``(events, t0_ns)`` where ``t0_ns`` is the reference-clock time of that 0.
    """
    clock = clock or {}
    parts = []
    for rank, recs in enumerate(raw):
        recs = np.asarray(recs)
        if recs.dtype != L.RECORD_DTYPE:
            raise ConfigError(
                f"trace records of rank {rank} have dtype {recs.dtype}, expected {L.RECORD_DTYPE}"
            )
        ev = np.zeros(len(recs), dtype=L.EVENT_DTYPE)
        local = recs["time_ns"].astype(np.int64)
        ev["rank"] = rank
        ev["time_ns"] = local - _offset_at(clock.get(rank, ()), local)
        ev["event"] = recs["event"] & L.MAX_EVENT
        ev["phase"] = recs["event"] >> L.PHASE_SHIFT
        ev["block"] = recs["block"]
        ev["arg"] = recs["arg"]
        parts.append(ev)
    events = np.concatenate(parts) if parts else np.zeros(0, dtype=L.EVENT_DTYPE)
    # Stable: records of one rank with equal timestamps keep their ring (i.e. issue) order,
    # which matters when the timer is coarser than the gap between a begin and its end.
    order = np.argsort(events["time_ns"], kind="stable")
    events = events[order]
    t0 = int(events["time_ns"][0]) if len(events) else 0
    events["time_ns"] -= t0
    return events, t0


def union_intervals(intervals: Iterable[Sequence[float]]) -> np.ndarray:
    """Sorted, disjoint union of [start, end] intervals, as an (n, 2) int64 array."""
    iv = np.array([(int(a), int(b)) for a, b in intervals], dtype=np.int64).reshape(-1, 2)
    if len(iv) == 0:
        return iv
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    out = [list(iv[0])]
    for a, b in iv[1:]:
        if a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out, dtype=np.int64)


def _total(iv: np.ndarray) -> int:
    return int((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0


def _intersection(a: np.ndarray, b: np.ndarray) -> int:
    """Total length of the intersection of two disjoint sorted interval lists."""
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        lo = max(a[i, 0], b[j, 0])
        hi = min(a[i, 1], b[j, 1])
        if hi > lo:
            total += int(hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def interval_overlap_fraction(a: Iterable[Sequence[float]], b: Iterable[Sequence[float]]) -> float:
    """|A intersect B| / |A union B| of two sets of intervals (0.0 when both are empty)."""
    ua, ub = union_intervals(a), union_intervals(b)
    union = _total(union_intervals(list(map(tuple, ua)) + list(map(tuple, ub))))
    return _intersection(ua, ub) / union if union else 0.0


def _default_gap(times: np.ndarray, tick: int = 1) -> int:
    """Instants closer than this belong to one burst of activity: 4 x the median spacing of their
    distinct timestamps, and at least one timer tick. Distinct, because a timer coarser than the
    events (%globaltimer ticks 128 ns to 1 us on H100/H200) stamps many of them alike: the median
    of all the steps is then 0 and every burst would collapse to nothing."""
    distinct = np.unique(times)
    if len(distinct) < 2:
        return tick if len(times) >= 2 else 0
    return max(int(tick), int(4 * np.median(np.diff(distinct))))


def _bursts(instants: np.ndarray, gap: int, tick: int) -> list[tuple[int, int]]:
    """Runs of instants at most ``gap`` apart -> [first, last]. A run of two or more instants that
    all carry one timestamp happened within one tick: it is [t, t + tick], not nothing. A lone
    instant is no activity."""
    runs: list[list[int]] = []  # [first, last, count]
    for t in np.sort(instants):
        if runs and t - runs[-1][1] <= gap:
            runs[-1][1] = int(t)
            runs[-1][2] += 1
        else:
            runs.append([int(t), int(t), 1])
    out = []
    for a, b, n in runs:
        if n >= 2:
            out.append((a, b if b > a else a + tick))
    return out


class Trace:
    """Events of every rank on one time base (ns since the earliest event)."""

    def __init__(self, events: np.ndarray, meta: TraceMeta, names: Mapping[int, str] | None = None) -> None:
        self.events = events
        self.meta = meta
        self.names: dict[int, str] = dict(L.BUILTIN_NAMES)
        self.names.update(names or {})
        self._spans = self._pair()

    @classmethod
    def from_records(
        cls,
        raw: Sequence[np.ndarray],
        clock: Mapping[int, Sequence[ClockSample]] | None = None,
        names: Mapping[int, str] | None = None,
        dropped: Mapping[int, int] | None = None,
    ) -> Trace:
        """Merge per-rank records (as the device wrote them) into a Trace."""
        events, t0 = merge(raw, clock)
        meta = TraceMeta(
            nranks=len(raw),
            dropped=dict(dropped or {}),
            clock={r: list(s) for r, s in (clock or {}).items()},
            t0_ns=t0,
            tick_ns={r: timer_tick(np.asarray(recs)["time_ns"]) for r, recs in enumerate(raw)},
        )
        return cls(events, meta, names)

    # -- names ----------------------------------------------------------------------------
    def name(self, event: int) -> str:
        if event in self.names:
            return self.names[event]
        return f"user{event - L.USER}" if event >= L.USER else f"event{event}"

    def _event_id(self, spec: EventSpec) -> int:
        if isinstance(spec, int | np.integer):
            return int(spec)
        for eid, nm in self.names.items():
            if nm == spec:
                return eid
        if isinstance(spec, str) and spec.startswith("user") and spec[4:].isdigit():
            return L.USER + int(spec[4:])
        known = ", ".join(sorted(set(self.names.values())))
        raise ConfigError(f"unknown trace event {spec!r} (known: {known}, or an integer id)")

    def _event_ids(self, specs: EventSpec | Iterable[EventSpec]) -> set[int]:
        if isinstance(specs, int | str | np.integer):
            specs = [specs]
        return {self._event_id(s) for s in specs}

    # -- spans ----------------------------------------------------------------------------
    def _pair(self) -> list[_Span]:
        """Begin/end records -> spans (per rank, event, arg, block; nested ones LIFO);
        instants -> zero-length spans. Unmatched records are counted, not guessed at."""
        open_: dict[tuple[int, int, int, int], list[int]] = {}
        spans: list[_Span] = []
        unmatched = 0
        for e in self.events:
            rank, ev, phase = int(e["rank"]), int(e["event"]), int(e["phase"])
            block, arg, t = int(e["block"]), int(e["arg"]), int(e["time_ns"])
            key = (rank, ev, arg, block)
            if phase == L.PHASE_BEGIN:
                open_.setdefault(key, []).append(t)
            elif phase == L.PHASE_END:
                stack = open_.get(key)
                if stack:
                    spans.append(_Span(rank, ev, arg, block, stack.pop(), t, True))
                else:
                    unmatched += 1
            else:
                spans.append(_Span(rank, ev, arg, block, t, t, False))
        unmatched += sum(len(s) for s in open_.values())
        self.meta.unmatched = unmatched
        spans.sort(key=lambda s: (s.start, s.rank, s.event, s.arg, s.block, s.end))
        return spans

    def spans(self, rank: int | None = None) -> list[_Span]:
        """Paired spans and instants (``paired`` False), sorted by start time."""
        return [s for s in self._spans if rank is None or s.rank == rank]

    def intervals(
        self, rank: int, events: EventSpec | Iterable[EventSpec], gap_ns: int | None = None
    ) -> np.ndarray:
        """When ``rank`` was busy with ``events``: the union of their begin/end spans and of
        bursts of their instants (instants at most ``gap_ns`` apart form one burst; default
        4 x the median spacing of their distinct timestamps, at least one timer tick), per block.
        An (n, 2) array of [start, end] ns."""
        self._check_rank(rank)
        ids = self._event_ids(events)
        tick = self.meta.tick(rank)
        chosen = [s for s in self._spans if s.rank == rank and s.event in ids]
        # A begin/end pair within one tick took between 0 and a tick: count it as a tick, so
        # that a coarse timer does not erase short spans from the activity.
        durations = [(s.start, s.end if s.end > s.start else s.start + tick) for s in chosen if s.paired]
        # Bursts per block: each block streams its own chunks (in a pipeline, block g receives
        # chunk k + 1 while block h sends), so its own spacing sets its gap; interleaving the
        # blocks' instants first would make the spacing that of the timer, not of the stream.
        by_block: dict[int, list[int]] = {}
        for s in chosen:
            if not s.paired:
                by_block.setdefault(s.block, []).append(s.start)
        bursts: list[tuple[int, int]] = []
        for block in sorted(by_block):
            instants = np.array(by_block[block], dtype=np.int64)
            gap = _default_gap(instants, tick) if gap_ns is None else int(gap_ns)
            bursts += _bursts(instants, gap, tick)
        return union_intervals(durations + bursts)

    def overlap_fraction(
        self, rank: int, a_events: EventSpec | Iterable[EventSpec], b_events: EventSpec | Iterable[EventSpec],
        gap_ns: int | None = None,
    ) -> float:
        """Fraction of the time ``rank`` was busy with ``a_events`` or ``b_events`` during
        which it was busy with both: |A and B| / |A or B| (1.0 = fully overlapped)."""
        return interval_overlap_fraction(
            self.intervals(rank, a_events, gap_ns).tolist(), self.intervals(rank, b_events, gap_ns).tolist()
        )

    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int | np.integer) or not 0 <= rank < self.meta.nranks:
            raise ConfigError(f"rank {rank} is out of range for a trace of {self.meta.nranks} ranks")

    # -- Chrome / Perfetto ----------------------------------------------------------------
    def _track(self, s: _Span) -> tuple[tuple[int, int, int], str]:
        """Which thread of the rank's process an event goes on, and that thread's name:
        one per channel and role, one per kernel (and block), one per other event kind."""
        suffix = f" block {s.block}" if s.block else ""
        if s.event in L.CHANNEL_EVENTS:
            return (s.event, s.arg, s.block), f"{self.name(s.event)} ch {s.arg}{suffix}"
        if s.event == L.KERNEL:
            label = "kernel" if s.arg == 0 else f"kernel {s.arg}"
            return (s.event, s.arg, s.block), label + suffix
        return (s.event, 0, s.block), self.name(s.event) + suffix

    def to_chrome(self) -> dict:
        """The trace as a Chrome trace-event dict (load the JSON in ui.perfetto.dev or
        chrome://tracing): one process per rank, one thread per channel / role; spans are
        complete ("X") events, instants are "i" events; times in microseconds."""
        tracks: dict[int, dict[tuple[int, int, int], str]] = {}
        for s in self._spans:
            key, label = self._track(s)
            tracks.setdefault(s.rank, {})[key] = label
        tids = {
            (rank, key): i + 1 for rank, keys in tracks.items() for i, key in enumerate(sorted(keys))
        }
        out: list[dict] = []
        for rank in range(self.meta.nranks):
            out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                        "args": {"name": f"rank {rank}"}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                        "args": {"sort_index": rank}})
            for key in sorted(tracks.get(rank, {})):
                tid = tids[(rank, key)]
                out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                            "args": {"name": tracks[rank][key]}})
                out.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                            "args": {"sort_index": tid}})
        for s in self._spans:
            key, _ = self._track(s)
            ev = {"name": self.name(s.event), "cat": "circuslink", "pid": s.rank, "tid": tids[(s.rank, key)],
                  "ts": round(s.start / 1000.0, 3)}
            if s.paired:
                ev["ph"] = "X"
                ev["dur"] = round((s.end - s.start) / 1000.0, 3)
            else:
                ev["ph"] = "i"
                ev["s"] = "t"
            ev["args"] = {"arg": s.arg, "block": s.block}
            out.append(ev)
        other = {
            "time_base": "rank 0's clock; ts 0 = the earliest event",
            "t0_ns": self.meta.t0_ns,
            "clock_residual_ns": {str(r): self.meta.residual_ns(r) for r in range(self.meta.nranks)},
            "dropped": {str(r): int(self.meta.dropped.get(r, 0)) for r in range(self.meta.nranks)},
            "unmatched": self.meta.unmatched,
            "timer_tick_ns": {str(r): self.meta.tick(r) for r in range(self.meta.nranks)},
        }
        return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": other}

    def export_chrome(self, path: str | os.PathLike, about: dict | None = None) -> str:
        """Write :meth:`to_chrome` as JSON to ``path`` (``about``: more ``otherData``, e.g. the device,
        date and commit of the run); returns the path."""
        path = os.fspath(path)
        doc = self.to_chrome()
        doc["otherData"].update(about or {})
        with open(path, "w") as f:
            json.dump(doc, f, indent=None, separators=(",", ":"))
            f.write("\n")
        return path

    def plot_waveform(
        self, path: str | os.PathLike, title: str | None = None, ranks: Sequence[int] | None = None
    ) -> str:
        """Draw send and receive activity of each rank over time as a PNG (like a logic
        analyser: one row per rank and direction, high while active). Returns the path."""
        from ._waveform import plot_waveform

        return plot_waveform(self, os.fspath(path), title=title, ranks=ranks)
