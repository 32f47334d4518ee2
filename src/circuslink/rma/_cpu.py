"""The cpu back-end's RMA windows: the reference semantics of RMA queues, over the shared memory the ipc
transport maps (its CPU form).

A window is a :class:`~circuslink.SymmetricBuffer`; a queue adds one symmetric array of
uint64 counters per rank: ``[0, size)`` arrival counters (slot o is raised by origin o
once its writes of an epoch are in my window), ``[size, 2*size)`` post counters (slot t
is raised by target t when I may write epoch e into it). Writes are numpy copies
between views built once at commit (strided views for block-stride writes: no packing).

Ordering: numpy stores the data before the counter store, and x86 (TSO) keeps stores in
order, so a peer that sees the counter sees the data. Waits go through
:func:`circuslink._wait.wait_until` with the deadline the queue passes down.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import transport
from .._wait import Deadline, wait_until
from ._transpose import _cpu as transposes
from ._transpose import is_transpose


def _view(arr: np.ndarray, offset: int, count: int, block: int, stride: int) -> np.ndarray:
    if count == 1:
        return arr[offset: offset + block]
    base = arr[offset: offset + (count - 1) * stride + block]
    return as_strided(base, shape=(count, block), strides=(stride, 1), writeable=True)


def open_window(world: Any, nbytes: int, deadline: Deadline) -> CpuWindow:
    """This module's half of ``rma.window_alloc`` (collective)."""
    return CpuWindow(world, nbytes, deadline)


class CpuWindow:
    runs_on_streams = False  # start(stream=) / wait(block=False) need a back-end with streams
    one_epoch_per_window = False

    def __init__(self, world: Any, nbytes: int, deadline: Deadline) -> None:
        self.world = world
        self.buf = transport.map_memory(world, None, nbytes, deadline)

    @property
    def local(self) -> np.ndarray:
        return self.buf.local

    def peer(self, rank: int) -> np.ndarray:
        return self.buf.peer(rank)

    def new_queue(self, deadline: Deadline) -> CpuQueue:
        return CpuQueue(self, deadline)

    def close(self, deadline: Deadline) -> None:
        self.buf.close(deadline)

    def release_local(self) -> None:
        self.buf.release_local()


class CpuQueue:
    def __init__(self, window: CpuWindow, deadline: Deadline) -> None:
        self.world = window.world
        self.window = window
        size = self.world.size
        self.size = size
        self.signals = transport.map_memory(self.world, None, 2 * size * 8, deadline)
        self.mine = self.signals.view(np.uint64)
        self.peers = {r: self.signals.view(np.uint64, r) for r in range(size)}
        self.queue: Any = None
        self.chain: list[tuple[int, list[tuple[np.ndarray, np.ndarray]]]] = []
        self.tiles: dict[int, tuple[int, int] | None] = {}
        self.origins: list[int] = []
        self.own_targets: list[int] = []  # a signal-only queue's targets (Queue.add_target)
        self.post_at = "start"

    def current_epoch(self, host_epoch: int, deadline: Deadline) -> int:
        return host_epoch

    def commit(self, queue: Any, base: int, post_at: str, incoming: dict, deadline: Deadline) -> None:
        self.queue = queue
        self.post_at = post_at
        self.origins = list(queue.origins)
        by_target: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for h in queue.handles:
            if is_transpose(h):  # (dst, src.T) view pairs, copied by the same loop
                pairs = transposes.copies(h, h.src_window._impl.local, self.window.peer(h.dst_rank))
                by_target.setdefault(h.dst_rank, []).extend(pairs)
                self.tiles[h.id] = h.tile  # None: one copy of the whole block
                continue
            src = _view(h.src_window._impl.local, h.src_offset, h.count, h.block_bytes, h.src_stride)
            dst = _view(self.window.peer(h.dst_rank), h.dst_offset, h.count, h.block_bytes, h.dst_stride)
            by_target.setdefault(h.dst_rank, []).append((dst, src))
        self.chain = sorted(by_target.items())
        self.own_targets = list(queue.targets) if queue.signal_only else []
        if post_at == "wait" and not queue.signal_only:
            self._post(base + 1)  # the first epoch is open from the start

    def describe(self) -> dict:
        return {"copies": sum(len(c) for _, c in self.chain), "tiles": dict(self.tiles)}

    def _post(self, epoch: int) -> None:
        me = self.world.rank
        for o in self.origins:
            self.peers[o][self.size + me] = epoch

    def start(self, epoch: int, deadline: Deadline, stream: Any) -> None:
        queue = self.queue
        if self.own_targets:  # my own writes into their windows came first: only the arrivals, no posts
            for t in self.own_targets:
                self.peers[t][self.world.rank] = epoch
            return
        if self.post_at == "start":
            self._post(epoch)
        me, mine = self.world.rank, self.mine
        for t, copies in self.chain:
            slot = self.size + t
            wait_until(lambda slot=slot: int(mine[slot]) >= epoch, deadline,
                       lambda t=t: queue._stall("in start() waiting for the post of target", [t], epoch))
            for dst, src in copies:
                dst[...] = src
            self.peers[t][me] = epoch  # after the data: a peer that sees it sees the bytes

    def wait(self, epoch: int, deadline: Deadline, stream: Any, block: bool) -> None:
        mine, origins = self.mine, self.origins
        wait_until(lambda: all(int(mine[o]) >= epoch for o in origins), deadline,
                   lambda: self.queue._stall("waiting for the writes of origin",
                                             [o for o in origins if int(mine[o]) < epoch], epoch))
        if self.post_at == "wait" and not self.own_targets:
            self._post(epoch + 1)

    def clear(self, deadline: Deadline | None) -> None:
        self.chain = []
        self.tiles = {}
        self.origins = []
        self.own_targets = []

    def close(self, deadline: Deadline) -> None:
        self.clear(deadline)
        self.peers = {}
        self.mine = None
        self.signals.close(deadline)

    def release_local(self) -> None:
        self.clear(None)
        self.peers = {}
        self.mine = None
        self.signals.release_local()
