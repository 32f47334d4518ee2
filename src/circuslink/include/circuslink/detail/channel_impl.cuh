// circuslink/detail/channel_impl.cuh - the device implementation of docs/protocol.md.
//
// Everything works on bytes: Sender<T> / Receiver<T> turn element counts into byte counts.
// Groups: ThreadG (one thread), WarpG (a full, converged warp), BlockG (every thread of the
// block, any block shape). Every wait polls with a deadline (%globaltimer) and the host's abort
// word; on expiry it records an error in the end's error record and the call returns false on
// every thread of the group.
//
// One packet format for every size (docs/protocol.md): a write of at most `ll_max` bytes travels as
// low-latency packets (flag in every 8-byte unit, no fence: one store per lane, the reader polls the
// units it needs), a larger one as bulk packets (payload in the slot's bulk area, then the header
// after a release fence scoped to where the two ends are; the reader acquires the header, then copies).
// Readers read any mix.
//
// What the hot paths are built from (each measured against the relaxed store+poll floor, see
// docs/protocol.md "Measuring it"):
//   - a warp moves low-latency packets two at a time, 16 bytes (two units) a lane, and polls up to
//     kLLRound packets in one round of loads, so a 1 KiB message costs one round trip, not nine;
//   - the echo / forward polls a packet once and stores it onward from the registers it polled into;
//   - a failed poll costs only the next poll: the deadline, the abort word and the error record are read
//     by an out-of-line check every kSpinsPerCheck polls, whose arguments are passed by value;
//   - bulk packets fence at .gpu scope when both ends share a GPU, .sys otherwise (kHandleGpuScope);
//   - grid sessions keep each warp's packet numbers in registers, so back-to-back grid calls stream
//     without a grid barrier between them.
#pragma once

#include "channel_types.cuh"
#include "sync.cuh"

namespace circuslink {
namespace detail {

typedef unsigned long long u64;
typedef unsigned int u32;

// ---- groups ----------------------------------------------------------------------------------
struct ThreadG {
  __device__ static u32 size() { return 1; }
  __device__ static u32 rank() { return 0; }
  __device__ static void sync() {}
  __device__ static u64 bcast(u64 v) { return v; }
  __device__ static bool all(bool v) { return v; }
};

struct WarpG {
  __device__ static u32 size() { return 32; }
  __device__ static u32 rank() { return lane_id(); }
  __device__ static void sync() { __syncwarp(); }
  // the value of lane 0
  __device__ static u64 bcast(u64 v) {
    v = __shfl_sync(0xffffffffu, v, 0);
    __syncwarp();  // shfl alone orders no memory: lane 0's acquire must cover the others' loads
    return v;
  }
  __device__ static bool all(bool v) { return __all_sync(0xffffffffu, v) != 0; }
};

struct BlockG {
  __device__ static u32 size() { return block_threads(); }
  __device__ static u32 rank() { return block_thread(); }
  __device__ static void sync() { __syncthreads(); }
  // the value of thread 0
  __device__ static u64 bcast(u64 v) {
    __shared__ u64 slot;
    __syncthreads();
    if (rank() == 0) slot = v;
    __syncthreads();
    return slot;
  }
  __device__ static bool all(bool v) { return __syncthreads_and(v ? 1 : 0) != 0; }
};

// ---- memory operations -----------------------------------------------------------------------
struct U4 {
  u32 x, y, z, w;
};

// One 8-byte unit {word, flag}: a single-copy-atomic store / load (the PTX memory model makes each
// aligned 8-byte access atomic).
__device__ __forceinline__ void st_unit(void* p, u32 word, u32 flag) {
  const u64 v = (u64)word | ((u64)flag << 32);
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ld_unit(const void* p) {
  u64 v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// Two units in one instruction. Each 8-byte half is single-copy atomic on its own (a vector access is
// not atomic as a whole), which is all the format needs: every unit carries its own flag.
__device__ __forceinline__ void st_units2(void* p, u64 a, u64 b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ld_units2(const void* p, u64& a, u64& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ u64 unit(u32 word, u32 flag) { return (u64)word | ((u64)flag << 32); }
// Predicated forms for the one-packet path: a lane-dependent condition becomes a predicate on the one instruction
// instead of a divergent branch (each costs a convergence barrier and a branch resolution on a warp that runs alone).
__device__ __forceinline__ void st_units2_if(bool p, void* ptr, u64 a, u64 b) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %3, 0;\n @q st.volatile.global.v2.u64 [%0], {%1, %2};\n}" ::"l"(ptr),
               "l"(a), "l"(b), "r"((u32)p) : "memory");
}
__device__ __forceinline__ void st_unit_if(bool p, void* ptr, u64 v) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q st.volatile.global.u64 [%0], %1;\n}" ::"l"(ptr), "l"(v),
               "r"((u32)p) : "memory");
}
// The caller's buffers (global or shared memory: generic addressing), 8 bytes, where p holds (else 0 / nothing).
__device__ __forceinline__ u64 ld_u64_if(bool p, const void* ptr) {
  u64 v = 0;
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q ld.u64 %0, [%1];\n}" : "+l"(v) : "l"(ptr), "r"((u32)p)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_u64_if(bool p, void* ptr, u64 v) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q st.u64 [%0], %1;\n}" ::"l"(ptr), "l"(v), "r"((u32)p)
               : "memory");
}
__device__ __forceinline__ void st_relaxed_if(bool p, unsigned int* ptr, u32 v) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q st.volatile.global.u32 [%0], %1;\n}" ::"l"(ptr), "r"(v),
               "r"((u32)p) : "memory");
}
__device__ __forceinline__ void st_relaxed_u64_if(bool p, unsigned long long* ptr, u64 v) {
  asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q st.volatile.global.u64 [%0], %1;\n}" ::"l"(ptr), "l"(v),
               "r"((u32)p) : "memory");
}

__device__ __forceinline__ u32 unit_flag(u64 v) { return (u32)(v >> 32); }
// The header {route, flag} {nbytes | kind, flag} as two 8-byte halves in one instruction.
__device__ __forceinline__ void st_header(void* p, u32 route, u32 flag, u32 word) {
  st_units2(p, unit(route, flag), unit(word, flag));
}
// Release / acquire for bulk packets, at the scope where the two ends live: .gpu when they share a
// GPU (ranks under MPS), .sys otherwise (peer GPUs, host memory). Not the sequentially consistent
// fence (__threadfence_system), which costs far more.
__device__ __forceinline__ void fence_for(const ChannelHandle& h) {
  if (h.flags & kHandleGpuScope) fence_acq_rel_gpu();
  else fence_acq_rel_sys();
}

__device__ __forceinline__ void st_v4(void* p, U4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// L2-only loads: a previous lap of the ring must not be served from L1.
__device__ __forceinline__ U4 ld_cg_v4(const void* p) {
  U4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ unsigned char ld_cg_u8(const unsigned char* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return (unsigned char)v;
}

// Packet seq's flag: never 0 (a zeroed ring never looks written) and different from the flag of the
// slot's previous occupants back to 2^32 packets (seq and seq - k * nslots, nslots even, agree in bit
// 0). What stays equal after 2^32 packets is covered by rewrites_all(): every unit of every slot is
// rewritten at least every 2^31 packets, so no unit that old survives.
__device__ __forceinline__ u32 flag_of(u64 seq) { return (u32)seq | 1u; }
__device__ __forceinline__ bool rewrites_all(u64 seq, u32 nslots) { return ((u32)seq & 0x7FFFFFFFu) < nslots; }

// 32-bit slot arithmetic: the host refuses rings of 4 GiB or more when the channel opens
// (protocol.geometry), so nslots * slot_bytes always fits.
__device__ __forceinline__ unsigned char* slot_of(const ChannelHandle& h, u64 seq) {
  return h.ring + ((u32)seq & (h.nslots - 1u)) * h.slot_bytes;
}

// 4 bytes of src[pos..) as a word, zero past `end`.
__device__ __forceinline__ u32 gather4(const unsigned char* src, u64 pos, u64 end) {
  const unsigned char* p = src + pos;
  if (pos + 4 <= end && (((u64)p) & 3ull) == 0) return *reinterpret_cast<const u32*>(p);
  u32 v = 0;
  for (int b = 0; b < 4; ++b)
    if (pos + b < end) v |= (u32)p[b] << (8 * b);
  return v;
}
// 16 bytes of src[pos..) as a vector, zero past `end`.
__device__ __forceinline__ U4 gather16(const unsigned char* src, u64 pos, u64 end) {
  const unsigned char* p = src + pos;
  if (pos + 16 <= end && (((u64)p) & 15ull) == 0) return *reinterpret_cast<const U4*>(p);
  return U4{gather4(src, pos, end), gather4(src, pos + 4, end), gather4(src, pos + 8, end),
            gather4(src, pos + 12, end)};
}
// Store bytes [from, to) of the little-endian word w at dst.
__device__ __forceinline__ void scatter4(unsigned char* dst, u32 w, u32 from, u32 to) {
  if (from == 0 && to == 4 && (((u64)dst) & 3ull) == 0) {
    *reinterpret_cast<u32*>(dst) = w;
    return;
  }
  for (u32 b = from; b < to; ++b) dst[b - from] = (unsigned char)(w >> (8 * b));
}

// ---- errors and waits ------------------------------------------------------------------------------
// Record {code, channel id, seq lo, seq hi} once. The first failure claims the record with a sentinel,
// fills the fields, and publishes the code last, so a host or device that sees a code sees its fields.
__device__ __noinline__ void record_error(u32* error, u32 code, u32 channel_id, u64 seq) {
  if (atomicCAS(error, 0u, kErrClaimed) == 0u) {
    st_relaxed(error + 1, channel_id);
    st_relaxed(error + 2, (u32)seq);
    st_relaxed(error + 3, (u32)(seq >> 32));
    __threadfence_system();  // the failure path: cost does not matter, visibility to the host does
    st_relaxed(error, code);
    __threadfence_system();
  }
}
__device__ __forceinline__ void record_error(const ChannelHandle& h, u32 code, u64 seq) {
  record_error(h.error, code, h.channel_id, seq);
}
__device__ __forceinline__ bool has_error(const ChannelHandle& h) { return ld_relaxed(h.error) != 0u; }

// The rare path of every wait, out of line and with its arguments by value (nothing of the caller's
// lives on a stack): called every kSpinsPerCheck failed polls. The first call (deadline 0) starts the
// deadline; later calls say whether it passed. Returns the deadline to keep waiting with (>= kWaitLive),
// or why to stop: this end failed earlier, the host aborted, or the time is up.
enum : u32 { kSpinsPerCheck = 256 };
enum : u64 { kWaitFailed = 1, kWaitAborted = 2, kWaitExpired = 3, kWaitLive = 4 };
__device__ __noinline__ u64 wait_check(u64 deadline, u64 timeout_ns, const u32* error,
                                       const volatile unsigned int* abort) {
  if (abort != nullptr && *abort != 0u) return kWaitAborted;
  if (ld_relaxed(error) != 0u) return kWaitFailed;
  const u64 now = globaltimer_ns();
  if (deadline == 0ull) {
    if (timeout_ns == 0ull) return ~0ull;  // never: only the host's abort ends this wait
    return timeout_ns > ~0ull - now ? ~0ull : now + timeout_ns;
  }
  return now > deadline ? kWaitExpired : deadline;
}
// After a wait gave up: record why (the error of an end that failed earlier is already there).
__device__ __forceinline__ void wait_failed(const ChannelHandle& h, u64 why, u32 code, u64 seq) {
  if (why == kWaitAborted) record_error(h, kErrAborted, seq);
  else if (why == kWaitExpired) record_error(h, code, seq);
}

// One thread polls until ready() holds (the hot loop is the poll alone), running wait_check every kSpinsPerCheck
// failed polls. Every wait of one thread is this loop; its callers choose two things:
// * abort_always: read the host's abort word (host memory, across the bus) at every check, else at every 16th.
//   Where every warp of a grid may be waiting at once the reads queued: on one H200 at 33 blocks a rank, the
//   ring's grid form took a median of 423 us one-way for 1 MiB in 4 KiB packets against a minimum of 4.7, and
//   525 us for 4 MiB in 16 KiB packets; at every 16th check 4.85 and 10.2 us, 32 KiB unchanged (3.48 us
//   against 3.50; scripts/dev/grid_wait_ab.sh). The rendezvous' first cut showed the same (700 us against 4.3).
// * backoff: __nanosleep between polls, doubling up to kWaitBackoffNs (for the many waiters of one word).
#ifndef CIRCUSLINK_RDV_BACKOFF_NS
#define CIRCUSLINK_RDV_BACKOFF_NS 256
#endif
enum : u32 { kWaitBackoffNs = CIRCUSLINK_RDV_BACKOFF_NS };
template <typename Ready>
__device__ __forceinline__ bool poll_until(const ChannelHandle& h, Ready ready, u32 code, u64 seq, bool abort_always,
                                           bool backoff) {
  if (ready()) return true;
  u64 deadline = 0;
  u32 ns = 0, checks = 0;
  while (true) {
#pragma unroll 1
    for (u32 k = 0; k < kSpinsPerCheck; ++k) {
      if (ready()) return true;
      if (backoff) {
        __nanosleep(ns);
        ns = ns < kWaitBackoffNs ? 2 * ns + 32 : kWaitBackoffNs;
      }
    }
    deadline = wait_check(deadline, h.timeout_ns, h.error, abort_always || (++checks & 15u) == 0 ? h.abort : nullptr);
    if (deadline < kWaitLive) {
      if (ready()) return true;
      wait_failed(h, deadline, code, seq);
      return false;
    }
  }
}
// A wait of one thread alone (the latency path of every protocol).
template <typename Ready>
__device__ __forceinline__ bool wait_for(const ChannelHandle& h, Ready ready, u32 code, u64 seq) {
  return poll_until(h, ready, code, seq, true, false);
}
// The waits of the grid forms' packets (a slot's credit, a packet's header), made by every warp of a grid at once.
template <typename Ready>
__device__ __forceinline__ bool grid_wait(const ChannelHandle& h, Ready ready, u32 code, u64 seq) {
  return poll_until(h, ready, code, seq, false, false);
}

// A warp polls together: every kSpinsPerCheck failed rounds lane 0 runs the check and the warp agrees.
// Returns false when the wait must end (the reason is recorded).
struct WarpWait {
  u64 deadline;
  u32 spins;
  __device__ __forceinline__ static WarpWait start() { return WarpWait{0ull, 0u}; }
  __device__ __forceinline__ bool keep_going(const ChannelHandle& h, u32 code, u64 seq) {
    if (++spins < kSpinsPerCheck) return true;
    spins = 0;
    u64 d = 0;
    if (lane_id() == 0) d = wait_check(deadline, h.timeout_ns, h.error, h.abort);
    d = __shfl_sync(0xffffffffu, d, 0);
    if (d < kWaitLive) {
      if (lane_id() == 0) wait_failed(h, d, code, seq);
      return false;
    }
    deadline = d;
    return true;
  }
};

// ---- state -----------------------------------------------------------------------------------
__device__ __forceinline__ SendState load_send_state(const ChannelHandle& h) {
  SendState s;
  s.seq = ld_relaxed_u64(h.state);
  s.credit_cache = ld_relaxed_u64(h.state + 1);
  s.departed = 0;
  s.pad = 0;
  return s;
}
__device__ __forceinline__ void save_send_state(const ChannelHandle& h, const SendState& s) {
  st_relaxed_u64(h.state, s.seq);
  st_relaxed_u64(h.state + 1, s.credit_cache);
}
__device__ __forceinline__ RecvState load_recv_state(const ChannelHandle& h) {
  RecvState s;
  s.seq = ld_relaxed_u64(h.state);
  s.offset = ld_relaxed(reinterpret_cast<const u32*>(h.state + 1));
  s.departed = 0;
  s.returned = ld_relaxed_u64(h.state + 2);
  return s;
}
__device__ __forceinline__ void save_recv_state(const ChannelHandle& h, const RecvState& s) {
  st_relaxed_u64(h.state, s.seq);
  st_relaxed(reinterpret_cast<u32*>(h.state + 1), s.offset);
  st_relaxed_u64(h.state + 2, s.returned);
}

// ---- credits ---------------------------------------------------------------------------------
// Sender, every thread of the group with the same state: may packet `seq` be written? From the
// cached counter (registers, no load, no broadcast) when it can tell; else the leader waits for the
// counter (out of line, arguments by value) and the group agrees on the value it saw.
__device__ __noinline__ u64 credit_wait(const unsigned long long* credit, u64 seq, u32 nslots, u64 timeout_ns,
                                        u32* error, const volatile unsigned int* abort, u32 channel_id) {
  u64 deadline = 0;
  while (true) {
#pragma unroll 1
    for (u32 k = 0; k < kSpinsPerCheck; ++k) {
      const u64 seen = ld_relaxed_u64(credit);
      if (seq < seen + nslots) return seen;
    }
    deadline = wait_check(deadline, timeout_ns, error, abort);
    if (deadline < kWaitLive) {
      const u64 seen = ld_relaxed_u64(credit);
      if (seq < seen + nslots) return seen;
      if (deadline != kWaitFailed)
        record_error(error, deadline == kWaitAborted ? kErrAborted : kErrCreditTimeout, channel_id, seq);
      return ~0ull;
    }
  }
}
template <typename G>
__device__ __forceinline__ bool credit_for(const ChannelHandle& h, SendState& st, u64 seq) {
  if (seq < st.credit_cache + h.nslots) return true;
  u64 seen = 0;
  if (G::rank() == 0) seen = credit_wait(h.credit, seq, h.nslots, h.timeout_ns, h.error, h.abort, h.channel_id);
  seen = G::bcast(seen);
  if (seen == ~0ull) return false;
  st.credit_cache = seen;
  return true;
}

// Receiver: packet `seq` is consumed. Its slot credit (for the grid forms' writers) at once; the
// in-order counter lazily, every half ring (flush_credits() before any wait, so a writer blocked on
// credits this reader holds always gets them before the reader blocks in turn).
__device__ __forceinline__ void flush_credits(const ChannelHandle& h, RecvState& st) {
  if (st.seq != st.returned) {
    st_relaxed_u64(h.credit, st.seq);
    st.returned = st.seq;
  }
}
__device__ __forceinline__ void consumed(const ChannelHandle& h, RecvState& st) {
  st_relaxed(h.slot_credit + ((u32)st.seq & (h.nslots - 1u)), flag_of(st.seq));
  st.seq += 1;
  st.offset = 0;
  if (st.seq - st.returned >= (h.nslots >> 1)) flush_credits(h, st);
}
// The same bookkeeping on the lanes that do not store (they keep the state in step with lane 0).
__device__ __forceinline__ void consumed_mirror(const ChannelHandle& h, RecvState& st) {
  st.seq += 1;
  st.offset = 0;
  if (st.seq - st.returned >= (h.nslots >> 1)) st.returned = st.seq;
}

// ---- low-latency packets: stores -----------------------------------------------------------------
// A warp stores packets two at a time: lanes 0-15 packet 2i, lanes 16-31 packet 2i + 1; lane `sub` of a
// half stores units 2 sub and 2 sub + 1 with one 16-byte store. Sub 0 holds the header (units 0 and 1),
// sub m >= 1 payload bytes [8 (m - 1), 8 m). Units past nbytes are not stored, except on a rewrite lap.
// Packets a warp polls in one round (four 16-byte loads a lane; 960 payload bytes). More would take
// more registers from every kernel that reads a channel (16: 128 registers a thread, against 64 at 8).
enum : u32 { kLLRound = 8 };

__device__ __forceinline__ void ll_store_pair(const ChannelHandle& h, unsigned char* slot, u64 seq,
                                              const unsigned char* src, u32 nb, u32 sub) {
  const u32 flag = flag_of(seq);
  if (sub == 0) {
    st_header(slot, h.route, flag, nb);
    return;
  }
  // Exactly the units below nb (one 8-byte store where only the first of the pair is), all on a rewrite lap.
  const u32 lo = 8 * (sub - 1);
  if (lo + 4 < nb || rewrites_all(seq, h.nslots))
    st_units2(slot + 16 * sub, unit(gather4(src, lo, nb), flag), unit(gather4(src, lo + 4, nb), flag));
  else if (lo < nb)
    st_unit(slot + 16 * sub, gather4(src, lo, nb), flag);
}

// Write nbytes as low-latency packets of <= 120 bytes. The state is the caller's (a session keeps it in
// registers across calls). Every warp of the group stores two packets per instruction, so a block of W
// warps stores 2 W packets a round.
template <typename G>
__device__ bool ll_write_st(const ChannelHandle& h, SendState& st, const unsigned char* src, u64 nbytes) {
  const u64 npk = (nbytes + kLLPayload - 1) / kLLPayload;
  if (G::size() == 1) {  // one thread: the units of each packet in turn
    for (u64 p = 0; p < npk; ++p) {
      const u64 seq = st.seq + p, off = p * kLLPayload;
      if (!credit_for<G>(h, st, seq)) { st.seq += p; return false; }
      const u32 nb = (u32)(nbytes - off < kLLPayload ? nbytes - off : kLLPayload);
      unsigned char* slot = slot_of(h, seq);
      for (u32 sub = 0; sub < kLLUnits / 2; ++sub) ll_store_pair(h, slot, seq, src + off, nb, sub);
    }
    st.seq += npk;
    return true;
  }
  const u64 per_round = 2 * (G::size() / 32);
  const u32 me = G::rank() / 16, sub = lane_id() & 15u;  // this half-warp's packet within a round
  u64 p0 = 0;  // first packet of this round
  while (p0 < npk) {
    // A later round's packet may land in a slot an earlier round wrote through other lanes: the barrier
    // orders those stores (only a writer whose credits let it lap the ring within one call can see it).
    if (p0 > 0) G::sync();
    // Wait for the credit of the round's FIRST packet only, then write as many as the credits allow:
    // a reader whose read spans the last packet written and the next one holds the last one until the
    // next arrives, so waiting for a whole round's credits could wait on that reader for ever.
    if (!credit_for<G>(h, st, st.seq + p0)) { st.seq += p0; return false; }
    const u64 room = st.credit_cache + h.nslots - (st.seq + p0);
    u64 cnt = npk - p0 < per_round ? npk - p0 : per_round;
    cnt = cnt < room ? cnt : room;
    cnt = cnt < h.nslots ? cnt : h.nslots;  // a round's packets never share a slot, whatever the credits say
    if (me < cnt) {
      const u64 p = p0 + me, off = p * kLLPayload;
      const u32 nb = (u32)(nbytes - off < kLLPayload ? nbytes - off : kLLPayload);
      ll_store_pair(h, slot_of(h, st.seq + p), st.seq + p, src + off, nb, sub);
    }
    p0 += cnt;
  }
  st.seq += npk;
  return true;
}

// ---- low-latency packets: one warp polls a round ----------------------------------------------------
// A round: packets st.seq .. st.seq + count - 1 (count <= kLLRound and <= nslots), loaded with one
// 16-byte load per lane per two packets. After it, the warp knows how many leading packets are complete
// (header and every data unit below nbytes flagged) and each one's nbytes; the loaded units stay in
// a[] / b[] for the caller to use, with no second load.
struct LLRound {
  u64 a[kLLRound / 2], b[kLLRound / 2];  // lane's units 2 sub and 2 sub + 1 of packet 2 i + half
  u32 nb[kLLRound];                       // header word of each packet (uniform); kNoHeader if not there yet
  u32 complete;                           // leading complete low-latency packets
  bool bulk_next;                         // the first incomplete packet is a bulk packet (its header is there)
};
enum : u32 { kNoHeader = 0xFFFFFFFFu };

__device__ __forceinline__ void ll_poll(const ChannelHandle& h, u64 seq, u32 count, LLRound& r) {
  const u32 lane = lane_id(), half = lane >> 4, sub = lane & 15u;
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    r.a[i] = 0;
    r.b[i] = 0;
    if (2 * i < count) {
      const u32 q = 2 * i + half;
      if (q < count) ld_units2(slot_of(h, seq + q) + 16 * sub, r.a[i], r.b[i]);
    }
  }
  r.complete = 0;
  r.bulk_next = false;
  bool broken = false;
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    if (2 * i < count) {
      const u32 q = 2 * i + half;
      const u32 flag = flag_of(seq + q);
      // header of this lane's packet, from sub 0 of its half
      const u64 hdr = __shfl_sync(0xffffffffu, r.b[i], lane & 16u);
      const bool hdr_ok = q < count && unit_flag(hdr) == flag;
      const u32 word = (u32)hdr;
      bool ok = hdr_ok && !(word & kKindBulk);
      if (ok && sub > 0) {
        const u32 lo = 8 * (sub - 1);
        if (lo < word) ok = unit_flag(r.a[i]) == flag;
        if (ok && lo + 4 < word) ok = unit_flag(r.b[i]) == flag;
      }
      const u32 votes = __ballot_sync(0xffffffffu, ok);
      const u32 hdrs = __ballot_sync(0xffffffffu, hdr_ok);
      const u32 w0 = __shfl_sync(0xffffffffu, word, 0), w1 = __shfl_sync(0xffffffffu, word, 16);
      r.nb[2 * i] = (hdrs & 1u) ? w0 : kNoHeader;
      r.nb[2 * i + 1] = (2 * i + 1 < count && (hdrs & 0x10000u)) ? w1 : kNoHeader;
      const bool c0 = (votes & 0xFFFFu) == 0xFFFFu, c1 = 2 * i + 1 < count && (votes >> 16) == 0xFFFFu;
      if (!broken) {
        if (c0) {
          r.complete += 1;
          if (c1) r.complete += 1;
          else { broken = true; r.bulk_next = 2 * i + 1 < count && r.nb[2 * i + 1] != kNoHeader && (w1 & kKindBulk); }
        } else {
          broken = true;
          r.bulk_next = r.nb[2 * i] != kNoHeader && (w0 & kKindBulk);
        }
      }
    }
  }
}

// How many packets a read of `need` more bytes from (seq, offset) may poll in one round.
__device__ __forceinline__ u32 ll_round_count(const ChannelHandle& h, u32 offset, u64 need) {
  u64 c = (offset + need + kLLPayload - 1) / kLLPayload;
  if (c < 1) c = 1;
  if (c > kLLRound) c = kLLRound;
  if (c > h.nslots) c = h.nslots;
  return (u32)c;
}

// Take the complete packets of a round into dst (at most `need` bytes, from st.offset of the first):
// each lane stores its own payload bytes, straight from the round's registers. Returns the bytes taken.
__device__ __forceinline__ u64 ll_take_round(const ChannelHandle& h, RecvState& st, const LLRound& r,
                                              unsigned char* dst, u64 need) {
  const u32 lane = lane_id(), half = lane >> 4, sub = lane & 15u;
  u64 got = 0;          // bytes of dst before the current pair of packets (uniform)
  u32 used = 0;         // packets taken from, whole or in part
  bool last_whole = true;
  u32 last_end = 0;     // where the last packet taken from stops (bytes of its payload)
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    u32 take[2] = {0u, 0u}, from[2] = {0u, 0u};
#pragma unroll
    for (u32 k = 0; k < 2; ++k) {  // packet 2 i + k: how much of it this read takes (uniform)
      const u32 q = 2 * i + k;
      const u64 before = got + (k ? take[0] : 0u);
      if (q < r.complete && before < need) {
        from[k] = q == 0 ? st.offset : 0u;
        const u32 avail = r.nb[q] - from[k];
        take[k] = (u64)avail < need - before ? avail : (u32)(need - before);
        used = q + 1;
        last_end = from[k] + take[k];
        last_whole = last_end == r.nb[q];
      }
    }
    // lane (half, sub) holds payload bytes [8 (sub - 1), 8 sub) of packet 2 i + half
    const u32 f = half ? from[1] : from[0], t = half ? take[1] : take[0];
    if (t > 0 && sub > 0) {
      const u64 at = got + (half ? take[0] : 0u);
      const u32 lo = 8 * (sub - 1), upto = f + t;
      const u32 words[2] = {(u32)r.a[i], (u32)r.b[i]};
#pragma unroll
      for (u32 k = 0; k < 2; ++k) {
        const u32 wlo = lo + 4 * k, whi = wlo + 4;
        const u32 s = wlo > f ? wlo : f, e = whi < upto ? whi : upto;
        if (s < e) scatter4(dst + at + (s - f), words[k], s - wlo, e - wlo);
      }
    }
    got += take[0] + take[1];
  }
  // bookkeeping: slot credits for the packets consumed whole, then the state
  const u32 whole = last_whole ? used : used - 1;
  if (lane == 0) {
    for (u32 q = 0; q < whole; ++q)
      st_relaxed(h.slot_credit + ((u32)(st.seq + q) & (h.nslots - 1u)), flag_of(st.seq + q));
  }
  st.seq += whole;
  st.offset = last_whole ? 0u : last_end;
  if (st.seq - st.returned >= (h.nslots >> 1)) {
    if (lane == 0) st_relaxed_u64(h.credit, st.seq);
    st.returned = st.seq;
  }
  return got;
}

// ---- low-latency packets: the one-packet latency path ---------------------------------------------
// A message of at most one packet, written, read or passed on whole by a warp, is the latency path. One warp runs it
// alone, so its cost is its instruction count: a warp that has nothing to overlap issues one dependent instruction
// every 4-9 cycles. Measured on one H200 (2 ranks under MPS, and the same pingpong in one process under Nsight
// Compute): the general paths took about 100 instructions a write and 140 a read, 0.55 us of a 0.79 us one-way
// time, while the memory system's part matched a hand-written loop's. So these paths do only what one packet
// needs, and everything that does not depend on the packet (slot address, flag, which lanes poll) is worked out
// before the poll:
//   - the poll loop is one 16-byte load a lane, a flag compare and one vote; the header's nbytes is looked at
//     once, after the vote (a bulk packet, or one shorter than the read, goes to the general path);
//   - the writer stores one 16-byte pair of units a lane, its payload taken with one 8-byte load where aligned.
// This path polls the packet's first `need` bytes (lanes 0-15, 16 bytes each: lane 0 the header, lane m payload
// bytes [8 (m - 1), 8 m)) and returns with them in a / b. Returns the packet's nbytes once the header and those units
// are there; kLLFallback when the packet is bulk or shorter than `need` (the general path takes it); 0 when the
// wait failed (recorded).
enum : u32 { kLLFallback = 0xFFFFFFFFu };

// The rare side of the one-packet poll, out of line with its arguments by value: every kSpinsPerCheck failed polls
// the deadline, abort and error check. Returns the deadline to keep polling with (>= kWaitLive), else why to stop
// (recorded).
__device__ __noinline__ u64 ll_poll_check(u64 deadline, u64 seq, u64 timeout_ns, u32* error,
                                          const volatile unsigned int* abort, u32 channel_id) {
  const u64 d = wait_check(deadline, timeout_ns, error, abort);
  if (d == kWaitAborted) record_error(error, kErrAborted, channel_id, seq);
  else if (d == kWaitExpired) record_error(error, kErrDataTimeout, channel_id, seq);
  return d;
}

// The failed-poll side of the one- and few-packet polls, off their hot loops: the first failed poll hands back the
// credits the reader holds (a writer may be blocked on them), then every kSpinsPerCheck failed polls lane 0 runs
// the out-of-line check and the warp agrees. False when the wait must end (recorded).
struct LLPollWait {
  u64 deadline = 0;
  u32 spins = 0, check_at = 1;
  __device__ __forceinline__ bool failed_poll(const ChannelHandle& h, RecvState& st) {
    if (++spins != check_at) return true;
    const u32 lane = lane_id();
    if (spins == 1) {
      st_relaxed_u64_if(lane == 0 && st.seq != st.returned, h.credit, st.seq);
      st.returned = st.seq;
      check_at = kSpinsPerCheck;
      return true;
    }
    u64 d = 0;
    if (lane == 0) d = ll_poll_check(deadline, st.seq, h.timeout_ns, h.error, h.abort, h.channel_id);
    d = __shfl_sync(0xffffffffu, d, 0);
    if (d < kWaitLive) return false;
    deadline = d;
    check_at = spins + kSpinsPerCheck;
    return true;
  }
};

__device__ __forceinline__ u32 ll_wait_one(const ChannelHandle& h, RecvState& st, u64 need, u64& a, u64& b) {
  const u32 lane = lane_id();
  const u32 flag = flag_of(st.seq);
  const u32 lo = 8 * (lane - 1);
  const bool poll = lane == 0 || (lane < 16 && lo < need);
  const bool first = lane != 0;            // lane 0's a is the route unit: its b (nbytes) carries the flag
  const bool second = lane == 0 || lo + 4 < need;
  // Every lane loads (no branch around the load): a lane that does not poll loads lane 0's 16 bytes, the same
  // sector, so the warp's request is no larger; its a and b mean nothing to the caller.
  const unsigned char* p = slot_of(h, st.seq) + (poll ? 16 * lane : 0u);
  LLPollWait wait;
  a = 0;
  b = 0;
  while (true) {
    ld_units2(p, a, b);
    const bool ok = !poll | ((!first | (unit_flag(a) == flag)) & (!second | (unit_flag(b) == flag)));
    const u32 votes = __ballot_sync(0xffffffffu, ok);
    if (votes == 0xFFFFFFFFu) break;
    if (votes & 1u) {  // the header is there, not every unit: in flight, or a packet this path does not take
      const u32 word = (u32)__shfl_sync(0xffffffffu, b, 0);
      if ((word & kKindBulk) || word < need) return kLLFallback;
    }
    if (!wait.failed_poll(h, st)) return 0;
  }
  const u32 nb = (u32)__shfl_sync(0xffffffffu, b, 0);
  return (nb & kKindBulk) || nb < need ? kLLFallback : nb;
}

// The unaligned or partial 8 bytes of the one-packet path, out of line (the common case is one aligned access).
__device__ __noinline__ u64 src_gather8(const unsigned char* src, u32 lo, u32 nb) {
  return (u64)gather4(src, lo, nb) | ((u64)gather4(src, lo + 4, nb) << 32);
}
__device__ __noinline__ void dst_scatter8(unsigned char* d, u64 v, u32 n) {
  for (u32 i = 0; i < n; ++i) d[i] = (unsigned char)(v >> (8 * i));
}

// After ll_wait_one: `take` bytes of the packet (all of it or its first part) are consumed.
__device__ __forceinline__ void ll_consume_one(const ChannelHandle& h, RecvState& st, u32 nb, u32 take) {
  if (take < nb) {
    st.offset = take;
    return;
  }
  const bool leader = lane_id() == 0;
  st_relaxed_if(leader, h.slot_credit + ((u32)st.seq & (h.nslots - 1u)), flag_of(st.seq));
  st.seq += 1;
  st.offset = 0;
  if (st.seq - st.returned >= (h.nslots >> 1)) {  // uniform
    st_relaxed_u64_if(leader, h.credit, st.seq);
    st.returned = st.seq;
  }
}

// A warp reads `need` (1..kLLPayload) bytes at a packet boundary: the packet's first `need` bytes go to dst, each
// payload lane storing its 8 bytes at once where dst allows. Returns as ll_wait_one does.
__device__ __forceinline__ u32 ll_read_one(const ChannelHandle& h, RecvState& st, unsigned char* dst, u32 need) {
  u64 a, b;
  const u32 nb = ll_wait_one(h, st, need, a, b);
  if (nb == 0 || nb == kLLFallback) return nb;
  const u32 lane = lane_id(), lo = 8 * (lane - 1);
  const bool mine = lane != 0 && lo < need;  // lanes 1 .. 15 that hold bytes of the read
  const u64 v = (a & 0xFFFFFFFFull) | (b << 32);
  if (((((u64)dst) | need) & 7u) == 0) st_u64_if(mine, dst + lo, v);  // whole aligned words (uniform)
  else if (mine) dst_scatter8(dst + lo, v, need - lo < 8 ? need - lo : 8);
  ll_consume_one(h, st, nb, need);
  return nb;
}

// A warp writes nb (1..kLLPayload) bytes as one low-latency packet: lane 0 the header, lane m payload bytes
// [8 (m - 1), 8 m), one 16-byte store each (one 8-byte store where only the first unit is below nb; every unit on
// a rewrite lap, as ll_store_pair does), the payload taken with one 8-byte load where src allows.
__device__ __forceinline__ bool ll_write_one(const ChannelHandle& h, SendState& st, const unsigned char* src, u32 nb) {
  const u64 seq = st.seq;
  if (seq >= st.credit_cache + h.nslots && !credit_for<WarpG>(h, st, seq)) return false;
  const u32 lane = lane_id(), flag = flag_of(seq), lo = 8 * (lane - 1);
  unsigned char* p = slot_of(h, seq) + 16 * lane;
  const bool lap = rewrites_all(seq, h.nslots), data = lane != 0 && lo < nb;
  u64 v;
  if (((((u64)src) | nb) & 7u) == 0) v = ld_u64_if(data, src + lo);  // whole aligned words (uniform)
  else v = data ? src_gather8(src, lo, nb) : 0ull;
  const u32 x = lane == 0 ? h.route : (u32)v, y = lane == 0 ? nb : (u32)(v >> 32);  // lane 0: the header
  const bool two = lane < 16 && (lane == 0 || lo + 4 < nb || lap);
  st_units2_if(two, p, unit(x, flag), unit(y, flag));
  st_unit_if(!two && data, p, unit(x, flag));
  st.seq = seq + 1;
  return true;
}

// ---- low-latency packets: the few-packet path -----------------------------------------------------
// A message of 2 .. kLLRound packets (121 .. 960 bytes) written, read or passed on whole by a warp: the one-packet
// path's rules over up to four pairs of packets (lanes 0-15 packet 2 i, lanes 16-31 packet 2 i + 1, as
// ll_store_pair and ll_poll lay them out), unrolled and predicated: no per-round barrier, no credit wait between
// packets, no byte loops where the caller's buffer is aligned. The general paths cost about 3 x the one-packet
// path's time at two packets (instruction count on a lone warp, as above). A message is taken here only when its
// packets are as a few-packet write lays them out (every packet full but the last, which may hold more than the
// read takes); anything else goes to the general path, which then finds every packet still unconsumed.
struct LLFew {
  u64 a[kLLRound / 2], b[kLLRound / 2];  // lane's units 2 sub and 2 sub + 1 of packet 2 i + half
};

__device__ __forceinline__ u32 ll_packets(u64 nbytes) { return (u32)((nbytes + kLLPayload - 1) / kLLPayload); }

// Payload bytes a few-packet message of `need` bytes has (writer) or needs (reader) in its packet q < npk.
__device__ __forceinline__ u32 ll_few_bytes(u32 q, u32 npk, u32 need) {
  return q + 1 < npk ? (u32)kLLPayload : need - q * kLLPayload;
}

// A warp writes nbytes (kLLPayload < nbytes <= kLLRound * kLLPayload) as ll_packets(nbytes) low-latency packets,
// one 16-byte store a lane a pair of packets. It needs every packet's credit at once: when the cached counter
// cannot tell, one look at the counter (no wait); if the ring is still too full, the general path writes the
// message (it waits for the first packet's credit only: see ll_write_st).
__device__ __forceinline__ bool ll_write_few(const ChannelHandle& h, SendState& st, const unsigned char* src,
                                             u32 nbytes) {
  const u32 npk = ll_packets(nbytes);
  const u64 seq0 = st.seq;
  if (seq0 + npk > st.credit_cache + h.nslots) {
    st.credit_cache = ld_relaxed_u64(h.credit);
    if (seq0 + npk > st.credit_cache + h.nslots) return ll_write_st<WarpG>(h, st, src, nbytes);
  }
  const u32 lane = lane_id(), half = lane >> 4, sub = lane & 15u, lo = 8 * (sub - 1);
  const bool aligned = ((((u64)src) | nbytes) & 7u) == 0;  // uniform
  // Every load before the first store: the loads and stores are ordered asm, so loads interleaved with stores
  // would wait for one another, one memory latency a pair of packets.
  u64 v[kLLRound / 2];
  u32 nb[kLLRound / 2];
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    const u32 q = 2 * i + half;
    nb[i] = q < npk ? ll_few_bytes(q, npk, nbytes) : 0u;
    const bool data = sub != 0 && lo < nb[i];
    v[i] = 0;
    if (2 * i < npk) {  // uniform
      if (aligned) v[i] = ld_u64_if(data, src + q * kLLPayload + lo);
      else if (data) v[i] = src_gather8(src + q * kLLPayload, lo, nb[i]);
    }
  }
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    if (2 * i < npk) {  // uniform
      const u32 q = 2 * i + half;
      const bool mine = q < npk;
      const u64 seq = seq0 + q;
      const u32 flag = flag_of(seq);
      const bool data = sub != 0 && lo < nb[i];
      const u32 x = sub == 0 ? h.route : (u32)v[i], y = sub == 0 ? nb[i] : (u32)(v[i] >> 32);  // sub 0: the header
      const bool two = mine && (sub == 0 || lo + 4 < nb[i] || rewrites_all(seq, h.nslots));
      unsigned char* p = slot_of(h, seq) + 16 * sub;
      st_units2_if(two, p, unit(x, flag), unit(y, flag));
      st_unit_if(!two && data, p, unit(x, flag));
    }
  }
  st.seq = seq0 + npk;
  return true;
}

// A warp polls the ll_packets(need) packets of a few-packet message at (st.seq, offset 0) until all are there:
// each lane loads its 16 bytes of each of its packets in one round, and one vote says whether every polled unit
// has its packet's flag and every header the size the layout says (the last packet: at least the bytes needed).
// Returns the last packet's nbytes, the units left in r; kLLFallback when a header says bulk or another size
// (the general path takes the message); 0 when the wait failed (recorded).
__device__ __forceinline__ u32 ll_wait_few(const ChannelHandle& h, RecvState& st, u32 need, LLFew& r) {
  const u32 npk = ll_packets(need);
  const u32 lane = lane_id(), half = lane >> 4, sub = lane & 15u, lo = 8 * (sub - 1);
  const unsigned char* p[kLLRound / 2];
  u32 flag[kLLRound / 2], want[kLLRound / 2];
  bool poll[kLLRound / 2], second[kLLRound / 2], last[kLLRound / 2];
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    const u32 q = 2 * i + half;
    const bool mine = q < npk;
    want[i] = mine ? ll_few_bytes(q, npk, need) : 0u;
    last[i] = q + 1 == npk;
    flag[i] = flag_of(st.seq + q);
    poll[i] = mine && (sub == 0 || lo < want[i]);
    second[i] = sub == 0 || lo + 4 < want[i];
    // a lane that does not poll loads the first packet's header, a sector the warp loads anyway
    p[i] = poll[i] ? slot_of(h, st.seq + q) + 16 * sub : slot_of(h, st.seq);
    r.a[i] = 0;
    r.b[i] = 0;
  }
  LLPollWait wait;
  while (true) {
#pragma unroll
    for (u32 i = 0; i < kLLRound / 2; ++i)
      if (2 * i < npk) ld_units2(p[i], r.a[i], r.b[i]);  // uniform condition
    bool ok = true, wrong = false;
#pragma unroll
    for (u32 i = 0; i < kLLRound / 2; ++i) {
      if (2 * i < npk) {
        const u32 word = (u32)r.b[i];
        const bool fb = unit_flag(r.b[i]) == flag[i];
        // the header lane: the size this layout says (the last packet may hold more than the read takes)
        const bool size_ok = !(word & kKindBulk) && (last[i] ? word >= want[i] : word == want[i]);
        const bool unit_ok = sub == 0 ? fb && size_ok : (unit_flag(r.a[i]) == flag[i]) & (!second[i] | fb);
        ok &= !poll[i] | unit_ok;
        wrong |= poll[i] & (sub == 0) & fb & !size_ok;
      }
    }
    const u32 votes = __ballot_sync(0xffffffffu, ok);
    if (votes == 0xFFFFFFFFu) break;
    if (__any_sync(0xffffffffu, wrong)) return kLLFallback;
    if (!wait.failed_poll(h, st)) return 0;
  }
  u32 word = 0;  // the last packet's header word, on the header lane of its half
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i)
    if (last[i]) word = (u32)r.b[i];
  return (u32)__shfl_sync(0xffffffffu, word, ((npk - 1) & 1u) << 4);
}

// After ll_wait_few: the message's packets are consumed, the last one in part when the read took less than it holds
// (nb_last). Lane q hands back packet q's slot credit, all in one store.
__device__ __forceinline__ void ll_consume_few(const ChannelHandle& h, RecvState& st, u32 npk, u32 take_last,
                                               u32 nb_last) {
  const u32 lane = lane_id();
  const u32 whole = take_last == nb_last ? npk : npk - 1;
  st_relaxed_if(lane < whole, h.slot_credit + ((u32)(st.seq + lane) & (h.nslots - 1u)), flag_of(st.seq + lane));
  st.seq += whole;
  st.offset = take_last == nb_last ? 0u : take_last;
  if (st.seq - st.returned >= (h.nslots >> 1)) {  // uniform
    st_relaxed_u64_if(lane == 0, h.credit, st.seq);
    st.returned = st.seq;
  }
}

// A warp reads `need` (kLLPayload < need <= kLLRound * kLLPayload) bytes at a packet boundary into dst, each payload
// lane storing its 8 bytes of each of its packets at once where dst allows. Returns as ll_wait_few does.
__device__ __forceinline__ u32 ll_read_few(const ChannelHandle& h, RecvState& st, unsigned char* dst, u32 need) {
  LLFew r;
  const u32 nb_last = ll_wait_few(h, st, need, r);
  if (nb_last == 0 || nb_last == kLLFallback) return nb_last;
  const u32 npk = ll_packets(need);
  const u32 lane = lane_id(), half = lane >> 4, sub = lane & 15u, lo = 8 * (sub - 1);
  const bool aligned = ((((u64)dst) | need) & 7u) == 0;  // uniform
#pragma unroll
  for (u32 i = 0; i < kLLRound / 2; ++i) {
    if (2 * i < npk) {
      const u32 q = 2 * i + half;
      const u32 take = q < npk ? ll_few_bytes(q, npk, need) : 0u;
      const bool mine = sub != 0 && lo < take;
      const u64 v = (r.a[i] & 0xFFFFFFFFull) | (r.b[i] << 32);
      unsigned char* d = dst + q * kLLPayload + lo;
      if (aligned) st_u64_if(mine, d, v);
      else if (mine) dst_scatter8(d, v, take - lo < 8 ? take - lo : 8);
    }
  }
  ll_consume_few(h, st, npk, need - (npk - 1) * kLLPayload, nb_last);
  return nb_last;
}

// One warp reads up to `need` bytes of low-latency packets from (st.seq, st.offset): at least one
// packet's worth, polling rounds until the first packet is complete. Returns the bytes taken, 0 on
// failure (recorded), -1 when the next packet is a bulk packet (the caller's bulk path takes it).
__device__ __forceinline__ long long ll_read_warp(const ChannelHandle& h, RecvState& st, unsigned char* dst,
                                                  u64 need) {
  const u32 count = ll_round_count(h, st.offset, need);
  LLRound r;
  ll_poll(h, st.seq, count, r);
  if (r.complete == 0) {
    if (r.bulk_next) return -1;
    // The rare path: nothing yet. Hand back held credits before waiting (a writer may be blocked on
    // them), then poll rounds; the clock and the error record only every many rounds.
    if (lane_id() == 0 && st.seq != st.returned) st_relaxed_u64(h.credit, st.seq);
    st.returned = st.seq;
    WarpWait wait = WarpWait::start();
    do {
      if (!wait.keep_going(h, kErrDataTimeout, st.seq)) return 0;
      ll_poll(h, st.seq, count, r);
      if (r.complete == 0 && r.bulk_next) return -1;
    } while (r.complete == 0);
  }
  return (long long)ll_take_round(h, st, r, dst, need);
}

// One thread: the same, unit by unit (the scalar path; not the fast path).
__device__ long long ll_take_thread(const ChannelHandle& h, RecvState& st, unsigned char* dst, u64 need) {
  const u64 seq = st.seq;
  const u32 flag = flag_of(seq);
  const unsigned char* slot = slot_of(h, seq);
  u64 hd = ld_unit(slot + kUnitBytes);
  if (unit_flag(hd) != flag) {
    flush_credits(h, st);
    if (!wait_for(h, [&] { hd = ld_unit(slot + kUnitBytes); return unit_flag(hd) == flag; }, kErrDataTimeout, seq))
      return 0;
  }
  if ((u32)hd & kKindBulk) return -1;
  const u32 nb = (u32)hd, from = st.offset;
  const u32 take = (u32)((u64)(nb - from) < need ? nb - from : need);
  for (u32 u = 2 + from / 4; (u - 2) * 4 < from + take; ++u) {
    u64 v = 0;
    if (!wait_for(h, [&] { v = ld_unit(slot + u * kUnitBytes); return unit_flag(v) == flag; }, kErrDataTimeout, seq))
      return 0;
    const u32 lo = (u - 2) * 4, hi = lo + 4;
    const u32 a = lo > from ? lo : from, b = hi < from + take ? hi : from + take;
    scatter4(dst + (a - from), (u32)v, a - lo, b - lo);
  }
  st.offset = from + take;
  if (st.offset == nb) consumed(h, st);
  return take;
}

// ---- bulk packets ------------------------------------------------------------------------------
// Copy nvec 16-byte vectors from src to dst, every thread of a group of `step` (rank `me`): kDepth loads in
// flight before their stores (one at a time leaves the memory system idle while they wait). The grid forms,
// whose kernels do nothing else, take 8 (streaming through an L2 ring on one H200: 1,100 GB/s against 960 at
// 4); the warp and block forms, which share their kernel with the user's work, take 4 (half the registers).
enum : u32 { kCopyDepth = 4, kGridCopyDepth = 8 };
template <u32 kDepth, typename Load, typename Store>
__device__ __forceinline__ void copy_v4(unsigned char* dst, const unsigned char* src, u32 nvec, u32 me, u32 step,
                                        Load load, Store store) {
  u32 i = me;
  for (; i + (kDepth - 1) * step < nvec; i += kDepth * step) {
    U4 v[kDepth];
#pragma unroll
    for (u32 j = 0; j < kDepth; ++j) v[j] = load(src + 16ull * (i + j * step));
#pragma unroll
    for (u32 j = 0; j < kDepth; ++j) store(dst + 16ull * (i + j * step), v[j]);
  }
  for (; i < nvec; i += step) store(dst + 16ull * i, load(src + 16ull * i));
}
struct LoadCg {  // ring memory another rank writes: L2 only
  __device__ __forceinline__ U4 operator()(const unsigned char* p) const { return ld_cg_v4(p); }
};
struct LoadPlain {  // the caller's source buffer (global or shared memory: a generic load)
  __device__ __forceinline__ U4 operator()(const unsigned char* p) const { return *reinterpret_cast<const U4*>(p); }
};
struct StoreRing {  // ring memory (always global)
  __device__ __forceinline__ void operator()(unsigned char* p, U4 v) const { st_v4(p, v); }
};
struct StorePlain {  // the caller's destination (global or shared memory: a generic store, never st.global)
  __device__ __forceinline__ void operator()(unsigned char* p, U4 v) const { *reinterpret_cast<U4*>(p) = v; }
};
// Ring to ring (forwarding)
template <u32 kDepth>
__device__ __forceinline__ void copy_v4_cg(unsigned char* dst, const unsigned char* src, u32 nvec, u32 me, u32 step) {
  copy_v4<kDepth>(dst, src, nvec, me, step, LoadCg{}, StoreRing{});
}

// The group copies one packet's payload into the slot's bulk area with 16-byte stores, then its
// leader publishes the header after a release fence (the group barrier orders everyone's stores
// before the leader's fence).
template <typename G, u32 kDepth = kCopyDepth>
__device__ __forceinline__ void bulk_store_packet(const ChannelHandle& h, const unsigned char* src, u64 seq, u32 nb) {
  unsigned char* slot = slot_of(h, seq);
  unsigned char* payload = slot + kLLAreaBytes;
  const u32 nvec = (nb + 15) / 16;
  u32 i = G::rank();
  if ((((u64)src) & 15ull) == 0) {
    const u32 full = nb / 16;
    copy_v4<kDepth>(payload, src, full, G::rank(), G::size(), LoadPlain{}, StoreRing{});
    i = full + ((G::rank() + G::size() - full % G::size()) % G::size());  // this thread's first vector past them
  }
  for (; i < nvec; i += G::size()) st_v4(payload + 16ull * i, gather16(src, 16ull * i, nb));
  // Rewrite lap: the low-latency units of this slot get this packet's flag too (see flag_of()).
  if (rewrites_all(seq, h.nslots))
    for (u32 u = 2 + G::rank(); u < kLLUnits; u += G::size()) st_unit(slot + u * kUnitBytes, 0u, flag_of(seq));
  G::sync();
  if (G::rank() == 0) {
    fence_for(h);
    st_header(slot, h.route, flag_of(seq), nb | kKindBulk);
  }
}

// Copy payload bytes [from, to) of bulk packet seq to dst (every thread of the group).
template <typename G, u32 kDepth = kCopyDepth>
__device__ __forceinline__ void bulk_copy_out(const ChannelHandle& h, u64 seq, u32 from, u32 to, unsigned char* dst) {
  const unsigned char* payload = slot_of(h, seq) + kLLAreaBytes;
  const u32 n = to - from;
  if ((from & 15u) == 0 && (((u64)dst) & 15ull) == 0) {
    const u32 nvec = n / 16;
    copy_v4<kDepth>(dst, payload + from, nvec, G::rank(), G::size(), LoadCg{}, StorePlain{});
    for (u32 b = nvec * 16 + G::rank(); b < n; b += G::size()) dst[b] = ld_cg_u8(payload + from + b);
  } else {
    for (u32 b = G::rank(); b < n; b += G::size()) dst[b] = ld_cg_u8(payload + from + b);
  }
}

// Leader polls packet seq's header; returns its word 2 (nbytes | kind) to the whole group, after an
// acquire fence for a bulk packet (0 on failure). Before waiting, the leader hands back the credits it holds.
template <typename G>
__device__ __forceinline__ u32 wait_header(const ChannelHandle& h, RecvState& st) {
  u64 word = 0;
  if (G::rank() == 0) {
    const unsigned char* slot = slot_of(h, st.seq);
    const u32 flag = flag_of(st.seq);
    u64 hd = ld_unit(slot + kUnitBytes);
    if (unit_flag(hd) != flag) {
      flush_credits(h, st);
      if (!wait_for(h, [&] { hd = ld_unit(slot + kUnitBytes); return unit_flag(hd) == flag; }, kErrDataTimeout,
                    st.seq))
        hd = 0;
    }
    word = (u32)hd;
    if (word & kKindBulk) fence_for(h);  // acquire: the payload loads below follow the header
    if (word & kKindRdv) {  // a rendezvous message: only a grid read pulls it (its writer waits for the grid's ack)
      record_error(h, kErrMisuse, st.seq);
      word = 0;
    }
  }
  return (u32)G::bcast(word);
}

// ---- the stream: writes and reads of any size -----------------------------------------------------
template <typename G>
__device__ bool bulk_write_st(const ChannelHandle& h, SendState& st, const unsigned char* src, u64 nbytes) {
  for (u64 off = 0; off < nbytes; off += h.chunk) {
    const u32 nb = (u32)(nbytes - off < h.chunk ? nbytes - off : h.chunk);
    if (!credit_for<G>(h, st, st.seq)) return false;
    bulk_store_packet<G>(h, src + off, st.seq, nb);
    st.seq += 1;
  }
  return true;
}

// Every write call publishes everything it was given: up to ll_max bytes as low-latency packets,
// more as bulk packets.
template <typename G>
__device__ __forceinline__ bool write_st(const ChannelHandle& h, SendState& st, const unsigned char* src,
                                         u64 nbytes) {
  if (nbytes == 0) return true;
  if (G::size() == 32 && nbytes <= h.ll_max) {  // the latency paths: one packet, or a few
    if (nbytes <= kLLPayload) return ll_write_one(h, st, src, (u32)nbytes);
    if (nbytes <= kLLRound * kLLPayload) return ll_write_few(h, st, src, (u32)nbytes);
  }
  return nbytes <= h.ll_max ? ll_write_st<G>(h, st, src, nbytes) : bulk_write_st<G>(h, st, src, nbytes);
}

// Read nbytes of the stream, whatever packets carry them.
template <typename G>
__device__ bool read_st(const ChannelHandle& h, RecvState& st, unsigned char* dst, u64 nbytes) {
  if (G::size() == 32 && st.offset == 0 && nbytes - 1 < kLLPayload) {  // the latency path: one packet
    const u32 nb = ll_read_one(h, st, dst, (u32)nbytes);
    if (nb != kLLFallback) return nb != 0;
  } else if (G::size() == 32 && st.offset == 0 && nbytes <= kLLRound * kLLPayload && nbytes <= h.ll_max &&
             ll_packets(nbytes) <= h.nslots) {  // a few packets (ll_max: a writer sends bulk packets above it)
    const u32 nb = ll_read_few(h, st, dst, (u32)nbytes);
    if (nb != kLLFallback) return nb != 0;
  }
  u64 done = 0;
  while (done < nbytes) {
    const u64 need = nbytes - done;
    if (G::size() == 32) {  // a warp: low-latency rounds of several packets, which also detect bulk packets
      const long long got = ll_read_warp(h, st, dst + done, need);
      if (got > 0) { done += (u64)got; continue; }
      if (got == 0) return false;
    } else if (G::size() == 1) {
      const long long got = ll_take_thread(h, st, dst + done, need);
      if (got > 0) { done += (u64)got; continue; }
      if (got == 0) return false;
    }
    const u32 word = wait_header<G>(h, st);
    if (word == 0) return false;
    const u32 nb = word & kNbytesMask;
    if (!(word & kKindBulk)) {  // a block meets low-latency packets: its first warp takes them
      u64 got = 0;
      RecvState mine = st;
      if (G::rank() < 32) {
        const long long g = ll_read_warp(h, mine, dst + done, need);
        got = g > 0 ? (u64)g : 0;
      }
      got = G::bcast(got);
      if (got == 0) return false;
      // every warp takes warp 0's state (the block barrier in bcast ordered warp 0's update)
      st.seq = G::bcast(G::rank() == 0 ? mine.seq : 0);
      st.offset = (u32)G::bcast(G::rank() == 0 ? (u64)mine.offset : 0);
      st.returned = G::bcast(G::rank() == 0 ? mine.returned : 0);
      done += got;
      continue;
    }
    const u64 take = (nb - st.offset) < need ? (nb - st.offset) : need;
    bulk_copy_out<G>(h, st.seq, st.offset, (u32)(st.offset + take), dst + done);
    done += take;
    st.offset += (u32)take;
    G::sync();  // every copy is done before the slot is handed back
    if (st.offset == nb) {
      if (G::rank() == 0) consumed(h, st);
      else consumed_mirror(h, st);
    }
  }
  return true;
}

// Wait until packet seq's header is valid, without consuming it (a benchmark's "first word back").
__device__ __forceinline__ bool peek_packet(const ChannelHandle& h, u64 seq) {
  const unsigned char* slot = slot_of(h, seq);
  const u32 flag = flag_of(seq);
  return wait_for(h, [&] { return unit_flag(ld_unit(slot + kUnitBytes)) == flag; }, kErrDataTimeout, seq);
}

// The plain forms load the state, call the *_st form and store the state back (one thread stores it).
template <typename G>
__device__ bool write(const ChannelHandle& h, const unsigned char* src, u64 nbytes) {
  SendState st = load_send_state(h);
  const bool ok = write_st<G>(h, st, src, nbytes);
  G::sync();
  if (G::rank() == 0) save_send_state(h, st);
  G::sync();
  return ok;
}
template <typename G>
__device__ bool read(const ChannelHandle& h, unsigned char* dst, u64 nbytes) {
  RecvState st = load_recv_state(h);
  const bool ok = read_st<G>(h, st, dst, nbytes);
  G::sync();
  if (G::rank() == 0) {
    if (ok) flush_credits(h, st);  // a plain call may be the last: never keep a writer waiting
    save_recv_state(h, st);
  }
  G::sync();
  return ok;
}

// ---- forwarding straight from the ring ---------------------------------------------------------
// One warp moves nbytes of the stream from rx's ring into tx's ring packet by packet, without
// staging: low-latency packets are polled once and stored onward, re-flagged for tx, from the
// registers the poll loaded (one poll and one store per packet, up to kLLRound packets a round); bulk
// payload is copied slot to slot and published by a new header. (The pingpong's echo.)
__device__ bool forward_warp_st(const ChannelHandle& rx, RecvState& rs, const ChannelHandle& tx, SendState& ss,
                                u64 nbytes) {
  const u32 lane = lane_id(), half = lane >> 4, sub = lane & 15u;
  u64 done = 0;
  if (rs.offset != 0) {  // a packet split across calls cannot be forwarded whole
    if (lane == 0) record_error(rx, kErrMisuse, rs.seq);
    return false;
  }
  while (done < nbytes) {
    if (nbytes - done <= kLLPayload) {  // the latency path: one packet, polled once and stored onward
      u64 a, b;
      const u64 need = nbytes - done;
      const u32 nb = ll_wait_one(rx, rs, need, a, b);
      if (nb == 0) return false;
      if (nb == need) {
        if (!credit_for<WarpG>(tx, ss, ss.seq)) return false;
        const u32 oflag = flag_of(ss.seq), lo = 8 * (lane - 1);
        unsigned char* out = slot_of(tx, ss.seq) + 16 * lane;
        // every lane decides by predicate (no divergent branch on the echo's path); what a lane past the
        // polled units loaded is not data
        const u32 x = lane == 0 ? tx.route : (lo < nb ? (u32)a : 0u), y = lane == 0 ? nb : (lo + 4 < nb ? (u32)b : 0u);
        const bool two = lane < 16 && (lane == 0 || lo + 4 < nb || rewrites_all(ss.seq, tx.nslots));
        st_units2_if(two, out, unit(x, oflag), unit(y, oflag));
        st_unit_if(!two && lane != 0 && lo < nb, out, unit(x, oflag));
        ss.seq += 1;
        ll_consume_one(rx, rs, nb, nb);
        done += nb;
        continue;
      }
    } else if (nbytes - done <= kLLRound * kLLPayload && ll_packets(nbytes - done) <= rx.nslots) {
      // a few packets, polled in one round and stored onward from the registers, re-flagged for tx
      LLFew r;
      const u32 need = (u32)(nbytes - done), npk = ll_packets(need);
      const u32 nb_last = ll_wait_few(rx, rs, need, r);
      if (nb_last == 0) return false;
      if (nb_last == need - (npk - 1) * kLLPayload) {  // whole packets only (else the general path says misuse)
        if (!credit_for<WarpG>(tx, ss, ss.seq + npk - 1)) return false;
        const u32 lo = 8 * (sub - 1);
#pragma unroll
        for (u32 i = 0; i < kLLRound / 2; ++i) {
          if (2 * i < npk) {
            const u32 q = 2 * i + half;
            const bool mine = q < npk;
            const u32 nb = mine ? ll_few_bytes(q, npk, need) : 0u, oflag = flag_of(ss.seq + q);
            const u32 x = sub == 0 ? tx.route : (lo < nb ? (u32)r.a[i] : 0u);
            const u32 y = sub == 0 ? nb : (lo + 4 < nb ? (u32)r.b[i] : 0u);
            const bool two = mine && (sub == 0 || lo + 4 < nb || rewrites_all(ss.seq + q, tx.nslots));
            unsigned char* out = slot_of(tx, ss.seq + q) + 16 * sub;
            st_units2_if(two, out, unit(x, oflag), unit(y, oflag));
            st_unit_if(!two && mine && sub != 0 && lo < nb, out, unit(x, oflag));
          }
        }
        ss.seq += npk;
        ll_consume_few(rx, rs, npk, nb_last, nb_last);
        done += need;
        continue;
      }
    }
    const u32 count = ll_round_count(rx, 0, nbytes - done);
    LLRound r;
    ll_poll(rx, rs.seq, count, r);
    if (r.complete == 0 && !r.bulk_next) {
      if (lane == 0 && rs.seq != rs.returned) st_relaxed_u64(rx.credit, rs.seq);
      rs.returned = rs.seq;
      WarpWait wait = WarpWait::start();
      do {
        if (!wait.keep_going(rx, kErrDataTimeout, rs.seq)) return false;
        ll_poll(rx, rs.seq, count, r);
      } while (r.complete == 0 && !r.bulk_next);
    }
    if (r.complete > 0) {
      // the complete packets that belong to this call, whole
      u32 use = 0;
      u64 bytes = 0;
#pragma unroll
      for (u32 q = 0; q < kLLRound; ++q)
        if (q < r.complete && q == use && bytes + r.nb[q] <= nbytes - done) {
          bytes += r.nb[q];
          use = q + 1;
        }
      if (use == 0) {  // the next packet goes past this call's bytes: not forwarded whole
        if (lane == 0) record_error(rx, kErrMisuse, rs.seq);
        return false;
      }
      if (!credit_for<WarpG>(tx, ss, ss.seq + use - 1)) return false;
#pragma unroll
      for (u32 i = 0; i < kLLRound / 2; ++i) {
        const u32 q = 2 * i + half;
        if (q < use) {
          const u64 seq = ss.seq + q;
          const u32 nb = half ? r.nb[2 * i + 1] : r.nb[2 * i];
          const u32 oflag = flag_of(seq);
          unsigned char* out = slot_of(tx, seq) + 16 * sub;
          if (sub == 0) {
            st_header(out, tx.route, oflag, nb);
          } else {
            const u32 lo = 8 * (sub - 1);
            if (lo + 4 < nb || rewrites_all(seq, tx.nslots))
              st_units2(out, unit(lo < nb ? (u32)r.a[i] : 0u, oflag), unit(lo + 4 < nb ? (u32)r.b[i] : 0u, oflag));
            else if (lo < nb)
              st_unit(out, (u32)r.a[i], oflag);
          }
        }
      }
      if (lane == 0)
        for (u32 q = 0; q < use; ++q)
          st_relaxed(rx.slot_credit + ((u32)(rs.seq + q) & (rx.nslots - 1u)), flag_of(rs.seq + q));
      ss.seq += use;
      rs.seq += use;
      if (rs.seq - rs.returned >= (rx.nslots >> 1)) {
        if (lane == 0) st_relaxed_u64(rx.credit, rs.seq);
        rs.returned = rs.seq;
      }
      done += bytes;
      continue;
    }
    // a bulk packet: copy its payload slot to slot, then publish a new header
    const u32 word = wait_header<WarpG>(rx, rs);
    if (word == 0) return false;
    const u32 nb = word & kNbytesMask;
    if (nb > nbytes - done) {
      if (lane == 0) record_error(rx, kErrMisuse, rs.seq);
      return false;
    }
    if (!credit_for<WarpG>(tx, ss, ss.seq)) return false;
    unsigned char* out = slot_of(tx, ss.seq);
    copy_v4_cg<kCopyDepth>(out + kLLAreaBytes, slot_of(rx, rs.seq) + kLLAreaBytes, (nb + 15) / 16, lane, 32);
    if (rewrites_all(ss.seq, tx.nslots) && lane >= 2) st_unit(out + lane * kUnitBytes, 0u, flag_of(ss.seq));
    __syncwarp();
    if (lane == 0) {
      fence_for(tx);
      st_header(out, tx.route, flag_of(ss.seq), nb | kKindBulk);
      consumed(rx, rs);
    } else {
      consumed_mirror(rx, rs);
    }
    ss.seq += 1;
    done += nb;
  }
  return true;
}

// ---- grid forms (bulk packets) ---------------------------------------------------------------
// The warps of the grid share the packets of a call: warp w handles packets base + w, base + w + W,
// ... (W = warps in the grid), each waiting only for its own slot's credit. Warps, not blocks, so
// that one warp's release fence before its header overlaps the other warps' stores.
__device__ __forceinline__ u32 grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ u32 grid_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ u32 block_warps() { return BlockG::size() / 32; }
__device__ __forceinline__ u32 grid_warps() { return grid_blocks() * block_warps(); }
__device__ __forceinline__ u32 grid_warp() { return grid_block() * block_warps() + BlockG::rank() / 32; }

// Warp-level: the first packet number of this call (every warp reads it at entry).
__device__ __forceinline__ u64 grid_base(const ChannelHandle& h) {
  return WarpG::bcast(WarpG::rank() == 0 ? ld_relaxed_u64(h.state) : 0ull);
}

// One thread: wait until packet seq's slot is free, its previous occupant (seq - nslots) handed back by its
// per-slot credit (the grid forms' and the rendezvous' flow control).
__device__ __forceinline__ bool wait_slot_free(const ChannelHandle& h, u64 seq) {
  if (seq < h.nslots) return true;
  const unsigned int* credit = h.slot_credit + ((u32)seq & (h.nslots - 1u));
  const u32 want = flag_of(seq - h.nslots);
  return grid_wait(h, [&] { return ld_relaxed(credit) == want; }, kErrCreditTimeout, seq);
}

// Warp-level: send one bulk packet (seq) of a grid call, waiting for its slot's previous occupant to be consumed.
__device__ __forceinline__ bool grid_send_packet(const ChannelHandle& h, const unsigned char* src, u64 seq, u32 nb) {
  u64 okv = 1;
  if (WarpG::rank() == 0) okv = wait_slot_free(h, seq) ? 1 : 0;
  if (!WarpG::bcast(okv)) return false;
  bulk_store_packet<WarpG, kGridCopyDepth>(h, src, seq, nb);
  return true;
}

// Warp-level: receive one bulk packet (seq) of a grid call, which must carry `expect` bytes.
__device__ __forceinline__ bool grid_recv_packet(const ChannelHandle& h, unsigned char* dst, u64 seq, u32 expect) {
  u64 word = 0;
  if (WarpG::rank() == 0) {
    const unsigned char* slot = slot_of(h, seq);
    const u32 flag = flag_of(seq);
    u64 hd = 0;
    if (grid_wait(h, [&] { hd = ld_unit(slot + kUnitBytes); return unit_flag(hd) == flag; }, kErrDataTimeout, seq)) {
      word = (u32)hd;
      fence_for(h);
    }
  }
  word = WarpG::bcast(word);
  if (word == 0) return false;
  if (word != (expect | kKindBulk)) {
    if (WarpG::rank() == 0) record_error(h, kErrMisuse, seq);
    return false;
  }
  bulk_copy_out<WarpG, kGridCopyDepth>(h, seq, 0, expect, dst);
  __syncwarp();  // every lane's loads are done before the slot is handed back
  if (WarpG::rank() == 0) st_relaxed(h.slot_credit + ((u32)seq & (h.nslots - 1u)), flag_of(seq));
  return true;
}

// Warp-level: leave a grid call of `npk` packets from `base`; the last of the `nwarps` warps that
// served this end stores the state (and, on the receiving side, the in-order credit counter). Release
// before the arrival, acquire after the last one: every warp's loads of its slots are done before the
// counter hands the slots back.
__device__ __forceinline__ void grid_leave(const ChannelHandle& h, u64 base, u64 npk, bool receiver, u32 nwarps) {
  __syncwarp();
  if (WarpG::rank() == 0) {
    // SendState.departed is at byte 16, RecvState.departed at byte 12
    u32* departed = receiver ? reinterpret_cast<u32*>(h.state + 1) + 1 : reinterpret_cast<u32*>(h.state + 2);
    __threadfence();
    if (atomicAdd(departed, 1u) == nwarps - 1) {
      __threadfence();  // acquire: the other warps' arrivals and what they did before them
      *departed = 0;
      st_relaxed_u64(h.state, base + npk);
      if (receiver) {
        st_relaxed(reinterpret_cast<u32*>(h.state + 1), 0u);
        st_relaxed_u64(h.state + 2, base + npk);  // RecvState.returned
        st_relaxed_u64(h.credit, base + npk);
      }
      __threadfence_system();
    }
  }
  __syncwarp();
}

// Warp-level: pass bulk packet rseq of rx on to tx as packet sseq, slot to slot (no staging), once
// the tx slot's previous occupant is consumed; the rx slot is handed back after.
__device__ __forceinline__ bool grid_forward_packet(const ChannelHandle& rx, u64 rseq, const ChannelHandle& tx,
                                                    u64 sseq, u32 expect) {
  u64 word = 0;
  if (WarpG::rank() == 0) {
    const unsigned char* slot = slot_of(rx, rseq);
    const u32 flag = flag_of(rseq);
    u64 hd = 0;
    if (grid_wait(rx, [&] { hd = ld_unit(slot + kUnitBytes); return unit_flag(hd) == flag; }, kErrDataTimeout,
                  rseq)) {
      word = (u32)hd;
      fence_for(rx);
      if (word == (expect | kKindBulk) && !wait_slot_free(tx, sseq)) word = 0;
    }
  }
  word = WarpG::bcast(word);
  if (word == 0) return false;
  if (word != (expect | kKindBulk)) {
    if (WarpG::rank() == 0) record_error(rx, kErrMisuse, rseq);
    return false;
  }
  unsigned char* out = slot_of(tx, sseq);
  const u32 lane = lane_id();
  copy_v4_cg<kGridCopyDepth>(out + kLLAreaBytes, slot_of(rx, rseq) + kLLAreaBytes, (expect + 15) / 16, lane, 32);
  if (rewrites_all(sseq, tx.nslots) && lane >= 2) st_unit(out + lane * kUnitBytes, 0u, flag_of(sseq));
  __syncwarp();
  if (lane == 0) {
    fence_for(tx);
    st_header(out, tx.route, flag_of(sseq), expect | kKindBulk);
    st_relaxed(rx.slot_credit + ((u32)rseq & (rx.nslots - 1u)), flag_of(rseq));
  }
  return true;
}

// Payload bytes of packet p of a call of nbytes in packets of `chunk`.
__device__ __forceinline__ u32 packet_bytes(u64 nbytes, u64 p, u32 chunk) {
  const u64 off = p * chunk;
  return (u32)(nbytes - off < chunk ? nbytes - off : chunk);
}

__device__ bool grid_forward_from(const ChannelHandle& rx, u64 rbase, const ChannelHandle& tx, u64 sbase,
                                  u64 nbytes, u32 first, u32 step) {
  const u64 npk = (nbytes + rx.chunk - 1) / rx.chunk;
  bool ok = rx.chunk == tx.chunk;  // packets are passed on as they are
  if (!ok && WarpG::rank() == 0 && first == 0) record_error(rx, kErrMisuse, rbase);
  for (u64 p = first; ok && p < npk; p += step)
    ok = grid_forward_packet(rx, rbase + p, tx, sbase + p, packet_bytes(nbytes, p, rx.chunk));
  return ok;
}
__device__ bool grid_write_from(const ChannelHandle& h, u64 base, const unsigned char* src, u64 nbytes, u32 first,
                                u32 step) {
  const u64 npk = (nbytes + h.chunk - 1) / h.chunk;
  bool ok = true;
  for (u64 p = first; ok && p < npk; p += step)
    ok = grid_send_packet(h, src + p * h.chunk, base + p, packet_bytes(nbytes, p, h.chunk));
  return ok;
}
__device__ bool grid_read_from(const ChannelHandle& h, u64 base, unsigned char* dst, u64 nbytes, u32 first, u32 step) {
  const u64 npk = (nbytes + h.chunk - 1) / h.chunk;
  bool ok = true;
  for (u64 p = first; ok && p < npk; p += step)
    ok = grid_recv_packet(h, dst + p * h.chunk, base + p, packet_bytes(nbytes, p, h.chunk));
  return ok;
}

__device__ bool grid_forward(const ChannelHandle& rx, const ChannelHandle& tx, u64 nbytes) {
  const u64 rbase = grid_base(rx), sbase = grid_base(tx);
  const u64 npk = (nbytes + rx.chunk - 1) / rx.chunk;
  const bool ok = grid_forward_from(rx, rbase, tx, sbase, nbytes, grid_warp(), grid_warps());
  grid_leave(rx, rbase, npk, true, grid_warps());
  grid_leave(tx, sbase, npk, false, grid_warps());
  return ok;
}

// ---- rendezvous: a large grid message pulled straight from the writer's buffer ------------------------
// A ring costs a large message two copies (the writer's into the ring, the reader's out of it) on the same
// memory; NVSHMEM's put costs one. A channel opened with a window (a symmetric buffer) sends a grid write of
// at least rdv_min bytes whose source lies in the writer's window as one descriptor packet (a low-latency
// packet of kRdvBytes: the source's offset in the window, the size; header word kRdvBytes | kKindBulk |
// kKindRdv). Every warp of the reading group takes the descriptor, pulls its slice of the message from the
// window (mapped on the reader's GPU) into the destination and adds itself to the sender's `done` word (a
// release reduction: no answer to wait for, no last warp); every warp of the writing group waits until `done`
// shows the message finished before its call returns (the source may then be reused), and the writing group's
// first warp hands the slot back. Measured with scripts/dev/rdv_probe.py (one H200, 256 KiB, 49 blocks): when
// the last warp counted itself with an atomic and then stored the ack, 1.5 us passed between the last copy and
// the ack, and the reading warps could not leave before their atomic answered.
// Measured on one H200 (2 ranks under MPS, a hand-written form: scripts/dev/rdv_pingpong.cu): 16 MiB one-way
// 12.5 us, 256 MiB 194 us, against 16.0 and 310 for NVSHMEM's block put and 25.9 and 900 for the ring.
//
// The rendezvous' waits are made by every warp of a group at once, for one word: hundreds of warps. The group's
// first warp polls without pause; the others back off (__nanosleep, doubling up to kWaitBackoffNs) and read the
// host's abort word only every 16th check: without that, every warp's check read host memory every 256 polls and
// the reads queued behind each other for hundreds of microseconds (one H200, 2 x 264 warps: a 256 KiB one-way
// median of 700 us against a minimum of 4.3).
// A development hook: CIRCUSLINK_RDV_PROBE(event, seq) marks the phases of a rendezvous on the lane that
// reaches them (0 send entered, 1 descriptor posted, 2 finish seen; 3 peek entered, 4 header seen, 5 copy
// started, 6 copy done and counted). Empty unless a kernel defines it before including channel.cuh
// (scripts/dev/rdv_probe.py times one round trip's phases with it).
#ifndef CIRCUSLINK_RDV_PROBE
#define CIRCUSLINK_RDV_PROBE(event, seq)
#endif
// The rendezvous' waits, on one word by every warp of a group: the group's first warp polls without pause and
// reads the abort word at every check; the others back off and read it at every 16th.
template <typename Ready>
__device__ bool wait_many(const ChannelHandle& h, Ready ready, u32 code, u64 seq, bool leader) {
  return poll_until(h, ready, code, seq, leader, !leader);
}

__device__ __forceinline__ bool rdv_source(const ChannelHandle& h, const unsigned char* src, u64 nbytes) {
  const u64 off = (u64)src - (u64)h.window;
  return h.rdv_min != 0u && nbytes >= h.rdv_min && (u64)src >= (u64)h.window && off <= h.window_bytes &&
         nbytes <= h.window_bytes - off;
}
// The sender's control words of the rendezvous: `done` (+112) counts finished messages in units of kRdvDone:
// every reading warp adds 1 when its slice is in, the group's first adds kRdvDone - W more (W the group's
// warps), so a message adds exactly kRdvDone once all W have added and less before; done >> 20 is the number of
// finished messages. `posted` (+120) = (u32)(seq + 1) << 32 | r, stored by the writing group's first warp when
// it posts descriptor seq, the r-th rendezvous message of the channel: the other writing warps learn r from it.
enum : u32 { kRdvDoneShift = 20 };
constexpr u64 kRdvDone = 1ull << kRdvDoneShift;
__device__ __forceinline__ unsigned long long* rdv_word(const ChannelHandle& h, bool receiver, u32 which) {
  // receiver: the sender's words (its control block starts at h.credit); sender: its own (h.state is
  // control block + kCtrlSendState)
  unsigned char* ctrl = receiver ? reinterpret_cast<unsigned char*>(h.credit)
                                 : reinterpret_cast<unsigned char*>(h.state) - kCtrlSendState;
  return reinterpret_cast<unsigned long long*>(ctrl + kCtrlRdv) + which;
}
__device__ __forceinline__ void red_release_add_u64(const ChannelHandle& h, unsigned long long* p, u64 v) {
  if (h.flags & kHandleGpuScope) asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Warp-level, every warp of the writing group: the first (`post`) stores descriptor packet seq for nbytes at
// `off` in the window; each waits until the reader has pulled the whole message, so that when the call
// returns on a warp the source may be reused (as after any grid write, once the grid barrier that follows).
// The first warp then hands the descriptor's slot back itself: every reading warp added to `done` only after
// it took the descriptor, so none will look at the slot again.
__device__ bool rdv_send(const ChannelHandle& h, u64 seq, u64 off, u64 nbytes, bool post) {
  const u32 lane = lane_id();
  unsigned long long* done = rdv_word(h, false, 0);
  unsigned long long* posted = rdv_word(h, false, 1);
  u64 okv = 1;
  if (lane == 0) CIRCUSLINK_RDV_PROBE(0, seq);
  u32 r = 0;  // this message's number among the channel's rendezvous messages (from 1, mod 2^32)
  if (post) {
    if (lane == 0) okv = wait_slot_free(h, seq) ? 1 : 0;
    if (!WarpG::bcast(okv)) return false;
    // every earlier rendezvous message has finished (its first warp waited for it before returning), so
    // done >> 20 counts them all and no reader adds to it until the descriptor below is seen
    if (lane == 0) {
      r = (u32)(ld_relaxed_u64(done) >> kRdvDoneShift) + 1u;
      st_relaxed_u64(posted, (u64)(u32)(seq + 1) << 32 | r);
    }
    unsigned char* slot = slot_of(h, seq);
    // unit u of the packet from lane u: the header, the descriptor's four words, zeros past them on a rewrite lap
    const u32 words[6] = {h.route, kRdvBytes | kKindBulk | kKindRdv, (u32)off, (u32)(off >> 32), (u32)nbytes,
                          (u32)(nbytes >> 32)};
    u32 word = 0;
#pragma unroll
    for (u32 u = 0; u < 6; ++u) word = lane == u ? words[u] : word;
    if (lane < 6 || rewrites_all(seq, h.nslots)) st_unit(slot + lane * kUnitBytes, word, flag_of(seq));
    if (lane == 0) CIRCUSLINK_RDV_PROBE(1, seq);
  }
  if (lane == 0) {
    if (!post) {  // learn r from the first warp's `posted`; a later message posted means this one finished
      u64 seen = 0;
      okv = wait_many(h, [&] {
        seen = ld_relaxed_u64(posted);
        return (int)((u32)(seen >> 32) - (u32)(seq + 1)) >= 0;
      }, kErrCreditTimeout, seq, false) ? 1 : 0;
      r = (u32)(seen >> 32) == (u32)(seq + 1) ? (u32)seen : 0u;
    }
    if (okv && (post || r != 0u))
      okv = wait_many(h, [&] { return (int)((u32)(ld_relaxed_u64(done) >> kRdvDoneShift) - r) >= 0; },
                      kErrCreditTimeout, seq, post) ? 1 : 0;
    if (okv && post) st_relaxed(h.slot_credit + ((u32)seq & (h.nslots - 1u)), flag_of(seq));
    fence_for(h);  // acquire: the reader's loads of the window came before its adds
    CIRCUSLINK_RDV_PROBE(2, seq);
  }
  return WarpG::bcast(okv) != 0;
}

// Warp-level, every warp of the reading group (`first` of `step`): packet seq's word 2 (lane 0 waits for its
// header; 0 when the wait failed). Called before a grid read of a channel with a window decides its path. A slot
// that already holds a later packet (a flag nslots or more ahead) held a bulk packet of the ring, which the group's
// first warp took and handed back while this warp came late: then kKindBulk (a descriptor's slot is handed back
// only after every warp of the group took it). Lane 0 loads a descriptor's four units in the same round as the
// header (d), so a rendezvous costs no second round trip.
__device__ __forceinline__ u32 rdv_peek(const ChannelHandle& h, u64 seq, bool leader, u64 (&d)[4]) {
  u64 word = 0;
  if (lane_id() == 0) {
    CIRCUSLINK_RDV_PROBE(3, seq);
    const unsigned char* slot = slot_of(h, seq);
    const u32 flag = flag_of(seq);
    u64 hd = 0;
    // The header's flag against the awaited one, a signed distance: < 0 an earlier occupant (or a zeroed slot on
    // the first lap), > 0 a later one. Every warp loads units 0-5 in each poll, three 16-byte loads in one
    // round, so the descriptor comes with the header (loading its four units after the header took another
    // round; A/B with scripts/dev/rdv_ab.sh on one H200, 49 blocks: 256 KiB one-way 3.94 us against 4.08,
    // 1 MiB 4.91 against 5.19).
    if (wait_many(h, [&] {
          u64 u0;
          ld_units2(slot, u0, hd);
          ld_units2(slot + 2 * kUnitBytes, d[0], d[1]);
          ld_units2(slot + 4 * kUnitBytes, d[2], d[3]);
          return (int)(unit_flag(hd) - flag) >= 0;
        }, kErrDataTimeout, seq, leader))
      word = unit_flag(hd) == flag ? (u32)hd : kKindBulk;
    CIRCUSLINK_RDV_PROBE(4, seq);
  }
  return (u32)WarpG::bcast(word);
}

// The reading warps' slices are cut per team of kRdvTeam warps (an experiment switch; 1, a slice a warp, by
// default). On one H200 (scripts/dev/rdv_ab.sh, 49 blocks) teams of 8 took 16 MiB in 18.6 us against 20.4 but
// 256 MiB in 224 against 201: fewer streams of addresses help while the data sits in L2, more help from DRAM.
#ifndef CIRCUSLINK_RDV_TEAM
#define CIRCUSLINK_RDV_TEAM 1
#endif
enum : u32 { kRdvTeam = CIRCUSLINK_RDV_TEAM };
// Warp-level, every warp of the reading group: take descriptor seq, pull this warp's slice into dst, arrive.
__device__ bool rdv_recv(const ChannelHandle& h, u64 seq, unsigned char* dst, u64 nbytes, u32 first, u32 step,
                         u64 (&d)[4]) {
  const u32 lane = lane_id();
  u64 off = 0, n = 0;
  u64 okv = 1;
  if (lane == 0) {
    const unsigned char* slot = slot_of(h, seq);
    const u32 flag = flag_of(seq);
    const auto all = [&] {
      bool ready = true;
#pragma unroll
      for (u32 u = 0; u < 4; ++u) ready = ready && unit_flag(d[u]) == flag;
      return ready;
    };
    if (!all())  // the header's round saw units stored before the header (units are stored in any order)
      okv = wait_for(h, [&] {
        for (u32 u = 0; u < 4; ++u) d[u] = ld_unit(slot + (2 + u) * kUnitBytes);
        return all();
      }, kErrDataTimeout, seq) ? 1 : 0;
    off = (u64)(u32)d[0] | ((u64)(u32)d[1] << 32);
    n = (u64)(u32)d[2] | ((u64)(u32)d[3] << 32);
    if (okv && (n != nbytes || off > h.window_bytes || n > h.window_bytes - off || step >= kRdvDone)) {
      // read with another n, or a window of another size (or a group of 2^20 warps or more, which `done`
      // could not count)
      if (first == 0) record_error(h, kErrMisuse, seq);
      okv = 0;
    }
  }
  if (!WarpG::bcast(okv)) return false;
  off = WarpG::bcast(off);
  if (lane == 0) CIRCUSLINK_RDV_PROBE(5, seq);
  const unsigned char* src = h.window + off;
  // this warp's team's slice: whole 16-byte vectors where both ends allow them, else bytes. A team is
  // kRdvTeam consecutive warps of the group (the warps of a block in a whole-grid group) interleaved 512 bytes
  // apart, so that fewer streams of addresses run at once
  if (((((u64)src) | ((u64)dst) | nbytes) & 15ull) == 0) {
    const u32 teams = (step + kRdvTeam - 1) / kRdvTeam, team = first / kRdvTeam, member = first % kRdvTeam;
    const u32 members = step - team * kRdvTeam < kRdvTeam ? step - team * kRdvTeam : kRdvTeam;
    const u64 nvec = nbytes / 16, per = (nvec + teams - 1) / teams, lo = per * team;
    const u64 cnt = lo >= nvec ? 0 : (nvec - lo < per ? nvec - lo : per);
    copy_v4<kGridCopyDepth>(dst + 16 * lo, src + 16 * lo, (u32)cnt, member * 32 + lane, members * 32, LoadCg{},
                            StorePlain{});
  } else {
    const u64 per = (nbytes + step - 1) / step, lo = per * first;
    const u64 hi = lo + per < nbytes ? lo + per : nbytes;
    for (u64 b = lo + lane; b < hi; b += 32) dst[b] = ld_cg_u8(src + b);
  }
  __syncwarp();
  if (lane == 0) {
    CIRCUSLINK_RDV_PROBE(6, seq);
    // release: this warp's loads of the window (and its lanes', ordered by the __syncwarp) before the add; the
    // writer counts the adds, so no warp waits for an atomic's answer and none is last
    red_release_add_u64(h, rdv_word(h, true, 0), first == 0 ? 1ull + kRdvDone - step : 1ull);
  }
  __syncwarp();
  return true;
}

// One grid call of nbytes from packet `base`, by warp `first` of `step`: the packets it takes (1 for a
// rendezvous message); ok false when it failed.
__device__ u64 grid_write_call(const ChannelHandle& h, u64 base, const unsigned char* src, u64 nbytes, u32 first,
                               u32 step, bool& ok) {
  if (rdv_source(h, src, nbytes)) {
    ok = rdv_send(h, base, (u64)(src - h.window), nbytes, first == 0);
    return 1;
  }
  ok = grid_write_from(h, base, src, nbytes, first, step);
  return (nbytes + h.chunk - 1) / h.chunk;
}
__device__ u64 grid_read_call(const ChannelHandle& h, u64 base, unsigned char* dst, u64 nbytes, u32 first, u32 step,
                              bool& ok) {
  if (h.window != nullptr && h.rdv_min != 0u && nbytes >= h.rdv_min) {
    u64 d[4];
    const u32 word = rdv_peek(h, base, first == 0, d);
    if (word == 0) {
      ok = false;
      return 1;
    }
    if (word & kKindRdv) {
      ok = rdv_recv(h, base, dst, nbytes, first, step, d);
      return 1;
    }
  }
  ok = grid_read_from(h, base, dst, nbytes, first, step);
  return (nbytes + h.chunk - 1) / h.chunk;
}

__device__ bool grid_write(const ChannelHandle& h, const unsigned char* src, u64 nbytes) {
  const u64 base = grid_base(h);
  bool ok = true;
  const u64 npk = grid_write_call(h, base, src, nbytes, grid_warp(), grid_warps(), ok);
  grid_leave(h, base, npk, false, grid_warps());
  return ok;
}

__device__ __forceinline__ bool grid_read_starts_clean(const ChannelHandle& h, u64 base) {
  u64 okv = 1;
  if (WarpG::rank() == 0 && ld_relaxed(reinterpret_cast<const u32*>(h.state + 1)) != 0u) {
    record_error(h, kErrMisuse, base);  // a grid read must start at a packet boundary
    okv = 0;
  }
  return WarpG::bcast(okv) != 0;
}

__device__ bool grid_read(const ChannelHandle& h, unsigned char* dst, u64 nbytes) {
  const u64 base = grid_base(h);
  bool ok = grid_read_starts_clean(h, base);
  const u64 npk = ok ? grid_read_call(h, base, dst, nbytes, grid_warp(), grid_warps(), ok) : 0;
  grid_leave(h, base, npk, true, grid_warps());
  return ok;
}

// ---- grid sessions: streaming without a barrier per call ------------------------------------------
// Every warp of the group keeps the end's next packet number in a register and advances it by the
// packets of each call, so consecutive calls need no grid barrier: warp w takes packets w, w + W, ... of
// each call and waits only for its own slots. The group is the warps [first, first + count) of the grid
// (all of them, or a part: a pingpong's writing half and reading half). close() is called by every warp of
// the group once; the last one stores the state, as grid_leave does.
struct GridSession {
  u64 base;   // the next call's first packet
  u32 first;  // this warp's index within the group
  u32 step;   // warps in the group
};
__device__ __forceinline__ GridSession grid_session_open(const ChannelHandle& h, u32 warp_in_group, u32 warps) {
  return GridSession{grid_base(h), warp_in_group, warps};
}
__device__ __forceinline__ u64 grid_packets(const ChannelHandle& h, u64 nbytes) { return (nbytes + h.chunk - 1) / h.chunk; }

// The lowest active lane of the calling warp: where a group stores a state every member holds.
__device__ __forceinline__ bool lowest_active_lane() {
  return (__activemask() & ((1u << lane_id()) - 1u)) == 0u;
}

}  // namespace detail
}  // namespace circuslink
