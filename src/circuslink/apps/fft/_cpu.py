"""The 2-D FFT's cpu back-end module: numpy's FFT on the rows of a slab, host memory limits."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np


def row_fft(world: Any, slab: np.ndarray, inverse: bool) -> Callable[[], None]:
    """A callable that replaces every row of ``slab`` by its unnormalised DFT (inverse: exp(+2 pi i ...))."""
    # norm="forward" leaves the inverse unscaled (the plan scales once at the end), like cuFFT.
    if inverse:
        return lambda: np.copyto(slab, np.fft.ifft(slab, axis=1, norm="forward"))
    return lambda: np.copyto(slab, np.fft.fft(slab, axis=1))


def scale(world: Any, slab: np.ndarray, factor: float) -> None:
    slab *= slab.dtype.type(factor)


def synchronize(world: Any) -> None:
    """Nothing runs asynchronously on the cpu."""


def enter(world: Any) -> None:
    """Nothing to order on the cpu (see the cuda module)."""


def free_bytes(world: Any) -> tuple[int, str]:
    """(bytes this machine can still give, what that is): MemAvailable, and /dev/shm where windows live."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    what = "host memory (MemAvailable)"
    try:
        shm = shutil.disk_usage("/dev/shm").free
        if shm < avail:
            avail, what = shm, "shared memory (/dev/shm)"
    except OSError:
        pass
    return int(avail), what


# Beside the window a rank holds numpy's output of one row FFT and its scratch: about two slabs.
EXTRA_SLABS = 2


def fft2_reference(x: np.ndarray, inverse: bool) -> np.ndarray:
    """The one-rank baseline: numpy's fft2 / ifft2."""
    return np.fft.ifft2(x) if inverse else np.fft.fft2(x)


def to_host(a: Any) -> np.ndarray:
    return np.asarray(a)


def random_slab(world: Any, shape: tuple[int, int], dtype: str, seed: Any) -> np.ndarray:
    g = np.random.default_rng(seed)
    real = "f4" if dtype == "complex64" else "f8"
    return (g.standard_normal(shape, dtype=real) + 1j * g.standard_normal(shape, dtype=real)).astype(dtype)
