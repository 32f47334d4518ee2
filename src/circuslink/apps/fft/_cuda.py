"""The 2-D FFT's cuda back-end module: cuFFT (through CuPy) on the rows of a slab, on the world's stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_C2C, _Z2Z, _FORWARD, _INVERSE = 0x29, 0x69, -1, 1  # cufft.h: CUFFT_C2C, CUFFT_Z2Z, CUFFT_FORWARD, CUFFT_INVERSE


def row_fft(world: Any, slab: Any, inverse: bool) -> Callable[[], None]:
    """A callable that replaces every row of ``slab`` (a contiguous cupy array) by its unnormalised
    DFT, in place: one batched 1-D cuFFT plan, made once."""
    from cupy.cuda import cufft

    rows, n = slab.shape
    kind = _C2C if slab.dtype == np.complex64 else _Z2Z
    plan = cufft.Plan1d(n, kind, rows)
    direction = _INVERSE if inverse else _FORWARD
    stream = world.backend.stream

    def run() -> None:
        with stream:  # cuFFT runs on the current stream: the world's, in order with the RMA launches
            plan.fft(slab, slab, direction)

    run.plan = plan
    return run


def scale(world: Any, slab: Any, factor: float) -> None:
    with world.backend.stream:
        slab *= slab.dtype.type(factor)


def synchronize(world: Any) -> None:
    world.backend.stream.synchronize()


def enter(world: Any) -> None:
    """Order the world's stream after the caller's (its writes of the input land first)."""
    world.backend.after_caller()


def free_bytes(world: Any) -> tuple[int, str]:
    import cupy as cp

    free, _total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(free + pool.free_bytes()), f"memory on GPU {world.device}"


# Beside the window a rank holds cuFFT's work area (at most about one slab) and scratch.
EXTRA_SLABS = 1


def fft2_reference(x: Any, inverse: bool) -> Any:
    """The one-rank baseline: cuFFT's 2-D transform through cupy.fft (its plan cache keeps the plan)."""
    import cupy as cp

    return cp.fft.ifft2(x) if inverse else cp.fft.fft2(x)


def to_host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def random_slab(world: Any, shape: tuple[int, int], dtype: str, seed: Any) -> Any:
    import cupy as cp

    g = cp.random.default_rng(np.random.SeedSequence(seed).generate_state(1)[0])
    real = cp.float32 if dtype == "complex64" else cp.float64
    return (g.standard_normal(shape, dtype=real) + 1j * g.standard_normal(shape, dtype=real)).astype(dtype)
