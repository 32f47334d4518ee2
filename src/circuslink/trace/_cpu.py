"""The tracer's back-end module on back-ends that run no kernels (cpu): Python records events into a numpy
ring with the same layout the device writes, and the clock exchange runs in Python over a small
symmetric buffer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._wait import Deadline, wait_until
from ..errors import ConfigError
from . import _layout as L
from ._clock import ROUNDS, combine
from ._model import ClockSample


class Recorder:
    """This rank's ring of records, written from Python."""

    def __init__(self, world: Any, capacity: int, clock_ns: Callable[[], int] | None = None) -> None:
        self.world = world
        self.capacity = capacity
        self.clock_ns = clock_ns or time.perf_counter_ns  # tests skew the clock through clock_ns
        self.records = np.zeros(capacity, dtype=L.RECORD_DTYPE)
        self.cursor = 0
        self.clock = ClockSync(world, self.clock_ns)

    def device_handle(self) -> np.void:
        raise ConfigError(f"device_handle() is for kernels, and the {self.world.backend.name} back-end runs none: "
                          "record with tracer.instant / begin / end / span")

    def record(self, event: int, phase: int, arg: int, block: int) -> None:
        t = self.clock_ns()
        slot = self.cursor
        self.cursor += 1
        if slot < self.capacity:  # full: dropped, and counted by the cursor
            self.records[slot] = (t, event | (phase << L.PHASE_SHIFT), min(block, 0xFFFF), arg & 0xFFFFFFFF)

    def local(self) -> tuple[np.ndarray, int]:
        kept = min(self.cursor, self.capacity)
        return self.records[:kept].copy(), self.cursor

    def reset(self) -> None:
        self.cursor = 0

    def sync(self, deadline: Deadline) -> list[ClockSample]:
        return self.clock.sync(deadline)

    def close(self, timeout: float | None) -> None:
        self.clock.close(timeout)

    def release_local(self) -> None:
        self.clock.release_local()


class ClockSync:
    """The clock exchange over a small symmetric buffer, in Python."""

    def __init__(self, world: Any, clock_ns: Callable[[], int], rounds: int = ROUNDS) -> None:
        self.world = world
        self.clock_ns = clock_ns
        self.rounds = rounds
        self.epoch = 0
        self.buf = world.alloc(8 * max(world.size, 2)) if world.size > 1 else None

    def sync(self, deadline: Deadline) -> list[ClockSample]:
        w = self.world
        if w.size == 1:
            return [ClockSample(self.clock_ns(), 0, 0)]
        self.epoch += 1
        base = self.epoch << 20  # slots keep counting up across syncs: no reset race
        mine_slots = self.buf.view(np.int64)
        mine: Any = {} if w.rank == 0 else None
        # One pair at a time, started by a barrier: the pair's two processes arrive together and
        # the others sleep in the barrier instead of polling (2 shared cores on CI machines).
        for r in range(1, w.size):
            w.barrier(deadline)
            if w.rank == 0:
                peer_slots = self.buf.view(np.int64, r)
                t1 = np.zeros(self.rounds, np.int64)
                t2 = np.zeros(self.rounds, np.int64)
                for k in range(self.rounds):
                    seq = base + k + 1
                    t1[k] = self.clock_ns()
                    peer_slots[0] = seq
                    wait_until(lambda seq=seq, r=r: int(mine_slots[r]) == seq, deadline,
                               lambda k=k, r=r: f"trace clock sync: rank {r} did not answer rank 0's ping {k}")
                    t2[k] = self.clock_ns()
                mine[r] = (t1, t2)
            elif w.rank == r:
                ref_slots = self.buf.view(np.int64, 0)
                tb = np.zeros(self.rounds, np.int64)
                for k in range(self.rounds):
                    seq = base + k + 1
                    wait_until(lambda seq=seq: int(mine_slots[0]) == seq, deadline,
                               lambda k=k: f"trace clock sync: rank {w.rank} got no ping {k} from rank 0")
                    tb[k] = self.clock_ns()
                    ref_slots[w.rank] = seq
                mine = tb
        return combine(w, mine, self.clock_ns(), deadline)

    def close(self, timeout: float | None) -> None:
        buf, self.buf = self.buf, None
        if buf is not None:
            buf.close(timeout)

    def release_local(self) -> None:
        buf, self.buf = self.buf, None
        if buf is not None:
            buf.release_local()
