"""The cpu back-end: symmetric memory in POSIX shared memory (/dev/shm).

Each rank creates one file per allocation (``circuslink-<job>-<alloc>-<rank>``) and maps every
peer's. Once every rank has mapped every file the names are unlinked, so nothing is left in
/dev/shm even if a rank is killed later: the memory lives exactly as long as the mappings. A
rank killed while an allocation is under way cannot unlink its file; the launcher removes the
job's files when the job ends (:func:`sweep_job`), and so does the job's guard if the launcher
itself is killed.
"""

from __future__ import annotations

import mmap
import os
import socket
from typing import Any

import numpy as np

from .._sysinfo import shm_dir
from ..errors import BackendError
from ..memory import SymmetricBuffer
from ._base import Backend


class CpuBackend(Backend):
    name = "cpu"
    device = None
    xp = np
    runs_kernels = False  # the cpu reference runs on the host

    def __init__(self, boot: Any) -> None:
        super().__init__(boot)
        self._alloc_count = 0
        self._dir = shm_dir()
        if not os.path.isdir(self._dir):
            raise BackendError(f"the cpu back-end needs POSIX shared memory at {self._dir} (CIRCUSLINK_SHM_DIR names "
                               "another folder)")

    def _name(self, alloc_id: int, rank: int) -> str:
        return os.path.join(self._dir, f"circuslink-{self.boot.job_id}-{alloc_id}-{rank}")

    def alloc(self, nbytes: int, timeout: float | None, peers: frozenset[int] | None = None) -> SymmetricBuffer:
        world = self.boot
        self._alloc_count += 1
        alloc_id = self._alloc_count
        mine = self._name(alloc_id, world.rank)
        maps: dict[int, mmap.mmap] = {}
        failure = self._create(mine, nbytes, maps)
        # From here my file exists: whatever happens (a peer that failed, a time-out, an interrupt), it is
        # unlinked before alloc returns or raises. A rank killed outright cannot unlink it: the launcher
        # sweeps the job's files (sweep_job) when the job ends, however it ends.
        try:
            # Every rank learns of every rank's failure, so all raise the same error at once instead of
            # waiting for a peer that gave up.
            failures = [f for f in world.allgather_object(failure, timeout) if f]
            if failures:
                raise BackendError(f"alloc of {nbytes} bytes failed: {'; '.join(failures)}")
            world.barrier(timeout)  # every file exists
            for r in range(world.size):
                if r == world.rank or (peers is not None and r not in peers):
                    continue
                pfd = os.open(self._name(alloc_id, r), os.O_RDWR)
                try:
                    maps[r] = mmap.mmap(pfd, nbytes)
                finally:
                    os.close(pfd)
            world.barrier(timeout)  # every rank has mapped every file
        except BaseException:
            for m in maps.values():
                m.close()
            raise
        finally:
            _unlink(mine)
        arrays = {r: np.frombuffer(m, dtype=np.uint8) for r, m in maps.items()}
        ptrs = [int(arrays[r].ctypes.data) if r in arrays else 0 for r in range(world.size)]

        def make_array(rank: int):
            return arrays[rank]

        def release_local() -> None:
            arrays.clear()
            for m in maps.values():
                try:
                    m.close()
                except BufferError:
                    pass  # a caller still holds a view; the mapping goes when it does
            maps.clear()

        def release_all(timeout: float | None = None) -> None:
            world.barrier(timeout)  # nobody is still writing into my buffer
            release_local()

        return SymmetricBuffer(world.rank, nbytes, ptrs, make_array, release_local, release_all, self.name,
                               mapped=peers)

    def _create(self, path: str, nbytes: int, maps: dict) -> str | None:
        """Create and map my file; on failure remove it and say why (None when all went well)."""
        rank = self.boot.rank
        try:
            free = os.statvfs(self._dir)
            room = free.f_bavail * free.f_frsize
        except OSError:
            room = None
        # tmpfs accepts any size and fails later with SIGBUS on the first store past its room: refuse first.
        if room is not None and nbytes > room:
            return (f"rank {rank}: {self._dir} has {room} bytes free, fewer than the {nbytes} asked for "
                    "(every rank of this machine allocates its own copy)")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError as exc:
            return f"rank {rank}: cannot create {path}: {exc.strerror}"
        try:
            os.ftruncate(fd, nbytes)
            maps[rank] = mmap.mmap(fd, nbytes)
        except (OSError, OverflowError, ValueError) as exc:
            _unlink(path)
            return f"rank {rank}: cannot map {nbytes} bytes of {self._dir}: {getattr(exc, 'strerror', None) or exc}"
        finally:
            os.close(fd)
        return None

    def device_label(self, nranks: int) -> str:
        return "cpu-" + _slug(socket.gethostname().split(".")[0])


def job_files_pattern(job_id: str) -> str:
    """The glob pattern of every file the cpu back-end may create for job ``job_id``."""
    return os.path.join(shm_dir(), f"circuslink-{job_id}-*")


def sweep_job(job_id: str) -> int:
    """Remove what job ``job_id`` left in /dev/shm (files of ranks killed mid-allocation); how many.
    Only the job's launcher calls it, once no rank of the job is alive."""
    import glob

    removed = 0
    for path in glob.glob(job_files_pattern(job_id)):
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"
