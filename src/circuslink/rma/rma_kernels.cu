// Kernels of the cuda RMA engine (circuslink/rma/_cuda.py compiles this file with NVRTC).
//
//   kernel engine: start = one launch of circuslink_rma_start (post, wait for the
//                  targets' posts, every CTA copies its share of the chain, the last CTA
//                  raises the arrival counters); wait = one launch of circuslink_rma_wait.
//                  circuslink_rma_start_transposeN: the same, then the transposing puts' tiles
//                  (N: their element size, 0 when mixed).
//   graph engine:  start = one CUDA graph: circuslink_rma_prologue (post, wait for posts),
//                  a 2-D copy-engine copy per handle, circuslink_rma_epilogue (signal).
//   device-driven: circuslink_rma_device_cycles runs start + wait `iters` times inside one
//                  kernel through rma.cuh, as a user kernel would (tests and bench).
#include <circuslink/rma.cuh>
#include <circuslink/detail/transpose_impl.cuh>

using circuslink::RmaQueue;

// The start launch; kTransposes (the element size of the queue's transposing puts, 0 for mixed
// sizes, -1 for none) adds their tiles after the copies, in kernels of their own: the tiles'
// shared memory and registers would cost the plain copy its occupancy.
template <int kTransposes>
__device__ __forceinline__ void rma_start_launch(const RmaQueue* queue) {
  const RmaQueue& q = *queue;
  const unsigned long long epoch = q.state->epoch + 1;
  if (blockIdx.x == 0 && !q.post_at_wait) circuslink::detail::rma_raise(q.post_at_origin, q.n_origins, epoch);
  const bool ok = circuslink::detail::rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull);
  const unsigned long long warps_per_block = (blockDim.x + 31u) / 32u;
  if (ok) {
    circuslink::detail::rma_copy_chain(q, blockIdx.x * warps_per_block + threadIdx.x / 32u,
                                       gridDim.x * warps_per_block);
    if constexpr (kTransposes >= 0) {
      circuslink::detail::transpose_chain<kTransposes>(*q.transposes, blockIdx.x, gridDim.x);
    }
  }
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    // Release this CTA's copies (bar.sync above makes the fence cover every thread's),
    // then count; the CTA that counts last acquires everyone's and signals.
    __threadfence_system();
    last = atomicAdd(&q.state->done_ctas, 1ull) == gridDim.x - 1ull;
    if (last) __threadfence_system();
  }
  __syncthreads();
  if (!last) return;
  const bool failed = circuslink::detail::ld_relaxed_u64(&q.state->failed) != 0ull;
  if (!failed) circuslink::detail::rma_raise(q.arrival_at_target, q.n_targets, epoch);
  __syncthreads();
  if (threadIdx.x == 0) {
    q.state->done_ctas = 0ull;  // every CTA of this launch has counted; the next launch starts at 0
    q.state->epoch = epoch;
  }
}

extern "C" __global__ void circuslink_rma_start(const RmaQueue* queue) { rma_start_launch<-1>(queue); }
// At most 85 registers (3 blocks of 256 per SM) without spilling; the mixed-size one needs more.
extern "C" __global__ void __launch_bounds__(256, 3) circuslink_rma_start_transpose4(const RmaQueue* queue) {
  rma_start_launch<4>(queue);
}
extern "C" __global__ void __launch_bounds__(256, 3) circuslink_rma_start_transpose8(const RmaQueue* queue) {
  rma_start_launch<8>(queue);
}
extern "C" __global__ void __launch_bounds__(256, 3) circuslink_rma_start_transpose16(const RmaQueue* queue) {
  rma_start_launch<16>(queue);
}
extern "C" __global__ void circuslink_rma_start_transpose0(const RmaQueue* queue) { rma_start_launch<0>(queue); }

extern "C" __global__ void circuslink_rma_wait(const RmaQueue* queue, unsigned long long timeout_ns) {
  RmaQueue q = *queue;
  q.timeout_ns = timeout_ns;  // wait(timeout=...) may differ from the commit-time default
  circuslink::rma_wait(&q);
}

extern "C" __global__ void circuslink_rma_prologue(const RmaQueue* queue) {
  const RmaQueue& q = *queue;
  const unsigned long long epoch = q.state->epoch + 1;
  if (!q.post_at_wait) circuslink::detail::rma_raise(q.post_at_origin, q.n_origins, epoch);
  circuslink::detail::rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull);
}

extern "C" __global__ void circuslink_rma_epilogue(const RmaQueue* queue) {
  const RmaQueue& q = *queue;
  const unsigned long long epoch = q.state->epoch + 1;
  // The copy-engine copies before this node have completed (graph order); make sure the
  // counters are not seen before them by any observer.
  __threadfence_system();
  const bool failed = circuslink::detail::ld_relaxed_u64(&q.state->failed) != 0ull;
  if (!failed) circuslink::detail::rma_raise(q.arrival_at_target, q.n_targets, epoch);
  __syncthreads();
  if (threadIdx.x == 0) q.state->epoch = epoch;
}

// Device-driven cycles, as a user kernel runs them: block 0 does `iters` x (start, wait).
// out[0] = cycles that succeeded, out[1] = %globaltimer nanoseconds for all of them.
extern "C" __global__ void circuslink_rma_device_cycles(const RmaQueue* queue, unsigned long long iters,
                                                        unsigned long long* out) {
  if (blockIdx.x != 0) return;
  const unsigned long long t0 = circuslink::detail::globaltimer_ns();
  unsigned long long done = 0;
  for (unsigned long long i = 0; i < iters; ++i) {
    if (!circuslink::rma_start(queue)) break;
    if (!circuslink::rma_wait(queue)) break;
    ++done;
  }
  if (threadIdx.x == 0) {
    out[0] = done;
    out[1] = circuslink::detail::globaltimer_ns() - t0;
  }
}
