"""The tracer's back-end module on back-ends that run kernels (cuda): kernels record into a ring in device
memory through the by-value ``circuslink::trace::Handle``, and the clock exchange runs in two
one-thread kernels polling over NVLink (``clock_kernels.cu``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._wait import Deadline
from ..errors import ConfigError, TimeoutError
from . import _layout as L
from ._clock import ROUNDS, combine
from ._model import ClockSample

_KERNELS = Path(__file__).with_name("clock_kernels.cu")


class Recorder:
    """This rank's ring of records in device memory, written by kernels."""

    def __init__(self, world: Any, capacity: int, clock_ns: Any = None) -> None:
        cp = world.xp
        self.world = world
        self.capacity = capacity
        self.records = cp.zeros(capacity * 2, dtype=cp.uint64)  # 16 B each, 16-B aligned
        self.cursor = cp.zeros(1, dtype=cp.uint64)
        self.clock = ClockSync(world)

    def device_handle(self) -> np.void:
        return L.HANDLE.pack(records=self.records.data.ptr, cursor=self.cursor.data.ptr, capacity=self.capacity,
                             rank=self.world.rank)

    def record(self, event: int, phase: int, arg: int, block: int) -> None:
        raise ConfigError(f"on the {self.world.backend.name} back-end events are recorded by kernels "
                          "through tracer.device_handle()")

    def local(self) -> tuple[np.ndarray, int]:
        # Every kernel of this rank that may record, on any stream, has finished.
        self.world.backend.synchronize()
        attempted = int(self.cursor.get()[0])
        kept = min(attempted, self.capacity)
        raw = self.records[: 2 * kept].get().view(L.RECORD_DTYPE)
        return raw.copy(), attempted

    def reset(self) -> None:
        self.world.backend.synchronize()
        self.cursor.fill(0)
        self.world.backend.synchronize()

    def sync(self, deadline: Deadline) -> list[ClockSample]:
        return self.clock.sync(deadline)

    def close(self, timeout: float | None) -> None:
        self.clock.close(timeout)
        self.records = self.cursor = None

    def release_local(self) -> None:
        self.clock.release_local()
        self.records = self.cursor = None


class ClockSync:
    """The clock exchange between one-thread kernels, over NVLink."""

    def __init__(self, world: Any, rounds: int = ROUNDS) -> None:
        from ..device_code import compile as compile_device

        cp = world.xp
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
        self.abort = np.uint64(world.backend.abort_ptr)

    def _run(self, name: str, args: tuple, deadline: Deadline, what: str) -> np.ndarray:
        """One one-thread kernel, waited for within ``deadline`` (on time-out the host aborts it)."""
        self.module.get_function(name)((1,), (1,), args, stream=self.stream)
        self.world.backend.wait_stream(self.stream, deadline, what)
        return self.out.get().astype(np.int64)

    def now_ns(self, deadline: Deadline) -> int:
        return int(self._run("clock_read", (self.out,), deadline, f"trace clock read on rank {self.world.rank}")[0])

    def sync(self, deadline: Deadline) -> list[ClockSample]:
        w = self.world
        if w.size == 1:
            return [ClockSample(self.now_ns(deadline), 0, 0)]
        self.epoch += 1
        base = np.uint64(self.epoch << 20)
        rounds = np.uint32(self.rounds)
        mine: Any = {} if w.rank == 0 else None
        # One pair at a time after a barrier (as on cpu): only the pair's kernels spin, so ranks
        # sharing a GPU with the pair do not take time slices from it.
        for r in range(1, w.size):
            w.barrier(deadline)
            if self.same_clock_as_ref[r]:
                continue  # the very same %globaltimer as rank 0: offset 0 by construction
            timeout_ns = np.uint64(max(1, int(deadline.remaining() * 1e9)))
            if w.rank == 0:
                slot_peer = np.uint64(self.buf.ptr(r))  # rank r's slot 0
                slot_mine = np.uint64(self.buf.ptr(0) + 8 * r)
                out = self._run("clock_ping", (slot_peer, slot_mine, base, rounds, timeout_ns, self.abort, self.out),
                                deadline, f"trace clock sync: rank 0 pinging rank {r}")
                if out[2 * self.rounds]:
                    raise TimeoutError(f"trace clock sync: rank {r} did not answer rank 0's ping "
                                       f"{out[2 * self.rounds] - 1} within {deadline.limit:g} s (device-side wait)")
                mine[r] = (out[0:2 * self.rounds:2], out[1:2 * self.rounds:2])
            elif w.rank == r:
                slot_ref = np.uint64(self.buf.ptr(0) + 8 * w.rank)
                slot_mine = np.uint64(self.buf.ptr(w.rank))
                out = self._run("clock_pong", (slot_ref, slot_mine, base, rounds, timeout_ns, self.abort, self.out),
                                deadline, f"trace clock sync: rank {r} answering rank 0")
                if out[self.rounds]:
                    raise TimeoutError(f"trace clock sync: rank {w.rank} got no ping {out[self.rounds] - 1} "
                                       f"from rank 0 within {deadline.limit:g} s (device-side wait)")
                mine = out[: self.rounds]
        return combine(w, mine, self.now_ns(deadline), deadline)

    def close(self, timeout: float | None) -> None:
        buf, self.buf = self.buf, None
        if buf is not None:
            buf.close(timeout)

    def release_local(self) -> None:
        buf, self.buf = self.buf, None
        if buf is not None:
            buf.release_local()
