// circuslink/grid.cuh - a barrier for every block of a co-resident grid, with a time-out.
//
// Kernels that call the channels' grid forms (write_grid, read_grid, forward_grid) more than once per
// launch separate the calls with grid_sync: a grid call takes its first packet number from the end's
// state and its last warp to leave stores the next one, so the next call must not start before the
// last warp has left. The grid must be co-resident (no more blocks than world.backend.max_blocks).
//
//   __global__ void k(circuslink::Sender<float> tx, unsigned int* bar, ...) {   // bar: 2 zeroed u32
//     for (int i = 0; i < steps; ++i) {
//       tx.write_grid(x + i * n, n);
//       if (!circuslink::grid_sync(bar, timeout_ns)) return;
//     }
//   }
#pragma once

#include "detail/sync.cuh"

namespace circuslink {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// Every thread of every block calls it. bar[0] counts arrivals, bar[1] is the generation; both start
// at 0 and are reused by later calls. False (on every thread) when the wait ran past timeout_ns (0:
// never) or the host aborted.
__device__ __forceinline__ bool grid_sync(unsigned int* bar, unsigned long long timeout_ns,
                                          const volatile unsigned int* abort = nullptr) {
  __shared__ int ok;
  __syncthreads();
  if (detail::block_thread() == 0) {
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    const unsigned int gen = detail::ld_relaxed(bar + 1);
    __threadfence();  // release: this block's writes before the arrival
    ok = 1;
    if (atomicAdd(bar, 1u) == blocks - 1) {
      bar[0] = 0u;
      __threadfence();
      detail::st_relaxed(bar + 1, gen + 1u);
    } else {
      detail::Deadline d = detail::Deadline::after(timeout_ns, abort);
      if (!detail::spin_until([&] { return detail::ld_relaxed(bar + 1) != gen; }, d)) ok = 0;
    }
    __threadfence();  // acquire: every block's writes before their arrivals
  }
  __syncthreads();
  return ok != 0;
}
#endif

}  // namespace circuslink
