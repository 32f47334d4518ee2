"""Back-ends: where symmetric memory lives and how code runs on it.

``cpu`` keeps buffers in POSIX shared memory mapped by every rank of the machine; it is
the reference implementation of every protocol. ``cuda`` keeps them in device memory
exported to peers with CUDA IPC and mapped over NVLink. :func:`default_backend_name`
picks cuda when a usable GPU is present, else cpu.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendError, ConfigError

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


def default_backend_name() -> str:
    return "cuda" if cuda_device_count() > 0 else "cpu"


def select_backend(name: str | None, world: Any):
    name = (name or "auto").lower()
    if name == "auto":
        name = default_backend_name()
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(world)
    if name == "cuda":
        if cuda_device_count() == 0:
            raise BackendError("the cuda back-end needs CuPy and a visible GPU; none was found (use --backend cpu)")
        from .cuda import CudaBackend

        return CudaBackend(world)
    raise ConfigError(f"unknown back-end {name!r}: choose one of {', '.join(BACKENDS)}")
