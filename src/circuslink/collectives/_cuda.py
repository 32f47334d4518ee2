"""The collectives' back-end module on back-ends that run kernels (cuda): collectives.cuh launched from the host,
and the ``circuslink::collectives::Team`` and ``Rings`` handles users' kernels receive.

Where every rank maps every other rank's memory (one GPU under MPS, one node) a team buffer (CUDA IPC,
``world.alloc``) carries the one-shot and two-shot algorithms, reduce-scatter, all-gather, broadcast and
barrier, picked by size from ``_select``; each call is one cooperative launch of
``collectives_kernels.cu``. The rings below serve ``algorithm="ring"`` and ranks that share no memory.

Two sets of rings per communicator: one low-latency ring (LL channels, one block) for messages up
to :data:`LL_MAX_BYTES`, and ``rings`` bandwidth-mode rings (1 MiB BW channels, one block each, each
reducing its own slice of the data) for larger ones. Each host call is one launch of
``collectives_kernels.cu`` on the world's stream, after the caller's stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._config import default_timeout
from .._wait import Deadline
from ..errors import ChannelError, ConfigError
from . import _layout as lay
from ._cpu import shares_memory
from ._layout import RING, RINGS
from ._ring import ChannelRing
from ._select import oneshot_max, resolve

DEFAULT_STAGE_BYTES = 32 << 20  # two-shot pieces; also what allreduce_stage may reduce in one call
TEAM_MAX_BLOCKS = 64  # two-shot grids: enough 512-thread blocks to saturate the memory system

# LL reads are done by one warp, two 120-byte packets per poll round: unbeatable for a few
# packets, slow beyond (~0.5 GB/s). So LL only up to 1 KiB (9 packets); above, every block of
# the grid moves its own slice in bandwidth mode (one 16-byte-vector packet per piece).
LL_MAX_BYTES = 1 << 10
LL_DEPTH_BYTES = 16 << 10  # auto mode makes these LL channels (payload <= 64 KiB)
BW_DEPTH_BYTES = 1 << 20  # and these BW channels (16 slots of 64 KiB)
DEFAULT_RINGS = 64  # blocks per all-reduce: each alternates writing and reading, so it takes
# about twice the ~16 CTAs that saturate NVLink with stores alone, plus margin (tune with --rings)
THREADS = 512

# C++ types of the dtypes the device collectives reduce (float16 only on the cpu back-end).
C_TYPES = {
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
    "int32": "int", "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long",
    "float32": "float", "float64": "double", "bfloat16": "circuslink::collectives::bf16",
}
OP_TYPES = {"sum": "Sum", "max": "Max", "min": "Min"}
KERNELS = Path(__file__).with_name("collectives_kernels.cu")


def allreduce_kernel(dtype_name: str, op: str) -> str:
    """The name expression of the all-reduce kernel for a dtype and op: ``cl_allreduce<float, ...::Sum>``."""
    return f"cl_allreduce<{C_TYPES[dtype_name]}, circuslink::collectives::{OP_TYPES[op]}>"


def team_kernel(kind: str, dtype_name: str, op: str) -> str:
    """``cl_team_allreduce<float, circuslink::collectives::Sum>`` and ``cl_team_reduce_scatter<...>``."""
    return f"cl_team_{kind}<{C_TYPES[dtype_name]}, circuslink::collectives::{OP_TYPES[op]}>"


# collectives_kernels.cu's parts (CL_COLLECTIVES_PART), each compiled when a call first needs it.
PART_UNTYPED, PART_TEAM, PART_RING = 1, 2, 3


def kernel_names(dtype_name: str, part: int) -> list[str]:
    """The templates a typed part instantiates: the team's all-reduces and reduce-scatters (PART_TEAM) or the
    ring all-reduces (PART_RING) of one dtype. (The untyped part's kernels are extern "C": CuPy finds an
    unlisted name as it is.)"""
    if part == PART_RING:
        return [allreduce_kernel(dtype_name, op) for op in OP_TYPES]
    if part == PART_TEAM:
        return [team_kernel(kind, dtype_name, op) for kind in ("allreduce", "reduce_scatter") for op in OP_TYPES]
    return []


def part_of(kernel: str) -> int:
    """The part of collectives_kernels.cu that holds ``kernel`` (a name or a name expression)."""
    if kernel.startswith("cl_allreduce<"):
        return PART_RING
    if kernel.startswith(("cl_team_allreduce<", "cl_team_reduce_scatter<")):
        return PART_TEAM
    return PART_UNTYPED


class DeviceTeam:
    """The team buffer (every rank's, mapped into every rank), this rank's private counters and error
    record, and the by-value ``Team`` handle."""

    def __init__(self, world: Any, stage_bytes: int, timeout: float | None) -> None:
        from ..backends._grid import timeout_ns
        from ..channels import fences_at_gpu_scope

        cp = world.xp
        self.world = world
        self.buf = world.alloc(lay.team_offsets(world.size, stage_bytes)["total"], timeout)
        one_gpu = fences_at_gpu_scope(world.allgather_object(world.backend.device_identity, timeout))
        self.peers = cp.asarray(np.array(self.buf.ptrs, dtype=np.uint64))
        self.counters = cp.zeros(lay.COUNTERS, dtype=cp.uint32)
        self.error = cp.zeros(lay.ERROR_WORDS, dtype=cp.uint32)
        self.handle = lay.TEAM.pack(
            peers=self.peers.data.ptr, counters=self.counters.data.ptr, error=self.error.data.ptr,
            abort=world.backend.abort_ptr, timeout_ns=timeout_ns(timeout), stage_bytes=stage_bytes,
            oneshot_max=oneshot_max(world.size), rank=world.rank, size=world.size,
            flags=lay.GPU_SCOPE if one_gpu else 0)

    def check(self, what: str) -> None:
        """Raise ChannelError naming the peer and slot of a wait that timed out (then the team is unusable:
        the ranks' call numbers disagree; close the Comm)."""
        err = [int(v) for v in self.error.get()]
        if err[0] == lay.ERROR_CLAIMED:  # read while a block of a kernel still running was writing its record
            raise ChannelError(f"{what} on rank {self.world.rank}: a device wait failed (its record was still "
                               "being written); the communicator's ranks no longer agree: close it")
        if err[0] == lay.ERROR_STAGE:
            raise ChannelError(f"{what} on rank {self.world.rank}: allreduce_stage was given more than the stage's "
                               f"{self.handle['stage_bytes']} bytes (Comm(stage_bytes=...) sets it)")
        if err[0]:
            kind = lay.ERROR_KINDS.get(err[0], f"wait {err[0]}")
            where = {lay.ERROR_SLOT: f" (chunk {err[2]})", lay.ERROR_GRID: f" (block {err[2]})"}.get(err[0], "")
            raise ChannelError(f"{what} on rank {self.world.rank}: the device wait for rank {err[1]}'s {kind}{where}, "
                               f"call {err[3]}, timed out; the communicator's ranks no longer agree: close it")

    def release(self, timeout: float | None, local: bool) -> None:
        buf, self.buf = self.buf, None
        self.peers = self.counters = self.error = None
        if buf is not None:
            buf._release_local() if local else buf.close(timeout)


class DeviceRings:
    """One ChannelRing's rings as an array of Ring records in device memory, with scratch, and the
    by-value ``Rings`` handle that points at them."""

    def __init__(self, world: Any, ring: ChannelRing) -> None:
        cp = world.xp
        self.count = ring.count
        self.piece = ring.piece
        self.scratch = cp.zeros(max(1, ring.count * ring.piece), dtype=cp.uint8)
        rec = RING.array(ring.count)
        for i in range(ring.count):
            if world.size > 1:
                rec["right"][i] = ring.rights[i].device_handle()
                rec["left"][i] = ring.lefts[i].device_handle()
            rec["scratch"][i] = self.scratch.data.ptr + i * ring.piece
            rec["piece"][i] = ring.piece
            rec["rank"][i] = world.rank
            rec["size"][i] = world.size
        self.array = cp.asarray(rec.view(np.uint8))
        self.handle = RINGS.pack(rings=self.array.data.ptr, count=ring.count)

    def release(self) -> None:
        self.array = self.scratch = None


class Collectives:
    """The device collectives driven from the host (one kernel launch per call)."""

    def __init__(self, world: Any, depth_bytes: int, rings: int | None, timeout: float | None,
                 stage_bytes: int | None = None) -> None:
        from ..device_code import compile as compile_device

        self.cp = world.xp
        self.world = world
        self.stream = world.backend.stream
        n = world.size
        self.ll_ring = self.bw_ring = None
        self.ll = self.bw = None
        self.team = None
        try:
            if n > 1 and shares_memory(world):
                self.team = DeviceTeam(world, stage_bytes or DEFAULT_STAGE_BYTES, timeout)
            self.ll_ring = ChannelRing(world, LL_DEPTH_BYTES, timeout, count=1, tag=".ll", id_base=0x8000)
            self.bw_ring = ChannelRing(world, BW_DEPTH_BYTES, timeout, count=rings or DEFAULT_RINGS, tag=".bw",
                                       id_base=0x8000 + 2 * n)
            self.ll = DeviceRings(world, self.ll_ring)
            self.bw = DeviceRings(world, self.bw_ring)
        except BaseException:
            self.release_local()
            raise
        self._compile = compile_device
        self._modules: dict[tuple[int, str], Any] = {}
        self.status = self.cp.zeros(1, dtype=self.cp.int32)
        device = self.bw_ring.timeout
        # A backstop: the channels' device waits give up first (with timeout 0 they never do, and
        # the host's own limit applies).
        self.host_limit = 2 * device + 5 if device else default_timeout()

    def _function(self, name: str, dtype_name: str) -> Any:
        # collectives_kernels.cu in parts, each compiled on first use (NVRTC takes seconds a part; CuPy
        # caches each on disk after that): the untyped kernels once, the team's and the ring's per dtype.
        part = part_of(name)
        key = (part, dtype_name if part != PART_UNTYPED else "")
        if key not in self._modules:
            self._modules[key] = self._compile(KERNELS.read_text(), options=(f"-DCL_COLLECTIVES_PART={part}",),
                                               name_expressions=kernel_names(dtype_name, part) or None)
        return self._modules[key].get_function(name)

    def rings_for(self, nbytes: int | None) -> DeviceRings:
        return self.ll if nbytes is not None and nbytes <= LL_MAX_BYTES else self.bw

    def ring_slices(self, nbytes: int) -> int:
        """Rings (slices of the data, each folded in its own ring order) of a ring all-reduce of ``nbytes``."""
        return self.rings_for(nbytes).count

    def device_handle(self, nbytes: int | None) -> np.void:
        return self.rings_for(nbytes).handle

    def device_team(self) -> np.void:
        if self.team is None:
            raise ConfigError(f"device_team: rank {self.world.rank}'s world does not map every rank's memory "
                              "(several nodes, or a single rank): use device_handle() and the ring forms")
        return self.team.handle

    def check(self) -> None:
        if self.team is not None:
            self.team.check("a collective")
        for ring in (self.ll_ring, self.bw_ring):
            if ring is not None and ring.channels is not None:
                ring.channels.check()  # raises ChannelError naming the channel that stalled

    def wait(self, stream: Any, what: str) -> None:
        self.world.backend.wait_stream(stream, Deadline.after(self.host_limit),
                                       lambda: f"{what} on rank {self.world.rank}: its kernel did not finish")
        self.check()

    def _launch(self, name: str, grid: int, args: tuple, what: str, dtype_name: str = "uint8") -> None:
        with self.stream:  # the status reset must precede the kernel on the same stream
            self.status.fill(0)
        fn = self._function(name, dtype_name)
        # The forward-progress rule: never more resident blocks than this rank's SM share holds
        # (the *_grid forms cover every ring's slice with fewer blocks).
        grid = min(grid, self.world.backend.max_blocks(fn, THREADS))
        if grid < 1:  # not one block can be guaranteed resident beside the other ranks': refused in one line
            self.world.backend.check_resident(fn, 1, THREADS)
        fn((grid,), (THREADS,), args + (self.status,), stream=self.stream)
        self.wait(self.stream, what)
        if int(self.status.get()[0]):
            raise ChannelError(f"{what} on rank {self.world.rank} failed in device code")

    def _team_launch(self, name: str, nbytes: int, args: tuple, what: str, dtype_name: str = "uint8",
                     oneshot: bool = False) -> None:
        fn = self._function(name, dtype_name)
        most = self.world.backend.max_blocks(fn, THREADS)
        want = -(-nbytes // lay.LL_CHUNK_BYTES) if oneshot else -(-nbytes // (THREADS * 16 * 4))
        grid = max(1, min(most, want, TEAM_MAX_BLOCKS if not oneshot else lay.LL_CHUNKS))
        self.world.backend.launch_resident(fn, grid, THREADS, (self.team.handle,) + args, stream=self.stream)
        self.wait(self.stream, what)
        self.team.check(what)

    def _device_copy(self, array: Any, bf16: bool) -> tuple[Any, str]:
        name = "bfloat16" if bf16 else np.dtype(array.dtype).name
        if name not in C_TYPES:
            raise ConfigError(f"dtype {name} is not supported on the {self.world.backend.name} back-end "
                              f"(supported: {', '.join(C_TYPES)})")
        self.world.backend.after_caller()
        with self.stream:  # a copy (of a strided or host array) lands before the kernel that reads it
            src = self.cp.ascontiguousarray(self.cp.asarray(array))
        return src, name

    def reduce_scatter(self, array: Any, op: str, bf16: bool = False) -> Any:
        src, name = self._device_copy(array, bf16)
        count = src.size // self.world.size
        if self.team is None:
            lo = self.world.rank * count
            return self.allreduce(src, op, "ring", bf16).reshape(-1)[lo:lo + count]
        out = self.cp.empty(count, dtype=src.dtype)
        if count:
            self._team_launch(team_kernel("reduce_scatter", name, op), src.nbytes,
                              (src, out, np.uint64(count)), "reduce_scatter", name)
        return out

    def all_gather(self, array: Any) -> Any:
        src, _ = self._device_copy(array.reshape(-1).view(np.uint8) if array.size else array, False)
        if self.team is None:
            return self.cp.concatenate([self.broadcast(src, q).reshape(-1) for q in range(self.world.size)]).view(
                array.dtype)
        out = self.cp.empty(src.size * self.world.size, dtype=self.cp.uint8)
        if src.size:
            self._team_launch("cl_team_all_gather", out.nbytes, (src, out, np.uint64(src.size)), "all_gather")
        return out.view(array.dtype)

    def allreduce(self, array: Any, op: str, algorithm: str | None = None, bf16: bool = False) -> Any:
        cp = self.cp
        name = "bfloat16" if bf16 else np.dtype(array.dtype).name
        how = resolve(array.nbytes, self.world.size, self.team is not None, algorithm)
        if how != "ring" and name in C_TYPES and self.world.size > 1 and array.size:
            src, name = self._device_copy(array, bf16)
            out = cp.empty_like(src)
            self._team_launch(team_kernel("allreduce", name, op), src.nbytes,
                              (src, out, np.uint64(src.size), np.int32(1 if how == "oneshot" else 2)),
                              "allreduce", name, oneshot=how == "oneshot")
            return out
        if name not in C_TYPES:
            raise ConfigError(f"allreduce: dtype {name} is not supported on the {self.world.backend.name} back-end "
                              f"(supported: {', '.join(C_TYPES)})")
        self.world.backend.after_caller()
        with self.stream:  # the copy must land before the kernel that reads it
            out = cp.array(array, copy=True, order="C")
        if self.world.size == 1 or out.size == 0:
            self.stream.synchronize()
            return out
        rings = self.rings_for(out.nbytes)
        self._launch(allreduce_kernel(name, op), rings.count, (rings.handle, out, np.uint64(out.size)),
                     "allreduce", name)
        return out

    def broadcast(self, array: Any, root: int) -> Any:
        cp = self.cp
        self.world.backend.after_caller()
        with self.stream:
            out = cp.array(array, copy=True, order="C")
        if self.world.size == 1 or out.size == 0:
            self.stream.synchronize()
            return out
        raw = out.reshape(-1).view(cp.uint8)
        if self.team is not None:
            self._team_launch("cl_team_broadcast", raw.nbytes, (raw, np.uint64(raw.size), np.uint32(root)),
                              "broadcast")
            return out
        rings = self.rings_for(raw.nbytes)
        self._launch("cl_broadcast", rings.count, (rings.handle, raw, np.uint64(raw.size), np.uint32(root)),
                     "broadcast")
        return out

    def barrier(self) -> None:
        if self.world.size > 1:
            self.world.backend.after_caller()  # a barrier also orders the caller's earlier work
            if self.team is not None:
                self._team_launch("cl_team_barrier", 0, (), "barrier")
                return
            self._launch("cl_barrier", 1, (self.ll.handle,), "barrier")

    def close(self, timeout: float | None) -> None:
        for ring in (self.ll_ring, self.bw_ring):
            if ring is not None:
                ring.close(timeout)
        if self.team is not None:
            self.team.release(timeout, local=False)
        self._drop_device_memory()

    def release_local(self) -> None:
        for ring in (self.ll_ring, self.bw_ring):
            if ring is not None:
                ring.release_local()
        if self.team is not None:
            self.team.release(None, local=True)
        self._drop_device_memory()

    def _drop_device_memory(self) -> None:
        for rings in (self.ll, self.bw):
            if rings is not None:
                rings.release()
