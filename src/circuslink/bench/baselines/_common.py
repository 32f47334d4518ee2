"""What every baseline shares: multicast off, fresh random data, argument checks, skipped rows.

Every wait of a baseline goes through :func:`circuslink._wait.wait_until` with a
:class:`~circuslink._wait.Deadline` passed down: ``timeout`` bounds each size's measurement (its
barriers, its data check and its timed loop together), so a dead peer ends the benchmark with an
error naming what stalled instead of a hang."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from ...errors import ConfigError

# NVLink multicast (NVLS) stays off in every baseline: the device machines must run with it
# off, and our channels do not use it, so the comparison stays like for like.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast() -> None:
    """Set NCCL_NVLS_ENABLE=0 and NVSHMEM_DISABLE_NVLS=1 before NCCL / NVSHMEM initialise."""
    os.environ.update(MULTICAST_OFF)


def on_gpu(world: Any) -> bool:
    """Whether the world's data lives on a GPU: a back-end that runs kernels, with a device (never
    decided by the back-end's name)."""
    return bool(world.backend.runs_kernels) and world.device is not None


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


def gbps(nbytes: float, seconds: float) -> float | None:
    """GB/s (10^9 bytes per second, as nccl-tests and the probe report)."""
    return nbytes / seconds / 1e9 if seconds > 0 else None
