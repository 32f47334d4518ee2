"""The collectives' back-end module on back-ends that run no kernels (cpu): the ring algorithms of
:mod:`._algorithms`, driven from Python over one ring of byte channels.

Before each all-reduce and broadcast a 16-byte header goes around the ring, so ranks that
disagree on the call (count, dtype, op, root) fail with a message naming both ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from . import _algorithms as alg
from ._ring import ChannelRing


class Collectives:
    """One ring of byte channels of ``depth_bytes``; every call runs on the calling thread."""

    def __init__(self, world: Any, depth_bytes: int, rings: int | None, timeout: float | None) -> None:
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.ring = ChannelRing(world, depth_bytes, timeout)

    def _ports(self) -> tuple[Any, Any, int]:
        return self.ring.right, self.ring.left, self.ring.piece

    def allreduce(self, array: np.ndarray, op: str) -> np.ndarray:
        right, left, piece = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "allreduce", array, op=op)
        return alg.ring_allreduce(self.rank, self.size, right, left, array, op, piece)

    def broadcast(self, array: np.ndarray, root: int) -> np.ndarray:
        right, left, piece = self._ports()
        alg.check_agreement(self.rank, self.size, right, left, "broadcast", array, root=root)
        return alg.ring_broadcast(self.rank, self.size, right, left, array, root, piece)

    def barrier(self) -> None:
        right, left, _ = self._ports()
        alg.ring_barrier(self.rank, self.size, right, left)

    def device_handle(self, nbytes: int | None) -> np.void:
        raise ConfigError(f"device_handle() is for kernels, and the {self.world.backend.name} back-end runs none: "
                          "call comm.allreduce / broadcast / barrier")

    def check(self) -> None:
        self.ring.check()

    def wait(self, stream: Any, what: str) -> None:
        raise ConfigError(f"wait() is for kernels, and the {self.world.backend.name} back-end runs none")

    def close(self, timeout: float | None) -> None:
        self.ring.close(timeout)

    def release_local(self) -> None:
        self.ring.release_local()
