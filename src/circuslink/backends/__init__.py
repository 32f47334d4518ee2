"""Back-ends: where symmetric memory lives and how code runs on it (the interface: ``_base.Backend``).

``cpu`` keeps buffers in POSIX shared memory mapped by every rank of the machine; it is
the reference implementation of every protocol. ``cuda`` keeps them in device memory
exported to peers with CUDA IPC and mapped over NVLink. :func:`default_backend_name`
picks cuda when a usable GPU is present, else cpu.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..errors import BackendError, ConfigError
from ._base import Backend

BACKENDS = ("cpu", "cuda")


def cuda_device_count() -> int:
    """Number of GPUs CuPy can see, 0 when CuPy or a driver is missing."""
    try:
        import cupy
    except Exception:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


# Why figures between ranks that share a GPU are not link figures. Each rank is a process with
# its own CUDA context, and without MPS the GPU time-slices contexts instead of running their
# kernels side by side: a spin-waiting pingpong between two of them waits for the time slice.
SHARED_GPU_NOTE = ("ranks that share a GPU run in separate CUDA contexts, which the GPU time-slices "
                   "(no MPS): their latencies measure the time slice, not a link")


def shared_gpus(world: Any) -> dict[int | str, list[int]]:
    """Collective: ``{gpu: [ranks]}`` for each GPU that more than one rank uses (empty without GPUs). Ranks are
    grouped by the GPU's identity (host and PCI bus, ``backend.device_identity``), not its ordinal: two hosts'
    GPU 0 are two GPUs. A GPU is named by its ordinal, or by ordinal and identity where ordinals repeat."""
    if world.device is None:
        return {}
    mine = (getattr(world.backend, "device_identity", None) or str(world.device), int(world.device))
    groups: dict[str, tuple[int, list[int]]] = {}
    for rank, (identity, device) in enumerate(world.allgather_object(mine)):
        groups.setdefault(identity, (device, []))[1].append(rank)
    shared = [(identity, device, ranks) for identity, (device, ranks) in groups.items() if len(ranks) > 1]
    ordinals = [device for _, device, _ in shared]
    return {(device if ordinals.count(device) == 1 else f"{device} ({identity})"): ranks
            for identity, device, ranks in shared}


def describe_shared_gpus(groups: dict[int | str, list[int]]) -> str:
    """``"ranks 0, 1 share GPU 0"``, for messages."""
    return "; ".join(f"ranks {', '.join(map(str, r))} share GPU {d}" for d, r in sorted(groups.items(),
                                                                                        key=lambda kv: kv[1][0]))


def module(backend: Backend, package: str) -> ModuleType:
    """``backend``'s module of subsystem ``package`` (see :meth:`Backend.module`)."""
    return backend.module(package)


def resolve_name(name: str | None) -> str:
    """``name`` checked ("auto" / None: the default back-end of this machine)."""
    name = (name or "auto").lower()
    if name == "auto":
        name = default_backend_name()
    if name not in BACKENDS:
        raise ConfigError(f"unknown back-end {name!r}: choose one of {', '.join(BACKENDS)}")
    return name


def runs_kernels(name: str | None) -> bool:
    """Whether back-end ``name`` ("auto" / None: this machine's default) runs device kernels: the capability
    a launcher or a command line asks before any World exists (GPUs to place ranks on, MPS, GPU memory,
    which transports can run), so that nothing above this package tests a back-end's name."""
    return resolve_name(name) == "cuda"


def default_backend_name() -> str:
    return "cuda" if cuda_device_count() > 0 else "cpu"


def select_backend(name: str | None, boot: Any) -> Backend:
    """The back-end called ``name`` ("cpu", "cuda", or None / "auto" for the default), for this job."""
    name = (name or "auto").lower()
    if name == "auto":
        name = default_backend_name()
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(boot)
    if name == "cuda":
        if cuda_device_count() == 0:
            raise BackendError("the cuda back-end needs CuPy and a visible GPU; none was found (the cpu back-end "
                               "runs without one)")
        from .cuda import CudaBackend

        return CudaBackend(boot)
    raise ConfigError(f"unknown back-end {name!r}: choose one of {', '.join(BACKENDS)}")
