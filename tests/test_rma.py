"""RMA queues on the cpu back-end (the reference) and the mpi back-end (MPI-3 RMA under mpirun).

The exchange tests run one body at 2 and 4 ranks: a ring where every rank writes
contiguous and block-stride pieces to both neighbours, with fresh random data every
cycle. After each wait() every rank rebuilds, from the seeds alone, what its whole window
must hold (the poison it started with, its own new source bytes, its neighbours' writes)
and compares byte for byte, so a write that lands wrong, short, twice or outside its
blocks fails.
"""

from __future__ import annotations

import numpy as np
import pytest

import circuslink as cl
from circuslink import rma

# The ring body. WINDOW layout per rank: [0, 4096) my sources, [4096, 8192) what my
# neighbours write into me; everything else keeps its poison.
RING = """
import numpy as np
import circuslink as cl
from circuslink import rma

BACKEND, CYCLES, POST_AT = {backend!r}, {cycles}, {post_at!r}
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
    return np.random.default_rng([7, rank]).integers(0, 256, NBYTES, dtype=np.uint8)

def sources(rank, cycle):
    return np.random.default_rng([11, rank, cycle]).integers(0, 256, 4096, dtype=np.uint8)

def blocks(off, count, block, stride):
    return np.concatenate([np.arange(off + i * stride, off + i * stride + block) for i in range(count)])

win = rma.window_alloc(world, NBYTES, backend=BACKEND)
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
world.close()
print(f"rank {{me}} ok {{CYCLES}} cycles")
"""


def _ring(spmd, n, cycles, backend="cpu", post_at="start", launcher="circuslink", world_backend="cpu", env=None):
    code = RING.format(backend=backend, cycles=cycles, post_at=post_at)
    job = spmd(n, code, backend=world_backend, launcher=launcher, timeout=120, env=env).check()
    assert job.output.count(f"ok {cycles} cycles") == n, job.output


@pytest.mark.parametrize("n", [2, 4])
def test_ring_exchange_is_byte_exact(spmd, n):
    _ring(spmd, n, cycles=20)


@pytest.mark.parametrize("n", [2, 4])
def test_thousand_cycles_with_changing_data(spmd, n):
    _ring(spmd, n, cycles=1000)


def test_post_at_wait(spmd):
    _ring(spmd, 2, cycles=50, post_at="wait")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_ring_exchange_is_byte_exact(spmd, n):
    _ring(spmd, n, cycles=20, backend="mpi", launcher="mpirun")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_thousand_cycles(spmd, n):
    _ring(spmd, n, cycles=1000, backend="mpi", launcher="mpirun")


@pytest.mark.mpi
def test_mpi_ring_without_single_copy_transport(spmd):
    """The device machines' Open MPI runs with btl_vader_single_copy_mechanism=none, where
    MPI_Win_create over a user buffer fails (MPI_ERR_WIN); our windows must still work."""
    _ring(spmd, 2, cycles=20, backend="mpi", launcher="mpirun",
          env={"OMPI_MCA_btl_vader_single_copy_mechanism": "none"})


@pytest.mark.mpi
def test_cpu_queue_under_mpirun(spmd):
    """The cpu engine does not care who launched the ranks."""
    _ring(spmd, 2, cycles=20, backend="cpu", launcher="mpirun")


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


def test_self_write_in_one_rank_world(world, win):
    rng = np.random.default_rng()
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
    q.wait()
    q.clear()  # back to open: a new chain, counters keep counting
    q.push(rma.declare_write(win, 64, win, 512, 8, 0))
    q.add_origin(0)
    q.commit()
    q.start()
    q.wait()
    assert q.epoch == 2
    q.free()
    for op in (q.start, q.wait, q.clear, q.commit, lambda: q.push(None), lambda: q.add_origin(0)):
        with pytest.raises(cl.RmaError, match="has been freed"):
            op()
    q.free()  # idempotent


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
    with pytest.raises(cl.RmaError, match="nbytes must be a positive integer"):
        rma.window_alloc(world, 0)
    with pytest.raises(cl.RmaError, match="unknown backend 'tcp'"):
        rma.window_alloc(world, 64, backend="tcp")
    with pytest.raises(cl.RmaError, match="backend 'cuda' needs a world of that back-end"):
        rma.window_alloc(world, 64, backend="cuda")
    with pytest.raises(cl.RmaError, match="needs a job started by mpirun"):
        rma.window_alloc(world, 64, backend="mpi")


def test_commit_option_checked(win):
    q = rma.Queue.alloc(win)
    with pytest.raises(cl.RmaError, match="post_at='soon' must be one of start, wait"):
        q.commit(post_at="soon")


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


def test_wait_times_out_naming_the_silent_origin(spmd):
    code = """
    import time
    import circuslink as cl
    from circuslink import rma
    world = cl.init()
    win = rma.window_alloc(world, 256)
    q = rma.Queue.alloc(win)
    if world.rank == 0:
        q.push(rma.declare_write(win, 0, win, 128, 8, 1))
    else:
        q.add_origin(0)
    q.commit()
    if world.rank == 1:
        q.start()
        try:
            q.wait(timeout=0.5)
        except cl.TimeoutError as exc:
            print("ERR", exc)
    world.barrier()
    """
    job = spmd(2, code).check()
    assert "waiting for the writes of origin rank(s) 0" in job.output, job.output
    assert "rma queue 1 of window 1 on rank 1: epoch 1 timed out after 0.5 s" in job.output, job.output


def test_start_times_out_naming_the_target_that_never_posts(spmd):
    code = """
    import circuslink as cl
    from circuslink import rma
    world = cl.init()
    win = rma.window_alloc(world, 256)
    q = rma.Queue.alloc(win)
    if world.rank == 0:
        q.push(rma.declare_write(win, 0, win, 128, 8, 1))
    else:
        q.add_origin(0)
    q.commit()
    if world.rank == 0:
        try:
            q.start()
        except cl.TimeoutError as exc:
            print("ERR", exc)
    world.barrier(timeout=30)
    """
    job = spmd(2, code, env={"CIRCUSLINK_TIMEOUT": "1"}).check()
    assert "in start() waiting for the post of target rank(s) 1" in job.output, job.output


@pytest.mark.mpi
def test_mpi_origin_stall_is_bounded_and_named(spmd):
    """MPI cannot bound MPI_Win_start/complete: the watchdog ends the stalled origin, naming queue and target."""
    job = spmd(2, """
        import time
        import circuslink as cl
        from circuslink import rma

        world = cl.init()
        win = rma.window_alloc(world, 64, backend="mpi")
        peer = 1 - world.rank
        q = rma.Queue.alloc(win)
        q.push(rma.declare_write(win, 32, win, 0, 8, peer))
        q.add_origin(peer)
        q.commit()
        if world.rank == 1:
            time.sleep(30)  # never posts within rank 0's limit
        t0 = time.monotonic()
        q.start()
        q.wait(timeout=2.0)
        print("returned after", time.monotonic() - t0)
    """, launcher="mpirun", env={"CIRCUSLINK_TIMEOUT": "2"}, job_timeout=25)
    assert job.returncode != 0, job.output
    assert "rma queue 1 of window 1 on rank 0: epoch 1 timed out after 2 s" in job.output, job.output
    assert "waiting for the post of target rank(s) 1" in job.output, job.output
    assert "returned after" not in job.output
