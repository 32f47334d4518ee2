// The host API's collectives on the cuda back-end (circuslink/collectives/_cuda.py): one launch per
// call over the rings or the team of a Comm. Compiled at run time with circuslink.compile, in parts
// that the host compiles only when a call first needs one (NVRTC takes seconds a part):
//   CL_COLLECTIVES_PART 1: the untyped kernels (ring broadcast and barrier; team all-gather, broadcast,
//                          barrier), extern "C";
//   CL_COLLECTIVES_PART 2: the team's all-reduce and reduce-scatter, templates instantiated by name
//                          (cl_team_allreduce<float, circuslink::collectives::Sum>, ...), one part per type;
//   CL_COLLECTIVES_PART 3: the ring all-reduce (cl_allreduce<float, ...::Sum>, ...), one part per type.
// Without the define every kernel is there (what the header checks compile).
#include <circuslink/collectives.cuh>

#ifndef CL_COLLECTIVES_PART
#define CL_COLLECTIVES_PART 0
#endif
#define CL_PART(k) (CL_COLLECTIVES_PART == 0 || CL_COLLECTIVES_PART == (k))

namespace {

// The first block that fails says so; the host then asks the channels which one stalled.
__device__ __forceinline__ void cl_fail(int* status) {
  if (circuslink::detail::block_thread() == 0) atomicExch(status, 1);
}

}  // namespace

#if CL_PART(3)
template <class T, class Op>
__global__ void __launch_bounds__(512) cl_allreduce(circuslink::collectives::Rings rings, T* data, unsigned long long n, int* status) {
  if (!circuslink::collectives::allreduce_grid(rings, data, n, Op())) cl_fail(status);
}

#endif

#if CL_PART(1)
extern "C" __global__ void __launch_bounds__(512) cl_broadcast(circuslink::collectives::Rings rings, unsigned char* data,
                                        unsigned long long n, unsigned int root, int* status) {
  if (!circuslink::collectives::broadcast_grid(rings, data, n, root)) cl_fail(status);
}

extern "C" __global__ void __launch_bounds__(512) cl_barrier(circuslink::collectives::Rings rings, int* status) {
  if (!circuslink::collectives::barrier_block(rings)) cl_fail(status);
}

#endif

#if CL_PART(2)
// The shared-memory team (Team handle): algo 1 = one-shot, 2 = two-shot (the host picks by size, from the
// same table as the device's cc::allreduce). Failures are in the team's error record (the host reads it
// and names peer and slot).
template <class T, class Op>
__global__ void __launch_bounds__(512) cl_team_allreduce(circuslink::collectives::Team team, const T* in, T* out,
                                                         unsigned long long n, int algo) {
  namespace cc = circuslink::collectives;
  if (algo == 1) cc::allreduce_oneshot(team, in, out, n, Op());
  else cc::allreduce_twoshot(team, in, out, n, Op());
}

template <class T, class Op>
__global__ void __launch_bounds__(512) cl_team_reduce_scatter(circuslink::collectives::Team team, const T* in, T* out,
                                                              unsigned long long count) {
  circuslink::collectives::reduce_scatter(team, in, out, count, Op());
}

#endif

#if CL_PART(1)
extern "C" __global__ void __launch_bounds__(512) cl_team_all_gather(circuslink::collectives::Team team,
                                                                     const unsigned char* in, unsigned char* out,
                                                                     unsigned long long count) {
  circuslink::collectives::all_gather(team, in, out, count);
}

extern "C" __global__ void __launch_bounds__(512) cl_team_broadcast(circuslink::collectives::Team team,
                                                                    unsigned char* data, unsigned long long n,
                                                                    unsigned int root) {
  circuslink::collectives::broadcast(team, data, n, root);
}

extern "C" __global__ void __launch_bounds__(512) cl_team_barrier(circuslink::collectives::Team team) {
  circuslink::collectives::barrier(team);
}
#endif
