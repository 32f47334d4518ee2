// circuslink/detail/team_impl.cuh - the shared-memory collectives of collectives.cuh (Team): one-shot and
// two-shot all-reduce, reduce-scatter, all-gather, broadcast and barrier. The cpu back-end runs the same
// steps from Python (collectives/_team.py), which is the reference these follow.
#pragma once

#include "../grid.cuh"
#include "collectives_types.cuh"
#include "sync.cuh"

namespace circuslink {
namespace collectives {
namespace detail {

typedef unsigned long long u64;
using circuslink::detail::block_thread;
using circuslink::detail::block_threads;

__device__ __forceinline__ unsigned int team_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ unsigned int team_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ u64 grid_thread() { return (u64)team_block() * block_threads() + block_thread(); }
__device__ __forceinline__ u64 grid_threads() { return (u64)team_blocks() * block_threads(); }

template <class T>
__device__ __forceinline__ T* stage_of(const Team& t, unsigned int q) {
  return reinterpret_cast<T*>(t.peers[q] + team_stage_offset(t.size));
}

// The first failure of this rank is recorded (what, peer, slot, call); the host raises it naming them. As the
// channels' record_error: the failure claims the record with kTeamErrorClaimed, fills the fields and publishes
// `what` last, so whoever reads a kind reads its fields (team_failed counts a claimed record as a failure).
__device__ __forceinline__ void team_fail(const Team& t, unsigned int what, unsigned int peer, unsigned int slot,
                                          unsigned int call) {
  if (atomicCAS(t.error, 0u, kTeamErrorClaimed) == 0u) {
    circuslink::detail::st_relaxed(t.error + 1, peer);
    circuslink::detail::st_relaxed(t.error + 2, slot);
    circuslink::detail::st_relaxed(t.error + 3, call);
    __threadfence();
    circuslink::detail::st_relaxed(t.error, what);
    __threadfence();
  }
}
__device__ __forceinline__ bool team_failed(const Team& t) {
  return circuslink::detail::ld_relaxed(t.error) != 0u;
}

// The team's scope (Team::flags): .gpu when every rank shares one GPU, else .sys.
__device__ __forceinline__ bool team_gpu_scope(const Team& t) { return (t.flags & kTeamGpuScope) != 0u; }
__device__ __forceinline__ void team_fence(const Team& t) {
  if (team_gpu_scope(t)) circuslink::detail::fence_acq_rel_gpu();
  else __threadfence_system();
}
__device__ __forceinline__ unsigned int team_ld_acquire(const Team& t, const unsigned int* p) {
  return team_gpu_scope(t) ? circuslink::detail::ld_acquire_gpu(p) : circuslink::detail::ld_acquire_sys(p);
}

// Every thread of one block: store my call number into my word of every rank's barrier flags, then
// wait until every rank's word in mine has reached it. One fence at the team's scope orders this
// grid's writes (seen by this block through the grid barrier) before the flags, which are then plain
// relaxed stores; each poll is an acquire at the same scope.
__device__ inline bool team_barrier_block(const Team& t) {
  __shared__ unsigned int call_s;
  __shared__ int ok_s;
  const unsigned int tid = block_thread();
  if (tid == 0) {
    call_s = t.counters[kTeamCounterBarrier] + 1u;
    t.counters[kTeamCounterBarrier] = call_s;
    ok_s = 1;
  }
  __syncthreads();
  const unsigned int call = call_s;
  if (tid < t.size) team_fence(t);
  for (unsigned int q = tid; q < t.size; q += block_threads()) {
    unsigned int* theirs = reinterpret_cast<unsigned int*>(t.peers[q]) + t.rank;
    circuslink::detail::st_relaxed(theirs, call);
  }
  for (unsigned int q = tid; q < t.size; q += block_threads()) {
    const unsigned int* mine = reinterpret_cast<const unsigned int*>(t.peers[t.rank]) + q;
    circuslink::detail::Deadline d = circuslink::detail::Deadline::after(t.timeout_ns, t.abort);
    if (!circuslink::detail::spin_until(
            [&] { return static_cast<int>(team_ld_acquire(t, mine) - call) >= 0; }, d)) {
      team_fail(t, kTeamErrorBarrier, q, 0, call);
      ok_s = 0;
    }
  }
  __syncthreads();
  return ok_s != 0;
}

// Every thread of the grid: every block of every rank has arrived (and its writes are visible).
// Block 0 meets the other ranks between two grid barriers.
__device__ inline bool team_sync(const Team& t) {
  if (team_blocks() == 1) return team_barrier_block(t) && !team_failed(t);
  if (!circuslink::grid_sync(t.counters + kTeamCounterGrid, t.timeout_ns, t.abort)) {
    if (block_thread() == 0) team_fail(t, kTeamErrorGrid, t.rank, team_block(), 0);
    return false;
  }
  if (team_block() == 0) team_barrier_block(t);  // a failure is in t.error, read by every block below
  if (!circuslink::grid_sync(t.counters + kTeamCounterGrid, t.timeout_ns, t.abort)) {
    if (block_thread() == 0) team_fail(t, kTeamErrorGrid, t.rank, team_block(), 0);
    return false;
  }
  __shared__ int failed_s;
  if (block_thread() == 0) failed_s = team_failed(t);
  __syncthreads();
  return failed_s == 0;
}

// Every thread of the grid: every block of this rank has arrived (no other rank takes part). Orders one
// block's reads of this rank's stage before another block's later writes to it.
__device__ inline bool rank_sync(const Team& t) {
  if (team_blocks() == 1) {
    __syncthreads();
    return true;
  }
  if (!circuslink::grid_sync(t.counters + kTeamCounterGrid, t.timeout_ns, t.abort)) {
    if (block_thread() == 0) team_fail(t, kTeamErrorGrid, t.rank, team_block(), 0);
    return false;
  }
  return true;
}

// Element-wise op over a 16-byte vector of T.
template <class T, class Op>
__device__ __forceinline__ uint4 vec_op(uint4 a, uint4 b, Op op) {
  T* pa = reinterpret_cast<T*>(&a);
  const T* pb = reinterpret_cast<const T*>(&b);
#pragma unroll
  for (unsigned int k = 0; k < 16 / sizeof(T); ++k) pa[k] = op(pa[k], pb[k]);
  return a;
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15u) == 0; }

// A load at L2 (ld.global.cg) of any 1-, 2-, 4- or 8-byte T (no standard headers: NVRTC compiles this).
template <unsigned int Bytes> struct word_of;
template <> struct word_of<1> { typedef unsigned char type; };
template <> struct word_of<2> { typedef unsigned short type; };
template <> struct word_of<4> { typedef unsigned int type; };
template <> struct word_of<8> { typedef unsigned long long type; };
template <class T>
__device__ __forceinline__ T ld_cg(const T* p) {
  typedef typename word_of<sizeof(T)>::type W;
  union { W w; T v; } u;
  u.w = __ldcg(reinterpret_cast<const W*>(p));
  return u.v;
}

// Every thread of the grid: dst[0, n) = src[0, n); 16-byte vectors where both are aligned. Loads at L2
// (ld.global.cg): peers' memory is written by other SMs, so no L1 copy may be trusted.
template <class T>
__device__ void grid_copy(T* dst, const T* src, u64 n) {
  const u64 i0 = grid_thread(), step = grid_threads();
  u64 done = 0;
  if (aligned16(dst) && aligned16(src) && sizeof(T) <= 16) {
    const u64 vecs = n * sizeof(T) / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    u64 i = i0;
    for (; i + 3 * step < vecs; i += 4 * step) {  // four loads in flight a thread: HBM needs the bytes in flight
      const uint4 v0 = __ldcg(s + i), v1 = __ldcg(s + i + step), v2 = __ldcg(s + i + 2 * step),
                  v3 = __ldcg(s + i + 3 * step);
      d[i] = v0;
      d[i + step] = v1;
      d[i + 2 * step] = v2;
      d[i + 3 * step] = v3;
    }
    for (; i < vecs; i += step) d[i] = __ldcg(s + i);
    done = vecs * 16 / sizeof(T);
  }
  for (u64 i = done + i0; i < n; i += step) dst[i] = ld_cg(src + i);
}

// d[i], d[i + step], d[i + 2 step], d[i + 3 step] = v0..v3.
__device__ __forceinline__ void put4(uint4* d, u64 i, u64 step, uint4 v0, uint4 v1, uint4 v2, uint4 v3) {
  d[i] = v0;
  d[i + step] = v1;
  d[i + 2 * step] = v2;
  d[i + 3 * step] = v3;
}

// Every thread of the grid: for i in [0, n), the fold op(...op(op(stage_0[off + i], stage_1[off + i]), ...),
// stage_n-1[off + i]) in rank order, as every algorithm reduces (collectives/_reduce.py, fold), handed over
// as 16-byte vectors (vector i's first element is element i * 16 / sizeof(T), where `vectors` allows it: the
// stage offset and every destination 16-byte aligned) and element by element past them. Four vectors a
// thread are in flight: every rank's loads of them issued together, then put_four(i, step, v0, v1, v2, v3)
// stores vectors i, i + step, i + 2 step, i + 3 step. A destination's four stores go out together: one
// put_vec per vector, each storing to every destination, was 16 % slower at 64 MiB on 2 ranks (one H200,
// 688 against 822 GB/s bus bandwidth) and spilled more. put_vec(i, v) takes the vectors past the last four,
// put_one(i, v) the elements past the vectors.
template <class T, class Op, class PutFour, class PutVec, class PutOne>
__device__ void grid_fold_each(const Team& t, u64 off, u64 n, bool vectors, Op op, PutFour put_four, PutVec put_vec,
                               PutOne put_one) {
  const u64 i0 = grid_thread(), step = grid_threads();
  u64 done = 0;
  if (vectors && ((off * sizeof(T)) & 15u) == 0 && sizeof(T) <= 16) {
    const u64 vecs = n * sizeof(T) / 16;
    u64 i = i0;
    for (; i + 3 * step < vecs; i += 4 * step) {
      const uint4* s0 = reinterpret_cast<const uint4*>(stage_of<T>(t, 0) + off) + i;
      uint4 a0 = __ldcg(s0), a1 = __ldcg(s0 + step), a2 = __ldcg(s0 + 2 * step), a3 = __ldcg(s0 + 3 * step);
      for (unsigned int q = 1; q < t.size; ++q) {
        const uint4* sq = reinterpret_cast<const uint4*>(stage_of<T>(t, q) + off) + i;
        const uint4 b0 = __ldcg(sq), b1 = __ldcg(sq + step), b2 = __ldcg(sq + 2 * step), b3 = __ldcg(sq + 3 * step);
        a0 = vec_op<T>(a0, b0, op);
        a1 = vec_op<T>(a1, b1, op);
        a2 = vec_op<T>(a2, b2, op);
        a3 = vec_op<T>(a3, b3, op);
      }
      put_four(i, step, a0, a1, a2, a3);
    }
    for (; i < vecs; i += step) {
      uint4 acc = __ldcg(reinterpret_cast<const uint4*>(stage_of<T>(t, 0) + off) + i);
      for (unsigned int q = 1; q < t.size; ++q)
        acc = vec_op<T>(acc, __ldcg(reinterpret_cast<const uint4*>(stage_of<T>(t, q) + off) + i), op);
      put_vec(i, acc);
    }
    done = vecs * 16 / sizeof(T);
  }
  for (u64 i = done + i0; i < n; i += step) {
    T acc = ld_cg(stage_of<T>(t, 0) + off + i);
    for (unsigned int q = 1; q < t.size; ++q) acc = op(acc, ld_cg(stage_of<T>(t, q) + off + i));
    put_one(i, acc);
  }
}

// Every thread of the grid: dst[i] = the fold of [off, off + n) of every rank's stage.
template <class T, class Op>
__device__ void grid_fold(const Team& t, u64 off, u64 n, T* dst, Op op) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  grid_fold_each<T>(
      t, off, n, aligned16(dst), op,
      [&](u64 i, u64 step, uint4 v0, uint4 v1, uint4 v2, uint4 v3) { put4(d, i, step, v0, v1, v2, v3); },
      [&](u64 i, uint4 v) { d[i] = v; }, [&](u64 i, T v) { dst[i] = v; });
}

// Every thread of the grid: the same fold, stored into every rank's stage at the same place (and into
// out[0, n) when out is not null): the reduce-scatter's result pushed to its readers, so that the
// all-gather is a local copy (or nothing). Only the segment's owner reads or writes [off, off + n) of any
// stage between the two barriers around this.
template <class T, class Op>
__device__ void grid_fold_push(const Team& t, u64 off, u64 n, T* out, Op op) {
  grid_fold_each<T>(
      t, off, n, out == nullptr || aligned16(out), op,
      [&](u64 i, u64 step, uint4 v0, uint4 v1, uint4 v2, uint4 v3) {
        for (unsigned int q = 0; q < t.size; ++q)
          put4(reinterpret_cast<uint4*>(stage_of<T>(t, q) + off), i, step, v0, v1, v2, v3);
        if (out) put4(reinterpret_cast<uint4*>(out), i, step, v0, v1, v2, v3);
      },
      [&](u64 i, uint4 v) {
        for (unsigned int q = 0; q < t.size; ++q) reinterpret_cast<uint4*>(stage_of<T>(t, q) + off)[i] = v;
        if (out) reinterpret_cast<uint4*>(out)[i] = v;
      },
      [&](u64 i, T v) {
        for (unsigned int q = 0; q < t.size; ++q) stage_of<T>(t, q)[off + i] = v;
        if (out) out[i] = v;
      });
}

// [lo, hi) of segment i: the cut of collectives_impl.cuh's detail::segment (whole 16-byte units).
__device__ __forceinline__ void team_segment(u64 count, unsigned int elem, unsigned int parts, unsigned int i, u64& lo,
                                             u64& hi) {
  const u64 per_unit = elem >= 16 ? 1 : 16 / elem;
  const u64 units = count / per_unit, base = units / parts, extra = units % parts;
  lo = (i * base + (i < extra ? i : extra)) * per_unit;
  hi = i + 1 == parts ? count : lo + (base + (i < extra ? 1 : 0)) * per_unit;
}

// Elements per stage piece when the stage is cut in `parts` (whole 16-byte units).
template <class T>
__device__ __forceinline__ u64 piece_elems(const Team& t, unsigned int parts) {
  const u64 unit = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
  const u64 units = t.stage_bytes / parts / 16;
  return (units ? units : 1) * unit;
}

// One LL line a unit (sync.cuh): the one-shot's slots carry these.
using circuslink::detail::ll_load;
using circuslink::detail::ll_store;
__device__ __forceinline__ uint4* ll_slot(const Team& t, unsigned int owner, unsigned int chunk, unsigned int parity,
                                          unsigned int src) {
  return reinterpret_cast<uint4*>(t.peers[owner] + team_ll_offset(t.size)) +
         ((static_cast<u64>(chunk) * 2 + parity) * t.size + src) * kLLLines;
}

// Threads a one-shot line takes: the team size rounded up to a power of two (a group inside one warp),
// or 1 for two ranks, for more than 32, or where the block has fewer threads than that.
__device__ __forceinline__ unsigned int oneshot_width(unsigned int size, unsigned int threads) {
  if (size <= 2 || size > 32) return 1;
  const unsigned int w = 1u << (32 - __clz(size - 1));  // the next power of two
  return w <= threads ? w : 1;
}

// Op over the `valid` bytes of an 8-byte unit (whole elements), as two words.
template <class T, class Op>
__device__ __forceinline__ u64 unit_op(u64 a, u64 b, unsigned int valid, Op op) {
  T* pa = reinterpret_cast<T*>(&a);
  const T* pb = reinterpret_cast<const T*>(&b);
  for (unsigned int k = 0; k < 8 / sizeof(T) && k * sizeof(T) < valid; ++k) pa[k] = op(pa[k], pb[k]);
  return a;
}


// The `valid` bytes (whole elements, at most 8) at byte `off` of p, as one word; and back.
__device__ __forceinline__ u64 load_unit(const void* p, u64 off, unsigned int valid) {
  const unsigned char* src = reinterpret_cast<const unsigned char*>(p) + off;
  if (valid == 8 && (reinterpret_cast<u64>(src) & 7u) == 0) return *reinterpret_cast<const u64*>(src);
  u64 v = 0;
  for (unsigned int b = 0; b < valid; ++b) v |= static_cast<u64>(src[b]) << (8 * b);
  return v;
}
__device__ __forceinline__ void store_unit(void* p, u64 off, unsigned int valid, u64 v) {
  unsigned char* dst = reinterpret_cast<unsigned char*>(p) + off;
  if (valid == 8 && (reinterpret_cast<u64>(dst) & 7u) == 0) {
    *reinterpret_cast<u64*>(dst) = v;
  } else {
    for (unsigned int b = 0; b < valid; ++b) dst[b] = static_cast<unsigned char>(v >> (8 * b));
  }
}

// allreduce_oneshot with a thread a peer (width > 1: see there). Lines go in rounds of `groups`, the same
// count for every thread of the block, so that a group's shuffles always meet every lane of its warp (a
// block's last warp may be partial: its lanes alone).
template <class T, class Op>
__device__ bool oneshot_grouped(const Team& t, const T* in, T* out, unsigned long long n, Op op,
                                             unsigned int width) {
  const u64 nbytes = n * sizeof(T);
  const unsigned int chunks = static_cast<unsigned int>((nbytes + kLLChunkBytes - 1) / kLLChunkBytes);
  const unsigned int tid = block_thread(), threads = block_threads();
  const unsigned int groups = threads / width, group = tid / width, q = tid % width;
  const unsigned int warp_lanes = threads - (tid & ~31u) < 32u ? threads - (tid & ~31u) : 32u;
  const unsigned int lanes = warp_lanes == 32u ? 0xffffffffu : (1u << warp_lanes) - 1u;
  __shared__ unsigned int call_s;
  int failed = 0;
  for (unsigned int c = team_block(); c < chunks; c += team_blocks()) {
    const u64 lo = static_cast<u64>(c) * kLLChunkBytes;
    const u64 bytes = nbytes - lo < kLLChunkBytes ? nbytes - lo : kLLChunkBytes;
    const unsigned int lines = static_cast<unsigned int>((bytes + 7) / 8);
    // The first round's data is loaded while thread 0 loads the call number (two loads in flight).
    bool active = group < groups && group < lines;
    u64 off = lo + static_cast<u64>(group) * 8;
    unsigned int valid = active && nbytes - off < 8 ? static_cast<unsigned int>(nbytes - off) : 8u;
    u64 mine = active ? load_unit(in, off, valid) : 0;
    if (tid == 0) call_s = t.counters[kTeamCounterChunk + c] + 1u;
    __syncthreads();
    const unsigned int call = call_s, parity = call & 1u;
    for (unsigned int round = 0; round * groups < lines; ++round) {
      if (round > 0) {
        const unsigned int line = round * groups + group;
        active = group < groups && line < lines;
        off = lo + static_cast<u64>(line) * 8;
        valid = active && nbytes - off < 8 ? static_cast<unsigned int>(nbytes - off) : 8u;
        mine = active ? load_unit(in, off, valid) : 0;
      }
      const unsigned int line = round * groups + group;
      u64 v = mine;
      if (active && q < t.size && q != t.rank && !failed) {
        ll_store(ll_slot(t, q, c, parity, t.rank) + line, static_cast<unsigned int>(mine),
                 static_cast<unsigned int>(mine >> 32), call);
        const uint4* slot = ll_slot(t, t.rank, c, parity, q) + line;
        uint4 got;
        circuslink::detail::Deadline d = circuslink::detail::Deadline::after(t.timeout_ns, t.abort);
        if (circuslink::detail::spin_until([&] {
              got = ll_load(slot);
              return got.y == call && got.w == call;
            }, d)) {
          v = static_cast<u64>(got.x) | (static_cast<u64>(got.z) << 32);
        } else {
          team_fail(t, kTeamErrorSlot, q, c, call);
          failed = 1;
        }
      }
      u64 acc = __shfl_sync(lanes, v, 0, width);
      for (unsigned int k = 1; k < t.size; ++k) acc = unit_op<T>(acc, __shfl_sync(lanes, v, k, width), valid, op);
      if (!__any_sync(lanes, failed) && active && q == 0) store_unit(out, off, valid, acc);
    }
    if (__syncthreads_or(failed)) return false;
    if (tid == 0) t.counters[kTeamCounterChunk + c] = call;
  }
  return true;
}

// The wait of a one-shot poll that missed many times, out of line with its arguments by value (the poll loop
// itself is a load and a compare). The first call starts the deadline; returns it, or 0 once it passed or the
// host aborted.
__device__ __noinline__ u64 oneshot_wait_check(u64 deadline, u64 timeout_ns, const volatile unsigned int* abort) {
  if (abort != nullptr && *abort != 0u) return 0;
  const u64 now = circuslink::detail::globaltimer_ns();
  if (deadline == 0) return timeout_ns == 0 || timeout_ns > ~0ull - now ? ~0ull : now + timeout_ns;
  return now > deadline ? 0 : deadline;
}

// Whether a call fits one warp of one block: one chunk of at most 32 / width lines (8-byte calls always).
__device__ __forceinline__ bool oneshot_fits_warp(const Team& t, u64 nbytes, unsigned int width) {
  return nbytes <= kLLChunkBytes && t.size <= 32 && (t.size <= 2 || width > 1) && block_threads() >= 32 &&
         (nbytes + 7) / 8 * width <= 32;
}

// The one-shot of a call that fits one warp (oneshot_fits_warp): warp 0 of block 0 does all of it, the other
// warps only meet it at the closing barrier. What a small call costs is the instructions between seeing the
// peers' lines and storing the next call's, run by one warp alone (as the channel's one-packet path), so
// everything else is kept off that path: no barrier or shared memory before the stores (every lane loads the
// call number itself; thread 0 stores the next one before the closing barrier, which makes it visible to the
// block), a poll that is one load and one compare, and the deadline checked out of line every many polls.
// Lanes: a line is a group of `width` lanes, lane q of the group storing to rank q and polling rank q's line
// (width 1, two ranks: the lane does both for its one peer).
template <class T, class Op>
__device__ bool oneshot_warp(const Team& t, const T* in, T* out, u64 nbytes, Op op, unsigned int width) {
  if (team_block() != 0) return true;  // one chunk: block 0's
  const unsigned int tid = block_thread();
  int failed = 0;
  if (tid < 32) {
    const unsigned int lines = static_cast<unsigned int>((nbytes + 7) / 8);
    const unsigned int group = tid >> (31 - __clz(width)), q = tid & (width - 1u);  // width: a power of two
    const bool active = group < lines;
    const u64 off = static_cast<u64>(group) * 8;
    const unsigned int valid = active && nbytes - off < 8 ? static_cast<unsigned int>(nbytes - off) : 8u;
    const u64 mine = active ? load_unit(in, off, valid) : 0;
    // A cached load: only this block's thread 0 stores the counter (chunk 0 is block 0's in every call of a
    // launch), through this SM's L1, and a launch starts with L1 invalidated; a volatile load went to L2.
    const unsigned int call = t.counters[kTeamCounterChunk] + 1u;
    const unsigned int parity = call & 1u;
    const unsigned int peer = width == 1 ? (t.rank ^ 1u) : q;
    u64 v = mine;
    if (active && peer < t.size && peer != t.rank) {
      ll_store(ll_slot(t, peer, 0, parity, t.rank) + group, static_cast<unsigned int>(mine),
               static_cast<unsigned int>(mine >> 32), call);
      const uint4* slot = ll_slot(t, t.rank, 0, parity, peer) + group;
      uint4 got = ll_load(slot);
      u64 deadline = 0;
      unsigned int spins = 0;
      while (got.y != call || got.w != call) {
        if (++spins % 256u == 0u && (deadline = oneshot_wait_check(deadline, t.timeout_ns, t.abort)) == 0) {
          got = ll_load(slot);
          if (got.y == call && got.w == call) break;
          team_fail(t, kTeamErrorSlot, peer, 0, call);
          failed = 1;
          break;
        }
        got = ll_load(slot);
      }
      v = static_cast<u64>(got.x) | (static_cast<u64>(got.z) << 32);
    }
    u64 acc;
    if (width == 1) {  // one or two ranks: rank 0's value first
      acc = t.size == 2 ? (t.rank == 0 ? unit_op<T>(mine, v, valid, op) : unit_op<T>(v, mine, valid, op)) : mine;
    } else {
      acc = __shfl_sync(0xffffffffu, v, 0, width);
      for (unsigned int k = 1; k < t.size; ++k) acc = unit_op<T>(acc, __shfl_sync(0xffffffffu, v, k, width), valid, op);
    }
    const bool any_failed = __any_sync(0xffffffffu, failed);
    if (!any_failed && active && q == 0) store_unit(out, off, valid, acc);
    if (!any_failed && tid == 0) t.counters[kTeamCounterChunk] = call;
  }
  return !__syncthreads_or(failed);
}

}  // namespace detail

// ---- one-shot (LL) -------------------------------------------------------------------------------------
// Every thread of the grid, n * sizeof(T) <= kLLChunks * kLLChunkBytes, sizeof(T) <= 8: out = op over every
// rank's in (out may be in). Chunk c (1 KiB) is block c mod G's; it stores each 8-byte line of mine as one
// 16-byte LL line into every peer's slot for me, and folds every rank's line in rank order as it arrives.
// The chunk's call number (private, per chunk: whichever block handles it next continues the count) is the
// flag, and its parity picks one of two slot sets, so nothing is ever reset: one round trip a call.
//
// Who waits for whom: with two ranks a line is one thread's (one peer: one store, one poll). With more, a
// line is a group of `width` threads (the team size rounded up to a power of two, at most 32, so a group
// is part of one warp): thread q of the group stores to rank q and polls rank q's line, so every peer's
// store and poll are in flight at once, and the group folds the values through shuffles in rank order.
// One thread polling its peers in turn paid a round trip a peer (scripts/dev/oneshot_variants.py, one H200
// under MPS, 8-byte calls): 1.29 us a call at 4 ranks and 2.44 at 8 that way, 1.57 and 1.86 this way. Teams
// over 32 ranks keep one thread a line, as do blocks narrower than a group. The grouped path is a function
// of its own (oneshot_grouped), so the two-rank path stays as it was. A kernel that calls this should let
// the compiler have the registers (__launch_bounds__(threads, 1)): held to 32 it spills on the poll path.
template <class T, class Op>
__device__ bool allreduce_oneshot(const Team& t, const T* in, T* out, unsigned long long n, Op op) {
  using detail::u64;
  const u64 nbytes = n * sizeof(T);
  const unsigned int chunks = static_cast<unsigned int>((nbytes + kLLChunkBytes - 1) / kLLChunkBytes);
  const unsigned int tid = detail::block_thread();
  const unsigned int width = detail::oneshot_width(t.size, detail::block_threads());
  __shared__ unsigned int call_s;
  int failed = 0;
  if (detail::oneshot_fits_warp(t, nbytes, width)) return detail::oneshot_warp(t, in, out, nbytes, op, width);
  if (width > 1) return detail::oneshot_grouped(t, in, out, n, op, width);
  for (unsigned int c = detail::team_block(); c < chunks; c += detail::team_blocks()) {
    const u64 lo = static_cast<u64>(c) * kLLChunkBytes;
    const u64 bytes = nbytes - lo < kLLChunkBytes ? nbytes - lo : kLLChunkBytes;
    const unsigned int lines = static_cast<unsigned int>((bytes + 7) / 8);
    // The first line's data is loaded while thread 0 loads the call number: two loads in flight, not
    // one after the other, on the latency path.
    const u64 first_off = lo + static_cast<u64>(tid) * 8;
    const unsigned int first_valid =
        tid < lines && nbytes - first_off < 8 ? static_cast<unsigned int>(nbytes - first_off) : 8u;
    const u64 first = tid < lines ? detail::load_unit(in, first_off, first_valid) : 0;
    if (tid == 0) call_s = t.counters[kTeamCounterChunk + c] + 1u;
    __syncthreads();
    const unsigned int call = call_s, parity = call & 1u;
    for (unsigned int line = tid; line < lines; line += detail::block_threads()) {
      const u64 off = lo + static_cast<u64>(line) * 8;
      const unsigned int valid = nbytes - off < 8 ? static_cast<unsigned int>(nbytes - off) : 8u;
      const u64 mine = line == tid ? first : detail::load_unit(in, off, valid);
      for (unsigned int k = 1; k < t.size; ++k) {  // peers in the order rank + 1, rank + 2, ...: spread the stores
        const unsigned int q = (t.rank + k) % t.size;
        detail::ll_store(detail::ll_slot(t, q, c, parity, t.rank) + line, static_cast<unsigned int>(mine),
                         static_cast<unsigned int>(mine >> 32), call);
      }
      u64 acc = 0;
      for (unsigned int q = 0; q < t.size && !failed; ++q) {
        u64 v = mine;
        if (q != t.rank) {
          const uint4* slot = detail::ll_slot(t, t.rank, c, parity, q) + line;
          uint4 got;
          circuslink::detail::Deadline d = circuslink::detail::Deadline::after(t.timeout_ns, t.abort);
          if (!circuslink::detail::spin_until([&] {
                got = detail::ll_load(slot);
                return got.y == call && got.w == call;
              }, d)) {
            detail::team_fail(t, kTeamErrorSlot, q, c, call);
            failed = 1;
            break;
          }
          v = static_cast<u64>(got.x) | (static_cast<u64>(got.z) << 32);
        }
        acc = q == 0 ? v : detail::unit_op<T>(acc, v, valid, op);
      }
      if (failed) break;
      detail::store_unit(out, off, valid, acc);
    }
    if (__syncthreads_or(failed)) return false;
    if (tid == 0) t.counters[kTeamCounterChunk + c] = call;
  }
  return true;
}

// ---- two-shot ------------------------------------------------------------------------------------------
// Every thread of the grid: out = op over every rank's in (out may be in), in pieces of the stage. Per
// piece: copy in to my stage; barrier; reduce my segment, loading every rank's stage in place, and push
// the result into every rank's stage (and my out); barrier; copy the other segments from my own stage
// into out; a barrier of my own blocks. No third team barrier: after the second, only I touch my stage
// until every rank has passed the next piece's first barrier, which I reach only after my copies. Each
// reduced byte is written once where each reader finds it locally.
template <class T, class Op>
__device__ bool allreduce_twoshot(const Team& t, const T* in, T* out, unsigned long long n, Op op) {
  using detail::u64;
  const u64 cap = detail::piece_elems<T>(t, 1);
  T* mine = detail::stage_of<T>(t, t.rank);
  for (u64 base = 0; base < n; base += cap) {
    const u64 m = n - base < cap ? n - base : cap;
    detail::grid_copy(mine, in + base, m);
    if (!detail::team_sync(t)) return false;
    u64 lo, hi;
    detail::team_segment(m, sizeof(T), t.size, t.rank, lo, hi);
    detail::grid_fold_push(t, lo, hi - lo, out + base + lo, op);
    if (!detail::team_sync(t)) return false;
    for (unsigned int k = 1; k < t.size; ++k) {
      const unsigned int q = (t.rank + k) % t.size;
      detail::team_segment(m, sizeof(T), t.size, q, lo, hi);
      detail::grid_copy(out + base + lo, mine + lo, hi - lo);
    }
    // My blocks' copies out of my stage before any of them copies the next piece (or call) in: the
    // copies map elements to threads differently, so without it a fast block overwrites what a slow
    // one has still to read (seen on 4 ranks with several pieces). This rank's blocks only.
    if (!detail::rank_sync(t)) return false;
  }
  return true;
}

// Every thread of the grid, in place on data already in my stage (stage<T>(team)[0, n), n * sizeof(T) <=
// stage_bytes): the symmetric form, as NVSHMEM's collectives on symmetric memory: no copy in; barrier;
// each rank reduces its segment and pushes it into every rank's stage; barrier. Per rank it loads and
// stores the message once each: 2 (n - 1) / n of it crosses between ranks, the bus-bandwidth minimum.
// The caller's writes to the stage precede the call.
template <class T, class Op>
__device__ bool allreduce_stage(const Team& t, unsigned long long n, Op op) {
  using detail::u64;
  if (t.size == 1) return true;
  if (n * sizeof(T) > t.stage_bytes) {  // a caller's error: say so rather than run past the stage
    if (detail::grid_thread() == 0) detail::team_fail(t, kTeamErrorStage, t.rank, 0, 0);
    return false;
  }
  if (!detail::team_sync(t)) return false;
  u64 lo, hi;
  detail::team_segment(n, sizeof(T), t.size, t.rank, lo, hi);
  detail::grid_fold_push(t, lo, hi - lo, static_cast<T*>(nullptr), op);
  return detail::team_sync(t);
}

// This rank's stage (device memory every rank maps), for allreduce_stage.
template <class T>
__device__ __forceinline__ T* stage(const Team& t) { return detail::stage_of<T>(t, t.rank); }

// Every thread of the grid: the all-reduce picked by size (one-shot up to t.oneshot_max bytes, which
// the host fills from its switch table, collectives/_select.py; two-shot above).
template <class T, class Op>
__device__ bool allreduce(const Team& t, const T* in, T* out, unsigned long long n, Op op) {
  if (t.size == 1 || n == 0) {
    if (in != out) detail::grid_copy(out, in, n);
    return true;
  }
  if (sizeof(T) <= 8 && n * sizeof(T) <= t.oneshot_max &&
      n * sizeof(T) <= static_cast<unsigned long long>(kLLChunks) * kLLChunkBytes)
    return allreduce_oneshot(t, in, out, n, op);
  return allreduce_twoshot(t, in, out, n, op);
}
template <class T, class Op>
__device__ bool allreduce(const Team& t, T* data, unsigned long long n, Op op) {
  return allreduce(t, static_cast<const T*>(data), data, n, op);
}

// Every thread of the grid: in holds size blocks of `count` elements; out[0, count) = block `rank` reduced
// over every rank (rank order). Per piece: my blocks' piece into my stage (block q at q x piece); barrier;
// fold my block from every stage; barrier.
template <class T, class Op>
__device__ bool reduce_scatter(const Team& t, const T* in, T* out, unsigned long long count, Op op) {
  using detail::u64;
  const u64 cap = detail::piece_elems<T>(t, t.size);
  T* mine = detail::stage_of<T>(t, t.rank);
  for (u64 base = 0; base < count; base += cap) {
    const u64 m = count - base < cap ? count - base : cap;
    for (unsigned int q = 0; q < t.size; ++q) detail::grid_copy(mine + q * cap, in + q * count + base, m);
    if (!detail::team_sync(t)) return false;
    detail::grid_fold(t, t.rank * cap, m, out + base, op);
    if (!detail::team_sync(t)) return false;
  }
  return true;
}

// Every thread of the grid: out[q * count + i] = rank q's in[i].
template <class T>
__device__ bool all_gather(const Team& t, const T* in, T* out, unsigned long long count) {
  using detail::u64;
  const u64 cap = detail::piece_elems<T>(t, 1);
  T* mine = detail::stage_of<T>(t, t.rank);
  for (u64 base = 0; base < count; base += cap) {
    const u64 m = count - base < cap ? count - base : cap;
    detail::grid_copy(mine, in + base, m);
    if (!detail::team_sync(t)) return false;
    for (unsigned int k = 0; k < t.size; ++k) {
      const unsigned int q = (t.rank + k) % t.size;
      detail::grid_copy(out + q * count + base, detail::stage_of<T>(t, q), m);
    }
    if (!detail::team_sync(t)) return false;
  }
  return true;
}

// Every thread of the grid: root's data[0, n) on every rank.
template <class T>
__device__ bool broadcast(const Team& t, T* data, unsigned long long n, unsigned int root) {
  using detail::u64;
  const u64 cap = detail::piece_elems<T>(t, 1);
  for (u64 base = 0; base < n; base += cap) {
    const u64 m = n - base < cap ? n - base : cap;
    if (t.rank == root) detail::grid_copy(detail::stage_of<T>(t, t.rank), data + base, m);
    if (!detail::team_sync(t)) return false;
    if (t.rank != root) detail::grid_copy(data + base, detail::stage_of<T>(t, root), m);
    if (!detail::team_sync(t)) return false;
  }
  return true;
}

// Every thread of the grid: returns once every block of every rank has arrived.
__device__ inline bool barrier(const Team& t) { return t.size == 1 || detail::team_sync(t); }

}  // namespace collectives
}  // namespace circuslink
