"""RMA queues: the same bodies on every back-end (cpu here; cuda on the device machine) and on MPI-3 windows.

The exchange tests run one body at 2 and 4 ranks: a ring where every rank writes
contiguous and block-stride pieces to both neighbours, with fresh random data every
cycle (seeded by CIRCUSLINK_TEST_SEED). After each wait() every rank rebuilds, from the
seeds alone, what its whole window must hold (the poison it started with, its own new
source bytes, its neighbours' writes) and compares byte for byte, so a write that lands
wrong, short, twice or outside its blocks fails.

Then: validation (one-line errors), time-outs (which limit reaches which wait, and what the
error names), the lifecycle (close, ``with``, release on error, nothing left after a failing
commit or free), the public hooks (describe, stream/block on windows without streams) and the
device handle's ABI table.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import BACKENDS, NVCC_TIMEOUT_S, on_backend

import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import CHUNK_BYTES

# (world back-end, CIRCUSLINK_RMA_LAUNCH): the cuda back-end's two launch methods
LAUNCHES = [on_backend("cpu", None), on_backend("cuda", "kernel"), on_backend("cuda", "graph")]

# The ring body. WINDOW layout per rank: [0, 4096) my sources, [4096, 8192) what my
# neighbours write into me; everything else keeps its poison.
RING = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import CHUNK_BYTES

MEMORY, CYCLES, POST_AT = {memory!r}, {cycles}, {post_at!r}
SEED = int(os.environ["CIRCUSLINK_TEST_SEED"])
world = cl.init()
me, n = world.rank, world.size
right, left = (me + 1) % n, (me - 1) % n
NBYTES = 8192
# (src_offset, count, block, src_stride, dst_offset, dst_stride, to): "right" or "left"
PIECES = [
    (0, 1, 100, 100, 4096, 100, "right"),        # contiguous
    (200, 7, 24, 40, 4300, 64, "right"),        # block-stride: halo-like columns
    (600, 1, 333, 333, 6144, 333, "left"),
    (1000, 5, 3, 3, 6600, 17, "left"),          # packed source, strided destination
    (1104, 3, 256, 512, 7008, 304, "left"),     # 16-byte aligned blocks
]

def poison(rank):
    return np.random.default_rng([SEED, 7, rank]).integers(0, 256, NBYTES, dtype=np.uint8)

def sources(rank, cycle):
    return np.random.default_rng([SEED, 11, rank, cycle]).integers(0, 256, 4096, dtype=np.uint8)

def blocks(off, count, block, stride):
    return np.concatenate([np.arange(off + i * stride, off + i * stride + block) for i in range(count)])

win = rma.window_alloc(world, NBYTES, memory=MEMORY)
win.local[:] = world.xp.asarray(poison(me))
world.barrier()
q = rma.Queue.alloc(win)
for so, count, block, ss, do, ds, to in PIECES:
    dst = right if to == "right" else left
    if count == 1:
        h = rma.declare_write(win, do, win, so, block, dst)
    else:
        h = rma.declare_strided_write(win, do, win, so, count, block, ss, ds, dst)
    q.push(h)
for o in sorted({{left, right}}):
    q.add_origin(o)
q.commit(post_at=POST_AT)

expected = poison(me)
for cycle in range(CYCLES):
    mine = sources(me, cycle)
    win.local[:4096] = world.xp.asarray(mine)
    q.start()
    q.wait()
    expected[:4096] = mine
    for so, count, block, ss, do, ds, to in PIECES:
        origin = left if to == "right" else right   # who writes this piece into me
        src = sources(origin, cycle)
        expected[blocks(do, count, block, ds)] = src[blocks(so, count, block, ss)]
    got = win.local.get() if hasattr(win.local, "get") else win.local
    if not np.array_equal(got, expected):
        bad = np.nonzero(got != expected)[0]
        raise SystemExit(f"rank {{me}} cycle {{cycle}}: {{len(bad)}} bytes differ, first at {{bad[:8]}}")
    if POST_AT == "wait":
        world.barrier()  # post_at=wait lets origins write the next epoch once my wait returns
q.free()
win.free()
left = [r for r in world.resources() if isinstance(r, cl.SymmetricBuffer | rma.Window | rma.Queue)]
assert not left, left   # the queue's counters and the window's buffer went too
world.close()
print(f"rank {{me}} ok {{CYCLES}} cycles")
"""


def _ring(spmd, n, cycles, memory="mapped", post_at="start", launcher="circuslink", world_backend="cpu", launch=None,
          env=None):
    code = RING.format(memory=memory, cycles=cycles, post_at=post_at)
    env = dict(env or {})
    if launch:
        env["CIRCUSLINK_RMA_LAUNCH"] = launch
    job = spmd(n, code, backend=world_backend, launcher=launcher, timeout=300, env=env).check()
    assert job.output.count(f"ok {cycles} cycles") == n, job.output


@pytest.mark.parametrize("backend, launch", LAUNCHES)
@pytest.mark.parametrize("n", [2, 4])
def test_ring_exchange_is_byte_exact(spmd, backend, launch, n):
    _ring(spmd, n, cycles=20, world_backend=backend, launch=launch)


@pytest.mark.slow
@pytest.mark.parametrize("backend, launch", LAUNCHES)
@pytest.mark.parametrize("n", [2, 4])
def test_thousand_cycles_with_changing_data(spmd, backend, launch, n):
    _ring(spmd, n, cycles=1000, world_backend=backend, launch=launch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_at_wait(spmd, backend):
    _ring(spmd, 2, cycles=50, post_at="wait", world_backend=backend)


# Queues one after another on one window. Each queue's epochs count from where the last one on its
# counters left off; a freed queue's memory (its chain, its graph, its counters) may come back to the
# next one from a pool. Every rank rebuilds its whole window from the seeds across all queues: a later
# queue that writes a freed queue's region, or whose wait returns before its writes land, fails.
SUCCESSIVE = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import CHUNK_BYTES

SEED = int(os.environ["CIRCUSLINK_TEST_SEED"])
world = cl.init()
me, n = world.rank, world.size
right, left = (me + 1) % n, (me - 1) % n
win = rma.window_alloc(world, 1 << 14)
expected = np.random.default_rng([SEED, 5, me]).integers(0, 256, 1 << 14, dtype=np.uint8)
win.local[:] = world.xp.asarray(expected)
world.barrier()
# (writes (src, dst, count, block, src_stride, dst_stride), post_at): the third queue overwrites part of
# the first one's region, the second one is 16-byte words only.
QUEUES = [([(i * 16, 8192 + i * 24, 1, 8, 8, 8) for i in range(8)] + [(512, 8992, 5, 8, 24, 40)], "start"),
          ([(1024 + i * 64, 12288 + i * 48, 1, 32, 32, 32) for i in range(4)] + [(2048, 12800, 3, 16, 48, 32)],
           "wait"),
          ([(3000, 8200, 1, 100, 100, 100), (3200, 9100, 4, 40, 50, 64)], "start")]
for k, (writes, post_at) in enumerate(QUEUES):
    q = rma.Queue.alloc(win)
    for src, dst, count, block, ss, ds in writes:
        if count == 1:
            q.push(rma.declare_write(win, dst, win, src, block, right))
        else:
            q.push(rma.declare_strided_write(win, dst, win, src, count, block, ss, ds, right))
    q.add_origin(left)
    q.commit(post_at=post_at, timeout=30)
    for cycle in range(20):
        mine = np.random.default_rng([SEED, k, cycle, me]).integers(0, 256, 4096, dtype=np.uint8)
        theirs = np.random.default_rng([SEED, k, cycle, left]).integers(0, 256, 4096, dtype=np.uint8)
        win.local[:4096] = world.xp.asarray(mine)
        expected[:4096] = mine
        q.start()
        q.wait()
        for src, dst, count, block, ss, ds in writes:
            for b in range(count):
                expected[dst + b * ds: dst + b * ds + block] = theirs[src + b * ss: src + b * ss + block]
        got = win.local.get() if hasattr(win.local, "get") else np.asarray(win.local)
        bad = np.flatnonzero(got != expected)
        assert not len(bad), f"rank {me} queue {k} cycle {cycle}: {len(bad)} bytes differ, first at {bad[:8]}"
        world.barrier()  # every rank has read this epoch before anyone's next start overwrites it
    q.free()
win.free()
world.close()
print(f"rank {me} successive queues ok")
"""


@pytest.mark.parametrize("backend, launch", LAUNCHES)
@pytest.mark.parametrize("n", [2, 3])
def test_successive_queues_on_one_window_are_byte_exact(spmd, backend, launch, n):
    env = {"CIRCUSLINK_RMA_LAUNCH": launch} if launch else {}
    job = spmd(n, SUCCESSIVE, backend=backend, timeout=300, env=env).check()
    assert job.output.count("successive queues ok") == n, job.output


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_ring_exchange_is_byte_exact(spmd, backend, n):
    """MPI-3 windows; on a cuda world they stage through host memory."""
    _ring(spmd, n, cycles=20, memory="mpi3", launcher="mpirun", world_backend=backend)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_thousand_cycles(spmd, n):
    _ring(spmd, n, cycles=1000, memory="mpi3", launcher="mpirun")


@pytest.mark.mpi
def test_mpi_ring_without_single_copy_transport(spmd):
    """The device machines' Open MPI runs with btl_vader_single_copy_mechanism=none, where
    MPI_Win_create over a user buffer fails (MPI_ERR_WIN); our windows must still work."""
    _ring(spmd, 2, cycles=20, memory="mpi3", launcher="mpirun",
          env={"OMPI_MCA_btl_vader_single_copy_mechanism": "none"})


@pytest.mark.mpi
def test_cpu_queue_under_mpirun(spmd):
    """The cpu back-end's windows do not care who launched the ranks."""
    _ring(spmd, 2, cycles=20, launcher="mpirun")


# -- validation, in this process (a world of one rank may write to itself) ---------------------
@pytest.fixture(scope="module")
def world():
    w = cl.init(backend="cpu")
    yield w


@pytest.fixture
def win(world):
    w = rma.window_alloc(world, 1024)
    yield w
    w.free()


def test_self_write_in_one_rank_world(world, win, rng):
    win.local[:] = rng.integers(0, 256, 1024, dtype=np.uint8)
    before = win.local.copy()
    q = rma.Queue.alloc(win)
    q.push(rma.declare_strided_write(win, 512, win, 0, 4, 16, 32, 48, 0))
    q.add_origin(0)
    q.commit()
    for _ in range(3):
        win.local[:128] = rng.integers(0, 256, 128, dtype=np.uint8)
        src = win.local[:128].copy()
        q.start()
        q.wait()
        expect = before.copy()
        expect[:128] = src
        for i in range(4):
            expect[512 + 48 * i: 512 + 48 * i + 16] = src[32 * i: 32 * i + 16]
        assert np.array_equal(win.local, expect)
    q.free()


def test_a_cycle_is_a_start_and_its_wait(world, win, rng):
    """cycle(): one epoch, start then wait, from the same state rules (on a device, cycle(stream=) enqueues both as
    one launch: tests/test_rma_cuda.py and bench rma's graphed rows)."""
    q = rma.Queue.alloc(win)
    q.push(rma.declare_write(win, 256, win, 0, 64, 0))
    q.add_origin(0)
    with pytest.raises(cl.RmaError, match=r"start before commit on rma queue"):
        q.cycle()
    q.commit()
    for epoch in (1, 2, 3):
        win.local[:64] = rng.integers(0, 256, 64, dtype=np.uint8)
        q.cycle()
        assert np.array_equal(win.local[256:320], win.local[:64]) and q.epoch == epoch
        assert q.describe()["state"] == "committed"
    q.start()
    with pytest.raises(cl.RmaError, match="epoch 4 was started and not waited for"):
        q.cycle()
    q.wait()
    with pytest.raises(cl.RmaError, match=r"cycle\(stream=\) on rma queue .*: the mapped \(cpu\) window runs on the "
                                          r"host and has no streams"):
        q.cycle(stream=object())
    assert q.epoch == 4 and q.describe()["state"] == "committed"  # refused before anything moved
    q.free()


def test_offsets_outside_the_window(win):
    with pytest.raises(cl.RmaError, match=r"ends at byte 1025, past the end of dst_window .*1024 B"):
        rma.declare_write(win, 1000, win, 0, 25, 0)
    with pytest.raises(cl.RmaError, match=r"reads up to byte 1030 \(src_offset 1000\).*1024 B"):
        rma.declare_write(win, 0, win, 1000, 30, 0)
    with pytest.raises(cl.RmaError, match=r"handle #\d+ \(3 x 8 B .*past the end of dst_window"):
        rma.declare_strided_write(win, 1000, win, 0, 3, 8, 8, 16, 0)
    with pytest.raises(cl.RmaError, match="dst_offset=-1 must be >= 0"):
        rma.declare_write(win, -1, win, 0, 8, 0)
    with pytest.raises(cl.RmaError, match="nbytes=0 must be >= 1"):
        rma.declare_write(win, 0, win, 0, 0, 0)


def test_bad_strides_and_types(win):
    with pytest.raises(cl.RmaError, match="dst_stride=4 is smaller than block_bytes=8"):
        rma.declare_strided_write(win, 0, win, 0, 2, 8, 8, 4, 0)
    with pytest.raises(cl.RmaError, match="src_stride=2 is smaller than block_bytes=8"):
        rma.declare_strided_write(win, 0, win, 0, 2, 8, 2, 8, 0)
    with pytest.raises(cl.RmaError, match="dst_window must be a Window"):
        rma.declare_write(np.zeros(8), 0, win, 0, 8, 0)
    with pytest.raises(cl.RmaError, match="count must be an integer"):
        rma.declare_strided_write(win, 0, win, 0, 2.0, 8, 8, 8, 0)


def test_rank_out_of_range(win):
    with pytest.raises(cl.RmaError, match="dst_rank=1 is out of range for a world of 1 ranks"):
        rma.declare_write(win, 0, win, 0, 8, 1)
    q = rma.Queue.alloc(win)
    with pytest.raises(cl.RmaError, match="add_origin: rank -1 is out of range"):
        q.add_origin(-1)
    q.add_origin(0)
    with pytest.raises(cl.RmaError, match="rank 0 is already an origin"):
        q.add_origin(0)


def test_overlapping_writes_name_both_handles(win):
    q = rma.Queue.alloc(win)
    a = rma.declare_strided_write(win, 100, win, 0, 4, 8, 8, 32, 0)   # [100,108) [132,140) ...
    q.push(a)
    q.push(rma.declare_write(win, 108, win, 0, 24, 0))               # fits exactly between blocks
    b = rma.declare_write(win, 139, win, 0, 2, 0)                     # hits [132,140)
    with pytest.raises(cl.RmaError, match=rf"handle #{b.id} .* overlaps handle #{a.id} "):
        q.push(b)
    c = rma.declare_strided_write(win, 300, win, 0, 2, 4, 4, 8, 0)   # [300,304) [308,312): clear
    q.push(c)
    with pytest.raises(cl.RmaError, match="already in"):
        q.push(c)
    d = rma.declare_strided_write(win, 190, win, 0, 2, 4, 4, 8, 0)   # [190,194) [198,202) hits [196,204)
    with pytest.raises(cl.RmaError, match=rf"handle #{d.id} .* overlaps handle #{a.id} "):
        q.push(d)


def test_state_machine_errors(win):
    q = rma.Queue.alloc(win)
    q.push(rma.declare_write(win, 0, win, 512, 8, 0))
    q.add_origin(0)
    with pytest.raises(cl.RmaError, match=r"start before commit on rma queue \d+ of window \d+ on rank 0"):
        q.start()
    with pytest.raises(cl.RmaError, match="wait without start"):
        q.wait()
    q.commit()
    with pytest.raises(cl.RmaError, match="push after commit"):
        q.push(rma.declare_write(win, 64, win, 512, 8, 0))
    with pytest.raises(cl.RmaError, match="add_origin after commit"):
        q.add_origin(0)
    with pytest.raises(cl.RmaError, match="already committed"):
        q.commit()
    with pytest.raises(cl.RmaError, match="wait without start"):
        q.wait()
    q.start()
    with pytest.raises(cl.RmaError, match="epoch 1 was started and not waited for"):
        q.start()
    with pytest.raises(cl.RmaError, match="while epoch 1 is in flight"):
        q.clear()
    with pytest.raises(cl.RmaError, match=r"free on rma queue \d+ of window \d+ on rank 0 while epoch 1 is in flight"):
        q.free()
    with pytest.raises(cl.RmaError, match=r"free on window \d+: rma queue \d+ of window \d+ on rank 0 has epoch 1 "
                                          r"in flight: call wait\(\) first"):
        win.free()
    assert not q.closed and not win.closed  # refused: nothing happened
    q.wait()
    q.clear()  # back to open: a new chain, counters keep counting
    q.push(rma.declare_write(win, 64, win, 512, 8, 0))
    q.add_origin(0)
    q.commit()
    q.start()
    q.wait()
    assert q.epoch == 2
    q.free()
    assert q.closed
    for op in (q.start, q.wait, q.clear, q.commit, lambda: q.push(None), lambda: q.add_origin(0), q.device_handle,
               q.check_device):
        with pytest.raises(cl.RmaError, match="has been freed"):
            op()
    q.free()  # idempotent
    q.close()


def test_push_checks_the_window(world, win):
    other = rma.window_alloc(world, 64)
    q = rma.Queue.alloc(win)
    with pytest.raises(cl.RmaError, match=r"writes into window \d+, but rma queue \d+ of window \d+ belongs"):
        q.push(rma.declare_write(other, 0, win, 0, 8, 0))
    with pytest.raises(cl.RmaError, match="expected a MsgHandle"):
        q.push("not a handle")
    other.free()
    with pytest.raises(cl.RmaError, match="has been freed"):
        rma.declare_write(other, 0, win, 0, 8, 0)


def test_window_alloc_errors(world):
    before = world.resources()
    with pytest.raises(cl.RmaError, match="nbytes must be a positive integer"):
        rma.window_alloc(world, 0)
    with pytest.raises(cl.RmaError, match="unknown memory 'tcp': choose mapped or mpi3"):
        rma.window_alloc(world, 64, memory="tcp")
    # Mapped memory is the world's own: naming a back-end (or a transport) is not how one chooses it.
    with pytest.raises(cl.RmaError, match="unknown memory 'cuda'"):
        rma.window_alloc(world, 64, memory="cuda")
    with pytest.raises(cl.RmaError, match="unknown memory 'mpi'"):
        rma.window_alloc(world, 64, memory="mpi")
    with pytest.raises(cl.RmaError, match=r"window_alloc\(memory='mpi3'\) needs a job started by mpirun"):
        rma.window_alloc(world, 64, memory="mpi3")
    assert world.resources() == before  # refused before anything was allocated


def test_commit_option_checked(win):
    q = rma.Queue.alloc(win)
    with pytest.raises(cl.RmaError, match="post_at='soon' must be one of start, wait"):
        q.commit(post_at="soon")


# -- public hooks: describe, streams ---------------------------------------------------------------
def test_describe_reports_the_committed_plan(win):
    q = rma.Queue.alloc(win)
    plain = rma.declare_strided_write(win, 512, win, 0, 4, 16, 32, 48, 0)
    forced = rma.declare_transpose_write(win, 700, 8, win, 256, 8, 4, 8, "float32", 0, tile=(2, 4))
    whole = rma.declare_transpose_write(win, 960, 2, win, 400, 4, 2, 4, "float32", 0)
    for h in (plain, forced, whole):
        q.push(h)
    q.add_origin(0)
    d = q.describe()
    assert d["state"] == "open" and d["timeout_s"] is None and d["memory"] == "mapped"
    assert d["handles"] == [plain.describe(), forced.describe(), whole.describe()]
    assert "copies" not in d  # no plan before commit
    q.commit(timeout=7.5)
    d = q.describe()
    assert (d["state"], d["timeout_s"], d["targets"], d["origins"], d["post_at"]) == ("committed", 7.5, [0], [0],
                                                                                        "start")
    assert d["queue"] == q.name and d["rank"] == 0 and d["epoch"] == q.epoch
    # The cpu back-end copies a forced tile's pieces one by one, else the whole block at once.
    assert d["transposes"] == [
        {"handle": forced.id, "dtype": "float32", "rows": 4, "cols": 8, "dst_rank": 0, "tile": (2, 4)},
        {"handle": whole.id, "dtype": "float32", "rows": 2, "cols": 4, "dst_rank": 0, "tile": None}]
    assert d["copies"] == 1 + (4 // 2) * (8 // 4) + 1
    q.start()
    assert q.describe()["state"] == "started"
    q.wait()
    q.free()
    assert q.describe()["state"] == "freed"


def test_streams_need_a_device(win):
    q = rma.Queue.alloc(win)
    q.push(rma.declare_write(win, 0, win, 512, 8, 0))
    q.add_origin(0)
    q.commit()
    with pytest.raises(cl.RmaError, match=r"start\(stream=\) on rma queue .*: the mapped \(cpu\) window runs on the "
                                          r"host and has no streams"):
        q.start(stream=object())
    assert q.describe()["state"] == "committed"  # refused before anything moved
    q.start()
    with pytest.raises(cl.RmaError, match=r"wait\(block=False\) on .*the mapped \(cpu\) window runs on the host"):
        q.wait(block=False)
    q.wait()
    with pytest.raises(cl.RmaError, match="device_handle: .* uses the mapped \\(cpu\\) window, which runs no kernels"):
        q.device_handle()
    q.check_device()  # nothing recorded, nothing to raise
    q.free()


# -- the device handle's ABI ------------------------------------------------------------------------
INCLUDE = Path(__file__).resolve().parents[1] / "src" / "circuslink" / "include"


def test_device_handle_table():
    from circuslink import _abi
    from circuslink.rma import _layout

    assert _layout.HANDLE in _abi.registered()
    # the queue's address, then a copy of the queue (kernels read its fields from their parameters)
    assert (_layout.HANDLE.cxx, _layout.HANDLE.size, _layout.HANDLE.align) == ("circuslink::RmaHandle",
                                                                               8 + _layout.QUEUE.size, 8)
    h = _layout.HANDLE.pack(queue=0xDEADBEEF000, q=_layout.QUEUE.pack(n_words=7, timeout_ns=123))
    assert isinstance(h, np.void) and h.dtype.isalignedstruct and int(h["queue"]) == 0xDEADBEEF000
    words = np.frombuffer(h.tobytes(), dtype="<u8")
    assert words[0] == 0xDEADBEEF000 and int(h["q"]["n_words"]) == 7
    assert words[1 + _layout.QUEUE.offsets["timeout_ns"] // 8] == 123


def _nvcc(source: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "abi.cu"
    path.write_text(source)
    return subprocess.run([shutil.which("nvcc"), "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(path), "-o",
                           str(tmp_path / "abi.o")], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_rma_tables_match_the_header_and_drift_fails(tmp_path):
    from circuslink import _abi
    from circuslink.rma import _layout

    tables = [_layout.HANDLE, _layout.QUEUE, _layout.DESCRIPTOR, _layout.STATE, _layout.ERROR_RECORD]
    proc = _nvcc(_abi.static_asserts(tables), tmp_path)
    assert proc.returncode == 0, proc.stderr
    drifted = _abi.Struct("circuslink::RmaHandle", _layout.HEADER, [("queue", _abi.PTR), ("timeout_ns", _abi.U64)],
                          register=False)
    proc = _nvcc(_abi.static_asserts([drifted]), tmp_path)
    assert proc.returncode != 0 and "circuslink::RmaHandle: size differs from the host table" in proc.stderr


# -- lifecycle ------------------------------------------------------------------------------------
def _rma_resources(world):
    return [r for r in world.resources() if isinstance(r, rma.Window | rma.Queue | cl.SymmetricBuffer)]


def test_windows_and_queues_are_resources(world):
    before = _rma_resources(world)
    with rma.window_alloc(world, 256) as w:
        q = rma.Queue.alloc(w)
        assert w in world.resources(rma.Window) and q in world.resources(rma.Queue)
        assert w.queues == (q,)
        q2 = rma.Queue.alloc(w)
        q2.close()  # closing a queue leaves the window and its other queues
        assert w.queues == (q,) and q2.closed and not w.closed
    assert w.closed and w.freed and q.closed  # the window closed its queue
    assert _rma_resources(world) == before
    with pytest.raises(cl.RmaError, match=r"window \d+ has been freed"):
        w.local  # noqa: B018
    w.free()  # idempotent


def test_window_numbers_live_on_the_world(world):
    a = rma.window_alloc(world, 64)
    b = rma.window_alloc(world, 64)
    assert b.index == a.index + 1
    assert "circuslink.rma.windows" in world._registries  # per-world state, no module global
    a.free()
    b.free()


def test_error_inside_with_releases_without_waiting(world):
    before = _rma_resources(world)
    with pytest.raises(ValueError, match="user error"):
        with rma.window_alloc(world, 256) as w:
            q = rma.Queue.alloc(w)
            raise ValueError("user error")
    assert w.closed and q.closed
    assert _rma_resources(world) == before


def test_failing_commit_leaves_nothing_behind(world, win, monkeypatch, rng):
    """If the window's module fails half-way through commit, what it built is dropped and the queue is open again."""
    from circuslink.rma import _cpu

    real = _cpu.CpuQueue.commit

    def half_then_fail(self, *args, **kwargs):
        real(self, *args, **kwargs)
        assert self.chain  # it had built something
        raise cl.BackendError("commit failed half-way")

    q = rma.Queue.alloc(win)
    q.push(rma.declare_write(win, 512, win, 0, 64, 0))
    q.add_origin(0)
    before = _rma_resources(world)
    monkeypatch.setattr(_cpu.CpuQueue, "commit", half_then_fail)
    with pytest.raises(cl.BackendError, match="half-way"):
        q.commit()
    monkeypatch.undo()
    assert q._impl.chain == [] and q._impl.origins == []
    assert q.describe()["state"] == "open" and _rma_resources(world) == before
    q.commit()  # the same declarations commit now, and move the right bytes
    win.local[:64] = rng.integers(0, 256, 64, dtype=np.uint8)
    q.start()
    q.wait()
    assert np.array_equal(win.local[512:576], win.local[:64])
    q.free()


LIFECYCLE = """
import time
import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import CHUNK_BYTES
world = cl.init()
me = world.rank

def mine():
    return [r for r in world.resources() if isinstance(r, rma.Window | rma.Queue | cl.SymmetricBuffer)]

# 1. A commit that fails (rank 1 forgot add_origin) leaves every rank's queue open and allocates nothing.
win = rma.window_alloc(world, 256)
q = rma.Queue.alloc(win)
if me == 0:
    q.push(rma.declare_write(win, 0, win, 128, 8, 1))
held = mine()
try:
    q.commit()
except cl.RmaError as exc:
    print("ERR", exc)
assert mine() == held and q.describe()["state"] == "open", (mine(), held)
q.clear()
if me == 0:
    q.push(rma.declare_write(win, 0, win, 128, 8, 1))
else:
    q.add_origin(0)
q.commit()
q.start()
q.wait()
world.barrier()

# 2. A free that fails (rank 1 does not join) still releases what rank 0 holds.
if me == 0:
    try:
        win.free(timeout=0.5)
    except cl.TimeoutError as exc:
        print("FREE", exc)
    assert win.closed and q.closed and not mine(), mine()
    print("rank 0 released")
else:
    time.sleep(2.0)   # not in rank 0's free; then take the place of the barrier it gave up on (exchanges are numbered)
    world.barrier()
    win.release_local()
    assert not mine(), mine()
world.barrier(timeout=30)

# 3. An error inside `with` on one rank: local release, no collective wait for the others.
w3 = rma.window_alloc(world, 128)
rma.Queue.alloc(w3)
if me == 0:
    try:
        with w3:
            raise KeyError("boom")
    except KeyError:
        assert w3.closed and not mine(), mine()
        print("rank 0 left the with block")
else:
    w3.release_local()  # the peers' part of an error path (a launcher would end the job)
world.close()
print(f"rank {me} lifecycle ok")
"""


def test_lifecycle_on_errors_across_ranks(spmd):
    job = spmd(2, LIFECYCLE, timeout=120).check()
    assert job.output.count("rank 0 writes to rank 1 but rank 1 did not add_origin(0)") == 2, job.output
    assert "FREE " in job.output and "timed out after 0.5 s" in job.output, job.output
    assert "rank 0 released" in job.output and "rank 0 left the with block" in job.output, job.output
    assert job.output.count("lifecycle ok") == 2, job.output


# -- multi-rank errors --------------------------------------------------------------------------
def test_commit_finds_missing_origin(spmd):
    code = """
    import circuslink as cl
    from circuslink import rma
    world = cl.init()
    win = rma.window_alloc(world, 256)
    q = rma.Queue.alloc(win)
    if world.rank == 0:
        q.push(rma.declare_write(win, 0, win, 128, 8, 1))
    try:
        q.commit()
    except cl.RmaError as exc:
        print("ERR", exc)
    """
    job = spmd(2, code).check()
    assert job.output.count("rank 0 writes to rank 1 but rank 1 did not add_origin(0)") == 2, job.output


def test_commit_finds_origin_that_writes_nothing(spmd):
    code = """
    import circuslink as cl
    from circuslink import rma
    world = cl.init()
    win = rma.window_alloc(world, 256)
    q = rma.Queue.alloc(win)
    if world.rank == 1:
        q.add_origin(0)
    try:
        q.commit()
    except cl.RmaError as exc:
        print("ERR", exc)
    """
    job = spmd(2, code).check()
    assert job.output.count("rank 1 added origin 0 but rank 0's queue writes nothing to rank 1") == 2, job.output


def test_commit_finds_two_origins_writing_the_same_bytes(spmd):
    code = """
    import circuslink as cl
    from circuslink import rma
    world = cl.init()
    win = rma.window_alloc(world, 256)
    q = rma.Queue.alloc(win)
    if world.rank == 0:
        q.add_origin(1)
        q.add_origin(2)
    else:
        off = 0 if world.rank == 1 else 12    # [0,16) and [12,20) meet at 12..16
        q.push(rma.declare_write(win, off, win, 128, 16 if world.rank == 1 else 8, 0))
    try:
        q.commit()
    except cl.RmaError as exc:
        print("ERR", exc)
    """
    job = spmd(3, code).check()
    assert job.output.count("ERR") == 3, job.output
    assert "rank 1's handle #1 (offset 0) and rank 2's handle #1 (offset 12) write the same bytes of rank 0" \
        in job.output, job.output


WAIT_TIMEOUT = """
import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import CHUNK_BYTES
world = cl.init()
win = rma.window_alloc(world, 256)
q = rma.Queue.alloc(win)
if world.rank == 0:
    q.push(rma.declare_write(win, 0, win, 128, 8, 1))
else:
    q.add_origin(0)
q.commit(timeout=0.7)                  # the queue's time-out: CIRCUSLINK_TIMEOUT is 60 in this job
if world.rank == 1:
    q.start()
    try:
        q.wait()                       # the queue's 0.7 s
    except cl.TimeoutError as exc:
        print("ERR1", exc)
    q.start()
    try:
        q.wait(timeout=0.5)            # overridden for this call
    except cl.TimeoutError as exc:
        print("ERR2", exc)
world.barrier()
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_times_out_naming_the_silent_origin(spmd, backend):
    job = spmd(2, WAIT_TIMEOUT, backend=backend, env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    lines = {m.group(1): m.group(0) for m in re.finditer(r"(ERR\d) .*", job.output)}
    assert set(lines) == {"ERR1", "ERR2"}, job.output
    for tag, epoch, limit in (("ERR1", 1, "0.7"), ("ERR2", 2, "0.5")):
        line = lines[tag]
        assert f"rma queue 1 of window 1 on rank 1: epoch {epoch} " in line, line
        assert "waiting for the writes of origin rank(s) 0" in line, line
        assert f"timed out after {limit} s" in line, line
    if backend == "cuda":
        assert "on the device waiting for the writes of origin rank(s) 0" in lines["ERR1"], job.output


START_TIMEOUT = """
import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import CHUNK_BYTES
world = cl.init()
win = rma.window_alloc(world, 256)
q = rma.Queue.alloc(win)
if world.rank == 0:
    q.push(rma.declare_write(win, 0, win, 128, 8, 1))
else:
    q.add_origin(0)
q.commit(timeout=COMMIT_TIMEOUT)
if world.rank == 0:
    try:
        q.start()                      # cpu: waits here for the post; cuda: the start kernel does
        q.wait()
    except cl.TimeoutError as exc:
        print("ERR", exc)
world.barrier(timeout=60)
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("via", ["env", "commit"])
def test_start_times_out_naming_the_target_that_never_posts(spmd, backend, via):
    """The start-side wait (for a target's post) has the queue's time-out: commit's, else CIRCUSLINK_TIMEOUT."""
    # Via the environment every wait of the job has the limit, so it leaves room for start-up skew.
    env = {"CIRCUSLINK_TIMEOUT": "3"} if via == "env" else {"CIRCUSLINK_TIMEOUT": "60"}
    # On the GPU this one-word chain would go as low-latency lines, which have no post to wait for (the origin
    # writes the target's staging and waits only 4 epochs ahead: docs/rma.md): the fenced protocol's start is
    # the wait under test (on the GPU, 2026-11-29, the origin's start and wait returned at once, as designed).
    env["CIRCUSLINK_RMA_LOW_LATENCY"] = "0"
    code = START_TIMEOUT.replace("COMMIT_TIMEOUT", "None" if via == "env" else "1.0")
    job = spmd(2, code, backend=backend, env=env).check()
    assert "rma queue 1 of window 1 on rank 0: epoch 1 " in job.output, job.output
    assert "waiting for the post of target rank(s) 1" in job.output, job.output
    assert f"timed out after {3 if via == 'env' else 1} s" in job.output, job.output


@pytest.mark.mpi
@pytest.mark.parametrize("via", ["env", "commit"])
def test_mpi_origin_stall_is_bounded_and_named(spmd, via):
    """MPI cannot bound MPI_Win_start/complete: the watchdog ends the stalled origin at the queue's time-out,
    naming queue and target."""
    job = spmd(2, """
        import time
        import circuslink as cl
        from circuslink import rma

        world = cl.init()
        win = rma.window_alloc(world, 64, memory="mpi3")
        peer = 1 - world.rank
        q = rma.Queue.alloc(win)
        q.push(rma.declare_write(win, 32, win, 0, 8, peer))
        q.add_origin(peer)
        q.commit(timeout=COMMIT_TIMEOUT)
        if world.rank == 1:
            time.sleep(30)  # never posts within rank 0's limit
        t0 = time.monotonic()
        q.start()
        q.wait()
        print("returned after", time.monotonic() - t0)
    """.replace("COMMIT_TIMEOUT", "None" if via == "env" else "2.0"), launcher="mpirun",
        env={"CIRCUSLINK_TIMEOUT": "2" if via == "env" else "60"}, job_timeout=25)
    assert job.returncode != 0, job.output
    assert "rma queue 1 of window 1 on rank 0: epoch 1 " in job.output, job.output
    assert "waiting for the post of target rank(s) 1" in job.output, job.output
    assert "timed out after 2 s" in job.output, job.output
    assert "returned after" not in job.output


@pytest.mark.mpi
def test_mpi_refuses_post_at_wait_and_stays_usable(spmd):
    """The refused commit builds nothing (no datatype or group left behind) and the queue commits afterwards."""
    job = spmd(2, """
        import os
        import numpy as np
        import circuslink as cl
        from circuslink import rma

        world = cl.init()
        me, peer = world.rank, 1 - world.rank
        win = rma.window_alloc(world, 256, memory="mpi3")
        q = rma.Queue.alloc(win)
        q.push(rma.declare_strided_write(win, 128, win, 0, 4, 8, 16, 24, peer))
        q.add_origin(peer)
        try:
            q.commit(post_at="wait")
        except cl.RmaError as exc:
            print("ERR", exc)
        assert q._impl.types == [] and q._impl.puts == [] and q._impl.origin_group is None
        assert q.describe()["state"] == "open"
        q.commit()
        assert q.describe()["datatypes"] == 2 and q.describe()["puts"] == 1
        seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
        win.local[:64] = np.random.default_rng([seed, me]).integers(0, 256, 64, dtype=np.uint8)
        q.start()
        q.wait()
        theirs = np.random.default_rng([seed, peer]).integers(0, 256, 64, dtype=np.uint8)
        for i in range(4):
            assert (win.local[128 + 24 * i: 136 + 24 * i] == theirs[16 * i: 16 * i + 8]).all()
        q.free()
        win.free()
        print("rank", me, "ok")
    """, launcher="mpirun", tag=True)
    job.check()
    assert job.output.count("post_at='wait' is not supported by MPI-3 windows") == 2, job.output
    for r in (0, 1):  # by rank tag: two ranks' lines may interleave in mpirun's untagged output
        assert f"rank {r} ok" in job.rank_lines(r), job.output


def _copy_blocks(mem: np.ndarray, blocks) -> None:
    for src, dst, count, block, ss, ds in blocks:
        for b in range(count):
            mem[dst + b * ds: dst + b * ds + block] = mem[src + b * ss: src + b * ss + block]


def test_small_chain_words_copy_exactly_what_the_blocks_do(rng):
    """A small chain committed as words (one aligned 8- or 16-byte load and store per device thread) moves the
    same bytes as the descriptors, byte for byte, for random aligned chains of contiguous and block-stride
    writes; misaligned or large chains keep the descriptors."""
    from circuslink.rma._cuda import small_chain_words

    for _ in range(200):
        width = int(rng.choice([8, 16]))
        blocks, src_at, dst_at = [], 0, 1 << 15
        for _ in range(int(rng.integers(1, 9))):
            count = int(rng.integers(1, 5))
            block = width * int(rng.integers(1, 5))
            ss = block + width * int(rng.integers(0, 3)) if count > 1 else block
            ds = block + width * int(rng.integers(0, 3)) if count > 1 else block
            blocks.append((src_at, dst_at, count, block, ss, ds))
            src_at += count * ss + width * int(rng.integers(0, 3))
            dst_at += count * ds + width * int(rng.integers(0, 3))
        words, got_width = small_chain_words(blocks)
        total = sum(c * b for _, _, c, b, _, _ in blocks)
        assert got_width >= width and len(words) == total // got_width
        mem = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
        want = mem.copy()
        _copy_blocks(want, blocks)
        for src, dst in words:  # what the device's threads do, one word each
            mem[dst: dst + got_width] = mem[src: src + got_width]
        assert np.array_equal(mem, want)
    assert small_chain_words([(0, 4096, 1, 12, 12, 12)])[1] == 0             # 12 B: no common 8-byte width
    assert small_chain_words([(8, 4096, 3, 8, 12, 8)])[1] == 0               # a stride breaks the alignment
    assert small_chain_words([(0, 1 << 20, 1, 4104, 4104, 4104)])[1] == 0     # more than a small chain
    assert small_chain_words([])[1] == 0


def test_low_latency_lines_deliver_what_the_blocks_do(rng):
    """A small chain as low-latency lines, simulated in numpy: each origin stores its 8-byte words (chain_lines)
    into its region of the target's staging slot (staging_layout), each target copies its lines to their
    destinations in the order the origins stored them. For random worlds and chains, every target's window ends
    up as the descriptors would leave it, byte for byte; the regions of a slot never overlap and fit the slot."""
    from circuslink.rma._cuda import chain_lines, staging_layout

    for _ in range(100):
        n = int(rng.integers(2, 6))
        chains = {}  # (origin, target): blocks with addresses relative to the origin's / target's window
        for o in range(n):
            for t in range(n):
                if o != t and rng.random() < 0.7:
                    blocks, dst_at = [], (o * n + t) * 1024
                    for _ in range(int(rng.integers(1, 4))):
                        count, block = int(rng.integers(1, 4)), 8 * int(rng.integers(1, 5))
                        ss = block + 8 * int(rng.integers(0, 3)) if count > 1 else block
                        ds = block + 8 * int(rng.integers(0, 3)) if count > 1 else block
                        blocks.append((8 * int(rng.integers(0, 32)), dst_at, count, block, ss, ds))
                        dst_at += count * ds
                    chains[(o, t)] = blocks
        outgoing = [{t: len(chain_lines(b)) for (oo, t), b in chains.items() if oo == o} for o in range(n)]
        slot, region = staging_layout(outgoing)
        assert slot % 128 == 0
        sources = [rng.integers(0, 256, 1024, dtype=np.uint8) for _ in range(n)]
        for t in range(n):
            staging = np.zeros(slot, dtype=np.uint8)
            written = np.zeros(slot, dtype=bool)
            want = np.zeros(n * n * 1024, dtype=np.uint8)
            got = want.copy()
            for (o, tt), blocks in sorted(chains.items()):
                if tt != t:
                    continue
                for src, dst, count, block, ss, ds in blocks:
                    for b in range(count):
                        want[dst + b * ds: dst + b * ds + block] = sources[o][src + b * ss: src + b * ss + block]
                for j, (src, _) in enumerate(chain_lines(blocks)):  # the origin's stores: 8 bytes a line
                    at = region[(o, t)] + 16 * j
                    assert not written[at: at + 16].any() and at + 16 <= slot
                    written[at: at + 16] = True
                    staging[at: at + 8] = sources[o][src: src + 8]
                for j, (_, dst) in enumerate(chain_lines(blocks)):  # the target's copies, from the offsets it got
                    at = region[(o, t)] + 16 * j
                    got[dst: dst + 8] = staging[at: at + 8]
            assert np.array_equal(got, want)
    assert staging_layout([{}, {}]) == (128, {})


def _copy_unit(mem, desc, k):
    """What one warp does with unit k of a descriptor (rma_copy_unit), in numpy."""
    src, dst, count, block_bytes, ss, ds, per_block, per_unit = desc
    if per_unit > 1:
        first = k * per_unit
        for b in range(first, min(count, first + per_unit)):
            mem[dst + b * ds: dst + b * ds + block_bytes] = mem[src + b * ss: src + b * ss + block_bytes]
        return
    block, offset = divmod(k, per_block)
    offset *= CHUNK_BYTES
    n = min(CHUNK_BYTES, block_bytes - offset)
    mem[dst + block * ds + offset: dst + block * ds + offset + n] = mem[src + block * ss + offset:
                                                                       src + block * ss + offset + n]


def test_work_units_cover_every_block_once(rng):
    """The units a chain is cut into (pieces of large blocks, several small blocks to a unit) copy every byte
    of every block exactly once, whatever the block size against the 4 KiB unit."""
    from circuslink.rma._layout import work_units

    for _ in range(300):
        block = int(rng.choice([1, 8, 100, 512, 2048, 2049, 4096, 5000, 12288]))
        count = int(rng.integers(1, 40))
        ss = block + int(rng.integers(0, 64))
        ds = block + int(rng.integers(0, 64))
        units, per_block, per_unit = work_units(count, block)
        assert units >= 1 and (per_unit == 1 or per_block == 1)
        assert per_unit * block <= max(CHUNK_BYTES, block)          # a unit never holds more than 4 KiB of blocks
        src, dst = 0, count * ss + 16
        size = dst + count * ds + 16
        mem = rng.integers(0, 256, size, dtype=np.uint8)
        want = mem.copy()
        _copy_blocks(want, [(src, dst, count, block, ss, ds)])
        for k in range(units):
            _copy_unit(mem, (src, dst, count, block, ss, ds, per_block, per_unit), k)
        assert np.array_equal(mem, want), (count, block, ss, ds)
    assert work_units(64, 100) == (2, 1, 40)        # 64 blocks of 100 B: 40 to a unit
    assert work_units(1, 100) == (1, 1, 1)
    assert work_units(3, 10000) == (9, 3, 1)        # 10,000 B blocks: 3 pieces each


def test_auto_launch_picks_the_copy_engine_for_large_chains_of_large_blocks(monkeypatch):
    from circuslink.rma._cuda import COPY_ENGINE_FROM, choose_launch

    assert choose_launch("auto", [(1, 8)] * 8) == "kernel"
    assert choose_launch("auto", [(1, COPY_ENGINE_FROM)]) == "graph"
    assert choose_launch("auto", [(1, COPY_ENGINE_FROM - 4096)]) == "kernel"
    assert choose_launch("auto", [(1 << 15, 512)]) == "kernel"      # 16 MiB in 512 B rows: SM copies
    assert choose_launch("kernel", [(1, 1 << 24)]) == "kernel" and choose_launch("graph", [(1, 8)]) == "graph"
    # large transposing puts: a kernel node of their own (a full wave of blocks), alone or beside large rows
    assert choose_launch("auto", [], COPY_ENGINE_FROM) == "graph"
    assert choose_launch("auto", [(1, 4096)], COPY_ENGINE_FROM) == "graph"
    assert choose_launch("auto", [], COPY_ENGINE_FROM - 1) == "kernel"
    assert choose_launch("auto", [(64, 512), (5, 24)], COPY_ENGINE_FROM) == "graph"  # few bytes of narrow rows
    assert choose_launch("auto", [(1 << 15, 512)], COPY_ENGINE_FROM) == "kernel"      # 16 MiB of them: SM copies
    assert choose_launch("kernel", [], 1 << 30) == "kernel"
    monkeypatch.setenv("CIRCUSLINK_RMA_COPY_ENGINE_FROM", "65536")
    assert choose_launch("auto", [(1, 65536)]) == "graph"
    monkeypatch.setenv("CIRCUSLINK_RMA_COPY_ENGINE_FROM", "64K")
    with pytest.raises(cl.RmaError, match="CIRCUSLINK_RMA_COPY_ENGINE_FROM='64K'"):
        choose_launch("auto", [(1, 65536)])
    monkeypatch.setenv("CIRCUSLINK_RMA_LAUNCH", "dma")
    from circuslink.rma._cuda import launch_mode
    with pytest.raises(cl.RmaError, match="CIRCUSLINK_RMA_LAUNCH='dma': choose one of auto, kernel, graph"):
        launch_mode()


# -- signal-only queues: the origin's own stores into the targets' windows (add_target, Window.peer) ------------
# Every rank writes fresh bytes into both neighbours' windows (mapped here), into the half of this cycle's
# parity, then starts: the start only tells them. Two halves are enough because a rank writes cycle c only after
# its wait for cycle c - 1, which both neighbours start after checking cycle c - 2 (the half c reuses).
# Window per rank: half h (h = cycle & 1) holds [from my left | from my right], BLOCK bytes each.
SIGNAL_ONLY = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma

CYCLES, BLOCK = {cycles}, 1000
SEED = int(os.environ["CIRCUSLINK_TEST_SEED"])
world = cl.init()
me, n = world.rank, world.size
right, left = (me + 1) % n, (me - 1) % n
xp = world.xp

def payload(origin, target, cycle):
    return np.random.default_rng([SEED, origin, target, cycle]).integers(0, 256, BLOCK, dtype=np.uint8)

def at(half, from_left):
    return (2 * half + (0 if from_left else 1)) * BLOCK

win = rma.window_alloc(world, 4 * BLOCK)
win.local[:] = 0
q = rma.Queue.alloc(win)
for t in sorted({{left, right}}):
    q.add_target(t)
    q.add_origin(t)
q.commit()
assert q.describe()["signal_only"] and q.describe()["targets"] == sorted({{left, right}})
world.barrier()
for cycle in range(CYCLES):
    half = cycle & 1
    a = at(half, True)   # I am my right neighbour's left
    win.peer(right)[a:a + BLOCK] = xp.asarray(payload(me, right, cycle))
    a = at(half, False)  # ... and my left neighbour's right
    win.peer(left)[a:a + BLOCK] = xp.asarray(payload(me, left, cycle))
    q.start()
    q.wait()
    got = win.local.get() if hasattr(win.local, "get") else win.local
    for from_left, origin in ((True, left), (False, right)):
        a = at(half, from_left)
        if not np.array_equal(got[a:a + BLOCK], payload(origin, me, cycle)):
            raise SystemExit(f"rank {{me}} cycle {{cycle}}: the bytes from rank {{origin}} differ")
q.free()
win.free()
world.close()
print(f"rank {{me}} ok {{CYCLES}} cycles")
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2, 3])
def test_signal_only_queue_carries_the_origins_own_stores(spmd, backend, n):
    cycles = 200
    job = spmd(n, SIGNAL_ONLY.format(cycles=cycles), backend=backend, timeout=300).check()
    assert job.output.count(f"ok {cycles} cycles") == n, job.output


def test_signal_only_queue_refuses_a_chain_and_bad_ranks(world, win):
    q = rma.Queue.alloc(win)
    q.add_target(0)
    with pytest.raises(cl.RmaError, match=r"push on rma queue .*: its writes are the caller's own \(add_target\)"):
        q.push(rma.declare_write(win, 0, win, 512, 8, 0))
    with pytest.raises(cl.RmaError, match="add_target: rank 0 is already a target"):
        q.add_target(0)
    with pytest.raises(cl.RmaError, match="add_target: rank 5 is out of range for a world of 1 ranks"):
        q.add_target(5)
    with pytest.raises(cl.RmaError, match="Window.peer: rank -1 is out of range"):
        win.peer(-1)
    q.add_origin(0)
    q.commit()
    with pytest.raises(cl.RmaError, match="add_target after commit"):
        q.add_target(0)
    win.peer(0)[:8] = 7  # my own write into rank 0's window (mine): the start releases it
    q.start()
    q.wait()
    assert (win.local[:8] == 7).all()
    q.clear()
    assert not q.describe()["signal_only"]  # clear forgets the targets too
    q.push(rma.declare_write(win, 0, win, 512, 8, 0))
    with pytest.raises(cl.RmaError, match="add_target on .*: it has a chain of declared writes"):
        q.add_target(0)
    q.free()


MIXED_KINDS = """
import circuslink as cl
from circuslink import rma

world = cl.init()
me, other = world.rank, 1 - world.rank
win = rma.window_alloc(world, 64)
q = rma.Queue.alloc(win)
if me == 0:
    q.add_target(other)     # writes rank 1's window itself
else:
    q.push(rma.declare_write(win, 0, win, 32, 8, other))  # a chain
q.add_origin(other)
try:
    q.commit()
except cl.RmaError as exc:
    print(f"rank {me} refused: {exc}")
q.free()
win.free()
world.close()
"""


def test_signal_only_and_chain_queues_cannot_meet(spmd):
    """A rank whose queue writes itself and one whose queue copies a chain would wait for different things (posts,
    arrivals): commit refuses on every rank, naming which ranks are which."""
    job = spmd(2, MIXED_KINDS, timeout=120).check()
    for r in (0, 1):
        assert (f"rank {r} refused: commit of rma queue 1 of window 1: ranks [0] write themselves (add_target) and "
                "ranks [1] push a chain; every rank's queue must be the same kind") in job.output, job.output
