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
#include "grid.cuh"
#if defined(CIRCUSLINK_TRANSPOSE_PUTS)
#include "detail/transpose_impl.cuh"
#endif

namespace circuslink {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

namespace detail {

// rma_start on the queue itself (here, not in rma_impl.cuh: whether it turns transposing puts depends
// on the includes of the kernel's translation unit), by block `index` of `blocks` blocks that start it
// together (1 for rma_start; the grid for rma_start_grid, whose caller raises the arrivals after a grid
// barrier). `q` is the handle's copy (see rma_wait_queue). One epoch's critical path, when the target
// posts at its start: the post's trip to me, my stores, one release and the arrival's trip to the target;
// everything read from memory (the counters' addresses, the small chain's words and their source bytes)
// is read before the start waits for the post.
__device__ __forceinline__ bool rma_start_blocks(const RmaQueue& q, unsigned long long index, unsigned long long blocks,
                                                 bool raise_arrivals, RmaAhead& a) {
  const unsigned long long epoch = q.state->epoch + 1;
#if !defined(CIRCUSLINK_TRANSPOSE_PUTS)
  if (q.transposes != nullptr) {  // compiled without them: refuse rather than skip them silently
    if (block_thread() == 0) rma_record_error(q, 3ull, 0ull, epoch);
    __syncthreads();
    return false;
  }
#endif
  const unsigned long long t = block_thread(), threads = block_threads();
  if (rma_signal_only(q)) {  // the caller's own stores are the epoch's writes: release them, raise the arrivals
    a.raise = rma_remote_slot(q.arrival_at_target, q.n_targets, t);
    __syncthreads();  // the block's stores before the release (other blocks': a grid barrier before the call)
    if (!raise_arrivals) return true;
    if (t == 0) q.state->epoch = epoch;
    rma_raise(q, q.arrival_at_target, q.n_targets, epoch, a.raise);
    __syncthreads();  // the new epoch, for this block's next call
    return true;
  }
  a.poll = rma_poll_slot(q, q.targets, q.size, q.n_targets, t);
  if (rma_low_latency(q)) {  // lines into the targets' staging: no post, no arrival (rma_types.cuh)
    __syncthreads();  // the block's threads wrote the sources before the call
    rma_load_words_ahead(q, index * threads + t, blocks * threads, a.words);
    const bool ok = rma_start_lines(q, epoch, index * threads + t, blocks * threads, a.poll, a.words);
    __syncthreads();  // the block's stores before the epoch moves on (ok is the block's: rma_start_lines votes)
    if (!raise_arrivals) return ok;
    if (t == 0) q.state->epoch = epoch;
    __syncthreads();  // the new epoch, for this block's next call
    return ok;
  }
  a.raise = rma_remote_slot(q.arrival_at_target, q.n_targets, t);
  if (index == 0 && !q.post_at_wait) {
    rma_raise(q, q.post_at_origin, q.n_origins, epoch, rma_remote_slot(q.post_at_origin, q.n_origins, t));
  }
  if (q.words != nullptr) {
    // The block's threads wrote the sources before the call: they are read ahead, so meet first.
    __syncthreads();
    rma_load_words_ahead(q, index * threads + t, blocks * threads, a.words);
  }
  const bool ok = rma_wait_counters(q, q.targets, q.size, q.n_targets, epoch, 1ull, q.timeout_ns, a.poll);
  if (ok) {
    if (q.words != nullptr) rma_copy_words(q, index * threads + t, blocks * threads, a.words);
    else rma_copy_descriptors(q, index, blocks);
#if defined(CIRCUSLINK_TRANSPOSE_PUTS)
    if (q.transposes != nullptr) transpose_chain<0>(*q.transposes, static_cast<unsigned int>(index),
                                                    static_cast<unsigned int>(blocks));
#endif
  }
  __syncthreads();  // the block's copies before the arrival; every thread has read state->epoch
  if (!raise_arrivals) return ok;
  if (t == 0) q.state->epoch = epoch;
  if (ok) rma_raise(q, q.arrival_at_target, q.n_targets, epoch, a.raise);
  __syncthreads();  // the new epoch, for this block's next call
  return ok;
}

// The end of a start that several blocks shared, by the one block that ends it once every block's copies (and
// failures) are visible to it: the queue's epoch moves on and, unless a block failed, the arrivals are raised.
// Whether none failed.
__device__ __forceinline__ bool rma_finish_shared_start(const RmaQueue& q, unsigned long long epoch,
                                                        const RmaAhead& a) {
  const bool ok = ld_relaxed_u64(&q.state->failed) == 0ull;
  if (block_thread() == 0) q.state->epoch = epoch;
  if (ok && !rma_low_latency(q)) {  // low-latency lines carry their epoch: no arrival
    if (!rma_gpu_scope(q)) fence_acq_rel_sys();  // the other blocks' copies, to the system
    rma_raise(q, q.arrival_at_target, q.n_targets, epoch, a.raise);
  }
  __syncthreads();
  return ok;
}

}  // namespace detail

// Start the next epoch: post my window to my origins (unless the queue posts at wait), wait until
// every target has posted, copy the chain with this block, then raise my arrival counter at every
// target. Returns false if a target never posted (recorded for the host).
__device__ __forceinline__ bool rma_start(RmaHandle queue) {
  detail::RmaAhead a;
  return detail::rma_start_blocks(queue.q, 0ull, 1ull, true, a);
}

// Wait until every origin's writes of the current epoch have arrived. Returns false on time-out
// (recorded for the host).
__device__ __forceinline__ bool rma_wait(RmaHandle queue) {
  return detail::rma_wait_queue(queue.q, queue.q.timeout_ns);
}

// The grid forms, for chains too large for one block (a 16 MiB chain copied by one block of 256 threads
// runs at a few tens of GB/s): every thread of every block of a co-resident grid calls them (launched
// with world.backend.launch_resident, at most world.backend.max_blocks blocks: the blocks wait for the
// targets' posts, so they must all run at once), with the grid's barrier (world.backend.grid_barrier()).
// The blocks share the copy; after a grid barrier block 0 raises the arrivals. rma_wait_grid: block 0
// waits, then the barrier makes the incoming bytes visible to every block. The same answer on every
// thread: false when a wait or the barrier timed out. Sources written by other blocks need a grid_sync
// before rma_start_grid (as every read of another block's writes does).
__device__ __forceinline__ bool rma_start_grid(RmaHandle queue, const GridBarrier& bar) {
  const RmaQueue& q = queue.q;
  const unsigned long long index = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned long long blocks = static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z;
  detail::RmaAhead a;
  const unsigned long long epoch = q.state->epoch + 1;  // read before the barrier lets block 0 advance it
  detail::rma_start_blocks(q, index, blocks, false, a);
  if (!grid_sync(bar)) return false;  // every block's copies are done and visible (gpu scope)
  // Every block's failure was recorded before the barrier: one answer for the whole grid.
  if (index == 0) return detail::rma_finish_shared_start(q, epoch, a);
  return detail::ld_relaxed_u64(&q.state->failed) == 0ull;
}

// The team form, for a co-resident grid whose other blocks have work of their own while the chain goes out (a
// dslash's interior while its faces travel): blocks 0 .. team-1 call it (every thread of each), share the copy and
// go on without waiting for one another; the last of them to finish raises the arrivals. It counts the team's blocks
// in the barrier's second word, which grid_sync leaves alone, and leaves it at 0; so between two team starts on the
// same barrier the grid must pass a grid_sync. `epoch` receives the epoch started, for rma_wait_epoch by any team
// block (the queue's own epoch moves on only once the last one is done). Why a team: one block's copy moves a few
// tens of GB/s (the loads it keeps in flight), and a team of k shares the chain's units k ways. The answer for this
// block: false when a target never posted (recorded for the host).
__device__ __forceinline__ bool rma_start_team(RmaHandle queue, const GridBarrier& bar, unsigned int team,
                                               unsigned long long& epoch) {
  const RmaQueue& q = queue.q;
  const unsigned long long index = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  detail::RmaAhead a;
  epoch = q.state->epoch + 1;  // every team block reads it before the last one can move it on
  const bool ok = detail::rma_start_blocks(q, index, team, false, a);  // ends with the block's __syncthreads
  __shared__ int last;
  if (detail::block_thread() == 0) {
    __threadfence();  // release: this block's copies before its count
    last = atomicAdd(bar.counters + 1, 1u) == team - 1u;
    if (last) {
      atomicExch(bar.counters + 1, 0u);
      __threadfence();  // acquire: the other team blocks' copies before the arrivals
    }
  }
  __syncthreads();
  if (last) detail::rma_finish_shared_start(q, epoch, a);  // every team block's failure was recorded before its count
  return ok;
}

// rma_wait for the epoch a team start returned (the queue's own epoch may not have moved on yet).
__device__ __forceinline__ bool rma_wait_epoch(RmaHandle queue, unsigned long long epoch) {
  return detail::rma_wait_queue(queue.q, queue.q.timeout_ns, epoch);
}

__device__ __forceinline__ bool rma_wait_grid(RmaHandle queue, const GridBarrier& bar) {
  const unsigned long long index = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (index == 0) detail::rma_wait_queue(queue.q, queue.q.timeout_ns);
  if (!grid_sync(bar)) return false;
  return detail::ld_relaxed_u64(&queue.q.state->failed) == 0ull;  // block 0's answer, for every block
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace circuslink
