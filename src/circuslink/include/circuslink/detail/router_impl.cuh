// circuslink/detail/router_impl.cuh - the forwarding agent (docs/routing.md, "Forwarding").
//
// One block per rank, relaunched back to back in slices (what it keeps between launches is in device memory:
// InputState, OutputState, ChannelState), so that it behaves as a persistent kernel while a device-wide
// synchronization elsewhere in the process still returns. Warp 0 is the router: pass after pass its lanes
// poll the head of every input ring (lane i: inputs i, i + 32, ...; one 8-byte load of the header's unit 1
// each, local memory), and for each ready input it moves up to kBurst packets, never waiting on an output: a
// head whose next buffer is full, or whose channel's receiver has not freed room (end-to-end credits), is
// left for the next pass, so one blocked head never holds up another input. Low-latency packets are
// re-flagged unit by unit by warp 0 (one store per lane); bulk packets are copied by the whole block (the
// other warps wait at a named barrier for a job), then warp 0 publishes their headers after one release
// fence. The cpu reference is channels/_router_cpu.py: the same decisions in the same order.
//
// Gateways (docs/scale.md): an output may be this rank's relay (Output::kind == kHopRelay: its out ring, which
// a transport carries to the peer gateway) and an input its in ring; the agent treats them as link rings (the
// same stores, flags and credits). The only decision they change: a packet whose next hop is its destination
// through a relay is forwarded into the relay, and the landing agent, on the destination itself, delivers it.
//
// Waits: the agent itself never waits for a peer except for a low-latency packet's data units that lag their
// header (bounded by timeout_ns); the host stops it through a host-mapped word, and the back-end's abort word
// ends it too. What a long-blocked head waits on is published as a chain record (the input, the buffer it
// waits for, and that buffer's own chain read from the neighbour), so the host can name a stall or a cycle.
#pragma once

#include "channel_impl.cuh"
#include "router_types.cuh"
#include "sync.cuh"

namespace circuslink {
namespace router {
namespace impl {

using circuslink::detail::u32;
using circuslink::detail::u64;

constexpr u32 kBurst = 8;         // packets of one input per visit
constexpr u32 kJobMax = 8;        // bulk packets copied by the block per job (one release fence)
constexpr u32 kReportEvery = 8;   // passes between credit reports while busy
constexpr u32 kControlEvery = 64; // passes between reads of the host-mapped stop and abort words
constexpr u32 kChainEvery = 16;   // idle passes between chain publications

// An input's state, in shared memory.
struct InS {
  unsigned char* ring;
  u64 seq;      // next packet to take
  u64 since;    // %globaltimer when its head last became blocked
  u32 mask;     // nslots - 1
  u32 slot_bytes;
  u32 blocked;  // kBlk* | index, 0: not blocked
  u32 published;
};
struct OutS {
  u64 seq;      // next slot to write
  u64 cache;    // the downstream consumed count last read
};
// channels/protocol.py sizes the dynamic shared memory with these (ROUTER_SHARED_PER_*)
static_assert(sizeof(InS) == 40 && sizeof(OutS) == 16 && sizeof(route::Entry) == 4, "router shared memory layout");
enum : u32 { kBlkGate = 0x80000000u, kBlkDeliver = 0x40000000u, kBlkOut = 0x20000000u, kBlkIndex = 0x0000FFFFu };

// A batch of bulk packets the whole block copies (shared memory).
struct Job {
  const unsigned char* src[kJobMax];  // input slots
  unsigned char* dst[kJobMax];        // output slots
  u32 nb[kJobMax];
  u32 route[kJobMax];
  u32 word[kJobMax];
  u32 flag[kJobMax];
  u32 rewrite[kJobMax];
  u32 n;
  u32 stop;
};

struct Ctx {
  InS* in;
  OutS* out;
  route::Entry* entries;
  Job* job;
  u32 nports;
};

// What lane 0 decided about an input's head packet.
enum : u32 { kActStop = 0, kActLL = 1, kActBulk = 2, kActTaken = 3, kActError = 4 };
struct Move {
  unsigned char* src;
  unsigned char* dst;
  u32 nb, route, word, flag, rewrite;
  u32 deliver;  // the channel delivered to (a credit report may follow), kNoChannel if none
};

__device__ __forceinline__ void named_barrier(u32 id, u32 count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ u64 shfl64(u64 v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ u32 shfl32(u32 v) { return __shfl_sync(0xffffffffu, v, 0); }

// Record the agent's first error in the host-mapped control words (only warp 0's lane 0 calls it, so no
// atomic is needed on host memory); the code is stored last, after the details it covers.
__device__ __forceinline__ void fail(const Agent& a, u32 code, u32 input, u64 seq, u32 word) {
  using namespace circuslink::detail;
  if (ld_relaxed(a.control + kCtlError) != 0u) return;
  st_relaxed(a.control + kCtlInput, input);
  st_relaxed(a.control + kCtlSeq, (u32)seq);
  st_relaxed(a.control + kCtlWord, word);
  __threadfence_system();
  st_relaxed(a.control + kCtlError, code);
  __threadfence_system();
}

__device__ __forceinline__ void block(InS& s, u32 why) {
  if (s.blocked != why) {
    s.blocked = why;
    s.since = circuslink::detail::globaltimer_ns();
  }
}
__device__ __forceinline__ void unblock(const Agent& a, u32 i, InS& s) {
  s.blocked = 0;
  if (s.published) {
    circuslink::detail::st_relaxed(a.inputs[i].chain, 0u);
    s.published = 0;
  }
}

// The receiver's in-order consumed count, from its slot credits on the board (any read form stores them).
__device__ u64 scan_board(const Channel& ch, ChannelState& st) {
  u64 p = st.consumed;
  const u32 mask = ch.nslots - 1u;
  while (p < st.delivered && circuslink::detail::ld_relaxed(ch.board + ((u32)p & mask)) ==
                                 circuslink::detail::flag_of(p))
    ++p;
  st.consumed = p;
  return p;
}

__device__ __forceinline__ bool out_room(const Output& o, OutS& s) {
  if (s.seq < s.cache + o.nslots) return true;
  s.cache = circuslink::detail::ld_relaxed_u64(o.credit);
  return s.seq < s.cache + o.nslots;
}

// Lane 0: what to do with input i's head, whose units 0 and 1 (the header) the warp loaded. Fills mv and
// advances the states it claims (the output slot, the delivery slot, the input's seq). kActStop: nothing to
// take now (not arrived, or blocked).
__device__ u32 decide(const Agent& a, Ctx& c, u32 i, Move& mv, u64 u0, u64 u1) {
  using namespace circuslink::detail;
  InS& s = c.in[i];
  const Input& in = a.inputs[i];
  const u64 q = s.seq;
  unsigned char* slot = s.ring + ((u32)q & s.mask) * s.slot_bytes;
  const u32 flag = flag_of(q);
  if ((u32)(u0 >> 32) != flag || (u32)(u1 >> 32) != flag) return kActStop;
  const u32 route = (u32)u0, word = (u32)u1;
  const bool bulk = (word & kKindBulk) != 0, ctrl = (word & kCtrl) != 0;
  const u32 nb = word & kNbytesMask, dst = route >> 16, rid = route & 0xFFFFu;
  const bool inject = in.kind == kInInject;
  if (nb == 0 || nb > (bulk ? in.chunk : (u32)kLLPayload) || dst >= a.nranks || (word & 0x60000000u) ||
      (ctrl && nb != kCreditBytes) || (inject && (ctrl || (word & kVcMask)))) {
    fail(a, kErrHeader, i, q, word);
    return kActError;
  }
  if (inject) {
    const u32 ci = in.channel;
    const Channel& ch = a.channels[ci];
    ChannelState& st = a.state[ci];
    if (q >= st.gate + ch.nslots) {
      if (ch.role & kRoleLast) st.gate = scan_board(ch, st);  // first == last: the board is here
      if (q >= st.gate + ch.nslots) {
        block(s, kBlkGate | ci);
        return kActStop;
      }
    }
  }
  mv.deliver = kNoChannel;
  if (ctrl && dst == a.rank) {  // a credit packet for a channel whose injection ring drains here
    const u32 ci = rid < a.nids ? a.channel_of_id[rid] : kNoChannel;
    if (ci == kNoChannel || !(a.channels[ci].role & kRoleFirst)) {
      fail(a, kErrChannel, i, q, rid);
      return kActError;
    }
    u64 lo = ld_unit(slot + 2 * kUnitBytes), hi = ld_unit(slot + 3 * kUnitBytes);
    if ((u32)(lo >> 32) != flag || (u32)(hi >> 32) != flag) {
      Deadline d = Deadline::after(a.timeout_ns, a.abort);
      while ((u32)(lo >> 32) != flag || (u32)(hi >> 32) != flag) {
        if (d.expired()) {
          fail(a, d.aborted() ? kErrAborted : kErrUnits, i, q, word);
          return kActError;
        }
        lo = ld_unit(slot + 2 * kUnitBytes);
        hi = ld_unit(slot + 3 * kUnitBytes);
      }
    }
    const u64 count = (u64)(u32)lo | ((u64)(u32)hi << 32);
    ChannelState& st = a.state[ci];
    if (count > st.gate) st.gate = count;
    s.seq = q + 1;
    unblock(a, i, s);
    return kActTaken;
  }
  const route::Entry e = c.entries[dst];
  // Deliver here when the packet is at its destination (it crossed a relay into the receiver's own agent) or
  // one mapped hop from it; a last hop through a relay goes into the relay like any other hop.
  bool deliver = !ctrl && (dst == a.rank || e.next == dst);
  if (deliver && dst != a.rank && e.port < c.nports && a.outputs[(u32)e.port * a.vcs + e.vc].kind == kHopRelay)
    deliver = false;
  if (deliver) {  // the last hop: straight into the channel's delivery ring
    const u32 ci = inject ? in.channel : (rid < a.nids ? a.channel_of_id[rid] : kNoChannel);
    if (ci == kNoChannel || !(a.channels[ci].role & kRoleLast)) {
      fail(a, kErrChannel, i, q, rid);
      return kActError;
    }
    const Channel& ch = a.channels[ci];
    ChannelState& st = a.state[ci];
    const u64 d = st.delivered;
    const u32 mask = ch.nslots - 1u;
    if (d >= ch.nslots && ld_relaxed(ch.board + ((u32)d & mask)) != flag_of(d - ch.nslots)) {
      block(s, kBlkDeliver | ci);
      return kActStop;
    }
    mv.dst = ch.ring + ((u32)d & mask) * ch.slot_bytes;
    mv.flag = flag_of(d);
    mv.rewrite = rewrites_all(d, ch.nslots) ? 1u : 0u;
    mv.word = nb | (bulk ? (u32)kKindBulk : 0u);
    st.delivered = d + 1;
    mv.deliver = (ch.role & kRoleFirst) ? (u32)kNoChannel : ci;
  } else {
    if (e.port >= c.nports) {
      fail(a, kErrNoLink, i, q, dst);
      return kActError;
    }
    const u32 o = (u32)e.port * a.vcs + e.vc;
    const Output& out = a.outputs[o];
    if (out.ring == nullptr) {
      fail(a, kErrNoLink, i, q, dst);
      return kActError;
    }
    OutS& os = c.out[o];
    if (!out_room(out, os)) {
      block(s, kBlkOut | o);
      return kActStop;
    }
    const u64 ss = os.seq++;
    mv.dst = out.ring + ((u32)ss & (out.nslots - 1u)) * out.slot_bytes;
    mv.flag = flag_of(ss);
    mv.rewrite = rewrites_all(ss, out.nslots) ? 1u : 0u;
    mv.word = nb | (bulk ? (u32)kKindBulk : 0u) | (ctrl ? (u32)kCtrl : 0u) | ((u32)e.vc << kVcShift);
  }
  mv.src = slot;
  mv.nb = nb;
  mv.route = route;
  s.seq = q + 1;
  unblock(a, i, s);
  // acquire: the block's payload loads (after the job's barrier) follow this header, as a reader's do
  if (bulk) fence_acq_rel_sys();
  return bulk ? kActBulk : kActLL;
}

// Every thread of the block: copy the job's bulk payloads (16-byte vectors, zero padding included, eight
// loads in flight) and, on a rewrite lap, the low-latency units of their slots.
__device__ void copy_job(const Job& job) {
  using namespace circuslink::detail;
  const u32 t = threadIdx.x, T = blockDim.x;
  for (u32 k = 0; k < job.n; ++k) {
    const unsigned char* src = job.src[k] + kLLAreaBytes;
    unsigned char* dst = job.dst[k] + kLLAreaBytes;
    const u32 nvec = (job.nb[k] + 15u) / 16u;
    u32 v = t;
    for (; v + 7 * T < nvec; v += 8 * T) {  // one SM copies: eight loads in flight per thread keep it busy
      U4 w[8];
#pragma unroll
      for (u32 j = 0; j < 8; ++j) w[j] = ld_cg_v4(src + 16ull * (v + j * T));
#pragma unroll
      for (u32 j = 0; j < 8; ++j) st_v4(dst + 16ull * (v + j * T), w[j]);
    }
    for (; v + 3 * T < nvec; v += 4 * T) {
      U4 w[4];
#pragma unroll
      for (u32 j = 0; j < 4; ++j) w[j] = ld_cg_v4(src + 16ull * (v + j * T));
#pragma unroll
      for (u32 j = 0; j < 4; ++j) st_v4(dst + 16ull * (v + j * T), w[j]);
    }
    for (; v < nvec; v += T) st_v4(dst + 16ull * v, ld_cg_v4(src + 16ull * v));
    if (job.rewrite[k])
      for (u32 u = 2 + t; u < kLLUnits; u += T) st_unit(job.dst[k] + u * kUnitBytes, 0u, job.flag[k]);
  }
}

// Warp 0 (all lanes): run the queued bulk copies with the whole block, then publish their headers.
__device__ void flush(Ctx& c) {
  using namespace circuslink::detail;
  __syncwarp();
  Job& job = *c.job;
  if (job.n == 0) return;
  named_barrier(1, blockDim.x);  // the other warps take the job
  copy_job(job);
  named_barrier(2, blockDim.x);  // every payload store is done (and ordered before lane 0's fence)
  if (lane_id() == 0) {
    fence_acq_rel_sys();
    for (u32 k = 0; k < job.n; ++k) st_header(job.dst[k], job.route[k], job.flag[k], job.word[k]);
    job.n = 0;
  }
  __syncwarp();
}

// Warp 0: re-flag one low-latency packet into its output slot (lane u: unit u, already loaded as `v` with
// the header), waiting (bounded) for data units that lag their header.
__device__ bool ll_move(const Agent& a, u32 i, u64 q, const Move& mv, u64 v) {
  using namespace circuslink::detail;
  const u32 lane = lane_id();
  const u32 want = flag_of(q);
  const bool mine = lane >= 2 && (lane - 2) * 4 < mv.nb;
  bool ok = true;
  if (mine) {
    if ((u32)(v >> 32) != want) {
      Deadline d = Deadline::after(a.timeout_ns, a.abort);
      while (true) {
        v = ld_unit(mv.src + lane * kUnitBytes);
        if ((u32)(v >> 32) == want) break;
        if (d.expired()) {
          fail(a, d.aborted() ? kErrAborted : kErrUnits, i, q, mv.word);
          ok = false;
          break;
        }
      }
    }
  }
  if (!__all_sync(0xffffffffu, ok)) return false;
  if (lane == 0) {
    st_unit(mv.dst, mv.route, mv.flag);
  } else if (lane == 1) {
    st_unit(mv.dst + kUnitBytes, mv.word, mv.flag);
  } else if (mine || mv.rewrite) {
    st_unit(mv.dst + lane * kUnitBytes, mine ? (u32)v : 0u, mv.flag);
  }
  return true;
}

// Warp 0: hand input i's packets [from, to) back to their writer (slot credits for injection rings, and the
// in-order count).
__device__ void give_back(const Agent& a, u32 i, u64 from, u64 to) {
  using namespace circuslink::detail;
  if (to == from) return;
  const Input& in = a.inputs[i];
  if (in.slot_credit != nullptr)
    for (u64 q = from + lane_id(); q < to; q += 32) st_relaxed(in.slot_credit + ((u32)q & (in.nslots - 1u)), flag_of(q));
  __syncwarp();
  if (lane_id() == 0) st_relaxed_u64(in.credit, to);
}

// Warp 0: send channel ci's consumed count to its first rank once it moved by `threshold` (kRoleLast,
// first elsewhere). Never waits: without room in the output, the next pass tries again.
__device__ void report(const Agent& a, Ctx& c, u32 ci, u64 threshold) {
  using namespace circuslink::detail;
  const u32 lane = lane_id();
  u64 slot = 0, count = 0;
  u32 go = 0, flag = 0, rewrite = 0, route = 0, vc = 0;
  if (lane == 0) {
    const Channel& ch = a.channels[ci];
    ChannelState& st = a.state[ci];
    count = scan_board(ch, st);
    if (count - st.reported >= threshold && count > st.reported) {
      const route::Entry e = c.entries[ch.first];
      const u32 o = (u32)e.port * a.vcs + e.vc;
      if (e.port < c.nports && a.outputs[o].ring != nullptr && out_room(a.outputs[o], c.out[o])) {
        const Output& out = a.outputs[o];
        const u64 ss = c.out[o].seq++;
        slot = (u64)(out.ring + ((u32)ss & (out.nslots - 1u)) * out.slot_bytes);
        flag = flag_of(ss);
        rewrite = rewrites_all(ss, out.nslots) ? 1u : 0u;
        route = (ch.route & 0xFFFFu) | (ch.first << 16);
        vc = e.vc;
        st.reported = count;
        go = 1;
      }
    }
  }
  if (!shfl32(go)) return;
  unsigned char* p = reinterpret_cast<unsigned char*>(shfl64(slot));
  count = shfl64(count);
  flag = shfl32(flag);
  rewrite = shfl32(rewrite);
  route = shfl32(route);
  vc = shfl32(vc);
  if (lane == 0) st_unit(p, route, flag);
  else if (lane == 1) st_unit(p + kUnitBytes, kCreditBytes | kCtrl | (vc << kVcShift), flag);
  else if (lane == 2) st_unit(p + 2 * kUnitBytes, (u32)count, flag);
  else if (lane == 3) st_unit(p + 3 * kUnitBytes, (u32)(count >> 32), flag);
  else if (rewrite) st_unit(p + lane * kUnitBytes, 0u, flag);
}

// Warp 0: serve input i: up to kBurst packets. Returns the packets taken, or ~0u on an agent error.
__device__ u32 serve(const Agent& a, Ctx& c, u32 i) {
  const u32 lane = circuslink::detail::lane_id();
  const u64 first_seq = shfl64(lane == 0 ? c.in[i].seq : 0ull);
  u32 done = 0, deliver = kNoChannel;
  bool error = false;
  while (done < kBurst) {
    Move mv{};
    u32 act = kActStop;
    // One load round for the head slot's 32 units: the header for lane 0's decision and, for a low-latency
    // packet, every lane's unit to re-flag (the poll saw unit 1 arrive, so the rest is on its way or there).
    __syncwarp();
    const InS& s = c.in[i];
    const u64 q = shfl64(lane == 0 ? s.seq : 0ull);  // lane 0 owns the state; the others take its view
    const u64 unit = circuslink::detail::ld_unit(s.ring + ((u32)q & s.mask) * s.slot_bytes +
                                                 lane * circuslink::detail::kUnitBytes);
    const u64 u0 = __shfl_sync(0xffffffffu, unit, 0), u1 = __shfl_sync(0xffffffffu, unit, 1);
    if (lane == 0) {
      act = decide(a, c, i, mv, u0, u1);
      if (act == kActBulk) {  // queue it: the block copies a batch, one fence publishes them all
        Job& job = *c.job;
        const u32 k = job.n;
        job.src[k] = mv.src;
        job.dst[k] = mv.dst;
        job.nb[k] = mv.nb;
        job.route[k] = mv.route;
        job.word[k] = mv.word;
        job.flag[k] = mv.flag;
        job.rewrite[k] = mv.rewrite;
        job.n = k + 1;
      }
      if ((act == kActLL || act == kActBulk) && mv.deliver != kNoChannel) deliver = mv.deliver;
    }
    act = shfl32(act);
    if (act == kActStop) break;
    if (act == kActError) {
      error = true;
      break;
    }
    ++done;
    if (act == kActLL) {
      flush(c);  // bulk packets taken before it are published first: this input's order holds
      mv.src = reinterpret_cast<unsigned char*>(shfl64((u64)mv.src));
      mv.dst = reinterpret_cast<unsigned char*>(shfl64((u64)mv.dst));
      mv.nb = shfl32(mv.nb);
      mv.route = shfl32(mv.route);
      mv.word = shfl32(mv.word);
      mv.flag = shfl32(mv.flag);
      mv.rewrite = shfl32(mv.rewrite);
      if (!ll_move(a, i, q, mv, unit)) {
        error = true;
        break;
      }
    } else if (act == kActBulk) {
      const u32 queued = shfl32(lane == 0 ? c.job->n : 0u);
      if (queued == kJobMax) flush(c);
    }
  }
  flush(c);
  const u64 last_seq = shfl64(lane == 0 ? c.in[i].seq : 0ull);
  give_back(a, i, first_seq, last_seq);
  deliver = shfl32(deliver);
  if (deliver != kNoChannel) report(a, c, deliver, (u64)(a.channels[deliver].nslots / 4 ? a.channels[deliver].nslots / 4 : 1));
  return error ? ~0u : done;
}

// Lane 0: publish what each input blocked longer than report_after_ns waits on (idle passes only).
__device__ void publish_chains(const Agent& a, Ctx& c) {
  using namespace circuslink::detail;
  const u64 now = globaltimer_ns();
  for (u32 i = 0; i < a.ninputs; ++i) {
    InS& s = c.in[i];
    if (!s.blocked || now - s.since < a.report_after_ns) continue;
    unsigned int* rec = a.inputs[i].chain;
    const u32 me = a.inputs[i].entry;
    u32 n = 1, flags = kChainBlocked, start = 0;  // start: cycle start + 1 (0: none)
    st_relaxed(rec + kChainHead, me);
    if (s.blocked & kBlkGate) {
      flags |= kChainGate;
    } else if (s.blocked & kBlkDeliver) {
      flags |= kChainDelivery;
    } else {
      const Output& out = a.outputs[s.blocked & kBlkIndex];
      const u32 dn = ld_relaxed(out.down_chain);
      if (dn == 0) {
        st_relaxed(rec + kChainHead + 1, out.entry);
        n = 2;
      } else {
        const u32 cnt = dn < (u32)kChainEntries ? dn : (u32)kChainEntries;
        const u32 dflags = ld_relaxed(out.down_chain + 1), dstart = ld_relaxed(out.down_chain + 3);
        flags |= dflags & kChainDelivery;
        bool cycle = false;
        for (u32 k = 0; k < cnt && n < (u32)kChainEntries; ++k) {
          const u32 v = ld_relaxed(out.down_chain + kChainHead + k);
          if (v == me) {  // this input is in its own chain: a cycle
            cycle = true;
            break;
          }
          st_relaxed(rec + kChainHead + n, v);
          ++n;
        }
        start = cycle ? 1u : (dstart ? (dstart + 1 <= n ? dstart + 1 : 0u) : 0u);
      }
    }
    st_relaxed(rec + 1, flags);
    st_relaxed(rec + 2, (u32)s.seq);
    st_relaxed(rec + 3, start);
    __threadfence_system();  // the entries before the count, for readers on any GPU or the host
    st_relaxed(rec, n);
    s.published = 1;
  }
}

// The agent: call from every thread of one block (blockDim.x a multiple of 32), with dynamic shared memory
// of shared_bytes(ninputs, noutputs, nranks) bytes.
__device__ void run(const Agent& a, unsigned char* smem) {
  using namespace circuslink::detail;
  __shared__ Job job;
  const u32 warp = threadIdx.x / 32, lane = lane_id();
  Ctx c;
  c.in = reinterpret_cast<InS*>(smem);
  c.out = reinterpret_cast<OutS*>(smem + sizeof(InS) * a.ninputs);
  c.entries = reinterpret_cast<route::Entry*>(smem + sizeof(InS) * a.ninputs + sizeof(OutS) * a.noutputs);
  c.job = &job;
  c.nports = a.vcs ? a.noutputs / a.vcs : 0;
  if (warp != 0) {  // the copying warps: take jobs until warp 0 posts the stop
    while (true) {
      named_barrier(1, blockDim.x);
      if (job.stop) break;
      copy_job(job);
      named_barrier(2, blockDim.x);
    }
    return;
  }
  for (u32 i = lane; i < a.ninputs; i += 32) {  // the state the previous slice left
    const Input& in = a.inputs[i];
    const InputState& p = a.input_state[i];
    c.in[i] = InS{in.ring, p.seq, p.since, in.nslots - 1u, in.slot_bytes, p.blocked, p.published};
  }
  for (u32 o = lane; o < a.noutputs; o += 32) c.out[o] = OutS{a.output_state[o].seq, a.output_state[o].cache};
  for (u32 r = lane; r < a.nranks; r += 32) c.entries[r] = a.entries[r];
  if (lane == 0) {
    job.n = 0;
    job.stop = 0;
    st_relaxed(a.control + kCtlState, 1u);
  }
  __syncwarp();
  const u64 slice_end = globaltimer_ns() + a.slice_ns;
  u32 pass = 0;
  bool stop = false;
  while (!stop) {
    u32 moved = 0;
    for (u32 base = 0; base < a.ninputs && !stop; base += 32) {
      const u32 i = base + lane;
      bool ready = false;
      if (i < a.ninputs) {
        const InS& s = c.in[i];
        const u64 u1 = ld_unit(s.ring + ((u32)s.seq & s.mask) * s.slot_bytes + kUnitBytes);
        ready = (u32)(u1 >> 32) == flag_of(s.seq);
      }
      u32 mask = __ballot_sync(0xffffffffu, ready);
      while (mask) {
        const u32 k = __ffs(mask) - 1;
        mask &= mask - 1;
        const u32 got = serve(a, c, base + k);
        if (got == ~0u) {
          stop = true;
          break;
        }
        moved += got;
      }
    }
    ++pass;
    if (!stop && (moved == 0 || pass % kReportEvery == 0)) {
      // credit reports: every channel this rank delivers whose gate is elsewhere
      for (u32 k = 0; k < a.nreporters; ++k) {
        const u32 ci = a.reporters[k];
        const u32 quarter = a.channels[ci].nslots / 4;
        report(a, c, ci, moved == 0 ? 1ull : (u64)(quarter ? quarter : 1));
      }
    }
    if (moved == 0 && pass % kChainEvery == 0) {
      if (lane == 0) publish_chains(a, c);
      __syncwarp();
    }
    if (pass % kControlEvery == 0) {
      u32 quit = 0;
      if (lane == 0) {
        if (ld_relaxed(a.control + kCtlStop) != 0u || globaltimer_ns() > slice_end) quit = 1;
        if (a.abort != nullptr && *a.abort != 0u) {
          fail(a, kErrAborted, 0xFFFFFFFFu, 0, 0);
          quit = 1;
        }
      }
      if (shfl32(quit)) stop = true;
    }
  }
  if (lane == 0) job.stop = 1;
  __syncwarp();
  named_barrier(1, blockDim.x);  // release the copying warps
  for (u32 i = lane; i < a.ninputs; i += 32) {  // for the next slice
    const InS& s = c.in[i];
    a.input_state[i] = InputState{s.seq, s.since, s.blocked, s.published};
  }
  for (u32 o = lane; o < a.noutputs; o += 32) a.output_state[o] = OutputState{c.out[o].seq, c.out[o].cache};
  if (lane == 0) {
    __threadfence_system();
    st_relaxed(a.control + kCtlState, 2u);
  }
}

}  // namespace impl

// Dynamic shared memory the agent needs.
__host__ __device__ constexpr unsigned int shared_bytes(unsigned int ninputs, unsigned int noutputs,
                                                        unsigned int nranks) {
  return (unsigned int)(sizeof(impl::InS) * ninputs + sizeof(impl::OutS) * noutputs + sizeof(route::Entry) * nranks);
}

}  // namespace router
}  // namespace circuslink
