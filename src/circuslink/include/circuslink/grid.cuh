// circuslink/grid.cuh - a barrier for every block of a co-resident grid, with a time-out.
//
// Kernels that call the channels' grid forms (write_grid, read_grid, forward_grid) more than once per
// launch separate the calls with grid_sync, and so does a persistent kernel between its iterations: a
// grid call takes its first packet number from the end's state and its last warp to leave stores the
// next one, so the next call must not start before the last warp has left.
//
// The host makes the barrier and launches the grid (docs/user-kernels.md):
//
//   bar = world.backend.grid_barrier(timeout=ch.timeout)      # zeroed words, the abort word, the time-out
//   world.backend.launch_resident(fn, blocks, 256, (tx.device_handle(), bar.device_handle(), ...))
//
//   __global__ void k(circuslink::Sender<float> tx, circuslink::GridBarrier bar, ...) {
//     for (int i = 0; i < steps; ++i) {
//       tx.write_grid(x + i * n, n);
//       if (!circuslink::grid_sync(bar)) return;              // false on every thread: timed out or aborted
//     }
//   }
//
// The grid must be co-resident: launch_resident refuses a grid larger than world.backend.max_blocks
// allows for the kernel (its registers, shared memory, block size and the rank's share of the GPU) and
// launches it cooperatively, so that every block runs at once; otherwise a block that never starts
// leaves the others waiting until the time-out.
#pragma once

#include "detail/sync.cuh"

namespace circuslink {

// What the host gives a kernel (by value; the host's table is circuslink.backends._grid.GRID_BARRIER).
struct GridBarrier {
  unsigned int* counters;              // 2 words in device memory, zeroed: the arrival count, and rma_start_team's
                                       // count of a team's blocks (rma.cuh; grid_sync leaves it alone)
  const volatile unsigned int* abort;  // host-mapped: the host sets it to end every device wait (may be null)
  unsigned long long timeout_ns;       // a wait gives up after this long (0: never; the host's abort still ends it)
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// Every thread of every block calls it. One word counts the arrivals: block 0 adds 2^31 - (blocks - 1) and every
// other block 1, so the last arrival flips the word's top bit and leaves its low bits as they were; a block that has
// arrived waits for the flip it can compute from the value its own atomic returned. One atomic and one poll a
// block: no reset and no separate generation store after the last arrival, each of which would add a round trip
// through L2 (a 2-word form with them took 1.5 us a barrier on one H200). grid_sync leaves bar[1] alone
// (rma_start_team counts a team in it). False (on every thread) when the wait ran past timeout_ns (0: never) or the host aborted; the barrier
// is then spent, as any barrier a block left early. The form below passes the three from the GridBarrier handle.
__device__ __forceinline__ bool grid_sync(unsigned int* bar, unsigned long long timeout_ns,
                                          const volatile unsigned int* abort = nullptr) {
  __shared__ int ok;
  const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
  if (blocks == 1) {  // one block: no arrival counter and nothing to wait for, the same fence for other ranks
    __syncthreads();
    if (detail::block_thread() == 0) __threadfence();
    __syncthreads();
    return true;
  }
  __syncthreads();
  if (detail::block_thread() == 0) {
    const bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    const unsigned int add = first ? 0x80000000u - (blocks - 1u) : 1u;
    __threadfence();  // release: this block's writes before the arrival
    ok = 1;
    const unsigned int before = atomicAdd(bar, add);
    const auto flipped = [&] { return ((detail::ld_relaxed(bar) ^ before) & 0x80000000u) != 0u; };
    if (!flipped()) {
      detail::Deadline d = detail::Deadline::after(timeout_ns, abort);
      if (!detail::spin_until(flipped, d)) ok = 0;
    }
    __threadfence();  // acquire: every block's writes before their arrivals
  }
  __syncthreads();
  return ok != 0;
}

__device__ __forceinline__ bool grid_sync(const GridBarrier& bar) {
  return grid_sync(bar.counters, bar.timeout_ns, bar.abort);
}
#endif

}  // namespace circuslink
