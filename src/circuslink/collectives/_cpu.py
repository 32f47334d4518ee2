"""The collectives' back-end module on back-ends that run no kernels (cpu): the algorithms driven from
Python. Where every rank maps every other rank's memory (the usual case: one machine) the one-shot
and two-shot algorithms of :mod:`._team` over a team buffer; otherwise, and for ``algorithm="ring"``,
the ring algorithms of :mod:`._algorithms` over one ring of byte channels.

Before each all-reduce and broadcast a 16-byte header goes around the ring, so ranks that
disagree on the call (count, dtype, op, root) fail with a message naming both ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from . import _algorithms as alg
from . import _layout as lay
from ._ring import ChannelRing
from ._select import oneshot_max, resolve
from ._team import Team

DEFAULT_STAGE_BYTES = 256 << 10  # two-shot pieces: Python copies, so a small stage costs little


def shares_memory(world: Any) -> bool:
    """Whether every rank of the world maps every other rank's memory (one node)."""
    return len(world.nodes) == 1


class Collectives:
    """One ring of byte channels of ``depth_bytes`` and, where the ranks share memory, a team buffer;
    every call runs on the calling thread."""

    def __init__(self, world: Any, depth_bytes: int, rings: int | None, timeout: float | None,
                 stage_bytes: int | None = None) -> None:
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.ring = ChannelRing(world, depth_bytes, timeout)
        self.team = self.team_buf = None
        if self.size > 1 and shares_memory(world):
            stage = stage_bytes or DEFAULT_STAGE_BYTES
            try:
                self.team_buf = world.alloc(lay.team_offsets(self.size, stage)["total"], timeout)
                self.team = Team(self.team_buf, self.rank, self.size, stage, oneshot_max(self.size), timeout)
            except BaseException:
                self.ring.release_local()
                raise

    def _ports(self) -> tuple[Any, Any, int]:
        return self.ring.right, self.ring.left, self.ring.piece

    def ring_slices(self, nbytes: int) -> int:
        """One ring carries every ring all-reduce here (its fold order: ``_algorithms.ring_fold_starts``)."""
        return 1

    def allreduce(self, array: np.ndarray, op: str, algorithm: str | None = None, bf16: bool = False) -> np.ndarray:
        right, left, piece = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "allreduce", array, op=op)
        how = resolve(array.nbytes, self.size, self.team is not None, algorithm)
        if self.size == 1 or array.size == 0:
            return np.array(array, copy=True)
        if how == "oneshot":
            return self.team.oneshot_allreduce(array, op, bf16)
        if how == "twoshot":
            return self.team.twoshot_allreduce(array, op, bf16)
        return alg.ring_allreduce(self.rank, self.size, right, left, array, op, piece, bf16)

    def reduce_scatter(self, array: np.ndarray, op: str, bf16: bool = False) -> np.ndarray:
        right, left, _ = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "reduce_scatter", array, op=op)
        if self.team is None:  # no shared memory: the ring all-reduce, keeping my block
            count = array.size // self.size
            return self.allreduce(array, op, "ring", bf16).reshape(-1)[self.rank * count:(self.rank + 1) * count]
        return self.team.reduce_scatter(array, op, bf16)

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        right, left, _ = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "all_gather", array)
        if self.team is None:  # no shared memory: one ring broadcast per rank
            return np.concatenate([self.broadcast(array, q).reshape(-1) for q in range(self.size)])
        return self.team.all_gather(array)

    def broadcast(self, array: np.ndarray, root: int) -> np.ndarray:
        right, left, piece = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "broadcast", array, root=root)
        if self.team is not None:
            return self.team.broadcast(array, root)
        return alg.ring_broadcast(self.rank, self.size, right, left, array, root, piece)

    def barrier(self) -> None:
        if self.team is not None:
            self.team.barrier()
            return
        right, left, _ = self._ports()
        alg.ring_barrier(self.rank, self.size, right, left)

    def device_handle(self, nbytes: int | None) -> np.void:
        raise ConfigError(f"device_handle() is for kernels, and the {self.world.backend.name} back-end runs none: "
                          "call comm.allreduce / broadcast / barrier")

    def device_team(self) -> np.void:
        raise ConfigError(f"device_team() is for kernels, and the {self.world.backend.name} back-end runs none")

    def check(self) -> None:
        self.ring.check()

    def wait(self, stream: Any, what: str) -> None:
        raise ConfigError(f"wait() is for kernels, and the {self.world.backend.name} back-end runs none")

    def close(self, timeout: float | None) -> None:
        self.ring.close(timeout)
        buf, self.team_buf, self.team = self.team_buf, None, None
        if buf is not None:
            buf.close(timeout)

    def release_local(self) -> None:
        self.ring.release_local()
        buf, self.team_buf, self.team = self.team_buf, None, None
        if buf is not None:
            buf._release_local()
