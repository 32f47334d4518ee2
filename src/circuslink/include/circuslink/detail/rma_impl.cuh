// circuslink/detail/rma_impl.cuh: the inline code behind circuslink/rma.cuh and the cuda back-end's RMA module's
// kernels (circuslink/rma/rma_kernels.cu). Every block-cooperative function here is correct for any
// block shape: threads are numbered by their linear index in the block (block_thread()), and warps
// are cut from it, the last one possibly partial.
#pragma once

#include "rma_types.cuh"
#include "sync.cuh"

namespace circuslink {
namespace detail {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ void rma_record_error(const RmaQueue& q, unsigned long long code,
                                                 unsigned long long rank, unsigned long long epoch) {
  // The first failure wins; later ones are consequences of it.
  if (atomicCAS(&q.state->failed, 0ull, 1ull) == 0ull) {
    volatile RmaErrorRecord* record = q.error;
    record->rank = rank;
    record->epoch = epoch;
    __threadfence_system();
    record->code = code;  // last: the host reads code first
    __threadfence_system();
  }
}

// Release / acquire / fence at the queue's scope (RmaQueue::flags): .gpu when every rank shares one GPU,
// .sys otherwise. Why this matters: start-to-wait of a device-driven 8 x 8 B chain took 17 us on one H200
// under MPS with every counter at .sys scope (four .sys release/acquire operations on each cycle's critical
// path: post, acquire of the post, arrival, acquire of the arrival) against a 0.28 us relaxed floor.
__device__ __forceinline__ bool rma_gpu_scope(const RmaQueue& q) { return (q.flags & kRmaGpuScope) != 0ull; }
__device__ __forceinline__ void rma_release_store(const RmaQueue& q, unsigned long long* p,
                                                  unsigned long long v) {
  if (rma_gpu_scope(q)) st_release_gpu_u64(p, v);
  else st_release_sys_u64(p, v);
}
__device__ __forceinline__ void rma_fence(const RmaQueue& q) {
  if (rma_gpu_scope(q)) fence_acq_rel_gpu();
  else fence_acq_rel_sys();
}

// Acquire load at the queue's scope: what every poll of a counter is, so that the poll that sees the value
// also orders what follows (a relaxed poll and then a separate acquire load cost one more trip to L2 on the
// critical path of every wait).
__device__ __forceinline__ unsigned long long rma_load_acquire(const RmaQueue& q, const unsigned long long* p) {
  return rma_gpu_scope(q) ? ld_acquire_gpu_u64(p) : ld_acquire_sys_u64(p);
}

// Polls made before a wait reads the clock: %globaltimer costs more than a poll, and most waits of a
// running exchange end within a few polls.
constexpr int kRmaPollsBeforeClock = 64;

// The counter one thread polls (`counter` of rank `rank`; nullptr: none), read before the call waits.
struct RmaPoll {
  const unsigned long long* counter;
  unsigned long long rank;
};

// Counter i of `n` in `slot_base + ranks[i]` of my signals (nullptr past n).
__device__ __forceinline__ RmaPoll rma_poll_slot(const RmaQueue& q, const unsigned long long* ranks,
                                                 unsigned long long slot_base, unsigned long long n,
                                                 unsigned long long i) {
  if (i >= n) return RmaPoll{nullptr, 0ull};
  const unsigned long long rank = ranks[i];
  return RmaPoll{q.signals + slot_base + rank, rank};
}

// The remote counter i of `n` (nullptr past n), read before the call waits: after an acquire (which
// invalidates L1) the pointer table would be one more L2 trip on the critical path.
__device__ __forceinline__ unsigned long long* rma_remote_slot(unsigned long long* const* remote,
                                                               unsigned long long n, unsigned long long i) {
  return i < n ? remote[i] : nullptr;
}

// One thread waits until *counter >= epoch, at most timeout_ns (0: no limit but the host's abort word).
// Polls are acquire loads at the queue's scope (no sleep, no back-off: a sleeping poller notices late).
// kAcquire false (a low-latency queue's credits): relaxed polls, since the counter orders nothing the poller
// reads afterwards (it only frees a staging slot for the poller's next stores).
template <bool kAcquire = true>
__device__ __forceinline__ bool rma_wait_one(const RmaQueue& q, const unsigned long long* counter,
                                             unsigned long long epoch, unsigned long long timeout_ns) {
  auto load = [&] { return kAcquire ? rma_load_acquire(q, counter) : ld_relaxed_u64(counter); };
#pragma unroll 1
  for (int k = 0; k < kRmaPollsBeforeClock; ++k) {
    if (load() >= epoch) return true;
  }
  Deadline deadline = Deadline::after(timeout_ns, q.abort);
  return spin_until([&] { return load() >= epoch; }, deadline);
}

// Threads of one block wait, in parallel, until counters[i] >= epoch for i in [0, n) (counter i: my
// signals[slot_base + ranks[i]]), each for at most timeout_ns. `mine` is counter block_thread(), read by
// the caller before it did anything that waits. Only one counter per peer is polled: the writer raises it
// once, after the last write of its chain to me. Returns false (and records `code`) on time-out.
// Block-cooperative (it ends with a block-wide vote).
template <bool kAcquire = true>
__device__ __forceinline__ bool rma_wait_counters(const RmaQueue& q, const unsigned long long* ranks,
                                                  unsigned long long slot_base, unsigned long long n,
                                                  unsigned long long epoch, unsigned long long code,
                                                  unsigned long long timeout_ns, RmaPoll mine) {
  bool ok = true;
  const unsigned long long t = block_thread();
  for (unsigned long long i = t; i < n; i += block_threads()) {
    const RmaPoll p = i == t ? mine : rma_poll_slot(q, ranks, slot_base, n, i);
    if (!rma_wait_one<kAcquire>(q, p.counter, epoch, timeout_ns)) {
      rma_record_error(q, code, p.rank, epoch);
      ok = false;
    }
  }
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// Raise each remote counter to `epoch` (release at the queue's scope: everything this thread wrote or saw
// before, the block's copies included through the barrier before the call, is visible to whoever acquires
// the value). Threads of one block share the counters; `mine` is remote[block_thread()], read ahead.
__device__ __forceinline__ void rma_raise(const RmaQueue& q, unsigned long long* const* remote,
                                          unsigned long long n, unsigned long long epoch,
                                          unsigned long long* mine) {
  const unsigned long long t = block_thread();
  for (unsigned long long i = t; i < n; i += block_threads()) rma_release_store(q, i == t ? mine : remote[i], epoch);
}

// Loads one lane keeps in flight before its stores: 64 bytes (4 to 8 words; more costs the start kernel
// its occupancy and the transposing starts spill).
template <typename T>
__device__ __forceinline__ constexpr unsigned int rma_words_in_flight() {
  return sizeof(T) >= 16 ? 4u : 8u;
}

// One warp copies `nbytes`: lane `lane` of `kLanes` takes words lane, lane + kLanes, ...
template <typename T, unsigned int kLanes>
__device__ __forceinline__ void rma_copy_span_full(T* d, const T* s, unsigned long long n, unsigned int lane) {
  // 64 bytes of loads in flight per lane before the stores (a 4 KiB unit in two rounds): peer stores are
  // latency-bound.
  constexpr unsigned int kAhead = rma_words_in_flight<T>();
  unsigned long long i = lane;
  for (; i + (kAhead - 1) * kLanes < n; i += kAhead * kLanes) {
    T v[kAhead];
#pragma unroll
    for (unsigned int k = 0; k < kAhead; ++k) v[k] = s[i + k * kLanes];
#pragma unroll
    for (unsigned int k = 0; k < kAhead; ++k) d[i + k * kLanes] = v[k];
  }
  for (; i < n; i += kLanes) d[i] = s[i];
}

// `lanes` threads (a full warp, or the partial last warp of a block whose size is not a multiple of
// 32) copy `nbytes` from src to dst in words of T.
template <typename T>
__device__ __forceinline__ void rma_copy_span(char* dst, const char* src, unsigned long long nbytes,
                                              unsigned int lane, unsigned int lanes) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  const unsigned long long n = nbytes / sizeof(T);
  if (lanes == 32u) {
    rma_copy_span_full<T, 32u>(d, s, n, lane);
    return;
  }
  for (unsigned long long i = lane; i < n; i += lanes) d[i] = s[i];
}

// `lanes` threads copy `rows` blocks of `row_bytes` (a whole number of T) from src (stride ss) to dst
// (stride ds), straight, no packing: the words of all the rows are dealt to the lanes as one list, so a
// warp keeps several loads in flight even when a block is a few words (a 512-byte block is one 16-byte
// word per lane: one warp per block would leave the warp idle on each block's latency).
template <typename T>
__device__ __forceinline__ void rma_copy_rows(char* dst, const char* src, unsigned int rows, unsigned int row_bytes,
                                              unsigned long long ss, unsigned long long ds, unsigned int lane,
                                              unsigned int lanes) {
  const unsigned int per_row = row_bytes / static_cast<unsigned int>(sizeof(T));
  const unsigned int n = rows * per_row;
  constexpr unsigned int kAhead = rma_words_in_flight<T>();
  unsigned int i = lane;
  for (; i + (kAhead - 1) * lanes < n; i += kAhead * lanes) {
    T v[kAhead];
    T* d[kAhead];
#pragma unroll
    for (unsigned int k = 0; k < kAhead; ++k) {
      const unsigned int w = i + k * lanes, r = w / per_row, c = w - r * per_row;
      v[k] = *reinterpret_cast<const T*>(src + r * ss + c * sizeof(T));
      d[k] = reinterpret_cast<T*>(dst + r * ds + c * sizeof(T));
    }
#pragma unroll
    for (unsigned int k = 0; k < kAhead; ++k) *d[k] = v[k];
  }
  for (; i < n; i += lanes) {
    const unsigned int r = i / per_row, c = i - r * per_row;
    *reinterpret_cast<T*>(dst + r * ds + c * sizeof(T)) = *reinterpret_cast<const T*>(src + r * ss + c * sizeof(T));
  }
}

struct alignas(16) RmaVec16 {
  unsigned long long x, y;
};

// A small chain's words (RmaQueue::words) that one thread copies first: their destinations and source
// bytes, loaded when the start begins, before it waits for the targets' posts. The sources are mine and
// final when the start is called; so the loads (of the word table, then of the sources: two dependent
// trips to memory) leave the critical path, and after the posts arrive the thread only stores. A kernel short
// of registers may define CIRCUSLINK_RMA_WORDS_AHEAD lower before it includes rma.cuh (as with the lines in flight
// below: each word ahead holds 6 registers across the wait for the posts).
#ifndef CIRCUSLINK_RMA_WORDS_AHEAD
#define CIRCUSLINK_RMA_WORDS_AHEAD 2
#endif
constexpr unsigned int kRmaWordsAhead = CIRCUSLINK_RMA_WORDS_AHEAD;
static_assert(kRmaWordsAhead >= 1, "CIRCUSLINK_RMA_WORDS_AHEAD: at least 1");
struct RmaWordsAhead {
  RmaVec16 value[kRmaWordsAhead];
  unsigned long long dst[kRmaWordsAhead];
};

__device__ __forceinline__ void rma_load_words_ahead(const RmaQueue& q, unsigned long long first,
                                                     unsigned long long stride, RmaWordsAhead& a) {
#pragma unroll
  for (unsigned int k = 0; k < kRmaWordsAhead; ++k) {
    const unsigned long long i = first + k * stride;
    a.dst[k] = 0ull;
    if (i < q.n_words) {
      const RmaWord w = q.words[i];
      a.dst[k] = w.dst;
      if (q.word_bytes == 16ull) a.value[k] = *reinterpret_cast<const RmaVec16*>(w.src);
      else a.value[k].x = *reinterpret_cast<const unsigned long long*>(w.src);
    }
  }
}

// A small chain's words shared by threads `first`, `first + stride`, ...: the ones loaded ahead are
// stored, the rest (chains of more words than kRmaWordsAhead x the threads) loaded and stored. One 8- or
// 16-byte store each, no descriptor walk. Block-stride writes are in the list block by block, copied
// straight from the strided source to the strided destination (no packing).
__device__ __forceinline__ void rma_copy_words(const RmaQueue& q, unsigned long long first,
                                               unsigned long long stride, const RmaWordsAhead& a) {
  const bool wide = q.word_bytes == 16ull;
#pragma unroll
  for (unsigned int k = 0; k < kRmaWordsAhead; ++k) {
    if (a.dst[k] == 0ull) continue;
    if (wide) *reinterpret_cast<RmaVec16*>(a.dst[k]) = a.value[k];
    else *reinterpret_cast<unsigned long long*>(a.dst[k]) = a.value[k].x;
  }
  for (unsigned long long i = first + kRmaWordsAhead * stride; i < q.n_words; i += stride) {
    const RmaWord w = q.words[i];
    if (wide) *reinterpret_cast<RmaVec16*>(w.dst) = *reinterpret_cast<const RmaVec16*>(w.src);
    else *reinterpret_cast<unsigned long long*>(w.dst) = *reinterpret_cast<const unsigned long long*>(w.src);
  }
}

template <typename T>
__device__ __forceinline__ void rma_copy_piece(char* dst, const char* src, unsigned int rows, unsigned long long len,
                                               unsigned long long ss, unsigned long long ds, unsigned int lane,
                                               unsigned int lanes) {
  if (rows == 1u) rma_copy_span<T>(dst, src, len, lane, lanes);
  else rma_copy_rows<T>(dst, src, rows, static_cast<unsigned int>(len), ss, ds, lane, lanes);
}

// One warp (`lanes` threads) copies work unit `unit` of the chain: a piece of at most kRmaChunkBytes of
// one block, or (blocks_per_unit > 1) up to blocks_per_unit whole small blocks.
__device__ __forceinline__ void rma_copy_unit(const RmaQueue& q, unsigned long long unit, unsigned int lane,
                                              unsigned int lanes) {
  // The descriptor holding `unit`: the last one whose unit_begin <= unit.
  unsigned long long lo = 0, hi = q.n_descs;
  while (hi - lo > 1) {
    const unsigned long long mid = (lo + hi) / 2;
    if (q.descs[mid].unit_begin <= unit) lo = mid; else hi = mid;
  }
  const RmaDescriptor& d = q.descs[lo];
  const unsigned long long k = unit - d.unit_begin;
  unsigned long long block, offset, len;
  unsigned int rows = 1u;
  if (d.blocks_per_unit > 1u) {
    block = k * d.blocks_per_unit;
    const unsigned long long left = d.count - block;
    rows = static_cast<unsigned int>(left < d.blocks_per_unit ? left : d.blocks_per_unit);
    offset = 0ull;
    len = d.block_bytes;
  } else {
    block = k / d.units_per_block;
    offset = (k % d.units_per_block) * kRmaChunkBytes;
    const unsigned long long left = d.block_bytes - offset;
    len = left < kRmaChunkBytes ? left : kRmaChunkBytes;
  }
  char* dst = reinterpret_cast<char*>(d.dst + block * d.dst_stride + offset);
  const char* src = reinterpret_cast<const char*>(d.src + block * d.src_stride + offset);
  const unsigned long long ss = d.src_stride, ds = d.dst_stride;
  switch (d.align) {
    case 16: rma_copy_piece<RmaVec16>(dst, src, rows, len, ss, ds, lane, lanes); break;
    case 8: rma_copy_piece<unsigned long long>(dst, src, rows, len, ss, ds, lane, lanes); break;
    case 4: rma_copy_piece<unsigned int>(dst, src, rows, len, ss, ds, lane, lanes); break;
    case 2: rma_copy_piece<unsigned short>(dst, src, rows, len, ss, ds, lane, lanes); break;
    default: rma_copy_piece<unsigned char>(dst, src, rows, len, ss, ds, lane, lanes); break;
  }
}

// The chain's units shared by `n_warps` warps; the caller is lane `lane` of `lanes` in warp `warp`.
__device__ __forceinline__ void rma_copy_chain(const RmaQueue& q, unsigned long long warp,
                                               unsigned long long n_warps, unsigned int lane, unsigned int lanes) {
  for (unsigned long long unit = warp; unit < q.total_units; unit += n_warps) rma_copy_unit(q, unit, lane, lanes);
}

// The chain's descriptors copied by the calling block, one of `blocks` doing the same (block `index`),
// any block shape: warps are cut from the linear thread index (as the hardware cuts them), the last one
// may be partial.
__device__ __forceinline__ void rma_copy_descriptors(const RmaQueue& q, unsigned long long index,
                                                     unsigned long long blocks) {
  const unsigned int t = block_thread(), threads = block_threads();
  const unsigned int warp = t / 32u, warps = (threads + 31u) / 32u;
  const unsigned int rest = threads - warp * 32u;
  rma_copy_chain(q, index * warps + warp, blocks * warps, t % 32u, rest < 32u ? rest : 32u);
}

// ---- low-latency queues (kRmaLowLatency) ----------------------------------------------------------------------
__device__ __forceinline__ bool rma_low_latency(const RmaQueue& q) { return (q.flags & kRmaLowLatency) != 0ull; }
__device__ __forceinline__ bool rma_signal_only(const RmaQueue& q) { return (q.flags & kRmaSignalOnly) != 0ull; }

// One 8-byte word as an LL line (sync.cuh: ll_store / ll_load) at a staging address, and the word back.
__device__ __forceinline__ void rma_line_store(unsigned long long addr, unsigned long long v, unsigned int flag) {
  ll_store(reinterpret_cast<uint4*>(addr), static_cast<unsigned int>(v), static_cast<unsigned int>(v >> 32), flag);
}
__device__ __forceinline__ unsigned long long rma_line_word(const uint4& v) {
  return static_cast<unsigned long long>(v.x) | (static_cast<unsigned long long>(v.z) << 32);
}

// A low-latency start's stores: the words of threads `first`, `first + stride`, ... as lines into epoch's
// staging slot (words[i].dst is the line's slot-0 address in the target's memory), the words loaded ahead first.
__device__ __forceinline__ void rma_store_lines(const RmaQueue& q, unsigned long long first,
                                                unsigned long long stride, const RmaWordsAhead& a,
                                                unsigned long long epoch) {
  const unsigned long long slot = (epoch % kRmaLLDepth) * q.ll_slot_bytes;
  const unsigned int flag = static_cast<unsigned int>(epoch);
#pragma unroll
  for (unsigned int k = 0; k < kRmaWordsAhead; ++k) {
    if (a.dst[k] != 0ull) rma_line_store(a.dst[k] + slot, a.value[k].x, flag);
  }
  for (unsigned long long i = first + kRmaWordsAhead * stride; i < q.n_words; i += stride) {
    const RmaWord w = q.words[i];
    rma_line_store(w.dst + slot, *reinterpret_cast<const unsigned long long*>(w.src), flag);
  }
}

// A low-latency start by threads `first`, `first + stride`, ... of the start's block or grid (block-cooperative):
// wait for the credits of epoch's staging slot (owed once the targets have consumed epoch - kRmaLLDepth; the
// first kRmaLLDepth epochs after commit are free), then store the lines. No post, no arrival counter.
__device__ __forceinline__ bool rma_start_lines(const RmaQueue& q, unsigned long long epoch,
                                                unsigned long long first, unsigned long long stride,
                                                const RmaPoll& credit, const RmaWordsAhead& a) {
  bool ok = true;
  if (epoch > q.ll_base + kRmaLLDepth) {
    ok = rma_wait_counters<false>(q, q.targets, q.size, q.n_targets, epoch - kRmaLLDepth, 1ull, q.timeout_ns,
                                  credit);
  }
  if (ok) rma_store_lines(q, first, stride, a, epoch);
  return ok;
}

// Lines a thread of a low-latency wait polls at once. Four keep their first polls in flight together; a kernel
// short of registers may define CIRCUSLINK_RMA_LINES_IN_FLIGHT lower before it includes rma.cuh (the resident CG:
// four lines' addresses and values, inlined into it, made it spill in loops that never wait).
#ifndef CIRCUSLINK_RMA_LINES_IN_FLIGHT
#define CIRCUSLINK_RMA_LINES_IN_FLIGHT 4
#endif
constexpr unsigned int kRmaLinesInFlight = CIRCUSLINK_RMA_LINES_IN_FLIGHT;
static_assert(kRmaLinesInFlight >= 1, "CIRCUSLINK_RMA_LINES_IN_FLIGHT: at least 1");

// A low-latency wait (block-cooperative): every line I receive, polled for epoch's flag (at most timeout_ns each)
// and its word stored to its destination; then "consumed through epoch" to every origin (relaxed: the lines'
// loads have returned, their values stored; nothing the origins read depends on more).
__device__ __forceinline__ bool rma_wait_lines(const RmaQueue& q, unsigned long long epoch,
                                               unsigned long long timeout_ns, unsigned long long* post) {
  const unsigned long long t = block_thread();
  const unsigned long long slot = (epoch % kRmaLLDepth) * q.ll_slot_bytes;
  const unsigned int flag = static_cast<unsigned int>(epoch);
  bool ok = true;
  const unsigned long long threads = block_threads();
  // A thread's lines go kRmaLinesInFlight at a time: all their first polls in flight at once, not one round trip
  // after another (a 4 KiB chain is 2 lines a thread of 256; a wait of 32 threads had 16 polls in series).
  for (unsigned long long i0 = t; i0 < q.n_lines; i0 += kRmaLinesInFlight * threads) {
    RmaLine line[kRmaLinesInFlight];
    uint4 v[kRmaLinesInFlight];
#pragma unroll
    for (unsigned int k = 0; k < kRmaLinesInFlight; ++k) {
      if (i0 + k * threads < q.n_lines) {
        line[k] = q.lines[i0 + k * threads];
        v[k] = ll_load(reinterpret_cast<const uint4*>(line[k].staging + slot));
      }
    }
#pragma unroll
    for (unsigned int k = 0; k < kRmaLinesInFlight; ++k) {
      if (i0 + k * threads >= q.n_lines) break;
      const unsigned long long at = line[k].staging + slot;
      bool seen = v[k].y == flag && v[k].w == flag;
      if (!seen) {
        Deadline deadline = Deadline::after(timeout_ns, q.abort);
        seen = spin_until([&] {
          v[k] = ll_load(reinterpret_cast<const uint4*>(at));
          return v[k].y == flag && v[k].w == flag;
        }, deadline);
      }
      if (seen) {
        *reinterpret_cast<unsigned long long*>(line[k].dst) = rma_line_word(v[k]);
      } else {
        rma_record_error(q, 2ull, line[k].origin, epoch);
        ok = false;
      }
    }
  }
  const bool all = __syncthreads_and(ok ? 1 : 0) != 0;
  for (unsigned long long i = t; i < q.n_origins; i += block_threads())
    st_relaxed_u64(i == t ? post : q.post_at_origin[i], epoch);
  return all;
}

// What one thread of a block that drives a queue reads before anything waits (rma_start / rma_wait and
// the start kernel): the counters it polls and raises, and its first words of a small chain.
struct RmaAhead {
  RmaPoll poll;                  // start: its target's post; wait: its origin's arrival
  unsigned long long* raise;     // start: its target's arrival counter; wait: its origin's post counter
  unsigned long long* post;      // start (posts at start): its origin's post counter
  RmaWordsAhead words;
};

// RmaAhead of the calling thread for a start whose words are dealt to threads `word_first`, `word_first +
// word_stride`, ... (the start's block or grid).
__device__ __forceinline__ RmaAhead rma_start_ahead(const RmaQueue& q, unsigned long long word_first,
                                                    unsigned long long word_stride) {
  const unsigned long long t = block_thread();
  RmaAhead a;
  a.poll = rma_poll_slot(q, q.targets, q.size, q.n_targets, t);
  a.raise = rma_remote_slot(q.arrival_at_target, q.n_targets, t);
  a.post = q.post_at_wait ? nullptr : rma_remote_slot(q.post_at_origin, q.n_origins, t);
  // Always, also for a rank with no words: it clears every slot first, and a low-latency start stores each slot
  // whose destination is not 0 (a target that writes nothing back stored through uninitialised registers).
  rma_load_words_ahead(q, word_first, word_stride, a.words);
  return a;
}

// Wait until every origin's writes of the current epoch have arrived (at most timeout_ns each), then,
// for a queue that posts at wait, post the next epoch. Block-cooperative. `q` is the handle's copy of
// the queue (RmaHandle::q, in the kernel's parameters), not the queue in device memory: every acquire
// invalidates L1, after which each field read there would be a trip to L2. The counters' addresses are
// read before the wait polls.
__device__ __forceinline__ bool rma_wait_queue(const RmaQueue& q, unsigned long long timeout_ns,
                                               unsigned long long epoch) {
  const unsigned long long t = block_thread();
  if (rma_low_latency(q)) {
    unsigned long long* post = rma_remote_slot(q.post_at_origin, q.n_origins, t);
    return rma_wait_lines(q, epoch, timeout_ns, post);
  }
  const RmaPoll mine = rma_poll_slot(q, q.origins, 0ull, q.n_origins, t);
  unsigned long long* post = q.post_at_wait ? rma_remote_slot(q.post_at_origin, q.n_origins, t) : nullptr;
  const bool ok = rma_wait_counters(q, q.origins, 0ull, q.n_origins, epoch, 2ull, timeout_ns, mine);
  if (q.post_at_wait) rma_raise(q, q.post_at_origin, q.n_origins, epoch + 1, post);
  return ok;
}

// The current epoch's wait (the queue's epoch, as the block's own start left it).
__device__ __forceinline__ bool rma_wait_queue(const RmaQueue& q, unsigned long long timeout_ns) {
  return rma_wait_queue(q, timeout_ns, q.state->epoch);
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace detail
}  // namespace circuslink
