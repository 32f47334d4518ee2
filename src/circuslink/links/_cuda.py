"""The cuda engine of the engine links: the rings live in pinned host memory mapped into the GPU.

The device image's MPI is not CUDA-aware, so the link is host-staged by construction: the GPU agent
stores its packets straight into the out ring in pinned host memory (over PCIe; the same path a
``cudaMemcpy`` to a pinned buffer takes), MPI sends from there with no copy, the peer's proxy receives
straight into its in ring, and the peer's agent loads from it. With unified addressing the host address of
mapped pinned memory is also its device address.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_HOST_ALLOC_PORTABLE = 1
_HOST_ALLOC_MAPPED = 2


class HostMemory:
    """``nbytes`` zeroed bytes of pinned host memory mapped into the device: ``array`` for the host (the
    proxy), ``ptr`` for kernels."""

    def __init__(self, world: Any, nbytes: int) -> None:
        import cupy as cp

        rt = cp.cuda.runtime
        with cp.cuda.Device(world.device):
            self._host = rt.hostAlloc(nbytes, _HOST_ALLOC_PORTABLE | _HOST_ALLOC_MAPPED)
        # Unified addressing (every 64-bit platform CUDA supports): the host address of mapped pinned
        # memory is its device address too. (CuPy's runtime module has no cudaHostGetDevicePointer.)
        self.ptr = int(self._host)
        self._rt = rt
        self.array = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(self._host), dtype=np.uint8)
        self.array[:] = 0

    def release(self) -> None:
        if self._host:
            self.array = None
            self._rt.freeHost(self._host)
            self._host = 0
