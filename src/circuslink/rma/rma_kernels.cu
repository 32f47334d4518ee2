// Kernels of the cuda back-end's RMA windows (circuslink/rma/_cuda.py compiles this file with NVRTC). Each takes
// the queue's device handle (circuslink::RmaHandle) by value, as user kernels do.
//
//   kernel launch: start = one launch of circuslink_rma_start (post, wait for the
//                  targets' posts, every CTA copies its share of the chain, the last CTA
//                  raises the arrival counters); wait = one launch of circuslink_rma_wait;
//                  a host-driven cycle = one launch of circuslink_rma_cycle (the start, then the
//                  last CTA waits).
//                  circuslink_rma_start_transposeN: the same, then the transposing puts' tiles
//                  (N: their element size, 0 when mixed).
//   graph launch:  start = one CUDA graph: circuslink_rma_prologue (post, wait for posts),
//                  a 2-D copy-engine copy per handle, circuslink_rma_epilogue (signal).
// Device-driven cycles are the user's kernels, through <circuslink/rma.cuh>.
//
// Compiled in parts, each once per process and only when a queue needs it (rma/_cuda.py: NVRTC takes about 1 s a
// part, 5 s for all of them at once): without CIRCUSLINK_RMA_TRANSPOSE_ELEM the plain kernels (start, cycle,
// wait, prologue, epilogue); with it (4, 8, 16, or 0 for mixed sizes) the start and cycle kernels of queues whose
// transposing puts move elements of that size (circuslink_rma_start_transposeN, circuslink_rma_cycle_transposeN).
#include <circuslink/rma.cuh>
#include <circuslink/detail/transpose_impl.cuh>

using circuslink::RmaHandle;
using circuslink::RmaQueue;
namespace cd = circuslink::detail;

// The start launch (a 1-D grid of 1-D blocks, launched by rma/_cuda.py); kTransposes (the element size
// of the queue's transposing puts, 0 for mixed sizes, -1 for none) adds their tiles after the copies,
// in kernels of their own: the tiles' shared memory and registers would cost the plain copy its occupancy.
// kWait: the cycle kernel of a host-driven start() (one graph node, not two): the CTA that raises the
// arrivals then waits for the origins' writes, as circuslink_rma_wait does (the queue's time-out).
template <int kTransposes, bool kWait>
__device__ __forceinline__ void rma_start_launch(const RmaQueue q) {
  const unsigned long long epoch = q.state->epoch + 1;
  const unsigned int threads = cd::block_threads(), t = cd::block_thread();
  const unsigned long long first = static_cast<unsigned long long>(blockIdx.x) * threads + t;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * threads;
  const cd::RmaAhead a = cd::rma_start_ahead(q, first, stride);  // before anything waits
  // One CTA and no post to wait for: a signal-only queue (nothing to copy: the stream's earlier stores are the
  // epoch's writes) or lines into the targets' staging (a small chain).
  if (cd::rma_signal_only(q) || cd::rma_low_latency(q)) {
    if (cd::rma_signal_only(q)) {
      if (!cd::rma_gpu_scope(q)) cd::rma_fence(q);  // .gpu: the kernel boundary before this launch ordered them
      cd::rma_raise(q, q.arrival_at_target, q.n_targets, epoch, a.raise);
    } else {
      cd::rma_start_lines(q, epoch, first, stride, a.poll, a.words);
    }
    __syncthreads();
    if (t == 0) q.state->epoch = epoch;
    if constexpr (kWait) {
      __syncthreads();  // the new epoch, for the wait's read
      cd::rma_wait_queue(q, q.timeout_ns);
    }
    return;
  }
  if (blockIdx.x == 0 && !q.post_at_wait) cd::rma_raise(q, q.post_at_origin, q.n_origins, epoch, a.post);
  const bool ok = cd::rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull, q.timeout_ns, a.poll);
  if (ok) {
    if (q.words != nullptr) cd::rma_copy_words(q, first, stride, a.words);  // a small chain: words over the grid
    else cd::rma_copy_descriptors(q, blockIdx.x, gridDim.x);
    if constexpr (kTransposes >= 0) {
      cd::transpose_chain<kTransposes>(*q.transposes, blockIdx.x, gridDim.x);
    }
  }
  __syncthreads();
  __shared__ int last;
  if (gridDim.x == 1u) {
    last = 1;  // one CTA (every small chain): no count, its barrier above orders the copies before the signal
  } else if (t == 0) {
    // Release this CTA's copies (bar.sync above makes the fence cover every thread's),
    // then count; the CTA that counts last acquires everyone's and signals.
    cd::rma_fence(q);
    last = atomicAdd(&q.state->done_ctas, 1ull) == gridDim.x - 1ull;
    if (last) cd::rma_fence(q);
  }
  __syncthreads();
  if (!last) return;
  const bool failed = cd::ld_relaxed_u64(&q.state->failed) != 0ull;
  if (!failed) cd::rma_raise(q, q.arrival_at_target, q.n_targets, epoch, a.raise);
  __syncthreads();
  if (t == 0) {
    q.state->done_ctas = 0ull;  // every CTA of this launch has counted; the next launch starts at 0
    q.state->epoch = epoch;
  }
  if constexpr (kWait) {
    __syncthreads();  // the new epoch, for the wait's read
    cd::rma_wait_queue(q, q.timeout_ns);
  }
}

// circuslink_rma_start*: start(stream=) and the copy-engine-free start; circuslink_rma_cycle*: the start and the
// wait of a host-driven cycle in one launch.
#ifdef CIRCUSLINK_RMA_TRANSPOSE_ELEM
#if CIRCUSLINK_RMA_TRANSPOSE_ELEM == 0
// Mixed element sizes: more registers than the kernels of one size.
extern "C" __global__ void circuslink_rma_start_transpose0(RmaHandle h) { rma_start_launch<0, false>(h.q); }
extern "C" __global__ void circuslink_rma_cycle_transpose0(RmaHandle h) { rma_start_launch<0, true>(h.q); }
#else
// One element size: at most 85 registers (3 blocks of 256 per SM).
#define CIRCUSLINK_RMA_TRANSPOSE_KERNEL(name, elem, wait)                                          \
  extern "C" __global__ void __launch_bounds__(256, 3) name(RmaHandle h) { rma_start_launch<elem, wait>(h.q); }
#if CIRCUSLINK_RMA_TRANSPOSE_ELEM == 4
CIRCUSLINK_RMA_TRANSPOSE_KERNEL(circuslink_rma_start_transpose4, 4, false)
CIRCUSLINK_RMA_TRANSPOSE_KERNEL(circuslink_rma_cycle_transpose4, 4, true)
#elif CIRCUSLINK_RMA_TRANSPOSE_ELEM == 8
CIRCUSLINK_RMA_TRANSPOSE_KERNEL(circuslink_rma_start_transpose8, 8, false)
CIRCUSLINK_RMA_TRANSPOSE_KERNEL(circuslink_rma_cycle_transpose8, 8, true)
#elif CIRCUSLINK_RMA_TRANSPOSE_ELEM == 16
CIRCUSLINK_RMA_TRANSPOSE_KERNEL(circuslink_rma_start_transpose16, 16, false)
CIRCUSLINK_RMA_TRANSPOSE_KERNEL(circuslink_rma_cycle_transpose16, 16, true)
#else
#error "CIRCUSLINK_RMA_TRANSPOSE_ELEM must be 0, 4, 8 or 16"
#endif
#endif
#else  // the plain kernels
extern "C" __global__ void circuslink_rma_start(RmaHandle h) { rma_start_launch<-1, false>(h.q); }
extern "C" __global__ void circuslink_rma_cycle(RmaHandle h) { rma_start_launch<-1, true>(h.q); }

// wait(timeout=...) may differ from the queue's time-out: it comes as an argument.
extern "C" __global__ void circuslink_rma_wait(RmaHandle h, unsigned long long timeout_ns) {
  cd::rma_wait_queue(h.q, timeout_ns);
}

extern "C" __global__ void circuslink_rma_prologue(RmaHandle h) {
  const RmaQueue& q = h.q;
  const unsigned long long epoch = q.state->epoch + 1;
  const unsigned long long t = cd::block_thread();
  const cd::RmaPoll poll = cd::rma_poll_slot(q, q.targets, q.size, q.n_targets, t);
  if (!q.post_at_wait) {
    cd::rma_raise(q, q.post_at_origin, q.n_origins, epoch, cd::rma_remote_slot(q.post_at_origin, q.n_origins, t));
  }
  cd::rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull, q.timeout_ns, poll);
}

extern "C" __global__ void circuslink_rma_epilogue(RmaHandle h) {
  const RmaQueue& q = h.q;
  const unsigned long long epoch = q.state->epoch + 1;
  unsigned long long* raise = cd::rma_remote_slot(q.arrival_at_target, q.n_targets, cd::block_thread());
  // The copy-engine copies before this node have completed (graph order); make sure the
  // counters are not seen before them by any observer (at the queue's scope).
  cd::rma_fence(q);
  const bool failed = cd::ld_relaxed_u64(&q.state->failed) != 0ull;
  if (!failed) cd::rma_raise(q, q.arrival_at_target, q.n_targets, epoch, raise);
  __syncthreads();
  if (cd::block_thread() == 0) q.state->epoch = epoch;
}
#endif  // CIRCUSLINK_RMA_TRANSPOSE_ELEM
