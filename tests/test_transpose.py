"""Transposing puts (rma.declare_transpose_write), the device call, and the tile model.

The exchange body runs as 2 and 3 ranks: every rank sends every rank (itself included) one
transposing put of each element type (odd shapes, rows != cols, leading dimensions larger than
the block, offsets that are not multiples of 16, forced tiles that cut the block unevenly),
beside a contiguous and a block-stride write, all in one queue, for several cycles with fresh
random bytes. After each wait every rank rebuilds its whole window with numpy from the seeds
(poison, its own sources, every origin's pieces transposed) and compares byte for byte.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest
from conftest import BACKENDS, NVCC_TIMEOUT_S, on_backend

import circuslink as cl
from circuslink import rma
from circuslink.rma import _tile_model as tm

EXCHANGE = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma

MEMORY, CYCLES, LARGE, WANT_LAUNCH = {memory!r}, {cycles}, {large}, {want_launch!r}
SEED = int(os.environ["CIRCUSLINK_TEST_SEED"])
world = cl.init()
me, n = world.rank, world.size
ELEM = {{"float32": 4, "float64": 8, "complex64": 8, "complex128": 16}}
WORD = {{4: "<u4", 8: "<u8", 16: "V16"}}
# (dtype, rows, cols, src_ld, dst_ld, tile, misalign): misalign shifts offsets by one element.
PIECES = [
    ("float32", 7, 13, 15, 9, None, 1),
    ("float64", 11, 5, 6, 12, (8, 16), 1),       # a forced tile that cuts the block unevenly
    ("complex64", 9, 9, 9, 9, None, 0),          # square, leading dimensions equal to the block
    ("complex128", 5, 12, 14, 7, (16, 8), 0),
    ("float32", 33, 70, 80, 40, None, 3),         # several device tiles, partial at both edges
    ("complex128", 1, 6, 6, 3, None, 0),          # one row: a column at the target
]
if LARGE:  # 312 KB a target: auto launches the tiles as their own kernel node with a full wave of blocks
    PIECES.append(("complex64", 300, 130, 301, 310, None, 1))
PLAIN, STRIDED = 100, (5, 24, 40, 56)            # contiguous bytes; (count, block, src_stride, dst_stride)

def extent(rows, cols, ld, elem):
    return ((rows - 1) * ld + cols) * elem

def align(x):
    return (x + 15) // 16 * 16

# Source layout (same on every rank): per target, each piece, then the plain and strided writes.
SRC, at = {{}}, 0
for t in range(n):
    for j, (dt, r, c, sl, dl, tile, mis) in enumerate(PIECES):
        SRC[t, j] = at + mis * ELEM[dt]
        at = align(SRC[t, j] + extent(r, c, sl, ELEM[dt]))
    SRC[t, "plain"] = at
    at = align(at + PLAIN)
    SRC[t, "strided"] = at
    at = align(at + (STRIDED[0] - 1) * STRIDED[2] + STRIDED[1])
SRC_BYTES = at
# Destination layout (same on every rank): per origin, each piece, then the plain and strided writes.
DST, at = {{}}, SRC_BYTES
for o in range(n):
    for j, (dt, r, c, sl, dl, tile, mis) in enumerate(PIECES):
        DST[o, j] = at + mis * ELEM[dt]
        at = align(DST[o, j] + extent(c, r, dl, ELEM[dt]))
    DST[o, "plain"] = at
    at = align(at + PLAIN)
    DST[o, "strided"] = at
    at = align(at + (STRIDED[0] - 1) * STRIDED[3] + STRIDED[1])
NBYTES = at + 64

def poison(rank):
    return np.random.default_rng([SEED, 7, rank]).integers(0, 256, NBYTES, dtype=np.uint8)

def sources(rank, cycle):
    return np.random.default_rng([SEED, 11, rank, cycle]).integers(0, 256, SRC_BYTES, dtype=np.uint8)

def matrix(buf, off, rows, cols, ld, elem):
    words = buf[off: off + extent(rows, cols, ld, elem)].view(WORD[elem])
    return np.lib.stride_tricks.as_strided(words, (rows, cols), (ld * elem, elem), writeable=True)

win = rma.window_alloc(world, NBYTES, memory=MEMORY)
win.local[:] = world.xp.asarray(poison(me))
world.barrier()
q = rma.Queue.alloc(win)
for t in range(n):
    for j, (dt, r, c, sl, dl, tile, mis) in enumerate(PIECES):
        q.push(rma.declare_transpose_write(win, DST[me, j], dl, win, SRC[t, j], sl, r, c, dt, t, tile=tile))
    q.push(rma.declare_write(win, DST[me, "plain"], win, SRC[t, "plain"], PLAIN, t))
    count, block, ss, ds = STRIDED
    q.push(rma.declare_strided_write(win, DST[me, "strided"], win, SRC[t, "strided"], count, block, ss, ds, t))
    q.add_origin(t)
q.commit()
if WANT_LAUNCH and world.backend.name == "cuda":
    assert q.describe()["launch"] == WANT_LAUNCH, q.describe()

expected = poison(me)
for cycle in range(CYCLES):
    mine = sources(me, cycle)
    win.local[:SRC_BYTES] = world.xp.asarray(mine)
    q.start()
    q.wait()
    expected[:SRC_BYTES] = mine
    for o in range(n):
        src = sources(o, cycle)
        for j, (dt, r, c, sl, dl, tile, mis) in enumerate(PIECES):
            e = ELEM[dt]
            matrix(expected, DST[o, j], c, r, dl, e)[...] = matrix(src, SRC[me, j], r, c, sl, e).T
        expected[DST[o, "plain"]: DST[o, "plain"] + PLAIN] = src[SRC[me, "plain"]: SRC[me, "plain"] + PLAIN]
        count, block, ss, ds = STRIDED
        for i in range(count):
            d, s = DST[o, "strided"] + i * ds, SRC[me, "strided"] + i * ss
            expected[d: d + block] = src[s: s + block]
    got = win.local.get() if hasattr(win.local, "get") else win.local
    if not np.array_equal(got, expected):
        bad = np.nonzero(got != expected)[0]
        raise SystemExit(f"rank {{me}} cycle {{cycle}}: {{len(bad)}} bytes differ, first at {{bad[:8]}}")
print(f"rank {{me}} ok {{CYCLES}} cycles")
q.free()
win.free()
world.close()
"""


def _exchange(spmd, n: int, memory: str = "mapped", world_backend: str = "cpu", cycles: int = 3, large: bool = False,
              want_launch: str = "", **kw) -> None:
    job = spmd(n, EXCHANGE.format(memory=memory, cycles=cycles, large=large, want_launch=want_launch),
               backend=world_backend, **kw).check()
    assert job.output.count(f"ok {cycles} cycles") == n, job.output


# (world back-end, CIRCUSLINK_RMA_LAUNCH, ranks, cycles)
EXCHANGES = [on_backend("cpu", None, 2, 3), on_backend("cpu", None, 3, 3)] + [
    on_backend("cuda", launch, n, 20, marks=[pytest.mark.slow] if n == 4 else []) for launch in ("kernel", "graph")
    for n in (2, 4)]


@pytest.mark.parametrize("backend, launch, n, cycles", EXCHANGES)
def test_transposing_puts_beside_other_writes_are_byte_exact(spmd, backend, launch, n, cycles):
    env = {"CIRCUSLINK_RMA_LAUNCH": launch} if launch else None
    _exchange(spmd, n, world_backend=backend, cycles=cycles, env=env, timeout=300)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_transposing_puts_take_their_own_kernel_node_byte_exact(spmd, backend):
    """Past 256 KiB of transposing puts the default launch is the graph, the tiles a kernel node of a full wave of
    blocks after the node that waited for the targets' posts; still byte-exact beside the other writes."""
    _exchange(spmd, 2, world_backend=backend, cycles=5, large=True, want_launch="graph", timeout=300)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_mpi3_windows_transpose_with_derived_datatypes(spmd, backend):
    """MPI derived datatypes do the transpose; on a cuda world the source rows are staged through the host."""
    _exchange(spmd, 2, memory="mpi3", world_backend=backend, launcher="mpirun", timeout=300)


# -- the device call and device-driven queues (GPU) --------------------------------------------
DEVICE_CALL = r'''
import os
import numpy as np
import cupy as cp
import circuslink as cl
from circuslink import rma

SOURCE = r"""
#include <circuslink/transpose.cuh>
#include <circuslink/rma.cuh>
// Each block shape is legal: the call uses the block's linear thread index.
extern "C" __global__ void put_c16(double2* peer, unsigned long long dst_ld, const double2* mine,
                                   unsigned long long src_ld, unsigned long long rows, unsigned long long cols,
                                   unsigned int* flag) {
  circuslink::transpose_put(peer, dst_ld, mine, src_ld, rows, cols, blockIdx.x, gridDim.x);
  __syncthreads();
  __threadfence_system();
  if (threadIdx.x == 0 && threadIdx.y == 0) atomicAdd(flag, 1u);
}
// Any block shape drives the queue (the copies and the tiles use the linear thread index).
extern "C" __global__ void driven(circuslink::RmaHandle q, unsigned long long cycles, unsigned long long* out) {
  unsigned long long done = 0;
  for (unsigned long long c = 0; c < cycles; ++c) {
    if (!circuslink::rma_start(q)) break;
    if (!circuslink::rma_wait(q)) break;
    ++done;
  }
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) out[0] = done;
}
"""
UNAWARE = r"""
#include <circuslink/rma.cuh>
extern "C" __global__ void unaware(circuslink::RmaHandle q, unsigned long long* out) {
  out[0] = circuslink::rma_start(q) ? 1 : 0;
}
"""
world = cl.init()
me, n = world.rank, world.size
peer = (me + 1) % n
origin = (me - 1) % n
rows, cols, sld, dld = 45, 70, 77, 50
mod = cl.compile(SOURCE)
buf = world.alloc(2 * 77 * 77 * 16 + 256)
rng = np.random.default_rng([int(os.environ["CIRCUSLINK_TEST_SEED"]), me])
src_host = rng.standard_normal((rows, sld)) + 1j * rng.standard_normal((rows, sld))
mine = buf.view(cp.complex128)[: rows * sld].reshape(rows, sld)
mine[...] = cp.asarray(src_host)
flag = cp.zeros(1, dtype=cp.uint32)
world.barrier()
dst_ptr = buf.ptr(peer) + 77 * 77 * 16
origin_src = np.random.default_rng([int(os.environ["CIRCUSLINK_TEST_SEED"]), origin])
o = origin_src.standard_normal((rows, sld)) + 1j * origin_src.standard_normal((rows, sld))
# Several block shapes (multiples of the tile sides and not: both code paths), 3 blocks sharing the tiles.
for block in ((256, 1), (96, 1), (16, 6), (10, 7)):
    buf.view(cp.complex128)[77 * 77:] = 0          # my destination, cleared before the peer writes it
    cp.cuda.Device().synchronize()
    world.barrier()
    mod.get_function("put_c16")((3,), block, (np.uint64(dst_ptr), np.uint64(dld), mine, np.uint64(sld),
                                              np.uint64(rows), np.uint64(cols), flag))
    cp.cuda.Device().synchronize()
    world.barrier()
    got = buf.view(cp.complex128)[77 * 77: 77 * 77 + (cols - 1) * dld + rows].get()
    view = np.lib.stride_tricks.as_strided(got, (cols, rows), (dld * 16, 16))
    assert np.array_equal(view, o[:, :cols].T), f"rank {me} block {block}: wrong transpose"
    world.barrier()

# Device-driven queue with a transposing put and a strided write of odd sizes (byte copies): rma_start
# turns the tiles when transpose.cuh came first, and any block shape copies everything (partial warps too).
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
win = rma.window_alloc(world, 1 << 16)
win.local[:32768] = cp.asarray(np.random.default_rng([seed, 5, me]).integers(0, 256, 32768, dtype=np.uint8))
q = rma.Queue.alloc(win)
q.push(rma.declare_transpose_write(win, 32768, 40, win, 0, 33, 37, 31, "float32", peer))
q.push(rma.declare_strided_write(win, 40001, win, 20003, 9, 37, 61, 53, peer))
q.add_origin(origin)
q.commit()
handle = q.device_handle()
from circuslink.rma._layout import HANDLE
assert handle.dtype == HANDLE.dtype and int(handle["queue"]) != 0
o_src = np.random.default_rng([seed, 5, origin]).integers(0, 256, 32768, dtype=np.uint8)
s = np.lib.stride_tricks.as_strided(o_src.view("<u4"), (37, 31), (33 * 4, 4))
out = cp.zeros(1, dtype=cp.uint64)
for block in ((256, 1, 1), (40, 1, 1), (16, 6, 1), (10, 7, 1), (8, 4, 3)):
    win.local[32768:] = 0                          # what the peer writes, cleared first
    cp.cuda.Device().synchronize()
    world.barrier()
    mod.get_function("driven")((1,), block, (handle, np.uint64(10), out))
    cp.cuda.Device().synchronize()
    q.check_device()
    assert int(out.get()[0]) == 10, block
    world.barrier()
    got = win.local.get()
    d = np.lib.stride_tricks.as_strided(got[32768:].view("<u4"), (31, 37), (40 * 4, 4))
    assert np.array_equal(d, s.T), f"rank {me} block {block}: device-driven transposing put wrong"
    for i in range(9):
        want = o_src[20003 + 61 * i: 20003 + 61 * i + 37]
        assert np.array_equal(got[40001 + 53 * i: 40001 + 53 * i + 37], want), f"rank {me} block {block}: write {i}"
        if i < 8:
            assert not got[40001 + 53 * i + 37: 40001 + 53 * (i + 1)].any(), f"rank {me} block {block}: gap {i}"
    world.barrier()
# Compiled without transpose.cuh: rma_start refuses the queue and check_device says why.
world.barrier()
cl.compile(UNAWARE).get_function("unaware")((1,), (64,), (q.device_handle(), out))
cp.cuda.Device().synchronize()
try:
    q.check_device()
    raise SystemExit("no error for a kernel compiled without transposing puts")
except cl.RmaError as exc:
    assert "#include <circuslink/transpose.cuh> before <circuslink/rma.cuh>" in str(exc), exc
world.barrier()
print(f"rank {me} device ok")
world.close()
'''


@pytest.mark.gpu
def test_device_call_and_device_driven_transposing_queue(spmd):
    job = spmd(2, DEVICE_CALL, backend="cuda", timeout=300).check()
    assert job.output.count("device ok") == 2, job.output


LOCAL = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma
world = cl.init()
xp = world.xp
rng = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))
for dtype in ("float32", "float64", "complex64", "complex128"):
    for tile in (None, (8, 32), (32, 8)):
        big = xp.asarray(rng.standard_normal((70, 90)).astype(dtype))
        src = big[3:53, 5:82]                 # a view: leading dimension 90, not the width
        out = xp.zeros((100, 60), dtype=dtype)
        dst = out[10:87, 2:52]
        plan = rma.plan_local_transpose(world, dst, src, tile=tile)
        plan()
        world.backend.synchronize()  # the plan runs on the world's stream without waiting: wait for it
        got = out.get() if hasattr(out, "get") else out
        want = np.zeros((100, 60), dtype=dtype)
        want[10:87, 2:52] = (big.get() if hasattr(big, "get") else big)[3:53, 5:82].T
        assert np.array_equal(got, want), (dtype, tile)
print("local ok")
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_local_transpose_plan(spmd, backend):
    job = spmd(1, LOCAL, backend=backend).check()
    assert "local ok" in job.output


# -- bad declarations (in this process: a world of one rank) ------------------------------------
@pytest.fixture(scope="module")
def world():
    return cl.init(backend="cpu")


@pytest.fixture
def win(world):
    w = rma.window_alloc(world, 4096)
    yield w
    w.free()


def _declare(win, **kw):
    args = dict(dst_window=win, dst_offset=2048, dst_ld=8, src_window=win, src_offset=0, src_ld=8, rows=8, cols=8,
                dtype="float32", dst_rank=0)
    args.update(kw)
    return rma.declare_transpose_write(**args)


@pytest.mark.parametrize("kw, message", [
    ({"dtype": "int16"}, r"dtype 'int16' is not supported: use float32, float64, complex64 or complex128"),
    ({"dtype": np.float16}, r"dtype <class 'numpy.float16'> is not supported"),
    ({"dtype": "nonsense"}, r"dtype 'nonsense' is not supported"),
    ({"rows": 0}, r"rows=0 must be >= 1"),
    ({"cols": 2.5}, r"cols must be an integer, got 2.5"),
    ({"src_ld": 7}, r"src_ld=7 is smaller than cols=8 \(source rows would overlap\)"),
    ({"dst_ld": 4}, r"dst_ld=4 is smaller than rows=8 \(destination rows would overlap\)"),
    ({"dst_offset": 4000}, r"handle #\d+ \(transpose 8 x 8 float32.*\) ends at byte 4256, past the end of "
                           r"dst_window \d+ \(4096 B\)"),
    ({"src_offset": 3900, "dst_offset": 0}, r"handle #\d+ \(transpose .*reads up to byte 4156 \(src_offset 3900\), "
                                            r"past the end of src_window"),
    ({"dst_offset": 2050}, r"dst_offset=2050 is not a multiple of the 4-byte float32 element"),
    ({"src_offset": 8, "dtype": "complex128", "dst_offset": 2048}, r"src_offset=8 is not a multiple of the 16-byte"),
    ({"dst_rank": 1}, r"dst_rank=1 is out of range for a world of 1 ranks"),
    ({"tile": (3, 8)}, r"tile=\(3, 8\) must be two powers of two"),
    ({"tile": (128, 128)}, r"tile=\(128, 128\) of 4-byte elements needs 66048 B of shared memory"),
    ({"dst_offset": 16}, r"handle #\d+ .* reads and writes the same bytes of rank 0's window \d+: an in-place "
                         r"transpose is not supported"),
    ({"dst_window": "win"}, r"dst_window must be a Window from rma.window_alloc, got str"),
])
def test_bad_declarations_say_what_is_wrong(win, kw, message):
    with pytest.raises(cl.RmaError, match=message) as info:
        _declare(win, **kw)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("declare_transpose_write: ")


def test_overlap_with_another_handle_names_both(win):
    q = rma.Queue.alloc(win)
    plain = rma.declare_write(win, 2048 + 5 * 32, win, 1024, 8, 0)    # lands inside the transpose's row 5
    t = _declare(win)
    q.push(plain)
    with pytest.raises(cl.RmaError, match=rf"push: handle #{t.id} \(transpose 8 x 8 float32.* overlaps handle "
                                          rf"#{plain.id} \(8 B to rank 0"):
        q.push(t)
    # Apart by the leading dimension: the transposes' rows interleave without touching.
    q2 = rma.Queue.alloc(win)
    q2.push(_declare(win, dst_ld=16, rows=8))
    q2.push(_declare(win, dst_offset=2048 + 32, dst_ld=16, rows=8, src_offset=512))
    q.free()
    q2.free()


def test_self_transpose_in_one_rank_world(world, win, rng):
    win.local[:] = rng.integers(0, 256, 4096, dtype=np.uint8)
    q = rma.Queue.alloc(win)
    q.push(_declare(win, rows=6, cols=10, src_ld=12, dst_ld=7, dtype="complex64"))
    q.add_origin(0)
    q.commit()
    for _ in range(2):
        src = rng.standard_normal((6, 12)) + 1j * rng.standard_normal((6, 12))
        win.local[:6 * 12 * 8] = src.astype(np.complex64).view(np.uint8).ravel()
        q.start()
        q.wait()
        got = np.lib.stride_tricks.as_strided(win.local[2048:].view(np.complex64), (10, 6), (7 * 8, 8))
        assert np.array_equal(got, src.astype(np.complex64)[:, :10].T)
    q.free()


def test_abi_tables_match_the_header(tmp_path):
    """The descriptor tables the host packs against detail/transpose_types.cuh (static_assert, nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    from circuslink import _abi
    from circuslink.device_code import include_dir
    from circuslink.rma._transpose import _cuda

    src = tmp_path / "abi.cu"
    src.write_text(_abi.static_asserts([_cuda.TRANSPOSE_DESCRIPTOR, _cuda.TRANSPOSE_CHAIN]))
    proc = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{include_dir()}", "-c", str(src), "-o",
                           str(tmp_path / "abi.o")], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


def test_transpose_tiles_are_the_back_ends_candidates(world):
    tiles = rma.transpose_tiles(world, "complex64")
    assert tiles and all(m & (m - 1) == 0 and n & (n - 1) == 0 for m, n in tiles)
    assert all(m * (n + 1) * 8 <= 18432 for m, n in tiles)  # every one is a tile= the declaration accepts
    assert (256, 16) in rma.transpose_tiles(world, "float32")  # the cpu back-end's larger candidates
    with pytest.raises(cl.RmaError, match="transpose_tiles: dtype 'int8' is not supported"):
        rma.transpose_tiles(world, "int8")
    picks = tm.calibration_tiles(tiles)
    assert set(picks) <= set(tiles) and len(picks) == len(set(picks)) >= 3
    aspects = [m / n for m, n in picks]
    assert min(aspects) == min(m / n for m, n in tiles) and max(aspects) == max(m / n for m, n in tiles)


def test_shared_memory_pitch_avoids_bank_conflicts():
    from circuslink.rma._transpose import _cuda

    # The unpadded pitch of a 32 x 32 float tile is the textbook 32-way conflict; n + 1 removes it.
    assert _cuda.bank_conflicts(32, 32, 4, 32) == 32
    assert _cuda.bank_conflicts(32, 32, 4, 33) == 1
    for elem in (4, 8, 16):
        tiles = _cuda.tile_candidates(elem)
        assert tiles
        for m, n in tiles:
            pitch = _cuda.pick_pitch(m, n, elem)
            assert n <= pitch and m * pitch * elem <= 18432
            assert _cuda.bank_conflicts(m, n, elem, pitch) <= 2


# -- the tile model -------------------------------------------------------------------------------
TRUE = tm.TileModel(b_ideal=1.5e12, x_read=96.0, x_write=48.0, k=4e-9, t0=6e-6, efficiency=0.92)


def _samples(model, tiles, elem, shapes, noise=0.0, rng=None):
    out = []
    for rows, cols in shapes:
        for tile in tiles:
            t = model.time(tile, elem, rows, cols)
            if noise:
                t *= 1 + noise * rng.standard_normal()
            out.append(tm.Sample(tile, elem, rows, cols, t))
    return out


def test_uzura_equations():
    m = tm.TileModel(b_ideal=850e6, x_read=16.0, x_write=16.0, k=0.0)
    # Burst efficiency c*w / (c*w + X) and B_io at the balance: UZURA's formula with X = 2 X_n.
    assert tm.TileModel.burst_efficiency(64, 16) == pytest.approx(0.8)
    assert m.b_io(32, 32, 4) == pytest.approx(850e6 * 128 / (128 + 32))
    # The start-up cost k per tile: B_actual = M / (M / B_io + k).
    mk = tm.TileModel(b_ideal=850e6, x_read=16.0, x_write=16.0, k=1e-6)
    tile = 32 * 32 * 4
    assert mk.b_actual(32, 32, 4) == pytest.approx(tile / (tile / m.b_io(32, 32, 4) + 1e-6))
    assert mk.b_actual(64, 64, 4) > mk.b_actual(32, 32, 4) > mk.b_actual(16, 16, 4)
    # Balance m = (X_m / X_n) n: with write bursts twice as costly the best tile of a fixed
    # buffer has twice the rows (write bursts m long), and it predicts the most.
    skew = tm.TileModel(b_ideal=1e12, x_read=20.0, x_write=40.0, k=0.0)
    assert skew.balanced_rows(32) == pytest.approx(64)
    same_buffer = [(16, 128), (32, 64), (64, 32), (128, 16)]
    best = max(same_buffer, key=lambda t: skew.b_io(*t, 4))
    assert best == (64, 32)


def test_whole_put_time_counts_partial_tiles():
    m = tm.TileModel(b_ideal=1e12, x_read=10.0, x_write=20.0, k=1e-8, t0=1e-6)
    rows, cols, elem = 100, 70, 8
    across, down = math.ceil(70 / 32), math.ceil(100 / 16)
    want = 1e-6 + (rows * cols * elem + rows * across * 10 + cols * down * 20) / 1e12 + across * down * 1e-8
    assert m.time((16, 32), elem, rows, cols) == pytest.approx(want)
    assert m.bandwidth((16, 32), elem, rows, cols) == pytest.approx(rows * cols * elem / want)


def test_fit_recovers_known_constants(rng):
    tiles = [(8, 128), (128, 8), (32, 32), (16, 16), (64, 32), (16, 64)]
    shapes = [(2048, 2048), (512, 1024), (4096, 1024)]
    fitted = tm.fit(_samples(TRUE, tiles, 4, shapes), b_ideal=TRUE.b_ideal)
    assert fitted.efficiency == pytest.approx(TRUE.efficiency, rel=1e-6)
    assert fitted.x_read == pytest.approx(TRUE.x_read, rel=1e-5)
    assert fitted.x_write == pytest.approx(TRUE.x_write, rel=1e-5)
    assert fitted.k == pytest.approx(TRUE.k, rel=1e-5)
    assert fitted.t0 == pytest.approx(TRUE.t0, rel=1e-5)
    # With 1% noise the predictions stay within a few percent everywhere.
    noisy = tm.fit(_samples(TRUE, tiles, 4, shapes, noise=0.01, rng=rng), b_ideal=TRUE.b_ideal)
    for err in tm.errors(noisy, _samples(TRUE, tm.candidates(4, 18432), 4, shapes)):
        assert abs(err) < 0.05


def test_fit_clamps_to_the_floor_and_refuses_too_little():
    fast = tm.fit(_samples(TRUE, [(32, 32), (8, 128), (128, 8)], 4, [(1024, 1024), (256, 256)]), b_ideal=1e12)
    assert fast.efficiency == pytest.approx(1.0)  # measured faster than the floor allows: clamped
    with pytest.raises(cl.ConfigError, match="at least 2 measured puts"):
        tm.fit([tm.Sample((32, 32), 4, 64, 64, 1e-6)], b_ideal=1e12)
    with pytest.raises(cl.ConfigError, match="b_ideal must be a positive bandwidth"):
        tm.fit([], b_ideal=0)


def test_choose_picks_the_best_and_autotunes_when_unsure():
    tm.forget_choices()
    tiles = tm.candidates(4, 18432)
    ranked = tm.rank_tiles(TRUE, tiles, 4, 4096, 4096)
    assert ranked[0][1] == max(TRUE.bandwidth(t, 4, 4096, 4096) for t in tiles)
    assert tm.choose(TRUE, tiles, 4, 4096, 4096) == ranked[0][0]
    # Unsure (top candidates within 10%): the measured fastest wins, and the choice is cached.
    close = [t for t, bw in ranked if bw >= 0.9 * ranked[0][1]]
    assert len(close) > 1
    slow_best = close[-1]
    calls = []

    def measure(tile):
        calls.append(tile)
        return 1.0 if tile == slow_best else 2.0

    key = ("test", "float32", 4096, 4096)
    assert tm.choose(TRUE, tiles, 4, 4096, 4096, key=key, measure=measure) == slow_best
    assert sorted(calls) == sorted(close)
    assert tm.choose(TRUE, tiles, 4, 4096, 4096, key=key, measure=measure) == slow_best
    assert len(calls) == len(close)  # cached: not measured again
    # Sure (one clear winner): no measurement.
    clear = [(8, 32), (64, 64)]
    assert tm.choose(TRUE, clear, 4, 4096, 4096, measure=lambda t: pytest.fail("measured")) == (64, 64)
    tm.forget_choices()


# -- the benchmark (smoke: quick, cpu) ------------------------------------------------------------
def test_bench_transpose_verification_catches_wrong_bytes(world, rng):
    """Every case checks the bytes that arrived: one wrong element fails the run."""
    from circuslink.bench.transpose import _Bench

    results = type("R", (), {"add": lambda self, **kw: kw, "rows": []})()
    bench = _Bench(world, 64 << 10, 1, 0, 1, results)
    try:
        for dtype, rows, cols in (("float32", 64, 32), ("complex128", 16, 8)):
            bench._fill(rows * cols * np.dtype(dtype).itemsize)
            q = bench._transpose_queue(dtype, rows, cols)
            q.start()
            q.wait()
            bench._verify(dtype, rows, cols, True, "transposing put")
            with pytest.raises(cl.RmaError, match=rf"received wrong bytes from rank 0 \(plain, {rows} x {cols} "):
                bench._verify(dtype, rows, cols, False, "plain")  # the untransposed layout is not what arrived
            at = bench.dst + int(rng.integers(rows * cols * np.dtype(dtype).itemsize))
            bench.win.local[at] ^= np.uint8(1 + rng.integers(255))
            with pytest.raises(cl.RmaError, match=rf"\(transposing put, {rows} x {cols} {dtype}\)"):
                bench._verify(dtype, rows, cols, True, "transposing put")
            q.free()
    finally:
        bench.close()
def test_bench_transpose_quick(tmp_path, world):
    import json
    import os
    import sys

    out = tmp_path / "tr.json"
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "transpose", "--quick", "--backend", "cpu",
                           "--dtypes", "float32,complex128", "--json", str(out), "--plot", str(tmp_path / "tr.png")],
                          capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    impls = {r["impl"] for r in res["rows"]}
    assert impls == {"transpose-put", "contiguous-put", "local-transpose+put", "model"}
    # The cpu back-end moves an unforced put whole (the tile the queue's describe() reports).
    assert {r["tile"] for r in res["rows"] if r["impl"] == "transpose-put"} == {"whole"}
    for dtype in ("float32", "complex128"):
        model = [r for r in res["rows"] if r["impl"] == "model" and r["dtype"] == dtype]
        assert sum(bool(r["pick"]) for r in model) == 1, model
        assert {r["tile"] for r in model} >= {f"{m}x{n}" for m, n in rma.transpose_tiles(world, dtype)}
    assert any(r.get("in_fit") for r in res["rows"]) and any(r.get("in_fit") is False for r in res["rows"])
    assert set(res["meta"]["models"]) == {"float32", "complex128"}
    assert res["floor"]["pairs"] and (tmp_path / "tr.png").exists() and not list(tmp_path.glob("tr-*"))
