// circuslink/rma.cuh: drive a committed RMA queue from inside a kernel.
//
// The host commits the queue (circuslink.rma.Queue.commit) and passes its device handle to the
// kernel by value, as every circuslink device handle:  kernel(..., queue.device_handle())
//
//   #include <circuslink/rma.cuh>
//   __global__ void step(circuslink::RmaHandle q, ...) {
//     if (blockIdx.x == 0) {               // one block drives the exchange
//       circuslink::rma_start(q);          // post my window, write my chain, signal targets
//       bool ok = circuslink::rma_wait(q); // my origins' writes of this epoch have arrived
//     }
//   }
//
// Both are block-cooperative: every thread of the calling block calls them (they synchronise the
// block), with any block shape (1-D, 2-D or 3-D, any size), and only one block at a time may drive
// a given queue. The data that rma_wait makes visible is visible to the calling block; other blocks
// need a grid-wide sync after it, and must have finished reading last epoch's incoming bytes before
// rma_start (it lets origins overwrite them). A wait that times out (the queue's time-out: the one
// given to commit(timeout=), else CIRCUSLINK_TIMEOUT) records the stalled rank and returns false;
// the host raises it with queue.check_device(). A queue with transposing puts
// (rma.declare_transpose_write) needs #include <circuslink/transpose.cuh> BEFORE this header:
// rma_start then turns their tiles in the calling block's shared memory (kTransposeTileBytes, 18 KiB
// of static shared memory and more registers, which kernels without transposing puts do not pay).
// Compiled without it, rma_start on such a queue returns false and check_device() says so.
#pragma once

#include "detail/rma_impl.cuh"
#if defined(CIRCUSLINK_TRANSPOSE_PUTS)
#include "detail/transpose_impl.cuh"
#endif

namespace circuslink {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

namespace detail {

// rma_start on the queue itself (here, not in rma_impl.cuh: whether it turns transposing puts depends
// on the includes of the kernel's translation unit).
__device__ __forceinline__ bool rma_start_queue(const RmaQueue& q) {
  const unsigned long long epoch = q.state->epoch + 1;
#if !defined(CIRCUSLINK_TRANSPOSE_PUTS)
  if (q.transposes != nullptr) {  // compiled without them: refuse rather than skip them silently
    if (block_thread() == 0) rma_record_error(q, 3ull, 0ull, epoch);
    __syncthreads();
    return false;
  }
#endif
  if (!q.post_at_wait) rma_raise(q, q.post_at_origin, q.n_origins, epoch);
  const bool ok = rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull, q.timeout_ns);
  if (ok) {
    rma_copy_chain_block(q);
#if defined(CIRCUSLINK_TRANSPOSE_PUTS)
    if (q.transposes != nullptr) transpose_chain<0>(*q.transposes, 0, 1);
#endif
    __syncthreads();
    rma_raise(q, q.arrival_at_target, q.n_targets, epoch);
  }
  __syncthreads();  // every thread has read state->epoch
  if (block_thread() == 0) q.state->epoch = epoch;
  __syncthreads();
  return ok;
}

}  // namespace detail

// Start the next epoch: post my window to my origins (unless the queue posts at wait), wait until
// every target has posted, copy the chain with this block, then raise my arrival counter at every
// target. Returns false if a target never posted (recorded for the host).
__device__ __forceinline__ bool rma_start(RmaHandle queue) { return detail::rma_start_queue(*queue.queue); }

// Wait until every origin's writes of the current epoch have arrived. Returns false on time-out
// (recorded for the host).
__device__ __forceinline__ bool rma_wait(RmaHandle queue) {
  return detail::rma_wait_queue(*queue.queue, queue.queue->timeout_ns);
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace circuslink
