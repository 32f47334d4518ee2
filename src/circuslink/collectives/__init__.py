"""Collectives on channels: all-reduce, broadcast and barrier.

Host API (every rank calls the same collectives in the same order, as with MPI)::

    from circuslink import collectives
    total = collectives.allreduce(world, x, op="sum")     # "sum" | "max" | "min"
    x = collectives.broadcast(world, x, root=0)
    collectives.barrier(world)

The first call on a world opens a ring of channels (rank r -> rank r+1) that later calls
reuse; ``Comm(world, depth_bytes=...)`` makes one explicitly, and ``comm.close()`` (also
collective) frees it. Any number of ranks from 1 up; integer and floating dtypes.

Algorithms: ring reduce-scatter + all-gather for all-reduce (each segment is reduced
once, so every rank gets bitwise the same result; floating sums differ from a serial sum
only by rounding, in ring order), a pipelined chain for broadcast, two trips of a token
for barrier. Before each all-reduce and broadcast a 16-byte header goes around the ring,
so ranks that disagree on the call (count, dtype, op, root) fail with a message naming
both ranks instead of exchanging garbage.

On the cuda back-end each call is one launch of the device collectives; there the ranks are
trusted to agree (a mismatch ends in a channel time-out naming the channel, not a header check).
float16 is reduced on the cpu back-end only.

Device API: ``#include <circuslink/collectives.cuh>``; ``comm.device_rings()`` gives the
``circuslink::collectives::Ring`` array a kernel passes to ``allreduce_grid`` and friends.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from . import _algorithms as alg
from ._ring import DEFAULT_DEPTH_BYTES, ChannelRing

OPS = tuple(alg.OPS)


class Comm:
    """Rings of channels over a world, for collectives. Collective to create and close.

    cpu: one ring of byte channels of ``depth_bytes``, driven from Python. cuda: one
    low-latency ring and ``rings`` bandwidth rings (one block each), driven by one kernel
    launch per call; :meth:`device_rings` hands the same rings to users' kernels.
    """

    def __init__(self, world: Any, depth_bytes: int = DEFAULT_DEPTH_BYTES, timeout: float | None = None,
                 rings: int | None = None) -> None:
        self.world = world
        self.rank = world.rank
        self.size = world.size
        self._cuda = None
        if rings is not None and (not isinstance(rings, int) or not 1 <= rings <= 128):
            raise ConfigError(f"collectives: rings={rings!r} must be an integer in 1..128")
        if world.backend.name == "cuda":
            from ._device import DEFAULT_RINGS, CudaCollectives

            self._cuda = CudaCollectives(world, rings or DEFAULT_RINGS, timeout)
            self._ring = self._cuda.ll_ring
        else:
            self._ring = ChannelRing(world, depth_bytes, timeout)

    def device_rings(self, nbytes: int | None = None) -> tuple[int, int]:
        """``(pointer, count)`` of an array of ``circuslink::collectives::Ring`` for a kernel
        (cuda): the bandwidth rings, or the low-latency ring when ``nbytes`` is small. Use the
        same rings on every rank, with ``*_grid`` calls of ``count`` blocks or more."""
        if self._cuda is None:
            raise ConfigError("device_rings() is for kernels on the cuda back-end")
        rings = self._cuda.rings_for(nbytes) if nbytes is not None else self._cuda.bw
        return rings.ptr, rings.count

    def _ports(self) -> tuple[Any, Any, int]:
        if self.size > 1 and self._ring.channels is None:
            raise ConfigError("this collectives Comm is closed")
        return self._ring.right, self._ring.left, self._ring.piece

    def allreduce(self, array: Any, op: str = "sum") -> Any:
        """The element-wise reduction of every rank's ``array`` (a new array, same shape)."""
        alg.check_op(op)
        alg.check_array(array, "allreduce")
        if self._cuda is not None:
            return self._cuda.allreduce(array, op)
        right, left, piece = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "allreduce", array, op=op)
        return alg.ring_allreduce(self.rank, self.size, right, left, array, op, piece)

    def broadcast(self, array: Any, root: int = 0) -> Any:
        """``root``'s ``array`` on every rank (each passes an array of the same shape and dtype)."""
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ConfigError(f"broadcast root={root!r} is out of range for a world of {self.size} ranks")
        alg.check_array(array, "broadcast")
        if self._cuda is not None:
            return self._cuda.broadcast(array, root)
        right, left, piece = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "broadcast", array, root=root)
        return alg.ring_broadcast(self.rank, self.size, right, left, array, root, piece)

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        if self._cuda is not None:
            self._cuda.barrier()
            return
        right, left, _ = self._ports()
        alg.ring_barrier(self.rank, self.size, right, left)

    def close(self) -> None:
        """Collective: free the rings."""
        if self._cuda is not None:
            self._cuda.close()
        else:
            self._ring.close()
        if _COMMS.get(id(self.world)) is self:
            del _COMMS[id(self.world)]


_COMMS: dict[int, Comm] = {}


def _comm(world_or_comm: Any) -> Comm:
    if isinstance(world_or_comm, Comm):
        return world_or_comm
    comm = _COMMS.get(id(world_or_comm))
    if comm is None or comm.world is not world_or_comm or getattr(world_or_comm, "_closed", False):
        comm = Comm(world_or_comm)
        _COMMS[id(world_or_comm)] = comm
    return comm


def allreduce(world_or_comm: Any, array: Any, op: str = "sum") -> Any:
    """Element-wise ``op`` ("sum", "max", "min") of every rank's ``array``; collective."""
    return _comm(world_or_comm).allreduce(array, op)


def broadcast(world_or_comm: Any, array: Any, root: int = 0) -> Any:
    """``root``'s ``array`` on every rank; collective."""
    return _comm(world_or_comm).broadcast(array, root)


def barrier(world_or_comm: Any) -> None:
    """Wait until every rank has called barrier; collective."""
    _comm(world_or_comm).barrier()


__all__ = ["OPS", "Comm", "allreduce", "barrier", "broadcast"]
