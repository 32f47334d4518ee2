"""The cuda back-end: symmetric memory in device memory, shared over NVLink by CUDA IPC.

Buffers come from plain ``cudaMalloc`` (never managed memory). Each rank exports its
buffer with ``cudaIpcGetMemHandle``; peers map it with ``cudaIpcOpenMemHandle`` and
then load from and store to it directly from kernels. Several ranks may share one GPU:
IPC between processes of the same device works the same way.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from typing import Any

import numpy as np

from .._config import default_timeout
from .._wait import Deadline, wait_until
from ..errors import BackendError, ConfigError, TimeoutError
from ..memory import SymmetricBuffer
from . import _grid, _occupancy, _partition, _resident
from ._base import Backend

_HOST_ALLOC_PORTABLE = 1
_HOST_ALLOC_MAPPED = 2
_ABORT_GRACE_S = 10.0  # after the abort word is set, device waits notice within microseconds

_IPC_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess
_CUDA_ERROR_NOT_SUPPORTED = 801


def _cupy():
    import cupy

    return cupy


_UNAVAILABLE_WAIT_S = 15.0  # the least a new rank waits for a GPU that MPS reports busy or unavailable


def _unavailable_wait_s(env: dict[str, str] | None = None) -> float:
    """How long a new rank waits for a GPU that MPS reports "busy or unavailable": the longer of 15 s and
    CIRCUSLINK_TIMEOUT (``env``: default this process's). A killed client takes the MPS server down until the
    server's other clients are gone, and those are the clients of a job that is itself ending on its own
    waits, which CIRCUSLINK_TIMEOUT bounds; 15 s was too short after a client died mid-kernel (the next
    job's ranks gave up while the old server was still being torn down, seen on an H200)."""
    return max(_UNAVAILABLE_WAIT_S, default_timeout(env))


def _use_device(cp: Any, device: int, wait_s: float | None = None) -> None:
    """Make ``device`` current. Under MPS a GPU is "busy or unavailable" to new clients for a while after
    a client was killed (its server is torn down, and the control daemon starts a new one once the old
    server's clients are gone: seen on an H100 after an MPI job aborted, 2026-11-24), so wait up to
    ``wait_s`` (default :func:`_unavailable_wait_s`: the longer of 15 s and CIRCUSLINK_TIMEOUT) for that
    before failing with one line that says so."""
    if wait_s is None:
        wait_s = _unavailable_wait_s()
    runtime = cp.cuda.runtime
    last: Exception | None = None

    def ready() -> bool:
        nonlocal last
        try:
            cp.cuda.Device(device).use()
            return True
        except runtime.CUDARuntimeError as exc:
            if exc.status != getattr(runtime, "errorDevicesUnavailable", 46):  # cudaErrorDevicesUnavailable
                raise
            last = exc
            return False

    try:
        wait_until(ready, Deadline.after(wait_s), f"GPU {device} to accept this process")
    except TimeoutError:
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "the default pipe directory")
        raise BackendError(f"GPU {device} is busy or unavailable to this process for {wait_s:g} s ({last}): "
                           f"another process holds it in exclusive mode, or the MPS server of {pipe} failed "
                           "(a killed client takes it down until its other clients exit)") from None


def _ranks_sharing(identities: list[str | None], mine: str) -> int:
    """How many of the job's ranks use the GPU whose ``backend.device_identity`` is ``mine`` (this rank among
    them), from every rank's identity. Counted from identities, never from how the devices were chosen:
    ``circuslink run`` pins every rank's GPU with CIRCUSLINK_DEVICE, and a count that took a pinned device for
    a GPU of its own gave each of 4 ranks on one H200 a persistent grid of its whole MPS share (the stencil's
    4 grids together wanted nearly every SM of the GPU), so one rank's grid started only after another's had
    timed out."""
    return max(1, sum(1 for identity in identities if identity == mine))


def _mps_capped() -> bool:
    """Whether this process runs under an MPS cap below the whole GPU (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the
    launcher sets 100/k for the k ranks sharing a GPU; 100 in the environment runs them uncapped)."""
    raw = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    try:
        return bool(raw) and float(raw) < 100
    except ValueError:
        return False


def _sm_budget(sm_count: int, ranks_on_gpu: int, capped: bool) -> int:
    """SMs this rank's kernels may occupy (the forward-progress rule, docs/architecture.md): the SMs CUDA reports,
    which under the launcher's MPS cap is the capped count (66 of an H100's 132 at 50%, measured under MPS on
    2026-11-23), or the rank's 1/k of the GPU's where k ranks share it uncapped. ``CIRCUSLINK_SM_BUDGET``
    overrides it (a number of SMs). :func:`_occupancy.resident_blocks` says how many blocks that allows."""
    raw = os.environ.get("CIRCUSLINK_SM_BUDGET")
    if raw not in (None, ""):
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"CIRCUSLINK_SM_BUDGET={raw!r} is not an integer") from None
        if value < 1:
            raise ConfigError(f"CIRCUSLINK_SM_BUDGET={raw!r} must be at least 1")
        return min(value, sm_count)
    return sm_count if capped or ranks_on_gpu <= 1 else max(1, sm_count // ranks_on_gpu)


class CudaBackend(Backend):
    name = "cuda"
    runs_kernels = True
    partition: _partition.GreenPartition | None = None  # this rank's SMs of its own, where it has them

    def __init__(self, boot: Any) -> None:
        super().__init__(boot)
        cp = _cupy()
        self.xp = cp
        world = boot
        count = cp.cuda.runtime.getDeviceCount()
        raw = os.environ.get("CIRCUSLINK_DEVICE")
        if raw not in (None, ""):
            try:
                device = int(raw)
            except ValueError:
                raise ConfigError(f"CIRCUSLINK_DEVICE={raw!r} is not an integer") from None
        else:
            device = world.local_rank % count
        if not 0 <= device < count:
            raise ConfigError(f"CIRCUSLINK_DEVICE={device} but this machine has {count} GPU(s)")
        self.device = device
        _use_device(cp, device)
        self.sm_count = int(cp.cuda.Device(device).attributes["MultiProcessorCount"])
        self.device_identity = f"{socket.gethostname()}:{cp.cuda.Device(device).pci_bus_id}"
        # Collective: the ranks whose GPU is this one, counted by device identity whoever chose the device
        # (max_blocks divides the GPU among them). A peer may still be waiting in _use_device for the GPU.
        identities = world.allgather_object(self.device_identity, _unavailable_wait_s() + default_timeout())
        self.ranks_on_gpu = _ranks_sharing(identities, self.device_identity)
        self.capped = _mps_capped()
        # Ranks sharing the GPU uncapped each take SMs of their own (a green context, _partition.py), before any
        # stream is made: streams made earlier run on every SM.
        if not self.capped and _partition.wanted(self.ranks_on_gpu):
            try:
                self.partition = _partition.GreenPartition(
                    device, self.ranks_on_gpu, _partition.index_on_gpu(identities, world.rank))
            except BackendError as exc:
                if _partition.mode() == "green":
                    raise
                # auto: share the GPU uncapped, as without green contexts, and say so once
                print(f"circuslink: warning: rank {world.rank}: {exc}", file=sys.stderr, flush=True)
            else:
                self.sm_count = self.partition.sm_count
        self.sm_budget = _sm_budget(self.sm_count, 1 if self.partition else self.ranks_on_gpu, self.capped)
        # The world's stream is non-blocking: our kernels never wait behind the user's stream
        # by accident, and after_caller() orders them behind it on purpose.
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._caller_done = cp.cuda.Event(disable_timing=True)
        if self.partition is not None:
            # CuPy's null stream runs on every SM whatever context is current: the caller's work goes to a
            # stream of the partition instead (ordered with the null stream like any blocking stream).
            self.caller_stream = cp.cuda.Stream(non_blocking=False)
            self.caller_stream.use()
        # The abort word (detail/sync.cuh): host-mapped, so the host can end every device wait of
        # this process when its own bounded wait for a kernel gives up. With unified addressing the
        # host pointer of mapped memory is also its device pointer.
        rt = cp.cuda.runtime
        self.resident = _resident.Registry()  # resident kernels (the agent): paused around device-wide syncs
        self.abort_ptr = rt.hostAlloc(8, rt.hostAllocMapped)
        self._abort = np.frombuffer((ctypes.c_uint32 * 2).from_address(self.abort_ptr), dtype=np.uint32)
        self._abort[:] = 0
        # launch_resident launches cooperatively until the driver says it cannot; CIRCUSLINK_COOPERATIVE=0 makes
        # it a plain launch of the checked grid (an A/B switch: with four ranks under MPS a persistent stencil
        # grid was seen not to start until the other ranks' grids had ended).
        self._cooperative = os.environ.get("CIRCUSLINK_COOPERATIVE", "1") != "0"

    def bind_thread(self) -> None:
        """Make this rank's context current on the calling thread: its green context where the rank has SMs of
        its own (a thread's first CUDA call would otherwise bind the primary context), else its device."""
        if self.partition is not None:
            self.partition.bind()
        else:
            self.xp.cuda.Device(self.device).use()

    def wait_stream(self, stream: Any, deadline: Deadline | float | None, what) -> None:
        """Wait, bounded, until ``stream`` has finished its work; on time-out set the abort word (every
        device wait of this process gives up and records why), let the kernels exit, and raise
        :class:`~circuslink.TimeoutError` naming ``what``. No host wait on the GPU is unbounded."""
        if stream.done:
            return
        try:
            wait_until(lambda: stream.done, deadline, what)
        except TimeoutError:
            self._abort[0] = 1
            try:
                wait_until(lambda: stream.done, _ABORT_GRACE_S, "kernels ignoring the abort word")
            except TimeoutError:
                pass  # the abort stays set: this process's GPU work cannot be trusted to finish
            else:
                self._abort[0] = 0
            raise

    def max_blocks(self, kernel: Any, threads: int, shared_bytes: int = 0) -> int:
        """Blocks of ``kernel`` (a cupy RawKernel) at ``threads`` threads a block and ``shared_bytes`` of dynamic
        shared memory that this rank may have resident at once, whatever the other ranks on its GPU run:
        the blocks one SM holds of it (the driver's occupancy: registers, shared memory, block size) times
        its SM budget when alone on the GPU; where k ranks share it, half of 1/k of those under an MPS cap (all k
        may run on the capped SMs), half of those uncapped (the budget is then the rank's group of SMs of its own,
        _partition.py, or without one its 1/k of the SMs; the rule and why: backends/_occupancy.py); 0 where not
        even the k ranks' single blocks fit the SMs they share."""
        return self._fit(kernel, threads, shared_bytes)[1]

    def wave_blocks(self, kernel: Any, threads: int, shared_bytes: int = 0) -> int:
        """Blocks of ``kernel`` that fill this rank's SM budget once (occupancy times budget): the grid of a
        streaming kernel whose blocks never wait on other blocks or on peers, so none needs to be resident with
        any other. Not a bound like :meth:`max_blocks`: where ranks share SMs, blocks beyond what fits queue
        until others leave, which is harmless here."""
        return self._fit(kernel, threads, shared_bytes)[0] * self.sm_budget

    def _fit(self, kernel: Any, threads: int, shared_bytes: int) -> tuple[int, int]:
        """(blocks one SM holds, blocks this rank may have resident); refuses a kernel no SM holds."""
        per_sm = int(self.xp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernel.kernel.ptr, int(threads), int(shared_bytes)))
        if per_sm < 1:  # the launch would fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: say why instead
            attrs = _occupancy.attributes_of(kernel)
            why = _occupancy.describe(attrs, threads, shared_bytes)
            raise BackendError(f"kernel {attrs.name} does not fit an SM ({why}): "
                               "give it __launch_bounds__ or launch fewer threads")
        # In SMs of its own (a green context) a rank takes half of what they hold, as uncapped ranks do, unless
        # CIRCUSLINK_PARTITION_GRID=whole (_partition.grid_share says why).
        whole = self.partition is not None and _partition.grid_share() == "whole"
        return per_sm, _occupancy.resident_blocks(per_sm, self.sm_budget, self.ranks_on_gpu, self.capped, whole)

    def launch_resident(self, kernel: Any, grid: Any, block: Any, args: tuple, shared_bytes: int = 0,
                        stream: Any = None, limit: int | None = None) -> None:
        """Launch ``kernel`` (a cupy RawKernel) as a persistent grid, every block of which runs at once: one
        that waits on other blocks (``grid_sync``) or on peers. A grid larger than :meth:`max_blocks` allows
        (or ``limit``, e.g. ``channels.max_blocks(...)`` while routed channels are open) is refused in one
        line naming the kernel and the blocks that fit, before anything runs. The launch is cooperative
        (``cuLaunchCooperativeKernel``: the driver starts every block together or refuses), unless the driver
        does not support that here, when it is a plain launch of the checked grid. ``stream``: default the
        caller's current CuPy stream."""
        self.check_resident(kernel, grid, block, shared_bytes, limit)
        grid_t = (grid,) if isinstance(grid, int) else tuple(grid)
        block_t = (block,) if isinstance(block, int) else tuple(block)
        stream = stream if stream is not None else self.xp.cuda.get_current_stream()
        function = kernel.kernel  # cupy.cuda.function.Function: it takes the cooperative flag per launch
        if self._cooperative:
            try:
                function(grid_t, block_t, tuple(args), shared_mem=int(shared_bytes), stream=stream,
                         enable_cooperative_groups=True)
                return
            except self.xp.cuda.driver.CUDADriverError as exc:
                if getattr(exc, "status", None) != _CUDA_ERROR_NOT_SUPPORTED:
                    raise BackendError(f"kernel {getattr(kernel, 'name', '?')}: the cooperative launch of "
                                       f"{_occupancy.grid_blocks(grid)} blocks failed on rank {self.boot.rank}: "
                                       f"{exc}") from None
                self._cooperative = False  # e.g. an MPS client that may not launch cooperatively: the check stands
        function(grid_t, block_t, tuple(args), shared_mem=int(shared_bytes), stream=stream)

    def check_resident(self, kernel: Any, grid: Any, block: Any, shared_bytes: int = 0,
                      limit: int | None = None) -> None:
        """Refuse, in one line naming the kernel and the blocks that fit, a grid of ``kernel`` larger than
        :meth:`max_blocks` allows (or ``limit``): what :meth:`launch_resident` checks before it launches, for
        launches of grids that must be resident made some other way."""
        threads = _occupancy.grid_blocks(block)
        blocks = _occupancy.grid_blocks(grid)
        per_sm, most = self._fit(kernel, threads, shared_bytes)
        if limit is not None:
            most = min(most, int(limit))
        if blocks > most:
            attrs = _occupancy.attributes_of(kernel)
            share = (self.partition.describe() if self.partition is not None else
                     f"{self.ranks_on_gpu} ranks share GPU {self.device}, {self.sm_budget} SMs each"
                     if self.ranks_on_gpu > 1 else f"GPU {self.device}, {self.sm_budget} SMs")
            advice = (f"launch at most {most} blocks" if most else
                      "no grid of it can be: the ranks' one blocks would not all fit the SMs they share under the "
                      "MPS cap; run fewer ranks on the GPU, or give the kernel fewer registers, threads or shared "
                      "memory")
            raise BackendError(f"kernel {attrs.name}: a persistent grid of {blocks} blocks cannot be resident on rank "
                               f"{self.boot.rank}: {most} fit ({_occupancy.describe(attrs, threads, shared_bytes)}; "
                               f"{per_sm} blocks an SM; {share}); {advice}")

    def grid_barrier(self, timeout: float | None = None) -> _grid.GridBarrier:
        """A ``circuslink::GridBarrier`` (circuslink/grid.cuh) for persistent kernels of this rank: zeroed
        counters, this process's abort word, and ``timeout`` (seconds; None: CIRCUSLINK_TIMEOUT; 0: never,
        though the host's bounded wait still aborts it). With channels pass ``timeout=channels.timeout``."""
        with self.xp.cuda.Device(self.device):
            bar = _grid.GridBarrier(self.xp, self.abort_ptr, timeout)
            # zeroed on the current stream: done before a launch on any other stream may use it
            self.wait_stream(self.xp.cuda.get_current_stream(), Deadline.after(_ABORT_GRACE_S),
                             "the zeroing of a grid barrier's counters")
        return bar

    def after_caller(self) -> None:
        """Order the world's stream after the caller's current stream (CuPy's null stream by
        default). Every host-side operation that launches on the world's stream calls this
        first: otherwise its kernel may read an input the caller has not finished writing. The
        GPU waits, not the host; one reused event keeps it to two driver calls."""
        caller = self.xp.cuda.get_current_stream()
        if caller.ptr != self.stream.ptr:
            self._caller_done.record(caller)
            self.stream.wait_event(self._caller_done)

    def _check_peer_access(self, devices: list[int]) -> None:
        rt = self.xp.cuda.runtime
        me = self.device
        for r, d in enumerate(devices):
            if d != me and not rt.deviceCanAccessPeer(me, d):
                raise BackendError(
                    f"rank {self.boot.rank} (GPU {me}) cannot access rank {r}'s GPU {d}: "
                    "no peer-to-peer path (NVLink or PCIe P2P) between them"
                )

    def alloc(self, nbytes: int, timeout: float | None, peers: frozenset[int] | None = None) -> SymmetricBuffer:
        cp = self.xp
        rt = cp.cuda.runtime
        world = self.boot
        mapping = peers  # `peers` below is every rank's (device, handle, failure)
        base, handle, failure = 0, b"", None
        with cp.cuda.Device(self.device):
            try:
                base = rt.malloc(nbytes)
                rt.memset(base, 0, nbytes)
                with self.resident.paused():
                    rt.deviceSynchronize()
                handle = bytes(rt.ipcGetMemHandle(base))
            except Exception as exc:  # CUDA's out-of-memory and friends: say it in one line, on every rank
                failure = f"rank {world.rank} (GPU {self.device}): {exc}"
                if base:
                    rt.free(base)
                base = 0
        ptrs: list[int] = []
        opened: list[int] = []
        peers = world.allgather_object((self.device, handle, failure), timeout)
        failures = [f for _, _, f in peers if f]
        if failures:
            if base:
                with cp.cuda.Device(self.device):
                    rt.free(base)
            raise BackendError(f"alloc of {nbytes} bytes failed: {'; '.join(failures)}")
        try:
            # with `mapping` (a direct network) this rank opens only its neighbours' handles
            self._check_peer_access([d if mapping is None or r in mapping else self.device
                                     for r, (d, _, _) in enumerate(peers)])
            with cp.cuda.Device(self.device):
                for r, (_, h, _) in enumerate(peers):
                    if r == world.rank:
                        ptrs.append(base)
                    elif mapping is not None and r not in mapping:
                        ptrs.append(0)
                    else:
                        p = rt.ipcOpenMemHandle(h, _IPC_LAZY_ENABLE_PEER_ACCESS)
                        opened.append(p)
                        ptrs.append(p)
            world.barrier(timeout)
        except Exception:
            self._close_handles(opened)
            rt.free(base)
            raise

        state = {"base": base, "opened": opened}

        def make_array(rank: int):
            mem = cp.cuda.UnownedMemory(ptrs[rank], nbytes, owner=buf, device_id=self.device)
            return cp.ndarray((nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))

        def release_local() -> None:
            self._close_handles(state["opened"])
            state["opened"] = []
            if state["base"] is not None:
                with cp.cuda.Device(self.device), self.resident.paused():
                    rt.deviceSynchronize()
                    rt.free(state["base"])
                state["base"] = None

        def release_all(timeout: float | None = None) -> None:
            with cp.cuda.Device(self.device), self.resident.paused():
                rt.deviceSynchronize()  # my kernels no longer touch peers' memory
            self._close_handles(state["opened"])
            state["opened"] = []
            world.barrier(timeout)  # no peer has my buffer mapped any more
            release_local()

        buf = SymmetricBuffer(world.rank, nbytes, ptrs, make_array, release_local, release_all, self.name,
                              mapped=mapping)
        return buf

    def _close_handles(self, opened: list[int]) -> None:
        rt = self.xp.cuda.runtime
        with self.xp.cuda.Device(self.device):
            for p in opened:
                try:
                    rt.ipcCloseMemHandle(p)
                except Exception:
                    pass

    def synchronize(self) -> None:
        self.xp.cuda.Device(self.device).synchronize()

    def host_memory(self, nbytes: int) -> PinnedMemory:
        """Pinned host memory mapped into this rank's GPU (device code stores into it over PCIe)."""
        return PinnedMemory(self.xp, self.device, nbytes)

    def device_label(self, nranks: int) -> str:
        import re

        props = self.xp.cuda.runtime.getDeviceProperties(self.device)
        name = props["name"].decode(errors="replace") if isinstance(props["name"], bytes) else props["name"]
        count = max(1, min(nranks, self.xp.cuda.runtime.getDeviceCount()))
        return f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-x{count}"

    def close(self) -> None:
        if self.abort_ptr:
            try:
                self.xp.cuda.runtime.freeHost(self.abort_ptr)
            except Exception:
                pass  # a context already torn down at exit
            self.abort_ptr = 0


class PinnedMemory:
    """``nbytes`` zeroed bytes of pinned host memory mapped into the device: ``array`` for the host, ``ptr`` for
    kernels and compiled host code (with unified addressing the host address of mapped pinned memory is also its
    device address; CuPy's runtime module has no cudaHostGetDevicePointer)."""

    def __init__(self, cp: Any, device: int, nbytes: int) -> None:
        rt = cp.cuda.runtime
        with cp.cuda.Device(device):
            self._host = rt.hostAlloc(nbytes, _HOST_ALLOC_PORTABLE | _HOST_ALLOC_MAPPED)
        self.ptr = int(self._host)
        self._rt = rt
        self.array = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(self._host), dtype=np.uint8)
        self.array[:] = 0

    def release(self) -> None:
        if self._host:
            self.array = None
            self._rt.freeHost(self._host)
            self._host = 0
