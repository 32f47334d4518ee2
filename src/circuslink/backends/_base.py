"""The back-end interface: what every back-end provides, and the one way subsystems reach it.

A subsystem never asks which back-end it holds. It calls the methods below, and it finds its own
back-end module with :meth:`Backend.module` (``world.backend_module("circuslink.rma")`` imports
``circuslink.rma._cuda`` on the cuda back-end, ``circuslink.rma._cpu`` on the cpu one). Adding a
back-end means one file here and one back-end module per subsystem, nothing else.

A back-end gets the job's :class:`~circuslink._bootstrap.Bootstrap` (rank, size, the store-based
collectives), not the World: the World sits above its back-end and the back-end never calls up.
"""

from __future__ import annotations

import importlib
import mmap
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import BackendError


class Backend(ABC):
    """One back-end instance per World."""

    name: str = "?"  # for labels and messages; never branch on it (use the capabilities below)
    xp: ModuleType  # the array module of device data: numpy or cupy
    device: int | None = None  # the GPU this rank uses, None without one
    runs_kernels: bool = False  # device kernels built with circuslink.compile run on this back-end
    sm_budget: int | None = None  # SMs this rank's kernels may occupy (the forward-progress rule)
    # Whether sm_budget counts SMs that every rank on the GPU may share (an MPS cap, the launcher's default) or
    # this rank's own 1/k of them (uncapped); the conservative reading unless the back-end knows (_occupancy.py)
    capped: bool = True
    abort_ptr: int = 0  # host-mapped word that ends every device wait of the process (0: none)
    # Which physical device this rank's memory lives on (host name and PCI bus id; None without a device): ranks
    # with the same identity share one GPU's memory system, whatever their device ordinals say.
    device_identity: str | None = None

    def __init__(self, boot: Any) -> None:
        self.boot = boot

    # -- memory ------------------------------------------------------------------------------
    @abstractmethod
    def alloc(self, nbytes: int, timeout: float | None, peers: frozenset[int] | None = None) -> Any:
        """Collective: a SymmetricBuffer of ``nbytes`` on every rank (zeroed), each mapped by all, or by this
        rank only where ``peers`` (this rank's own set, itself included) names it."""

    def host_memory(self, nbytes: int) -> HostMemory:
        """``nbytes`` zeroed bytes of this process's host memory that its device code can also reach (the rings
        of a transport's relays, which a host thread reads): here plain anonymous memory, on a GPU back-end
        pinned and mapped into the device."""
        return HostMemory(nbytes)

    # -- ordering and waiting ---------------------------------------------------------------------
    def after_caller(self) -> None:
        """Order this back-end's own work after what the caller already issued (no-op without a device)."""
        return None

    def bind_thread(self) -> None:
        """Make this rank's device context current on the calling thread; a thread the library starts calls it
        before its first device call (no-op without a device)."""
        return None

    def wait_stream(self, stream: Any, deadline: Any, what: Any) -> None:
        """Wait, bounded, for device work on ``stream`` (back-ends without streams have nothing to wait for)."""
        return None

    def max_blocks(self, kernel: Any, threads: int, shared_bytes: int = 0) -> int:
        """Blocks of ``kernel`` this rank may have resident at once (back-ends that run kernels only)."""
        raise BackendError(f"the {self.name} back-end runs no device kernels")

    def wave_blocks(self, kernel: Any, threads: int, shared_bytes: int = 0) -> int:
        """Blocks of a streaming kernel that fill this rank's SMs once (back-ends that run kernels only)."""
        raise BackendError(f"the {self.name} back-end runs no device kernels")

    def launch_resident(self, kernel: Any, grid: Any, block: Any, args: tuple, shared_bytes: int = 0,
                        stream: Any = None, limit: int | None = None) -> None:
        """Launch a persistent grid whose blocks must all run at once (back-ends that run kernels only)."""
        raise BackendError(f"the {self.name} back-end runs no device kernels")

    def grid_barrier(self, timeout: float | None = None) -> Any:
        """A ``circuslink::GridBarrier`` for a persistent kernel (back-ends that run kernels only)."""
        raise BackendError(f"the {self.name} back-end runs no device kernels")

    def synchronize(self) -> None:
        """Wait until this rank's device work is done (no-op without a device)."""
        return None

    # -- identity ---------------------------------------------------------------------------------
    @abstractmethod
    def device_label(self, nranks: int) -> str:
        """A short name for result files: ``cpu-<host>`` or ``<gpu-name>-x<count>``."""

    def module(self, package: str) -> ModuleType:
        """This back-end's module of subsystem ``package``: ``<package>._<name>``."""
        module = f"{package}._{self.name}"
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            raise BackendError(f"{package} has no module for the {self.name} back-end ({module})") from None

    def close(self) -> None:
        """Release what the back-end itself holds (its buffers are Resources of the World)."""
        return None


class HostMemory:
    """``nbytes`` zeroed bytes of host memory: ``array`` (uint8, for the host), ``ptr`` (the address device code and
    compiled code use), :meth:`release`. This one: an anonymous mapping of this process."""

    def __init__(self, nbytes: int) -> None:
        self._map = mmap.mmap(-1, nbytes)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.ptr = int(self.array.ctypes.data)

    def release(self) -> None:
        self.array = None
        try:
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view: the mapping goes with it
