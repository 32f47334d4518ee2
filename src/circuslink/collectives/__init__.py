"""Collectives on channels: all-reduce, broadcast and barrier of arrays, from the host or inside kernels.

Host API (every rank calls the same collectives in the same order, as with MPI)::

    from circuslink import collectives
    total = collectives.allreduce(world, x, op="sum")     # "sum" | "max" | "min"
    x = collectives.broadcast(world, x, root=0)
    collectives.barrier(world)

The module functions use the world's default communicator, opened on first use and kept on the
World (``world.registry``); ``Comm(world, ...)`` opens one explicitly. A Comm is a collective
resource: ``comm.close()`` (collective) frees it, ``with`` closes it, and ``world.close()`` closes
what is left open. Any number of ranks from 1 up; integer and floating dtypes.

Device API (``#include <circuslink/collectives.cuh>``): ``comm.device_handle(nbytes)`` is the
by-value ``circuslink::collectives::Rings`` a kernel passes to ``allreduce_grid`` and friends;
``comm.wait(stream)`` waits, bounded, for such a kernel and raises the channel error of a ring
that stalled. docs/collectives.md has both APIs, the algorithms and the SM-budget rule.

Each back-end has its module (``world.backend_module("circuslink.collectives")``): ``_cpu`` runs the ring
algorithms from Python (a header goes around the ring first, so ranks that disagree on a call fail
naming both), ``_cuda`` launches one kernel per call (there the ranks are trusted to agree: a
mismatch ends in a channel time-out naming the channel). float16 is reduced on the cpu back-end only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lifecycle import Resource
from ..errors import ConfigError
from . import _algorithms as alg
from ._ring import DEFAULT_DEPTH_BYTES

OPS = tuple(alg.OPS)
_DEFAULT = "circuslink.collectives.default"  # the world's registry key of its default communicator


class Comm(Resource):
    """Rings of channels over a world, for collectives. Collective to create and to close.

    ``depth_bytes``: buffer of each ring channel where the host drives the rings (cpu); ``rings``:
    bandwidth rings (one block each) where kernels drive them (cuda, default 64); ``timeout``
    (seconds, default CIRCUSLINK_TIMEOUT; 0 = device waits never give up) bounds every wait of
    every call on this communicator.
    """

    _kind = "collectives communicator"

    def __init__(self, world: Any, depth_bytes: int = DEFAULT_DEPTH_BYTES, timeout: float | None = None,
                 rings: int | None = None) -> None:
        if rings is not None and (isinstance(rings, bool) or not isinstance(rings, int) or not 1 <= rings <= 128):
            raise ConfigError(f"collectives: rings={rings!r} must be an integer in 1..128")
        self.world = world
        self.rank = world.rank
        self.size = world.size
        self._impl = world.backend_module("circuslink.collectives").Collectives(world, depth_bytes, rings, timeout)
        self._register(world)

    # -- host API --------------------------------------------------------------------------------
    def allreduce(self, array: Any, op: str = "sum") -> Any:
        """The element-wise reduction of every rank's ``array`` (a new array, same shape)."""
        self._check_open("allreduce")
        alg.check_op(op)
        alg.check_array(array, "allreduce")
        return self._impl.allreduce(array, op)

    def broadcast(self, array: Any, root: int = 0) -> Any:
        """``root``'s ``array`` on every rank (each passes an array of the same shape and dtype)."""
        self._check_open("broadcast")
        if isinstance(root, bool) or not isinstance(root, int | np.integer) or not 0 <= root < self.size:
            raise ConfigError(f"broadcast root={root!r} is out of range for a world of {self.size} ranks")
        alg.check_array(array, "broadcast")
        return self._impl.broadcast(array, int(root))

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        self._check_open("barrier")
        self._impl.barrier()

    # -- device API ------------------------------------------------------------------------------
    def device_handle(self, nbytes: int | None = None) -> np.void:
        """The ``circuslink::collectives::Rings`` handle for a kernel (a 16-byte numpy struct CuPy passes
        by value): the bandwidth rings, or the low-latency ring when ``nbytes`` (the message a call moves)
        is small. Every rank passes the same handle kind to the same calls; see docs/collectives.md."""
        self._check_open("device_handle")
        if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer)
                                   or nbytes < 0):
            raise ConfigError(f"device_handle: nbytes={nbytes!r} must be a non-negative integer or None")
        return self._impl.device_handle(None if nbytes is None else int(nbytes))

    def wait(self, stream: Any, what: str = "a kernel using the collectives") -> None:
        """Wait, bounded, until ``stream``'s work (a kernel that called the device API) is done, then
        :meth:`check`. On time-out every device wait of this process is aborted and
        :class:`~circuslink.TimeoutError` names ``what`` and the rank."""
        self._check_open("wait")
        self._impl.wait(stream, what)

    def check(self) -> None:
        """Raise :class:`~circuslink.ChannelError` naming a ring channel whose device code timed out."""
        self._check_open("check")
        self._impl.check()

    # -- lifecycle (circuslink._lifecycle) ---------------------------------------------------------
    def _close(self, timeout: float | None) -> None:
        self._impl.close(timeout)

    def _release_local(self) -> None:
        self._impl.release_local()


def default_comm(world: Any) -> Comm:
    """The world's default communicator (opened, collectively, on first use; kept on the World)."""
    slot = world.registry(_DEFAULT, dict)
    comm = slot.get("comm")
    if comm is None or comm.closed:
        comm = slot["comm"] = Comm(world)
    return comm


def _comm(world_or_comm: Any) -> Comm:
    return world_or_comm if isinstance(world_or_comm, Comm) else default_comm(world_or_comm)


def allreduce(world_or_comm: Any, array: Any, op: str = "sum") -> Any:
    """Element-wise ``op`` ("sum", "max", "min") of every rank's ``array``; collective."""
    return _comm(world_or_comm).allreduce(array, op)


def broadcast(world_or_comm: Any, array: Any, root: int = 0) -> Any:
    """``root``'s ``array`` on every rank; collective."""
    return _comm(world_or_comm).broadcast(array, root)


def barrier(world_or_comm: Any) -> None:
    """Wait until every rank has called barrier; collective."""
    _comm(world_or_comm).barrier()


__all__ = ["OPS", "Comm", "allreduce", "barrier", "broadcast", "default_comm"]
