"""What every baseline shares: multicast off, fresh random data, bounded waits, skipped rows."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..._config import resolve_timeout
from ...errors import ConfigError, TimeoutError

# NVLink multicast (NVLS) stays off in every baseline: the device machines must run with it
# off, and our channels do not use it, so the comparison stays like for like.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}

_SPIN_S = 0.002  # poll without sleeping this long: short waits stay precise
_NAP_S = 0.0002  # then nap between polls, so a long wait does not take a CPU core


def disable_multicast() -> None:
    """Set NCCL_NVLS_ENABLE=0 and NVSHMEM_DISABLE_NVLS=1 before NCCL / NVSHMEM initialise."""
    os.environ.update(MULTICAST_OFF)


def fresh_seed() -> int:
    """A new random seed for each size, so a test never passes on stale data from the last one."""
    return secrets.randbits(63)


def random_bytes(seed: int, nbytes: int):
    """``nbytes`` random bytes (numpy uint8) from ``seed``: the same on every rank that knows the seed."""
    import numpy as np

    return np.frombuffer(np.random.default_rng(seed).bytes(nbytes), dtype=np.uint8).copy()


def check_sizes(sizes: Iterable[int], what: str) -> list[int]:
    out = list(sizes)
    if not out:
        raise ConfigError(f"{what}: no sizes given")
    for s in out:
        if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
            raise ConfigError(f"{what}: size {s!r} is not a positive number of bytes")
    return out


def check_counts(iters: int, warmup: int, what: str) -> None:
    if not isinstance(iters, int) or iters <= 0:
        raise ConfigError(f"{what}: iters must be a positive integer, got {iters!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"{what}: warmup must be zero or a positive integer, got {warmup!r}")


def skipped_rows(impl: str, sizes: Sequence[int], reason: str, **extra: Any) -> list[dict]:
    """One row per size saying why ``impl`` did not run (callers print the reason, never drop it)."""
    return [dict(impl=impl, bytes=int(s), skipped=reason, **extra) for s in sizes]


def wait_until(done, timeout: float | None, describe) -> None:
    """Poll ``done()`` until true; after ``timeout`` s raise TimeoutError with ``describe()`` in it.

    Spins briefly first (most waits are short and the figure must stay precise), then naps.
    """
    limit = resolve_timeout(timeout)
    start = time.monotonic()
    while not done():
        elapsed = time.monotonic() - start
        if elapsed > limit:
            raise TimeoutError(f"{describe()} did not complete within {limit:g} s (CIRCUSLINK_TIMEOUT sets the limit)")
        if elapsed > _SPIN_S:
            time.sleep(_NAP_S)


def gbps(nbytes: float, seconds: float) -> float | None:
    """GB/s (10^9 bytes per second, as nccl-tests and the probe report)."""
    return nbytes / seconds / 1e9 if seconds > 0 else None
