"""The probe on the cpu back-end: ranks are processes sharing memory through /dev/shm.

Bandwidths are numpy copies, fills and reductions on a peer's mapping. The flag pingpong
runs in Python, so its latency is the interpreter's, not the memory system's; on x86
(TSO) plain stores and loads already have release/acquire order, so the relaxed and
acquire/release variants are the same code.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._config import default_timeout
from . import _stall, buffer_bytes


class Probe:
    def __init__(self, world: Any, quick: bool) -> None:
        self.world = world
        self.nbytes = buffer_bytes(False, quick)
        self.reps = 3 if quick else 5
        self.iters = 200 if quick else 2000
        self.buf = world.alloc(self.nbytes + 4096)
        self.data = self.buf.local[: self.nbytes]
        self.data[:] = np.random.default_rng().integers(0, 256, self.nbytes, dtype=np.uint8)
        self._base = 0

    def device_name(self) -> str:
        import platform

        return f"cpu ({platform.machine()})"

    def _flags(self, rank: int) -> np.ndarray:
        return self.buf.peer(rank)[self.nbytes:].view(np.uint32)

    def _best_GBps(self, fn) -> float:
        best = float("inf")
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return self.nbytes / best / 1e9

    def measure_pair(self, a: int, b: int) -> dict:
        w = self.world
        out: dict = {}
        w.barrier()
        if w.rank == a:
            peer = self.buf.peer(b)[: self.nbytes]
            out["ce_GBps"] = self._best_GBps(lambda: np.copyto(peer, self.data))
            out["sm_store_GBps"] = self._best_GBps(lambda: peer.fill(0x5A))
            words = peer.view(np.uint64)
            out["sm_load_GBps"] = self._best_GBps(lambda: np.bitwise_xor.reduce(words))
        w.barrier()
        if w.rank in (a, b):
            other = b if w.rank == a else a
            peer = self.buf.peer(other)[: self.nbytes]
            out_bidir = self._best_GBps(lambda: peer.fill(0xA5))
        w.barrier()
        for mode in ("relaxed", "acqrel", "pull"):
            self._base += self.iters + 16
            lat = self._pingpong(a, b, mode) if w.rank in (a, b) else None
            w.barrier()
            if w.rank == a:
                out[f"lat_{mode}_us"] = lat
        if w.rank == a:
            out["sm_store_bidir_GBps"] = out_bidir
        return w.broadcast_object(out, root=a)

    def _pingpong(self, a: int, b: int, mode: str) -> float:
        me = self.world.rank
        other = b if me == a else a
        mine, peers = self._flags(me), self._flags(other)
        initiator = me == a
        warmup = 10
        deadline = time.monotonic() + default_timeout()
        t0 = 0.0
        for i in range(1, warmup + self.iters + 1):
            if i == warmup + 1:
                t0 = time.perf_counter()
            v = self._base + i
            target, watched = (mine, peers) if mode == "pull" else (peers, mine)
            if initiator:
                target[0] = v
            spins = 0
            while watched[0] != v:
                spins += 1
                if spins % 4096 == 0:
                    if time.monotonic() > deadline:
                        raise _stall("flag pingpong", a, b, f"at iteration {i}")
                    time.sleep(0)
            if not initiator:
                target[0] = v
        return (time.perf_counter() - t0) / (2 * self.iters) * 1e6

    def local_copy_GBps(self) -> float:
        dst = np.empty_like(self.data)
        return 2 * self._best_GBps(lambda: np.copyto(dst, self.data))

    def close(self) -> None:
        self.buf.close()
