"""The pull scheme's own transform of one axis: kernels that read a stage's input straight from the ranks that
hold it, tile by tile, transform it in shared memory and write the stage's output (line_pull.cu).

Why kernels of our own. Through cuFFT's load callback (``_cuda.make_pull_fft``) every element is one load whose
neighbours belong to other threads' transforms: at complex64 each 8-byte load takes a 32-byte sector, and the
pulled stage ran 1.3-1.9 x the puts' whole FFT (BENCHMARKS.md, twenty-second session). Here a block owns ``T``
neighbouring runs ``j`` (``T`` elements of 64 bytes in all) of every point ``b`` it transforms, so each load
instruction takes whole sectors from the holder, and the reshape costs no pass over memory of its own: UZURA's
transpose inside the communication.

* Up to ``MAX_POINTS`` points: one kernel, one pass over memory (read the peers, write the output).
* Up to ``CLUSTER_BYTES`` of points (16384 complex64, 8192 complex128): still one pass, by a thread-block
  cluster of ``T`` blocks (``T`` runs of 64 bytes). Each block reads a ``T``-th of the points of every run of
  the cluster, whole sectors again, and stores them into the shared memory of the run's block (distributed
  shared memory, sm_90); then each block transforms its own run. Up to twice that (16384 complex128), two
  blocks a run, each transforming the even or the odd points; the halves then meet through shared memory in
  one radix-2 step (decimation in time) as they write the output.
* Up to ``MAX_POINTS ** 2``: a four-step FFT of ``n = m1 x m2`` in two kernels. The first pulls, for each
  ``b2 < m2``, the ``m1`` points ``b1 x m2 + b2``, transforms them and twiddles them into a scratch array
  of the output's size (kept in the plan's cache, shared by its pulled stages: they run on one stream); the
  second transforms across ``b2`` and writes the output. Two passes, as cuFFT takes for such lengths, of which
  the first is also the reshape.

Powers of two only (the kernels' radices are 8, 4 and 2). Layout (as the callback's): ``dst.reshape(-1, n)[j, b]``
is element ``j`` of ``table[b]``, an address in the window of the rank holding point ``b``'s run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import BackendError

MAX_POINTS = 1024  # one kernel's largest axis: 8 runs x 1025 complex64 (64 KiB) of shared memory a block
THREADS = 256  # a block's threads where the tile has enough work for them
TILE_BYTES = 64  # the run each block reads of every point: two whole 32-byte sectors
CLUSTER_BYTES = 128 << 10  # one run's points in one block's shared memory (1/16 more with the padding)
CLUSTER_THREADS = 1024  # the cluster kernel's threads a block, at least 8 elements each

_SOURCE = Path(__file__).resolve().parent / "line_pull.cu"
_modules: dict = {}  # (kernel, element, points, sign, rows) -> (the compiled kernel, tile, threads, shared bytes)


def fits(n: int, count: int) -> bool:
    """Whether these kernels transform a pulled stage of ``count`` axes and ``n`` points: one axis of a power of
    two, up to ``MAX_POINTS ** 2``."""
    return count == 1 and 2 <= n <= MAX_POINTS ** 2 and n & (n - 1) == 0


def faster(n: int, itemsize: int) -> bool:
    """Whether these kernels were measured faster than cuFFT's load callback for ``n`` points (``fits``):
    one pass at either precision (512 points split 4 ways on one H100: 0.22 against 0.67 ms at complex64, 0.45
    against 0.52 at complex128), the four-step at complex64 only (16384 points: 1.10 against 1.73 ms; at
    complex128 2.13 against 1.98; ``scripts/dev/fft_line_pull_probe.py``, BENCHMARKS.md, 2026-12-08)."""
    return n <= MAX_POINTS or itemsize == 8


def cluster_blocks(n: int, itemsize: int) -> int:
    """The cluster kernel's blocks a run of ``n`` points (``fits``) above ``MAX_POINTS``: 1 where the run fits
    one block's shared memory, 2 where two halves do and the cluster stays within the portable 8 blocks; 0 where
    the kernel does not take it."""
    if n <= MAX_POINTS:
        return 0
    halves = -(-n * itemsize // CLUSTER_BYTES)
    return halves if halves in (1, 2) and halves * TILE_BYTES // itemsize <= 8 else 0


def cluster_fits(n: int, itemsize: int) -> bool:
    """Whether the cluster kernel transforms a run of ``n`` points (``fits``)."""
    return cluster_blocks(n, itemsize) > 0


def kernel_for(n: int, itemsize: int, cluster: bool) -> str:
    """Which of these kernels ``make`` runs for ``n`` points (``fits``): ``line`` up to ``MAX_POINTS``, else
    ``cluster`` where asked for and it fits, else ``four-step``."""
    if n <= MAX_POINTS:
        return "line"
    return "cluster" if cluster and cluster_fits(n, itemsize) else "four-step"


def scratch_bytes(n: int, itemsize: int, elements: int, cluster: bool) -> int:
    """The GPU memory ``make`` allocates beside its output of ``elements`` elements: the four-step's scratch
    array, the size of the output (a plan's memory check counts it before anything is allocated)."""
    return elements * itemsize if kernel_for(n, itemsize, cluster) == "four-step" else 0


def halves(n: int) -> tuple[int, int]:
    """The four-step's ``(m1, m2)`` for ``n`` points: ``m1`` pulled and transformed first, the larger half."""
    m1 = 1 << (n.bit_length() // 2)
    return m1, n // m1


def shape(n: int, itemsize: int, cluster: bool = False) -> tuple[int, int, int]:
    """(runs a block or, for the cluster kernel, a cluster; elements a thread; threads a block) for ``n`` points
    of ``itemsize``-byte elements."""
    tile = max(1, TILE_BYTES // itemsize)
    if cluster:  # a run's points over cluster_blocks blocks
        m = n // cluster_blocks(n, itemsize)
        each = max(8, m // CLUSTER_THREADS)
        return tile, each, m // each
    each = max(8, tile * n // THREADS)
    return tile, each, tile * n // each


def _kernel(which: str, itemsize: int, n: int, inverse: bool, rows: bool = False) -> tuple[Any, int, int, int]:
    key = (which, itemsize, n, inverse, rows)
    if key not in _modules:
        from ...device_code import compile as compile_device

        cluster = which == "line_pull_cluster"
        tile, each, threads = shape(n, itemsize, cluster)
        tile = 1 if rows else tile  # rows in memory: a block's loads run along its own row
        element = {8: "float2", 16: "double2"}[itemsize]
        blocks = f"{cluster_blocks(n, itemsize)}, " if cluster else ""
        name = f"circuslink_fft_{which}<{element}, {n}, {tile}, {blocks}{each}, {1 if inverse else -1}>"
        kernel = compile_device(_SOURCE.read_text(), name_expressions=[name]).get_function(name)
        m = n // cluster_blocks(n, itemsize) if cluster else n
        smem = (m + m // 16 if cluster else tile * (n + 1)) * itemsize  # the cluster kernel's padding: PAD 4
        if smem > 48 << 10:
            kernel.max_dynamic_shared_size_bytes = smem
        _modules[key] = (kernel, tile, threads, smem)
    return _modules[key]


def _twiddles(cp: Any, n: int, dtype: Any, inverse: bool) -> Any:
    """exp(+-2 pi i m / n), m < n, computed in double precision."""
    return cp.asarray(np.exp((1.0 if inverse else -1.0) * 2j * np.pi * np.arange(n) / n).astype(dtype))


def make(dst: Any, n: int, table: Any, inverse: bool, cache: dict, cluster: bool = False) -> Any:
    """A callable that fills ``dst`` (contiguous, complex, ``dst.size // n`` runs of ``n`` points) with the
    transforms along its last axis of what ``table`` (device array of ``n`` element addresses, one a point)
    points at, on the current stream; unnormalised, as cuFFT. ``cache``: the plan's (the four-step's scratch).
    ``cluster``: the cluster kernel where it fits (``cluster_fits``), else the four-step above ``MAX_POINTS``.
    The callable's ``kernel`` says which ran: ``line``, ``cluster`` or ``four-step``."""
    import cupy as cp

    runs = dst.size // n
    which = kernel_for(n, dst.itemsize, cluster)
    if which == "line":
        kernel, tile, threads, smem = _kernel("line_pull", dst.itemsize, n, inverse)
        tw = _twiddles(cp, n, dst.dtype, inverse)
        grid = ((runs + tile - 1) // tile,)
        args = (np.uint64(table.data.ptr), np.uint64(tw.data.ptr), np.uint64(dst.data.ptr), np.int64(runs))

        def run() -> None:
            kernel(grid, (threads,), args, shared_mem=smem, stream=cp.cuda.get_current_stream())

        run.keep = (table, tw)  # the kernel reads them at every launch
        run.kernel = "line"
        return run
    if which == "cluster":
        launch, blocks_of = _cluster(dst, n, table, 1, inverse, rows=False)

        instead: list = []  # the four-step, where this GPU (or this rank's share of it) cannot run the clusters

        def run_cluster() -> None:
            if instead:
                instead[0]()
                return
            try:
                launch()
            except cp.cuda.driver.CUDADriverError as exc:  # e.g. too few SMs of one GPC for a cluster's blocks
                print(f"circuslink: fft pull: the cluster kernel ({n} points, {blocks_of}) did not launch ({exc}); "
                      "the four-step instead", file=sys.stderr, flush=True)
                instead.append(make(dst, n, table, inverse, cache, cluster=False))
                run_cluster.kernel = "four-step (the cluster kernel did not launch)"
                instead[0]()

        run_cluster.keep = launch.keep
        run_cluster.kernel = "cluster"
        return run_cluster
    m1, m2 = halves(n)
    one, tile1, threads1, smem1 = _kernel("pull_half1", dst.itemsize, m1, inverse)
    two, tile2, threads2, smem2 = _kernel("pull_half2", dst.itemsize, m2, inverse)
    tw1, tw2, twn = (_twiddles(cp, m, dst.dtype, inverse) for m in (m1, m2, n))
    key = ("pull scratch", dst.size, str(dst.dtype))
    if key not in cache:
        try:
            cache[key] = cp.empty(dst.size, dtype=dst.dtype)
        except cp.cuda.memory.OutOfMemoryError:  # the plan's check counts it (scratch_bytes); the GPU has less now
            raise BackendError(f"fft scheme 'pull': no GPU memory for the four-step's scratch array "
                               f"({dst.nbytes / 2**30:.2f} GiB); set CIRCUSLINK_FFT_PULL_KERNEL=callback or "
                               "use scheme='transpose-put'") from None
    mid = cache[key]
    grid1, grid2 = ((runs + tile1 - 1) // tile1, m2), (runs, (m1 + tile2 - 1) // tile2)
    args1 = (np.uint64(table.data.ptr), np.uint64(tw1.data.ptr), np.uint64(twn.data.ptr), np.uint64(mid.data.ptr),
             np.int64(runs), np.int32(m2))
    args2 = (np.uint64(mid.data.ptr), np.uint64(tw2.data.ptr), np.uint64(dst.data.ptr), np.int32(m1))

    def four_step() -> None:
        stream = cp.cuda.get_current_stream()
        one(grid1, (threads1,), args1, shared_mem=smem1, stream=stream)
        two(grid2, (threads2,), args2, shared_mem=smem2, stream=stream)

    four_step.keep = (table, tw1, tw2, twn, mid)
    four_step.kernel = "four-step"
    return four_step


def make_rows(dst: Any, src: Any, n: int, inverse: bool) -> Any:
    """A callable that fills ``dst`` with the transforms of ``src``'s rows of ``n`` points (both contiguous, of
    ``cluster_fits`` size), on the current stream, unnormalised: the cluster kernel on rows in memory (a block, or
    two, a row; loads along the row). A local stage's transform, as cuFFT's; for A/B runs
    (``scripts/dev/fft_line_pull_probe.py``), not yet used by the plans."""
    import cupy as cp

    if not cluster_fits(n, dst.itemsize):
        raise ValueError(f"make_rows: {n} points of {dst.itemsize} bytes do not fit the cluster kernel")
    table = cp.asarray(np.uint64(src.data.ptr) + np.arange(n, dtype=np.uint64) * np.uint64(src.itemsize))
    launch, _ = _cluster(dst, n, table, n, inverse, rows=True)
    launch.keep += (src,)
    return launch


def _cluster(dst: Any, n: int, table: Any, stride: int, inverse: bool, rows: bool) -> tuple[Any, str]:
    """The cluster kernel's launch over ``dst`` (``dst.size // n`` runs, ``cluster_fits``), reading run ``j``'s
    point ``b`` at ``table[b][j * stride]`` (``rows``: rows in memory, one block or two a row), and its clusters
    in words."""
    import cupy as cp

    blocks = cluster_blocks(n, dst.itemsize)
    kernel, tile, threads, smem = _kernel("line_pull_cluster", dst.itemsize, n, inverse, rows=rows)
    runs = dst.size // n
    twm = _twiddles(cp, n // blocks, dst.dtype, inverse)
    twn = _twiddles(cp, n, dst.dtype, inverse)  # the radix-2 step's (two blocks a run)
    grid = ((runs + tile - 1) // tile * tile * blocks,)  # whole clusters of tile x blocks
    args = (np.uint64(table.data.ptr), np.uint64(twm.data.ptr), np.uint64(twn.data.ptr), np.uint64(dst.data.ptr),
            np.int64(runs), np.int64(stride))

    def launch() -> None:
        kernel(grid, (threads,), args, shared_mem=smem, stream=cp.cuda.get_current_stream())

    launch.keep = (table, twm, twn)  # the kernel reads them at every launch
    return launch, f"{blocks * tile} blocks of {smem >> 10} KiB shared memory"
