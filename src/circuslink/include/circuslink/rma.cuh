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

// ---- sessions ------------------------------------------------------------------------------------------------
// A block's session on a queue, for a kernel that drives one queue cycle after cycle (a persistent halo
// exchange), as a channel end's session keeps its state in registers. rma_session(queue) reads, once, the queue's
// epoch and each thread's share of what the cycles address: its words' sources and their lines in the targets'
// staging, the lines it polls and their destinations, its target's credit and its origin's consumed counter.
// start() and wait() then read from memory only the sources' bytes and the lines and credits they wait on; a
// credit read stays in a register until the staging needs a newer one (once every kRmaLLDepth epochs at most).
// close() stores the epoch back, so that host-driven cycles, rma_start / rma_wait and a later session go on from
// it. Every thread of the block calls each of the four; between rma_session and close() nothing else drives the
// queue. start(): the block's threads have written the sources before it (it meets them at its one barrier);
// wait(): the incoming bytes are visible to the whole block after it; both return the same answer on every
// thread, false when a wait timed out (recorded for the host, as rma_start / rma_wait record it).
//
// A session takes a low-latency queue (kRmaLowLatency: small chains of plain writes, decided at commit) whose
// words and lines the block holds: at most kRmaWordsAhead words and kRmaLinesInFlight lines a thread, and a thread
// for each target and each origin (Queue.describe()["session_threads"]: the fewest threads that do). On any other
// queue rma_session records why (the host's check_device raises it) and start() and wait() return false: use
// rma_start / rma_wait there. Why sessions: of a low-latency cycle's 1.28 us (8 x 8 B, 2 ranks on one H200), a
// cycle written by hand with its addresses in registers took 0.76 us; the rest were the reads of the epoch, the
// word and line tables and the credit before each cycle's stores and polls (BENCHMARKS.md, fifth session).
struct RmaSession {
  RmaQueue q;                                        // the handle's copy (kernel parameters, then registers)
  unsigned long long epoch;                          // the last epoch started
  bool taken;                                        // the queue is one a session takes (else refused, recorded)
  unsigned long long word_src[detail::kRmaWordsAhead];   // this thread's words: where their bytes are read,
  unsigned long long word_line[detail::kRmaWordsAhead];  //   their lines in the targets' staging (slot 0; 0: none)
  unsigned long long line_at[detail::kRmaLinesInFlight];   // the lines this thread polls (slot 0 of my staging;
  unsigned long long line_dst[detail::kRmaLinesInFlight];  //   0: none) and where their words go
  const unsigned long long* credit;                  // thread t < n_targets: target t's consumed count, in my memory
  unsigned long long credit_seen;                    // the count it read last
  unsigned long long* consumed;                      // thread t < n_origins: my consumed count in origin t's memory

  __device__ bool start() {
    if (!taken) return false;
    const unsigned long long e = epoch + 1;
    epoch = e;  // moves on whatever happens, as rma_start's epoch does
    bool ok = true;
    // Staging slot e % kRmaLLDepth is free once the target has consumed e - kRmaLLDepth (the first kRmaLLDepth
    // epochs after commit are free).
    if (credit != nullptr && e > q.ll_base + kRmaLLDepth && credit_seen + kRmaLLDepth < e) {
      const unsigned long long need = e - kRmaLLDepth;
      unsigned long long c = detail::ld_relaxed_u64(credit);
      if (c < need) {
        detail::Deadline deadline = detail::Deadline::after(q.timeout_ns, q.abort);
        if (!detail::spin_until([&] { return (c = detail::ld_relaxed_u64(credit)) >= need; }, deadline)) {
          detail::rma_record_error(q, 1ull, q.targets[detail::block_thread()], need);  // as rma_start records it
          ok = false;
        }
      }
      credit_seen = c;
    }
    // One barrier: the block's sources are written, and every target's slot is free (or a wait failed).
    if (__syncthreads_and(ok ? 1 : 0) == 0) return false;
    const unsigned long long slot = (e % kRmaLLDepth) * q.ll_slot_bytes;
    unsigned long long v[detail::kRmaWordsAhead];
#pragma unroll
    for (unsigned int k = 0; k < detail::kRmaWordsAhead; ++k) {  // every load in flight before the first store
      if (word_line[k] != 0ull) v[k] = *reinterpret_cast<const unsigned long long*>(word_src[k]);
    }
#pragma unroll
    for (unsigned int k = 0; k < detail::kRmaWordsAhead; ++k) {
      if (word_line[k] != 0ull) detail::rma_line_store(word_line[k] + slot, v[k], static_cast<unsigned int>(e));
    }
    return true;
  }

  __device__ bool wait() {
    if (!taken) return false;
    const unsigned long long slot = (epoch % kRmaLLDepth) * q.ll_slot_bytes;
    const unsigned int flag = static_cast<unsigned int>(epoch);
    bool ok = true;
    uint4 v[detail::kRmaLinesInFlight];
#pragma unroll
    for (unsigned int k = 0; k < detail::kRmaLinesInFlight; ++k) {  // every first poll in flight at once
      if (line_at[k] != 0ull) v[k] = detail::ll_load(reinterpret_cast<const uint4*>(line_at[k] + slot));
    }
#pragma unroll
    for (unsigned int k = 0; k < detail::kRmaLinesInFlight; ++k) {
      if (line_at[k] == 0ull) continue;
      const uint4* at = reinterpret_cast<const uint4*>(line_at[k] + slot);
      bool seen = v[k].y == flag && v[k].w == flag;
      if (!seen) {
        detail::Deadline deadline = detail::Deadline::after(q.timeout_ns, q.abort);
        seen = detail::spin_until([&] {
          v[k] = detail::ll_load(at);
          return v[k].y == flag && v[k].w == flag;
        }, deadline);
      }
      if (seen) {
        *reinterpret_cast<unsigned long long*>(line_dst[k]) = detail::rma_line_word(v[k]);
      } else {  // the origin, read only now: the rare path
        const unsigned long long i = detail::block_thread() + k * static_cast<unsigned long long>(detail::block_threads());
        detail::rma_record_error(q, 2ull, q.lines[i].origin, epoch);
        ok = false;
      }
    }
    // Every line's load has returned (its slot may be written again) and its word is visible to the block.
    const bool all = __syncthreads_and(ok ? 1 : 0) != 0;
    if (consumed != nullptr) detail::st_relaxed_u64(consumed, epoch);
    return all;
  }

  // Stores the epoch back (every thread calls it; it ends with a block barrier).
  __device__ void close() {
    if (taken && detail::block_thread() == 0) q.state->epoch = epoch;
    __syncthreads();
  }
};

// Open a session (every thread of the block calls it; see RmaSession).
__device__ __forceinline__ RmaSession rma_session(const RmaHandle& queue) {
  RmaSession s;
  s.q = queue.q;
  const RmaQueue& q = queue.q;
  const unsigned long long t = detail::block_thread(), threads = detail::block_threads();
  s.taken = detail::rma_low_latency(q) && !detail::rma_signal_only(q) && q.transposes == nullptr &&
           q.n_words <= threads * detail::kRmaWordsAhead && q.n_lines <= threads * detail::kRmaLinesInFlight &&
           q.n_targets <= threads && q.n_origins <= threads;
  s.epoch = q.state->epoch;
  s.credit = nullptr;
  s.credit_seen = 0ull;
  s.consumed = nullptr;
#pragma unroll
  for (unsigned int k = 0; k < detail::kRmaWordsAhead; ++k) {
    const unsigned long long i = t + k * threads;
    s.word_src[k] = s.word_line[k] = 0ull;
    if (s.taken && i < q.n_words) {
      const RmaWord w = q.words[i];
      s.word_src[k] = w.src;
      s.word_line[k] = w.dst;
    }
  }
#pragma unroll
  for (unsigned int k = 0; k < detail::kRmaLinesInFlight; ++k) {
    const unsigned long long i = t + k * threads;
    s.line_at[k] = s.line_dst[k] = 0ull;
    if (s.taken && i < q.n_lines) {
      const RmaLine line = q.lines[i];
      s.line_at[k] = line.staging;
      s.line_dst[k] = line.dst;
    }
  }
  if (s.taken && t < q.n_targets) s.credit = q.signals + q.size + q.targets[t];
  if (s.taken && t < q.n_origins) s.consumed = q.post_at_origin[t];
  // A queue a session does not take: recorded (the host's check_device names what does not fit), and every
  // start() and wait() of the session returns false.
  if (!s.taken && t == 0) detail::rma_record_error(q, kRmaErrSession, threads, s.epoch);
  return s;
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace circuslink
