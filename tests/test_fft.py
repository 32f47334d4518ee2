"""The distributed FFT (circuslink.apps.fft) against numpy.fft: geometry, plans at 1-4 ranks, refusals.

The plan jobs draw their cases from the test's seed: random 2-D and 3-D shapes (uneven splits, axes of
one point, ranks with empty boxes), complex64 / complex128 (c2c) and float32 / float64 (r2c / c2r), slab
and pencil decompositions, natural and transposed output layouts, both schemes, chunked pipelines, every
scale, boxes from ``fft.boxes`` and boxes of the user's own (random cuts, random storage orders). Every
case checks forward against numpy's fftn / rfftn, backward of the result against the input, and backward
of fresh random frequency data against numpy's ifftn / irfftn, in the max norm relative to the
reference's max: 1e-5 in single precision, 1e-12 in double.
"""

from __future__ import annotations

import numpy as np
import pytest

import circuslink as cl
from circuslink.apps import fft
from circuslink.apps.fft import _boxes as bx

# -- geometry (no world) -------------------------------------------------------------------------


def _random_box(rng, shape):
    lo = [int(rng.integers(0, n)) for n in shape]
    hi = [int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape, strict=True)]
    return fft.Box(lo, hi, tuple(int(a) for a in rng.permutation(len(shape))))


def _storage(x, box):
    return np.ascontiguousarray(x[tuple(slice(lo, hi) for lo, hi in zip(box.low, box.high, strict=True))]
                                .transpose(box.order))


def test_copy_pieces_move_exactly_the_intersection(rng):
    """Random boxes in random storage orders: the pieces write every shared index once and nothing else."""
    checked = 0
    for _ in range(2000):
        shape = tuple(int(n) for n in rng.integers(1, 7, int(rng.integers(2, 4))))
        a, b = _random_box(rng, shape), _random_box(rng, shape)
        inter = a.intersect(b)
        if inter is None:
            continue
        x = rng.standard_normal(shape)
        dst = np.full(b.size, np.nan)
        bx.apply_pieces(bx.copy_pieces(*inter, a, b), _storage(x, a).ravel(), dst)
        got = dst.reshape(b.storage_shape).transpose(np.argsort(b.order))
        inside = tuple(slice(lo - o, hi - o) for lo, hi, o in zip(*inter, b.low, strict=True))
        assert np.array_equal(got[inside], x[tuple(slice(lo, hi) for lo, hi in zip(*inter, strict=True))])
        outside = np.ones(b.shape, bool)
        outside[inside] = False
        assert np.isnan(got[outside]).all()
        checked += 1
    assert checked > 500


@pytest.mark.parametrize("shape, nranks, decomposition, puts", [
    ((64, 48, 40), 4, "slab", [1, 1, 1, 1]),      # slab: one transposing put per pair of ranks
    ((40, 64), 3, "slab", [1, 1, 1]),
    ((64, 64, 64), 4, "pencil", [32, 32, 0, 0]),   # pencil, first reshape: one put per index of axis 0, in the row
])
def test_reshapes_take_few_puts(shape, nranks, decomposition, puts):
    ins, outs = fft.boxes(shape, nranks, decomposition)
    st = bx.stages(shape, nranks, decomposition, None, ins, outs, None)
    got = []
    for t in range(nranks):
        inter = st[0].boxes[0].intersect(st[1].boxes[t])
        got.append(0 if inter is None else len(bx.copy_pieces(*inter, st[0].boxes[0], st[1].boxes[t])))
    assert got == puts
    assert all(p.transpose for t in range(nranks) if (i := st[0].boxes[0].intersect(st[1].boxes[t]))
               for p in bx.copy_pieces(*i, st[0].boxes[0], st[1].boxes[t]))


def test_cufft_is_not_asked_for_axes_of_one_point():
    """A DFT of one point is the identity: those axes leave the cuFFT plan (the packed layout is the same without
    them), except the last axis of a real transform, which changes the element type."""
    from circuslink.apps.fft._cuda import cufft_dims

    assert cufft_dims("c2c", (4, 3, 2)) == (4, 3, 2)
    assert cufft_dims("c2c", (1, 9)) == (9,) and cufft_dims("c2c", (7, 1)) == (7,)
    assert cufft_dims("c2c", (1, 1, 1)) == ()
    assert cufft_dims("r2c", (1, 6)) == (6,) and cufft_dims("r2c", (1, 1)) == (1,)
    assert cufft_dims("c2r", (1, 5, 1)) == (5, 1)


def test_split_is_even_and_tiles(rng):
    for _ in range(50):
        shape = tuple(int(n) for n in rng.integers(1, 20, 3))
        grid = tuple(int(n) for n in rng.integers(1, 5, 3))
        boxes = fft.split(shape, grid)
        assert len(boxes) == int(np.prod(grid))
        bx.check_layout(boxes, shape, "test")
        for a in range(3):
            sizes = {b.shape[a] for b in boxes}
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("boxes, message", [
    ([fft.Box((0, 0), (2, 4)), fft.Box((1, 0), (4, 4))], r"rank 0's box \[0:2, 0:4\] .* and rank 1's box .* overlap"),
    ([fft.Box((0, 0), (2, 4)), fft.Box((3, 0), (4, 4))], r"the boxes hold 12 of the array's 16 points"),
    ([fft.Box((0, 0), (2, 4)), fft.Box((2, 0), (5, 4))],
     r"rank 1's box .* reaches index 4 on axis 0, past the array's 4"),
])
def test_bad_layouts_are_one_line(boxes, message):
    with pytest.raises(cl.ConfigError, match=message) as info:
        bx.check_layout(boxes, (4, 4), "fft: the input boxes")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("args, message", [
    (((0, 0), (2,)), r"low \(0, 0\) and high \(2,\) have different lengths"),
    (((0, 3), (2, 1)), r"axis 1 runs from 3 to 1: need 0 <= low <= high"),
    (((0, 0), (2, 2), (0, 0)), r"order \(0, 0\) is not a permutation"),
    (((0, 0.5), (2, 2)), r"low .* must hold integers"),
    (((), ()), r"a box needs at least one axis"),
])
def test_bad_box_is_one_line(args, message):
    with pytest.raises(cl.ConfigError, match=message):
        fft.Box(*args)


# -- plans at 1..4 ranks, against numpy ---------------------------------------------------------------
CASES = """
import os
import numpy as np
import circuslink as cl
from circuslink.apps import fft

world = cl.init()
R, me, xp = world.size, world.rank, world.xp
SEED = int(os.environ["CIRCUSLINK_TEST_SEED"])
TOL = {{"complex64": 1e-5, "float32": 1e-5, "complex128": 1e-12, "float64": 1e-12}}
g = np.random.default_rng([SEED, R])
host = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)


def sl(box):
    return tuple(slice(lo, hi) for lo, hi in zip(box.low, box.high))


def mine(a, box):
    return np.ascontiguousarray(a[sl(box)].transpose(box.order))


def err(got, want, ref):
    got = host(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max()) / max(float(np.abs(ref).max()), 1e-300) if got.size else 0.0


def own_boxes(shape, real):
    # Random uneven cuts of axis 0 (some ranks may get nothing); the output: the same cuts or, half of the
    # time, slabs of axis 1 in a random storage order (the plan then adds a reshape).
    cuts = np.sort(g.integers(0, shape[0] + 1, R - 1))
    edges = [0, *[int(c) for c in cuts], shape[0]]
    cshape = shape[:-1] + (shape[-1] // 2 + 1,) if real else shape
    ins = [fft.Box((edges[r],) + (0,) * (len(shape) - 1), (edges[r + 1], *shape[1:])) for r in range(R)]
    if g.random() < 0.5:
        outs = [fft.Box((edges[r],) + (0,) * (len(shape) - 1), (edges[r + 1], *cshape[1:])) for r in range(R)]
    else:
        order = tuple(int(a) for a in g.permutation(len(shape)))
        outs = [b.with_order(order) for b in fft.split(cshape, (1, R) + (1,) * (len(shape) - 2))]
    return ins, outs


def case(shape, dtype, decomposition, layout, scheme, chunks, scales, own):
    real = dtype.startswith("float")
    if own:
        ins, outs = own_boxes(shape, real)
    else:
        ins, outs = fft.boxes(shape, R, decomposition, layout=layout, real=real)
    x = g.standard_normal(shape) + (0 if real else 1j * g.standard_normal(shape))
    x = x.astype(dtype)
    n = int(np.prod(shape))
    fs, bs = scales
    factor = {{"none": 1.0, "full": 1.0 / n, "symmetric": n ** -0.5}}
    what = (shape, dtype, decomposition, layout, scheme, chunks, scales, own)
    if me == 0:  # the case a fault or a hang happened in (a device fault surfaces at a later call)
        print("case", what, flush=True)
    try:
        plan = fft.Plan(world, ins[me], outs[me], dtype, decomposition=decomposition if not own else "auto",
                        scheme=scheme, chunks=chunks)
    except cl.ConfigError as exc:  # the pull outside what it reads: refused in one line on every rank
        if scheme != "pull":
            raise
        assert "scheme='pull'" in str(exc) and len(str(exc).splitlines()) == 1, exc
        # a complex slab in the stages' own layout is always pulled; a real one (more than one stage) never
        assert not (not real and not own and layout == "transposed" and decomposition == "slab"), (what, exc)
        return 0
    if scheme == "pull" and real:
        assert len(plan.stages) == 1, (what, "a real transform pulled")
    with plan:
        ref = (np.fft.rfftn(x.astype(np.float64)) if real else np.fft.fftn(x.astype(np.complex128))) * factor[fs]
        for rep in range(2):  # a plan runs many times: the second run must agree too
            y = plan.forward(xp.asarray(mine(x, plan.inbox)), scale=fs, profile=rep == 1)
            assert host(y).dtype == np.dtype(fft.COMPLEX[dtype]), host(y).dtype
            e = err(y, mine(ref, plan.outbox), ref)
            assert e < TOL[dtype], (what, "forward", rep, e)
        back = plan.backward(y, scale=bs)
        want = x * (n * factor[fs] * factor[bs])
        e = err(back, mine(want, plan.inbox), want)
        assert e < TOL[dtype], (what, "round trip", e)
        # backward of fresh frequency data (non-Hermitian for c2r: numpy's irfftn keeps the real parts)
        cshape = plan.cshape
        z = (g.standard_normal(cshape) + 1j * g.standard_normal(cshape)).astype(fft.COMPLEX[dtype])
        if real and xp is not np:  # a spectrum rfftn can give: cuFFT's C2R assumes one (numpy's takes any)
            z = np.fft.rfftn(g.standard_normal(shape)).astype(fft.COMPLEX[dtype])
        if real:
            want = np.fft.irfftn(z.astype(np.complex128), s=shape, axes=tuple(range(len(shape)))) * n * factor[bs]
        else:
            want = np.fft.ifftn(z.astype(np.complex128)) * n * factor[bs]
        got = plan.backward(xp.asarray(mine(z, plan.outbox)), scale=bs)
        e = err(got, mine(want, plan.inbox), want)
        assert e < TOL[dtype], (what, "backward", e)
        assert set(plan.timings) == {{"fft", "transpose", "comm", "put", "total"}}
        if scheme == "transpose-put":
            assert plan.timings["transpose"] == 0.0
        if scheme == "pull" and len(plan.stages) > 1:  # no reshape: each stage read the one before where it lay
            assert plan.describe()["reshapes"] == {{"forward": 0, "backward": 0}} and plan.chunks == 1
            # what ran each pulled stage, named (and no kernel that gave way to another)
            kinds = plan.describe()["pull_kernels"]
            assert sorted(kinds) == ["backward", "forward"], kinds
            assert all(len(v) == len(plan.stages) - 1 for v in kinds.values()), kinds  # "none": an empty box
            assert "did not launch" not in str(kinds), kinds
    return 1


checked = 0
for k in range({cases}):
    ndim = int(g.integers(2, 4))
    shape = tuple(int(v) for v in g.integers(1, {largest}, ndim))
    dtype = str(g.choice(["complex64", "complex128", "float32", "float64"]))
    decomposition = str(g.choice(["slab", "pencil"])) if ndim == 3 else "slab"
    layout = str(g.choice(["natural", "transposed"]))
    own = bool(g.random() < 0.3)
    pullable = dtype.startswith("complex") and layout == "transposed" and not own
    scheme = str(g.choice(["transpose-put", "local-transpose"] + ["pull"] * pullable))
    chunks = [None, 2, 3][int(g.integers(0, 3))]
    scales = [("none", "full"), ("symmetric", "symmetric"), ("full", "none")][int(g.integers(0, 3))]
    checked += case(shape, dtype, decomposition, layout, scheme, chunks, scales, own=own)
for shape, dtype, dec, scheme, chunks, own in {fixed}:
    for layout in ("natural",) if own else ("natural", "transposed"):  # own boxes choose their output layout
        checked += case(shape, dtype, dec, layout, scheme, chunks, ("none", "full"), own=own)
print(f"rank {{me}} checked {{checked}} plans")
world.close()
"""
# Fixed cases (shape, dtype, decomposition, scheme, chunks, own boxes), each in both output layouts (own boxes:
# once). Shapes every rank count meets: axes of one point, fewer indices than ranks (empty boxes), odd r2c axes.
FIXED = [((1, 1), "complex128", "slab", "transpose-put", 2, False),
         ((3, 4, 5), "float64", "slab", "transpose-put", 2, False),
         ((3, 2, 7), "complex64", "pencil", "transpose-put", 2, False),
         ((5, 1, 9), "float32", "pencil", "transpose-put", 2, False),
         ((2, 17), "float64", "slab", "transpose-put", 2, False),
         ((7, 3), "complex128", "slab", "pull", None, False),  # natural layout: refused; transposed: pulled
         ((4, 9), "float32", "slab", "pull", None, False),  # real: refused in both layouts
         ((2, 5), "complex64", "slab", "pull", None, False),  # fewer rows than ranks: empty slabs
         ((5, 6, 7), "complex128", "slab", "pull", None, False),  # 3-D: one pull of a plane's runs
         ((6, 5, 4), "complex64", "pencil", "pull", None, False)]  # pencils: pulled where the runs allow
# The GPU's: both precisions, uneven slabs (no size divides by 2 or 4 ranks), many tiles with partial ones at
# the edges, boxes of the user's own (random uneven cuts: some ranks may hold nothing), c2c and r2c / c2r,
# slab and pencil, both schemes, chunks from the tile model (None: the model's choice, measured where it
# cannot tell) and forced.
GPU_FIXED = [((37, 50), "complex64", "slab", "transpose-put", None, False),
             ((45, 31), "complex128", "slab", "transpose-put", 2, False),
             ((301, 257), "complex64", "slab", "transpose-put", 3, False),
             ((13, 10, 9), "complex128", "slab", "local-transpose", 2, False),
             ((10, 9, 7), "complex64", "pencil", "transpose-put", None, False),
             ((9, 12, 10), "float32", "slab", "transpose-put", None, False),
             ((11, 6, 7), "float64", "pencil", "transpose-put", 2, False),
             ((29, 23), "complex128", "auto", "transpose-put", 2, True),
             ((17, 9, 6), "complex64", "auto", "transpose-put", None, True),
             ((1, 1), "complex128", "slab", "transpose-put", 2, False),
             ((5, 1, 9), "float32", "pencil", "transpose-put", 2, False),
             ((37, 50), "complex128", "slab", "pull", None, False),
             ((301, 257), "complex64", "slab", "pull", None, False),
             # powers of two: a pulled stage of one axis runs the pull's own kernels (64 and 128 points
             # forward, 32 backward; the four-step: 2048 points forward at complex64), the 3-D backward's two
             # axes, other lengths and the four-step's at complex128 (4096 backward) cuFFT's callback
             ((64, 24, 10), "complex64", "slab", "pull", None, False),
             ((128, 32), "complex128", "slab", "pull", None, False),
             ((2048, 12), "complex64", "slab", "pull", None, False),
             ((16, 4096), "complex128", "slab", "pull", None, False)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_plans_match_numpy(spmd, n):
    code = CASES.format(cases=24, largest=17, fixed=FIXED)
    job = spmd(n, code, timeout=420).check()
    assert job.output.count("checked") == n and " checked 0 plans" not in job.output, job.output


@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 4])
def test_plans_match_numpy_on_gpu(spmd, n):
    """The GPU stage's accuracy check (scripts/gpu-check.sh fft): 1e-5 / 1e-12 against numpy at 2 and 4 ranks."""
    job = spmd(n, CASES.format(cases=2, largest=40, fixed=GPU_FIXED), backend="cuda", timeout=300).check()
    assert job.output.count("checked") == n and " checked 0 plans" not in job.output, job.output


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3])
def test_plans_match_numpy_on_gpu_sweep(spmd, n):
    fixed = FIXED + [((256, 512), "complex64", "slab", "transpose-put", 2, False),
                     ((96, 80, 64), "complex128", "pencil", "transpose-put", None, False),
                     ((64, 64, 66), "float32", "slab", "transpose-put", 2, False)]
    job = spmd(n, CASES.format(cases=8, largest=40, fixed=fixed), backend="cuda", timeout=420).check()
    assert job.output.count("checked") == n and " checked 0 plans" not in job.output, job.output


ONE_SHOT = """
import os
import numpy as np
import circuslink as cl
from circuslink.apps import fft

world = cl.init()
R, me, xp = world.size, world.rank, world.xp
g = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))
host = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)
for shape in [(11, 6), (9, 5, 4)]:
    x = g.standard_normal(shape) + 1j * g.standard_normal(shape)
    rows = [int(v) for v in np.diff([0, *sorted(g.integers(0, shape[0] + 1, R - 1)), shape[0]])]  # uneven
    start = sum(rows[:me])
    part = xp.asarray(x[start: start + rows[me]])
    y = fft.fftn(world, part)
    assert np.allclose(host(y), np.fft.fftn(x)[start: start + rows[me]], rtol=0, atol=1e-12 * np.abs(x).sum())
    back = fft.ifftn(world, y)
    assert back.shape == part.shape and (not back.size or
                                         float(abs(host(back) - host(part)).max()) < 1e-12 * float(abs(x).max()))
    if len(shape) == 2:  # fft2(x.T) == fft2(x).T: the transposed layout's pair returns the input (in even rows)
        yt = fft.fft2(world, part, layout="transposed")
        back = fft.ifft2(world, yt, layout="transposed")
        lo, hi = fft.spans(shape[0], R)[me]
        assert back.shape == (hi - lo, shape[1]), back.shape
        assert not back.size or float(abs(host(back) - x[lo:hi]).max()) < 1e-12 * float(abs(x).max())
print(f"rank {me} one-shot ok")
world.close()
"""


@pytest.mark.parametrize("n", [1, 3])
def test_one_shot_calls_with_uneven_slabs(spmd, n):
    job = spmd(n, ONE_SHOT, timeout=240).check()
    assert job.output.count("one-shot ok") == n, job.output


AGREED_CHUNKS = """
import os
import numpy as np
import circuslink as cl
from circuslink.apps import fft
from circuslink.apps.fft import _cpu
from circuslink.rma import _tile_model as tm

# What a GPU gives: a tile model calibrated on each rank (its own start cost t0) and measured transforms. Rank 1's
# start cost makes more chunks look hopeless to it, rank 0's makes them worth measuring: the plan must still
# build the same programs on every rank (its queues are collective).
world = cl.init()
me = world.rank
model = tm.TileModel(b_ideal=1e11, x_read=64.0, x_write=64.0, k=1e-8, t0=1.0 if me == 1 else 1e-6)
_cpu.tile_model = lambda w, dtype: model
_cpu.time_op = lambda w, op: 1e-3
g = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))
shape = (12, 10)
x = (g.standard_normal(shape) + 1j * g.standard_normal(shape)).astype(np.complex128)
ins, outs = fft.boxes(shape, world.size, "slab", layout="transposed")
with fft.Plan(world, ins[me], outs[me], "complex128") as plan:
    chunks = world.allgather_object(plan.chunks)
    assert len(set(chunks)) == 1, chunks
    assert "chunk_measured_s" in plan.prediction, plan.prediction  # rank 0's candidates were measured
    box = plan.outbox
    want = np.fft.fft2(x)[tuple(slice(lo, hi) for lo, hi in zip(box.low, box.high))].transpose(box.order)
    got = plan.forward(x[ins[me].low[0]: ins[me].high[0]])
    assert np.abs(got - want).max() < 1e-12 * np.abs(want).max()
print(f"rank {me} agreed on {chunks[0]} chunks")
world.close()
"""


def test_ranks_agree_on_chunks_whatever_their_tile_models(spmd):
    job = spmd(2, AGREED_CHUNKS, timeout=120, env={"CIRCUSLINK_TIMEOUT": "20"}).check()
    assert job.output.count("agreed on") == 2, job.output


SYNC_PER_CHUNK = """
import circuslink as cl
from circuslink.apps import fft
from circuslink.apps.fft import _cpu
from circuslink.rma import _tile_model as tm

# The model counts the ranks' hand-off (one meeting's measured cost) once per chunk's queue of every reshape:
# each chunk's queue is one cycle of start and wait between all ranks, as a meeting is.
world = cl.init()
me = world.rank
model = tm.TileModel(b_ideal=1e11, x_read=64.0, x_write=64.0, k=1e-8, t0=1e-6)
_cpu.tile_model = lambda w, dtype: model
_cpu.reshape_sync_seconds = lambda w: 5e-5
ins, outs = fft.boxes((12, 10), world.size, "slab", layout="transposed")
for chunks in (1, 3):
    with fft.Plan(world, ins[me], outs[me], "complex128", chunks=chunks) as plan:
        p = plan.prediction
        queues = sum(len(s.queues) for s in plan._programs["forward"])
        assert queues == chunks, (queues, chunks)
        assert p["sync_s"] == 5e-5 and abs(p["comm_s"] - (p["comm_alone_s"] + chunks * 5e-5)) < 1e-15, p
print(f"rank {me} counted the hand-off per chunk")
world.close()
"""


def test_the_model_counts_one_hand_off_per_chunk(spmd):
    job = spmd(2, SYNC_PER_CHUNK, timeout=120).check()
    assert job.output.count("per chunk") == 2, job.output


RESULT_KEPT = """
import os
import time
import numpy as np
import circuslink as cl
from circuslink.apps import fft

# A result is valid until this rank's next execute, whatever its peers do: a peer that starts its next forward at
# once must not overwrite the output this rank still reads (rank 0 reads its output late, and starts late).
world = cl.init()
me, xp = world.rank, world.xp
host = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)
g = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))
shape = (13, 9)
xs = [(g.standard_normal(shape) + 1j * g.standard_normal(shape)).astype(np.complex128) for _ in range(3)]
ins, outs = fft.boxes(shape, world.size, "slab", layout="transposed")
with fft.Plan(world, ins[me], outs[me], "complex128", scheme="{scheme}") as plan:
    box = plan.outbox
    for i, x in enumerate(xs):
        if me == 0:
            time.sleep(0.3)
        y = plan.forward(xp.asarray(x[ins[me].low[0]: ins[me].high[0]]))
        if me == 0:
            time.sleep(0.3)
        want = np.fft.fft2(x)[tuple(slice(lo, hi) for lo, hi in zip(box.low, box.high))].transpose(box.order)
        assert np.abs(host(y) - want).max() < 1e-12 * np.abs(want).max(), ("forward", i)
print(f"rank {{me}} kept its results")
world.close()
"""


SCRATCH_COUNTED = """
import circuslink as cl
from circuslink.apps import fft
from circuslink.apps.fft import _cpu, _plan

# The pulled transforms' own memory (the cuda module's four-step scratch) is in the plan's check before anything
# is allocated: here the cpu module claims 1 TiB for each pulled stage of {n} points.
world = cl.init()
me = world.rank
_cpu.pull_scratch_bytes = lambda shape, count, itemsize: (1 << 40) if shape[-1] == {n} else 0
seen = []
check = _plan.check_memory
_plan.check_memory = lambda w, module, nbytes, problem: (seen.append(nbytes), check(w, module, nbytes, problem))
ins, outs = fft.boxes(({n}, {n}), world.size, "slab", layout="transposed")
before = len(world.resources())
try:
    fft.Plan(world, ins[me], outs[me], "complex64", scheme="pull").close()
    print(f"rank {{me}} planned", flush=True)
except cl.ConfigError as exc:
    assert "needs about 1024." in str(exc), exc  # the scratch and the plan's few bytes
    assert len(world.resources()) == before
    print(f"rank {{me}} refused", flush=True)
with fft.Plan(world, ins[me], outs[me], "complex64", scheme="transpose-put"):
    pass
assert seen[0] - seen[1] == 1 << 40, seen  # the pull's check counted one scratch array (its stages share it)
print(f"rank {{me}} counted the scratch", flush=True)
world.close()
"""


def test_the_pulled_transforms_memory_is_in_the_plans_check(spmd):
    job = spmd(2, SCRATCH_COUNTED.format(n=64), timeout=120).check()
    assert job.output.count("refused") == 2 and job.output.count("counted the scratch") == 2, job.output


@pytest.mark.parametrize("scheme", ["pull", "transpose-put"])
def test_a_result_stays_until_this_ranks_next_execute(spmd, scheme):
    job = spmd(3, RESULT_KEPT.format(scheme=scheme), timeout=120, env={"CIRCUSLINK_TIMEOUT": "20"}).check()
    assert job.output.count("kept its results") == 3, job.output


# -- the Python API's refusals (in this process: a world of one rank) ----------------------------------
@pytest.fixture(scope="module")
def world():
    return cl.init(backend="cpu")


def test_too_large_is_refused_before_allocating(world):
    before = len(world.resources())
    box = fft.Box((0, 0), (1 << 20, 1 << 20))
    with pytest.raises(cl.ConfigError, match=r"fft: a 1048576 x 1048576 complex128 FFT over 1 ranks needs about "
                                             r"[\d.]+ GiB per rank, .* but only [\d.]+ GiB is free"):
        fft.Plan(world, box, box, "complex128")
    assert len(world.resources()) == before


def test_gpus_short_of_memory_are_refused_before_any_rank_starts(monkeypatch):
    """The commands' up-front check: ranks spread over the GPUs as the launcher spreads them (rank r on GPU
    r % GPUs), each GPU's need against its free memory as nvidia-smi reports it."""
    from circuslink import mps
    from circuslink.apps.fft import _plan

    gib = 1 << 30
    monkeypatch.setattr(mps, "gpu_count", lambda: 2)
    monkeypatch.setattr(mps, "gpu_memory_free", lambda: [7 * gib, 4 * gib])
    _plan.require_gpu_memory(3, 3 * gib, "fft3: x", "advice")  # GPU 0: 2 ranks, 6 GiB of 7; GPU 1: 3 of 4
    with pytest.raises(cl.ConfigError, match=r"^fft3: x needs about 9.0 GiB on GPU 0, more than its 7.0 GiB free "
                                             r"\(nvidia-smi\): advice$"):
        _plan.require_gpu_memory(5, 3 * gib, "fft3: x", "advice")
    monkeypatch.setattr(mps, "gpu_memory_free", lambda: None)  # nvidia-smi cannot say: the ranks check
    _plan.require_gpu_memory(5, 100 * gib, "fft3: x", "advice")


@pytest.mark.parametrize("call, message", [
    (lambda w: fft.fft2(w, np.ones(8, dtype=np.complex64)), r"fft2: the local slab is 1-D"),
    (lambda w: fft.fftn(w, np.ones((4, 4))), r"the local slab has dtype float64: pass a complex"),
    (lambda w: fft.fftn(w, np.ones((4, 4), dtype=np.int8)), r"has dtype int8, not complex or real floating point"),
    (lambda w: fft.Plan(w, fft.Box((0, 0), (4, 4)), fft.Box((0, 0), (4, 4)), "float16"),
     r"dtype has dtype float16, which the FFT does not support"),
    (lambda w: fft.Plan(w, fft.Box((0, 0), (4, 4)), fft.Box((0, 0), (4, 4)), scheme="alltoall"),
     r"scheme='alltoall' must be one of"),
    (lambda w: fft.Plan(w, fft.Box((0, 0), (4, 4)), fft.Box((0, 0), (4, 4)), decomposition="pencil"),
     r"a pencil decomposition needs a 3-D array"),
    (lambda w: fft.Plan(w, fft.Box((0, 0), (4, 4)), fft.Box((0, 0), (4, 4)), "float32"),
     r"a real-to-complex transform of shape \(4, 4\) has shape \(4, 3\)"),
    (lambda w: fft.Plan(w, fft.Box((0,), (4,)), fft.Box((0,), (4,))), r"the boxes are 1-D: .* takes 2-D or 3-D"),
    (lambda w: fft.Plan(w, fft.Box((0, 0), (4, 4)), fft.Box((0, 0, 0), (4, 4, 1))), r"the same number of axes"),
    (lambda w: fft.Plan(w, (0, 4), fft.Box((0, 0), (4, 4))), r"inbox must be an fft.Box, got tuple"),
    (lambda w: fft.Plan(w, fft.Box((0, 0), (4, 4)), fft.Box((0, 0), (4, 4)), chunks=0), r"chunks=0 must be"),
    (lambda w: fft.Plan(w, fft.Box((0, 0, 0), (2, 2, 2)), fft.Box((0, 0, 0), (2, 2, 2)), grid=(2, 2)),
     r"grid=\(2, 2\) must be two positive integers P0, P1 with P0 \* P1 = 1"),
    (lambda w: fft.boxes((4, 0), 2), r"2-D or 3-D array of positive sizes"),
    (lambda w: fft.boxes((4, 4, 4), 4, "pencil", grid=(3, 1)), r"P0 \* P1 = 4"),
    (lambda w: fft.boxes((4, 4), 2, layout="diagonal"), r"layout='diagonal' must be one of natural"),
])
def test_api_bad_input(world, call, message):
    with pytest.raises(cl.ConfigError, match=message) as info:
        call(world)
    assert "\n" not in str(info.value)


def test_plan_runs_many_times_and_closes(world, rng):
    x = (rng.standard_normal((16, 8)) + 1j * rng.standard_normal((16, 8))).astype(np.complex128)
    box = fft.Box((0, 0), x.shape)
    plan = fft.Plan(world, box, box, "complex128")
    for scale, norm in zip(fft.SCALES, ("backward", "forward", "ortho"), strict=True):
        want = np.fft.fft2(x, norm=norm)
        got = plan.forward(x, scale=scale)
        assert np.abs(got - want).max() < 1e-12 * np.abs(want).max()
    with pytest.raises(cl.ConfigError, match=r"rank 0 passed shape \(8, 16\), but its box holds \(16, 8\)"):
        plan.forward(x.T)
    with pytest.raises(cl.ConfigError, match="scale='half' must be one of none, full, symmetric"):
        plan.backward(scale="half")
    plan.forward(x, profile=True)
    assert set(plan.timings) == {"fft", "transpose", "comm", "put", "total"} and plan.seconds > 0
    last = plan.seconds
    assert plan.time_exchanges() >= 0 and plan.seconds == last  # one rank: no reshape to time; seconds kept
    assert plan.flops == pytest.approx(5 * 128 * 7)
    assert plan.describe()["decomposition"] == "slab"
    plan.close()
    with pytest.raises(cl.ConfigError, match="this fft plan is closed"):
        plan.forward()
    with pytest.raises(cl.ConfigError, match="this fft plan is closed"):
        plan.time_exchanges()
