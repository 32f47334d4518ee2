"""The cpu engine of the engine links: the rings live in this process's memory (anonymous shared mapping).

The proxy and a host agent are threads of the rank's process, so any host memory serves; a caller may
instead hand in memory of its own (``memory=``: e.g. a region of the forwarding layer's shared allocation,
so that a neighbour in the node can store packets into the out ring directly).
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np


class HostMemory:
    """``nbytes`` zeroed bytes the host reads and writes; ``ptr`` is the address agents use."""

    def __init__(self, world: Any, nbytes: int) -> None:
        self._map = mmap.mmap(-1, nbytes)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.ptr = int(self.array.ctypes.data)

    def release(self) -> None:
        self.array = None
        try:
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view: the mapping goes with it
