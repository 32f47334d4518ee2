// Dev experiment: where the one-shot all-reduce's time goes at 8 bytes (oneshot_variants.py).
//
// Every kernel runs `warmup + iters` 8-byte sum all-reduces back to back in one block, as the bench's
// team loop does, and records thread 0's clock after the warm-up and at the end. Variants strip or add
// one thing at a time:
//   real      the library's cc::allreduce_oneshot on a Team built here (the bench's row)
//   serial    the same protocol by hand: thread 0 stores to every peer, then polls every peer in turn
//   lanes     lane q stores to and polls peer q (all peers at once), the fold in rank order by shuffles
// and kIo / kCounter / kSync switch on the data load and store, the call number kept in global memory,
// and the block's barriers (the library's one-shot has all three).
#include <circuslink/collectives.cuh>

namespace cc = circuslink::collectives;
using circuslink::detail::globaltimer_ns;

namespace {

constexpr unsigned long long kRawOffset = 8ull << 20;  // the hand-written variants' slots in each team buffer

__device__ __forceinline__ void st_line(uint4* p, unsigned int d0, unsigned int d1, unsigned int flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1), "r"(flag)
               : "memory");
}
__device__ __forceinline__ uint4 ld_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p) : "memory");
  return v;
}
// Slot of `src`'s line in `owner`'s buffer, by parity.
__device__ __forceinline__ uint4* raw_slot(const unsigned long long* peers, unsigned int owner, unsigned int parity,
                                           unsigned int src) {
  return reinterpret_cast<uint4*>(peers[owner] + kRawOffset) + parity * 64 + src;
}
__device__ __forceinline__ float2 as_f2(unsigned int a, unsigned int b) {
  return make_float2(__uint_as_float(a), __uint_as_float(b));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512) real(int rank, int size, const unsigned long long* peers,
                                                       unsigned int* counters, unsigned int* error, float* data,
                                                       int warmup, int iters, unsigned long long* times) {
  cc::Team t;
  t.peers = reinterpret_cast<unsigned char* const*>(peers);
  t.counters = counters;
  t.error = error;
  t.abort = nullptr;
  t.timeout_ns = 10000000000ull;
  t.stage_bytes = 1 << 20;
  t.oneshot_max = 64 << 10;
  t.rank = rank;
  t.size = size;
  t.flags = cc::kTeamGpuScope;
  t.pad = 0;
  unsigned long long t0 = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t0 = globaltimer_ns();
    if (!cc::allreduce_oneshot(t, data, data, 2ull, cc::Sum())) break;
  }
  if (threadIdx.x == 0) {
    times[0] = t0;
    times[1] = globaltimer_ns();
  }
}

// kLanes: lane q handles peer q; else thread 0 handles every peer in turn. kIo: the value is loaded from and
// stored to `data` each call (else it stays in a register). kCounter: the call number is loaded from and
// stored to counters[0] each call by thread 0, handed over in shared memory (else a register). kSync: the
// block's barriers around the call as the library has them.
template <bool kLanes, bool kIo, bool kCounter, bool kSync>
__device__ void hand(int rank, int size, const unsigned long long* peers, unsigned int* counters, float* data,
                     unsigned int base, int warmup, int iters, unsigned long long* times) {
  __shared__ unsigned int call_s;
  const unsigned int tid = threadIdx.x;
  float2 reg = make_float2(1.0f + rank, 2.0f);
  unsigned int call = base;
  unsigned long long t0 = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t0 = globaltimer_ns();
    float2 mine = reg;
    if (kIo && tid < 32) mine = *reinterpret_cast<const float2*>(data);
    if (kCounter) {
      if (tid == 0) call_s = counters[0] + 1u;
      if (kSync) __syncthreads();
      else __syncwarp();
      call = call_s;
    } else {
      ++call;
    }
    const unsigned int parity = call & 1u;
    float2 acc = mine;
    if (kLanes) {
      if (tid < 32) {
        const unsigned int q = tid;
        float2 v = mine;
        if (q < static_cast<unsigned int>(size) && q != static_cast<unsigned int>(rank)) {
          st_line(raw_slot(peers, q, parity, rank), __float_as_uint(mine.x), __float_as_uint(mine.y), call);
          const uint4* s = raw_slot(peers, rank, parity, q);
          uint4 got;
          do {
            got = ld_line(s);
          } while (got.y != call || got.w != call);
          v = as_f2(got.x, got.z);
        }
        acc = make_float2(__shfl_sync(0xffffffffu, v.x, 0), __shfl_sync(0xffffffffu, v.y, 0));
        for (int k = 1; k < size; ++k) {
          acc.x += __shfl_sync(0xffffffffu, v.x, k);
          acc.y += __shfl_sync(0xffffffffu, v.y, k);
        }
      }
    } else if (tid == 0) {
      for (int k = 1; k < size; ++k) {
        const unsigned int q = (rank + k) % size;
        st_line(raw_slot(peers, q, parity, rank), __float_as_uint(mine.x), __float_as_uint(mine.y), call);
      }
      for (int q = 0; q < size; ++q) {
        float2 v = mine;
        if (q != rank) {
          const uint4* s = raw_slot(peers, rank, parity, q);
          uint4 got;
          do {
            got = ld_line(s);
          } while (got.y != call || got.w != call);
          v = as_f2(got.x, got.z);
        }
        acc = q == 0 ? v : make_float2(acc.x + v.x, acc.y + v.y);
      }
    }
    if (tid == 0) {
      if (kIo) *reinterpret_cast<float2*>(data) = acc;
      else reg = acc;
    }
    if (kSync) __syncthreads_or(0);
    else __syncwarp();
    if (kCounter && tid == 0) counters[0] = call;
    if (!kIo && tid < 32) reg = make_float2(__shfl_sync(0xffffffffu, reg.x, 0), __shfl_sync(0xffffffffu, reg.y, 0));
  }
  if (tid == 0) {
    times[0] = t0;
    times[1] = globaltimer_ns();
  }
}

#define HAND(name, lanes, io, counter, sync)                                                                     \
  extern "C" __global__ void __launch_bounds__(512)                                                             \
      name(int rank, int size, const unsigned long long* peers, unsigned int* counters, float* data,              \
           unsigned int base, int warmup, int iters, unsigned long long* times) {                                \
    hand<lanes, io, counter, sync>(rank, size, peers, counters, data, base, warmup, iters, times);                \
  }
HAND(serial_min, false, false, false, false)
HAND(serial_io, false, true, false, false)
HAND(serial_io_ctr, false, true, true, false)
HAND(serial_all, false, true, true, true)
HAND(lanes_min, true, false, false, false)
HAND(lanes_all, true, true, true, true)
