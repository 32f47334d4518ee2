"""What this machine can give a job: cores and host memory, read the one way every check reads them.

The launcher refuses a job whose ranks would not fit in memory and warns when ranks outnumber cores;
the applications and benchmarks check their own memory need against the same figures before any rank
starts (a job that the kernel's out-of-memory killer ends takes other processes down with it).
"""

from __future__ import annotations

import os
import shutil

ENV_SHM_DIR = "CIRCUSLINK_SHM_DIR"  # where the cpu back-end keeps symmetric memory (default /dev/shm)


def shm_dir() -> str:
    """The folder of the cpu back-end's shared memory: ``CIRCUSLINK_SHM_DIR``, default ``/dev/shm`` (a tmpfs;
    another folder works too, backed by its file system)."""
    return os.environ.get(ENV_SHM_DIR) or "/dev/shm"


ENV_CORES = "CIRCUSLINK_CORES"  # set by the launcher for its ranks: the cores the job was given


def cores() -> int:
    """Cores the job may run on: what the launcher saw (``CIRCUSLINK_CORES``; mpirun binds each rank to fewer),
    else this process's CPU affinity, else every online core."""
    raw = os.environ.get(ENV_CORES, "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_ranks() -> int:
    """Ranks of this job on this machine, from the launcher's environment (1 for a plain process)."""
    for name in ("CIRCUSLINK_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"):
        raw = os.environ.get(name, "")
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return 1


def host_memory() -> tuple[int, str]:
    """(bytes of host memory a new job can still use, what that figure is): ``MemAvailable``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "host memory available (MemAvailable)"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free host memory"
    except (ValueError, OSError):
        return 1 << 62, "host memory (unknown)"


def shared_memory() -> tuple[int, str]:
    """(bytes the cpu back-end's symmetric memory can still take, what that is): the smaller of host memory
    and the free space of /dev/shm (:func:`shm_dir`), where every rank's buffers live."""
    avail, what = host_memory()
    try:
        free = shutil.disk_usage(shm_dir()).free
    except OSError:
        return avail, what
    return (free, f"free space in {shm_dir()}") if free < avail else (avail, what)


def gib(nbytes: float) -> str:
    """``12.3 GiB`` (``0.4 GiB``): memory figures in messages."""
    return f"{nbytes / (1 << 30):.1f} GiB"


def require_memory(need: int, what: str, advice: str, shared: bool = True) -> None:
    """Refuse, in one line, work that needs more host memory than this machine has left: ``what`` needs about
    ``need`` bytes (``shared``: in the cpu back-end's shared memory, /dev/shm) and ``advice`` says what to do
    instead. Called before any rank starts, so a job never dies of the out-of-memory killer halfway."""
    from .errors import ConfigError

    have, where = shared_memory() if shared else host_memory()
    if need > have:
        raise ConfigError(f"{what} needs about {gib(need)} of memory, more than the {gib(have)} of {where}: {advice}")
