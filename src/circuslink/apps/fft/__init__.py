"""A distributed 2-D FFT whose global transpose is done by transposing puts (UZURA's use case).

Slab decomposition: an n1 x n2 array is split by rows over R ranks (rank r holds rows
r*b1 .. (r+1)*b1, b1 = n1 / R). One transform is

1. the FFT of every row of my slab (length n2; cuFFT through CuPy on the GPU, numpy on the cpu);
2. the global transpose: I send each rank t my b1 x b2 block of its columns (b2 = n2 / R) with a
   *transposing put*, so it lands in t's memory already transposed (t now holds rows t*b2 .. of
   the transposed array); one RMA queue, committed once, started every transform;
3. the FFT of every row of that slab (length n1): the columns of the original;
4. ``layout="natural"`` (default): a second transposing put brings the result back to rows of the
   output (rank r holds output rows r*b1 ..); ``layout="transposed"`` stops before it (like
   cuFFTMp's shuffled output) and rank r holds rows r*b2 .. of the *transposed* output.

The inverse is the same with exp(+2 pi i ...) and numpy's normalisation (divided by n1*n2).
Because fft2(X.T) == fft2(X).T, a transposed-layout output fed back to a transposed-layout
inverse returns the natural layout: a forward/inverse pair with ``layout="transposed"`` saves both
second transposes.

``scheme="local-transpose"`` is the baseline that FFTW-MPI and heFFTe use: transpose my slab
locally into a send buffer (the same tile kernel), then put contiguous blocks (block-stride writes
of whole rows) to every rank. Same results, one more pass over memory per transpose.

    from circuslink.apps import fft
    plan = fft.Plan(world, (n, n), dtype="complex64")       # collective; made once
    plan.input[...] = my_rows                               # (n / R, n): rows plan.rows of the input
    out = plan.execute()                                    # (n / R, n) rows of fft2(input)
    plan.close()
    y = fft.fft2(world, my_rows)                            # the same, one shot
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._lifecycle import Resource
from ...errors import ConfigError

DTYPES = {"complex64": 8, "complex128": 16}
LAYOUTS = ("natural", "transposed")
SCHEMES = ("transpose-put", "local-transpose")
_MARGIN = 256 << 20  # bytes a rank keeps free beside its estimate (tile calibration scratch, CUDA context)


def check_dtype(dtype: Any, where: str) -> str:
    """The name of a complex dtype the FFT takes, or one line saying what to pass instead."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: unknown dtype {dtype!r}: pass complex64 or complex128") from None
    if dt.name in DTYPES:
        return dt.name
    if dt.kind == "c":
        raise ConfigError(f"{where} has dtype {dt.name}, which fft2 does not support: pass complex64 or complex128")
    raise ConfigError(f"{where} has dtype {dt.name}, not complex: pass a complex64 or complex128 array "
                      "(e.g. x.astype(numpy.complex64))")


def check_shape(shape: Any, nranks: int, where: str) -> tuple[int, int]:
    """(n1, n2) of a 2-D problem that ``nranks`` ranks split evenly, or one line saying why not."""
    dims = tuple(shape) if isinstance(shape, tuple | list) else (shape, shape)
    if len(dims) != 2:
        raise ConfigError(f"{where} is {len(dims)}-D (shape {tuple(dims)}): fft2 takes a 2-D array")
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1 for d in dims):
        raise ConfigError(f"{where} has shape {tuple(dims)}: both dimensions must be positive integers")
    n1, n2 = (int(d) for d in dims)
    for name, d in (("rows", n1), ("columns", n2)):
        if d % nranks:
            raise ConfigError(f"{where}: {n1} x {n2} cannot be split over {nranks} ranks: {d} {name} are not "
                              f"divisible by {nranks} (both dimensions must be)")
    return n1, n2


def bytes_per_rank(n1: int, n2: int, dtype: str, nranks: int, scheme: str, extra_slabs: int, staging: bool) -> int:
    """Memory one rank needs: the window (2 slabs; 3 for the local-transpose scheme), the back-end module's
    extra slabs (FFT work areas), a staging slab when files are read or written, and a margin."""
    slab = n1 * n2 * DTYPES[dtype] // nranks
    slabs = (3 if scheme == "local-transpose" else 2) + extra_slabs + (1 if staging else 0)
    return slabs * slab + _MARGIN


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_memory(world: Any, module: Any, n1: int, n2: int, dtype: str, scheme: str, staging: bool = False) -> None:
    """Collective: refuse, before allocating, a problem that the ranks sharing a device (or the host) cannot hold.

    Every rank reports its device and free bytes; each group of ranks on one device needs the sum
    of their estimates. Every rank raises the same one-line error.
    """
    need = bytes_per_rank(n1, n2, dtype, world.size, scheme, module.EXTRA_SLABS, staging)
    free, what = module.free_bytes(world)
    everyone = world.allgather_object((world.device, free, what))
    groups: dict[Any, list[int]] = {}
    for rank, (device, _, _) in enumerate(everyone):
        groups.setdefault(device, []).append(rank)
    for ranks in groups.values():
        have = min(everyone[r][1] for r in ranks)
        if need * len(ranks) > have:
            share = f" ({len(ranks)} ranks share it)" if len(ranks) > 1 else ""
            raise ConfigError(
                f"fft2: a {n1} x {n2} {dtype} problem over {world.size} ranks needs about {_gib(need)} per rank, "
                f"{_gib(need * len(ranks))} on {everyone[ranks[0]][2]}{share}, but only {_gib(have)} is free: "
                "use more ranks (or GPUs), complex64, or a smaller size")


class Plan(Resource):
    """A distributed 2-D FFT of one shape, dtype, direction, layout and scheme: made once, executed many times.

    Collective to make and to close. ``input`` is this rank's slab of the input (rows
    ``rows``); :meth:`execute` transforms it and returns this rank's slab of the output (rows
    ``out_rows`` of fft2(x), or of fft2(x).T with ``layout="transposed"``), a view valid until
    the next execute. ``timings`` holds the last profiled execute's phases in seconds.
    """

    _kind = "fft2 plan"

    def __init__(self, world: Any, shape: Any, dtype: Any = "complex64", inverse: bool = False,
                 layout: str = "natural", scheme: str = "transpose-put", staging: bool = False,
                 timeout: float | None = None) -> None:
        from ... import rma

        self.world = world
        self.dtype = check_dtype(dtype, "fft2: dtype")
        self.n1, self.n2 = check_shape(shape, world.size, "fft2: the array")
        if layout not in LAYOUTS:
            raise ConfigError(f"fft2: layout={layout!r} must be one of {', '.join(LAYOUTS)}")
        if scheme not in SCHEMES:
            raise ConfigError(f"fft2: scheme={scheme!r} must be one of {', '.join(SCHEMES)}")
        self.inverse, self.layout, self.scheme = bool(inverse), layout, scheme
        self._impl = world.backend_module("circuslink.apps.fft")
        check_memory(world, self._impl, self.n1, self.n2, self.dtype, scheme, staging)
        R, me, es = world.size, world.rank, DTYPES[self.dtype]
        n1, n2 = self.n1, self.n2
        b1, b2 = n1 // R, n2 // R
        self.b1, self.b2 = b1, b2
        slab = b1 * n2 * es
        stride = -(-slab // 256) * 256
        a_off, b_off, c_off = 0, stride, 2 * stride
        regions = 3 if scheme == "local-transpose" else 2
        self.window = rma.window_alloc(world, regions * stride, timeout=timeout)
        self._queues = []
        self._register(world)
        try:
            xp = world.xp
            local = self.window.local
            self.a = local[a_off: a_off + slab].view(xp.dtype(self.dtype)).reshape(b1, n2)
            self.b = local[b_off: b_off + slab].view(xp.dtype(self.dtype)).reshape(b2, n1)
            self._fft_a = self._impl.row_fft(world, self.a, self.inverse)
            self._fft_b = self._impl.row_fft(world, self.b, self.inverse)
            win = self.window
            self._steps: list[tuple[str, Callable[[], None]]] = []
            if scheme == "transpose-put":
                first = self._queue(lambda t: rma.declare_transpose_write(
                    win, b_off + me * b1 * es, n1, win, a_off + t * b2 * es, n2, b1, b2, self.dtype, t))
                second = self._queue(lambda s: rma.declare_transpose_write(
                    win, a_off + me * b2 * es, n2, win, b_off + s * b1 * es, n1, b2, b1, self.dtype, s))
                first_local = second_local = None
            else:
                c1 = local[c_off: c_off + slab].view(xp.dtype(self.dtype)).reshape(n2, b1)
                c2 = local[c_off: c_off + slab].view(xp.dtype(self.dtype)).reshape(n1, b2)
                first_local = rma.plan_local_transpose(world, c1, self.a)
                second_local = rma.plan_local_transpose(world, c2, self.b)
                first = self._queue(lambda t: rma.declare_strided_write(
                    win, b_off + me * b1 * es, win, c_off + t * b2 * b1 * es, b2, b1 * es, b1 * es, n1 * es, t))
                second = self._queue(lambda s: rma.declare_strided_write(
                    win, a_off + me * b2 * es, win, c_off + s * b1 * b2 * es, b1, b2 * es, b2 * es, n2 * es, s))
            self._steps.append(("fft", self._fft_a))
            if first_local is not None:
                self._steps.append(("transpose", first_local))
            self._steps.append(("comm", lambda q=first: (q.start(), q.wait())))
            self._steps.append(("fft", self._fft_b))
            if self.inverse:
                factor = 1.0 / (n1 * n2)
                self._steps.append(("fft", lambda: self._impl.scale(world, self.b, factor)))
            if layout == "natural":
                if second_local is not None:
                    self._steps.append(("transpose", second_local))
                self._steps.append(("comm", lambda q=second: (q.start(), q.wait())))
            else:
                second.free()
                self._queues.remove(second)
            self.timings: dict[str, float] = {}
        except BaseException:
            self.release_local()
            raise

    def _queue(self, declare: Callable[[int], Any]):
        """A committed queue of one write to every rank (``declare(t)``), with every rank as origin."""
        from ... import rma

        q = rma.Queue.alloc(self.window)
        self._queues.append(q)
        for t in range(self.world.size):
            q.push(declare(t))
            q.add_origin(t)
        q.commit()
        return q

    # -- what users see ---------------------------------------------------------------------------
    @property
    def input(self) -> Any:
        """This rank's input slab, (n1 / R) x n2: write rows ``rows`` of the input here."""
        self._check_open("input")
        return self.a

    @property
    def rows(self) -> slice:
        """The input rows this rank holds."""
        return slice(self.world.rank * self.b1, (self.world.rank + 1) * self.b1)

    @property
    def out_rows(self) -> slice:
        """The output rows this rank holds: of fft2(x) (natural) or of fft2(x).T (transposed)."""
        b = self.b1 if self.layout == "natural" else self.b2
        return slice(self.world.rank * b, (self.world.rank + 1) * b)

    @property
    def output(self) -> Any:
        """This rank's output slab after :meth:`execute`: (n1 / R) x n2 natural, (n2 / R) x n1 transposed."""
        self._check_open("output")
        return self.a if self.layout == "natural" else self.b

    @property
    def flops(self) -> float:
        """5 N log2 N for N = n1 * n2 points: the usual count for a complex FFT."""
        n = self.n1 * self.n2
        return 5.0 * n * np.log2(n)

    def execute(self, profile: bool = False) -> Any:
        """Transform ``input``; return ``output``. With ``profile`` each phase is synchronised and timed
        (``timings``: fft, transpose, comm, total, in seconds); without, only the end is."""
        self._check_open("execute")
        eng, world = self._impl, self.world
        eng.enter(world)
        if not profile:
            for _, step in self._steps:
                step()
            eng.synchronize(world)
            return self.output
        times = {"fft": 0.0, "transpose": 0.0, "comm": 0.0}
        t_start = time.perf_counter()
        for phase, step in self._steps:
            t0 = time.perf_counter()
            step()
            eng.synchronize(world)
            times[phase] += time.perf_counter() - t0
        times["total"] = time.perf_counter() - t_start
        self.timings = times
        return self.output

    def _close(self, timeout: float | None) -> None:
        for q in self._queues:
            q.free(timeout)
        self._queues = []
        self.window.free(timeout)

    def _release_local(self) -> None:
        # The window's buffers belong to the world, which releases them on its own error path.
        self._queues = []

    def __repr__(self) -> str:
        return (f"fft.Plan({self.n1} x {self.n2} {self.dtype}, {'inverse' if self.inverse else 'forward'}, "
                f"{self.layout}, {self.scheme}, rank {self.world.rank} of {self.world.size})")


def fft2(world: Any, local_slab: Any, inverse: bool = False, layout: str = "natural",
         scheme: str = "transpose-put") -> Any:
    """Collective: the 2-D FFT of the array whose rows are every rank's ``local_slab`` in rank order.

    ``local_slab`` is this rank's (n1 / R) x n2 block of rows (numpy or cupy, complex64 or
    complex128; the same shape on every rank). Returns this rank's output slab as a new array of
    ``world.xp``: rows rank*n1/R .. of fft2 (natural), or rows rank*n2/R .. of fft2(...).T
    (transposed). Makes a :class:`Plan` and frees it; loops should keep a Plan.
    """
    ndim = getattr(local_slab, "ndim", None)
    if ndim != 2:
        raise ConfigError(f"fft2: the local slab is {ndim}-D (shape {getattr(local_slab, 'shape', '?')}): "
                          "fft2 takes a 2-D block of rows")
    dtype = check_dtype(local_slab.dtype, "fft2: the local slab")
    shapes = world.allgather_object(tuple(int(d) for d in local_slab.shape))
    if len(set(shapes)) != 1:
        detail = ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
        raise ConfigError(f"fft2: every rank must pass a slab of the same shape ({detail})")
    rows, cols = shapes[0]
    with Plan(world, (rows * world.size, cols), dtype, inverse, layout, scheme) as plan:
        plan.input[...] = world.xp.asarray(local_slab)
        return plan.execute().copy()


def ifft2(world: Any, local_slab: Any, layout: str = "natural", scheme: str = "transpose-put") -> Any:
    """Collective: :func:`fft2` with ``inverse=True`` (numpy's ifft2: divided by n1 * n2)."""
    return fft2(world, local_slab, True, layout, scheme)


__all__ = ["DTYPES", "LAYOUTS", "SCHEMES", "Plan", "check_dtype", "check_shape", "fft2", "ifft2"]
