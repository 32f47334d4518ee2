"""Windows, declared writes and persistent queues: the back-end independent half of circuslink.rma.

Everything a user can get wrong is checked here, once, for every back-end; the engines
(``_cpu.py``, ``_cuda.py``, ``_mpi.py``) only move bytes and flip counters.

Epochs. Every queue counts its start/wait cycles (epoch 1, 2, ...). A target *posts*
epoch e (tells its origins "you may write into me now") and an origin writes its data,
then raises the target's per-origin *arrival* counter to e. Counters only grow, so
repeated cycles need no reset; the target's wait(e) is "arrival[o] >= e for every
declared origin o".
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._config import resolve_timeout
from ..errors import RmaError, TimeoutError

BACKENDS = ("cpu", "cuda", "mpi")
POST_AT = ("start", "wait")
_handle_ids = itertools.count(1)


# -- windows ------------------------------------------------------------------------------------
class Window:
    """A region of every rank's memory that remote writes may target. Create with :func:`window_alloc`."""

    def __init__(self, world: Any, nbytes: int, backend: str, impl: Any, index: int) -> None:
        self.world = world
        self.nbytes = nbytes
        self.backend = backend
        self.index = index
        self._impl = impl
        self._queues: list[Queue] = []
        self._active_queue: Queue | None = None  # mpi: one PSCW epoch per window at a time
        self._queue_count = 0
        self.freed = False

    @property
    def local(self):
        """My part of the window: a uint8 array (numpy on cpu, cupy when the world is cuda)."""
        self._check()
        return self._impl.local

    def view(self, dtype):
        """My part of the window reinterpreted as ``dtype``."""
        arr = self.local
        itemsize = np.dtype(dtype).itemsize
        return arr[: self.nbytes - self.nbytes % itemsize].view(dtype)

    def _check(self) -> None:
        if self.freed:
            raise RmaError(f"window {self.index} has been freed")

    def free(self, timeout: float | None = None) -> None:
        """Collective: free the window and every queue allocated on it. Idempotent."""
        if self.freed:
            return
        for q in list(self._queues):
            q.free(timeout)
        self.freed = True
        self._impl.free(timeout)

    def __enter__(self) -> Window:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.free()

    def __repr__(self) -> str:
        return f"Window(index={self.index}, nbytes={self.nbytes}, backend={self.backend!r}, rank={self.world.rank})"


_window_counts: dict[int, int] = {}


def window_alloc(world: Any, nbytes: int, backend: str = "auto", timeout: float | None = None) -> Window:
    """Collective: a window of ``nbytes`` (zeroed) on every rank.

    ``backend``: "auto" (the world's: cpu or cuda), "cpu", "cuda" (both need the world of
    that back-end) or "mpi" (MPI-3 RMA; needs a job started by mpirun; on a cuda world
    the data lives on the GPU and is staged through host memory).
    """
    if not isinstance(nbytes, int | np.integer) or isinstance(nbytes, bool) or nbytes <= 0:
        raise RmaError(f"window_alloc: nbytes must be a positive integer, got {nbytes!r}")
    nbytes = int(nbytes)
    name = (backend or "auto").lower()
    if name == "auto":
        name = world.backend.name
    if name not in BACKENDS:
        raise RmaError(f"window_alloc: unknown backend {backend!r}: choose auto, {', '.join(BACKENDS)}")
    if name in ("cpu", "cuda") and name != world.backend.name:
        raise RmaError(
            f"window_alloc: backend {name!r} needs a world of that back-end, but this world is "
            f"{world.backend.name!r} (circuslink.init(backend={name!r}))"
        )
    key = id(world)
    index = _window_counts.get(key, 0) + 1
    _window_counts[key] = index
    if name == "cpu":
        from ._cpu import CpuWindow as Impl
    elif name == "cuda":
        from ._cuda import CudaWindow as Impl
    else:
        from ._mpi import MpiWindow as Impl
    impl = Impl(world, nbytes, timeout)
    return Window(world, nbytes, name, impl, index)


# -- declared writes ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class MsgHandle:
    """One declared write: ``count`` blocks of ``block_bytes``, my ``src_window`` -> ``dst_rank``'s ``dst_window``.

    A contiguous write is one block. Offsets and strides are in bytes.
    """

    dst_window: Window
    dst_offset: int
    src_window: Window
    src_offset: int
    count: int
    block_bytes: int
    src_stride: int
    dst_stride: int
    dst_rank: int
    id: int = field(default_factory=lambda: next(_handle_ids))

    @property
    def nbytes(self) -> int:
        """Bytes this write moves."""
        return self.count * self.block_bytes

    @property
    def contiguous(self) -> bool:
        return self.count == 1

    @property
    def dst_extent(self) -> int:
        """Bytes from dst_offset to the end of the last block."""
        return (self.count - 1) * self.dst_stride + self.block_bytes

    @property
    def src_extent(self) -> int:
        return (self.count - 1) * self.src_stride + self.block_bytes

    def describe(self) -> str:
        what = f"{self.block_bytes} B" if self.count == 1 else (
            f"{self.count} x {self.block_bytes} B (src stride {self.src_stride}, dst stride {self.dst_stride})"
        )
        return f"handle #{self.id} ({what} to rank {self.dst_rank} at offset {self.dst_offset})"

    def dst_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (exclusive) of every destination block."""
        starts = self.dst_offset + np.arange(self.count, dtype=np.int64) * self.dst_stride
        return starts, starts + self.block_bytes

    def _spec(self) -> tuple[int, int, int, int, int]:
        """What a target needs to know about a write into it (exchanged at commit)."""
        return (self.id, self.dst_offset, self.count, self.block_bytes, self.dst_stride)


def _int_arg(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise RmaError(f"declare_write: {name} must be an integer, got {value!r}")
    if value < minimum:
        raise RmaError(f"declare_write: {name}={value} must be >= {minimum}")
    return int(value)


def declare_strided_write(
    dst_window: Window,
    dst_offset: int,
    src_window: Window,
    src_offset: int,
    count: int,
    block_bytes: int,
    src_stride: int,
    dst_stride: int,
    dst_rank: int,
) -> MsgHandle:
    """Declare a block-stride write: block i goes from ``src_offset + i*src_stride`` to ``dst_offset + i*dst_stride``.

    No packing: the back-ends move the blocks where they are (2-D copies, a copy kernel,
    MPI vector datatypes, strided numpy views).
    """
    for w, role in ((dst_window, "dst_window"), (src_window, "src_window")):
        if not isinstance(w, Window):
            raise RmaError(f"declare_write: {role} must be a Window from rma.window_alloc, got {type(w).__name__}")
        w._check()
    if src_window.world is not dst_window.world or src_window.backend != dst_window.backend:
        raise RmaError(
            f"declare_write: src_window {src_window.index} ({src_window.backend}) and dst_window "
            f"{dst_window.index} ({dst_window.backend}) must belong to the same world and back-end"
        )
    dst_offset = _int_arg("dst_offset", dst_offset, 0)
    src_offset = _int_arg("src_offset", src_offset, 0)
    count = _int_arg("count", count, 1)
    block_bytes = _int_arg("block_bytes", block_bytes, 1)
    src_stride = _int_arg("src_stride", src_stride, 0) if count > 1 else block_bytes
    dst_stride = _int_arg("dst_stride", dst_stride, 0) if count > 1 else block_bytes
    if src_stride < block_bytes:
        raise RmaError(f"declare_write: src_stride={src_stride} is smaller than block_bytes={block_bytes}")
    if dst_stride < block_bytes:
        raise RmaError(
            f"declare_write: dst_stride={dst_stride} is smaller than block_bytes={block_bytes} (blocks would overlap)"
        )
    size = dst_window.world.size
    if isinstance(dst_rank, bool) or not isinstance(dst_rank, int | np.integer) or not 0 <= dst_rank < size:
        raise RmaError(f"declare_write: dst_rank={dst_rank!r} is out of range for a world of {size} ranks")
    h = MsgHandle(dst_window, dst_offset, src_window, src_offset, count, block_bytes, src_stride, dst_stride,
                  int(dst_rank))
    if dst_offset + h.dst_extent > dst_window.nbytes:
        raise RmaError(
            f"declare_write: {h.describe()} ends at byte {dst_offset + h.dst_extent}, past the end of "
            f"dst_window {dst_window.index} ({dst_window.nbytes} B)"
        )
    if src_offset + h.src_extent > src_window.nbytes:
        raise RmaError(
            f"declare_write: {h.describe()} reads up to byte {src_offset + h.src_extent} (src_offset {src_offset}), "
            f"past the end of src_window {src_window.index} ({src_window.nbytes} B)"
        )
    return h


def declare_write(
    dst_window: Window, dst_offset: int, src_window: Window, src_offset: int, nbytes: int, dst_rank: int
) -> MsgHandle:
    """Declare a contiguous write of ``nbytes`` from my ``src_window`` to ``dst_rank``'s ``dst_window``."""
    nbytes = _int_arg("nbytes", nbytes, 1)
    return declare_strided_write(dst_window, dst_offset, src_window, src_offset, 1, nbytes, nbytes, nbytes, dst_rank)


def _first_overlap(a: list[tuple[np.ndarray, np.ndarray, Any]]) -> tuple[Any, Any] | None:
    """The labels of two overlapping block sets among ``a`` (each (starts, ends, label)), or None."""
    if len(a) < 2:
        return None
    starts = np.concatenate([s for s, _, _ in a])
    ends = np.concatenate([e for _, e, _ in a])
    labels = np.concatenate([np.full(len(s), i, dtype=np.int64) for i, (s, _, _) in enumerate(a)])
    order = np.argsort(starts, kind="stable")
    starts, ends, labels = starts[order], ends[order], labels[order]
    # Running maximum of the ends so far: a block overlaps an earlier one if it starts before it.
    reach = np.maximum.accumulate(ends)
    bad = np.nonzero(starts[1:] < reach[:-1])[0]
    if len(bad) == 0:
        return None
    j = int(bad[0]) + 1
    owner = int(np.nonzero(ends[:j] > starts[j])[0][-1])  # an earlier block that reaches past start j
    return a[labels[owner]][2], a[labels[j]][2]


# -- waiting ------------------------------------------------------------------------------------
def poll_until(done: Callable[[], bool], deadline: float) -> bool:
    """Poll ``done`` until it holds (True) or ``deadline`` (monotonic) passes (False).

    Backs off from yielding to sleeping up to 1 ms: ranks share few CPU cores, and a
    spinning rank would starve the peer it waits for.
    """
    polls = 0
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return done()
        polls += 1
        time.sleep(0 if polls < 20 else min(1e-3, 1e-5 * (polls - 19)))


# -- queues -------------------------------------------------------------------------------------
_OPEN, _COMMITTED, _STARTED, _FREED = "open", "committed", "started", "freed"


class Queue:
    """A persistent chain of declared writes into ``window``, started and waited on repeatedly.

    ``Queue.alloc(window)`` is collective (every rank allocates its queues on a window in
    the same order), and so is ``commit()``. A cycle is ``start()`` then ``wait()``;
    ``wait()`` returns when my writes are complete and every declared origin's writes
    into my window for this epoch have arrived.
    """

    def __init__(self, window: Window, index: int, impl: Any) -> None:
        self.window = window
        self.world = window.world
        self.index = index
        self._impl = impl
        self._handles: list[MsgHandle] = []
        self._origins: list[int] = []
        self._state = _OPEN
        self.epoch = 0  # the last epoch started (host-driven); counters agree on it at commit
        self.post_at = "start"

    # construction ------------------------------------------------------------------------
    @classmethod
    def alloc(cls, window: Window, timeout: float | None = None) -> Queue:
        """Collective: a new, empty queue on ``window``."""
        if not isinstance(window, Window):
            raise RmaError(f"Queue.alloc: expected a Window, got {type(window).__name__}")
        window._check()
        # Same order of allocation on every rank, so the same index names the same queue everywhere.
        window._queue_count += 1
        index = window._queue_count
        impl = window._impl.new_queue(index, timeout)
        q = cls(window, index, impl)
        window._queues.append(q)
        return q

    @property
    def name(self) -> str:
        return f"rma queue {self.index} of window {self.window.index}"

    def _where(self) -> str:
        return f"{self.name} on rank {self.world.rank}"

    def _check_not_freed(self, op: str) -> None:
        if self._state == _FREED:
            raise RmaError(f"{op}: {self._where()} has been freed")

    @property
    def handles(self) -> tuple[MsgHandle, ...]:
        return tuple(self._handles)

    @property
    def origins(self) -> tuple[int, ...]:
        return tuple(self._origins)

    @property
    def targets(self) -> tuple[int, ...]:
        return tuple(sorted({h.dst_rank for h in self._handles}))

    def push(self, handle: MsgHandle) -> None:
        """Add a declared write to the chain (before commit)."""
        self._check_not_freed("push")
        if self._state != _OPEN:
            raise RmaError(f"push after commit on {self._where()}: call clear() first to change the chain")
        if not isinstance(handle, MsgHandle):
            raise RmaError(f"push: expected a MsgHandle from declare_write, got {type(handle).__name__}")
        if handle.dst_window is not self.window:
            raise RmaError(
                f"push: {handle.describe()} writes into window {handle.dst_window.index}, but {self.name} "
                f"belongs to window {self.window.index}"
            )
        handle.src_window._check()
        if any(h is handle for h in self._handles):
            raise RmaError(f"push: {handle.describe()} is already in {self.name}")
        same_rank = [h for h in self._handles if h.dst_rank == handle.dst_rank]
        lo, hi = handle.dst_offset, handle.dst_offset + handle.dst_extent
        for other in same_rank:
            if other.dst_offset >= hi or other.dst_offset + other.dst_extent <= lo:
                continue  # extents apart: cannot overlap
            if _first_overlap([(*other.dst_blocks(), other), (*handle.dst_blocks(), handle)]):
                raise RmaError(
                    f"push: {handle.describe()} overlaps {other.describe()} in {self.name}: "
                    f"two writes to the same destination bytes of rank {handle.dst_rank}"
                )
        self._handles.append(handle)

    def add_origin(self, rank: int) -> None:
        """Declare that ``rank`` writes into my window through this queue; wait() waits for it."""
        self._check_not_freed("add_origin")
        if self._state != _OPEN:
            raise RmaError(f"add_origin after commit on {self._where()}: call clear() first")
        size = self.world.size
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < size:
            raise RmaError(f"add_origin: rank {rank!r} is out of range for a world of {size} ranks")
        if int(rank) in self._origins:
            raise RmaError(f"add_origin: rank {rank} is already an origin of {self._where()}")
        self._origins.append(int(rank))

    def commit(self, post_at: str = "start", timeout: float | None = None) -> None:
        """Collective: check the chain against every peer's and build it once (descriptors, graphs, datatypes).

        ``post_at`` says when a target lets its origins write the next epoch: "start" (the
        default, like MPI's post: at my next start(), so I may read my window freely
        between wait() and start()) or "wait" (at the end of my wait(): lower latency, but I
        must not touch the incoming bytes after wait() returns, since origins may already be
        writing the next epoch). Every rank must pass the same value.
        """
        self._check_not_freed("commit")
        if self._state == _STARTED:
            raise RmaError(f"commit on {self._where()} while an epoch is in flight: call wait() first")
        if self._state == _COMMITTED:
            raise RmaError(f"commit on {self._where()}: already committed (call clear() to rebuild)")
        if post_at not in POST_AT:
            raise RmaError(f"commit: post_at={post_at!r} must be one of {', '.join(POST_AT)}")
        me = self.world.rank
        mine = {
            "targets": {t: [h._spec() for h in self._handles if h.dst_rank == t] for t in self.targets},
            "origins": list(self._origins),
            "epoch": self._impl.current_epoch(self.epoch),
            "post_at": post_at,
        }
        everyone = self.world.allgather_object(mine, timeout)
        modes = {r: d["post_at"] for r, d in enumerate(everyone)}
        if len(set(modes.values())) != 1:
            raise RmaError(f"commit of {self.name}: post_at differs between ranks ({modes})")
        problems = []
        for r, d in enumerate(everyone):
            for t in d["targets"]:
                if r not in everyone[t]["origins"]:
                    problems.append(f"rank {r} writes to rank {t} but rank {t} did not add_origin({r})")
            for o in d["origins"]:
                if r not in everyone[o]["targets"]:
                    problems.append(f"rank {r} added origin {o} but rank {o}'s queue writes nothing to rank {r}")
        if problems:
            raise RmaError(f"commit of {self.name}: " + "; ".join(sorted(set(problems))))
        # Two origins writing the same bytes of my window: only I can see both.
        incoming = []
        for o in self._origins:
            for hid, off, count, block, stride in everyone[o]["targets"][me]:
                starts = off + np.arange(count, dtype=np.int64) * stride
                incoming.append((starts, starts + block, (o, hid, off)))
        clash = _first_overlap(incoming)
        bad = None
        if clash:
            (o1, h1, off1), (o2, h2, off2) = clash
            bad = (f"commit of {self.name}: rank {o1}'s handle #{h1} (offset {off1}) and rank {o2}'s handle "
                   f"#{h2} (offset {off2}) write the same bytes of rank {me}'s window")
        # Everyone learns of a clash found anywhere, so no rank goes on to start alone.
        verdicts = self.world.allgather_object(bad, timeout)
        found = [v for v in verdicts if v]
        if found:
            raise RmaError(found[0])
        base = max(d["epoch"] for d in everyone)
        incoming_specs = {o: everyone[o]["targets"][me] for o in self._origins}
        self._impl.commit(self, base, post_at, incoming_specs, timeout)
        self.epoch = base
        self.post_at = post_at
        self._state = _COMMITTED

    # cycles ------------------------------------------------------------------------------
    def start(self) -> None:
        """Post my window to my origins and run my writes (host-driven)."""
        self._check_not_freed("start")
        if self._state == _OPEN:
            raise RmaError(f"start before commit on {self._where()}")
        if self._state == _STARTED:
            raise RmaError(f"start on {self._where()}: epoch {self.epoch} was started and not waited for")
        active = self.window._active_queue
        if active is not None and active is not self and self.window.backend == "mpi":
            raise RmaError(
                f"start on {self._where()}: {active.name} has an epoch in flight on the same mpi window; "
                "wait() for it first (MPI allows one access epoch per window)"
            )
        self.epoch += 1
        self._state = _STARTED
        self.window._active_queue = self
        self._impl.start(self.epoch)

    def wait(self, timeout: float | None = None) -> None:
        """Return once my writes are complete and every origin's writes for this epoch have arrived."""
        self._check_not_freed("wait")
        if self._state != _STARTED:
            raise RmaError(f"wait without start on {self._where()}")
        limit = resolve_timeout(timeout)
        try:
            self._impl.wait(self.epoch, limit)
        finally:
            self._state = _COMMITTED
            if self.window._active_queue is self:
                self.window._active_queue = None

    def _timeout(self, limit: float, what: str, ranks: list[int]) -> TimeoutError:
        """The one time-out error of a queue, naming the ranks that stalled."""
        return TimeoutError(
            f"{self._where()}: epoch {self.epoch} timed out after {limit:g} s {what} rank(s) "
            f"{', '.join(map(str, sorted(ranks)))} (CIRCUSLINK_TIMEOUT sets the limit)"
        )

    def clear(self) -> None:
        """Forget the chain and the origins (counters keep counting); push, add_origin and commit again."""
        self._check_not_freed("clear")
        if self._state == _STARTED:
            raise RmaError(f"clear on {self._where()} while epoch {self.epoch} is in flight: call wait() first")
        self._impl.clear()
        self._handles.clear()
        self._origins.clear()
        self._state = _OPEN

    def free(self, timeout: float | None = None) -> None:
        """Collective: release the queue's counters and descriptors. Idempotent."""
        if self._state == _FREED:
            return
        if self._state == _STARTED:
            raise RmaError(f"free on {self._where()} while epoch {self.epoch} is in flight: call wait() first")
        self._state = _FREED
        if self in self.window._queues:
            self.window._queues.remove(self)
        self._impl.free(timeout)

    # device-driven -----------------------------------------------------------------------
    def device_handle(self) -> int:
        """Address of the queue's device descriptor (cuda): pass it to a kernel as ``const circuslink::RmaQueue*``."""
        self._check_not_freed("device_handle")
        if self._state == _OPEN:
            raise RmaError(f"device_handle before commit on {self._where()}")
        if not hasattr(self._impl, "device_handle"):
            raise RmaError(f"device_handle: {self.name} uses the {self.window.backend} back-end; only cuda has one")
        return self._impl.device_handle()

    def check_device(self) -> None:
        """Raise the error a device-side start/wait recorded (call after the kernel finished), then clear it."""
        self._check_not_freed("check_device")
        if hasattr(self._impl, "check_device"):
            self._impl.check_device(self)

    def __repr__(self) -> str:
        return (f"Queue({self.name}, rank={self.world.rank}, handles={len(self._handles)}, "
                f"origins={self._origins}, state={self._state})")


def queue_alloc(window: Window, timeout: float | None = None) -> Queue:
    """Collective: ``Queue.alloc(window)``."""
    return Queue.alloc(window, timeout)

