"""Windows, declared writes and persistent queues: the back-end independent half of circuslink.rma.

Everything a user can get wrong is checked here, once, for every kind of window; the window modules
(``_cpu.py``, ``_cuda.py``: the back-end's, over the mapped memory of the transport inside a node, found with
``world.backend_module("circuslink.rma")``; ``_mpi.py``: MPI-3 windows, on request) only move bytes and flip
counters.

Epochs. Every queue counts its start/wait cycles (epoch 1, 2, ...). A target *posts*
epoch e (tells its origins "you may write into me now") and an origin writes its data,
then raises the target's per-origin *arrival* counter to e. Counters only grow, so
repeated cycles need no reset; the target's wait(e) is "arrival[o] >= e for every
declared origin o".

Time-outs. A queue's time-out is the one given to ``commit(timeout=)`` (else
``CIRCUSLINK_TIMEOUT``): every start() and wait() makes one :class:`~circuslink._wait.Deadline`
of it and passes it down to every wait under the call, host or device (the descriptor's
``timeout_ns``); ``wait(timeout=)`` overrides it for that call.

Lifecycle. Windows and queues are :class:`~circuslink._lifecycle.Resource` s registered on
their World: ``close()`` (``free()``, the QUDA interface's name), ``with``, and on an error
they release what they hold on this rank without waiting for peers.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._lifecycle import Resource
from .._wait import Deadline
from ..errors import RmaError

MEMORY = ("mapped", "mpi3")  # where a window lives: circuslink's mapped memory, or an MPI-3 window
POST_AT = ("start", "wait")
_handle_ids = itertools.count(1)
_WINDOW_COUNTER = "circuslink.rma.windows"  # World.registry key: window numbers, per world


def _window_module(world: Any, memory: str):
    """The module that runs windows of ``memory``: the back-end's (``rma._cpu`` / ``rma._cuda``) for mapped memory,
    ``rma._mpi`` for MPI-3 windows."""
    if memory == "mpi3":
        return importlib.import_module(f"{__package__}._mpi")
    return world.backend_module(__package__)


def _rank_arg(op: str, rank: Any, size: int) -> int:
    """``rank`` as an int, refused in one line naming ``op`` unless it is a rank of a world of ``size``."""
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < size:
        raise RmaError(f"{op}: rank {rank!r} is out of range for a world of {size} ranks")
    return int(rank)


# -- windows ------------------------------------------------------------------------------------
class Window(Resource):
    """A region of every rank's memory that remote writes may target. Create with :func:`window_alloc`."""

    def __init__(self, world: Any, nbytes: int, memory: str, impl: Any, index: int) -> None:
        self.world = world
        self.nbytes = nbytes
        self.memory = memory  # "mapped" or "mpi3"
        # for messages only (code asks the window's module, never the label)
        self.label = f"mapped ({world.backend.name})" if memory == "mapped" else "MPI-3"
        self.index = index
        self._kind = f"rma window {index}"
        self._impl = impl
        self._queues: list[Queue] = []
        self._active_queue: Queue | None = None  # windows with one access epoch at a time (MPI-3)
        self._queue_count = 0

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

    def peer(self, rank: int):
        """Rank ``rank``'s part of the window, mapped here, as a uint8 array (numpy on cpu, cupy when the world is
        cuda: its ``data.ptr`` is the device address a kernel stores through): where a queue's origin writes
        itself (:meth:`Queue.add_target`). Windows of MPI-3 memory have no such mapping."""
        self._check()
        rank = _rank_arg("Window.peer", rank, self.world.size)
        if not hasattr(self._impl, "peer"):
            raise RmaError(f"Window.peer: window {self.index} is {self.label} memory, which maps no peer's part; "
                           "use memory='mapped'")
        return self._impl.peer(rank)

    @property
    def freed(self) -> bool:
        return self._closed

    @property
    def queues(self) -> tuple[Queue, ...]:
        """The open queues allocated on this window, oldest first."""
        return tuple(self._queues)

    def _check(self) -> None:
        if self._closed:
            raise RmaError(f"window {self.index} has been freed")

    def free(self, timeout: float | None = None) -> None:
        """Collective: free the window and every queue allocated on it (``close()``). Idempotent."""
        self.close(timeout)

    def close(self, timeout: float | Deadline | None = None) -> None:
        """Collective: free the window and its queues (see :meth:`free`). Refused while a queue has an epoch
        in flight (nothing is released then)."""
        busy = [q for q in self._queues if q._state == _STARTED]
        if not self._closed and busy:
            raise RmaError(f"free on window {self.index}: {busy[0]._where()} has epoch {busy[0].epoch} in flight: "
                           "call wait() first")
        super().close(timeout)

    def _close(self, timeout: float | Deadline | None) -> None:
        deadline = Deadline.after(timeout)  # one limit for the whole free: queues and window together
        for q in reversed(list(self._queues)):
            q.close(deadline)
        self._impl.close(deadline)

    def _release_local(self) -> None:
        for q in reversed(list(self._queues)):
            q.release_local()
        self._impl.release_local()

    def __repr__(self) -> str:
        return f"Window(index={self.index}, nbytes={self.nbytes}, memory={self.memory!r}, rank={self.world.rank})"


def window_alloc(world: Any, nbytes: int, memory: str = "mapped", timeout: float | None = None) -> Window:
    """Collective: a window of ``nbytes`` (zeroed) on every rank.

    ``memory``: "mapped" (the memory the transport inside a node maps, ``circuslink.transport.map_memory``:
    shared memory on cpu, CUDA IPC on cuda) or "mpi3" (an MPI-3 window, the MPI back-end of the RMA papers;
    needs a job started by mpirun; on a world with a GPU the data lives on the GPU and is staged through host
    memory). ``timeout`` bounds the collective allocation.
    """
    if not isinstance(nbytes, int | np.integer) or isinstance(nbytes, bool) or nbytes <= 0:
        raise RmaError(f"window_alloc: nbytes must be a positive integer, got {nbytes!r}")
    nbytes = int(nbytes)
    name = memory.lower() if isinstance(memory, str) else memory
    if name not in MEMORY:
        raise RmaError(f"window_alloc: unknown memory {memory!r}: choose {' or '.join(MEMORY)}")
    module = _window_module(world, name)
    deadline = Deadline.after(timeout)
    impl = module.open_window(world, nbytes, deadline)
    # The same order of allocation on every rank, so the same number names the same window everywhere.
    index = next(world.registry(_WINDOW_COUNTER, lambda: itertools.count(1)))
    win = Window(world, nbytes, name, impl, index)
    win._register(world)
    return win


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
    if src_window.world is not dst_window.world or src_window.memory != dst_window.memory:
        raise RmaError(
            f"declare_write: src_window {src_window.index} ({src_window.label}) and dst_window "
            f"{dst_window.index} ({dst_window.label}) must belong to the same world and memory"
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


# -- queues -------------------------------------------------------------------------------------
_OPEN, _COMMITTED, _STARTED = "open", "committed", "started"


class Queue(Resource):
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
        self._kind = f"rma queue {index} of window {window.index}"
        self._impl = impl
        self._handles: list[MsgHandle] = []
        self._origins: list[int] = []
        self._own_targets: list[int] = []  # add_target: ranks whose window I write myself
        self._state = _OPEN
        self.epoch = 0  # the last epoch started (host-driven); counters agree on it at commit
        self.post_at = "start"
        self.timeout: float | None = None  # seconds: the queue's time-out, fixed at commit

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
        impl = window._impl.new_queue(Deadline.after(timeout))
        q = cls(window, index, impl)
        window._queues.append(q)
        q._register(window.world)
        return q

    @property
    def name(self) -> str:
        return f"rma queue {self.index} of window {self.window.index}"

    def _where(self) -> str:
        return f"{self.name} on rank {self.world.rank}"

    def _stall(self, what: str, ranks: Any, epoch: int | None = None) -> str:
        """What a time-out of this queue names: queue, rank, epoch, and the ranks it waited for."""
        return (f"{self._where()}: epoch {self.epoch if epoch is None else epoch} {what} rank(s) "
                f"{', '.join(map(str, sorted(ranks)))}")

    def _check_not_freed(self, op: str) -> None:
        if self._closed:
            raise RmaError(f"{op}: {self._where()} has been freed")

    @property
    def handles(self) -> tuple[MsgHandle, ...]:
        return tuple(self._handles)

    @property
    def origins(self) -> tuple[int, ...]:
        return tuple(self._origins)

    @property
    def targets(self) -> tuple[int, ...]:
        return tuple(sorted({h.dst_rank for h in self._handles} | set(self._own_targets)))

    @property
    def signal_only(self) -> bool:
        """Whether the queue's writes are its origin's own stores (:meth:`add_target`): no chain to copy."""
        return bool(self._own_targets)

    @property
    def committed(self) -> bool:
        """True between commit() and clear() / free()."""
        return self._state != _OPEN and not self._closed

    def push(self, handle: MsgHandle) -> None:
        """Add a declared write to the chain (before commit)."""
        self._check_not_freed("push")
        if self._state != _OPEN:
            raise RmaError(f"push after commit on {self._where()}: call clear() first to change the chain")
        if not isinstance(handle, MsgHandle):
            raise RmaError(f"push: expected a MsgHandle from declare_write, got {type(handle).__name__}")
        if self._own_targets:
            raise RmaError(f"push on {self._where()}: its writes are the caller's own (add_target); a queue is "
                           "either a chain of declared writes or that, not both")
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
        rank = _rank_arg("add_origin", rank, self.world.size)
        if rank in self._origins:
            raise RmaError(f"add_origin: rank {rank} is already an origin of {self._where()}")
        self._origins.append(rank)

    def add_target(self, rank: int) -> None:
        """Declare that I write into ``rank``'s window myself, through its mapping here (:meth:`Window.peer`):
        my kernel's own stores are the epoch's writes, made before the start, whose only job is then to release
        them and tell the target (a signal-only queue: nothing to copy, so its output can be the message itself).
        Nothing is posted and no post is waited for, so which bytes I may write when is the caller's protocol:
        for instance two halves of the target's window alternating by epoch, written only after the wait for
        the target's previous epoch. A queue is either this or a chain of declared writes (push), not both."""
        self._check_not_freed("add_target")
        if self._state != _OPEN:
            raise RmaError(f"add_target after commit on {self._where()}: call clear() first")
        rank = _rank_arg("add_target", rank, self.world.size)
        if self._handles:
            raise RmaError(f"add_target on {self._where()}: it has a chain of declared writes (push); a queue is "
                           "either that or the caller's own writes, not both")
        if rank in self._own_targets:
            raise RmaError(f"add_target: rank {rank} is already a target of {self._where()}")
        if not hasattr(self.window._impl, "peer"):
            raise RmaError(f"add_target on {self._where()}: the {self.window.label} window maps no peer's part, "
                           "so nothing could write it; use memory='mapped'")
        self._own_targets.append(rank)

    def commit(self, post_at: str = "start", timeout: float | None = None) -> None:
        """Collective: check the chain against every peer's and build it once (descriptors, graphs, datatypes).

        ``post_at`` says when a target lets its origins write the next epoch: "start" (the
        default, like MPI's post: at my next start(), so I may read my window freely
        between wait() and start()) or "wait" (at the end of my wait(): lower latency, but I
        must not touch the incoming bytes after wait() returns, since origins may already be
        writing the next epoch). Every rank must pass the same value.

        ``timeout`` (seconds, default ``CIRCUSLINK_TIMEOUT``) bounds commit itself and becomes the
        queue's time-out: every wait under a later start() or wait(), on the host or on the
        device, gives up after it (``wait(timeout=)`` overrides it for one call). If commit fails,
        whatever it built is released and the queue is open again, as before the call.
        """
        self._check_not_freed("commit")
        if self._state == _STARTED:
            raise RmaError(f"commit on {self._where()} while an epoch is in flight: call wait() first")
        if self._state == _COMMITTED:
            raise RmaError(f"commit on {self._where()}: already committed (call clear() to rebuild)")
        if post_at not in POST_AT:
            raise RmaError(f"commit: post_at={post_at!r} must be one of {', '.join(POST_AT)}")
        deadline = Deadline.after(timeout)
        me = self.world.rank
        mine = {
            "targets": {t: [h._spec() for h in self._handles if h.dst_rank == t] for t in self.targets},
            "origins": list(self._origins),
            "epoch": self._impl.current_epoch(self.epoch, deadline),
            "post_at": post_at,
            "signal_only": self.signal_only,
        }
        everyone = self.world.allgather_object(mine, deadline)
        modes = {r: d["post_at"] for r, d in enumerate(everyone)}
        if len(set(modes.values())) != 1:
            raise RmaError(f"commit of {self.name}: post_at differs between ranks ({modes})")
        own = {r: d["signal_only"] for r, d in enumerate(everyone)}
        if len(set(own.values())) != 1:
            raise RmaError(f"commit of {self.name}: ranks {sorted(r for r, v in own.items() if v)} write themselves "
                           f"(add_target) and ranks {sorted(r for r, v in own.items() if not v)} push a chain; "
                           "every rank's queue must be the same kind")
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
        verdicts = self.world.allgather_object(bad, deadline)
        found = [v for v in verdicts if v]
        if found:
            raise RmaError(found[0])
        base = max(d["epoch"] for d in everyone)
        incoming_specs = {o: everyone[o]["targets"][me] for o in self._origins}
        try:
            self._impl.commit(self, base, post_at, incoming_specs, deadline)
        except BaseException:
            try:
                self._impl.clear(None)  # nothing half-built stays behind: the queue is open, as before
            except Exception:  # noqa: S110 - the commit's own error is the one to report
                pass
            raise
        self.epoch = base
        self.post_at = post_at
        self.timeout = deadline.limit
        self._state = _COMMITTED

    # cycles ------------------------------------------------------------------------------
    def start(self, stream: Any = None) -> None:
        """Post my window to my origins and run my writes (host-driven).

        ``stream`` (windows whose module runs on a device only): enqueue the start on this stream, ordered
        after the work already on it and returning at once, e.g. inside a CUDA graph capture; by
        default it runs on the world's stream, after the caller's current stream.
        """
        self._check_startable("start", stream)
        active = self.window._active_queue
        if active is not None and active is not self and self.window._impl.one_epoch_per_window:
            raise RmaError(
                f"start on {self._where()}: {active.name} has an epoch in flight on the same {self.window.label} "
                "window; wait() for it first (MPI allows one access epoch per window)"
            )
        self.epoch += 1
        self._state = _STARTED
        self.window._active_queue = self
        self._impl.start(self.epoch, Deadline.after(self.timeout), stream)

    def wait(self, timeout: float | None = None, stream: Any = None, block: bool = True) -> None:
        """Return once my writes are complete and every origin's writes for this epoch have arrived.

        ``timeout`` overrides the queue's time-out for this call. ``stream`` (on a device only):
        enqueue the wait on this stream instead of the world's. ``block=False`` (on a device only)
        enqueues the wait and returns at once: work queued after it on the same stream runs once
        the epoch is complete; a time-out it records is raised by :meth:`check_device` (or the
        next blocking wait). The queue may be started again right away.
        """
        self._check_not_freed("wait")
        if self._state != _STARTED:
            raise RmaError(f"wait without start on {self._where()}")
        self._check_stream("wait", stream, block)
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        try:
            self._impl.wait(self.epoch, deadline, stream, block)
        finally:
            self._state = _COMMITTED
            if self.window._active_queue is self:
                self.window._active_queue = None

    def cycle(self, stream: Any = None) -> None:
        """One whole epoch: :meth:`start` then :meth:`wait`.

        ``stream`` (windows whose module runs on a device only): both are enqueued on it as one launch where the
        module can (cuda, SM copies: one kernel whose last block waits for the origins, with the queue's
        time-out; copy-engine queues: the start's nodes and the wait kernel) and the call returns at once, as
        ``wait(stream=, block=False)`` does: a time-out it records is raised by :meth:`check_device`. A CUDA graph
        of cycles then holds one kernel node a cycle instead of two.
        """
        if stream is None:
            self.start()
            self.wait()
            return
        self._check_startable("cycle", stream, block=False)
        self.epoch += 1
        self._impl.cycle(self.epoch, Deadline.after(self.timeout), stream)

    def _check_startable(self, op: str, stream: Any, block: bool = True) -> None:
        """What a new epoch needs (start, cycle): a live, committed queue with no epoch in flight, and a stream only
        where the window's module has them."""
        self._check_not_freed(op)
        if self._state == _OPEN:
            raise RmaError(f"{op} before commit on {self._where()}")
        if self._state == _STARTED:
            raise RmaError(f"{op} on {self._where()}: epoch {self.epoch} was started and not waited for")
        self._check_stream(op, stream, block)

    def _check_stream(self, op: str, stream: Any, block: bool = True) -> None:
        if (stream is not None or not block) and not self.window._impl.runs_on_streams:
            what = "stream=" if stream is not None else "block=False"
            raise RmaError(f"{op}({what}) on {self._where()}: the {self.window.label} window runs on the host "
                           "and has no streams; leave stream=None and block=True")

    def clear(self) -> None:
        """Forget the chain and the origins (counters keep counting); push, add_origin and commit again."""
        self._check_not_freed("clear")
        if self._state == _STARTED:
            raise RmaError(f"clear on {self._where()} while epoch {self.epoch} is in flight: call wait() first")
        self._impl.clear(Deadline.after(self.timeout))
        self._handles.clear()
        self._origins.clear()
        self._own_targets.clear()
        self._state = _OPEN

    def free(self, timeout: float | None = None) -> None:
        """Collective: release the queue's counters and descriptors (``close()``). Idempotent."""
        self.close(timeout)

    def close(self, timeout: float | Deadline | None = None) -> None:
        """Collective: release the queue (see :meth:`free`). Refused while an epoch is in flight."""
        if not self._closed and self._state == _STARTED:
            raise RmaError(f"free on {self._where()} while epoch {self.epoch} is in flight: call wait() first")
        super().close(timeout)

    def _close(self, timeout: float | Deadline | None) -> None:
        self._forget_window()
        self._impl.close(Deadline.after(timeout))

    def _release_local(self) -> None:
        self._forget_window()
        self._impl.release_local()

    def _forget_window(self) -> None:
        if self in self.window._queues:
            self.window._queues.remove(self)
        if self.window._active_queue is self:
            self.window._active_queue = None

    # plan and device-driven ----------------------------------------------------------------
    def describe(self) -> dict:
        """The queue and, once committed, the plan its window's module built: a dict for logs and benchmarks.

        Keys: ``queue``, ``rank``, ``memory``, ``state``, ``epoch``, ``post_at``, ``timeout_s``,
        ``targets``, ``origins``, ``signal_only`` (:meth:`add_target`), ``handles`` (their descriptions),
        ``transposes`` (one entry per
        transposing put: handle id, dtype, rows, cols and ``tile``, the (m, n) the module uses, None
        where it moves the block whole); once committed, the module's own (cuda: ``launch``
        "kernel" or "graph", ``grid``, ``threads``, ``work_units``).
        """
        from ._transpose import is_transpose

        state = "freed" if self._closed else self._state
        plan = self._impl.describe() if self._state != _OPEN and not self._closed else {}
        tiles = plan.pop("tiles", {})
        transposes = [{"handle": h.id, "dtype": h.dtype, "rows": h.rows, "cols": h.cols, "dst_rank": h.dst_rank,
                       "tile": tiles.get(h.id, h.tile)} for h in self._handles if is_transpose(h)]
        return {"queue": self.name, "rank": self.world.rank, "memory": self.window.memory, "state": state,
                "epoch": self.epoch, "post_at": self.post_at, "timeout_s": self.timeout,
                "targets": list(self.targets), "origins": list(self._origins),
                "signal_only": self.signal_only, "handles": [h.describe() for h in self._handles],
                "transposes": transposes, **plan}

    def device_handle(self) -> np.void:
        """The queue's device handle: a numpy scalar of ``circuslink::RmaHandle``, passed to a kernel by value.

        ``kernel(grid, block, (q.device_handle(), ...))`` with a kernel taking ``circuslink::RmaHandle q`` by value
        calling ``circuslink::rma_start(q)`` / ``rma_wait(q)`` (``<circuslink/rma.cuh>``)."""
        self._check_not_freed("device_handle")
        if self._state == _OPEN:
            raise RmaError(f"device_handle before commit on {self._where()}")
        if not hasattr(self._impl, "device_handle"):
            raise RmaError(f"device_handle: {self.name} uses the {self.window.label} window, which runs no "
                           "kernels; device-driven queues need a world whose back-end runs kernels")
        return self._impl.device_handle()

    def check_device(self) -> None:
        """Raise the error a device-side start/wait recorded, then clear it.

        Call it after the kernel that drove the queue finished; it waits (bounded by the queue's
        time-out) for the work on the world's stream first; synchronise streams of your own yourself."""
        self._check_not_freed("check_device")
        if hasattr(self._impl, "check_device"):
            self._impl.check_device(Deadline.after(self.timeout))

    def __repr__(self) -> str:
        state = "freed" if self._closed else self._state
        return (f"Queue({self.name}, rank={self.world.rank}, handles={len(self._handles)}, "
                f"origins={self._origins}, state={state})")


def queue_alloc(window: Window, timeout: float | None = None) -> Queue:
    """Collective: ``Queue.alloc(window)``."""
    return Queue.alloc(window, timeout)


_MEETING = "circuslink.rma.meeting"  # World.registry key: the world's meeting queue (or None)


def meeting_queue(world: Any) -> Queue | None:
    """Collective on first use: the world's meeting queue, a committed signal-only queue between every pair of
    ranks (each signals every other and waits for them). One cycle enqueued on a stream (``q.start(stream=s)``,
    ``q.wait(stream=s, block=False)``) is a device-side barrier: work behind it on ``s`` starts once every rank's
    GPU is there, not when each rank's host left a host barrier (as NVSHMEM's ``barrier_all_on_stream``). Made
    once per world, freed with it. None on one rank, and where the ranks span nodes (no window maps every peer):
    callers then meet at the host barrier alone. After the work, ``q.check_device()`` raises what a device-side
    wait recorded, naming the rank that did not come."""
    if world.size < 2:
        return None
    return world.registry(_MEETING, lambda: _make_meeting_queue(world))


def meet(world: Any) -> Queue | None:
    """One cycle of the world's meeting queue (collective): on a device enqueued on the caller's current stream
    with no host wait, so that work queued behind it starts once every rank's GPU is there; on the cpu a
    host-driven cycle, returning once every rank has come. Returns the queue, whose ``check_device()`` after the
    work raises what a device-side wait recorded; None where there is no meeting queue (one rank, several nodes):
    the caller meets at the host barrier alone."""
    queue = meeting_queue(world)
    if queue is None:
        return None
    if world.device is None:
        queue.start()
        queue.wait()
        return queue
    stream = world.xp.cuda.get_current_stream()
    queue.start(stream=stream)
    queue.wait(stream=stream, block=False)
    return queue


def _make_meeting_queue(world: Any) -> Queue | None:
    if len(world.nodes) > 1:  # every rank sees the same layout, so every rank decides alike
        return None
    queue = Queue.alloc(window_alloc(world, 64))
    for r in range(world.size):
        if r != world.rank:
            queue.add_target(r)
            queue.add_origin(r)
    queue.commit()
    return queue
