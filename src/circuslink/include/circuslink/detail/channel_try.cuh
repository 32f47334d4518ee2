// circuslink/detail/channel_try.cuh - the non-blocking channel calls: try_write, try_read, test.
//
// Thin forms over channel_impl.cuh, which they do not change: the wire format, the blocking paths and their
// register costs stay as they are. Each try_* call first asks, without waiting, whether the blocking call
// could run to its end without a wait, and only then makes it:
//   - try_write: the credits for every packet of the write are there (the cached counter, else one load of
//     the reader's counter); the write then never waits;
//   - try_read: every byte of the read has arrived (the packets from the end's position are there and
//     complete: a low-latency packet's header and every unit below its nbytes carry its flag, a bulk
//     packet's header carries it); the read then never waits.
// Otherwise they return false at once, having moved nothing and recorded nothing (a "not now"); the end's
// failed() tells a "not now" from a failure. A try_read that finds nothing hands back the credits the
// reader holds, as a blocking read does before it waits, so a writer polling try_write always progresses.
#pragma once

#include "channel_impl.cuh"

namespace circuslink {
namespace detail {

// Packets a write of nbytes takes (the split write_st makes: low-latency up to ll_max bytes, else bulk).
__device__ __forceinline__ u64 write_packets(const ChannelHandle& h, u64 nbytes) {
  return nbytes <= h.ll_max ? (nbytes + kLLPayload - 1) / kLLPayload : (nbytes + h.chunk - 1) / h.chunk;
}

// Whether packets st.seq .. st.seq + npk - 1 may all be written now (every thread of the group, the same
// answer): from the cached counter when it tells, else from one load of the reader's counter by the leader.
template <typename G>
__device__ __forceinline__ bool credits_now(const ChannelHandle& h, SendState& st, u64 npk) {
  const u64 last = st.seq + npk - 1;
  if (last < st.credit_cache + h.nslots) return true;
  const u64 seen = G::bcast(G::rank() == 0 ? ld_relaxed_u64(h.credit) : 0ull);
  if (seen > st.credit_cache) st.credit_cache = seen;
  return last < st.credit_cache + h.nslots;
}

// Every thread of the group: write nbytes if it can go without a wait, else nothing. A write of more
// packets than the ring holds can never go at once: misuse (recorded), false.
template <typename G>
__device__ bool try_write_st(const ChannelHandle& h, SendState& st, const unsigned char* src, u64 nbytes) {
  if (nbytes == 0) return true;
  const u64 npk = write_packets(h, nbytes);
  if (npk > h.nslots) {
    if (G::rank() == 0) record_error(h, kErrMisuse, st.seq);
    return false;
  }
  if (!credits_now<G>(h, st, npk)) return false;
  return write_st<G>(h, st, src, nbytes);
}

// Whether `need` bytes of the stream from (seq, offset) have arrived, without waiting and without
// consuming anything. kLanes = 1: one thread loads unit by unit; kLanes = 32: a full warp loads a packet's
// 32 units at once (lane u unit u; one round trip a packet). Packets past seq + nslots cannot have been
// written yet, so the scan stops there.
template <u32 kLanes>
__device__ __forceinline__ bool arrived(const ChannelHandle& h, u64 seq, u32 offset, u64 need) {
  const u32 lane = kLanes == 1 ? 0u : lane_id();
  u64 have = 0;
  for (u32 k = 0; k < h.nslots; ++k) {
    const u64 s = seq + k;
    const unsigned char* slot = slot_of(h, s);
    const u32 flag = flag_of(s);
    u64 mine = 0, hd;
    if (kLanes == 1) {
      hd = ld_unit(slot + kUnitBytes);
    } else {
      mine = ld_unit(slot + lane * kUnitBytes);
      hd = __shfl_sync(0xffffffffu, mine, 1);
    }
    if (unit_flag(hd) != flag) return false;
    const u32 word = (u32)hd, nb = word & kNbytesMask;
    if (!(word & kKindBulk)) {  // low-latency: every unit below nbytes carries the flag (units 2..)
      bool complete = true;
      if (kLanes == 1) {
        for (u32 u = 2; complete && (u - 2) * 4 < nb; ++u) complete = unit_flag(ld_unit(slot + u * kUnitBytes)) == flag;
      } else {
        complete = __all_sync(0xffffffffu, lane < 2 || (lane - 2) * 4 >= nb || unit_flag(mine) == flag) != 0;
      }
      if (!complete) return false;
    }
    have += nb - (k == 0 ? offset : 0u);
    if (have >= need) return true;
  }
  return false;
}

// The group's answer to arrived(): a thread alone, a warp together, a block through its first warp.
template <typename G>
__device__ __forceinline__ bool arrived_group(const ChannelHandle& h, const RecvState& st, u64 need) {
  if (G::size() == 1) return arrived<1>(h, st.seq, st.offset, need);
  u64 yes = 0;
  if (G::rank() < 32) yes = arrived<32>(h, st.seq, st.offset, need) ? 1ull : 0ull;
  return G::bcast(yes) != 0;
}

// Every thread of the group: read nbytes if all of them have arrived, else nothing (credits held are
// handed back, so a writer waiting on them goes on).
template <typename G>
__device__ bool try_read_st(const ChannelHandle& h, RecvState& st, unsigned char* dst, u64 nbytes) {
  if (nbytes == 0) return true;
  if (!arrived_group<G>(h, st, nbytes)) {
    if (st.seq != st.returned) {
      if (G::rank() == 0) st_relaxed_u64(h.credit, st.seq);
      st.returned = st.seq;
    }
    return false;
  }
  return read_st<G>(h, st, dst, nbytes);
}

// The plain forms: load the end's state, call the _st form, store the state back (as write / read do).
template <typename G>
__device__ bool try_write(const ChannelHandle& h, const unsigned char* src, u64 nbytes) {
  SendState st = load_send_state(h);
  const bool ok = try_write_st<G>(h, st, src, nbytes);
  G::sync();
  if (G::rank() == 0) save_send_state(h, st);
  G::sync();
  return ok;
}
template <typename G>
__device__ bool try_read(const ChannelHandle& h, unsigned char* dst, u64 nbytes) {
  RecvState st = load_recv_state(h);
  const bool ok = try_read_st<G>(h, st, dst, nbytes);
  G::sync();
  if (G::rank() == 0) {
    if (ok) flush_credits(h, st);  // as read(): a plain call may be the last
    save_recv_state(h, st);
  }
  G::sync();
  return ok;
}

// Sender: has the reader consumed every packet written so far (its credits came back)? One thread.
__device__ __forceinline__ bool all_consumed(const ChannelHandle& h) {
  return ld_relaxed_u64(h.credit) >= ld_relaxed_u64(h.state);
}

}  // namespace detail
}  // namespace circuslink
