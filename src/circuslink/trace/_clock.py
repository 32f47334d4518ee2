"""Putting every rank's clock on rank 0's time base.

Clocks of different ranks are not assumed to agree: GPUs of one machine may well share
%globaltimer, but nothing guarantees it, and hosts certainly do not. So each rank r > 0
measures its offset to rank 0 with an NTP-style exchange through symmetric memory:

    rank 0: t1 = clock(); store k into rank r's slot; wait for k in my slot r; t2 = clock()
    rank r: wait for k in my slot; tb = clock(); store k into rank 0's slot r

Causality puts rank 0's time at ``tb`` inside [t1, t2], so ``offset = tb - (t1 + t2) / 2``
is off by at most ``(t2 - t1) / 2``; of ``rounds`` exchanges the one with the shortest
round trip wins, and half its round trip is the stated residual. On the GPU the exchange
runs in two one-thread kernels polling over NVLink (round trip ~1-3 us); on the cpu
back-end in Python over shared memory (tens of us). Ranks that use the same GPU as rank 0
read the very same %globaltimer, so their offset is 0 by construction: no exchange (it
could not run anyway: two processes' kernels on one GPU are time-sliced, not concurrent).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._config import resolve_timeout
from ..errors import TimeoutError
from ._model import ClockSample

ROUNDS = 32
_SPIN_S = 50e-6  # spin this long before yielding, and yield this long before sleeping:
_YIELD_S = 2e-3  # the cpu back-end must not burn the (shared) cores while it waits
_SLEEP_S = 100e-6


def _wait_value(slots: np.ndarray, index: int, value: int, deadline: float, what: str) -> None:
    start = time.perf_counter()
    while int(slots[index]) != value:
        now = time.perf_counter()
        if now > deadline:
            raise TimeoutError(what)
        waited = now - start
        if waited > _YIELD_S:
            time.sleep(_SLEEP_S)
        elif waited > _SPIN_S:
            os.sched_yield()


def _estimate(t1: np.ndarray, t2: np.ndarray, tb: np.ndarray) -> ClockSample:
    rtt = t2 - t1
    k = int(np.argmin(rtt))
    # integer arithmetic: float64 would lose nanoseconds on 64-bit timer values
    offset = int(tb[k]) - (int(t1[k]) + int(t2[k])) // 2
    return ClockSample(local_ns=int(tb[k]), offset_ns=offset, residual_ns=(int(rtt[k]) + 1) // 2)


def _combine(world: Any, mine: Any, now_ns: int) -> list[ClockSample]:
    """Everyone's exchange results -> one ClockSample per rank, on every rank."""
    gathered = world.allgather_object(mine)
    ref = gathered[0]
    samples = [ClockSample(local_ns=now_ns if world.rank == 0 else 0, offset_ns=0, residual_ns=0)]
    for r in range(1, world.size):
        if gathered[r] is None:  # same clock as rank 0 by construction
            samples.append(ClockSample(local_ns=0, offset_ns=0, residual_ns=0))
            continue
        t1, t2 = ref[r]
        t1, t2, tb = (np.asarray(x, np.int64) for x in (t1, t2, gathered[r]))
        samples.append(_estimate(t1, t2, tb))
    return samples


class CpuClockSync:
    """The exchange over a small symmetric buffer, in Python (cpu back-end)."""

    def __init__(self, world: Any, clock_ns: Callable[[], int], rounds: int = ROUNDS) -> None:
        self.world = world
        self.clock_ns = clock_ns
        self.rounds = rounds
        self.epoch = 0
        self.buf = world.alloc(8 * max(world.size, 2)) if world.size > 1 else None

    def sync(self, timeout: float | None = None) -> list[ClockSample]:
        w = self.world
        if w.size == 1:
            return [ClockSample(self.clock_ns(), 0, 0)]
        limit = resolve_timeout(timeout)
        self.epoch += 1
        base = self.epoch << 20  # slots keep counting up across syncs: no reset race
        mine_slots = self.buf.view(np.int64)
        mine: Any = {} if w.rank == 0 else None
        # One pair at a time, started by a barrier: the pair's two processes arrive together and
        # the others sleep in the barrier instead of polling (2 shared cores on CI machines).
        for r in range(1, w.size):
            w.barrier(timeout)
            if w.rank == 0:
                peer_slots = self.buf.view(np.int64, r)
                t1 = np.zeros(self.rounds, np.int64)
                t2 = np.zeros(self.rounds, np.int64)
                deadline = time.perf_counter() + limit
                for k in range(self.rounds):
                    seq = base + k + 1
                    t1[k] = self.clock_ns()
                    peer_slots[0] = seq
                    _wait_value(mine_slots, r, seq, deadline, f"trace clock sync: rank {r} did not answer "
                                f"rank 0's ping {k} within {limit:g} s")
                    t2[k] = self.clock_ns()
                mine[r] = (t1, t2)
            elif w.rank == r:
                ref_slots = self.buf.view(np.int64, 0)
                tb = np.zeros(self.rounds, np.int64)
                deadline = time.perf_counter() + limit
                for k in range(self.rounds):
                    seq = base + k + 1
                    _wait_value(mine_slots, 0, seq, deadline,
                                f"trace clock sync: rank {w.rank} got no ping {k} from rank 0 within {limit:g} s")
                    tb[k] = self.clock_ns()
                    ref_slots[w.rank] = seq
                mine = tb
        return _combine(w, mine, self.clock_ns())

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()
            self.buf = None


_KERNELS = Path(__file__).with_name("clock_kernels.cu")


class CudaClockSync:
    """The exchange between one-thread kernels, over NVLink (cuda back-end)."""

    def __init__(self, world: Any, rounds: int = ROUNDS) -> None:
        import cupy as cp

        from ..device_code import compile as compile_device

        self.cp = cp
        self.world = world
        self.rounds = rounds
        self.epoch = 0
        self.module = compile_device(_KERNELS.read_text())
        self.stream = world.backend.stream
        bus = cp.cuda.Device(world.device).pci_bus_id
        buses = world.allgather_object(bus)
        self.same_clock_as_ref = [b == buses[0] for b in buses]
        self.buf = world.alloc(8 * max(world.size, 2)) if world.size > 1 else None
        self.out = cp.zeros(2 * rounds + 1, dtype=cp.uint64)

    def now_ns(self) -> int:
        self.module.get_function("clock_read")((1,), (1,), (self.out,), stream=self.stream)
        self.stream.synchronize()
        return int(self.out[0].get())

    def sync(self, timeout: float | None = None) -> list[ClockSample]:
        w = self.world
        if w.size == 1:
            return [ClockSample(self.now_ns(), 0, 0)]
        limit = resolve_timeout(timeout)
        timeout_ns = np.uint64(int(limit * 1e9))
        self.epoch += 1
        base = np.uint64(self.epoch << 20)
        rounds = np.uint32(self.rounds)
        mine: Any = {} if w.rank == 0 else None
        # One pair at a time after a barrier (as on cpu): only the pair's kernels spin, so ranks
        # sharing a GPU with the pair do not take time slices from it.
        for r in range(1, w.size):
            w.barrier(timeout)
            if self.same_clock_as_ref[r]:
                continue  # the very same %globaltimer as rank 0: offset 0 by construction
            if w.rank == 0:
                slot_peer = np.uint64(self.buf.ptr(r))  # rank r's slot 0
                slot_mine = np.uint64(self.buf.ptr(0) + 8 * r)
                args = (slot_peer, slot_mine, base, rounds, timeout_ns, self.out)
                self.module.get_function("clock_ping")((1,), (1,), args, stream=self.stream)
                self.stream.synchronize()
                out = self.out.get().astype(np.int64)
                if out[2 * self.rounds]:
                    raise TimeoutError(f"trace clock sync: rank {r} did not answer rank 0's ping "
                                       f"{out[2 * self.rounds] - 1} within {limit:g} s (device-side wait)")
                mine[r] = (out[0:2 * self.rounds:2], out[1:2 * self.rounds:2])
            elif w.rank == r:
                slot_ref = np.uint64(self.buf.ptr(0) + 8 * w.rank)
                slot_mine = np.uint64(self.buf.ptr(w.rank))
                args = (slot_ref, slot_mine, base, rounds, timeout_ns, self.out)
                self.module.get_function("clock_pong")((1,), (1,), args, stream=self.stream)
                self.stream.synchronize()
                out = self.out.get().astype(np.int64)
                if out[self.rounds]:
                    raise TimeoutError(f"trace clock sync: rank {w.rank} got no ping {out[self.rounds] - 1} "
                                       f"from rank 0 within {limit:g} s (device-side wait)")
                mine = out[: self.rounds]
        return _combine(w, mine, self.now_ns())

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()
            self.buf = None
