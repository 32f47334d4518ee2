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
// after a release fence; the reader acquires the header, then copies). Readers read any mix.
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
// aligned 8-byte access atomic; a v4.u32 access would be four separate ones).
__device__ __forceinline__ void st_unit(void* p, u32 word, u32 flag) {
  const u64 v = (u64)word | ((u64)flag << 32);
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ld_unit(const void* p) {
  u64 v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// The header {route, flag} {nbytes | kind, flag} as two 8-byte halves in one instruction.
__device__ __forceinline__ void st_header(void* p, u32 route, u32 flag, u32 word) {
  const u64 lo = (u64)route | ((u64)flag << 32), hi = (u64)word | ((u64)flag << 32);
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}
// Release / acquire at system scope for bulk packets: the writer's payload stores (ordered before
// this thread by the group's barrier) become visible before the header; the reader's payload loads
// after it. Not the sequentially consistent fence (__threadfence_system), which costs far more.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

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

__device__ __forceinline__ unsigned char* slot_of(const ChannelHandle& h, u64 seq) {
  return h.ring + ((u32)seq & (h.nslots - 1u)) * h.slot_bytes;  // 32-bit arithmetic: rings stay < 4 GiB
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

// ---- errors ------------------------------------------------------------------------------------
__device__ __forceinline__ void record_error(const ChannelHandle& h, u32 code, u64 seq) {
  if (atomicCAS(h.error, 0u, code) == 0u) {
    st_relaxed(h.error + 1, h.channel_id);
    st_relaxed(h.error + 2, (u32)seq);
    st_relaxed(h.error + 3, (u32)(seq >> 32));
    __threadfence_system();  // the failure path: cost does not matter, visibility to the host does
  }
}
__device__ __forceinline__ bool has_error(const ChannelHandle& h) { return ld_relaxed(h.error) != 0u; }

// Poll until ready() holds. Gives up on the deadline or the host's abort, or at once when this end
// already failed (the error flag and the clock are read only after many failed polls).
template <typename Ready>
__device__ __noinline__ bool wait_slow(const ChannelHandle& h, Ready ready, u32 code, u64 seq) {
  if (has_error(h)) return false;
  Deadline d = Deadline::after(h.timeout_ns, h.abort);
  while (true) {
#pragma unroll 1
    for (int k = 0; k < 8; ++k)
      if (ready()) return true;
    if (d.expired()) {
      if (ready()) return true;
      record_error(h, d.aborted() ? kErrAborted : code, seq);
      return false;
    }
  }
}
template <typename Ready>
__device__ __forceinline__ bool wait_for(const ChannelHandle& h, Ready ready, u32 code, u64 seq) {
  return ready() || wait_slow(h, ready, code, seq);
}

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
// counter and the group agrees on the value it saw.
template <typename G>
__device__ __noinline__ bool credit_slow(const ChannelHandle& h, SendState& st, u64 seq) {
  u64 seen = st.credit_cache;
  if (G::rank() == 0) {
    const u64 nslots = h.nslots;
    unsigned long long* credit = h.credit;
    if (!wait_slow(h, [&] { seen = ld_relaxed_u64(credit); return seq < seen + nslots; }, kErrCreditTimeout, seq))
      seen = ~0ull;
  }
  seen = G::bcast(seen);
  if (seen == ~0ull) return false;
  st.credit_cache = seen;
  return true;
}
template <typename G>
__device__ __forceinline__ bool credit_for(const ChannelHandle& h, SendState& st, u64 seq) {
  return seq < st.credit_cache + h.nslots || credit_slow<G>(h, st, seq);
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

// ---- low-latency packets -----------------------------------------------------------------------
// One lane stores unit `u` of packet seq (payload src[0, nb)): header units 0 and 1, data units
// 2..31 below nb (all of them on a rewrite lap). One aligned 8-byte store; no fence.
__device__ __forceinline__ void ll_store_unit(const ChannelHandle& h, unsigned char* slot, u64 seq,
                                              const unsigned char* src, u32 nb, u32 u) {
  const u32 flag = flag_of(seq);
  if (u == 0) {
    st_unit(slot, h.route, flag);
  } else if (u == 1) {
    st_unit(slot + kUnitBytes, nb, flag);
  } else if ((u - 2) * 4 < nb || rewrites_all(seq, h.nslots)) {
    st_unit(slot + u * kUnitBytes, gather4(src, (u - 2) * 4, nb), flag);
  }
}

// Write nbytes as low-latency packets of <= 120 bytes: each warp of the group stores one packet per
// instruction (one unit per lane), so a block of W warps stores W packets at once. The state is the
// caller's (a session keeps it in registers across calls).
template <typename G>
__device__ bool ll_write_st(const ChannelHandle& h, SendState& st, const unsigned char* src, u64 nbytes) {
  const u64 npk = (nbytes + kLLPayload - 1) / kLLPayload;
  if (G::size() == 1) {  // one thread: the units of each packet in turn
    for (u64 p = 0; p < npk; ++p) {
      const u64 seq = st.seq + p, off = p * kLLPayload;
      if (!credit_for<G>(h, st, seq)) { st.seq += p; return false; }
      const u32 nb = (u32)(nbytes - off < kLLPayload ? nbytes - off : kLLPayload);
      unsigned char* slot = slot_of(h, seq);
      for (u32 u = 0; u < kLLUnits; ++u) ll_store_unit(h, slot, seq, src + off, nb, u);
    }
    st.seq += npk;
    return true;
  }
  const u64 warps = G::size() / 32, warp = G::rank() / 32;
  const u32 lane = lane_id();
  u64 p0 = 0;  // first packet of this round
  while (p0 < npk) {
    // Wait for the credit of the round's FIRST packet only, then write as many as the credits allow:
    // a reader whose read spans the last packet written and the next one holds the last one until the
    // next arrives, so waiting for a whole round's credits could wait on that reader for ever.
    if (!credit_for<G>(h, st, st.seq + p0)) { st.seq += p0; return false; }
    const u64 room = st.credit_cache + h.nslots - (st.seq + p0);
    u64 cnt = npk - p0 < warps ? npk - p0 : warps;
    cnt = cnt < room ? cnt : room;
    if (warp < cnt) {
      const u64 p = p0 + warp, off = p * kLLPayload;
      const u32 nb = (u32)(nbytes - off < kLLPayload ? nbytes - off : kLLPayload);
      ll_store_unit(h, slot_of(h, st.seq + p), st.seq + p, src + off, nb, lane);
    }
    p0 += cnt;
  }
  st.seq += npk;
  return true;
}

// One warp takes bytes [st.offset, st.offset + take) of low-latency packet st.seq into dst, where
// take <= need. Returns the bytes taken (0: failure; the error is recorded). The fast path: every
// lane polls only its own unit, one shuffle and one vote per round; a bulk packet (header kind)
// returns -1 for the caller's bulk path.
__device__ __forceinline__ long long ll_take_warp(const ChannelHandle& h, RecvState& st, unsigned char* dst,
                                                  u64 need) {
  const u32 lane = lane_id();
  const u64 seq = st.seq;
  const u32 flag = flag_of(seq);
  const unsigned char* slot = slot_of(h, seq);
  const u32 from = st.offset;
  const u64 want_end = from + need;
  const u32 want = (u32)(want_end < kLLPayload ? want_end : kLLPayload);  // bytes of this packet we could use
  // Lanes 1 (header) and the units covering [from, want) poll; the others stay idle.
  const bool polls = lane == 1 || (lane >= 2 && (lane - 2) * 4 < want && (lane - 2) * 4 + 4 > from);
  const unsigned char* unit = slot + lane * kUnitBytes;
  u64 v = 0;
  u32 hdr = 0xFFFFFFFFu;
  bool done = false, flushed = false;
  Deadline d = Deadline::after(0);
  bool timed = false;
  while (true) {
    if (polls) v = ld_unit(unit);
    const bool mine = (u32)(v >> 32) == flag;
    hdr = __shfl_sync(0xffffffffu, mine ? (u32)v : 0xFFFFFFFFu, 1);
    if (hdr != 0xFFFFFFFFu) {
      if (hdr & kKindBulk) return -1;
      const u32 end = hdr < want ? hdr : want;  // units past nbytes are not written: do not wait for them
      const bool needed = polls && lane >= 2 && (lane - 2) * 4 < end;
      done = __all_sync(0xffffffffu, !needed || mine);
      if (done) break;
    }
    // The rare path: nothing yet. Hand back held credits before waiting (a writer may be blocked on
    // them), then keep polling with a deadline; the clock and the error flag only every many polls.
    if (!flushed) {
      if (lane == 0) flush_credits(h, st);
      flushed = true;
    }
    if (!timed) {
      d = Deadline::after(h.timeout_ns, h.abort);
      timed = true;
      if (__any_sync(0xffffffffu, lane == 0 && has_error(h))) return 0;
    }
    if (__any_sync(0xffffffffu, lane == 0 && d.expired())) {
      if (lane == 0) record_error(h, d.aborted() ? kErrAborted : kErrDataTimeout, seq);
      return 0;
    }
  }
  const u32 nb = hdr;
  const u32 take = (u32)((u64)(nb - from) < need ? nb - from : need);
  if (lane >= 2) {
    const u32 lo = (lane - 2) * 4, hi = lo + 4;
    const u32 a = lo > from ? lo : from, b = hi < from + take ? hi : from + take;
    if (a < b) scatter4(dst + (a - from), (u32)v, a - lo, b - lo);
  }
  st.offset = from + take;
  if (st.offset == nb) {
    __syncwarp();
    if (lane == 0) {
      st_relaxed(h.slot_credit + ((u32)seq & (h.nslots - 1u)), flag_of(seq));
      if (seq + 1 - st.returned >= (h.nslots >> 1)) st_relaxed_u64(h.credit, seq + 1);
    }
    st.seq = seq + 1;
    st.offset = 0;
    if (st.seq - st.returned >= (h.nslots >> 1)) st.returned = st.seq;
  }
  return take;
}

// One thread: the same, unit by unit (the scalar path; not the fast path).
__device__ long long ll_take_thread(const ChannelHandle& h, RecvState& st, unsigned char* dst, u64 need) {
  const u64 seq = st.seq;
  const u32 flag = flag_of(seq);
  const unsigned char* slot = slot_of(h, seq);
  u64 hd = 0;
  if (!wait_for(h, [&] { hd = ld_unit(slot + kUnitBytes); return (u32)(hd >> 32) == flag; }, kErrDataTimeout,
                seq)) {
    return 0;
  }
  if ((u32)hd & kKindBulk) return -1;
  const u32 nb = (u32)hd, from = st.offset;
  const u32 take = (u32)((u64)(nb - from) < need ? nb - from : need);
  for (u32 u = 2 + from / 4; (u - 2) * 4 < from + take; ++u) {
    u64 v = 0;
    if (!wait_for(h, [&] { v = ld_unit(slot + u * kUnitBytes); return (u32)(v >> 32) == flag; }, kErrDataTimeout,
                  seq)) {
      return 0;
    }
    const u32 lo = (u - 2) * 4, hi = lo + 4;
    const u32 a = lo > from ? lo : from, b = hi < from + take ? hi : from + take;
    scatter4(dst + (a - from), (u32)v, a - lo, b - lo);
  }
  st.offset = from + take;
  if (st.offset == nb) consumed(h, st);
  return take;
}

// ---- bulk packets ------------------------------------------------------------------------------
// The group copies one packet's payload into the slot's bulk area with 16-byte stores, then its
// leader publishes the header after a release fence (the group barrier orders everyone's stores
// before the leader's fence).
template <typename G>
__device__ __forceinline__ void bulk_store_packet(const ChannelHandle& h, const unsigned char* src, u64 seq, u32 nb) {
  unsigned char* slot = slot_of(h, seq);
  unsigned char* payload = slot + kLLAreaBytes;
  const u32 nvec = (nb + 15) / 16;
  u32 i = G::rank();
  if ((((u64)src) & 15ull) == 0) {
    // Four loads in flight before their stores: one at a time leaves the link idle while they wait.
    const u32 full = nb / 16, step = G::size();
    for (; i + 3 * step < full; i += 4 * step) {
      const U4 a = *reinterpret_cast<const U4*>(src + 16ull * i);
      const U4 b = *reinterpret_cast<const U4*>(src + 16ull * (i + step));
      const U4 c = *reinterpret_cast<const U4*>(src + 16ull * (i + 2 * step));
      const U4 e = *reinterpret_cast<const U4*>(src + 16ull * (i + 3 * step));
      st_v4(payload + 16ull * i, a);
      st_v4(payload + 16ull * (i + step), b);
      st_v4(payload + 16ull * (i + 2 * step), c);
      st_v4(payload + 16ull * (i + 3 * step), e);
    }
  }
  for (; i < nvec; i += G::size()) st_v4(payload + 16ull * i, gather16(src, 16ull * i, nb));
  // Rewrite lap: the low-latency units of this slot get this packet's flag too (see flag_of()).
  if (rewrites_all(seq, h.nslots))
    for (u32 u = 2 + G::rank(); u < kLLUnits; u += G::size()) st_unit(slot + u * kUnitBytes, 0u, flag_of(seq));
  G::sync();
  if (G::rank() == 0) {
    fence_acq_rel_sys();
    st_header(slot, h.route, flag_of(seq), nb | kKindBulk);
  }
}

// Copy payload bytes [from, to) of bulk packet seq to dst (every thread of the group).
template <typename G>
__device__ __forceinline__ void bulk_copy_out(const ChannelHandle& h, u64 seq, u32 from, u32 to, unsigned char* dst) {
  const unsigned char* payload = slot_of(h, seq) + kLLAreaBytes;
  const u32 n = to - from;
  if ((from & 15u) == 0 && (((u64)dst) & 15ull) == 0) {
    const u32 nvec = n / 16, step = G::size();
    u32 i = G::rank();
    for (; i + 3 * step < nvec; i += 4 * step) {  // four loads in flight, as in bulk_store_packet
      const U4 a = ld_cg_v4(payload + from + 16ull * i);
      const U4 b = ld_cg_v4(payload + from + 16ull * (i + step));
      const U4 c = ld_cg_v4(payload + from + 16ull * (i + 2 * step));
      const U4 e = ld_cg_v4(payload + from + 16ull * (i + 3 * step));
      *reinterpret_cast<U4*>(dst + 16ull * i) = a;
      *reinterpret_cast<U4*>(dst + 16ull * (i + step)) = b;
      *reinterpret_cast<U4*>(dst + 16ull * (i + 2 * step)) = c;
      *reinterpret_cast<U4*>(dst + 16ull * (i + 3 * step)) = e;
    }
    for (; i < nvec; i += step) *reinterpret_cast<U4*>(dst + 16ull * i) = ld_cg_v4(payload + from + 16ull * i);
    for (u32 b = nvec * 16 + G::rank(); b < n; b += G::size()) dst[b] = ld_cg_u8(payload + from + b);
  } else {
    for (u32 b = G::rank(); b < n; b += G::size()) dst[b] = ld_cg_u8(payload + from + b);
  }
}

// Leader polls packet seq's header; returns its word 2 (nbytes | kind) to the whole group, after an
// acquire fence (0 on failure). Before waiting, the leader hands back the credits it holds.
template <typename G>
__device__ __forceinline__ u32 wait_header(const ChannelHandle& h, RecvState& st) {
  u64 word = 0;
  if (G::rank() == 0) {
    const unsigned char* slot = slot_of(h, st.seq);
    const u32 flag = flag_of(st.seq);
    u64 hd = ld_unit(slot + kUnitBytes);
    if ((u32)(hd >> 32) != flag) {
      flush_credits(h, st);
      if (!wait_slow(h, [&] { hd = ld_unit(slot + kUnitBytes); return (u32)(hd >> 32) == flag; }, kErrDataTimeout,
                     st.seq))
        hd = 0;
    }
    word = (u32)hd;
    if (word & kKindBulk) fence_acq_rel_sys();  // acquire: the payload loads below follow the header
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
  return nbytes <= h.ll_max ? ll_write_st<G>(h, st, src, nbytes) : bulk_write_st<G>(h, st, src, nbytes);
}

// Read nbytes of the stream, whatever packets carry them.
template <typename G>
__device__ bool read_st(const ChannelHandle& h, RecvState& st, unsigned char* dst, u64 nbytes) {
  u64 done = 0;
  while (done < nbytes) {
    const u64 need = nbytes - done;
    if (G::size() == 32) {  // a warp: the low-latency fast path, which also detects bulk packets
      const long long got = ll_take_warp(h, st, dst + done, need);
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
    if (!(word & kKindBulk)) {  // a block meets a low-latency packet: its first warp takes it
      u64 got = 0;
      if (G::rank() < 32) {
        const long long g = ll_take_warp(h, st, dst + done, need);
        got = g > 0 ? (u64)g : 0;
      }
      got = G::bcast(got);
      if (got == 0) return false;
      if (G::rank() >= 32) {  // the other warps follow warp 0's state
        st.offset += (u32)got;
        if (st.offset == nb) { st.seq += 1; st.offset = 0; }
      }
      done += got;
      continue;
    }
    const u64 take = (nb - st.offset) < need ? (nb - st.offset) : need;
    bulk_copy_out<G>(h, st.seq, st.offset, (u32)(st.offset + take), dst + done);
    done += take;
    st.offset += (u32)take;
    G::sync();  // every copy is done before the slot is handed back
    if (st.offset == nb) {
      if (G::rank() == 0) {
        consumed(h, st);
      } else {
        st.seq += 1;
        st.offset = 0;
        if (st.seq - st.returned >= (h.nslots >> 1)) st.returned = st.seq;
      }
    }
  }
  return true;
}

// Wait until packet seq's header is valid, without consuming it (a benchmark's "first word back").
__device__ __forceinline__ bool peek_packet(const ChannelHandle& h, u64 seq) {
  const unsigned char* slot = slot_of(h, seq);
  const u32 flag = flag_of(seq);
  return wait_for(h, [&] { return (u32)(ld_unit(slot + kUnitBytes) >> 32) == flag; }, kErrDataTimeout, seq);
}

// The plain forms load the state, call the *_st form and store the state back.
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
// staging: low-latency units are re-flagged for tx, bulk payload is copied slot to slot and
// published by a new header. (The pingpong's echo; the routing agents' hop.)
__device__ bool forward_warp_st(const ChannelHandle& rx, RecvState& rs, const ChannelHandle& tx, SendState& ss,
                                u64 nbytes) {
  const u32 lane = lane_id();
  u64 done = 0;
  while (done < nbytes) {
    const u32 word = wait_header<WarpG>(rx, rs);
    if (word == 0) return false;
    const u32 nb = word & kNbytesMask;
    if (rs.offset != 0 || nb > nbytes - done) {  // a packet split across calls: not forwarded whole
      if (lane == 0) record_error(rx, kErrMisuse, rs.seq);
      return false;
    }
    if (!credit_for<WarpG>(tx, ss, ss.seq)) return false;
    unsigned char* out = slot_of(tx, ss.seq);
    const unsigned char* in = slot_of(rx, rs.seq);
    if (word & kKindBulk) {
      for (u32 i = lane; i < (nb + 15) / 16; i += 32)
        st_v4(out + kLLAreaBytes + 16ull * i, ld_cg_v4(in + kLLAreaBytes + 16ull * i));
      if (rewrites_all(ss.seq, tx.nslots) && lane >= 2) st_unit(out + lane * kUnitBytes, 0u, flag_of(ss.seq));
      __syncwarp();
      if (lane == 0) {
        fence_acq_rel_sys();
        st_header(out, tx.route, flag_of(ss.seq), nb | kKindBulk);
      }
    } else {
      const u32 flag = flag_of(rs.seq);
      const bool mine = lane >= 2 && (lane - 2) * 4 < nb;
      u64 v = 0;
      const bool arrived = !mine || wait_for(rx, [&] { v = ld_unit(in + lane * kUnitBytes);
                                                      return (u32)(v >> 32) == flag; }, kErrDataTimeout, rs.seq);
      if (!__all_sync(0xffffffffu, arrived)) return false;
      const u32 oflag = flag_of(ss.seq);
      if (lane == 0) st_unit(out, tx.route, oflag);
      else if (lane == 1) st_unit(out + kUnitBytes, nb, oflag);
      else if (mine || rewrites_all(ss.seq, tx.nslots)) st_unit(out + lane * kUnitBytes, mine ? (u32)v : 0u, oflag);
    }
    __syncwarp();
    ss.seq += 1;
    if (lane == 0) consumed(rx, rs);
    else {
      rs.seq += 1;
      rs.offset = 0;
      if (rs.seq - rs.returned >= (rx.nslots >> 1)) rs.returned = rs.seq;
    }
    done += nb;
  }
  return true;
}

// ---- grid forms (bulk packets) ---------------------------------------------------------------
// The warps of the grid share the packets of a call: warp w handles packets base + w, base + w + W,
// ... (W = warps in the grid), each waiting only for its own slot's credit. Warps, not blocks, so
// that one warp's release fence before its header overlaps the other warps' stores. The last warp
// to leave stores the new state.
__device__ __forceinline__ u32 grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ u32 grid_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ u32 block_warps() { return BlockG::size() / 32; }
__device__ __forceinline__ u32 grid_warps() { return grid_blocks() * block_warps(); }
__device__ __forceinline__ u32 grid_warp() { return grid_block() * block_warps() + BlockG::rank() / 32; }

// Warp-level: the first packet number of this call (every warp reads it at entry).
__device__ __forceinline__ u64 grid_base(const ChannelHandle& h) {
  return WarpG::bcast(WarpG::rank() == 0 ? ld_relaxed_u64(h.state) : 0ull);
}

// Warp-level: send one bulk packet (seq) of a grid call, waiting for its slot's previous occupant to be consumed.
__device__ __forceinline__ bool grid_send_packet(const ChannelHandle& h, const unsigned char* src, u64 seq, u32 nb) {
  u64 okv = 1;
  if (WarpG::rank() == 0 && seq >= h.nslots) {
    unsigned int* credit = h.slot_credit + ((u32)seq & (h.nslots - 1u));
    const u32 want = flag_of(seq - h.nslots);
    okv = wait_for(h, [&] { return ld_relaxed(credit) == want; }, kErrCreditTimeout, seq) ? 1 : 0;
  }
  if (!WarpG::bcast(okv)) return false;
  bulk_store_packet<WarpG>(h, src, seq, nb);
  return true;
}

// Warp-level: receive one bulk packet (seq) of a grid call, which must carry `expect` bytes.
__device__ __forceinline__ bool grid_recv_packet(const ChannelHandle& h, unsigned char* dst, u64 seq, u32 expect) {
  u64 word = 0;
  if (WarpG::rank() == 0) {
    const unsigned char* slot = slot_of(h, seq);
    const u32 flag = flag_of(seq);
    u64 hd = 0;
    if (wait_for(h, [&] { hd = ld_unit(slot + kUnitBytes); return (u32)(hd >> 32) == flag; }, kErrDataTimeout,
                 seq)) {
      word = (u32)hd;
      fence_acq_rel_sys();
    }
  }
  word = WarpG::bcast(word);
  if (word == 0) return false;
  if (word != (expect | kKindBulk)) {
    if (WarpG::rank() == 0) record_error(h, kErrMisuse, seq);
    return false;
  }
  bulk_copy_out<WarpG>(h, seq, 0, expect, dst);
  __syncwarp();  // every lane's loads are done before the slot is handed back
  if (WarpG::rank() == 0) st_relaxed(h.slot_credit + ((u32)seq & (h.nslots - 1u)), flag_of(seq));
  return true;
}

// Warp-level: leave a grid call of `npk` packets from `base`; the last of the `nwarps` warps that
// served this end stores the state (and, on the receiving side, the in-order credit counter).
__device__ __forceinline__ void grid_leave(const ChannelHandle& h, u64 base, u64 npk, bool receiver, u32 nwarps) {
  __syncwarp();
  if (WarpG::rank() == 0) {
    __threadfence();
    // SendState.departed is at byte 16, RecvState.departed at byte 12
    u32* departed = receiver ? reinterpret_cast<u32*>(h.state + 1) + 1 : reinterpret_cast<u32*>(h.state + 2);
    if (atomicAdd(departed, 1u) == nwarps - 1) {
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
    if (wait_for(rx, [&] { hd = ld_unit(slot + kUnitBytes); return (u32)(hd >> 32) == flag; }, kErrDataTimeout,
                 rseq)) {
      word = (u32)hd;
      fence_acq_rel_sys();
      if (word == (expect | kKindBulk) && sseq >= tx.nslots) {
        unsigned int* credit = tx.slot_credit + ((u32)sseq & (tx.nslots - 1u));
        const u32 want = flag_of(sseq - tx.nslots);
        if (!wait_for(tx, [&] { return ld_relaxed(credit) == want; }, kErrCreditTimeout, sseq)) word = 0;
      }
    }
  }
  word = WarpG::bcast(word);
  if (word == 0) return false;
  if (word != (expect | kKindBulk)) {
    if (WarpG::rank() == 0) record_error(rx, kErrMisuse, rseq);
    return false;
  }
  const unsigned char* in = slot_of(rx, rseq) + kLLAreaBytes;
  unsigned char* out = slot_of(tx, sseq);
  const u32 lane = lane_id(), nvec = (expect + 15) / 16;
  u32 i = lane;
  for (; i + 96 < nvec; i += 128) {  // four loads in flight
    const U4 a = ld_cg_v4(in + 16ull * i), b = ld_cg_v4(in + 16ull * (i + 32));
    const U4 c = ld_cg_v4(in + 16ull * (i + 64)), e = ld_cg_v4(in + 16ull * (i + 96));
    st_v4(out + kLLAreaBytes + 16ull * i, a);
    st_v4(out + kLLAreaBytes + 16ull * (i + 32), b);
    st_v4(out + kLLAreaBytes + 16ull * (i + 64), c);
    st_v4(out + kLLAreaBytes + 16ull * (i + 96), e);
  }
  for (; i < nvec; i += 32) st_v4(out + kLLAreaBytes + 16ull * i, ld_cg_v4(in + 16ull * i));
  if (rewrites_all(sseq, tx.nslots) && lane >= 2) st_unit(out + lane * kUnitBytes, 0u, flag_of(sseq));
  __syncwarp();
  if (lane == 0) {
    fence_acq_rel_sys();
    st_header(out, tx.route, flag_of(sseq), expect | kKindBulk);
    st_relaxed(rx.slot_credit + ((u32)rseq & (rx.nslots - 1u)), flag_of(rseq));
  }
  return true;
}

__device__ bool grid_forward(const ChannelHandle& rx, const ChannelHandle& tx, u64 nbytes) {
  const u64 rbase = grid_base(rx), sbase = grid_base(tx);
  const u64 npk = (nbytes + rx.chunk - 1) / rx.chunk;
  bool ok = rx.chunk == tx.chunk;  // packets are passed on as they are
  if (!ok && WarpG::rank() == 0 && grid_warp() == 0) record_error(rx, kErrMisuse, rbase);
  for (u64 p = grid_warp(); ok && p < npk; p += grid_warps()) {
    const u64 off = p * rx.chunk;
    ok = grid_forward_packet(rx, rbase + p, tx, sbase + p, (u32)(nbytes - off < rx.chunk ? nbytes - off : rx.chunk));
  }
  grid_leave(rx, rbase, npk, true, grid_warps());
  grid_leave(tx, sbase, npk, false, grid_warps());
  return ok;
}

__device__ bool grid_write(const ChannelHandle& h, const unsigned char* src, u64 nbytes) {
  const u64 base = grid_base(h);
  const u64 npk = (nbytes + h.chunk - 1) / h.chunk;
  bool ok = true;
  for (u64 p = grid_warp(); ok && p < npk; p += grid_warps()) {
    const u64 off = p * h.chunk;
    const u32 nb = (u32)(nbytes - off < h.chunk ? nbytes - off : h.chunk);
    ok = grid_send_packet(h, src + off, base + p, nb);
  }
  grid_leave(h, base, npk, false, grid_warps());
  return ok;
}

__device__ bool grid_read(const ChannelHandle& h, unsigned char* dst, u64 nbytes) {
  const u64 base = grid_base(h);
  const u64 npk = (nbytes + h.chunk - 1) / h.chunk;
  u64 okv = 1;
  if (WarpG::rank() == 0 && ld_relaxed(reinterpret_cast<const u32*>(h.state + 1)) != 0u) {
    record_error(h, kErrMisuse, base);  // a grid read must start at a packet boundary
    okv = 0;
  }
  bool ok = WarpG::bcast(okv) != 0;
  for (u64 p = grid_warp(); ok && p < npk; p += grid_warps()) {
    const u64 off = p * h.chunk;
    const u32 nb = (u32)(nbytes - off < h.chunk ? nbytes - off : h.chunk);
    ok = grid_recv_packet(h, dst + off, base + p, nb);
  }
  grid_leave(h, base, npk, true, grid_warps());
  return ok;
}

}  // namespace detail
}  // namespace circuslink
