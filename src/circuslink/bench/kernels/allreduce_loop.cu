// The timed loop of `circuslink bench allreduce` (circuslink/bench/allreduce.py): `iters` in-place sum
// all-reduces back to back in one launch, as a user's kernel would call them, through the public
// device API alone (collectives.cuh, trace.cuh). Instantiated by name: allreduce_loop<float>, <int>.
#include <circuslink/collectives.cuh>
#include <circuslink/trace.cuh>

namespace cc = circuslink::collectives;
namespace tr = circuslink::trace;

// t[0] / t[1]: the first block's start / the last block's end (ns; the host sets them to ~0 / 0).
// Each block records a USER span per operation (nothing with the null trace handle). failed: set
// to 1 when a call returns false (a channel wait timed out; the host raises the channel's error).
template <class T>
__global__ void __launch_bounds__(512) allreduce_loop(cc::Rings rings, T* data, unsigned long long n, unsigned int iters,
                               unsigned long long* t, tr::Handle trace, int* failed) {
  const bool leader = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  if (blockIdx.x >= rings.count) return;  // a block without a slice would time nothing
  const unsigned long long t0 = tr::now_ns();
  for (unsigned int i = 0; i < iters; ++i) {
    tr::record_block(trace, tr::USER, tr::PHASE_BEGIN, i);
    if (!cc::allreduce_grid(rings, data, n, cc::Sum())) {
      if (leader) atomicExch(failed, 1);
      return;
    }
    tr::record_block(trace, tr::USER, tr::PHASE_END, i);
  }
  __syncthreads();
  if (leader) {
    atomicMin(t, t0);
    atomicMax(t + 1, tr::now_ns());
  }
}
