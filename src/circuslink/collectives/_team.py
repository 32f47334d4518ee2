"""The shared-memory algorithms (one-shot, two-shot, and reduce-scatter, all-gather, broadcast and
barrier on the same buffers), run from Python over a team buffer that every rank maps: the cpu
back-end's implementation, and the reference the device code (detail/collectives_impl.cuh) follows
step by step, with the same layout (``_layout.team_offsets``), the same call numbers and the same
reduction order (rank 0, 1, ..., n - 1, ``_reduce.fold``).

Stores become visible in program order on the machines the cpu back-end runs on (x86-64: total
store order), so a flag written after its data is never seen before it; an LL line's flag and data
share an aligned 8-byte word, read and written whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._wait import Deadline, wait_until
from . import _layout as lay
from ._algorithms import segments
from ._reduce import combine


def _units(itemsize: int) -> int:
    """Elements per 16-byte unit (pieces and segments are cut in whole units)."""
    return max(1, 16 // itemsize)


class Team:
    """This rank's view of a team buffer (a SymmetricBuffer every rank maps) plus its private counters."""

    def __init__(self, buf: Any, rank: int, size: int, stage_bytes: int, oneshot_max: int,
                 timeout: float | None) -> None:
        self.buf, self.rank, self.size = buf, rank, size
        self.off = lay.team_offsets(size, stage_bytes)
        self.stage_bytes, self.oneshot_max, self.timeout = stage_bytes, oneshot_max, timeout
        self.counters = np.zeros(lay.COUNTERS, dtype=np.uint32)  # private, as on the device
        words = buf.nbytes // 4
        self._u32 = [buf.view(np.uint32, q)[:words] for q in range(size)]

    # -- pieces of a buffer ------------------------------------------------------------------------
    def _flags(self, q: int) -> np.ndarray:
        return self._u32[q][: self.size]

    def _ll(self, q: int) -> np.ndarray:
        lines = lay.LL_CHUNKS * 2 * self.size * lay.LL_LINES
        start = self.off["ll"] // 4
        return self._u32[q][start:start + 4 * lines].reshape(lines, 4)

    def stage(self, q: int, dtype: Any) -> np.ndarray:
        raw = self.buf.peer(q)[self.off["stage"]:self.off["stage"] + self.stage_bytes]
        item = np.dtype(dtype).itemsize
        return raw[: len(raw) - len(raw) % item].view(dtype)

    def _deadline(self) -> Deadline:
        return Deadline.after(self.timeout)

    # -- barrier -----------------------------------------------------------------------------------
    def barrier(self, deadline: Deadline | None = None) -> None:
        """Every rank stores its call number into its word of every rank's flags, then waits for all."""
        seq = int(self.counters[lay.COUNTER_BARRIER]) + 1 & 0xFFFFFFFF
        self.counters[lay.COUNTER_BARRIER] = seq
        for q in range(self.size):
            self._flags(q)[self.rank] = seq
        mine = self._flags(self.rank)
        deadline = deadline or self._deadline()
        for q in range(self.size):
            wait_until(lambda q=q: (int(mine[q]) - seq) & 0x80000000 == 0, deadline,
                       lambda q=q: f"collectives barrier on rank {self.rank}: rank {q}'s barrier flag "
                                   f"(call {seq}) did not arrive")

    # -- one-shot ----------------------------------------------------------------------------------
    def oneshot_allreduce(self, data: np.ndarray, op: str, bf16: bool) -> np.ndarray:
        """Every rank stores its message as LL lines into every peer's slots, then folds all ranks' lines."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        nbytes = raw.size
        out = np.empty(nbytes, dtype=np.uint8)
        deadline = self._deadline()
        for c in range(-(-nbytes // lay.LL_CHUNK_BYTES)):
            seq = int(self.counters[lay.COUNTER_CHUNK + c]) + 1 & 0xFFFFFFFF
            lo, hi = c * lay.LL_CHUNK_BYTES, min(nbytes, (c + 1) * lay.LL_CHUNK_BYTES)
            nlines = -(-(hi - lo) // 8)
            words = np.zeros(2 * nlines, dtype=np.uint32)
            words.view(np.uint8)[: hi - lo] = raw[lo:hi]
            lines = np.empty((nlines, 4), dtype=np.uint32)
            lines[:, 0], lines[:, 2] = words[0::2], words[1::2]
            lines[:, 1] = lines[:, 3] = seq
            first = lay.ll_line(c, seq & 1, self.rank, self.size)
            for q in range(self.size):
                if q != self.rank:
                    self._ll(q)[first:first + nlines] = lines
            parts = []
            for q in range(self.size):
                if q == self.rank:
                    got = lines
                else:
                    got = self._poll_lines(q, c, seq, nlines, deadline)
                parts.append(np.ascontiguousarray(got[:, [0, 2]]).view(np.uint8).reshape(-1)[: hi - lo])
            out[lo:hi] = self._fold_bytes(parts, data.dtype, op, bf16)
            self.counters[lay.COUNTER_CHUNK + c] = seq
        return out.view(data.dtype).reshape(data.shape)

    def _poll_lines(self, q: int, chunk: int, seq: int, nlines: int, deadline: Deadline) -> np.ndarray:
        first = lay.ll_line(chunk, seq & 1, q, self.size)
        slot = self._ll(self.rank)[first:first + nlines]
        got: list[np.ndarray] = []

        def ready() -> bool:
            snap = slot.copy()  # one snapshot: each line's flags and data are read together
            if np.all(snap[:, 1] == seq) and np.all(snap[:, 3] == seq):
                got.append(snap)
                return True
            return False

        wait_until(ready, deadline, lambda: f"one-shot all-reduce on rank {self.rank}: rank {q}'s one-shot slot "
                                            f"(chunk {chunk}, call {seq}) did not arrive")
        return got[0]

    @staticmethod
    def _fold_bytes(parts: list[np.ndarray], dtype: Any, op: str, bf16: bool) -> np.ndarray:
        acc = parts[0].view(dtype).copy()
        for p in parts[1:]:
            acc = combine(op, acc, p.view(dtype), bf16)
        return acc.view(np.uint8)

    # -- two-shot and friends ----------------------------------------------------------------------
    def _piece_elems(self, itemsize: int, parts: int = 1) -> int:
        unit = _units(itemsize)
        return max(unit, (self.stage_bytes // parts // 16) * unit if itemsize <= 16 else self.stage_bytes // parts)

    def _reduce_from_all(self, dtype: Any, lo: int, hi: int, op: str, bf16: bool) -> np.ndarray:
        acc = self.stage(0, dtype)[lo:hi].copy()
        for q in range(1, self.size):
            acc = combine(op, acc, self.stage(q, dtype)[lo:hi], bf16)
        return acc

    def twoshot_allreduce(self, data: np.ndarray, op: str, bf16: bool) -> np.ndarray:
        """Per piece of the stage: copy in; barrier; reduce my segment from every rank's stage in place and
        push it into every rank's stage and my output; barrier; copy the other segments from my own stage.
        (No third barrier: until every rank passes the next barrier only its owner touches a stage.)"""
        src = np.ascontiguousarray(data).reshape(-1)
        out = np.empty_like(src)
        cap = self._piece_elems(src.dtype.itemsize)
        mine = self.stage(self.rank, src.dtype)
        deadline = self._deadline()
        for base in range(0, src.size, cap):
            m = min(cap, src.size - base)
            mine[:m] = src[base:base + m]
            self.barrier(deadline)
            seg = segments(m, src.dtype.itemsize, self.size)
            lo, hi = seg[self.rank]
            acc = self._reduce_from_all(src.dtype, lo, hi, op, bf16)
            for q in range(self.size):
                self.stage(q, src.dtype)[lo:hi] = acc
            out[base + lo:base + hi] = acc
            self.barrier(deadline)
            for q in range(self.size):
                if q != self.rank:
                    lo, hi = seg[q]
                    out[base + lo:base + hi] = mine[lo:hi]
        return out.reshape(data.shape)

    def reduce_scatter(self, data: np.ndarray, op: str, bf16: bool) -> np.ndarray:
        """``data`` holds size blocks of count elements; returns block ``rank`` reduced over every rank.
        Per piece: copy my blocks' piece in (block q at q x piece); barrier; fold; barrier."""
        src = np.ascontiguousarray(data).reshape(self.size, -1)
        count = src.shape[1]
        out = np.empty(count, dtype=src.dtype)
        cap = self._piece_elems(src.dtype.itemsize, self.size)
        mine = self.stage(self.rank, src.dtype)
        deadline = self._deadline()
        for base in range(0, count, cap):
            m = min(cap, count - base)
            for q in range(self.size):
                mine[q * cap:q * cap + m] = src[q, base:base + m]
            self.barrier(deadline)
            out[base:base + m] = self._reduce_from_all(src.dtype, self.rank * cap, self.rank * cap + m, op, bf16)
            self.barrier(deadline)
        return out

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """Every rank's ``data`` (count elements each), in rank order: (size x count) elements."""
        src = np.ascontiguousarray(data).reshape(-1)
        out = np.empty((self.size, src.size), dtype=src.dtype)
        cap = self._piece_elems(src.dtype.itemsize)
        mine = self.stage(self.rank, src.dtype)
        deadline = self._deadline()
        for base in range(0, src.size, cap):
            m = min(cap, src.size - base)
            mine[:m] = src[base:base + m]
            self.barrier(deadline)
            for q in range(self.size):
                out[q, base:base + m] = self.stage(q, src.dtype)[:m]
            self.barrier(deadline)
        return out.reshape(-1)

    def broadcast(self, data: np.ndarray, root: int) -> np.ndarray:
        """``root``'s data on every rank: the root copies a piece in; barrier; the others copy it out; barrier."""
        out = np.array(data, copy=True).reshape(-1)
        raw = out.view(np.uint8)
        mine = self.stage(self.rank, np.uint8)
        theirs = self.stage(root, np.uint8)
        deadline = self._deadline()
        for base in range(0, raw.size, self.stage_bytes):
            m = min(self.stage_bytes, raw.size - base)
            if self.rank == root:
                mine[:m] = raw[base:base + m]
            self.barrier(deadline)
            if self.rank != root:
                raw[base:base + m] = theirs[:m]
            self.barrier(deadline)
        return out.reshape(np.shape(data))
