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

using circuslink::detail::ll_load;   // one 16-byte line {d0, flag, d1, flag}, as the library stores it
using circuslink::detail::ll_store;
// Slot of `src`'s line in `owner`'s buffer, by parity: every source's line side by side (kSpread 0), or
// 2 KiB apart as the team's LL layout has them (kSpread 1: kLLLines lines a source).
template <int kSpread = 0>
__device__ __forceinline__ uint4* raw_slot(const unsigned long long* peers, unsigned int owner, unsigned int parity,
                                           unsigned int src) {
  if (kSpread) return reinterpret_cast<uint4*>(peers[owner] + kRawOffset) + (parity * 64 + src) * cc::kLLLines;
  return reinterpret_cast<uint4*>(peers[owner] + kRawOffset) + parity * 64 + src;
}
__device__ __forceinline__ float2 as_f2(unsigned int a, unsigned int b) {
  return make_float2(__uint_as_float(a), __uint_as_float(b));
}

// A Team on this script's buffers (the same fields the host's Comm fills; no abort word).
__device__ cc::Team team_of(int rank, int size, const unsigned long long* peers, unsigned int* counters,
                            unsigned int* error) {
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
  return t;
}

// The SM this block runs on: whether the ranks' blocks share an SM changes the poll's path.
__device__ __forceinline__ unsigned long long sm_id() {
  unsigned int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Thread 0: the clock after the warm-up, the clock now and the block's SM.
__device__ __forceinline__ void record_times(unsigned long long* times, unsigned long long t0) {
  if (threadIdx.x == 0) {
    times[0] = t0;
    times[1] = globaltimer_ns();
    times[2] = sm_id();
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512, 1) real(int rank, int size, const unsigned long long* peers,
                                                       unsigned int* counters, unsigned int* error, float* data,
                                                       int warmup, int iters, unsigned long long* times) {
  const cc::Team t = team_of(rank, size, peers, counters, error);
  unsigned long long t0 = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t0 = globaltimer_ns();
    if (!cc::allreduce_oneshot(t, data, data, 2ull, cc::Sum())) break;
  }
  record_times(times, t0);
}

// kLanes: lane q handles peer q; else thread 0 handles every peer in turn. kIo: the value is loaded from and
// stored to `data` each call (else it stays in a register). kCounter: the call number is loaded from and
// stored to counters[0] each call by thread 0, handed over in shared memory (else a register). kSync: the
// block's barriers around the call as the library has them.
template <bool kLanes, bool kIo, bool kCounter, bool kSync, int kSpread = 0, bool kDeadline = false>
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
          ll_store(raw_slot<kSpread>(peers, q, parity, rank), __float_as_uint(mine.x), __float_as_uint(mine.y), call);
          const uint4* s = raw_slot<kSpread>(peers, rank, parity, q);
          uint4 got;
          if (kDeadline) {
            circuslink::detail::Deadline d = circuslink::detail::Deadline::after(10000000000ull, nullptr);
            circuslink::detail::spin_until([&] {
              got = ll_load(s);
              return got.y == call && got.w == call;
            }, d);
          } else {
            do {
              got = ll_load(s);
            } while (got.y != call || got.w != call);
          }
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
        ll_store(raw_slot(peers, q, parity, rank), __float_as_uint(mine.x), __float_as_uint(mine.y), call);
      }
      for (int q = 0; q < size; ++q) {
        float2 v = mine;
        if (q != rank) {
          const uint4* s = raw_slot(peers, rank, parity, q);
          uint4 got;
          do {
            got = ll_load(s);
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
  record_times(times, t0);
}

#define HAND(name, lanes, io, counter, sync, ...)                                                                \
  extern "C" __global__ void __launch_bounds__(512)                                                             \
      name(int rank, int size, const unsigned long long* peers, unsigned int* counters, float* data,              \
           unsigned int base, int warmup, int iters, unsigned long long* times) {                                \
    hand<lanes, io, counter, sync, ##__VA_ARGS__>(rank, size, peers, counters, data, base, warmup, iters, times); \
  }
HAND(serial_min, false, false, false, false)
HAND(serial_io, false, true, false, false)
HAND(serial_io_ctr, false, true, true, false)
HAND(serial_all, false, true, true, true)
HAND(lanes_min, true, false, false, false)
HAND(lanes_all, true, true, true, true)
HAND(lanes_spread, true, true, true, true, 1)
HAND(lanes_deadline, true, true, true, true, 0, true)

// The library's one-shot on the team handle a Comm gives (comm.device_team(), by value, as the bench passes
// it); no_abort: the same handle without its host-mapped abort word.
extern "C" __global__ void __launch_bounds__(512, 1) lib(cc::Team t, int no_abort, float* data, int warmup, int iters,
                                                      unsigned long long* times) {
  if (no_abort) t.abort = nullptr;
  unsigned long long t0 = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t0 = globaltimer_ns();
    if (!cc::allreduce_oneshot(t, data, data, 2ull, cc::Sum())) break;
  }
  record_times(times, t0);
}

// The one-shot as the library had it before a line's peers got a thread each (one thread a line), for A/B.
template <class T, class Op>
__device__ bool oneshot_old(const cc::Team& t, const T* in, T* out, unsigned long long n, Op op) {
  using cc::detail::u64;
  const u64 nbytes = n * sizeof(T);
  const unsigned int chunks = static_cast<unsigned int>((nbytes + cc::kLLChunkBytes - 1) / cc::kLLChunkBytes);
  const unsigned int tid = cc::detail::block_thread();
  __shared__ unsigned int call_s;
  int failed = 0;
  // This thread's 8 bytes at `off` (the `valid` bytes that exist), as one word.
  auto unit_at = [&](u64 off, unsigned int valid) -> u64 {
    const unsigned char* src = reinterpret_cast<const unsigned char*>(in) + off;
    if (valid == 8 && (reinterpret_cast<u64>(src) & 7u) == 0) return *reinterpret_cast<const u64*>(src);
    u64 v = 0;
    for (unsigned int b = 0; b < valid; ++b) v |= static_cast<u64>(src[b]) << (8 * b);
    return v;
  };
  for (unsigned int c = cc::detail::team_block(); c < chunks; c += cc::detail::team_blocks()) {
    const u64 lo = static_cast<u64>(c) * cc::kLLChunkBytes;
    const u64 bytes = nbytes - lo < cc::kLLChunkBytes ? nbytes - lo : cc::kLLChunkBytes;
    const unsigned int lines = static_cast<unsigned int>((bytes + 7) / 8);
    // The first line's data is loaded while thread 0 loads the call number: two loads in flight, not
    // one after the other, on the latency path.
    const u64 first_off = lo + static_cast<u64>(tid) * 8;
    const unsigned int first_valid =
        tid < lines && nbytes - first_off < 8 ? static_cast<unsigned int>(nbytes - first_off) : 8u;
    const u64 first = tid < lines ? unit_at(first_off, first_valid) : 0;
    if (tid == 0) call_s = t.counters[cc::kTeamCounterChunk + c] + 1u;
    __syncthreads();
    const unsigned int call = call_s, parity = call & 1u;
    for (unsigned int line = tid; line < lines; line += cc::detail::block_threads()) {
      const u64 off = lo + static_cast<u64>(line) * 8;
      const unsigned int valid = nbytes - off < 8 ? static_cast<unsigned int>(nbytes - off) : 8u;
      const u64 mine = line == tid ? first : unit_at(off, valid);
      for (unsigned int k = 1; k < t.size; ++k) {  // peers in the order rank + 1, rank + 2, ...: spread the stores
        const unsigned int q = (t.rank + k) % t.size;
        cc::detail::ll_store(cc::detail::ll_slot(t, q, c, parity, t.rank) + line, static_cast<unsigned int>(mine),
                         static_cast<unsigned int>(mine >> 32), call);
      }
      u64 acc = 0;
      for (unsigned int q = 0; q < t.size && !failed; ++q) {
        u64 v = mine;
        if (q != t.rank) {
          const uint4* slot = cc::detail::ll_slot(t, t.rank, c, parity, q) + line;
          uint4 got;
          circuslink::detail::Deadline d = circuslink::detail::Deadline::after(t.timeout_ns, t.abort);
          if (!circuslink::detail::spin_until([&] {
                got = cc::detail::ll_load(slot);
                return got.y == call && got.w == call;
              }, d)) {
            cc::detail::team_fail(t, cc::kTeamErrorSlot, q, c, call);
            failed = 1;
            break;
          }
          v = static_cast<u64>(got.x) | (static_cast<u64>(got.z) << 32);
        }
        acc = q == 0 ? v : cc::detail::unit_op<T>(acc, v, valid, op);
      }
      if (failed) break;
      unsigned char* dst = reinterpret_cast<unsigned char*>(out) + off;
      if (valid == 8 && (reinterpret_cast<u64>(dst) & 7u) == 0) {
        *reinterpret_cast<u64*>(dst) = acc;
      } else {
        for (unsigned int b = 0; b < valid; ++b) dst[b] = static_cast<unsigned char>(acc >> (8 * b));
      }
    }
    if (__syncthreads_or(failed)) return false;
    if (tid == 0) t.counters[cc::kTeamCounterChunk + c] = call;
  }
  return true;
}

extern "C" __global__ void __launch_bounds__(512) old(int rank, int size, const unsigned long long* peers,
                                                      unsigned int* counters, unsigned int* error, float* data,
                                                      int warmup, int iters, unsigned long long* times) {
  const cc::Team t = team_of(rank, size, peers, counters, error);
  unsigned long long t0 = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t0 = globaltimer_ns();
    if (!oneshot_old<float>(t, data, data, 2ull, cc::Sum())) break;
  }
  record_times(times, t0);
}
