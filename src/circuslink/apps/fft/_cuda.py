"""The FFT's cuda module: cuFFT (through CuPy's plan objects) over the last axes of a box, and a runner with two
streams, so that a stage's transforms overlap with the puts of its chunks.

Streams. Transforms (and the final scaling) run on the plan's own *compute* stream; RMA queues start and
wait on the world's stream (the *comm* stream, where the cuda RMA module keeps its state). A chunk's put
waits, on the GPU, for the event its transform recorded; the next stage's transforms wait for the event
recorded after every queue of the exchange has been waited for (``Queue.wait(stream=, block=False)``).
The host blocks once, at the end, bounded by the plan's time-out, then asks every queue for an error its
device waits recorded (``Queue.check_device``).

Timing. Every execute records two events on the compute stream (its whole device time, ``Runner.total``);
a profiled execute also brackets every transform (compute stream), every local transpose and every
exchange (comm stream, from the moment its first put may start to the end of its last wait: ``comm``),
and every put's start launch on its own (``put``: what the tile model predicts). Phases can overlap: their
sum may exceed the total.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._wait import Deadline
from ...errors import BackendError, ConfigError
from . import _line_pull

# Beside the window a rank holds cuFFT's work areas (at most about one region for the plans of a stage).
EXTRA_REGIONS = 1

# cufft.h: CUFFT_R2C, CUFFT_C2R, CUFFT_C2C, CUFFT_D2Z, CUFFT_Z2D, CUFFT_Z2Z; directions
_TYPES = {("c2c", 8): 0x29, ("c2c", 16): 0x69, ("r2c", 4): 0x2A, ("r2c", 8): 0x6A, ("c2r", 8): 0x2C,
          ("c2r", 16): 0x6C}
_FORWARD, _INVERSE = -1, 1


def _cp():
    import cupy

    return cupy


def _plan(world: Any, fft_type: int, shape: tuple[int, ...], batch: int, cache: dict) -> Any:
    """A cuFFT plan (CuPy's PlanNd: default packed layout, ``batch`` transforms), kept in ``cache`` (the FFT
    plan's: its transforms of one shape and batch share one cuFFT plan and its work area; they all run on
    one stream, so never at the same time)."""
    from cupy.cuda import cufft

    key = (fft_type, shape, batch)
    if key not in cache:
        try:
            cache[key] = cufft.PlanNd(list(shape), None, 1, 0, None, 1, 0, fft_type, batch, "C", -1, None)
        except Exception as exc:  # cuFFT's errors and CuPy's OutOfMemoryError: one line naming the plan
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BackendError(f"rank {world.rank}: cuFFT could not plan {batch} transform(s) of shape {shape} "
                               f"(type {fft_type:#x}): {reason}") from None
    return cache[key]


def cufft_dims(kind: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    """The transform sizes cuFFT is asked for: ``dims`` without the axes of one point (a DFT of one point is the
    identity, and the packed layout is the same without them), but the last axis of a real transform, which
    changes the element type, always stays. Empty: nothing to do (a complex transform of single points)."""
    kept = tuple(n for n in dims[:-1] if n > 1)
    if kind != "c2c" or dims[-1] > 1:
        kept += (dims[-1],)
    return kept


def make_fft(world: Any, kind: str, src: Any, dst: Any, count: int, inverse: bool, cache: dict
             ) -> Callable[[], None] | None:
    """A callable that transforms ``src`` over its last ``count`` axes into ``dst`` on the current stream (the
    runner makes it the compute stream); None when there is nothing to transform. ``kind`` as in the cpu
    module; the inverse is unnormalised."""
    if src.size == 0 or dst.size == 0:
        return None
    for label, a in (("source", src), ("destination", dst)):
        if not a.flags.c_contiguous:
            raise BackendError(f"fft: the {label} of a {kind} transform must be contiguous (shape {a.shape})")
    real = dst if kind == "c2r" else src
    shape = cufft_dims(kind, tuple(int(n) for n in real.shape[-count:]))
    if not shape:  # complex transforms of single points: the identity
        if src.data.ptr == dst.data.ptr:
            return None

        def copy() -> None:
            dst[...] = src

        return copy
    batch = int(np.prod(real.shape[:-count], dtype=np.int64))
    fft_type = _TYPES[(kind, src.itemsize)]
    plan = _plan(world, fft_type, shape, batch, cache)
    direction = _INVERSE if inverse else _FORWARD

    def run() -> None:
        plan.fft(src, dst, direction)

    run.plan = plan
    return run


# The pull scheme's load callback: element (j, b) of the transform's input (runs j of the untransformed axes, b
# the transformed points, packed) is element j of the run at b in the rank that holds it: info = {n, &table[0]},
# table[b] the run's address there. A C++ function, found by its plain name: cuFFT 12 would not plan with an
# extern "C" one (CUFFT_INTERNAL_ERROR, one H100, 2026-12-07).
_PULL_CALLBACK = r"""
__device__ ELEMENT circuslink_fft_pull(void* dataIn, unsigned long long offset, void* callerInfo,
                                      void* sharedPtr) {
  const unsigned long long* info = (const unsigned long long*)callerInfo;
  const unsigned long long n = info[0];
  const ELEMENT* const* table = (const ELEMENT* const*)info[1];
  const unsigned long long j = offset / n;
  return table[offset - j * n][j];
}
"""


# A callback that loads ones: a plan made the way make_pull_fft makes its own must transform 8 of them into
# (8, 0, ..., 0), or cuFFT ran it without the callback (checked once per element type, before the first pull).
_CANARY_CALLBACK = r"""
__device__ ELEMENT circuslink_fft_canary(void* dataIn, unsigned long long offset, void* callerInfo,
                                        void* sharedPtr) {
  ELEMENT one;
  one.x = 1;
  one.y = 0;
  return one;
}
"""
_CALLBACKS_SEEN: set = set()


def _callback_plan(dims: tuple[int, ...], batch: int, itemsize: int, code: str, name: str, info: int) -> Any:
    """``batch`` packed transforms of shape ``dims`` whose loads are the device function ``name`` in ``code``."""
    from . import _cufft_callback as cb

    source = code.replace("ELEMENT", cb.ELEMENT[itemsize])
    return cb.CallbackPlan(dims, batch, itemsize, cb.lto_ir(source, name), name, info)


def _check_callbacks(world: Any, cp: Any, dtype: Any) -> None:
    if dtype in _CALLBACKS_SEEN:
        return
    out = cp.zeros(8, dtype=dtype)
    plan = _callback_plan((8,), 1, out.itemsize, _CANARY_CALLBACK, "circuslink_fft_canary", 0)
    stream = cp.cuda.get_current_stream()
    plan.execute(out.data.ptr, _FORWARD, stream.ptr)
    world.backend.wait_stream(stream, None, lambda: f"rank {world.rank}: the fft pull's check of cuFFT's load callback")
    plan.close()
    got = out.get()
    if abs(got[0] - 8) > 1e-3 or np.abs(got[1:]).max() > 1e-3:
        raise RuntimeError("cuFFT ran the canary plan without its load callback")
    _CALLBACKS_SEEN.add(dtype)


def pull_kernel() -> str:
    """Which transform a pulled stage of one power-of-two axis (up to ``_line_pull.MAX_POINTS ** 2``) runs, from
    ``CIRCUSLINK_FFT_PULL_KERNEL``: ``auto`` (the default: the pull's own kernels where they were measured faster,
    ``_line_pull.faster``; the four-step above ``_line_pull.MAX_POINTS``), ``own`` (wherever they fit, the
    cluster kernel where it fits), ``four-step`` (wherever they fit, never the cluster kernel) or ``callback``
    (cuFFT with a load callback, as every other pulled stage); the last three for A/B runs. The cluster kernel
    is not in ``auto`` until it has been timed on a GPU."""
    kind = os.environ.get("CIRCUSLINK_FFT_PULL_KERNEL", "auto")
    if kind not in ("auto", "own", "four-step", "callback"):
        raise ConfigError(f"CIRCUSLINK_FFT_PULL_KERNEL={kind!r}: expected 'auto', 'own', 'four-step' or 'callback'")
    return kind


def _pull_own(dims: tuple[int, ...], itemsize: int) -> tuple[bool, bool]:
    """(whether a pulled stage transforming ``dims`` (``cufft_dims``) runs the pull's own kernels, whether the
    cluster kernel may be among them), from ``pull_kernel``."""
    kind = pull_kernel()
    own = len(dims) == 1 and _line_pull.fits(dims[0], 1) and \
        (kind in ("own", "four-step") or (kind == "auto" and _line_pull.faster(dims[0], itemsize)))
    return own, kind == "own"


def pull_scratch_bytes(shape: tuple[int, ...], count: int, itemsize: int) -> int:
    """The GPU memory a pulled stage's transform allocates beside its array of ``shape`` (transformed over the
    last ``count`` axes): the four-step's scratch, where it runs (``Plan`` counts it before allocating)."""
    dims = cufft_dims("c2c", tuple(int(x) for x in shape[len(shape) - count:]))
    own, cluster = _pull_own(dims, itemsize)
    return _line_pull.scratch_bytes(dims[0], itemsize, math.prod(shape), cluster) if own else 0


def make_pull_fft(world: Any, window: Any, dst: Any, count: int, ranks: np.ndarray, offsets: np.ndarray,
                  inverse: bool, cache: dict) -> Callable[[], None] | None:
    """The pull scheme's transform over ``dst``'s last ``count`` axes, whose input ``dst.reshape(-1, n)[j, b]``
    is read from the window of ``ranks[b]`` at element ``offsets[b] + j``, so that the reshape costs no pass of
    its own; in place. One axis of a power of two: our own kernel (_line_pull); otherwise one cuFFT plan with a
    load callback JIT-linked into its kernels (_cufft_callback). The callable's ``kernel`` names which (for
    ``Plan.describe``)."""
    if dst.size == 0:
        return None
    cp = _cp()
    e = dst.itemsize
    bases = {int(r): int(window.peer(int(r)).data.ptr) for r in np.unique(ranks)}
    table = cp.asarray(np.array([bases[int(r)] for r in ranks], dtype=np.uint64) + offsets.astype(np.uint64) * e)
    n = int(offsets.size)
    dims = cufft_dims("c2c", tuple(int(x) for x in dst.shape[dst.ndim - count:]))
    if not dims:  # transforms of single points: the gather alone
        flat = dst.reshape(-1, n)
        sources = [(cp.asarray(np.flatnonzero(ranks == r)), int(r)) for r in np.unique(ranks)]
        runs = cp.arange(flat.shape[0])[:, None]
        starts = cp.asarray(offsets)

        def gather() -> None:
            for points, r in sources:
                flat[:, points] = window.peer(r).view(dst.dtype)[starts[points][None, :] + runs]

        gather.kernel = "gather"
        return gather
    own, cluster = _pull_own(dims, e)
    if own:
        return _line_pull.make(dst.reshape(-1), n, table, inverse, cache, cluster=cluster)
    batch = dst.size // n
    info = cp.asarray(np.array([n, table.data.ptr], dtype=np.uint64))
    try:
        _check_callbacks(world, cp, dst.dtype)
        plan = _callback_plan(dims, batch, e, _PULL_CALLBACK, "circuslink_fft_pull", info.data.ptr)
    except Exception as exc:  # no JIT callbacks in this cuFFT, NVRTC or cuFFT refusing: one line naming the plan
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BackendError(f"rank {world.rank}: fft scheme 'pull': cuFFT could not plan {batch} transform(s) of "
                           f"shape {dims} with a load callback ({type(exc).__name__}: {reason}); "
                           "use scheme='transpose-put'") from None
    direction = _INVERSE if inverse else _FORWARD
    flat = dst.reshape(-1)

    def run() -> None:
        plan.execute(flat.data.ptr, direction, cp.cuda.get_current_stream().ptr)

    run.plan, run.keep = plan, (table, info)  # the callback reads them for the plan's life
    run.kernel = "callback"
    return run


def scale(world: Any, a: Any, factor: float) -> None:
    a *= a.dtype.type(factor)


def strided(flat: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    from cupy.lib.stride_tricks import as_strided

    e = flat.itemsize
    return as_strided(flat[offset:], shape, tuple(s * e for s in strides))


class Runner:
    """A plan's two streams, their hand-off events and (profiled) phase events."""

    def __init__(self, world: Any) -> None:
        cp = _cp()
        self.world = world
        self.cp = cp
        self.compute = cp.cuda.Stream(non_blocking=True)
        self.comm = world.backend.stream
        self._handoff = cp.cuda.Event(disable_timing=True)
        self._begin, self._end = cp.cuda.Event(), cp.cuda.Event()
        self._pool: list = []
        self.times: dict[str, float] = {}
        self.timeline: list[tuple[str, float, float]] = []
        self.total = 0.0

    def _event(self) -> Any:
        if self._used == len(self._pool):
            self._pool.append(self.cp.cuda.Event())
        ev = self._pool[self._used]
        self._used += 1
        return ev

    def begin(self, profile: bool) -> None:
        self.profile = profile
        self._used = 0
        self._marks: list[tuple[str, Any, Any]] = []
        self._comm_start = None
        self._met: list = []
        caller = self.cp.cuda.get_current_stream()
        if caller.ptr != self.compute.ptr:  # the caller's writes of the input land first
            self._handoff.record(caller)
            self.compute.wait_event(self._handoff)
        self._begin.record(self.compute)

    def _timed(self, phase: str, stream: Any, op: Callable[[], None]) -> None:
        if not self.profile:
            with stream:
                op()
            return
        a, b = self._event(), self._event()
        a.record(stream)
        with stream:
            op()
        b.record(stream)
        self._marks.append((phase, a, b))

    def fft(self, op: Callable[[], None]) -> None:
        self._timed("fft", self.compute, op)

    def pack(self, op: Callable[[], None]) -> None:
        # rma.plan_local_transpose launches on the world's (comm) stream after the caller's: with the compute
        # stream current, that is after this chunk's transform.
        if self.profile:
            a, b = self._event(), self._event()
            self._to_comm()
            a.record(self.comm)
            with self.compute:
                op()
            b.record(self.comm)
            self._marks.append(("transpose", a, b))
        else:
            with self.compute:
                op()

    def local(self, op: Callable[[], None]) -> None:
        """A local transpose launched on the current stream (the baselines' packing), on the compute stream."""
        self._timed("transpose", self.compute, op)

    def _to_comm(self) -> None:
        self._handoff.record(self.compute)
        self.comm.wait_event(self._handoff)

    def put(self, queue: Any) -> None:
        self._to_comm()
        if not self.profile:
            queue.start(stream=self.comm)
            return
        a, b = self._event(), self._event()
        a.record(self.comm)
        if self._comm_start is None:
            self._comm_start = a
        queue.start(stream=self.comm)
        b.record(self.comm)
        self._marks.append(("put", a, b))  # the puts alone (their start launch), for the tile model

    def fence(self, queue: Any) -> None:
        """A cycle of ``queue`` on the comm stream that later puts wait for (a barrier), not the transforms."""
        self._to_comm()
        queue.start(stream=self.comm)
        queue.wait(stream=self.comm, block=False)

    def wait(self, queues: list) -> None:
        for q in queues:
            q.wait(stream=self.comm, block=False)
        if self.profile:
            end = self._event()
            end.record(self.comm)
            self._marks.append(("comm", self._comm_start, end))
            self._comm_start = None
        self._handoff.record(self.comm)
        self.compute.wait_event(self._handoff)

    def meet(self) -> None:
        """Every rank's GPU meets on the compute stream (``rma.meet``; the pull scheme: between a stage and the
        transforms that read it from the peers); its device-side errors are raised at ``end``."""
        from ... import rma

        def cycle() -> None:
            queue = rma.meet(self.world)
            if queue is not None and queue not in self._met:
                self._met.append(queue)

        self._timed("comm", self.compute, cycle)

    def scale(self, a: Any, factor: float) -> None:
        self._timed("fft", self.compute, lambda: scale(self.world, a, factor))

    def end(self, deadline: Any, queues: list) -> None:
        self._end.record(self.compute)
        self.world.backend.wait_stream(self.compute, deadline,
                                       lambda: f"rank {self.world.rank}: an FFT plan's transforms did not finish")
        for q in [*queues, *self._met]:  # bounded waits for the comm stream; errors its device waits recorded
            q.check_device()
        get = self.cp.cuda.get_elapsed_time
        self.total = get(self._begin, self._end) * 1e-3
        if self.profile:
            times = {"fft": 0.0, "transpose": 0.0, "comm": 0.0, "put": 0.0}
            for phase, a, b in self._marks:
                times[phase] += get(a, b) * 1e-3
            times["total"] = self.total
            self.times = times
            # each phase's (name, start, end) in seconds from the execute's start: where a rank waited (dev runs)
            self.timeline = [(phase, get(self._begin, a) * 1e-3, get(self._begin, b) * 1e-3)
                             for phase, a, b in self._marks]


def free_bytes(world: Any) -> tuple[int, str]:
    cp = _cp()
    free, _total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(free + pool.free_bytes()), f"memory on GPU {world.device}"


def tile_model(world: Any, dtype: str) -> Any:
    """The transposing put's tile model for ``dtype`` on this rank, calibrated once per world (rma's)."""
    from ...rma._transpose import DTYPES
    from ...rma._transpose._cuda import calibrated_model

    return calibrated_model(world, DTYPES[dtype])


def same_memory(world: Any) -> bool:
    """Collective: whether every rank's memory is one GPU's (puts and transforms then share its bandwidth). By the
    GPU's identity (host and PCI bus), not its ordinal: ranks on two hosts may both use their GPU 0."""
    return len(set(world.allgather_object(world.backend.device_identity))) == 1


_SHARED_PUT = "circuslink.fft.shared_put"  # World.registry key: {element bytes: shared_put_bandwidth's figure}


_SYNC = "circuslink.fft.reshape_sync"  # World.registry key: reshape_sync_seconds's figure


def _slowest_median(world: Any, queue: Any, op: Callable[[Any], None], samples: int, warmup: int, what: str
                    ) -> float:
    """Collective: the median over ``samples`` (after ``warmup`` more) of the slowest rank's seconds for ``op``
    on the world's stream, each sample's clock started behind a meeting of every rank (so no rank runs alone);
    ``queue`` the world's meeting queue, asked for an error its device waits recorded; ``what`` names the wait."""
    from ... import rma

    cp = _cp()
    stream = world.backend.stream
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for sample in range(samples + warmup):
        world.barrier()
        with stream:
            rma.meet(world)
            start.record(stream)
            op(stream)
            end.record(stream)
        world.backend.wait_stream(stream, Deadline.behind_device(),  # the meeting's own wait names a late rank
                                  lambda: f"rank {world.rank}: {what}")
        queue.check_device()
        slowest = max(world.allgather_object(cp.cuda.get_elapsed_time(start, end) * 1e-3))
        if sample >= warmup:
            times.append(slowest)
    return statistics.median(times)


def reshape_sync_seconds(world: Any, samples: int = 9) -> float | None:
    """Collective: seconds one cycle of a reshape's queue spends on its ranks' hand-off beyond moving bytes: a
    cycle of the world's meeting queue (a queue with signals only: every rank signals every other and waits for
    them, as every chunk's queue does), launched behind a meeting so that every rank is there, the slowest
    rank's median. The tile model's t0 is one rank's launch alone and cannot see it; the puts alone ran 0.07 ms
    (2 ranks) and 0.11 ms (4 ranks) above a line through the origin at 8192^2 and 16384^2 (2026-12-07).
    Measured once per world; None on one rank or across nodes (no meeting queue)."""
    from ... import rma

    def measure() -> float | None:
        queue = rma.meeting_queue(world)
        if queue is None:
            return None
        return _slowest_median(world, queue, lambda stream: rma.meet(world), samples, 2,
                               "the ranks' meeting (fft model)")

    return world.registry(_SYNC, measure)


def shared_put_bandwidth(world: Any, dtype: str, nbytes: int = 32 << 20, loops: int = 4) -> float | None:
    """Collective: bytes/s that all ranks of the world, sharing one GPU, move together with the transposing put
    (every rank transposes a ``nbytes`` block of ``dtype`` in its own memory at once, with the tile the model
    ranks first for it, each sample started after the world's meeting queue so that no rank runs alone): the
    bandwidth a reshape's puts of every rank share. The tile model is fitted on each rank alone and cannot see
    it; a plain copy's shared figure (1,547 GB/s on 4 ranks of one H100) left the prediction 18-20 % under the
    puts alone (BENCHMARKS.md), which move their bytes through the transpose's tiles, not a copy engine.
    Measured once per world and element size; None on one rank or across nodes (no meeting queue)."""
    from ... import rma
    from ...rma import _tile_model as tm
    from ...rma._transpose import DTYPES
    from ...rma._transpose._cuda import DeviceChain, Piece, calibrated_model, square_shape, tile_candidates

    if world.size < 2:
        return None
    elem = DTYPES[dtype]

    def measure() -> float | None:
        queue = rma.meeting_queue(world)
        if queue is None:
            return None
        cp = _cp()
        rows, cols = square_shape(nbytes, elem)
        tile = tm.rank_tiles(calibrated_model(world, elem), tile_candidates(elem), elem, rows, cols)[0][0]
        tile = world.broadcast_object(tile)  # every rank the same work (their models differ in the last digits)
        src, dst = cp.cuda.alloc(rows * cols * elem), cp.cuda.alloc(rows * cols * elem)
        chain = DeviceChain(world, [Piece(src.ptr, dst.ptr, rows, cols, cols, rows, elem, tile)])

        def puts(stream: Any) -> None:
            for _ in range(loops):
                chain.launch(stream)

        seconds = _slowest_median(world, queue, puts, 5, 1, "the ranks' shared transposing put (fft model)")
        # the median, the statistic the benchmark reports of the puts (the best of three read 1,355-1,513 GB/s
        # where the puts alone moved 1,330-1,350 GB/s, 2026-12-07)
        return world.size * rows * cols * elem * loops / seconds

    figures = world.registry(_SHARED_PUT, dict)
    if elem not in figures:
        figures[elem] = measure()
    return figures[elem]


def time_op(world: Any, op: Callable[[], None]) -> float:
    """Seconds ``op`` takes on the GPU (events around it on a fresh stream, after one untimed run)."""
    cp = _cp()
    stream = cp.cuda.Stream(non_blocking=True)
    a, b = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        op()
        a.record(stream)
        op()
        b.record(stream)
    world.backend.wait_stream(stream, None, lambda: f"rank {world.rank}: timing an FFT stage")
    return cp.cuda.get_elapsed_time(a, b) * 1e-3


def fftn_reference(x: Any, inverse: bool) -> Any:
    """The one-rank ceiling: cuFFT's transform of the whole array through cupy.fft (its plan cache keeps it)."""
    cp = _cp()
    return cp.fft.ifftn(x) if inverse else cp.fft.fftn(x)


def to_host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def random_array(world: Any, shape: tuple[int, ...], dtype: str, seed: Any) -> Any:
    cp = _cp()
    g = cp.random.default_rng(np.random.SeedSequence(seed).generate_state(1)[0])
    dt = np.dtype(dtype)
    real = cp.float32 if dt in (np.float32, np.complex64) else cp.float64
    if dt.kind == "f":
        return g.standard_normal(shape, dtype=real)
    return (g.standard_normal(shape, dtype=real) + 1j * g.standard_normal(shape, dtype=real)).astype(dt)


def sync(world: Any, what: str) -> None:
    """Wait, bounded by the time-out (CIRCUSLINK_TIMEOUT), for the caller's current stream: its copies into or
    out of a plan's arrays have landed. ``what`` names the wait in the time-out's error."""
    stream = _cp().cuda.get_current_stream()
    world.backend.wait_stream(stream, None, lambda: f"rank {world.rank}: {what} did not finish")


def release_memory(world: Any) -> None:
    """Hand the memory pool's free blocks back to the GPU (between benchmark cases)."""
    sync(world, "the work before freeing the memory pool")
    _cp().get_default_memory_pool().free_all_blocks()
