"""Every all-reduce algorithm (one-shot, two-shot, ring) and the shared-memory reduce-scatter,
all-gather, broadcast and barrier, byte-exact against a numpy fold in the order each algorithm
documents, at 2, 3, 4 and 8 ranks on the cpu back-end, with sizes that do not divide evenly and a
small stage so that the two-shot runs in several pieces; on the GPU machine the same job runs the
device kernels (collectives.cuh's Team forms) under MPS and must match the same numpy fold bitwise.
bfloat16 (uint16 bit patterns) is checked against the round-to-nearest-even reference of ``_reduce``,
and that reference against its definition (no nearer bfloat16, ties to even, NaN kept).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import on_backend

from circuslink.collectives import _reduce as red
from circuslink.collectives._algorithms import ring_fold_starts, segments

_BODY = """
import os
import numpy as np, circuslink as cl
from circuslink import collectives
from circuslink.collectives import _reduce as red
from circuslink.collectives._algorithms import ring_fold_starts

w = cl.init()
r, n = w.rank, w.size
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
comm = collectives.Comm(w, stage_bytes=4096)        # two-shot pieces of 4 KiB: several per call
DTYPES = ("float32", "float64", "bfloat16", "int32")

def host(a):
    return a.get() if hasattr(a, "get") else a

def inputs(dtype, count, salt):
    g = [np.random.default_rng([seed, salt, q]) for q in range(n)]
    if dtype == "bfloat16":
        return [red.f32_to_bf16(x.standard_normal(count).astype(np.float32) * 100) for x in g]
    if dtype == "int32":
        return [x.integers(-(1 << 31), 1 << 31, count, dtype=np.int64).astype(np.int32) for x in g]
    return [x.standard_normal(count).astype(dtype) * 1e3 for x in g]

def ring_expected(xs, op, bf16):
    # the back-end's rings each fold their slice in ring order (the cuda back-end runs many at once)
    out = np.empty_like(xs[0])
    slices = comm._impl.ring_slices(xs[0].nbytes)
    for lo, hi, s in ring_fold_starts(xs[0].size, xs[0].dtype.itemsize, n, slices):
        out[lo:hi] = red.fold(op, [xs[(s + k) % n][lo:hi] for k in range(n)], bf16)
    return out

salt = 0
for dtype in DTYPES:
    bf16 = dtype == "bfloat16"
    # 5001 x 8 B > the 4 KiB stage; 9000 + n does not divide; 16 and 64 float32 are the edges of the one-shot's
    # one-warp form on the device (64 B fills a warp of groups of 4 lanes, 256 B a warp at 2 ranks)
    for count in (1, 3, 16, 64, 257, 5001, 9000 + n):
        for op in ("sum", "max", "min"):
            salt += 1
            xs = inputs(dtype, count, salt)
            want = red.fold(op, xs, bf16)
            algos = ["twoshot", "ring"] + (["oneshot"] if xs[0].nbytes <= 64 << 10 else [])
            for algo in algos:
                got = host(comm.allreduce(xs[r], op, algorithm=algo, dtype="bfloat16" if bf16 else None))
                exp = ring_expected(xs, op, bf16) if algo == "ring" else want
                assert got.dtype == xs[r].dtype and got.tobytes() == exp.tobytes(), (algo, dtype, count, op)
            got = host(comm.allreduce(xs[r], op, dtype="bfloat16" if bf16 else None))   # picked by size
            assert got.tobytes() == want.tobytes(), ("auto", dtype, count, op)
    # reduce-scatter: block r of size equal blocks; all-gather; broadcast from the last rank
    count = 1001
    xs = inputs(dtype, count * n, 999)
    got = host(comm.reduce_scatter(xs[r], "sum", dtype="bfloat16" if bf16 else None))
    assert got.tobytes() == red.fold("sum", xs, bf16)[r * count:(r + 1) * count].tobytes(), dtype
    got = host(comm.all_gather(xs[r][:count]))
    assert got.tobytes() == np.concatenate([x[:count] for x in xs]).tobytes(), dtype
    got = host(comm.broadcast(xs[r], root=n - 1))
    assert got.tobytes() == xs[n - 1].tobytes(), dtype
for _ in range(3):
    comm.barrier()
comm.close()
print("ok", r)
w.close()
"""


@pytest.mark.parametrize("backend, n", [on_backend("cpu", n, id=f"cpu-{n}") for n in (2, 3, 4, 8)] + [
    on_backend("cuda", n, id=f"cuda-{n}", marks=[pytest.mark.slow] if n == 8 else []) for n in (2, 3, 4, 8)])
def test_every_algorithm_is_exact(spmd, backend, n):
    job = spmd(n, _BODY, backend=backend, job_timeout=600).check()
    assert job.stdout.count("ok") == n


def test_bf16_rounding_is_nearest_even(rng):
    """The bfloat16 reference: widening is exact, rounding picks the nearest (ties to even), NaN stays NaN."""
    bits = rng.integers(0, 1 << 16, 4096, dtype=np.uint32).astype(np.uint16)
    finite = bits[np.isfinite(red.bf16_to_f32(bits))]
    assert red.f32_to_bf16(red.bf16_to_f32(finite)).tobytes() == finite.tobytes()
    x = rng.standard_normal(100_000).astype(np.float32) * 1e3
    got = red.bf16_to_f32(red.f32_to_bf16(x)).astype(np.float64)
    # no representable bfloat16 is nearer: compare with both neighbours of the chosen one
    up = red.bf16_to_f32(red.f32_to_bf16(x).view(np.uint16) + np.uint16(1)).astype(np.float64)
    down = red.bf16_to_f32(red.f32_to_bf16(x).view(np.uint16) - np.uint16(1)).astype(np.float64)
    err = np.abs(got - x)
    assert np.all(err <= np.abs(up - x)) and np.all(err <= np.abs(down - x))
    ties = np.array([0x3F808000, 0x3F818000], dtype=np.uint32).view(np.float32)  # 1 + 2^-8 and 1 + 3 * 2^-8
    assert red.f32_to_bf16(ties).tolist() == [0x3F80, 0x3F82]
    nan = red.f32_to_bf16(np.array([np.nan], dtype=np.float32))
    assert np.isnan(red.bf16_to_f32(nan)).all()


def test_max_min_keep_the_device_sign_of_zero():
    a, b = np.array([-0.0, 0.0], dtype=np.float32), np.array([0.0, -0.0], dtype=np.float32)
    assert np.signbit(red.combine("max", a, b)).tolist() == [True, False]   # a < b is false: a stays
    assert np.signbit(red.combine("min", a, b)).tolist() == [True, False]


def test_ring_fold_starts_cover_every_element_once_in_slice_order(rng):
    """One slice: the segments, segment s from rank s. Many slices (the cuda back-end's rings): each slice cut
    again, so the first rank of an element depends on where it sits in its slice, not in the whole array."""
    for _ in range(50):
        count, item, n = int(rng.integers(1, 20000)), int(rng.choice([2, 4, 8])), int(rng.integers(2, 9))
        one = [(lo, hi, s) for s, (lo, hi) in enumerate(segments(count, item, n)) if hi > lo]
        assert ring_fold_starts(count, item, n, 1) == one
        slices = int(rng.integers(2, 65))
        stretches = ring_fold_starts(count, item, n, slices)
        covered = np.zeros(count, dtype=int)
        for lo, hi, first in stretches:
            covered[lo:hi] += 1
            assert 0 <= first < n
        assert (covered == 1).all(), (count, item, n, slices)
    # 257 float32 over 64 rings and 4 ranks: every ring's first 16-byte unit starts at rank 0
    assert [first for lo, hi, first in ring_fold_starts(257, 4, 4, 64)].count(0) == 64


def test_segments_match_the_two_shot_pieces(rng):
    for _ in range(50):
        count, parts = int(rng.integers(1, 10_000)), int(rng.integers(1, 9))
        seg = segments(count, 4, parts)
        assert seg[0][0] == 0 and seg[-1][1] == count
        assert all(a[1] == b[0] for a, b in zip(seg, seg[1:], strict=False))


def test_a_missing_peer_is_named(spmd):
    """A team wait that times out names the peer and what it waited for (here rank 1 never enters the barrier)."""
    job = spmd(2, """
        import circuslink as cl
        from circuslink import collectives
        w = cl.init()
        comm = collectives.Comm(w, timeout=2)
        if w.rank == 0:
            try:
                comm.barrier()
            except cl.TimeoutError as exc:
                print("error:", exc)
        w.barrier(timeout=30)
        comm.close()
        w.close()
    """).check()
    assert ("error: collectives barrier on rank 0: rank 1's barrier flag (call 1) did not arrive: timed out after 2 s"
            in job.stdout), job.stdout


def test_bad_calls_are_one_line():
    import circuslink as cl
    from circuslink import collectives

    w = cl.init(backend="cpu")
    try:
        comm = collectives.Comm(w)
        x = np.zeros(6, dtype=np.float32)
        for call, match in [
            (lambda: comm.allreduce(x, algorithm="tree"), "algorithm='tree' is not one of oneshot, twoshot, ring"),
            (lambda: comm.allreduce(x, algorithm="oneshot"), "needs ranks that share memory"),
            (lambda: comm.allreduce(x, dtype="bfloat16"), "needs a uint16 array of bit patterns, got float32"),
            (lambda: comm.allreduce(x.view(np.uint16), dtype="half"), "dtype='half' is not supported"),
            (lambda: collectives.Comm(w, stage_bytes=1000), "stage_bytes=1000 must be a positive multiple of 4096"),
            (lambda: comm.device_team(), "device_team\\(\\) is for kernels"),
        ]:
            with pytest.raises(cl.ConfigError, match=match):
                call()
        assert not comm.shares_memory  # one rank: nothing to share, the rings serve
        assert comm.allreduce(x + 1, algorithm="ring").tolist() == [1.0] * 6
        comm.close()
    finally:
        w.close()


def test_oneshot_refuses_more_than_its_slots(spmd):
    job = spmd(2, """
        import numpy as np, circuslink as cl
        from circuslink import collectives
        w = cl.init()
        try:
            collectives.allreduce(w, np.zeros((64 << 10) // 4 + 1, dtype=np.float32), algorithm="oneshot")
        except cl.ConfigError as exc:
            print("error:", exc)
        w.close()
    """).check()
    assert job.stdout.count("error: allreduce: algorithm='oneshot' moves at most 65536 bytes per rank, not 65540") == 2
