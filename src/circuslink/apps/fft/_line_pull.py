"""The pull scheme's own transform of one axis: a kernel that reads a stage's input straight from the ranks that
hold it, tile by tile, transforms it in shared memory and writes the stage's output once.

Why a kernel of our own. Through cuFFT's load callback (``_cuda.make_pull_fft``) every element is one load whose
neighbours belong to other threads' transforms: at complex64 each 8-byte load takes a 32-byte sector, and the
pulled stage ran 1.3-1.9 x the puts' whole FFT (BENCHMARKS.md, twenty-second session). Here a block owns ``T``
neighbouring runs ``j`` (``T`` elements of 64 bytes in all) of every point ``b`` of the axis, so each load
instruction takes whole sectors from the holder, and the reshape costs no pass over memory of its own: the
stage reads the peers once and writes its output once, UZURA's transpose inside the communication.

The transform is a Stockham autosort FFT (radix 8, then one radix-4 or radix-2 pass; Govindaraju et al., "High
Performance Discrete Fourier Transforms on Graphics Processors", SC 2008) on powers of two up to ``MAX_POINTS``,
in place in shared memory: each pass reads every element it owns into registers, waits for the block, then
writes. The first pass reads global memory (the peers) and the last writes global memory (the output rows,
whole lines), so a transform of 8^3 points makes four passes over shared memory, not eight. Twiddles come from
a table computed in double precision on the host.

Layout (as the callback's): ``dst.reshape(-1, n)[j, b]`` is element ``j`` of ``table[b]``, an address in the
window of the rank holding point ``b``'s run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

MAX_POINTS = 1024  # the largest axis: 8 runs x 1025 complex64 (64 KiB) of shared memory a block
THREADS = 256  # a block's threads where the tile has enough work for them
TILE_BYTES = 64  # the run each block reads of every point: two whole 32-byte sectors

_SOURCE = Path(__file__).resolve().parent / "line_pull.cu"

_modules: dict = {}  # (element, n, tile, per thread, sign) -> the compiled kernel


def fits(n: int, count: int) -> bool:
    """Whether this kernel transforms a pulled stage of ``count`` axes and ``n`` points: one axis, a power of two."""
    return count == 1 and 2 <= n <= MAX_POINTS and n & (n - 1) == 0


def shape(n: int, itemsize: int) -> tuple[int, int, int]:
    """(runs a block, elements a thread, threads a block) for ``n`` points of ``itemsize``-byte elements."""
    tile = max(1, TILE_BYTES // itemsize)
    each = max(8, tile * n // THREADS)
    return tile, each, tile * n // each


def _kernel(itemsize: int, n: int, inverse: bool) -> tuple[Any, int, int, int]:
    tile, each, threads = shape(n, itemsize)
    element = {8: "float2", 16: "double2"}[itemsize]
    name = f"circuslink_fft_line_pull<{element}, {n}, {tile}, {each}, {1 if inverse else -1}>"
    key = (itemsize, n, inverse)
    if key not in _modules:
        from ...device_code import compile as compile_device

        kernel = compile_device(_SOURCE.read_text(), name_expressions=[name]).get_function(name)
        smem = tile * (n + 1) * itemsize
        if smem > 48 << 10:
            kernel.max_dynamic_shared_size_bytes = smem
        _modules[key] = (kernel, tile, threads, smem)
    return _modules[key]


def make(dst: Any, n: int, table: Any, inverse: bool) -> Any:
    """A callable that fills ``dst`` (contiguous, complex, ``dst.size // n`` runs of ``n`` points) with the
    transforms along its last axis of what ``table`` (device array of ``n`` element addresses, one a point)
    points at, on the current stream; unnormalised, as cuFFT."""
    import cupy as cp

    kernel, tile, threads, smem = _kernel(dst.itemsize, n, inverse)
    sign = 1.0 if inverse else -1.0
    tw = cp.asarray(np.exp(sign * 2j * np.pi * np.arange(n) / n).astype(dst.dtype))
    runs = dst.size // n
    grid = (runs + tile - 1) // tile
    args = (np.uint64(table.data.ptr), np.uint64(tw.data.ptr), np.uint64(dst.data.ptr), np.int64(runs))

    def run() -> None:
        kernel((grid,), (threads,), args, shared_mem=smem, stream=cp.cuda.get_current_stream())

    run.keep = (table, tw)  # the kernel reads them at every launch
    return run
