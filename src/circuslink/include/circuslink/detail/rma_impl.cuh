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
__device__ __forceinline__ void rma_acquire_load(const RmaQueue& q, const unsigned long long* p) {
  if (rma_gpu_scope(q)) (void)ld_acquire_gpu_u64(p);
  else (void)ld_acquire_sys_u64(p);
}
__device__ __forceinline__ void rma_fence(const RmaQueue& q) {
  if (rma_gpu_scope(q)) fence_acq_rel_gpu();
  else fence_acq_rel_sys();
}

// Threads of one block wait, in parallel, until counters[i] >= epoch for i in [0, n), each for at
// most timeout_ns (0: no limit but the host's abort word). Polls are relaxed (the cheap loop, no sleep,
// no back-off: a sleeping poller notices late); once satisfied one acquire load (the queue's scope) orders
// what follows after the writer's release. A counter already there costs one load: the deadline (a
// %globaltimer read) is made only when a wait really waits. Only one counter per peer is polled: the
// writer raises it once, after the last write of its chain to me. Returns false (and records `code`) on
// time-out. Block-cooperative (it ends with a block-wide vote).
__device__ __forceinline__ bool rma_wait_counters(const RmaQueue& q, const unsigned long long* ranks,
                                                  unsigned long long slot_base, unsigned long long n,
                                                  unsigned long long epoch, unsigned long long code,
                                                  unsigned long long timeout_ns) {
  bool ok = true;
  for (unsigned long long i = block_thread(); i < n; i += block_threads()) {
    const unsigned long long rank = ranks[i];
    const unsigned long long* counter = q.signals + slot_base + rank;
    if (ld_relaxed_u64(counter) < epoch) {
      Deadline deadline = Deadline::after(timeout_ns, q.abort);
      if (!spin_until([&] { return ld_relaxed_u64(counter) >= epoch; }, deadline)) {
        rma_record_error(q, code, rank, epoch);
        ok = false;
        continue;
      }
    }
    rma_acquire_load(q, counter);
  }
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// Raise each remote counter to `epoch` (release at the queue's scope: everything this thread wrote or saw
// before, the block's copies included through the barrier before the call, is visible to whoever acquires
// the value). Threads of one block share the counters.
__device__ __forceinline__ void rma_raise(const RmaQueue& q, unsigned long long* const* remote,
                                          unsigned long long n, unsigned long long epoch) {
  for (unsigned long long i = block_thread(); i < n; i += block_threads()) rma_release_store(q, remote[i], epoch);
}

// One warp copies `nbytes`: lane `lane` of `kLanes` takes words lane, lane + kLanes, ...
template <typename T, unsigned int kLanes>
__device__ __forceinline__ void rma_copy_span_full(T* d, const T* s, unsigned long long n, unsigned int lane) {
  // Four loads in flight per lane before the stores: peer stores are latency-bound.
  unsigned long long i = lane;
  for (; i + 3 * kLanes < n; i += 4 * kLanes) {
    T a = s[i], b = s[i + kLanes], c = s[i + 2 * kLanes], e = s[i + 3 * kLanes];
    d[i] = a;
    d[i + kLanes] = b;
    d[i + 2 * kLanes] = c;
    d[i + 3 * kLanes] = e;
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

struct alignas(16) RmaVec16 {
  unsigned long long x, y;
};

// A small chain's words (RmaQueue::words), shared by threads `first`, `first + stride`, ...: one 8- or
// 16-byte load and store each, no descriptor walk. Block-stride writes are in the list block by block,
// copied straight from the strided source to the strided destination (no packing).
__device__ __forceinline__ void rma_copy_words(const RmaQueue& q, unsigned long long first,
                                               unsigned long long stride) {
  if (q.word_bytes == 16ull) {
    for (unsigned long long i = first; i < q.n_words; i += stride) {
      const RmaWord w = q.words[i];
      *reinterpret_cast<RmaVec16*>(w.dst) = *reinterpret_cast<const RmaVec16*>(w.src);
    }
  } else {
    for (unsigned long long i = first; i < q.n_words; i += stride) {
      const RmaWord w = q.words[i];
      *reinterpret_cast<unsigned long long*>(w.dst) = *reinterpret_cast<const unsigned long long*>(w.src);
    }
  }
}

// One warp (`lanes` threads) copies work unit `unit` of the chain.
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
  const unsigned long long block = k / d.units_per_block;
  const unsigned long long offset = (k % d.units_per_block) * kRmaChunkBytes;
  const unsigned long long left = d.block_bytes - offset;
  const unsigned long long len = left < kRmaChunkBytes ? left : kRmaChunkBytes;
  char* dst = reinterpret_cast<char*>(d.dst + block * d.dst_stride + offset);
  const char* src = reinterpret_cast<const char*>(d.src + block * d.src_stride + offset);
  switch (d.align) {
    case 16: rma_copy_span<RmaVec16>(dst, src, len, lane, lanes); break;
    case 8: rma_copy_span<unsigned long long>(dst, src, len, lane, lanes); break;
    case 4: rma_copy_span<unsigned int>(dst, src, len, lane, lanes); break;
    case 2: rma_copy_span<unsigned short>(dst, src, len, lane, lanes); break;
    default: rma_copy_span<unsigned char>(dst, src, len, lane, lanes); break;
  }
}

// The chain's units shared by `n_warps` warps; the caller is lane `lane` of `lanes` in warp `warp`.
__device__ __forceinline__ void rma_copy_chain(const RmaQueue& q, unsigned long long warp,
                                               unsigned long long n_warps, unsigned int lane, unsigned int lanes) {
  for (unsigned long long unit = warp; unit < q.total_units; unit += n_warps) rma_copy_unit(q, unit, lane, lanes);
}

// The chain copied by the calling block alone, any block shape: warps are cut from the linear thread
// index (as the hardware cuts them), the last one may be partial.
__device__ __forceinline__ void rma_copy_chain_block(const RmaQueue& q) {
  const unsigned int t = block_thread(), threads = block_threads();
  if (q.words != nullptr) {
    rma_copy_words(q, t, threads);
    return;
  }
  const unsigned int warp = t / 32u;
  const unsigned int rest = threads - warp * 32u;
  rma_copy_chain(q, warp, (threads + 31u) / 32u, t % 32u, rest < 32u ? rest : 32u);
}

// Wait until every origin's writes of the current epoch have arrived (at most timeout_ns each), then,
// for a queue that posts at wait, post the next epoch. Block-cooperative.
__device__ __forceinline__ bool rma_wait_queue(const RmaQueue& q, unsigned long long timeout_ns) {
  const unsigned long long epoch = q.state->epoch;
  const bool ok = rma_wait_counters(q, q.origins, 0ull, q.n_origins, epoch, 2ull, timeout_ns);
  if (q.post_at_wait) {
    rma_raise(q, q.post_at_origin, q.n_origins, epoch + 1);
    __syncthreads();
  }
  return ok;
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace detail
}  // namespace circuslink
