"""MPI-3 windows: the RMA papers' MPI back-end (``MPI_Put`` inside PSCW epochs), ``window_alloc(memory="mpi3")``.

A back-end of RMA, not a transport: it is the comparison the persistent queues are measured against, and it
takes MPI from the world's bootstrap (``world.mpi``: the module, COMM_WORLD), which initialised it once.

A window is ``MPI.Win.Allocate``: MPI owns the host memory, so Open MPI can serve it with its
shared-memory one-sided component inside a node. (``MPI_Win_create`` over our own buffer needs
a single-copy transport, which the device machines' Open MPI has switched off:
``btl_vader_single_copy_mechanism=none`` makes it fail with MPI_ERR_WIN.) A cycle is

    start():  MPI_Win_post(origins)   MPI_Win_start(targets)   MPI_Put ... (one per handle)
    wait():   MPI_Win_complete()      MPI_Win_test() until done (our time-out), H2D of incoming bytes

Strided handles use MPI vector datatypes for origin and target, built once at commit.
On a cuda world ``local`` is device memory and the window a host mirror: start() copies
my source blocks device -> host, wait() copies the incoming blocks host -> device (this
Open MPI is not CUDA-aware, so a user of it would stage the same way). Block-stride
staging uses 2-D copies so bytes between blocks are never touched.

The target side (the usual stall) polls MPI_Win_test through :func:`circuslink._wait.wait_until`
with the deadline the queue passes down (the queue's time-out, or wait()'s). MPI gives no way
to bound MPI_Win_complete (an origin whose target never posts blocks there), nor the
collective MPI_Win_allocate / MPI_Win_free: those run under :func:`bounded`, a watchdog
thread that, at the same deadline, prints the one time-out error naming the queue and the
peers and ends the process (MPI cannot cancel the call; mpirun then ends the job). mpi4py
releases the GIL inside these calls, so the watchdog can run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._wait import Deadline, timeout_error, wait_until
from ..errors import RmaError
from ._transpose import _mpi as transposes
from ._transpose import is_transpose

What = str | Callable[[], str]


def _text(what: What) -> str:
    return what() if callable(what) else what


class _Watchdog:
    """One thread per process that ends it when an armed, unboundable call outlives its deadline.

    Arming is a plain lock and (rarely) a notify, cheap enough to wrap every cycle of a
    benchmark; the thread is started once.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._deadline: Deadline | None = None
        self._what: What | None = None
        self._wake_at = float("inf")  # when the thread next looks: arm() notifies only if sooner
        self._thread: threading.Thread | None = None

    def arm(self, deadline: Deadline, what: What) -> None:
        with self._cond:
            self._deadline, self._what = deadline, what
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="circuslink-mpi-watchdog", daemon=True)
                self._thread.start()
            elif deadline.at < self._wake_at:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = self._what = None

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._deadline is None:
                    self._wake_at = now + 1.0
                elif now >= self._deadline.at:
                    self._fire(self._what, self._deadline)
                else:
                    self._wake_at = self._deadline.at
                self._cond.wait(self._wake_at - now)

    @staticmethod
    def _fire(what: What | None, deadline: Deadline) -> None:
        msg = str(timeout_error(_text(what) if what is not None else "an MPI call", deadline))
        # The main thread is stuck inside MPI, which cannot cancel the call: say what stalled and
        # leave without MPI_Finalize (it would wait for the stalled peer too); mpirun ends the job.
        sys.stderr.write(f"circuslink: TimeoutError: {msg}; MPI cannot cancel the call, so this rank exits\n")
        sys.stderr.flush()
        os._exit(124)


_watchdog = _Watchdog()


class bounded:  # noqa: N801 - used like a function: ``with bounded(deadline, what): comm.Call()``
    """Run a blocking MPI call that MPI cannot bound; past ``deadline`` end the process with the one
    time-out error naming ``what`` (a string, or a function called only on a time-out).

    ``deadline`` is a :class:`~circuslink._wait.Deadline` passed down by the caller (or seconds, or
    None for ``CIRCUSLINK_TIMEOUT``). One bounded call at a time per process (circuslink drives MPI
    from one thread).
    """

    __slots__ = ("_deadline", "_what")

    def __init__(self, deadline: Deadline | float | None, what: What) -> None:
        self._deadline = Deadline.after(deadline)
        self._what = what

    def __enter__(self) -> None:
        _watchdog.arm(self._deadline, self._what)

    def __exit__(self, *exc: object) -> None:
        _watchdog.disarm()


def poll_request(request: Any, deadline: Deadline | float | None, what: What) -> None:
    """Complete a non-blocking MPI request by polling ``Test`` (the one host wait), or raise the one
    :class:`~circuslink.TimeoutError` naming ``what`` at ``deadline``."""
    wait_until(request.Test, deadline, what)


def _collective_stall(where: str, call: str, world: Any) -> str:
    return (f"{where} on rank {world.rank}: {call} (collective) did not return: some rank of {world.size} "
            "did not join")


def open_window(world: Any, nbytes: int, deadline: Deadline) -> MpiWindow:
    """This module's half of ``rma.window_alloc(memory="mpi3")`` (collective)."""
    return MpiWindow(world, nbytes, deadline)


class MpiWindow:
    runs_on_streams = False  # host-driven: MPI calls, staging waited for on the host
    one_epoch_per_window = True  # MPI allows one access epoch per window

    def __init__(self, world: Any, nbytes: int, deadline: Deadline) -> None:
        if world.mpi is None:
            raise RmaError("window_alloc(memory='mpi3') needs a job started by mpirun (world.mpi is None)")
        comm, MPI = world.mpi.comm, world.mpi.MPI
        self.world = world
        self.comm = comm
        self.nbytes = nbytes
        # With a GPU the user's data lives there and MPI (not CUDA-aware here) works on a host mirror.
        self.on_gpu = world.device is not None
        self.device = world.xp.zeros(nbytes, dtype=np.uint8) if self.on_gpu else None
        self.win = None
        self.group = None
        calls = "MPI_Win_allocate + MPI_Barrier"
        with bounded(deadline, lambda: _collective_stall("window_alloc(memory='mpi3')", calls, world)):
            self.win = MPI.Win.Allocate(nbytes, disp_unit=1, comm=comm)
            self.host = np.frombuffer(self.win.tomemory(), dtype=np.uint8, count=nbytes)
            self.host[:] = 0
            comm.Barrier()  # every window is zeroed before any rank may write into it
        self.group = comm.Get_group()

    @property
    def local(self):
        return self.device if self.on_gpu else self.host

    def new_queue(self, deadline: Deadline) -> MpiQueue:
        return MpiQueue(self)

    def close(self, deadline: Deadline) -> None:
        if self.win is not None:
            world = self.world
            with bounded(deadline, lambda: _collective_stall("window free (memory='mpi3')", "MPI_Win_free", world)):
                self.host = None  # a view of MPI's memory, which Free releases
                self.win.Free()  # collective
            self.win = None
        self.release_local()

    def release_local(self) -> None:
        # MPI_Win_free is collective: on the error path the window is left to MPI_Finalize (or the
        # job's end); what is ours alone goes now.
        if self.group is not None:
            self.group.Free()
            self.group = None
        self.device = None


def _copy_blocks(dst_ptr: int, src_ptr: int, count: int, block: int, dst_stride: int, src_stride: int,
                 kind: int, stream: Any) -> None:
    """Host <-> device staging of one strided pattern, with one 2-D copy."""
    import cupy as cp

    cp.cuda.runtime.memcpy2DAsync(dst_ptr, dst_stride, src_ptr, src_stride, block, count, kind, stream.ptr)


class MpiQueue:
    def __init__(self, window: MpiWindow) -> None:
        self.window = window
        self.world = window.world
        self.queue: Any = None
        self.puts: list[tuple] = []
        self.types: list[Any] = []
        self.origin_group = None
        self.target_group = None
        self.stage_out: list[tuple] = []
        self.stage_in: list[tuple] = []
        self.post_at = "start"
        self.posted = False

    def current_epoch(self, host_epoch: int, deadline: Deadline) -> int:
        return host_epoch

    def commit(self, queue: Any, base: int, post_at: str, incoming: dict, deadline: Deadline) -> None:
        if post_at == "wait":
            # An exposure epoch left open by wait() could only be closed by every origin
            # running an empty access epoch; MPI's PSCW has no cheaper way, so we refuse.
            raise RmaError(f"commit of {queue.name}: post_at='wait' is not supported by MPI-3 windows")
        MPI = self.world.mpi.MPI
        self.queue = queue
        self.post_at = post_at
        win = self.window
        for h in queue.handles:
            src = h.src_window._impl
            if is_transpose(h):  # MPI derived datatypes do the transpose
                origin, target, types, stage = transposes.put(h, src, MPI)
                self.types += types
                self.puts.append((origin, h.dst_rank, target))
                if win.on_gpu:
                    self.stage_out.append(stage)
                continue
            if h.count == 1:
                origin = [src.host[h.src_offset: h.src_offset + h.block_bytes], h.block_bytes, MPI.BYTE]
                target = (h.dst_offset, h.block_bytes, MPI.BYTE)
            else:
                otype = MPI.BYTE.Create_vector(h.count, h.block_bytes, h.src_stride).Commit()
                self.types.append(otype)
                ttype = MPI.BYTE.Create_vector(h.count, h.block_bytes, h.dst_stride).Commit()
                self.types.append(ttype)
                origin = [src.host[h.src_offset: h.src_offset + h.src_extent], 1, otype]
                target = (h.dst_offset, 1, ttype)
            self.puts.append((origin, h.dst_rank, target))
            if win.on_gpu:
                self.stage_out.append((src, h.src_offset, h.count, h.block_bytes, h.src_stride))
        for specs in incoming.values():
            for _hid, off, count, block, stride in specs:
                self.stage_in.append((off, count, block, stride))
        group = win.group
        self.origin_group = group.Incl(sorted(queue.origins)) if queue.origins else None
        self.target_group = group.Incl(list(queue.targets)) if queue.targets else None

    def describe(self) -> dict:
        return {"puts": len(self.puts), "datatypes": len(self.types), "staged": self.window.on_gpu,
                "tiles": {}}

    def _post(self) -> None:
        if self.origin_group is not None and not self.posted:
            self.window.win.Post(self.origin_group)
            self.posted = True

    def _stage(self, copies: list, to_device: bool, deadline: Deadline, what: str) -> None:
        """Host <-> device staging of ``copies`` on the world's stream, waited for (bounded)."""
        import cupy as cp

        win, backend = self.window, self.world.backend
        stream = backend.stream
        backend.after_caller()  # after what the caller queued on its stream (sources, or reads of the window)
        if to_device:
            h2d = cp.cuda.runtime.memcpyHostToDevice
            for off, count, block, stride in copies:
                _copy_blocks(win.device.data.ptr + off, win.host.ctypes.data + off, count, block, stride, stride,
                             h2d, stream)
        else:
            d2h = cp.cuda.runtime.memcpyDeviceToHost
            for src, off, count, block, stride in copies:
                _copy_blocks(src.host.ctypes.data + off, src.device.data.ptr + off, count, block, stride, stride,
                             d2h, stream)
        backend.wait_stream(stream, deadline, lambda: f"{self.queue._where()}: {what}")

    def start(self, epoch: int, deadline: Deadline, stream: Any) -> None:
        win = self.window
        if win.on_gpu and self.stage_out:
            self._stage(self.stage_out, False, deadline, f"epoch {epoch}'s sources staged to the host")
        if self.post_at == "start":
            self._post()
        if self.target_group is not None:
            targets = list(self.queue.targets)
            with bounded(deadline, lambda: self.queue._stall(
                    "in start() (MPI_Win_start / MPI_Put) waiting for the post of target", targets, epoch)):
                win.win.Start(self.target_group)
                for origin, rank, target in self.puts:
                    win.win.Put(origin, rank, target)

    def wait(self, epoch: int, deadline: Deadline, stream: Any, block: bool) -> None:
        win, queue = self.window, self.queue
        if self.target_group is not None:
            # Where an origin waits for its targets' posts depends on the osc component (osc/sm:
            # MPI_Win_start; osc/rdma and pt2pt: MPI_Win_complete); neither can be bounded but by the watchdog.
            targets = list(queue.targets)
            with bounded(deadline, lambda: queue._stall(
                    "in wait() (MPI_Win_complete) waiting for the post of target", targets, epoch)):
                win.win.Complete()
        if self.origin_group is not None:
            # On a time-out the exposure epoch stays open: MPI cannot cancel it. The job must end.
            origins = list(queue.origins)
            wait_until(win.win.Test, deadline, lambda: queue._stall("waiting for the writes of origin", origins, epoch))
            self.posted = False
            if win.on_gpu and self.stage_in:
                self._stage(self.stage_in, True, deadline, f"epoch {epoch}'s incoming bytes staged to the device")

    def clear(self, deadline: Deadline | None) -> None:
        for t in self.types:
            t.Free()
        self.types = []
        self.puts = []
        self.stage_out = []
        self.stage_in = []
        for g in (self.origin_group, self.target_group):
            if g is not None:
                g.Free()
        self.origin_group = self.target_group = None

    def close(self, deadline: Deadline) -> None:
        self.clear(deadline)
        self.world.barrier(deadline)

    def release_local(self) -> None:
        self.clear(None)
