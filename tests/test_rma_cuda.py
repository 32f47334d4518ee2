"""RMA queues on the cuda back-end (run on the device machine: ranks share its GPU under MPS).

The same ring body as tests/test_rma.py (byte-exact, poisoned windows, fresh data every
cycle), host-driven with both engines, then device-driven: a user kernel that includes
<circuslink/rma.cuh> fills its sources, starts, waits and checks what arrived, 1,000
times without returning to the host. Also the mpi back-end on a cuda world (host staging).
"""

from __future__ import annotations

import pytest
from test_rma import RING

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("engine", ["kernel", "graph"])
@pytest.mark.parametrize("cycles", [20, 1000])
def test_cuda_ring_host_driven(spmd, engine, cycles):
    code = RING.format(backend="cuda", cycles=cycles, post_at="start")
    job = spmd(2, code, backend="cuda", env={"CIRCUSLINK_RMA_ENGINE": engine}, timeout=300).check()
    assert job.output.count(f"ok {cycles} cycles") == 2, job.output


def test_cuda_ring_post_at_wait(spmd):
    code = RING.format(backend="cuda", cycles=50, post_at="wait")
    job = spmd(2, code, backend="cuda", timeout=300).check()
    assert job.output.count("ok 50 cycles") == 2, job.output


@pytest.mark.mpi
def test_mpi_backend_on_cuda_world_stages_through_host(spmd):
    code = RING.format(backend="mpi", cycles=50, post_at="start")
    job = spmd(2, code, backend="cuda", launcher="mpirun", timeout=300).check()
    assert job.output.count("ok 50 cycles") == 2, job.output


DEVICE_DRIVEN = r'''
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
// Sources: [0, 1024) contiguous to the right neighbour's [4096, 5120); 16 blocks of 24 B
// at stride 32 from 1024 to the right neighbour's 6144 at stride 40.
extern "C" __global__ void user_cycles(const circuslink::RmaQueue* q, unsigned char* win, unsigned long long me,
                                       unsigned long long left, unsigned long long cycles, unsigned long long* out) {
  unsigned long long bad = 0, done = 0;
  for (unsigned long long c = 0; c < cycles; ++c) {
    for (unsigned int i = threadIdx.x; i < 2048; i += blockDim.x) win[i] = value(me, c, i);
    __syncthreads();
    if (!circuslink::rma_start(q)) break;
    if (!circuslink::rma_wait(q)) break;
    for (unsigned int i = threadIdx.x; i < 1024; i += blockDim.x) bad += win[4096 + i] != value(left, c, i);
    for (unsigned int i = threadIdx.x; i < 16 * 24; i += blockDim.x) {
      unsigned int b = i / 24, k = i % 24;
      bad += win[6144 + b * 40 + k] != value(left, c, 1024 + b * 32 + k);
    }
    // Untouched bytes between the strided blocks keep their poison (0xA5).
    for (unsigned int i = threadIdx.x; i < 15 * 16; i += blockDim.x) {
      unsigned int b = i / 16, k = i % 16;
      bad += win[6144 + b * 40 + 24 + k] != 0xA5;
    }
    __syncthreads();  // everyone has read this epoch's bytes before the next start lets them change
    ++done;
  }
  atomicAdd(&out[0], bad);
  if (threadIdx.x == 0) out[1] = done;
}
"""

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
kernel = cl.compile(USER_KERNEL).get_function("user_cycles")
out = cp.zeros(2, dtype=cp.uint64)
CYCLES = 1000
with world.backend.stream:
    kernel((1,), (256,), (np.uint64(q.device_handle()), win.local, np.uint64(me), np.uint64(left),
                          np.uint64(CYCLES), out))
q.check_device()
bad, done = (int(x) for x in out.get())
assert done == CYCLES and bad == 0, (done, bad)
# Host-driven cycles continue from the device's epoch without a reset.
for _ in range(3):
    q.start()
    q.wait()
done, ns = q._impl.device_cycles(100)
assert done == 100, done
world.barrier()
q.free()
win.free()
world.close()
print(f"rank {me} device-driven ok, {ns / 1e3:.2f} us a cycle")
'''


def test_cuda_device_driven_user_kernel(spmd):
    job = spmd(2, DEVICE_DRIVEN, backend="cuda", timeout=300).check()
    assert job.output.count("device-driven ok") == 2, job.output


TIMEOUT = """
import circuslink as cl
from circuslink import rma
world = cl.init()
win = rma.window_alloc(world, 4096)
q = rma.Queue.alloc(win)
if world.rank == 0:
    q.push(rma.declare_write(win, 0, win, 1024, 64, 1))
else:
    q.add_origin(0)
q.commit()
if world.rank == 1:
    q.start()
    try:
        q.wait(timeout=0.5)
    except cl.TimeoutError as exc:
        print("ERR", exc)
world.barrier(timeout=30)
"""


def test_cuda_wait_times_out_on_the_device(spmd):
    job = spmd(2, TIMEOUT, backend="cuda", timeout=120).check()
    assert "on the device waiting for the writes of origin rank(s) 0" in job.output, job.output


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
    job = spmd(2, LATE_PEER, backend="cuda", timeout=240, env={"CIRCUSLINK_TIMEOUT": "20"}).check()
    assert job.output.count("late peer ok") == 2, job.output
