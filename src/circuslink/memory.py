"""Symmetric memory: one buffer per rank, each mapped into every rank of the machine.

A :class:`SymmetricBuffer` is what :meth:`World.alloc` returns. ``buf.local`` is my
buffer; ``buf.peer(r)`` is rank r's buffer as mapped into my address space (the
same memory, so a store into it lands in rank r's buffer); ``buf.ptr(r)`` is the raw
address to hand to a kernel. Arrays are numpy on the cpu back-end and cupy on the
cuda back-end; both export DLPack (``__dlpack__``) for other frameworks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import ConfigError


class SymmetricBuffer:
    """A collective allocation. Back-ends construct it; users only read it and free it."""

    def __init__(
        self,
        world: Any,
        nbytes: int,
        ptrs: list[int],
        make_array: Callable[[int], Any],
        release_local: Callable[[], None],
        release_all: Callable[[float | None], None],
    ) -> None:
        self.world = world
        self.nbytes = nbytes
        self._ptrs = ptrs
        self._make_array = make_array
        self._release_local_fn = release_local
        self._release_all_fn = release_all
        self._arrays: dict[int, Any] = {}
        self.freed = False

    def _check(self, rank: int) -> None:
        if self.freed:
            raise ConfigError("this symmetric buffer has been freed")
        if not isinstance(rank, int | np.integer) or not 0 <= rank < len(self._ptrs):
            raise ConfigError(f"rank {rank} is out of range for a world of {len(self._ptrs)} ranks")

    def ptr(self, rank: int | None = None) -> int:
        """Address of rank ``rank``'s buffer in this process (device pointer on cuda)."""
        rank = self.world.rank if rank is None else rank
        self._check(rank)
        return self._ptrs[rank]

    @property
    def ptrs(self) -> list[int]:
        """Addresses of every rank's buffer, in rank order."""
        self._check(self.world.rank)
        return list(self._ptrs)

    def peer(self, rank: int):
        """Rank ``rank``'s buffer as a uint8 array (a view of the mapped memory)."""
        self._check(rank)
        if rank not in self._arrays:
            self._arrays[rank] = self._make_array(rank)
        return self._arrays[rank]

    @property
    def local(self):
        """My own buffer as a uint8 array."""
        return self.peer(self.world.rank)

    def view(self, dtype, rank: int | None = None):
        """Rank ``rank``'s buffer (mine by default) reinterpreted as ``dtype``."""
        rank = self.world.rank if rank is None else rank
        arr = self.peer(rank)
        itemsize = np.dtype(dtype).itemsize
        return arr[: self.nbytes - self.nbytes % itemsize].view(dtype)

    def _release_local(self) -> None:
        """Drop my mappings without waiting for peers (used on the error path)."""
        if not self.freed:
            self.freed = True
            self._arrays.clear()
            self._release_local_fn()
            self.world._forget(self)

    def free(self, timeout: float | None = None) -> None:
        """Collective: unmap peers, wait for every rank, release my buffer. Idempotent."""
        if self.freed:
            return
        self.freed = True
        self._arrays.clear()
        self.world._forget(self)
        self._release_all_fn(timeout)

    def __enter__(self) -> SymmetricBuffer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.free()
        else:
            self._release_local()

    def __repr__(self) -> str:
        return f"SymmetricBuffer(nbytes={self.nbytes}, ranks={len(self._ptrs)}, backend={self.world.backend.name!r})"
