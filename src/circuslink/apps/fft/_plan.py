"""The distributed FFT plan: boxes in, boxes out, stages, reshapes by transposing puts, a pipeline of chunks.

A plan is made once (collective: it checks every rank's boxes, checks memory, allocates one RMA window and
commits every reshape's queues) and executed many times. The window holds two *regions* (three for the
local-transpose scheme: a staging region); the arrays of the plan (input, the stages, output) take
alternate regions, so a reshape never writes where it reads. Forward:

    input --reshape--> stage 1 (spatial) --r2c--> stage 1 --reshape--> stage 2 ... --reshape--> output

(reshapes only where the boxes differ; c2c transforms in place). Backward runs the same arrays in reverse.
A reshape that follows a transform is cut into chunks along the slowest storage axis of its source: chunk
j's transform, then chunk j's puts, so that the puts of one chunk overlap the transform of the next (the
cuda module's two streams). How many chunks: the tile model's prediction of the puts beside the measured
transform time; where it cannot tell the candidates apart (ranks sharing one GPU share its bandwidth), the
candidates are measured, as the tile model measures close tiles.

The *pull* scheme has no reshape of its own: after a stage every rank meets the others on the device
(``rma.meet``), and the next stage's transform reads its input straight from the rank that holds each piece
(cuFFT's load callback on the GPU, a gather on the cpu), then meets them again so that no rank overwrites what
a peer still reads. On one GPU the transforms are memory-bound and the put is one more pass over the data
(16384^2 complex128 on 4 ranks, one H100: two stages of 4 x 1.3 ms of cuFFT and 3.3 ms of puts, the ranks'
transforms taking turns at the memory: BENCHMARKS.md); the pull leaves that pass out. It applies to complex
slabs (2-D and 3-D) whose input and output are the first and last stages' own layouts, where every rank maps
every other's memory (one node). On the GPU the callback is JIT-linked into cuFFT's kernels (_cufft_callback).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._lifecycle import Resource
from ..._wait import Deadline
from ...errors import BackendError, ConfigError
from . import _boxes as bx

DTYPES = {"complex64": 8, "complex128": 16, "float32": 4, "float64": 8}
COMPLEX = {"float32": "complex64", "float64": "complex128", "complex64": "complex64", "complex128": "complex128"}
SCALES = ("none", "full", "symmetric")
SCHEMES = ("transpose-put", "local-transpose", "pull")
DECOMPOSITIONS = ("auto", "slab", "pencil")
_MARGIN = 256 << 20  # bytes a rank keeps free beside its estimate (tile calibration scratch, CUDA context)
_ALIGN = 256
_CHUNK_CANDIDATES = (1, 2, 4)
_CHUNK_RUNS = 5  # timed forwards per measured candidate (a 16384^2 complex128 forward on 4 ranks: ~13 ms)
_CHUNK_OVERHEAD_S = 10e-6  # one more chunk's launches and events, beside its put's start cost (the model's t0)
_UNSURE = 0.10  # candidates predicted within this of the best are measured
# The FFT's commands (fft2, fft3, bench fft) run ranks that share a GPU in SMs of their own (CIRCUSLINK_SM_PARTITION,
# where the user sets none): under MPS's cap every rank ran on the same SMs, a quarter of the GPU at 4 ranks. On
# one H100 (2026-12-07, BENCHMARKS.md) 16384^2 on 4 ranks took 4.96 ms (complex64) and 13.96 (complex128) against
# 6.27 and 16.12 capped in the same call, and 1024^3 complex64 23.65 / 25.22 ms on 2 / 4 ranks against 24.74 / 26.83.
SM_PARTITION = "auto"


def check_dtype(dtype: Any, where: str) -> str:
    """The name of a dtype a plan takes (complex: c2c; float: r2c / c2r), or one line saying what to pass."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: unknown dtype {dtype!r}: pass complex64, complex128, float32 or float64"
                          ) from None
    if dt.name in DTYPES:
        return dt.name
    if dt.kind in "cf":
        raise ConfigError(f"{where} has dtype {dt.name}, which the FFT does not support: pass complex64 or "
                          "complex128 (float32 or float64 for a real-to-complex transform)")
    raise ConfigError(f"{where} has dtype {dt.name}, not complex or real floating point: pass complex64, "
                      "complex128, float32 or float64 (e.g. x.astype(numpy.complex64))")


def _same_layout(a: Sequence[bx.Box], b: Sequence[bx.Box]) -> bool:
    return all((x.empty and y.empty) or x.same(y) for x, y in zip(a, b, strict=True))


@dataclass(eq=False)
class _Array:
    """One array of the plan: every rank's box, its element type and its region of the window."""

    name: str
    boxes: tuple[bx.Box, ...]
    dtype: str
    region: int = 0
    view: Any = None  # this rank's array (storage shape), set once the window exists


@dataclass(eq=False)
class _Step:
    """Transforms (one per chunk; None where a chunk is empty) and, for a reshape, one queue per chunk."""

    ops: list
    queues: list = field(default_factory=list)
    packs: list = field(default_factory=list)  # local-transpose scheme: each chunk's local transposes
    pieces: list = field(default_factory=list)  # each chunk's (piece, target rank): the model's input
    src: _Array | None = None
    meet_after: bool = False  # pull scheme: every rank meets on the device after the transforms


class Plan(Resource):
    """A distributed 2-D or 3-D FFT between this rank's ``inbox`` and ``outbox`` (heFFTe's fft3d shape).

    Collective to make and to close. ``dtype`` is the spatial data's: complex64 / complex128 for a
    complex-to-complex transform, float32 / float64 for real-to-complex (forward) and complex-to-real
    (backward); the frequency side is then ``shape[:-1] + (shape[-1] // 2 + 1,)`` (numpy's rfftn). Every
    rank's input boxes must tile the spatial array and its output boxes the frequency array; boxes may be
    uneven, in any storage order, and empty. ``decomposition``: "slab" (one reshape between two stages),
    "pencil" (3-D: three stages over a P0 x P1 ``grid``, two reshapes within rows and columns of the grid)
    or "auto" (pencil when the input boxes already are pencils of a 2-D grid, else slab). ``scheme``:
    "transpose-put" (reshapes by transposing puts), "local-transpose" (the FFTW-MPI way: a local
    transpose into a staging region, then block puts) or "pull" (no reshape: each stage's transform reads its
    input where the stage before left it; complex slabs in the stages' own layouts on one node, see the module
    docstring; anything else is one line saying why). ``chunks``: pieces each reshape after a transform is
    cut into (None: chosen by the tile model, see the module docstring). ``reserve_bytes``: memory per rank
    the caller will allocate beside the plan (counted in the memory check).

    ``input`` / ``output`` are this rank's arrays (storage shape: the box's extents in its ``order``),
    views into the plan's window: :meth:`forward` reads ``input`` and returns ``output``, :meth:`backward`
    the other way round; each overwrites what it does not return, and a result is valid until the next
    execute.
    """

    _kind = "fft plan"

    def __init__(self, world: Any, inbox: bx.Box, outbox: bx.Box, dtype: Any = "complex64", *,
                 decomposition: str = "auto", grid: Sequence[int] | None = None, scheme: str = "transpose-put",
                 chunks: int | None = None, reserve_bytes: int = 0, timeout: float | None = None) -> None:
        from ... import rma

        self.world = world
        self.dtype = check_dtype(dtype, "fft: dtype")
        self.real = self.dtype.startswith("float")
        self.cdtype = COMPLEX[self.dtype]
        if scheme not in SCHEMES:
            raise ConfigError(f"fft: scheme={scheme!r} must be one of {', '.join(SCHEMES)}")
        if decomposition not in DECOMPOSITIONS:
            raise ConfigError(f"fft: decomposition={decomposition!r} must be one of {', '.join(DECOMPOSITIONS)}")
        if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int | np.integer)
                                   or chunks < 1):
            raise ConfigError(f"fft: chunks={chunks!r} must be a positive integer (or None: the model's choice)")
        for name, b in (("inbox", inbox), ("outbox", outbox)):
            if not isinstance(b, bx.Box):
                raise ConfigError(f"fft: {name} must be an fft.Box, got {type(b).__name__}")
        self.scheme = scheme
        self._timeout = timeout
        R, me = world.size, world.rank
        everyone = world.allgather_object((inbox, outbox))
        inboxes = tuple(b for b, _ in everyone)
        outboxes = tuple(b for _, b in everyone)
        dims = {b.ndim for b in inboxes + outboxes}
        if len(dims) != 1:
            detail = ", ".join(f"rank {r}: {i.ndim}-D in, {o.ndim}-D out" for r, (i, o) in enumerate(everyone))
            raise ConfigError(f"fft: every box must have the same number of axes ({detail})")
        d = dims.pop()
        if d not in (2, 3):
            raise ConfigError(f"fft: the boxes are {d}-D: the distributed FFT takes 2-D or 3-D arrays")
        self.shape = tuple(max(b.high[a] for b in inboxes) for a in range(d))
        self.cshape = tuple(max(b.high[a] for b in outboxes) for a in range(d))
        bx.check_layout(inboxes, self.shape, "fft: the input boxes")
        want = self.shape[:-1] + (self.shape[-1] // 2 + 1,) if self.real else self.shape
        if self.cshape != want:
            what = "a real-to-complex transform of" if self.real else "the transform of"
            raise ConfigError(f"fft: the output boxes cover shape {self.cshape}, but {what} shape {self.shape} "
                              f"has shape {want}")
        bx.check_layout(outboxes, self.cshape, "fft: the output boxes")
        self.inboxes, self.outboxes = inboxes, outboxes
        self.decomposition, self.grid = self._decomposition(decomposition, grid, d, inboxes)
        self.stages = bx.stages(self.cshape, R, self.decomposition, self.grid, inboxes, outboxes,
                                self.shape[-1] if self.real else None)
        self._impl = world.backend_module("circuslink.apps.fft")
        self._arrays = self._lay_out()
        e_max = max(DTYPES[a.dtype] * b.size for a in self._arrays for b in a.boxes)
        self._region = max(_ALIGN, -(-e_max // _ALIGN) * _ALIGN)
        regions = 3 if scheme == "local-transpose" else 2
        scratch = self._pull_scratch_bytes() if scheme == "pull" else 0
        check_memory(world, self._impl, regions * self._region + self._impl.EXTRA_REGIONS * self._region
                     + scratch + int(reserve_bytes), self._describe_problem())
        self.window = rma.window_alloc(world, regions * self._region, timeout=timeout)
        self._queues_all: list = []
        self._register(world)
        try:
            local = self.window.local
            for a in self._arrays:
                box = a.boxes[me]
                off = a.region * self._region
                a.view = local[off: off + box.size * DTYPES[a.dtype]].view(world.xp.dtype(a.dtype)).reshape(
                    box.storage_shape)
            self._runner = self._impl.Runner(world)
            self.prediction: dict = {}
            self._cache: dict = {}  # cuFFT plans of this plan's transforms (back-end-specific)
            self._prebuilt: list | None = None
            self._pulls = self._pull_maps() if scheme == "pull" else None
            self.chunks = 1 if self._pulls else self._choose_chunks(chunks)
            forward = self._prebuilt or self._forward(self.chunks)
            self._prebuilt = None
            self._programs = {"forward": forward, "backward": self._backward(self.chunks)}
            # cuFFT plans (and their work areas) only the chunk candidates or the model's timing used go
            used = {id(getattr(op, "plan", None)) for p in self._programs.values() for st in p for op in st.ops}
            self._cache = {k: v for k, v in self._cache.items() if id(v) in used}
            self._predict_committed()
            self.timings: dict[str, float] = {}
            self.seconds = 0.0
        except BaseException:
            self.release_local()
            raise

    # -- construction ------------------------------------------------------------------------------
    def _decomposition(self, kind: str, grid: Any, d: int, inboxes: Sequence[bx.Box]) -> tuple[str, Any]:
        R = self.world.size
        if grid is not None:
            g = tuple(grid) if isinstance(grid, tuple | list) else None
            if (g is None or len(g) != 2 or any(isinstance(x, bool) or not isinstance(x, int | np.integer) or x < 1
                                                for x in g) or g[0] * g[1] != R):
                raise ConfigError(f"fft: grid={grid!r} must be two positive integers P0, P1 with P0 * P1 = {R} ranks")
            grid = (int(g[0]), int(g[1]))
        if kind == "pencil" and d != 3:
            raise ConfigError(f"fft: a pencil decomposition needs a 3-D array; this one is {d}-D (use slab)")
        if kind == "auto":
            found = bx._pencil_grid(inboxes, self.shape) if d == 3 else None
            kind = "pencil" if found is not None and len(found[0]) > 1 and len(found[1]) > 1 else "slab"
        if kind == "slab":
            return "slab", None
        found = bx._pencil_grid(inboxes, self.shape)
        if found is not None:
            return "pencil", (len(found[0]), len(found[1]))
        return "pencil", grid or bx.grid_2d(R)

    def _lay_out(self) -> list[_Array]:
        """The plan's arrays in forward order, in alternate regions."""
        st = self.stages
        arrays = [_Array("input", self.inboxes, self.dtype)]
        first = bx.real_boxes(st[0].boxes, self.shape[-1]) if self.real else st[0].boxes
        if not _same_layout(self.inboxes, first):
            arrays.append(_Array("stage 1 (spatial)", first, self.dtype))
        self._spatial = arrays[-1]
        if self.real:
            arrays.append(_Array("stage 1", st[0].boxes, self.cdtype))
        self._stage_arrays = [arrays[-1]]
        for k, s in enumerate(st[1:], 2):
            arrays.append(_Array(f"stage {k}", s.boxes, self.cdtype))
            self._stage_arrays.append(arrays[-1])
        if not _same_layout(self.outboxes, st[-1].boxes):
            arrays.append(_Array("output", self.outboxes, self.cdtype))
        for i, a in enumerate(arrays):
            a.region = i % 2
        return arrays

    def _describe_problem(self) -> str:
        kind = "real-to-complex " if self.real else ""
        shape = " x ".join(map(str, self.shape))
        return f"a {kind}{shape} {self.dtype} FFT over {self.world.size} ranks"

    def _fft_ops(self, op: tuple, parts: int, cache: dict) -> list:
        """One transform per chunk of ``dst``'s slowest storage axis (``src`` is cut the same way)."""
        kind, src, dst, count, inverse = op
        eng, world = self._impl, self.world
        if parts == 1:
            return [eng.make_fft(world, kind, src.view, dst.view, count, inverse, cache)]
        ops = []
        for lo, hi in bx.spans(dst.view.shape[0], parts):
            ops.append(eng.make_fft(world, kind, src.view[lo:hi], dst.view[lo:hi], count, inverse, cache))
        return ops

    def _transform(self, k: int, inverse: bool) -> tuple[str, _Array, _Array, int, bool]:
        """(kind, source, destination, transformed storage axes, inverse) of stage k's transform."""
        stage = self._stage_arrays[k]
        count = self.stages[k].count
        if k == 0 and self.real:
            return ("c2r", stage, self._spatial, count, True) if inverse else ("r2c", self._spatial, stage, count,
                                                                              False)
        return "c2c", stage, stage, count, inverse

    def _pull_scratch_bytes(self) -> int:
        """What the pulled stages' transforms allocate beside the window on this rank (the four-step's scratch
        arrays: one per distinct stage size and type, as ``_line_pull`` keeps them in the plan's cache)."""
        stages = self._stage_arrays
        if len(stages) == 1:
            return 0
        me = self.world.rank
        sizes: dict[tuple[int, int], int] = {}
        for k in range(len(stages)):  # forward pulls stages 1..K-1, backward 0..K-2: together every stage
            box = stages[k].boxes[me]
            if not box.empty:
                e = DTYPES[stages[k].dtype]
                need = self._impl.pull_scratch_bytes(tuple(box.storage_shape), self.stages[k].count, e)
                sizes[(box.size, e)] = max(sizes.get((box.size, e), 0), need)
        return sum(sizes.values())

    def _pull_maps(self) -> dict[str, list[tuple[np.ndarray, np.ndarray]]] | None:
        """The pull scheme's sources, per direction and per stage after the first it runs: for this rank's array
        of that stage, per point b of its transformed axes (flattened as stored), the rank whose piece of the
        stage before holds the run of the other axes at b, and that run's element offset in the rank's window:
        ``dst.reshape(-1, n)[j, b] = window of that rank [offset + j]``. None where there is nothing to pull."""
        def refuse(why: str) -> ConfigError:
            return ConfigError(f"fft: scheme='pull' {why}; use scheme='transpose-put'")

        stages = self._stage_arrays
        if len(stages) == 1:
            return None  # one stage (one rank): no peer to read; a reshape of the input or output stays a put
        if self.real:
            raise refuse("takes complex-to-complex transforms (a real transform's first stage is out of place)")
        if self._arrays != stages:
            raise refuse("needs the input and output boxes to be the first and last stages' own (slabs of axis 0 "
                         "in, the transformed axes stored last out: layout 'transposed')")
        if len(self.world.nodes) > 1 or not self._impl.same_memory(self.world):
            raise refuse("needs every rank to map every other's memory (one node, one GPU or the cpu)")
        K = len(stages)
        maps = {"forward": [self._pull_map(stages[k - 1], stages[k], self.stages[k].count) for k in range(1, K)],
                "backward": [self._pull_map(stages[k + 1], stages[k], self.stages[k].count)
                             for k in reversed(range(K - 1))]}
        bad = self.world.allgather_object(any(m is None for ms in maps.values() for m in ms))
        if any(bad):
            raise refuse(f"cannot read rank(s) {', '.join(str(r) for r, b in enumerate(bad) if b)}'s runs of "
                         "the untransformed axes from one rank each")
        return maps

    def _pull_map(self, src: _Array, dst: _Array, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        box = dst.boxes[self.world.rank]
        axes, free = box.order[len(box.order) - count:], box.order[:len(box.order) - count]
        n = math.prod(box.shape[a] for a in axes)
        ranks = np.full(n, -1, dtype=np.int64)
        offsets = np.zeros(n, dtype=np.int64)
        if box.empty:
            return ranks, offsets
        points = np.indices([box.shape[a] for a in axes]).reshape(count, -1)  # b's coordinates, as stored
        at = {a: points[i] + box.low[a] for i, a in enumerate(axes)}
        e = DTYPES[src.dtype]
        for r, held in enumerate(src.boxes):
            if held.empty:
                continue
            inside = np.logical_and.reduce([(held.low[a] <= at[a]) & (at[a] < held.high[a]) for a in axes])
            if not inside.any():
                continue
            # dst's run of the other axes at b is one contiguous run of the holder's storage: the holder stores
            # those axes last, in the same order, holds all of dst's range on them, and all of them but the
            # first have the same extent in both
            if (free and tuple(held.order[-len(free):]) != tuple(free)) or \
                    any(held.low[a] > box.low[a] or held.high[a] < box.high[a] for a in free) or \
                    any(held.shape[a] != box.shape[a] for a in free[1:]):
                return None
            stride = held.strides()
            base = src.region * self._region // e + sum((box.low[a] - held.low[a]) * stride[a] for a in free)
            ranks[inside] = r
            offsets[inside] = base + sum((at[a][inside] - held.low[a]) * stride[a] for a in axes)
        return (ranks, offsets) if (ranks >= 0).all() else None

    def _pulled(self, direction: str, cache: dict) -> list[_Step]:
        """The pull scheme's program: the first stage's transforms, then per later stage a meeting and its
        transforms reading the stage before from the peers, and a last meeting."""
        K = len(self._stage_arrays)
        inverse = direction == "backward"
        order = list(reversed(range(K))) if inverse else list(range(K))
        steps = [_Step(self._fft_ops(self._transform(order[0], inverse), 1, cache), meet_after=True)]
        for k, (ranks, offsets) in zip(order[1:], self._pulls[direction], strict=True):
            try:  # every rank plans alike, but a refusal on one must not leave the others in a collective
                why = None
                pull = self._impl.make_pull_fft(self.world, self.window, self._stage_arrays[k].view,
                                                self.stages[k].count, ranks, offsets, inverse, cache)
            except BackendError as exc:
                pull, why = None, str(exc)
            refused = [w for w in self.world.allgather_object(why) if w]
            if refused:
                raise BackendError(refused[0])
            steps.append(_Step([pull], meet_after=True))
        return steps

    def _forward(self, parts: int, cache: dict | None = None) -> list[_Step]:
        cache = self._cache if cache is None else cache
        if self._pulls:
            return self._pulled("forward", cache)
        steps = []
        if self._spatial is not self._arrays[0]:
            steps.append(self._reshape(self._arrays[0], self._spatial, None, 1, cache))
        out = self._arrays[-1]
        for k in range(len(self.stages)):
            op = self._transform(k, False)
            here = self._stage_arrays[k]
            nxt = self._stage_arrays[k + 1] if k + 1 < len(self.stages) else (out if out is not here else None)
            steps.append(self._reshape(here, nxt, op, parts, cache) if nxt is not None
                         else _Step(self._fft_ops(op, 1, cache)))
        return steps

    def _backward(self, parts: int, cache: dict | None = None) -> list[_Step]:
        cache = self._cache if cache is None else cache
        if self._pulls:
            return self._pulled("backward", cache)
        steps = []
        last = self._stage_arrays[-1]
        if self._arrays[-1] is not last:
            steps.append(self._reshape(self._arrays[-1], last, None, 1, cache))
        for k in reversed(range(len(self.stages))):
            op = self._transform(k, True)
            result = op[2]
            if k > 0:
                nxt = self._stage_arrays[k - 1]
            else:
                nxt = self._arrays[0] if self._spatial is not self._arrays[0] else None
            steps.append(self._reshape(result, nxt, op, parts, cache) if nxt is not None
                         else _Step(self._fft_ops(op, 1, cache)))
        return steps

    def _reshape(self, src: _Array, dst: _Array, op: tuple | None, parts: int, cache: dict) -> _Step:
        """A reshape from ``src`` to ``dst`` (``op``: the transform that writes ``src`` first, chunk by chunk)."""
        from ... import rma

        world, me, R = self.world, self.world.rank, self.world.size
        if op is None or op[0] != "c2c" or op[3] >= len(src.boxes[me].order):
            # Nothing to overlap with; or the transform covers every axis (one rank); or it is out of place
            # (r2c, c2r): its source is in the region this reshape writes into, so later chunks' transforms
            # would read what earlier chunks' puts overwrite.
            parts = 1
        ops = self._fft_ops(op, parts, cache) if op is not None else [None]
        step = _Step(ops, src=src)
        chunks = [bx.chunk_boxes(src.boxes[s], parts) for s in range(R)]
        e = DTYPES[src.dtype]
        flat = self.window.local.view(world.xp.dtype(src.dtype))
        staged = 0
        for j in range(parts):
            q = rma.Queue.alloc(self.window, timeout=self._timeout)
            self._queues_all.append(q)
            packs: list[Callable[[], None]] = []
            pieces = []
            mine = chunks[me][j]
            for t in range(R):
                inter = None if mine.empty else mine.intersect(dst.boxes[t])
                if inter is None:
                    continue
                for p in bx.copy_pieces(*inter, src.boxes[me], dst.boxes[t]):
                    pieces.append((p, t))
                    so = src.region * self._region + p.src * e
                    do = dst.region * self._region + p.dst * e
                    if not p.transpose:
                        q.push(rma.declare_strided_write(self.window, do, self.window, so, p.rows, p.cols * e,
                                                         p.src_ld * e, p.dst_ld * e, t))
                    elif self.scheme == "transpose-put":
                        q.push(rma.declare_transpose_write(self.window, do, p.dst_ld, self.window, so, p.src_ld,
                                                           p.rows, p.cols, src.dtype, t))
                    else:  # local transpose into the staging region, then block puts of whole rows
                        base = 2 * self._region // e
                        stage = self._impl.strided(flat, base + staged, (p.cols, p.rows), (p.rows, 1))
                        source = self._impl.strided(flat, src.region * self._region // e + p.src,
                                                      (p.rows, p.cols), (p.src_ld, 1))
                        packs.append(rma.plan_local_transpose(world, stage, source))
                        q.push(rma.declare_strided_write(self.window, do, self.window, 2 * self._region + staged * e,
                                                         p.cols, p.rows * e, p.rows * e, p.dst_ld * e, t))
                        staged += p.rows * p.cols
            for s in range(R):
                if not chunks[s][j].empty and chunks[s][j].intersect(dst.boxes[me]) is not None:
                    q.add_origin(s)
            q.commit(timeout=self._timeout)
            step.queues.append(q)
            step.packs.append(packs)
            step.pieces.append(pieces)
        return step

    # -- chunks: the model, and measurement where it cannot tell -------------------------------------
    def _choose_chunks(self, chunks: int | None) -> int:
        # More chunks than the slowest storage axis has indices would only add empty ones.
        limit = max(1, min((b.storage_shape[0] for a in self._stage_arrays for b in a.boxes if not b.empty),
                           default=1))
        if chunks is not None:
            return max(1, min(int(chunks), limit))
        model = self._impl.tile_model(self.world, self.cdtype) if len(self.stages) > 1 else None
        if model is None:
            return 1
        candidates = [k for k in _CHUNK_CANDIDATES if k <= limit]
        shared = self._impl.same_memory(self.world)
        fft_s, put_s = self._stage_costs(model)
        bounds = {}
        for k in candidates:
            lo = hi = 0.0
            for f, p in zip(fft_s, put_s, strict=True):
                over = (k - 1) * (model.t0 + _CHUNK_OVERHEAD_S)
                apart = (f + p) / k + (k - 1) / k * max(f, p) + over  # puts and transforms on separate memories
                together = f + p + over  # one memory's bandwidth for both: overlap saves nothing
                lo += apart
                hi += together if shared else apart
            bounds[k] = (lo, hi)
        best_hi = min(h for _, h in bounds.values())
        close = [k for k in candidates if bounds[k][0] <= best_hi * (1 + _UNSURE)]
        # Every rank must build the same programs (their queues are collective), but each rank has its own
        # calibrated model (its own t0), so the bounds may differ in the last digits: rank 0's choice holds.
        close = self.world.broadcast_object(close)
        self.prediction.update(chunk_candidates={k: {"low_s": lo, "high_s": hi} for k, (lo, hi) in bounds.items()},
                               stage_fft_s=fft_s, stage_put_s=put_s, shared_memory=shared)
        if len(close) == 1:
            return close[0]
        return self._measure_chunks(close)

    def _stage_costs(self, model: Any) -> tuple[list[float], list[float]]:
        """Per forward reshape after a transform: the transform's measured seconds and the puts' predicted
        seconds (the slowest rank's; the tile model's best tile for each piece)."""
        from ... import rma
        from ...rma import _tile_model as tm

        me = self.world.rank
        e = DTYPES[self.cdtype]
        tiles = rma.transpose_tiles(self.world, self.cdtype)
        fft_s, put_s = [], []
        out = self._arrays[-1]
        for k in range(len(self.stages)):
            here = self._stage_arrays[k]
            nxt = self._stage_arrays[k + 1] if k + 1 < len(self.stages) else (out if out is not here else None)
            if nxt is None:
                continue
            ops = self._fft_ops(self._transform(k, False), 1, self._cache)
            f = sum(self._impl.time_op(self.world, op) for op in ops if op is not None)
            pieces = []
            mine = here.boxes[me]
            for t in range(self.world.size):
                got = None if mine.empty else mine.intersect(nxt.boxes[t])
                if got is not None:
                    pieces += [(x, t) for x in bx.copy_pieces(*got, mine, nxt.boxes[t])]
            p = _predict_pieces(model, tm, tiles, e, [pieces])
            fft_s.append(f)
            put_s.append(p)
        both = self.world.allgather_object((fft_s, put_s))
        fft_s = [max(b[0][i] for b in both) for i in range(len(fft_s))]
        put_s = [max(b[1][i] for b in both) for i in range(len(put_s))]
        return fft_s, put_s

    def _measure_chunks(self, candidates: list[int]) -> int:
        """Time forward executes of every candidate and keep the fastest by the statistic the benchmarks report:
        the median over ``_CHUNK_RUNS`` runs (after one to warm up) of the slowest rank's time. Each run starts
        after the world's device-side meeting (``rma.meet``): after the host barrier alone the ranks' launches came
        up to a millisecond apart under MPS, a rank's puts waited that long for its peers' posts, and two runs of
        one case picked 4 and 2 chunks (16384^2 complex64 on 4 ranks, one H100). The best of two runs, the
        earlier statistic, follows a case's fast mode: at 512^3 complex64 on 2 ranks it picked 4 chunks, whose
        median was 3.08 ms, where 1 chunk's had been 2.74 in another run (H100, 2026-12-07)."""
        from ... import rma

        measured: dict[int, float] = {}
        kept: dict[int, tuple[list, list]] = {}
        for k in candidates:  # one cuFFT plan cache: they run on one stream, one after the other
            first = len(self._queues_all)
            program = self._forward(k, self._cache)
            queues = self._queues_all[first:]
            times = []
            for _ in range(1 + _CHUNK_RUNS):
                self.world.barrier()
                met = rma.meet(self.world)
                self._execute(program, None, 1.0, False)
                if met is not None:
                    met.check_device()
                times.append(self._runner.total)
            slowest = [max(run) for run in zip(*self.world.allgather_object(times[1:]), strict=True)]
            measured[k] = statistics.median(slowest)
            kept[k] = (program, queues)
        best = min(candidates, key=lambda k: (measured[k], k))
        for k in candidates:  # every rank frees the same queues in the same order
            if k != best:
                for q in kept[k][1]:
                    q.free(self._timeout)
                    self._queues_all.remove(q)
        self._prebuilt = kept[best][0]
        self.prediction["chunk_measured_s"] = measured
        return best

    def _predict_committed(self) -> None:
        """The tile model's seconds for each forward reshape with the tiles the queues committed: per reshape the
        slowest rank's, and where the ranks share one GPU at least every rank's bytes at the bandwidth they move
        together through the transposing put (``shared_put_bandwidth``): the model is fitted on each rank alone,
        but a reshape's puts of every rank run at once on one memory. Plus, per chunk's queue, the ranks'
        hand-off (``reshape_sync_seconds``: one meeting of every rank, which no single rank's fit sees)."""
        from ...rma import _tile_model as tm

        model = self._impl.tile_model(self.world, self.cdtype) if len(self._arrays) > 1 and not self._pulls else None
        if model is None:
            return
        mine = []  # per forward reshape: (this rank's predicted seconds, its bytes)
        for step in self._programs["forward"]:
            if not step.queues:
                continue
            used = {}
            for q in step.queues:
                for tr in q.describe()["transposes"]:
                    if tr.get("tile"):
                        used[(tr["rows"], tr["cols"])] = tuple(tr["tile"])
            e = DTYPES[step.src.dtype]
            nbytes = sum(p.elements * e for pieces in step.pieces for p, _t in pieces)
            mine.append((_predict_pieces(model, tm, None, e, step.pieces, used), nbytes))
        # per reshape: (the slowest rank's predicted seconds, every rank's bytes)
        steps = [(max(s[0] for s in ranks), sum(s[1] for s in ranks))
                 for ranks in zip(*self.world.allgather_object(mine), strict=True)]
        alone = sum(t for t, _ in steps)
        shared = self._impl.same_memory(self.world)
        shared_bw = self._impl.shared_put_bandwidth(self.world, self.cdtype) if shared else None
        total = sum(max(t, b / shared_bw) for t, b in steps) if shared_bw else alone
        # every chunk's queue is one cycle of start and wait between all ranks, as a meeting is (the meeting
        # queue is one with signals only): one meeting's cost per chunk of every reshape
        sync = self._impl.reshape_sync_seconds(self.world) or 0.0
        total += sync * sum(len(s.queues) for s in self._programs["forward"])
        self.prediction.update(comm_s=total, comm_alone_s=alone, shared_put_bps=shared_bw, sync_s=sync,
                               model=model.as_dict())

    # -- what users see ---------------------------------------------------------------------------
    @property
    def input(self) -> Any:
        """This rank's spatial array (``inbox.storage_shape``): what :meth:`forward` reads."""
        self._check_open("input")
        return self._arrays[0].view

    @property
    def output(self) -> Any:
        """This rank's frequency array (``outbox.storage_shape``): what :meth:`forward` returns."""
        self._check_open("output")
        return self._arrays[-1].view

    @property
    def inbox(self) -> bx.Box:
        return self.inboxes[self.world.rank]

    @property
    def outbox(self) -> bx.Box:
        return self.outboxes[self.world.rank]

    @property
    def flops(self) -> float:
        """5 N log2 N for N points (complex); half of it for a real-to-complex transform."""
        n = math.prod(self.shape)
        return (2.5 if self.real else 5.0) * n * math.log2(max(n, 2))

    def _factor(self, scale: str) -> float:
        if scale not in SCALES:
            raise ConfigError(f"fft: scale={scale!r} must be one of {', '.join(SCALES)}")
        n = math.prod(self.shape)
        return {"none": 1.0, "full": 1.0 / n, "symmetric": 1.0 / math.sqrt(n)}[scale]

    def _load(self, dst: Any, x: Any, what: str) -> None:
        shape = tuple(getattr(x, "shape", ()))
        if shape != tuple(dst.shape):
            raise ConfigError(f"fft: {what}: rank {self.world.rank} passed shape {shape}, but its box holds "
                              f"{tuple(dst.shape)} (the box's extents in its storage order)")
        if np.dtype(x.dtype).kind == "c" and np.dtype(dst.dtype).kind != "c":
            raise ConfigError(f"fft: {what}: complex data ({x.dtype}) for a real {dst.dtype} array")
        dst[...] = self.world.xp.asarray(x)

    def forward(self, x: Any = None, scale: str = "none", profile: bool = False) -> Any:
        """Transform ``input`` (after copying ``x`` into it, when given); return ``output``.

        ``scale``: "none" (default, numpy's forward), "full" (1/N) or "symmetric" (1/sqrt(N)). ``profile``
        records ``timings`` (seconds, from device events on the GPU): fft, transpose (local transposes),
        comm (each reshape from its first put to its last wait), put (the puts alone), total.
        """
        self._check_open("forward")
        factor = self._factor(scale)
        if x is not None:
            self._load(self.input, x, "forward")
        self._execute(self._programs["forward"], self._arrays[-1].view, factor, profile)
        return self.output

    def backward(self, y: Any = None, scale: str = "full", profile: bool = False) -> Any:
        """Transform ``output`` back (after copying ``y`` into it, when given); return ``input``.

        ``scale`` defaults to "full" (1/N: numpy's ifftn / irfftn)."""
        self._check_open("backward")
        factor = self._factor(scale)
        if y is not None:
            self._load(self.output, y, "backward")
        self._execute(self._programs["backward"], self._arrays[0].view, factor, profile)
        return self.input

    def time_exchanges(self) -> float:
        """Seconds (this rank's, device events on the GPU) that one forward execute's reshapes take alone: every
        chunk's puts started and waited for as ``forward`` does, without the transforms between them. What the
        tile model predicts (``describe()["prediction"]["comm_s"]``), measured the same way, for benchmarks.
        Collective; overwrites what ``forward`` overwrites; ``seconds`` keeps the last execute's."""
        self._check_open("time_exchanges")
        program = [_Step([None] * len(s.ops), s.queues, s.packs, s.pieces, s.src)
                   for s in self._programs["forward"] if s.queues]
        last = self.seconds
        self._execute(program, None, 1.0, False)
        alone, self.seconds = self.seconds, last
        return alone

    def _execute(self, program: list[_Step], target: Any, factor: float, profile: bool) -> None:
        run = self._runner
        run.begin(profile)
        used = []
        for step in program:
            if not step.queues:
                for op in step.ops:
                    if op is not None:
                        run.fft(op)
                if step.meet_after:
                    run.meet()
                continue
            for j, q in enumerate(step.queues):
                op = step.ops[j] if j < len(step.ops) else None
                if op is not None:
                    run.fft(op)
                for pack in step.packs[j]:
                    run.pack(pack)
                run.put(q)
            run.wait(step.queues)
            used += step.queues
        if factor != 1.0 and target is not None and target.size:
            run.scale(target, factor)
        run.end(Deadline.after(self._timeout), used)
        self.seconds = run.total
        if profile:
            self.timings = dict(run.times)

    def describe(self) -> dict:
        """The plan for logs and benchmarks: shapes, decomposition, stages, arrays, chunks, the model's
        prediction, and for the pull scheme what transforms each pulled stage (as of its last run: a kernel that
        could not launch gives way to another)."""
        me = self.world.rank
        # a pulled program: the first stage's transforms, then one step a pulled stage (its callable's ``kernel``)
        pulls = {d: [getattr(s.ops[0], "kernel", "unnamed") if s.ops[0] is not None else "none" for s in p[1:]]
                 for d, p in self._programs.items()} if self._pulls else {}
        return {"shape": self.shape, "frequency_shape": self.cshape, "dtype": self.dtype, "real": self.real,
                "decomposition": self.decomposition, "grid": self.grid, "scheme": self.scheme, "pull_kernels": pulls,
                "chunks": self.chunks, "stages": [str(s.boxes[me]) for s in self.stages],
                "arrays": {a.name: (str(a.boxes[me]), a.region) for a in self._arrays},
                "reshapes": {d: sum(1 for s in p if s.queues) for d, p in self._programs.items()},
                "puts": {d: sum(len(pc) for s in p for pc in s.pieces) for d, p in self._programs.items()},
                "prediction": dict(self.prediction)}

    def _close(self, timeout: float | None) -> None:
        self._queues_all = []
        self._programs = {}
        self._cache = {}
        self.window.free(timeout)

    def _release_local(self) -> None:
        # The window (and its queues) are the world's resources, released on its own error path.
        self._queues_all = []
        self._programs = {}
        self._cache = {}

    def __repr__(self) -> str:
        return (f"fft.Plan({' x '.join(map(str, self.shape))} {self.dtype}, {self.decomposition}, {self.scheme}, "
                f"rank {self.world.rank} of {self.world.size})")


def _predict_pieces(model: Any, tm: Any, tiles: Any, e: int, pieces_by_chunk: list, used: dict | None = None
                    ) -> float:
    """Seconds the tile model predicts for the puts of one reshape: per chunk one start (t0), then every
    transposing piece with its tile (``used``: the committed tiles by (rows, cols); else the model's best of
    ``tiles``) and every block write at the model's contiguous bandwidth."""
    total = 0.0
    for pieces in pieces_by_chunk:
        if not pieces:
            continue
        total += model.t0
        for p, _t in pieces:
            if not p.transpose:
                total += p.elements * e / model.b_eff
                continue
            tile = (used or {}).get((p.rows, p.cols))
            if tile is None and tiles:
                tile = tm.rank_tiles(model, tiles, e, p.rows, p.cols)[0][0]
            if tile is None:
                total += p.elements * e / model.b_eff
            else:
                total += model.time(tile, e, p.rows, p.cols) - model.t0
    return total


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def require_gpu_memory(nranks: int, each: float, what: str, advice: str) -> None:
    """Before any rank starts: refuse in one line work whose ``nranks`` ranks, spread over the visible GPUs as
    the launcher spreads them, need more than a GPU has free, ``each`` bytes a rank (where nvidia-smi can say;
    the ranks check again, with what they see, before they allocate)."""
    from ... import mps

    gpus = max(1, mps.gpu_count())
    mps.require_gpu_memory({g: len(range(g, nranks, gpus)) * int(each) for g in range(min(gpus, nranks))}, what,
                           advice)


def check_memory(world: Any, module: Any, nbytes: int, problem: str) -> None:
    """Collective: refuse, before allocating, a plan that the ranks sharing a device (or the host) cannot hold.

    Every rank reports its device, need and free bytes; each group of ranks on one device needs the sum
    of their needs. Every rank raises the same one-line error.
    """
    need = int(nbytes) + _MARGIN
    free, what = module.free_bytes(world)
    # Grouped by the device's identity (host and PCI bus on a GPU; None, the host's memory, on the cpu), not its
    # ordinal: ranks on two hosts may both use their GPU 0.
    everyone = world.allgather_object((world.backend.device_identity, need, free, what))
    groups: dict[Any, list[int]] = {}
    for rank, (device, _, _, _) in enumerate(everyone):
        groups.setdefault(device, []).append(rank)
    for ranks in groups.values():
        have = min(everyone[r][2] for r in ranks)
        total = sum(everyone[r][1] for r in ranks)
        if total > have:
            share = f" ({len(ranks)} ranks share it)" if len(ranks) > 1 else ""
            raise ConfigError(
                f"fft: {problem} needs about {_gib(max(everyone[r][1] for r in ranks))} per rank, {_gib(total)} "
                f"on {everyone[ranks[0]][3]}{share}, but only {_gib(have)} is free: use more ranks (or GPUs), "
                "single precision, or a smaller size")
