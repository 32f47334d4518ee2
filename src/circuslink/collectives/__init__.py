"""Collectives on channels: all-reduce, broadcast and barrier of arrays, from the host or inside kernels.

Host API (every rank calls the same collectives in the same order, as with MPI)::

    from circuslink import collectives
    total = collectives.allreduce(world, x, op="sum")     # "sum" | "max" | "min"
    mine = collectives.reduce_scatter(world, x, op="sum")  # block `rank` of size equal blocks, reduced
    every = collectives.all_gather(world, x)              # every rank's x, in rank order
    x = collectives.broadcast(world, x, root=0)
    collectives.barrier(world)

bfloat16 travels as uint16 bit patterns with ``dtype="bfloat16"`` (numpy and cupy have no bfloat16).

The module functions use the world's default communicator, opened on first use and kept on the
World (``world.registry``); ``Comm(world, ...)`` opens one explicitly. A Comm is a collective
resource: ``comm.close()`` (collective) frees it, ``with`` closes it, and ``world.close()`` closes
what is left open. Any number of ranks from 1 up; integer and floating dtypes.

Device API (``#include <circuslink/collectives.cuh>``): ``comm.device_team()`` is the by-value
``circuslink::collectives::Team`` (ranks sharing memory) a kernel passes to ``allreduce`` and friends
(one-shot / two-shot); ``comm.device_handle(nbytes)`` is the
by-value ``circuslink::collectives::Rings`` a kernel passes to ``allreduce_grid`` and friends;
``comm.wait(stream)`` waits, bounded, for such a kernel and raises the channel error of a ring
that stalled. docs/collectives.md has both APIs, the algorithms and the SM-budget rule.

Each back-end has its module (``world.backend_module("circuslink.collectives")``): ``_cpu`` runs the ring
algorithms from Python (a header goes around the ring first, so ranks that disagree on a call fail
naming both), ``_cuda`` launches one kernel per call (there the ranks are trusted to agree: a
mismatch ends in a time-out naming the channel or the peer and slot). The algorithm is chosen by
size from one table (``_select``); ``algorithm=`` forces one. float16 is reduced on the cpu back-end only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lifecycle import Resource
from ..errors import ConfigError
from . import _algorithms as alg
from ._reduce import BF16
from ._ring import DEFAULT_DEPTH_BYTES
from ._select import ALGORITHMS

OPS = tuple(alg.OPS)
_DEFAULT = "circuslink.collectives.default"  # the world's registry key of its default communicator


class Comm(Resource):
    """Rings of channels over a world and, where its ranks map each other's memory, a team buffer, for
    collectives. Collective to create and to close.

    ``depth_bytes``: buffer of each ring channel where the host drives the rings (cpu); ``rings``:
    bandwidth rings (one block each) where kernels drive them (cuda, default 64); ``timeout``
    (seconds, default CIRCUSLINK_TIMEOUT; 0 = device waits never give up) bounds every wait of
    every call on this communicator. ``stage_bytes``: the team buffer's stage (ranks sharing memory),
    which two-shot calls move in pieces of (default: 32 MiB on cuda, 256 KiB on cpu).
    """

    _kind = "collectives communicator"

    def __init__(self, world: Any, depth_bytes: int = DEFAULT_DEPTH_BYTES, timeout: float | None = None,
                 rings: int | None = None, stage_bytes: int | None = None) -> None:
        if stage_bytes is not None and (isinstance(stage_bytes, bool) or not isinstance(stage_bytes, int)
                                        or stage_bytes < 4096 or stage_bytes % 4096):
            raise ConfigError(f"collectives: stage_bytes={stage_bytes!r} must be a positive multiple of 4096")
        if rings is not None and (isinstance(rings, bool) or not isinstance(rings, int) or not 1 <= rings <= 128):
            raise ConfigError(f"collectives: rings={rings!r} must be an integer in 1..128")
        self.world = world
        self.rank = world.rank
        self.size = world.size
        self._impl = world.backend_module("circuslink.collectives").Collectives(world, depth_bytes, rings, timeout,
                                                                               stage_bytes)
        self._register(world)

    @property
    def shares_memory(self) -> bool:
        """Whether this communicator's ranks map each other's memory (the one-shot / two-shot algorithms and
        :meth:`device_team`); otherwise every collective runs over the rings."""
        return self._impl.team is not None

    # -- host API --------------------------------------------------------------------------------
    def allreduce(self, array: Any, op: str = "sum", algorithm: str | None = None, dtype: str | None = None) -> Any:
        """The element-wise reduction of every rank's ``array`` (a new array, same shape).

        ``algorithm``: None picks by size (``_select``), or "oneshot" / "twoshot" (ranks sharing memory)
        / "ring". ``dtype="bfloat16"``: ``array`` is uint16 holding bfloat16 bit patterns."""
        self._check_open("allreduce")
        alg.check_op(op)
        alg.check_array(array, "allreduce")
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise ConfigError(f"allreduce: algorithm={algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        return self._impl.allreduce(array, op, algorithm, _bf16(array, dtype, "allreduce"))

    def reduce_scatter(self, array: Any, op: str = "sum", dtype: str | None = None) -> Any:
        """Block ``rank`` of ``array`` (size equal blocks, flattened) reduced over every rank: a new 1-D array."""
        self._check_open("reduce_scatter")
        alg.check_op(op)
        alg.check_array(array, "reduce_scatter")
        if array.size % self.size:
            raise ConfigError(f"reduce_scatter: {array.size} elements do not split into {self.size} equal blocks")
        return self._impl.reduce_scatter(array, op, _bf16(array, dtype, "reduce_scatter"))

    def all_gather(self, array: Any) -> Any:
        """Every rank's ``array`` (same shape and dtype everywhere), flattened and concatenated in rank order."""
        self._check_open("all_gather")
        alg.check_array(array, "all_gather")
        return self._impl.all_gather(array)

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
    def device_team(self) -> np.void:
        """The ``circuslink::collectives::Team`` handle for a kernel (by value): the shared-memory
        algorithms (one-shot, two-shot, reduce-scatter, all-gather, broadcast, barrier) of
        collectives.cuh. Only where every rank maps every other rank's memory; docs/collectives.md."""
        self._check_open("device_team")
        return self._impl.device_team()

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
        """Raise :class:`~circuslink.ChannelError` naming a ring channel, or the peer and slot of a team wait, whose
        device code timed out."""
        self._check_open("check")
        self._impl.check()

    # -- lifecycle (circuslink._lifecycle) ---------------------------------------------------------
    def _close(self, timeout: float | None) -> None:
        self._impl.close(timeout)

    def _release_local(self) -> None:
        self._impl.release_local()


def _bf16(array: Any, dtype: str | None, what: str) -> bool:
    """Whether ``array`` holds bfloat16 bit patterns (``dtype="bfloat16"`` on a uint16 array)."""
    if dtype is None:
        return False
    if dtype != BF16:
        raise ConfigError(f"{what}: dtype={dtype!r} is not supported (only 'bfloat16', for uint16 arrays)")
    if array.dtype != np.uint16:
        raise ConfigError(f"{what}: dtype='bfloat16' needs a uint16 array of bit patterns, got {array.dtype}")
    return True


def default_comm(world: Any) -> Comm:
    """The world's default communicator (opened, collectively, on first use; kept on the World)."""
    slot = world.registry(_DEFAULT, dict)
    comm = slot.get("comm")
    if comm is None or comm.closed:
        comm = slot["comm"] = Comm(world)
    return comm


def _comm(world_or_comm: Any) -> Comm:
    return world_or_comm if isinstance(world_or_comm, Comm) else default_comm(world_or_comm)


def allreduce(world_or_comm: Any, array: Any, op: str = "sum", algorithm: str | None = None,
              dtype: str | None = None) -> Any:
    """Element-wise ``op`` ("sum", "max", "min") of every rank's ``array``; collective."""
    return _comm(world_or_comm).allreduce(array, op, algorithm, dtype)


def reduce_scatter(world_or_comm: Any, array: Any, op: str = "sum", dtype: str | None = None) -> Any:
    """Block ``rank`` (of size equal blocks) of the element-wise ``op`` over every rank's ``array``; collective."""
    return _comm(world_or_comm).reduce_scatter(array, op, dtype)


def all_gather(world_or_comm: Any, array: Any) -> Any:
    """Every rank's ``array``, concatenated in rank order (1-D); collective."""
    return _comm(world_or_comm).all_gather(array)


def broadcast(world_or_comm: Any, array: Any, root: int = 0) -> Any:
    """``root``'s ``array`` on every rank; collective."""
    return _comm(world_or_comm).broadcast(array, root)


def barrier(world_or_comm: Any) -> None:
    """Wait until every rank has called barrier; collective."""
    _comm(world_or_comm).barrier()


__all__ = ["ALGORITHMS", "OPS", "Comm", "all_gather", "allreduce", "barrier", "broadcast", "default_comm",
           "reduce_scatter"]
