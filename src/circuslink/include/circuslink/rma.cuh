// circuslink/rma.cuh: drive a committed RMA queue from inside a kernel.
//
// The host commits the queue (circuslink.rma.Queue.commit) and passes its device handle
// to the kernel as a pointer:  kernel(..., numpy.uint64(queue.device_handle()))
//
//   #include <circuslink/rma.cuh>
//   __global__ void step(const circuslink::RmaQueue* q, ...) {
//     if (blockIdx.x == 0) {               // one block drives the exchange
//       circuslink::rma_start(q);          // post my window, write my chain, signal targets
//       bool ok = circuslink::rma_wait(q); // my origins' writes of this epoch have arrived
//     }
//   }
//
// Both are block-cooperative: every thread of the calling block calls them (they use
// __syncthreads), and only one block at a time may drive a given queue. The data that
// rma_wait makes visible is visible to the calling block; other blocks need a grid-wide
// sync after it, and must have finished reading last epoch's incoming bytes before
// rma_start (it lets origins overwrite them). A wait that times out (the queue's time-out,
// CIRCUSLINK_TIMEOUT) records the stalled rank and returns false; the host raises it with
// queue.check_device(). A queue with transposing puts (rma.declare_transpose_write) needs
// #include <circuslink/transpose.cuh> BEFORE this header: rma_start then turns their tiles in the
// calling block's shared memory (kTransposeTileBytes, 18 KiB of static shared memory and more
// registers, which kernels without transposing puts do not pay). Compiled without it, rma_start
// on such a queue returns false and check_device() says so.
#pragma once

#include "detail/rma_impl.cuh"
#if defined(CIRCUSLINK_TRANSPOSE_PUTS)
#include "detail/transpose_impl.cuh"
#endif

namespace circuslink {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Start the next epoch: post my window to my origins (unless the queue posts at wait),
// wait until every target has posted, copy the chain with this block, then raise my
// arrival counter at every target. Returns false if a target never posted.
__device__ __forceinline__ bool rma_start(const RmaQueue* queue) {
  const RmaQueue& q = *queue;
  const unsigned long long epoch = q.state->epoch + 1;
#if !defined(CIRCUSLINK_TRANSPOSE_PUTS)
  if (q.transposes != nullptr) {  // compiled without them: refuse rather than skip them silently
    if (detail::block_thread() == 0) detail::rma_record_error(q, 3ull, 0ull, epoch);
    __syncthreads();
    return false;
  }
#endif
  if (!q.post_at_wait) detail::rma_raise(q.post_at_origin, q.n_origins, epoch);
  bool ok = detail::rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull);
  if (ok) {
    detail::rma_copy_chain(q, detail::block_thread() / 32u, (detail::block_threads() + 31u) / 32u);
#if defined(CIRCUSLINK_TRANSPOSE_PUTS)
    if (q.transposes != nullptr) detail::transpose_chain<0>(*q.transposes, 0, 1);
#endif
    __syncthreads();
    detail::rma_raise(q.arrival_at_target, q.n_targets, epoch);
  }
  __syncthreads();  // every thread has read state->epoch
  if (detail::block_thread() == 0) q.state->epoch = epoch;
  __syncthreads();
  return ok;
}

// Wait until every origin's writes of the current epoch have arrived. Returns false on
// time-out (recorded for the host).
__device__ __forceinline__ bool rma_wait(const RmaQueue* queue) {
  const RmaQueue& q = *queue;
  const unsigned long long epoch = q.state->epoch;
  const bool ok = detail::rma_wait_counters(q, q.origins, 0ull, q.n_origins, epoch, 2ull);
  if (q.post_at_wait) {
    detail::rma_raise(q.post_at_origin, q.n_origins, epoch + 1);
    __syncthreads();
  }
  return ok;
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace circuslink
