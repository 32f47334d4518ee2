"""Symmetric memory: one buffer per rank, each mapped into every rank of the machine (or into its peers only).

A :class:`SymmetricBuffer` is what :meth:`World.alloc` returns. ``buf.local`` is my
buffer; ``buf.peer(r)`` is rank r's buffer as mapped into my address space (the
same memory, so a store into it lands in rank r's buffer); ``buf.ptr(r)`` is the raw
address to hand to a kernel. An allocation made with ``peers=`` (a direct network: a rank
maps only its neighbours' memory) maps only those ranks; ``buf.mapped`` says which, and
``peer`` / ``ptr`` of another rank raise one line naming it. Arrays are numpy on the cpu back-end and cupy on the
cuda back-end; both export DLPack (``__dlpack__``) for other frameworks. It is a
:class:`~circuslink._lifecycle.Resource`: ``close()`` (collective) frees it, ``with``
closes it, and the World closes what is left open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._lifecycle import Resource
from .errors import ConfigError


class SymmetricBuffer(Resource):
    """A collective allocation. Back-ends construct it; users read it and close it."""

    _kind = "symmetric buffer"

    def __init__(
        self,
        rank: int,
        nbytes: int,
        ptrs: list[int],
        make_array: Callable[[int], Any],
        release_local: Callable[[], None],
        release_all: Callable[[float | None], None],
        backend_name: str = "",
        mapped: frozenset[int] | None = None,
    ) -> None:
        self.rank = rank
        self.nbytes = nbytes
        self._ptrs = ptrs
        self._make_array = make_array
        self._release_local_fn = release_local
        self._release_all_fn = release_all
        self._backend_name = backend_name
        self._arrays: dict[int, Any] = {}
        # the ranks whose memory this rank maps (itself included); None: every rank
        self._mapped = None if mapped is None else frozenset(mapped) | {rank}
        self.world = None  # the World that owns it (set by World.alloc), which closes it if the user does not

    @property
    def freed(self) -> bool:
        return self._closed

    def _check(self, rank: int) -> None:
        if self._closed:
            raise ConfigError("this symmetric buffer has been closed")
        if not isinstance(rank, int | np.integer) or not 0 <= rank < len(self._ptrs):
            raise ConfigError(f"rank {rank} is out of range for a world of {len(self._ptrs)} ranks")
        if self._mapped is not None and rank not in self._mapped:
            raise ConfigError(f"rank {self.rank} maps only ranks {_ranks_text(self._mapped)} of this symmetric buffer "
                              f"(allocated with peers=...): rank {rank}'s memory is not mapped here")

    @property
    def mapped(self) -> list[int]:
        """The ranks whose memory this rank maps, itself included (every rank unless allocated with ``peers``)."""
        return sorted(self._mapped) if self._mapped is not None else list(range(len(self._ptrs)))

    def ptr(self, rank: int | None = None) -> int:
        """Address of rank ``rank``'s buffer in this process (device pointer on cuda)."""
        rank = self.rank if rank is None else rank
        self._check(rank)
        return self._ptrs[rank]

    @property
    def ptrs(self) -> list[int]:
        """Addresses of every rank's buffer, in rank order (0 for a rank this rank does not map)."""
        self._check(self.rank)
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
        return self.peer(self.rank)

    def view(self, dtype, rank: int | None = None):
        """Rank ``rank``'s buffer (mine by default) reinterpreted as ``dtype``."""
        rank = self.rank if rank is None else rank
        arr = self.peer(rank)
        itemsize = np.dtype(dtype).itemsize
        return arr[: self.nbytes - self.nbytes % itemsize].view(dtype)

    def _release_local(self) -> None:
        """Drop my mappings without waiting for peers (the error path)."""
        self._arrays.clear()
        self._release_local_fn()

    def _close(self, timeout: float | None) -> None:
        """Collective: unmap peers, wait for every rank, release my buffer."""
        self._arrays.clear()
        self._release_all_fn(timeout)

    def __repr__(self) -> str:
        peers = "" if self._mapped is None else f", mapped={self.mapped}"
        return f"SymmetricBuffer(nbytes={self.nbytes}, ranks={len(self._ptrs)}{peers}, backend={self._backend_name!r})"


def _ranks_text(ranks) -> str:
    return ", ".join(map(str, sorted(ranks)))
