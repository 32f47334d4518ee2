"""The host half of ``circuslink::GridBarrier`` (circuslink/grid.cuh): its counters, the abort word and the
time-out a persistent kernel's ``grid_sync(bar)`` waits with. Made by ``world.backend.grid_barrier()``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _abi
from .._config import resolve_timeout
from ..errors import ConfigError

GRID_BARRIER = _abi.Struct("circuslink::GridBarrier", "circuslink/grid.cuh", [
    ("counters", _abi.PTR), ("abort", _abi.PTR), ("timeout_ns", _abi.U64)])


def timeout_ns(timeout: float | None) -> int:
    """Nanoseconds for a device wait: ``None`` is CIRCUSLINK_TIMEOUT, 0 is never (the host's abort still ends
    it), anything else a positive number of seconds."""
    if timeout == 0:
        return 0
    if isinstance(timeout, bool) or (timeout is not None and not isinstance(timeout, int | float)):
        raise ConfigError(f"grid barrier: timeout must be seconds (a number) or None, got {timeout!r}")
    return int(resolve_timeout(timeout) * 1e9)


class GridBarrier:
    """Two zeroed words of device memory and the wait's limits, for one persistent grid at a time.

    ``device_handle()`` is the kernel argument. The counters return to zero after every complete
    ``grid_sync``, so one barrier serves launch after launch; after a launch whose barrier timed out or
    was aborted, :meth:`reset` zeroes them (on the stream the next launch uses)."""

    def __init__(self, xp: Any, abort_ptr: int, timeout: float | None = None) -> None:
        self._counters = xp.zeros(2, dtype=np.uint32)
        self.timeout_ns = timeout_ns(timeout)
        self._handle = GRID_BARRIER.pack(counters=int(self._counters.data.ptr), abort=int(abort_ptr),
                                         timeout_ns=self.timeout_ns)

    def device_handle(self) -> np.void:
        """The kernel argument ``circuslink::GridBarrier`` (by value)."""
        return self._handle

    def reset(self, stream: Any = None) -> None:
        """Zero the counters on ``stream`` (default: the current one), after a launch whose barrier failed."""
        if stream is None:
            self._counters.fill(0)
        else:
            with stream:
                self._counters.fill(0)
