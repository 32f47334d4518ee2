// circuslink/detail/rma_impl.cuh: the inline code behind circuslink/rma.cuh.
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

// Threads of one block wait, in parallel, until counters[i] >= epoch for i in [0, n).
// Polls are relaxed (the cheap loop); once satisfied one acquire load orders what follows
// after the writer's release. Returns false (and records `code`) on time-out.
__device__ __forceinline__ bool rma_wait_counters(const RmaQueue& q, const unsigned long long* ranks,
                                                  unsigned long long slot_base, unsigned long long n,
                                                  unsigned long long epoch, unsigned long long code) {
  bool ok = true;
  for (unsigned long long i = block_thread(); i < n; i += block_threads()) {
    const unsigned long long rank = ranks[i];
    const unsigned long long* counter = q.signals + slot_base + rank;
    Deadline deadline = Deadline::after(q.timeout_ns, q.abort);
    if (!spin_until([&] { return ld_relaxed_u64(counter) >= epoch; }, deadline)) {
      rma_record_error(q, code, rank, epoch);
      ok = false;
    } else {
      (void)ld_acquire_sys_u64(counter);
    }
  }
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// Raise each remote counter to `epoch` (release: everything this block wrote or saw before
// is visible to whoever acquires the value).
__device__ __forceinline__ void rma_raise(unsigned long long* const* remote, unsigned long long n,
                                          unsigned long long epoch) {
  for (unsigned long long i = block_thread(); i < n; i += block_threads()) st_release_sys_u64(remote[i], epoch);
}

template <typename T>
__device__ __forceinline__ void rma_copy_span(char* dst, const char* src, unsigned long long nbytes,
                                              unsigned int lane) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  const unsigned long long n = nbytes / sizeof(T);
  // Four loads in flight per lane before the stores: peer stores are latency-bound.
  unsigned long long i = lane;
  for (; i + 96 < n; i += 128) {
    T a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
    d[i] = a;
    d[i + 32] = b;
    d[i + 64] = c;
    d[i + 96] = e;
  }
  for (; i < n; i += 32) d[i] = s[i];
}

struct alignas(16) RmaVec16 {
  unsigned long long x, y;
};

// One warp copies work unit `unit` of the chain.
__device__ __forceinline__ void rma_copy_unit(const RmaQueue& q, unsigned long long unit, unsigned int lane) {
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
    case 16: rma_copy_span<RmaVec16>(dst, src, len, lane); break;
    case 8: rma_copy_span<unsigned long long>(dst, src, len, lane); break;
    case 4: rma_copy_span<unsigned int>(dst, src, len, lane); break;
    case 2: rma_copy_span<unsigned short>(dst, src, len, lane); break;
    default: rma_copy_span<unsigned char>(dst, src, len, lane); break;
  }
}

// Warps [first_warp, first_warp + n_warps) of the caller share the chain's units.
__device__ __forceinline__ void rma_copy_chain(const RmaQueue& q, unsigned long long warp,
                                               unsigned long long n_warps) {
  const unsigned int lane = lane_id();
  for (unsigned long long unit = warp; unit < q.total_units; unit += n_warps) rma_copy_unit(q, unit, lane);
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace detail
}  // namespace circuslink
