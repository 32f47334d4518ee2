// The timed loops of `circuslink bench allreduce` (circuslink/bench/allreduce.py): `iters` in-place sum
// all-reduces back to back in one launch, as a user's kernel would call them, through the public
// device API alone (collectives.cuh, trace.cuh). Every loop starts with the team's device-side barrier
// (cc::barrier: every block of every rank has arrived) before its clock, as nccl-tests barriers before
// timing. Instantiated by name: allreduce_loop<float>, team_oneshot_loop<float>, team_stage_loop<float>, ...
// (int too).
#include <circuslink/collectives.cuh>
#include <circuslink/trace.cuh>

namespace cc = circuslink::collectives;
namespace tr = circuslink::trace;

// t[0] / t[1]: after the barrier (block 0) / the last block's end (ns; the host zeroes them). failed: 1 when a
// call returns false (a wait timed out; the host raises the channel's or the team's error).
__device__ __forceinline__ void loop_end(unsigned long long* t, unsigned long long t0) {
  __syncthreads();
  if (circuslink::detail::block_thread() == 0) {
    if (blockIdx.x == 0) t[0] = t0;
    atomicMax(t + 1, tr::now_ns());
  }
}

__device__ __forceinline__ void loop_fail(int* failed) {
  if (circuslink::detail::block_thread() == 0) atomicExch(failed, 1);
}

// The ring over channels (rings: comm.device_handle(nbytes)); the team only for the barrier before the
// clock (a team of size 1, a zeroed handle, where ranks share no memory: no barrier).
template <class T>
__global__ void __launch_bounds__(512) allreduce_loop(cc::Rings rings, cc::Team team, T* data, unsigned long long n,
                                                      unsigned int iters, unsigned long long* t, tr::Handle trace,
                                                      int* failed) {
  if (!cc::barrier(team)) return loop_fail(failed);
  const unsigned long long t0 = tr::now_ns();
  for (unsigned int i = 0; i < iters; ++i) {
    tr::record_block(trace, tr::USER, tr::PHASE_BEGIN, i);
    if (!cc::allreduce_grid(rings, data, n, cc::Sum())) return loop_fail(failed);
    tr::record_block(trace, tr::USER, tr::PHASE_END, i);
  }
  loop_end(t, t0);
}

// The team's one-shot on `data` (any device memory). One block an SM is all it needs, and saying so lets
// the compiler keep the call in registers: with __launch_bounds__(512) alone it held the kernel to 32
// registers and spilled in the one-shot's poll path (1.64 against 0.67 us a call at 4 ranks, one H200).
template <class T>
__global__ void __launch_bounds__(512, 1) team_oneshot_loop(cc::Team team, T* data, unsigned long long n,
                                                         unsigned int iters, unsigned long long* t, int* failed) {
  if (!cc::barrier(team)) return loop_fail(failed);
  const unsigned long long t0 = tr::now_ns();
  for (unsigned int i = 0; i < iters; ++i) {
    if (!cc::allreduce_oneshot(team, data, data, n, cc::Sum())) return loop_fail(failed);
  }
  loop_end(t, t0);
}

// The team's two-shot in place on the stage (the symmetric form: the data is copied there first, outside
// the clock). A kernel of its own, not a switch in the one-shot's: each gets its own registers (one kernel
// for both spilled in the fold's loop).
template <class T>
__global__ void __launch_bounds__(512) team_stage_loop(cc::Team team, T* data, unsigned long long n,
                                                       unsigned int iters, unsigned long long* t, int* failed) {
  circuslink::collectives::detail::grid_copy(cc::stage<T>(team), data, n);
  if (!cc::barrier(team)) return loop_fail(failed);
  const unsigned long long t0 = tr::now_ns();
  for (unsigned int i = 0; i < iters; ++i) {
    if (!cc::allreduce_stage<T>(team, n, cc::Sum())) return loop_fail(failed);
  }
  loop_end(t, t0);
}
