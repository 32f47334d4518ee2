"""The halo exchanges that exist only on GPUs: NCCL grouped send/recv and NVSHMEM puts with signals.

Both keep the operator's contract (``send``, ``start()``, ``wait() -> ghost``) and keep the GPU busy: the
transfers run on a stream of their own that waits (on the GPU) for the kernel that wrote the faces, and
``wait()`` makes the caller's stream wait for them, so the interior kernel overlaps the exchange and the host
never blocks. Their ``wait_seconds`` is therefore only the host's share (near zero).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import BackendError, CompileError, ConfigError
from ...transport import _build
from ._halo import Halo, transfers
from ._lattice import Lattice

_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}


class _Streamed(Halo):
    """Shared by the two: a side stream ordered after the caller's stream, and back."""

    def __init__(self, world: Any, lattice: Lattice, dtype: Any) -> None:
        super().__init__(world, lattice, dtype)
        import cupy as cp

        self.cp = cp
        self.side = cp.cuda.Stream(non_blocking=True)
        self._faces_ready = cp.cuda.Event(disable_timing=True)
        self._arrived = cp.cuda.Event(disable_timing=True)

    def _enter_side(self) -> None:
        self._faces_ready.record(self.cp.cuda.get_current_stream())
        self.side.wait_event(self._faces_ready)

    def _leave_side(self) -> None:
        self._arrived.record(self.side)
        self.cp.cuda.get_current_stream().wait_event(self._arrived)


class NcclHalo(_Streamed):
    """NCCL: per face, 6 sends and 6 receives (one per spin-colour component: NCCL moves contiguous bytes
    only) in one group, on the side stream. Refuses ranks that share a GPU (NCCL does)."""

    name = "nccl"

    def __init__(self, world: Any, lattice: Lattice, dtype: Any) -> None:
        from ...backends import describe_shared_gpus, shared_gpus

        sharing = shared_gpus(world)  # collective
        if sharing:
            raise ConfigError(f"--halo nccl: {describe_shared_gpus(sharing)}, and NCCL refuses two ranks on one GPU; "
                              "use --halo rma, rma-device or nvshmem")
        super().__init__(world, lattice, dtype)
        for k, v in _MULTICAST_OFF.items():
            os.environ.setdefault(k, v)
        from cupy.cuda import nccl

        self.nccl = nccl
        cp = self.cp
        uid = nccl.get_unique_id() if world.rank == 0 else None
        uid = world.broadcast_object(uid)
        self.comm = nccl.NcclCommunicator(world.size, uid, world.rank)
        S = self.faces
        self.send = cp.zeros((6, S), dtype=self.dtype)
        self.ghost = cp.zeros((6, S), dtype=self.dtype)
        self.real_type = nccl.NCCL_FLOAT64 if self.dtype == np.complex128 else nccl.NCCL_FLOAT32
        item = self.dtype.itemsize
        self.plan = []
        for offset, n, dst, src in transfers(lattice):
            for c in range(6):
                at = (c * S + offset) * item
                self.plan.append((self.send.data.ptr + at, self.ghost.data.ptr + at, 2 * n, dst, src))

    def start(self) -> None:
        self._enter_side()
        nccl, comm, stream = self.nccl, self.comm, self.side.ptr
        nccl.groupStart()
        for send, recv, count, dst, src in self.plan:
            comm.recv(recv, count, self.real_type, src, stream)
            comm.send(send, count, self.real_type, dst, stream)
        nccl.groupEnd()

    def wait(self):
        self._timed_wait(self._leave_side)
        return self.ghost

    def _close(self, timeout: float | None) -> None:
        self.side.synchronize()
        self.comm.destroy()
        self.world.barrier(timeout)


# -- NVSHMEM ------------------------------------------------------------------------------------------
_SOURCE = Path(__file__).with_name("nvshmem_halo.cu")
_FACE = np.dtype([("offset", "<u8"), ("count", "<u8"), ("dst", "<i4"), ("src", "<i4")])  # QcdNvshmemFace
_lib = None


def build_command(output: Path) -> list[str]:
    """nvcc -rdc against NVSHMEM, found by the one toolchain (``circuslink.transport._build``)."""
    nv = _build.find_nvshmem()
    return [_build.find_nvcc(), "-std=c++17", "-rdc=true", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90a", "-O2",
            f"-I{nv / 'include'}", str(_SOURCE), "-o", str(output), *_build.nvshmem_link_args(nv)]


def build_library(folder: Path | None = None) -> Path:
    """Build the NVSHMEM halo exchange's shared library (cached by source and command); return its path."""
    return _build.build_cached("qcd", "libqcd_nvshmem", _SOURCE, build_command, what="--halo nvshmem: nvcc",
                               folder=folder)


def _library(world: Any) -> Any:
    """Collective: build (rank 0), load and initialise NVSHMEM once per process (unique-id bootstrap)."""
    global _lib
    if _lib is not None:
        return _lib
    path, error = None, None
    if world.rank == 0:
        try:
            path = str(build_library())
        except (BackendError, CompileError, OSError) as exc:
            error = str(exc).splitlines()[0]
    path, error = world.broadcast_object((path, error))
    if error:
        raise BackendError(error if error.startswith("--halo") else f"--halo nvshmem is unavailable: {error}")
    for k, v in _MULTICAST_OFF.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(256 << 20))  # several PEs share a GPU under MPS
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib.qcd_nvshmem_malloc.restype = ctypes.c_void_p
    lib.qcd_nvshmem_malloc.argtypes = [ctypes.c_ulonglong]
    lib.qcd_nvshmem_free.argtypes = [ctypes.c_void_p]
    lib.qcd_nvshmem_start.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_ulonglong,
                                      ctypes.c_void_p]
    lib.qcd_nvshmem_wait.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p]
    uid = ctypes.create_string_buffer(int(lib.qcd_nvshmem_uid_size()))
    if world.rank == 0 and lib.qcd_nvshmem_get_uid(uid) != 0:
        raise BackendError("--halo nvshmem is unavailable: nvshmemx_get_uniqueid failed")
    raw = world.broadcast_object(uid.raw)
    uid = ctypes.create_string_buffer(raw, len(raw))
    if lib.qcd_nvshmem_init(uid, world.rank, world.size) != 0:
        raise BackendError(f"--halo nvshmem is unavailable: NVSHMEM init failed on rank {world.rank}")
    import atexit

    atexit.register(lib.qcd_nvshmem_finalize)
    _lib = lib
    return lib


class NvshmemHalo(_Streamed):
    """NVSHMEM: one block per face puts its 6 component blocks into the neighbour's ghost buffer of this
    epoch's parity and sets the face's signal to the epoch; the wait kernel waits for every incoming signal."""

    name = "nvshmem"

    def __init__(self, world: Any, lattice: Lattice, dtype: Any) -> None:
        super().__init__(world, lattice, dtype)
        lib = _library(world)
        self.lib = lib
        cp = self.cp
        S = self.faces
        item = self.dtype.itemsize
        region = 6 * S * item
        plan = transfers(lattice)
        self.n_faces = len(plan)
        self._mem = [lib.qcd_nvshmem_malloc(region), lib.qcd_nvshmem_malloc(2 * region),
                     lib.qcd_nvshmem_malloc(8 * self.n_faces)]
        if not all(self._mem):
            raise BackendError(f"--halo nvshmem: nvshmem_malloc failed on rank {world.rank} "
                               "(NVSHMEM_SYMMETRIC_SIZE too small?)")
        self.send = self._view(self._mem[0], (6, S))
        self._ghosts = self._view(self._mem[1], (2, 6, S))
        faces = np.zeros(self.n_faces, dtype=_FACE)
        for i, (offset, n, dst, src) in enumerate(plan):
            faces[i] = (offset, n, dst, src)
        self.face_table = cp.asarray(faces.view(np.uint8))
        self.item = item
        self.epoch = 0

    def _view(self, ptr: int, shape: tuple[int, ...]):
        cp = self.cp
        nbytes = int(np.prod(shape)) * self.dtype.itemsize
        mem = cp.cuda.UnownedMemory(ptr, nbytes, owner=self)
        return cp.ndarray(shape, dtype=self.dtype, memptr=cp.cuda.MemoryPointer(mem, 0))

    def start(self) -> None:
        self.epoch += 1
        self._enter_side()
        rc = self.lib.qcd_nvshmem_start(self._mem[0], self._mem[1], self._mem[2], self.face_table.data.ptr,
                                        self.n_faces, self.faces, self.item, self.epoch, self.side.ptr)
        if rc:
            raise BackendError(f"--halo nvshmem: the put kernel failed to launch (CUDA error {rc})")

    def wait(self):
        def wait_on_device() -> None:
            rc = self.lib.qcd_nvshmem_wait(self._mem[2], self.n_faces, self.epoch, self.side.ptr)
            if rc:
                raise BackendError(f"--halo nvshmem: the wait kernel failed to launch (CUDA error {rc})")
            self._leave_side()

        self._timed_wait(wait_on_device)
        return self._ghosts[self.epoch & 1]

    @property
    def ghost(self):
        return self._ghosts[self.epoch & 1]

    def _close(self, timeout: float | None) -> None:
        self.cp.cuda.Device().synchronize()
        self.world.barrier(timeout)
        for p in self._mem:
            self.lib.qcd_nvshmem_free(p)
        self._mem = []
