"""RMA queues on the cuda back-end only (run on the device machine: ranks share its GPU under MPS).

The bodies every back-end runs (rings, time-outs, mpi staging) are parametrized in tests/test_rma.py.
Here: device-driven queues (a user kernel that includes <circuslink/rma.cuh>, takes the queue's
``circuslink::RmaHandle`` by value, fills its sources, starts, waits and checks what arrived, 1,000
times without returning to the host, in several block shapes; the same through an rma_session, and its
refusals), the stream hooks (cycles enqueued
into a CUDA graph with ``start(stream=)`` / ``wait(stream=, block=False)``), a device-driven
time-out with the queue's time-out, and a late peer under MPS.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
KERNELS = Path(__file__).parent / "kernels" / "rma_ring_cycles.cu"  # user_cycles and session_cycles


DEVICE_DRIVEN = r'''
from pathlib import Path
import numpy as np
import cupy as cp
import circuslink as cl
from circuslink import rma
from circuslink.rma._layout import HANDLE

world = cl.init()
me, n = world.rank, world.size
right, left = (me + 1) % n, (me - 1) % n
win = rma.window_alloc(world, 8192)
win.local[:] = 0xA5
q = rma.Queue.alloc(win)
q.push(rma.declare_write(win, 4096, win, 0, 1024, right))
q.push(rma.declare_strided_write(win, 6144, win, 1024, 16, 24, 32, 40, right))
q.add_origin(left)
q.commit()
handle = q.device_handle()
assert isinstance(handle, np.void) and handle.dtype == HANDLE.dtype
plan = q.describe()
# 1024 B + 16 x 24 B: 176 words and 176 lines; a session's thread holds 2 words and 4 lines
assert plan["protocol"] == "low-latency lines" and plan["session_threads"] == 88, plan
module = cl.compile(Path("KERNELS").read_text())

def refused(queue, why):  # the session's refusal, raised by check_device in one line saying why
    try:
        queue.check_device()
    except cl.RmaError as exc:
        assert f"rma_session refused the queue: {why}" in str(exc), exc
        return
    raise AssertionError("a refused session was not reported")

first = 0
# rma_start / rma_wait, then an rma_session; 1-D, a partial last warp, 2-D and 3-D blocks: the device API uses the
# linear thread index. A block of 64 threads holds 128 words: its session refuses the queue, and says why.
cases = [("user_cycles", (256, 1, 1), 1000), ("user_cycles", (48, 1, 1), 100), ("user_cycles", (16, 6, 1), 100),
         ("user_cycles", (8, 4, 3), 100), ("session_cycles", (256, 1, 1), 1000), ("session_cycles", (88, 1, 1), 100),
         ("session_cycles", (16, 6, 1), 100), ("session_cycles", (8, 4, 3), 100), ("session_cycles", (64, 1, 1), 1)]
for name, block, cycles in cases:
    out = cp.zeros(3, dtype=cp.uint64)
    cp.cuda.Device().synchronize()
    module.get_function(name)((1,), block, (handle, win.local, np.uint64(me), np.uint64(left), np.uint64(first),
                                            np.uint64(cycles), out))
    cp.cuda.Device().synchronize()
    bad, done, taken = (int(x) for x in out.get())
    if block == (64, 1, 1):
        assert (done, taken) == (0, 0), (done, taken)
        refused(q, "a block of 64 threads does not hold its 176 words and 176 lines a cycle to 1 target(s) from 1 "
                   "origin(s): it takes 88")
    else:
        q.check_device()
        assert (done, bad) == (cycles, 0) and taken == (name == "session_cycles"), (name, block, done, bad, taken)
        first += cycles
    # Host-driven cycles continue from the device's epoch without a reset.
    for _ in range(3):
        q.start()
        q.wait()
    world.barrier()
# A fenced queue (a 4-byte write is no whole line): no session takes it.
q2 = rma.Queue.alloc(win)
q2.push(rma.declare_write(win, 4096, win, 0, 1020, right))
q2.add_origin(left)
q2.commit()
assert q2.describe()["protocol"] == "fenced" and q2.describe()["session_threads"] is None, q2.describe()
out = cp.zeros(3, dtype=cp.uint64)
module.get_function("session_cycles")((1,), (256,), (q2.device_handle(), win.local, np.uint64(me), np.uint64(left),
                                                     np.uint64(0), np.uint64(1), out))
cp.cuda.Device().synchronize()
assert [int(x) for x in out.get()][1:] == [0, 0]
refused(q2, "it is not a low-latency queue")
q2.free()
q.free()
win.free()
world.close()
print(f"rank {me} device-driven ok")
'''


@pytest.mark.parametrize("ranks", [2, 3])
def test_cuda_device_driven_user_kernel_any_block_shape(spmd, ranks):
    """A kernel drives a queue 1,000 times (and 100 in other block shapes) by rma_start / rma_wait, then through
    an rma_session, every byte checked; host-driven cycles go on from its epoch; a block too small for the queue,
    and a fenced queue, are refused in one line saying why."""
    job = spmd(ranks, DEVICE_DRIVEN.replace("KERNELS", str(KERNELS)), backend="cuda", timeout=300).check()
    assert job.output.count("device-driven ok") == ranks, job.output


HOOKS = """
import os
import numpy as np
import cupy as cp
import circuslink as cl
from circuslink import rma

world = cl.init()
me, peer = world.rank, 1 - world.rank
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
win = rma.window_alloc(world, 1 << 16)
q = rma.Queue.alloc(win)
q.push(rma.declare_strided_write(win, 32768, win, 0, 64, 100, 128, 140, peer))
q.add_origin(peer)
q.commit(timeout=30)
plan = q.describe()
assert plan["launch"] == "kernel" and plan["threads"] == 256 and plan["timeout_s"] == 30, plan
assert 1 <= plan["grid"] and plan["work_units"] == 2, plan   # 64 blocks of 100 B, 40 to a 4 KiB unit

def fill(cycle):
    data = np.random.default_rng([seed, me, cycle]).integers(0, 256, 8192, dtype=np.uint8)
    win.local[:8192] = cp.asarray(data)

def check(cycle):
    theirs = np.random.default_rng([seed, peer, cycle]).integers(0, 256, 8192, dtype=np.uint8)
    got = win.local.get()
    for i in range(64):
        assert np.array_equal(got[32768 + 140 * i: 32768 + 140 * i + 100], theirs[128 * i: 128 * i + 100]), (cycle, i)

def captured(cycles, enqueue, replays):  # cycles enqueued into one CUDA graph, launched replays times
    cp.cuda.Device().synchronize()
    world.barrier()
    capture = cp.cuda.Stream(non_blocking=True)
    capture.begin_capture()
    for _ in range(cycles):
        enqueue(capture)
    graph = capture.end_capture()
    for _ in range(replays):
        graph.launch(world.backend.stream)
    q.check_device()

def start_and_wait(stream):
    q.start(stream=stream)
    q.wait(stream=stream, block=False)

# 1. Cycles captured into one CUDA graph through the public hooks, replayed.
fill(0)
captured(5, start_and_wait, 1)
check(0)
world.barrier()
# 2. A wait enqueued on the world's stream without blocking the host, then work queued behind it.
fill(1)
q.start()
q.wait(block=False)
with world.backend.stream:
    first = win.local[32768:32868].copy()       # runs after the epoch is complete
q.check_device()
theirs = np.random.default_rng([seed, peer, 1]).integers(0, 256, 8192, dtype=np.uint8)
assert np.array_equal(first.get(stream=world.backend.stream), theirs[:100])
check(1)
world.barrier()
# 3. Whole cycles, one launch each (q.cycle(stream=)), captured into one graph and replayed twice.
fill(2)
captured(4, lambda stream: q.cycle(stream=stream), 2)
check(2)
assert q.describe()["state"] == "committed" and q.epoch == 5 + 1 + 4, q.epoch  # the host counts what it enqueued
world.barrier()
q.free()
win.free()
world.close()
print(f"rank {me} hooks ok")
"""


def test_cuda_stream_hooks_in_a_graph_and_without_blocking(spmd):
    job = spmd(2, HOOKS, backend="cuda", timeout=300).check()
    assert job.output.count("hooks ok") == 2, job.output


DEVICE_TIMEOUT = r'''
import numpy as np
import cupy as cp
import circuslink as cl
from circuslink import rma

SOURCE = r"""
#include <circuslink/rma.cuh>
extern "C" __global__ void one(circuslink::RmaHandle q, int* ok) {
  const bool a = circuslink::rma_start(q);
  const bool b = circuslink::rma_wait(q);
  if (threadIdx.x == 0) ok[0] = a && b;
}
"""
world = cl.init()
win = rma.window_alloc(world, 4096)
q = rma.Queue.alloc(win)
if world.rank == 0:
    q.push(rma.declare_write(win, 0, win, 1024, 64, 1))
else:
    q.add_origin(0)
q.commit(timeout=0.8)                      # CIRCUSLINK_TIMEOUT is 60 in this job
if world.rank == 1:                        # rank 0 never starts: rank 1's device wait gives up at 0.8 s
    ok = cp.ones(1, dtype=cp.int32)
    cl.compile(SOURCE).get_function("one")((1,), (64,), (q.device_handle(), ok))
    cp.cuda.Device().synchronize()
    assert int(ok.get()[0]) == 0
    try:
        q.check_device()
    except cl.TimeoutError as exc:
        print("ERR", exc)
world.barrier(timeout=30)
'''


def test_cuda_device_driven_wait_has_the_queues_timeout(spmd):
    job = spmd(2, DEVICE_TIMEOUT, backend="cuda", timeout=120, env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    assert "rma queue 1 of window 1 on rank 1: epoch 1 in a device-driven call on the device waiting for the " \
           "writes of origin rank(s) 0: timed out after 0.8 s" in job.output, job.output


LATE_PEER = """
import time
import numpy as np
import circuslink as cl
from circuslink import rma
world = cl.init()
me, peer = world.rank, 1 - world.rank
chain, size = 16, 512 << 10     # 2,048 work units: the start kernel's widest grid
win = rma.window_alloc(world, 2 * chain * size)
q = rma.Queue.alloc(win)
for i in range(chain):
    q.push(rma.declare_write(win, chain * size + i * size, win, i * size, size, peer))
q.add_origin(peer)
q.commit()
seed = int(__import__("os").environ["CIRCUSLINK_TEST_SEED"])
for cycle in range(6):
    mine = np.random.default_rng([seed, cycle, me]).integers(0, 256, chain * size, dtype=np.uint8)
    win.local[:chain * size] = world.xp.asarray(mine)
    if me == 1:
        time.sleep(0.2)  # rank 0's start kernel is already spinning on the GPU, waiting for this post
    q.start()
    q.wait()
    theirs = np.random.default_rng([seed, cycle, peer]).integers(0, 256, chain * size, dtype=np.uint8)
    got = win.local[chain * size:].get()
    assert got.tobytes() == theirs.tobytes(), f"cycle {cycle}: wrong bytes"
    world.barrier()
q.free()
win.free()
world.close()
print(f"rank {me} late peer ok")
"""


def test_start_kernel_leaves_a_late_peer_room_to_post(spmd):
    """Every CTA of a start kernel spins until its targets post: the peer's start kernel, which posts,
    must still find SMs. Rank 1 always starts 0.2 s late, so rank 0's whole grid is spinning when it
    does (grids fit the rank's SM share; the late peer has its own share)."""
    job = spmd(2, LATE_PEER, backend="cuda", timeout=240,
               env={"CIRCUSLINK_TIMEOUT": "20", "CIRCUSLINK_RMA_LAUNCH": "kernel"}).check()
    assert job.output.count("late peer ok") == 2, job.output


SMALL_CHAINS = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma

world = cl.init()
me, peer = world.rank, 1 - world.rank
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
win = rma.window_alloc(world, 1 << 14)
poison = np.random.default_rng([seed, 99, me]).integers(0, 256, 1 << 14, dtype=np.uint8)
win.local[:] = world.xp.asarray(poison)
# (writes, word width the commit must choose): 8 x 8 B plus a block-stride write of 8-byte blocks; then
# 16-byte aligned blocks only.
CHAINS = [([(i * 16, 8192 + i * 24, 1, 8, 8, 8) for i in range(8)] + [(512, 9000 - 9000 % 8, 5, 8, 24, 40)], 8),
          ([(1024 + i * 64, 12288 + i * 48, 1, 32, 32, 32) for i in range(4)] + [(2048, 12800, 3, 16, 48, 32)], 16)]
# What my window must hold, rebuilt from the seeds alone, across both queues: the first queue's last
# bytes stay where it wrote them after it is freed (the second one must not touch them).
window = poison.copy()
for k, (writes, width) in enumerate(CHAINS):
    q = rma.Queue.alloc(win)
    for src, dst, count, block, ss, ds in writes:
        if count == 1:
            q.push(rma.declare_write(win, dst, win, src, block, peer))
        else:
            q.push(rma.declare_strided_write(win, dst, win, src, count, block, ss, ds, peer))
    q.add_origin(peer)
    q.commit(timeout=30)
    plan = q.describe()
    total = sum(c * b for _, _, c, b, _, _ in writes)
    one_gpu = len(set(world.allgather_object(world.backend.device_identity))) == 1
    low_latency = os.environ.get("CIRCUSLINK_RMA_LOW_LATENCY", "1") == "1"
    # low-latency lines carry 8 bytes each, whatever width the fenced words would have
    assert plan["words"] == total // (8 if low_latency else width) and plan["grid"] == 1, plan
    assert plan["protocol"] == ("low-latency lines" if low_latency else "fenced"), plan
    assert plan["scope"] == ("gpu" if one_gpu else "sys"), plan
    for cycle in range(50):
        mine = np.random.default_rng([seed, k, cycle, me]).integers(0, 256, 4096, dtype=np.uint8)
        theirs = np.random.default_rng([seed, k, cycle, peer]).integers(0, 256, 4096, dtype=np.uint8)
        win.local[:4096] = world.xp.asarray(mine)
        window[:4096] = mine
        q.start()
        q.wait()
        for src, dst, count, block, ss, ds in writes:
            for b in range(count):
                window[dst + b * ds: dst + b * ds + block] = theirs[src + b * ss: src + b * ss + block]
        got = win.local.get()
        assert np.array_equal(got, window), (k, cycle, np.flatnonzero(got != window)[:8])
        world.barrier()
    q.free()
win.free()
world.close()
print(f"rank {me} small chains ok")
"""


@pytest.mark.parametrize("low_latency", ["1", "0"])
def test_small_chains_as_words_host_driven_byte_exact(spmd, low_latency):
    """Small aligned chains are committed as words (one 8-byte low-latency line each into the target's staging,
    or, with CIRCUSLINK_RMA_LOW_LATENCY=0, one 8- or 16-byte fenced store each into its window), counters at .gpu
    scope (ranks under MPS share the GPU), and start() is one graph launch: every byte of the window is right after
    each cycle, the bytes between strided blocks and around the writes keep their poison."""
    job = spmd(2, SMALL_CHAINS, backend="cuda", timeout=300, env={"CIRCUSLINK_RMA_LOW_LATENCY": low_latency}).check()
    assert job.output.count("small chains ok") == 2, job.output


MANY_ORIGINS = """
import os
import numpy as np
import circuslink as cl
from circuslink import rma

world = cl.init()
me, n = world.rank, world.size
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
fenced_rank = int(os.environ["FENCED_RANK"])  # -1: none; else that rank's chain cannot go as lines
silent_rank = int(os.environ["SILENT_RANK"])  # -1: none; else that rank only receives (no writes of its own)
rng = np.random.default_rng([seed, 7])
# Every rank writes to every other: a few blocks of 8..64 bytes (8-byte multiples) from its sources into its own
# slice of each target's window (the plan is the same on every rank: one generator, one seed).
plan = {}
for o in range(n):
    for t in range(n):
        if o != t and o != silent_rank:
            plan[(o, t)] = [(int(rng.integers(0, 64)) * 8, (o * n + t) * 512 + j * 80, int(rng.integers(1, 9)) * 8)
                            for j in range(int(rng.integers(1, 5)))]
win = rma.window_alloc(world, 1 << 16)
win.local[:] = 0xA5
q = rma.Queue.alloc(win)
for (o, t), writes in plan.items():
    if o == me:
        for src, dst, size in writes:
            if me == fenced_rank and dst == writes[0][1]:
                size -= 4  # a 4-byte tail: not a whole line, so this rank (and the whole queue) stays fenced
            q.push(rma.declare_write(win, 32768 + dst, win, src, size, t))
    if t == me:
        q.add_origin(o)
q.commit(timeout=30)
protocol = q.describe()["protocol"]
assert protocol == ("fenced" if fenced_rank >= 0 else "low-latency lines"), protocol
window = np.full(1 << 16, 0xA5, dtype=np.uint8)
for cycle in range(3 * 4 + 5):  # past the staging's depth: the credits are owed from then on
    srcs = {o: np.random.default_rng([seed, cycle, o]).integers(0, 256, 1024, dtype=np.uint8) for o in range(n)}
    win.local[:1024] = world.xp.asarray(srcs[me])
    window[:1024] = srcs[me]
    q.start()
    q.wait()
    for (o, t), writes in plan.items():
        if t == me:
            for src, dst, size in writes:
                if o == fenced_rank and dst == writes[0][1]:
                    size -= 4
                window[32768 + dst: 32768 + dst + size] = srcs[o][src: src + size]
    got = win.local.get()
    assert np.array_equal(got, window), (cycle, np.flatnonzero(got != window)[:8])
    world.barrier()
q.free()
win.free()
world.close()
print(f"rank {me} many origins ok ({protocol})")
"""


@pytest.mark.parametrize("fenced_rank, silent_rank", [("-1", "-1"), ("2", "-1"), ("-1", "3")])
def test_small_chains_many_origins_byte_exact(spmd, fenced_rank, silent_rank):
    """4 ranks, each writing a few random small blocks to every other (3 origins a target, staging regions side by
    side), for more cycles than the staging has slots: byte-exact each cycle. One rank whose chain cannot go as
    low-latency lines (a 4-byte tail) keeps the whole queue on the fenced protocol, and that is byte-exact too.
    A rank that only receives (the distributed FFT's reshapes onto uneven or empty boxes have them) starts its
    low-latency epochs with no words: its start stored through uninitialised registers, a misaligned or illegal
    address on the GPU."""
    job = spmd(4, MANY_ORIGINS, backend="cuda", timeout=300,
               env={"FENCED_RANK": fenced_rank, "SILENT_RANK": silent_rank}).check()
    assert job.output.count("many origins ok") == 4, job.output


GRID_DRIVEN = r'''
import os
import numpy as np
import cupy as cp
import circuslink as cl
from circuslink import rma

USER_KERNEL = r"""
#include <circuslink/rma.cuh>
__device__ unsigned char value(unsigned long long rank, unsigned long long cycle, unsigned long long i) {
  unsigned long long x = (rank * 0x9E3779B97F4A7C15ull) ^ (cycle * 0xBF58476D1CE4E5B9ull) ^ (i * 0x94D049BB133111EBull);
  x ^= x >> 31; x *= 0xD6E8FEB86774B5D3ull; x ^= x >> 29;
  return (unsigned char)(x >> 24);
}
// Sources [0, S): [0, S/2) contiguous to the right neighbour's [S, 3S/2); [S/2, S) as blocks of 512 B at
// source stride 512 to the neighbour's 2S at stride 768 (no packing). team == 0: the grid form, every block of the
// grid copies. team > 0: the team form, blocks [0, team) share the chain and go on while the others write a scratch
// area of their own (as a dslash's interior), and block 0 waits for the epoch its start returned.
extern "C" __global__ void grid_cycles(circuslink::RmaHandle q, circuslink::GridBarrier bar, unsigned char* win,
                                       unsigned long long S, unsigned long long me, unsigned long long left,
                                       unsigned long long cycles, unsigned long long* out, unsigned int team,
                                       unsigned char* scratch) {
  const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nt = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long bad = 0, done = 0;
  for (unsigned long long c = 0; c < cycles; ++c) {
    for (unsigned long long i = t; i < S; i += nt) win[i] = value(me, c, i);
    if (!circuslink::grid_sync(bar)) break;
    if (team == 0) {
      if (!circuslink::rma_start_grid(q, bar) || !circuslink::rma_wait_grid(q, bar)) break;
    } else {
      unsigned long long epoch = 0;
      bool ok = true;
      if (blockIdx.x < team) {
        ok = circuslink::rma_start_team(q, bar, team, epoch);
      } else {
        const unsigned long long first = t - team * (unsigned long long)blockDim.x, others = nt - team * blockDim.x;
        for (unsigned long long i = first; i < S; i += others) scratch[i] = value(me, c + 7, i);
      }
      if (blockIdx.x == 0) {
        __syncthreads();
        ok = ok && circuslink::rma_wait_epoch(q, epoch);
        if (threadIdx.x == 0 && ok) out[2] = c + 1;  // the grid barrier below makes it visible
      }
      if (!circuslink::grid_sync(bar)) break;
      if (*static_cast<volatile unsigned long long*>(&out[2]) != c + 1) break;  // block 0's wait failed
      for (unsigned long long i = t; i < S; i += nt) bad += scratch[i] != value(me, c + 7, i);
    }
    for (unsigned long long i = t; i < S / 2; i += nt) bad += win[S + i] != value(left, c, i);
    for (unsigned long long i = t; i < S / 2; i += nt) {
      const unsigned long long b = i / 512, k = i % 512;
      bad += win[2 * S + b * 768 + k] != value(left, c, S / 2 + i);
      if (k < 256) bad += win[2 * S + b * 768 + 512 + k] != 0xA5;   // the gaps keep their poison
    }
    if (!circuslink::grid_sync(bar)) break;  // every block has read the epoch before the next start
    ++done;
  }
  atomicAdd(&out[0], bad);
  if (t == 0) out[1] = done;
}
"""

world = cl.init()
me, n = world.rank, world.size
right, left = (me + 1) % n, (me - 1) % n
S = 4 << 20
win = rma.window_alloc(world, 2 * S + (S // 2 // 512) * 768)
win.local[:] = 0xA5
q = rma.Queue.alloc(win)
q.push(rma.declare_write(win, S, win, 0, S // 2, right))
q.push(rma.declare_strided_write(win, 2 * S, win, S // 2, S // 2 // 512, 512, 512, 768, right))
q.add_origin(left)
q.commit(timeout=30)
kernel = cl.compile(USER_KERNEL).get_function("grid_cycles")
backend = world.backend
blocks = backend.max_blocks(kernel, 256)
bar = backend.grid_barrier(timeout=30)
out = cp.zeros(3, dtype=cp.uint64)
team = int(os.environ.get("TEAM", "0"))  # 0: the grid form; k: the team form, k blocks (-1: all but one)
cp.cuda.Device().synchronize()
world.barrier()
if team:
    team = blocks - 1 if team < 0 else min(team, blocks - 1)
scratch = cp.zeros(S if team else 1, dtype=cp.uint8)
backend.launch_resident(kernel, blocks, 256, (q.device_handle(), bar.device_handle(), win.local, np.uint64(S),
                        np.uint64(me), np.uint64(left), np.uint64(20), out, np.uint32(team), scratch),
                        stream=backend.stream)
q.check_device()
bad, done, _ = (int(x) for x in out.get(stream=backend.stream))
assert done == 20 and bad == 0 and blocks > 1, (blocks, team, done, bad)
for _ in range(3):  # host-driven cycles continue from the device's epoch
    q.start()
    q.wait()
world.barrier()
q.free()
win.free()
world.close()
print(f"rank {me} grid-driven ok on {blocks} blocks")
'''


def test_device_driven_grid_forms_byte_exact(spmd):
    """rma_start_grid / rma_wait_grid: every block of a co-resident grid shares a 4 MiB chain (contiguous and
    512-byte block-stride), 20 cycles inside one kernel, every byte checked on the device each cycle."""
    job = spmd(2, GRID_DRIVEN, backend="cuda", timeout=300).check()
    assert job.output.count("grid-driven ok") == 2, job.output


@pytest.mark.parametrize("team", [1, 3, -1])
def test_device_driven_team_form_byte_exact(spmd, team):
    """rma_start_team / rma_wait_epoch: blocks [0, team) share the same chain and go on without waiting for one
    another while the other blocks write a scratch area of their own; block 0 waits for the epoch its start
    returned. 20 cycles in one kernel, every byte of the chain and of the scratch checked each cycle; then the
    host's cycles go on from the device's epoch (the last team block moved it on)."""
    job = spmd(2, GRID_DRIVEN, backend="cuda", timeout=300, env={"TEAM": str(team)}).check()
    assert job.output.count("grid-driven ok") == 2, job.output
