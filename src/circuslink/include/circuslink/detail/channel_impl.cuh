// circuslink/detail/channel_impl.cuh - the device implementation of docs/protocol.md.
//
// Everything works on bytes: Sender<T> / Receiver<T> turn element counts into byte counts.
// Groups: ThreadG (one thread), WarpG (a full, converged warp), BlockG (every thread of the
// block). Every wait polls with a deadline (%globaltimer); on expiry it records an error in the
// end's error record and the call returns false on every thread of the group.
#pragma once

#include "channel_types.cuh"
#include "sync.cuh"

namespace circuslink {
namespace detail {

// ---- groups ----------------------------------------------------------------------------------
struct ThreadG {
  __device__ static unsigned int size() { return 1; }
  __device__ static unsigned int rank() { return 0; }
  __device__ static void sync() {}
  __device__ static unsigned long long bcast(unsigned long long v) { return v; }
};

struct WarpG {
  __device__ static unsigned int size() { return 32; }
  __device__ static unsigned int rank() { return lane_id(); }
  __device__ static void sync() { __syncwarp(); }
  // the value of lane 0
  __device__ static unsigned long long bcast(unsigned long long v) {
    v = __shfl_sync(0xffffffffu, v, 0);
    __syncwarp();  // shfl alone orders no memory: lane 0's acquire must cover the others' loads
    return v;
  }
};

struct BlockG {
  __device__ static unsigned int size() { return block_threads(); }
  __device__ static unsigned int rank() { return block_thread(); }
  __device__ static void sync() { __syncthreads(); }
  // the value of thread 0
  __device__ static unsigned long long bcast(unsigned long long v) {
    __shared__ unsigned long long slot;
    __syncthreads();
    if (rank() == 0) slot = v;
    __syncthreads();
    return slot;
  }
};

// ---- memory operations -----------------------------------------------------------------------
struct U4 {
  unsigned int x, y, z, w;
};

// A 16-byte line {word, flag, word, flag} as two 8-byte halves. The PTX memory model makes a vector
// access one access per element, so only each element is single-copy atomic: with v2.u64 every
// {word, flag} pair is stored and loaded whole (with v4.u32 a reader could see a pair's new flag
// beside its old word).
__device__ __forceinline__ void st_volatile_v4(void* p, U4 v) {
  const unsigned long long lo = (unsigned long long)v.x | ((unsigned long long)v.y << 32);
  const unsigned long long hi = (unsigned long long)v.z | ((unsigned long long)v.w << 32);
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}
__device__ __forceinline__ U4 ld_volatile_v4(const void* p) {
  unsigned long long lo, hi;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
  return U4{(unsigned int)lo, (unsigned int)(lo >> 32), (unsigned int)hi, (unsigned int)(hi >> 32)};
}
__device__ __forceinline__ void st_v4(void* p, U4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// L2-only load: a previous lap of the ring must not be served from L1.
__device__ __forceinline__ U4 ld_cg_v4(const void* p) {
  U4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// One byte, L2-only (the byte path and vector tails of bw_copy_out: a plain load may hit a stale L1
// line of the slot's previous lap within the same launch).
__device__ __forceinline__ unsigned char ld_cg_u8(const unsigned char* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return (unsigned char)v;
}

// Packet seq's flag: never 0 (a zeroed ring never looks written) and different from the flag of the
// slot's previous occupants back to 2^32 packets (seq and seq - k * nslots, nslots even, agree in bit
// 0). What stays equal after 2^32 packets is covered by ll_rewrites_all(): every line of every slot is
// rewritten at least every 2^31 packets, so no line that old survives.
__device__ __forceinline__ unsigned int flag_of(unsigned long long seq) { return (unsigned int)seq | 1u; }

// LL packets of the first lap after every multiple of 2^31 write all 15 data lines (zeros past
// nbytes), not only those below nbytes: see flag_of().
__device__ __forceinline__ bool ll_rewrites_all(unsigned long long seq, unsigned int nslots) {
  return (seq & 0x7FFFFFFFull) < nslots;
}

// 8 bytes of src[pos..) as two words, zero past `end` (the stream is little-endian bytes).
__device__ __forceinline__ void gather8(const unsigned char* src, unsigned long long pos, unsigned long long end,
                                        unsigned int& lo, unsigned int& hi) {
  const unsigned char* p = src + pos;
  if (pos + 8 <= end && (((unsigned long long)p) & 7ull) == 0) {
    unsigned long long v = *reinterpret_cast<const unsigned long long*>(p);
    lo = (unsigned int)v;
    hi = (unsigned int)(v >> 32);
    return;
  }
  unsigned long long v = 0;
  for (int b = 0; b < 8; ++b)
    if (pos + b < end) v |= (unsigned long long)p[b] << (8 * b);
  lo = (unsigned int)v;
  hi = (unsigned int)(v >> 32);
}

// 16 bytes of src[pos..) as a vector, zero past `end`.
__device__ __forceinline__ U4 gather16(const unsigned char* src, unsigned long long pos, unsigned long long end) {
  const unsigned char* p = src + pos;
  if (pos + 16 <= end && (((unsigned long long)p) & 15ull) == 0) return *reinterpret_cast<const U4*>(p);
  U4 v;
  gather8(src, pos, end, v.x, v.y);
  gather8(src, pos + 8, end, v.z, v.w);
  return v;
}

// Store bytes [from, to) of the 8-byte little-endian value (lo, hi) at dst.
__device__ __forceinline__ void scatter8(unsigned char* dst, unsigned int lo, unsigned int hi, unsigned int from,
                                         unsigned int to) {
  unsigned long long v = (unsigned long long)lo | ((unsigned long long)hi << 32);
  if (from == 0 && to == 8 && (((unsigned long long)dst) & 7ull) == 0) {
    *reinterpret_cast<unsigned long long*>(dst) = v;
    return;
  }
  for (unsigned int b = from; b < to; ++b) dst[b - from] = (unsigned char)(v >> (8 * b));
}

// ---- errors ------------------------------------------------------------------------------------
__device__ __forceinline__ void record_error(const ChannelHandle& h, unsigned int code, unsigned long long seq) {
  if (atomicCAS(h.error, 0u, code) == 0u) {
    st_relaxed(h.error + 1, h.channel_id);
    st_relaxed(h.error + 2, (unsigned int)seq);
    st_relaxed(h.error + 3, (unsigned int)(seq >> 32));
    __threadfence_system();
  }
}
__device__ __forceinline__ bool has_error(const ChannelHandle& h) { return ld_relaxed(h.error) != 0u; }

// Poll until ready() holds. Gives up on the deadline, or at once when this end already failed.
template <typename Ready>
__device__ __forceinline__ bool wait_for(const ChannelHandle& h, Ready ready, unsigned int code,
                                         unsigned long long seq) {
  if (ready()) return true;
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

// ---- sender: credits -----------------------------------------------------------------------
// Leader only: make sure packet `seq` may be written (seq < consumed + nslots).
__device__ __forceinline__ bool credit_for(const ChannelHandle& h, SendState& st, unsigned long long seq) {
  if (seq < st.credit_cache + h.nslots) return true;
  unsigned long long* credit = h.credit;
  const unsigned long long nslots = h.nslots;
  unsigned long long seen = st.credit_cache;
  bool ok = wait_for(
      h, [&] { seen = ld_relaxed_u64(credit); return seq < seen + nslots; }, kErrCreditTimeout, seq);
  st.credit_cache = seen;
  return ok;
}

// Leader only: wait for the credit of packet `seq` ALONE, then return how many of the `want`
// packets from `seq` may be written now (1 .. want; 0 on time-out). A batch must never wait for
// the credits of its later packets: a reader whose read spans the last packet written and the next
// one keeps the last one (and its credit) until the next one arrives, so a writer waiting for the
// whole batch's credits (up to nslots packets) and that reader would wait on each other forever.
__device__ __forceinline__ unsigned long long credits_from(const ChannelHandle& h, SendState& st,
                                                           unsigned long long seq, unsigned long long want) {
  const unsigned long long nslots = h.nslots;
  // The cache covers the first packet but not the batch: one fresh look (no wait) may cover it all.
  if (seq + want > st.credit_cache + nslots && seq < st.credit_cache + nslots)
    st.credit_cache = ld_relaxed_u64(h.credit);
  if (!credit_for(h, st, seq)) return 0;
  const unsigned long long room = st.credit_cache + nslots - seq;
  return room < want ? room : want;
}

__device__ __forceinline__ SendState load_send_state(const ChannelHandle& h) {
  SendState s;
  s.seq = ld_relaxed_u64(h.state);
  s.credit_cache = ld_relaxed_u64(h.state + 1);
  return s;
}
__device__ __forceinline__ void save_send_state(const ChannelHandle& h, const SendState& s) {
  st_relaxed_u64(h.state, s.seq);
  st_relaxed_u64(h.state + 1, s.credit_cache);
}
__device__ __forceinline__ RecvState load_recv_state(const ChannelHandle& h) {
  RecvState s;
  s.seq = ld_relaxed_u64(h.state);
  s.offset = ld_relaxed(reinterpret_cast<const unsigned int*>(h.state + 1));
  s.returned = ld_relaxed_u64(h.state + 2);
  return s;
}
__device__ __forceinline__ void save_recv_state(const ChannelHandle& h, const RecvState& s) {
  st_relaxed_u64(h.state, s.seq);
  st_relaxed(reinterpret_cast<unsigned int*>(h.state + 1), s.offset);
  st_relaxed_u64(h.state + 2, s.returned);
}

// Receiver: hand consumed packets back to the writer (a posted store into its memory).
__device__ __forceinline__ void return_credits(const ChannelHandle& h, RecvState& st) {
  if (st.seq != st.returned) {
    st_relaxed_u64(h.credit, st.seq);
    st.returned = st.seq;
  }
}

// ---- low-latency mode ------------------------------------------------------------------------
// Write nbytes as packets of <= 120 bytes; the group stores 16 lines per packet, one 16-byte
// volatile store per line, flags in every line (no fence).
// The *_st forms work on a state the caller holds (in registers across calls, as the pingpong
// benchmark does to keep two dependent loads off the latency path); the plain forms load the
// state from memory and store it back.
template <typename G>
__device__ bool ll_write_st(const ChannelHandle& h, SendState& st, const unsigned char* src,
                            unsigned long long nbytes) {
  if (nbytes == 0) return true;
  const unsigned long long npk = (nbytes + kLLPayload - 1) / kLLPayload;
  // packets per iteration: 16 lanes each, and never more than the ring holds
  unsigned int per_iter = G::size() >= 16 ? G::size() / 16 : 1;
  if (per_iter > h.nslots) per_iter = h.nslots;
  const unsigned long long mask = h.nslots - 1;
  bool ok = true;
  unsigned long long base = 0;  // packets stored (all of them unless a credit wait failed)
  while (base < npk) {
    // as many packets as the group covers AND the credits allow: waiting for a whole batch's credits
    // deadlocks against a reader holding the last packet (credits_from explains)
    unsigned long long cnt = 0;
    if (G::rank() == 0) cnt = credits_from(h, st, st.seq + base, npk - base < per_iter ? npk - base : per_iter);
    cnt = G::bcast(cnt);
    if (cnt == 0) { ok = false; break; }
    const unsigned int items = (unsigned int)cnt * 16;
    for (unsigned int it = G::rank(); it < items; it += G::size()) {
      const unsigned long long p = base + it / 16;
      const unsigned int line = it % 16;
      const unsigned long long seq = st.seq + p;
      const unsigned long long off = p * kLLPayload;
      const unsigned int nb = (unsigned int)(nbytes - off < kLLPayload ? nbytes - off : kLLPayload);
      unsigned char* slot = h.ring + (seq & mask) * kLLSlotBytes;
      const unsigned int flag = flag_of(seq);
      if (line == 0) {
        st_volatile_v4(slot, U4{h.route, flag, nb, flag});
      } else if ((line - 1) * kLLLinePayload < nb || ll_rewrites_all(seq, h.nslots)) {
        U4 v;
        gather8(src, off + (line - 1) * kLLLinePayload, off + nb, v.x, v.z);
        v.y = flag;
        v.w = flag;
        st_volatile_v4(slot + line * kLineBytes, v);
      }
    }
    base += cnt;
  }
  st.seq += base;
  return ok;
}

template <typename G>
__device__ bool ll_write(const ChannelHandle& h, const unsigned char* src, unsigned long long nbytes) {
  SendState st = load_send_state(h);
  const bool ok = ll_write_st<G>(h, st, src, nbytes);
  G::sync();
  if (G::rank() == 0) save_send_state(h, st);
  G::sync();
  return ok;
}

// One lane per line of up to two packets (lanes 0-15: packet seq, lanes 16-31: seq + 1).
// Packet seq+1 is polled only when packet seq cannot satisfy the request.
__device__ bool ll_read_warp_st(const ChannelHandle& h, RecvState& st, unsigned char* dst,
                                unsigned long long nbytes) {
  const unsigned int lane = lane_id();
  const unsigned long long mask = h.nslots - 1;
  const unsigned int j = lane / 16, line = lane % 16;
  unsigned long long done = 0;
  bool ok = true;
  while (done < nbytes) {
    const unsigned long long need = nbytes - done;
    const unsigned long long seq = st.seq + j;
    const unsigned int flag = flag_of(seq);
    const unsigned char* slot = h.ring + (seq & mask) * kLLSlotBytes;
    U4 v;
    unsigned int nb0 = 0, nb1 = 0;
    bool hdr0 = false, hdr1 = false, need1 = true;
    Deadline d = Deadline::after(h.timeout_ns, h.abort);
    bool give_up = has_error(h);
    unsigned int spins = 0;
    while (true) {
      v = ld_volatile_v4(slot + line * kLineBytes);
      const bool flags_ok = v.y == flag && v.w == flag;
      // Idle polls cost one vote: nothing is consumable before packet seq's header is valid, so
      // the shuffles below run only once it is (on the lines loaded in this same round).
      hdr0 = __any_sync(0xffffffffu, lane == 0 && flags_ok);
      if (hdr0) {
        hdr1 = __shfl_sync(0xffffffffu, flags_ok ? 1 : 0, 16) != 0;
        nb0 = __shfl_sync(0xffffffffu, v.z, 0);
        nb1 = __shfl_sync(0xffffffffu, v.z, 16);
        need1 = (unsigned long long)(nb0 - st.offset) < need;
        bool mine;
        if (j == 1 && !need1) {
          mine = true;  // packet seq alone satisfies the request
        } else {
          const bool hdr = j == 0 ? true : hdr1;
          const unsigned int nb = j == 0 ? nb0 : nb1;
          mine = hdr && (line == 0 || (line - 1) * kLLLinePayload >= nb || flags_ok);
        }
        if (__all_sync(0xffffffffu, mine)) break;
      }
      if (give_up) { ok = false; break; }
      if ((++spins & 7u) == 0) {
        bool late = lane == 0 ? d.expired() || has_error(h) : false;
        late = __shfl_sync(0xffffffffu, late ? 1 : 0, 0) != 0;
        if (late) {
          if (lane == 0 && !has_error(h)) record_error(h, d.aborted() ? kErrAborted : kErrDataTimeout,
                                                       st.seq + (hdr0 ? 1 : 0));
          give_up = true;
        }
      }
    }
    if (!ok) break;
    // Copy: packet 0 bytes [offset, offset + take0), then packet 1 bytes [0, take1).
    const unsigned long long take0 = (nb0 - st.offset) < need ? (nb0 - st.offset) : need;
    const unsigned long long take1 = need1 ? ((need - take0) < nb1 ? (need - take0) : nb1) : 0;
    if (line > 0) {
      const unsigned int lo = (line - 1) * kLLLinePayload, hi = lo + kLLLinePayload;
      const unsigned int from_b = j == 0 ? st.offset : 0;
      const unsigned int to_b = j == 0 ? (unsigned int)(st.offset + take0) : (unsigned int)take1;
      const unsigned int a = lo > from_b ? lo : from_b, b = hi < to_b ? hi : to_b;
      if (a < b) {
        unsigned char* out = dst + done + (j == 0 ? (a - st.offset) : (take0 + a));
        scatter8(out, v.x, v.z, a - lo, b - lo);
      }
    }
    // Advance (every lane computes the same).
    done += take0 + take1;
    if (need1 || st.offset + take0 == nb0) {
      st.seq += 1;
      st.offset = 0;
      if (take1 > 0) {
        if (take1 == nb1) st.seq += 1;
        else st.offset = (unsigned int)take1;
      }
    } else {
      st.offset += (unsigned int)take0;
    }
    __syncwarp();
    if (lane == 0) return_credits(h, st);
  }
  return ok;
}

__device__ bool ll_read_warp(const ChannelHandle& h, unsigned char* dst, unsigned long long nbytes) {
  RecvState st = load_recv_state(h);
  const bool ok = ll_read_warp_st(h, st, dst, nbytes);
  __syncwarp();
  if (lane_id() == 0) save_recv_state(h, st);
  __syncwarp();
  return ok;
}

// One thread: the scalar path (not the fast path).
__device__ bool ll_read_thread(const ChannelHandle& h, unsigned char* dst, unsigned long long nbytes) {
  RecvState st = load_recv_state(h);
  const unsigned long long mask = h.nslots - 1;
  unsigned long long done = 0;
  bool ok = true;
  while (done < nbytes && ok) {
    const unsigned long long seq = st.seq;
    const unsigned int flag = flag_of(seq);
    const unsigned char* slot = h.ring + (seq & mask) * kLLSlotBytes;
    U4 hd;
    ok = wait_for(h, [&] { hd = ld_volatile_v4(slot); return hd.y == flag && hd.w == flag; }, kErrDataTimeout, seq);
    if (!ok) break;
    const unsigned int nb = hd.z;
    const unsigned long long take = (nb - st.offset) < nbytes - done ? (nb - st.offset) : nbytes - done;
    const unsigned int from_b = st.offset, to_b = (unsigned int)(st.offset + take);
    for (unsigned int line = 1 + from_b / kLLLinePayload; ok && (line - 1) * kLLLinePayload < to_b; ++line) {
      U4 v;
      ok = wait_for(h, [&] { v = ld_volatile_v4(slot + line * kLineBytes); return v.y == flag && v.w == flag; },
                    kErrDataTimeout, seq);
      if (!ok) break;
      const unsigned int lo = (line - 1) * kLLLinePayload, hi = lo + kLLLinePayload;
      const unsigned int a = lo > from_b ? lo : from_b, b = hi < to_b ? hi : to_b;
      scatter8(dst + done + (a - from_b), v.x, v.z, a - lo, b - lo);
    }
    if (!ok) break;
    done += take;
    st.offset += (unsigned int)take;
    if (st.offset == nb) {
      st.seq += 1;
      st.offset = 0;
      return_credits(h, st);
    }
  }
  save_recv_state(h, st);
  return ok;
}

// Leader only: wait until packet seq's header is valid (both modes), without consuming it. For
// measurements (the pingpong's "first word back" time); false on time-out.
__device__ __forceinline__ bool peek_packet(const ChannelHandle& h, unsigned long long seq) {
  const unsigned char* slot = h.ring + (seq & (unsigned long long)(h.nslots - 1)) * h.slot_bytes;
  const unsigned int flag = flag_of(seq);
  return wait_for(h, [&] { U4 hd = ld_volatile_v4(slot); return hd.y == flag && hd.w == flag; }, kErrDataTimeout,
                  seq);
}

// ---- bandwidth mode --------------------------------------------------------------------------
// The group copies one packet's payload with 16-byte stores, then its leader publishes the
// header after a system-scope fence.
template <typename G>
__device__ __forceinline__ void bw_store_packet(const ChannelHandle& h, const unsigned char* src,
                                                unsigned long long seq, unsigned int nb) {
  unsigned char* slot = h.ring + (seq & (unsigned long long)(h.nslots - 1)) * h.slot_bytes;
  unsigned char* payload = slot + kBWHeaderBytes;
  const unsigned int nvec = (nb + 15) / 16;
  unsigned int i = G::rank();
  if ((((unsigned long long)src) & 15ull) == 0) {
    // Four loads in flight before their stores: one load at a time leaves NVLink idle while the
    // loads wait on local memory.
    const unsigned int full = nb / 16, step = G::size();
    for (; i + 3 * step < full; i += 4 * step) {
      const U4 a = *reinterpret_cast<const U4*>(src + 16ull * i);
      const U4 b = *reinterpret_cast<const U4*>(src + 16ull * (i + step));
      const U4 c = *reinterpret_cast<const U4*>(src + 16ull * (i + 2 * step));
      const U4 d = *reinterpret_cast<const U4*>(src + 16ull * (i + 3 * step));
      st_v4(payload + 16ull * i, a);
      st_v4(payload + 16ull * (i + step), b);
      st_v4(payload + 16ull * (i + 2 * step), c);
      st_v4(payload + 16ull * (i + 3 * step), d);
    }
  }
  for (; i < nvec; i += G::size()) st_v4(payload + 16ull * i, gather16(src, 16ull * i, nb));
  G::sync();
  if (G::rank() == 0) {
    __threadfence_system();
    const unsigned int flag = flag_of(seq);
    st_volatile_v4(slot, U4{h.route, flag, nb, flag});
  }
}

// Leader polls packet seq's header; returns nbytes (0 on failure) to the whole group.
template <typename G>
__device__ __forceinline__ unsigned int bw_wait_packet(const ChannelHandle& h, unsigned long long seq) {
  unsigned long long nb = 0;
  if (G::rank() == 0) {
    const unsigned char* slot = h.ring + (seq & (unsigned long long)(h.nslots - 1)) * h.slot_bytes;
    const unsigned int flag = flag_of(seq);
    U4 hd;
    if (wait_for(h, [&] { hd = ld_volatile_v4(slot); return hd.y == flag && hd.w == flag; }, kErrDataTimeout, seq)) {
      nb = hd.z;
      __threadfence_system();  // acquire: the payload loads below follow the flag
    }
  }
  return (unsigned int)G::bcast(nb);
}

// Copy payload bytes [from, to) of packet seq to dst.
template <typename G>
__device__ __forceinline__ void bw_copy_out(const ChannelHandle& h, unsigned long long seq, unsigned int from,
                                            unsigned int to, unsigned char* dst) {
  const unsigned char* payload =
      h.ring + (seq & (unsigned long long)(h.nslots - 1)) * h.slot_bytes + kBWHeaderBytes;
  const unsigned int n = to - from;
  if ((from & 15u) == 0 && (((unsigned long long)dst) & 15ull) == 0) {
    const unsigned int nvec = n / 16, step = G::size();
    unsigned int i = G::rank();
    for (; i + 3 * step < nvec; i += 4 * step) {  // four loads in flight, as in bw_store_packet
      const U4 a = ld_cg_v4(payload + from + 16ull * i);
      const U4 b = ld_cg_v4(payload + from + 16ull * (i + step));
      const U4 c = ld_cg_v4(payload + from + 16ull * (i + 2 * step));
      const U4 d = ld_cg_v4(payload + from + 16ull * (i + 3 * step));
      *reinterpret_cast<U4*>(dst + 16ull * i) = a;
      *reinterpret_cast<U4*>(dst + 16ull * (i + step)) = b;
      *reinterpret_cast<U4*>(dst + 16ull * (i + 2 * step)) = c;
      *reinterpret_cast<U4*>(dst + 16ull * (i + 3 * step)) = d;
    }
    for (; i < nvec; i += step) *reinterpret_cast<U4*>(dst + 16ull * i) = ld_cg_v4(payload + from + 16ull * i);
    for (unsigned int b = nvec * 16 + G::rank(); b < n; b += G::size()) dst[b] = ld_cg_u8(payload + from + b);
  } else {
    for (unsigned int b = G::rank(); b < n; b += G::size()) dst[b] = ld_cg_u8(payload + from + b);
  }
}

template <typename G>
__device__ bool bw_write_st(const ChannelHandle& h, SendState& st, const unsigned char* src,
                            unsigned long long nbytes) {
  bool ok = true;
  for (unsigned long long off = 0; off < nbytes; off += h.payload) {
    const unsigned int nb = (unsigned int)(nbytes - off < h.payload ? nbytes - off : h.payload);
    unsigned long long okv = 1;
    if (G::rank() == 0) okv = credit_for(h, st, st.seq) ? 1 : 0;
    if (!G::bcast(okv)) { ok = false; break; }
    bw_store_packet<G>(h, src + off, st.seq, nb);
    st.seq += 1;
  }
  return ok;
}

template <typename G>
__device__ bool bw_write(const ChannelHandle& h, const unsigned char* src, unsigned long long nbytes) {
  SendState st = load_send_state(h);
  const bool ok = bw_write_st<G>(h, st, src, nbytes);
  G::sync();
  if (G::rank() == 0) save_send_state(h, st);
  G::sync();
  return ok;
}

template <typename G>
__device__ bool bw_read_st(const ChannelHandle& h, RecvState& st, unsigned char* dst, unsigned long long nbytes) {
  unsigned long long done = 0;
  bool ok = true;
  while (done < nbytes) {
    const unsigned int nb = bw_wait_packet<G>(h, st.seq);
    if (nb == 0) { ok = false; break; }
    const unsigned long long take = (nb - st.offset) < nbytes - done ? (nb - st.offset) : nbytes - done;
    bw_copy_out<G>(h, st.seq, st.offset, (unsigned int)(st.offset + take), dst + done);
    done += take;
    st.offset += (unsigned int)take;
    G::sync();  // every copy is done before the slot is handed back
    if (st.offset == nb) {
      if (G::rank() == 0) st_relaxed(h.slot_credit + (st.seq & (h.nslots - 1)), flag_of(st.seq));
      st.seq += 1;
      st.offset = 0;
      if (G::rank() == 0) return_credits(h, st);
    }
  }
  return ok;
}

template <typename G>
__device__ bool bw_read(const ChannelHandle& h, unsigned char* dst, unsigned long long nbytes) {
  RecvState st = load_recv_state(h);
  const bool ok = bw_read_st<G>(h, st, dst, nbytes);
  G::sync();
  if (G::rank() == 0) save_recv_state(h, st);
  G::sync();
  return ok;
}

// ---- grid forms (bandwidth mode) -------------------------------------------------------------
// The warps of the grid share the packets of a call: warp w handles packets base + w,
// base + w + W, ... (W = warps in the grid), each waiting only for its own slot's credit. Warps,
// not blocks, so that one warp's system fence before its header overlaps the other warps' stores
// instead of stalling a whole block. The last warp to leave stores the new state.
__device__ __forceinline__ unsigned int grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ unsigned int grid_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ unsigned int block_warps() { return BlockG::size() / 32; }
__device__ __forceinline__ unsigned int grid_warps() { return grid_blocks() * block_warps(); }
__device__ __forceinline__ unsigned int grid_warp() { return grid_block() * block_warps() + BlockG::rank() / 32; }

// Warp-level: the first packet number of this call (every warp reads it at entry).
__device__ __forceinline__ unsigned long long grid_base(const ChannelHandle& h) {
  return WarpG::bcast(WarpG::rank() == 0 ? ld_relaxed_u64(h.state) : 0ull);
}

// Warp-level: send one packet (seq) of a grid call, waiting for its slot's credit.
__device__ __forceinline__ bool grid_send_packet(const ChannelHandle& h, const unsigned char* src,
                                                 unsigned long long seq, unsigned int nb) {
  unsigned long long okv = 1;
  if (WarpG::rank() == 0 && seq >= h.nslots) {
    unsigned int* credit = h.slot_credit + (seq & (h.nslots - 1));
    const unsigned int want = flag_of(seq - h.nslots);
    okv = wait_for(h, [&] { return ld_relaxed(credit) == want; }, kErrCreditTimeout, seq) ? 1 : 0;
  }
  if (!WarpG::bcast(okv)) return false;
  bw_store_packet<WarpG>(h, src, seq, nb);
  return true;
}

// Warp-level: receive one packet (seq) of a grid call, which must carry `expect` bytes.
__device__ __forceinline__ bool grid_recv_packet(const ChannelHandle& h, unsigned char* dst, unsigned long long seq,
                                                 unsigned int expect) {
  const unsigned int nb = bw_wait_packet<WarpG>(h, seq);
  if (nb == 0) return false;
  if (nb != expect) {
    if (WarpG::rank() == 0) record_error(h, kErrMisuse, seq);
    return false;
  }
  bw_copy_out<WarpG>(h, seq, 0, nb, dst);
  __syncwarp();  // every lane's loads are done before the slot is handed back
  if (WarpG::rank() == 0) st_relaxed(h.slot_credit + (seq & (h.nslots - 1)), flag_of(seq));
  return true;
}

// Warp-level: leave a grid call of `npk` packets from `base`; the last of the `nwarps` warps that
// served this end stores the state (and, on the receiving side, the in-order credit counter).
__device__ __forceinline__ void grid_leave(const ChannelHandle& h, unsigned long long base, unsigned long long npk,
                                           bool receiver, unsigned int nwarps) {
  __syncwarp();
  if (WarpG::rank() == 0) {
    __threadfence();
    // SendState.departed is at byte 16, RecvState.departed at byte 12
    unsigned int* departed = receiver ? reinterpret_cast<unsigned int*>(h.state + 1) + 1
                                      : reinterpret_cast<unsigned int*>(h.state + 2);
    if (atomicAdd(departed, 1u) == nwarps - 1) {
      *departed = 0;
      st_relaxed_u64(h.state, base + npk);
      if (receiver) {
        st_relaxed(reinterpret_cast<unsigned int*>(h.state + 1), 0u);
        st_relaxed_u64(h.state + 2, base + npk);  // RecvState.returned
        st_relaxed_u64(h.credit, base + npk);
      }
      __threadfence_system();
    }
  }
  __syncwarp();
}

__device__ bool grid_write(const ChannelHandle& h, const unsigned char* src, unsigned long long nbytes) {
  const unsigned long long base = grid_base(h);
  const unsigned long long npk = (nbytes + h.payload - 1) / h.payload;
  bool ok = true;
  for (unsigned long long p = grid_warp(); ok && p < npk; p += grid_warps()) {
    const unsigned long long off = p * h.payload;
    const unsigned int nb = (unsigned int)(nbytes - off < h.payload ? nbytes - off : h.payload);
    ok = grid_send_packet(h, src + off, base + p, nb);
  }
  grid_leave(h, base, npk, false, grid_warps());
  return ok;
}

__device__ bool grid_read(const ChannelHandle& h, unsigned char* dst, unsigned long long nbytes) {
  const unsigned long long base = grid_base(h);
  const unsigned long long npk = (nbytes + h.payload - 1) / h.payload;
  unsigned long long okv = 1;
  if (WarpG::rank() == 0 && ld_relaxed(reinterpret_cast<const unsigned int*>(h.state + 1)) != 0u) {
    record_error(h, kErrMisuse, base);  // a grid read must start at a packet boundary
    okv = 0;
  }
  bool ok = WarpG::bcast(okv) != 0;
  for (unsigned long long p = grid_warp(); ok && p < npk; p += grid_warps()) {
    const unsigned long long off = p * h.payload;
    const unsigned int nb = (unsigned int)(nbytes - off < h.payload ? nbytes - off : h.payload);
    ok = grid_recv_packet(h, dst + off, base + p, nb);
  }
  grid_leave(h, base, npk, true, grid_warps());
  return ok;
}

}  // namespace detail
}  // namespace circuslink
