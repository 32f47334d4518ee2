// circuslink/detail/router_impl.cuh - the forwarding agent (docs/routing.md, "Forwarding").
//
// A grid of 1 + ncopy blocks per rank, resident for the job (a launch ends only when the host asks, kCtlYield, or
// after slice_ns; what it keeps between launches is in device memory: InputState, OutputState, ChannelState,
// CopyState).
//
// Block 0 routes. Its last warp is the keeper; every other warp (a routing warp) owns the inputs i with
// i % routers == warp and serves them in turn; an input's state (InS) lives in shared memory and only its warp
// touches it, so the per-packet path takes no lock:
//   - the poll is the packet: the warp loads the head slot's 256-byte low-latency area in one round (lane u:
//     unit u), the header's flags say whether it arrived, and a low-latency packet is already in the lanes'
//     registers when lane 0 has decided where it goes (where each destination goes, the input's own constants
//     and the output claims are in shared memory);
//   - cut-through: a low-latency packet is stored onward at once (one store instruction for the warp, new
//     flags, no fence); a bulk packet is handed to a copy block as a job (its output slot already claimed, so
//     the output ring's order is fixed at the decision); the warp goes on polling;
//   - bookkeeping after: the input's slots go back to its writer (credits) once the packets before them are
//     stored onward and their jobs done, after the burst; chain records between idle passes.
// A routing warp's pass is its inputs' polls and nothing else that waits on memory: the keeper warp owns no
// input and does what the routing warps' passes must not (a host-mapped read is a PCIe round trip, longer than
// a hop): it sends the end-to-end credit packets of the channels this rank delivers (every channel's board,
// every pass) and reads the host's stop, yield and abort words (every kControlNs). Routing warps that own no
// input wait at the launch's end barrier instead of spinning beside the ones that do.
// Outputs (link rings, relays) are shared by the warps: a slot is claimed by a compare-and-swap on the output's
// sequence number in shared memory, against the downstream credit cached beside it.
//
// Blocks 1..ncopy copy bulk packets: ticket t is copy block 1 + t % ncopy's, in a ring of njobs jobs (several
// per block: while a block copies one, the router posts the next). A copy block copies the payload (16-byte
// vectors, all of a 64 KiB packet's loads in flight at once), fences at the scope where the ranks live (.gpu
// when they share one GPU, kAgentGpuScope) and publishes the header itself. Without copy blocks (ncopy 0) the
// routing warp copies its own bulk packets.
//
// The agent never waits on an output: a head whose next buffer is full, or whose channel's receiver has not
// freed room (end-to-end credits), is left for the next pass, so one blocked head never holds up another input.
// Its only waits are bounded by timeout_ns: a low-latency packet's data units that lag their header, a job slot
// still being copied, the copy blocks' arrival. The cpu reference is channels/_router_cpu.py: the same decisions.
//
// Gateways (docs/scale.md): an output may be this rank's relay (Output::kind == kHopRelay: its out ring, which
// a transport carries to the peer gateway) and an input its in ring; the agent treats them as link rings (the
// same stores, flags and credits). The only decision they change: a packet whose next hop is its destination
// through a relay is forwarded into the relay, and the landing agent, on the destination itself, delivers it.
//
// What a long-blocked head waits on is published as a chain record (the input, the buffer it waits for, and
// that buffer's own chain read from the neighbour), so the host can name a stall or a cycle.
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
constexpr u32 kPend = 6;          // bulk jobs of one input in flight (its slots go back in order as they finish)
constexpr u32 kChainEvery = 16;   // idle passes between chain publications
constexpr u32 kCopyDepth = 8;     // 16-byte loads in flight per thread of a copy block
constexpr u64 kControlNs = 20000; // the keeper reads the host-mapped stop, yield and abort words this often
constexpr u32 kCopyAbortEvery = 1024;  // a waiting copy block's polls between reads of the host-mapped abort word
constexpr u32 kReportEvery = 8;   // passes between credit reports while busy (a block of one warp only: it keeps too)
constexpr u32 kKeeperNapNs = 500; // the keeper's pause after a pass that sent nothing

// An input's state, in shared memory (its warp's alone), with the input's constants the per-packet path needs.
struct InS {
  unsigned char* ring;
  u64 seq;              // next packet to take
  u64 freed;            // packets handed back to the writer
  u64 since;            // %globaltimer when its head last became blocked
  u64 gate;             // injection rings: the channel's gate as last read (a lower bound: it only rises)
  u64 pend_seq[kPend];  // the packet of each bulk job in flight, oldest at pend_head
  u64 pend_tick[kPend]; // its ticket
  u32 mask;             // nslots - 1 (an injection ring has its channel's geometry: the gate's window too)
  u32 slot_bytes;
  u32 chunk;
  u32 channel;          // an injection ring's routed channel; kNoChannel: a link ring
  u32 blocked;          // kBlk* | index, 0: not blocked
  u32 published;
  u32 pend_head;
  u32 npend;
};
struct OutS {
  u64 seq;      // next slot to write (claimed by compare-and-swap: every routing warp may write any output)
  u64 cache;    // the downstream consumed count last read (raised with atomicMax)
};
// channels/protocol.py sizes the dynamic shared memory with these (ROUTER_SHARED_PER_*)
static_assert(sizeof(InS) == kSharedPerInput && sizeof(OutS) == kSharedPerOutput && sizeof(u32) == kSharedPerRank,
              "router shared memory layout");
enum : u32 { kBlkGate = 0x80000000u, kBlkDeliver = 0x40000000u, kBlkOut = 0x20000000u, kBlkIndex = 0x0000FFFFu };
// The hop table (shared memory, a word per destination rank, from the routing table row at launch): the output a
// packet for that rank leaves by (kHopNone: none), its VC where the routed header keeps it (kVcMask), and whether
// a data packet for that rank is delivered here.
enum : u32 { kHopOut = 0x0000FFFFu, kHopNone = 0x0000FFFFu, kHopDeliver = 0x00010000u };
static_assert((kHopOut & kVcMask) == 0 && (kHopDeliver & (kVcMask | kHopOut)) == 0, "hop word fields overlap");

// Block 0's shared words beside the dynamic arrays.
struct Shared {
  u64 tick;      // the next copy ticket
  u32 quit;      // every warp leaves its loop
  u32 failed;    // the first error claimed the control words
};

struct Ctx {
  InS* in;
  OutS* out;
  u32* hop;       // nranks words (kHop*)
  Shared* sh;
  u32 warp;
  u32 routers;    // routing warps: 0 .. routers - 1
  u32 keeper;     // the keeper warp: the last (the only warp of a one-warp block is both)
};

// What lane 0 decided about an input's head packet.
enum : u32 { kActStop = 0, kActLL = 1, kActBulk = 2, kActTaken = 3, kActError = 4 };
struct Move {
  unsigned char* src;
  unsigned char* dst;
  u32 nb, route, word, flag, rewrite;
};

__device__ __forceinline__ u64 shfl64(u64 v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ u32 shfl32(u32 v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ u32 ld_shared_u32(const u32* p) { return *(const volatile u32*)p; }
__device__ __forceinline__ u64 ld_shared_u64(const u64* p) { return *(const volatile u64*)p; }
// A word another warp of this block stores (volatile): coherent within the block, so the SM's L1 may serve it.
__device__ __forceinline__ u64 ld_block_u64(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.cta.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Release / acquire at the scope where the agent's peers live (the ranks whose rings it reads and writes).
__device__ __forceinline__ void fence_scope(const Agent& a) {
  if (a.flags & kAgentGpuScope) circuslink::detail::fence_acq_rel_gpu();
  else circuslink::detail::fence_acq_rel_sys();
}

// Record the agent's first error in the host-mapped control words (the first caller claims them), the code
// last, after the details it covers; every warp of the router block then leaves.
__device__ void fail(const Agent& a, Ctx& c, u32 code, u32 input, u64 seq, u32 word) {
  using namespace circuslink::detail;
  if (atomicCAS(&c.sh->failed, 0u, 1u) == 0u && ld_relaxed(a.control + kCtlError) == 0u) {
    st_relaxed(a.control + kCtlInput, input);
    st_relaxed(a.control + kCtlSeq, (u32)seq);
    st_relaxed(a.control + kCtlWord, word);
    __threadfence_system();
    st_relaxed(a.control + kCtlError, code);
    __threadfence_system();
  }
  *(volatile u32*)&c.sh->quit = 1u;
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

// The receiver's in-order consumed count, from its slot credits on the board (any read form stores them), up to
// `delivered`. Only one warp per channel calls it: the keeper (first elsewhere) or the injection ring's warp.
__device__ u64 scan_board(const Channel& ch, ChannelState& st, u64 delivered) {
  u64 p = st.consumed;
  const u32 mask = ch.nslots - 1u;
  while (p < delivered && circuslink::detail::ld_relaxed(ch.board + ((u32)p & mask)) == circuslink::detail::flag_of(p))
    ++p;
  circuslink::detail::st_relaxed_u64(&st.consumed, p);  // the delivering warp reads it (decide)
  return p;
}

// The gate (the receiver's consumed count as known at first) is written by the warp of the input the credit
// packets arrive on and read by the warp of the injection ring: volatile both ways, raised only.
__device__ __forceinline__ u64 gate_of(const ChannelState& st) {
  return circuslink::detail::ld_relaxed_u64(&st.gate);
}
__device__ __forceinline__ void raise_gate(ChannelState& st, u64 v) {
  if (v > gate_of(st)) circuslink::detail::st_relaxed_u64(&st.gate, v);
}

// Claim the next slot of output o if the downstream ring has room; ~0 if not. Any routing warp may call it.
__device__ u64 claim_out(const Output& o, OutS& s) {
  u64 q = ld_shared_u64(&s.seq);
  while (true) {
    if (q >= ld_shared_u64(&s.cache) + o.nslots) {
      const u64 fresh = circuslink::detail::ld_relaxed_u64(o.credit);
      atomicMax(&s.cache, fresh);
      if (q >= fresh + o.nslots) return ~0ull;
    }
    const u64 seen = atomicCAS(&s.seq, q, q + 1);
    if (seen == q) return q;
    q = seen;
  }
}

// Whether a bulk packet of input s can be handed to a copy block now (a job slot is free and the input has
// room for one more job in flight); without copy blocks the warp copies it itself.
__device__ __forceinline__ bool job_room(const Agent& a, const Ctx& c, const InS& s) {
  if (a.ncopy == 0) return true;
  if (s.npend >= kPend) return false;
  const u64 t = ld_shared_u64(&c.sh->tick);
  return t < a.njobs || circuslink::detail::ld_relaxed_u64(&a.jobs[t % a.njobs].done) >= t - a.njobs + 1;
}

// The hop table's word for destination dst (docs/routing.md, "Forwarding"): the output of the routing table's
// (port, vc) where this rank has a link out there; a data packet is delivered here when it is at its destination
// (it crossed a relay into the receiver's own agent) or one mapped hop from it (a last hop through a relay goes
// into the relay like any other hop, and the landing agent delivers).
__device__ u32 hop_word(const Agent& a, u32 dst) {
  const u32 nports = a.vcs ? a.noutputs / a.vcs : 0u;
  const route::Entry e = a.entries[dst];
  const u32 o = (u32)e.port * a.vcs + e.vc;
  const bool port = e.port < nports;
  u32 w = port && a.outputs[o].ring != nullptr ? o | ((u32)e.vc << kVcShift) : (u32)kHopNone;
  if (dst == a.rank || (e.next == dst && !(port && a.outputs[o].kind == kHopRelay))) w |= kHopDeliver;
  return w;
}

// Lane 0: what to do with input i's head packet, whose header units u0, u1 the warp loaded (serve() saw their
// flags). Fills mv and advances the states it claims (the output slot, the delivery slot, the input's seq).
// kActStop: nothing to take now (blocked). Between the poll and the onward store of a forwarded packet it reads
// shared memory only (the input's constants, the hop table, the output's claim) and the output's row (L1).
__device__ u32 decide(const Agent& a, Ctx& c, u32 i, Move& mv, u64 u0, u64 u1, u64 u2, u64 u3) {
  using namespace circuslink::detail;
  InS& s = c.in[i];
  const u64 q = s.seq;
  unsigned char* slot = s.ring + ((u32)q & s.mask) * s.slot_bytes;
  const u32 flag = flag_of(q);
  const u32 route = (u32)u0, word = (u32)u1;
  const bool bulk = (word & kKindBulk) != 0, ctrl = (word & kCtrl) != 0;
  const u32 nb = word & kNbytesMask, dst = route >> 16, rid = route & 0xFFFFu;
  const bool inject = s.channel != kNoChannel;
  if (nb == 0 || nb > (bulk ? s.chunk : (u32)kLLPayload) || dst >= a.nranks || (word & 0x60000000u) ||
      (ctrl && nb != kCreditBytes) || (inject && (ctrl || (word & kVcMask)))) {
    fail(a, c, kErrHeader, i, q, word);
    return kActError;
  }
  if (bulk && !job_room(a, c, s)) return kActStop;  // a copy block frees a job soon: not a wait on a buffer
  if (inject && q >= s.gate + s.mask + 1u) {  // the gate as last read says no: read it again
    const u32 ci = s.channel;
    const Channel& ch = a.channels[ci];
    ChannelState& st = a.state[ci];
    if (ch.role & kRoleLast) raise_gate(st, scan_board(ch, st, st.delivered));  // first == last: the board is here
    s.gate = gate_of(st);
    if (q >= s.gate + s.mask + 1u) {
      block(s, kBlkGate | ci);
      return kActStop;
    }
  }
  if (ctrl && dst == a.rank) {  // a credit packet for a channel whose injection ring drains here
    const u32 ci = rid < a.nids ? a.channel_of_id[rid] : kNoChannel;
    if (ci == kNoChannel || !(a.channels[ci].role & kRoleFirst)) {
      fail(a, c, kErrChannel, i, q, rid);
      return kActError;
    }
    u64 lo = u2, hi = u3;
    if ((u32)(lo >> 32) != flag || (u32)(hi >> 32) != flag) {
      Deadline d = Deadline::after(a.timeout_ns, a.abort);
      while ((u32)(lo >> 32) != flag || (u32)(hi >> 32) != flag) {
        if (d.expired()) {
          fail(a, c, d.aborted() ? kErrAborted : kErrUnits, i, q, word);
          return kActError;
        }
        lo = ld_unit(slot + 2 * kUnitBytes);
        hi = ld_unit(slot + 3 * kUnitBytes);
      }
    }
    raise_gate(a.state[ci], (u64)(u32)lo | ((u64)(u32)hi << 32));
    s.seq = q + 1;
    unblock(a, i, s);
    return kActTaken;
  }
  const u32 hop = c.hop[dst];
  if (!ctrl && (hop & kHopDeliver)) {  // the last hop: straight into the channel's delivery ring
    const u32 ci = inject ? s.channel : (rid < a.nids ? a.channel_of_id[rid] : kNoChannel);
    if (ci == kNoChannel || !(a.channels[ci].role & kRoleLast)) {
      fail(a, c, kErrChannel, i, q, rid);
      return kActError;
    }
    const Channel& ch = a.channels[ci];
    ChannelState& st = a.state[ci];
    const u64 d = st.delivered;
    const u32 mask = ch.nslots - 1u;
    // Slot d is free when its previous packet was consumed: below the in-order count last scanned (a lower
    // bound: no load of the board, the usual case), else its slot credit on the board says so. The end-to-end
    // gate already reserved it; the check only turns a broken invariant into a stall instead of an overwrite.
    if (d >= ld_block_u64(&st.consumed) + ch.nslots &&
        ld_relaxed(ch.board + ((u32)d & mask)) != flag_of(d - ch.nslots)) {
      block(s, kBlkDeliver | ci);
      return kActStop;
    }
    mv.dst = ch.ring + ((u32)d & mask) * ch.slot_bytes;
    mv.flag = flag_of(d);
    mv.rewrite = rewrites_all(d, ch.nslots) ? 1u : 0u;
    mv.word = nb | (bulk ? (u32)kKindBulk : 0u);
    st_relaxed_u64(&st.delivered, d + 1);  // the keeper reads it (the credit reports)
  } else {
    const u32 o = hop & kHopOut;
    if (o == kHopNone) {
      fail(a, c, kErrNoLink, i, q, dst);
      return kActError;
    }
    const Output& out = a.outputs[o];
    const u64 ss = claim_out(out, c.out[o]);
    if (ss == ~0ull) {
      block(s, kBlkOut | o);
      return kActStop;
    }
    mv.dst = out.ring + ((u32)ss & (out.nslots - 1u)) * out.slot_bytes;
    mv.flag = flag_of(ss);
    mv.rewrite = rewrites_all(ss, out.nslots) ? 1u : 0u;
    mv.word = nb | (bulk ? (u32)kKindBulk : 0u) | (ctrl ? (u32)kCtrl : 0u) | (hop & kVcMask);
  }
  mv.src = slot;
  mv.nb = nb;
  mv.route = route;
  s.seq = q + 1;
  unblock(a, i, s);
  return bulk ? kActBulk : kActLL;
}

// Copy a bulk payload (16-byte vectors, zero padding included) with `count` threads, `depth` loads in flight
// each; then, on a rewrite lap, re-flag the slot's low-latency units.
template <u32 kDepth>
__device__ __forceinline__ void copy_payload(const unsigned char* src_slot, unsigned char* dst_slot, u32 nb,
                                             u32 rewrite, u32 flag, u32 t, u32 count) {
  using namespace circuslink::detail;
  const unsigned char* src = src_slot + kLLAreaBytes;
  unsigned char* dst = dst_slot + kLLAreaBytes;
  const u32 nvec = (nb + 15u) / 16u;
  u32 v = t;
  for (; v + (kDepth - 1) * count < nvec; v += kDepth * count) {
    U4 w[kDepth];
#pragma unroll
    for (u32 j = 0; j < kDepth; ++j) w[j] = ld_cg_v4(src + 16ull * (v + j * count));
#pragma unroll
    for (u32 j = 0; j < kDepth; ++j) st_v4(dst + 16ull * (v + j * count), w[j]);
  }
  for (; v < nvec; v += count) st_v4(dst + 16ull * v, ld_cg_v4(src + 16ull * v));
  if (rewrite)
    for (u32 u = 2 + t; u < kLLUnits; u += count) st_unit(dst_slot + u * kUnitBytes, 0u, flag);
}

// Lane 0: hand a claimed bulk packet of input i to its copy block (a ticket, the job, one fence, posted).
// The fence both acquires the payload the upstream writer released with the header and releases the job.
__device__ bool post_job(const Agent& a, Ctx& c, u32 i, const Move& mv) {
  using namespace circuslink::detail;
  InS& s = c.in[i];
  const u64 t = atomicAdd(&c.sh->tick, 1ull);
  Job* j = a.jobs + (t % a.njobs);
  if (t >= a.njobs && ld_relaxed_u64(&j->done) < t - a.njobs + 1) {  // rare: job_room saw it free, another warp won
    Deadline d = Deadline::after(a.timeout_ns, a.abort);
    while (ld_relaxed_u64(&j->done) < t - a.njobs + 1) {
      if (d.expired()) {
        fail(a, c, d.aborted() ? kErrAborted : kErrCopy, i, s.seq - 1, (u32)t);
        return false;
      }
    }
  }
  j->src = mv.src;
  j->dst = mv.dst;
  j->nb = mv.nb;
  j->route = mv.route;
  j->word = mv.word;
  j->flag = mv.flag;
  j->rewrite = mv.rewrite;
  fence_scope(a);
  st_relaxed_u64(&j->posted, t + 1);
  const u32 k = (s.pend_head + s.npend) % kPend;
  s.pend_seq[k] = s.seq - 1;
  s.pend_tick[k] = t;
  ++s.npend;
  return true;
}

// Warp (all lanes): copy a bulk packet itself (no copy blocks), then publish its header after one fence.
__device__ void copy_here(const Agent& a, const Move& mv) {
  using namespace circuslink::detail;
  fence_scope(a);  // acquire: the payload loads follow the header the warp saw
  copy_payload<4>(mv.src, mv.dst, mv.nb, mv.rewrite, mv.flag, lane_id(), 32);
  __syncwarp();
  if (lane_id() == 0) {
    fence_scope(a);
    st_header(mv.dst, mv.route, mv.flag, mv.word);
  }
  __syncwarp();
}

// Warp: re-flag one low-latency packet into its output slot (lane u: unit u, already loaded as `v` by the
// poll), waiting (bounded) for data units that lag their header.
__device__ bool ll_move(const Agent& a, Ctx& c, u32 i, u64 q, const Move& mv, u64 v) {
  using namespace circuslink::detail;
  const u32 lane = lane_id();
  const u32 want = flag_of(q);
  const bool mine = lane >= 2 && (lane - 2) * 4 < mv.nb;
  bool ok = true;
  if (mine && (u32)(v >> 32) != want) {
    Deadline d = Deadline::after(a.timeout_ns, a.abort);
    while (true) {
      v = ld_unit(mv.src + lane * kUnitBytes);
      if ((u32)(v >> 32) == want) break;
      if (d.expired()) {
        fail(a, c, d.aborted() ? kErrAborted : kErrUnits, i, q, mv.word);
        ok = false;
        break;
      }
    }
  }
  if (!__all_sync(0xffffffffu, ok)) return false;
  // One store instruction for the warp: the header and the data leave together (stored lane by lane in program
  // order, a header could reach the next agent before its data, which then polls its units again).
  const u32 w = lane == 0 ? mv.route : lane == 1 ? mv.word : mine ? (u32)v : 0u;
  if (lane < 2 || mine || mv.rewrite) st_unit(mv.dst + lane * kUnitBytes, w, mv.flag);
  return true;
}

// Warp: hand input i's packets that are stored onward (and whose jobs are done) back to their writer: slot
// credits for injection rings, and the in-order count. With `wait`, first wait (bounded) for every job.
__device__ bool give_back(const Agent& a, Ctx& c, u32 i, bool wait) {
  using namespace circuslink::detail;
  u64 from = 0, to = 0;
  bool ok = true;
  if (lane_id() == 0) {
    InS& s = c.in[i];
    Deadline d = Deadline::after(a.timeout_ns, a.abort);
    while (s.npend) {
      const u64 t = s.pend_tick[s.pend_head];
      if (ld_relaxed_u64(&a.jobs[t % a.njobs].done) < t + 1) {
        if (!wait) break;
        if (d.expired()) {
          fail(a, c, d.aborted() ? kErrAborted : kErrCopy, i, s.pend_seq[s.pend_head], (u32)t);
          ok = false;
          break;
        }
        continue;
      }
      s.pend_head = (s.pend_head + 1) % kPend;
      --s.npend;
    }
    from = s.freed;
    to = s.npend ? s.pend_seq[s.pend_head] : s.seq;
    s.freed = to;
  }
  from = shfl64(from);
  to = shfl64(to);
  ok = shfl32(ok ? 1u : 0u) != 0u;
  if (to == from) return ok;
  const Input& in = a.inputs[i];
  if (in.slot_credit != nullptr)
    for (u64 q = from + lane_id(); q < to; q += 32) st_relaxed(in.slot_credit + ((u32)q & (in.nslots - 1u)), flag_of(q));
  __syncwarp();
  if (lane_id() == 0) st_relaxed_u64(in.credit, to);
  return ok;
}

__device__ __forceinline__ u64 quarter_ring(const Channel& ch) { return ch.nslots / 4 ? ch.nslots / 4 : 1; }

// Whether a credit report is due (channels/_router_cpu.py: report_due, the same rule): the count moved by a
// quarter ring since the last report, or it moved at all while first may be out of room (every packet the last
// report lets it drain has been delivered here). So a sender that waits for room always gets it, and a channel
// with room to spare (a pingpong) sends a credit packet every quarter ring, not one beside every message.
__device__ __forceinline__ bool report_due(u64 count, u64 reported, u64 delivered, const Channel& ch) {
  return count > reported && (count - reported >= quarter_ring(ch) || delivered - reported >= ch.nslots);
}

// The keeper warp: send channel ci's consumed count `count` to its first rank (kRoleLast, first elsewhere), if the
// output toward it has room. Never waits: without room, the next pass tries.
__device__ bool send_credit(const Agent& a, Ctx& c, u32 ci, u64 count) {
  using namespace circuslink::detail;
  const u32 lane = lane_id();
  u64 slot = 0;
  u32 go = 0, flag = 0, rewrite = 0, route = 0, vc = 0;
  if (lane == 0) {
    const Channel& ch = a.channels[ci];
    const u32 hop = c.hop[ch.first];
    const u32 o = hop & kHopOut;
    if (o != kHopNone) {
      const Output& out = a.outputs[o];
      const u64 ss = claim_out(out, c.out[o]);
      if (ss != ~0ull) {
        slot = (u64)(out.ring + ((u32)ss & (out.nslots - 1u)) * out.slot_bytes);
        flag = flag_of(ss);
        rewrite = rewrites_all(ss, out.nslots) ? 1u : 0u;
        route = (ch.route & 0xFFFFu) | (ch.first << 16);
        vc = hop & kVcMask;
        a.state[ci].reported = count;
        go = 1;
      }
    }
  }
  if (!shfl32(go)) return false;
  unsigned char* p = reinterpret_cast<unsigned char*>(shfl64(slot));
  flag = shfl32(flag);
  rewrite = shfl32(rewrite);
  route = shfl32(route);
  vc = shfl32(vc);
  const u32 w = lane == 0 ? route : lane == 1 ? (u32)kCreditBytes | kCtrl | vc : lane == 2 ? (u32)count
              : lane == 3 ? (u32)(count >> 32) : 0u;
  if (lane < 4 || rewrite) st_unit(p + lane * kUnitBytes, w, flag);  // one store instruction, as ll_move
  return true;
}

// The keeper warp: the credit reports of the channels this rank delivers whose first is elsewhere, 32 channels
// a round (lane k scans channel k's board), then a credit packet for each one whose report is due. True when
// it sent one.
__device__ bool report_all(const Agent& a, Ctx& c) {
  using namespace circuslink::detail;
  bool sent = false;
  for (u32 base = 0; base < a.nreporters; base += 32) {
    const u32 k = base + lane_id();
    u32 ci = 0;
    u64 count = 0;
    bool due = false;
    if (k < a.nreporters) {
      ci = a.reporters[k];
      const Channel& ch = a.channels[ci];
      ChannelState& st = a.state[ci];
      const u64 delivered = ld_relaxed_u64(&st.delivered);  // the arrival input's warp writes it
      count = scan_board(ch, st, delivered);
      due = report_due(count, st.reported, delivered, ch);
    }
    for (u32 m = __ballot_sync(0xffffffffu, due); m != 0u; m &= m - 1u) {
      const int j = __ffs(m) - 1;
      sent |= send_credit(a, c, __shfl_sync(0xffffffffu, ci, j), __shfl_sync(0xffffffffu, count, j));
    }
  }
  return sent;
}

// Warp: serve input i: up to kBurst packets, each polled in one load of its low-latency area and stored onward
// (or posted to a copy block) before anything else; then the slots go back. Returns the packets taken, or ~0u
// on an agent error.
__device__ u32 serve(const Agent& a, Ctx& c, u32 i) {
  using namespace circuslink::detail;
  const u32 lane = lane_id();
  u32 done = 0;
  bool error = false;
  while (done < kBurst) {
    Move mv{};
    u32 act = kActStop;
    __syncwarp();
    const InS& s = c.in[i];
    const u64 q = s.seq;  // every lane reads its warp's own state
    const u64 unit = ld_unit(s.ring + ((u32)q & s.mask) * s.slot_bytes + lane * kUnitBytes);
    const u64 u0 = __shfl_sync(0xffffffffu, unit, 0), u1 = __shfl_sync(0xffffffffu, unit, 1);
    if ((u32)(u0 >> 32) != flag_of(q) || (u32)(u1 >> 32) != flag_of(q)) break;  // not arrived: the common miss
    const u64 u2 = __shfl_sync(0xffffffffu, unit, 2), u3 = __shfl_sync(0xffffffffu, unit, 3);
    if (lane == 0) {
      act = decide(a, c, i, mv, u0, u1, u2, u3);
      if (act == kActBulk && a.ncopy != 0 && !post_job(a, c, i, mv)) act = kActError;
    }
    act = shfl32(act);
    if (act == kActStop) break;
    if (act == kActError) {
      error = true;
      break;
    }
    ++done;
    if (act == kActLL || (act == kActBulk && a.ncopy == 0)) {
      mv.src = reinterpret_cast<unsigned char*>(shfl64((u64)mv.src));
      mv.dst = reinterpret_cast<unsigned char*>(shfl64((u64)mv.dst));
      mv.nb = shfl32(mv.nb);
      mv.route = shfl32(mv.route);
      mv.word = shfl32(mv.word);
      mv.flag = shfl32(mv.flag);
      mv.rewrite = shfl32(mv.rewrite);
      if (act == kActBulk) {
        copy_here(a, mv);
      } else if (!ll_move(a, c, i, q, mv, unit)) {
        error = true;
        break;
      }
    }
  }
  if (done == 0 && !error) {
    if (c.in[i].npend && !give_back(a, c, i, false)) error = true;  // jobs finished since the last visit
    return error ? ~0u : 0u;
  }
  if (!give_back(a, c, i, false)) error = true;
  return error ? ~0u : done;
}

// Lane 0: publish what each of this warp's inputs blocked longer than report_after_ns waits on (idle passes; the
// clock is read only when one of them is blocked).
__device__ void publish_chains(const Agent& a, Ctx& c) {
  using namespace circuslink::detail;
  u64 now = 0;
  for (u32 i = c.warp; i < a.ninputs; i += c.routers) {
    InS& s = c.in[i];
    if (!s.blocked) continue;
    if (now == 0) now = globaltimer_ns();
    if (now - s.since < a.report_after_ns) continue;
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

// Blocks 1..ncopy: copy the jobs of tickets t with t % ncopy == blockIdx.x - 1, in ticket order, until the
// router block ends the launch (CopyState::launches moves) or the agent fails.
__device__ void run_copy(const Agent& a) {
  using namespace circuslink::detail;
  __shared__ Job job;
  __shared__ u64 first;
  __shared__ u32 launch, leave;
  const u32 b = blockIdx.x - 1, C = a.ncopy, t0 = threadIdx.x, T = blockDim.x;
  if (t0 == 0) {
    launch = ld_relaxed(&a.copy->launches);   // stable until this block has arrived
    const u64 base = ld_relaxed_u64(&a.copy->next);
    first = base + (u64)((b + C - (u32)(base % C)) % C);
    __threadfence();
    atomicAdd(&a.copy->arrived, 1u);
  }
  __syncthreads();
  for (u64 t = first;; t += C) {
    Job* j = a.jobs + (t % a.njobs);
    if (t0 == 0) {
      u32 spins = 0;
      leave = 0;
      while (ld_relaxed_u64(&j->posted) != t + 1) {
        // the host-mapped abort word (a PCIe round trip) only every kCopyAbortEvery polls: the router block's
        // keeper reads it too, and its failure reaches the copy blocks through `dead` and `launches`
        if (++spins % 64 == 0 && (ld_relaxed(&a.copy->launches) != launch || ld_relaxed(&a.copy->dead) ||
                                  (spins % kCopyAbortEvery == 0 && a.abort != nullptr && *a.abort != 0u))) {
          // the router block ends a launch only once every ticket it took is done: t was never taken
          leave = ld_relaxed_u64(&j->posted) != t + 1;
          if (leave) break;
        }
      }
      if (!leave) {
        fence_scope(a);  // acquire the job, and through the router's fence the payload
        job.src = *(unsigned char* const volatile*)&j->src;
        job.dst = *(unsigned char* const volatile*)&j->dst;
        job.nb = *(const volatile u32*)&j->nb;
        job.route = *(const volatile u32*)&j->route;
        job.word = *(const volatile u32*)&j->word;
        job.flag = *(const volatile u32*)&j->flag;
        job.rewrite = *(const volatile u32*)&j->rewrite;
      }
    }
    __syncthreads();
    if (leave) return;
    copy_payload<kCopyDepth>(job.src, job.dst, job.nb, job.rewrite, job.flag, t0, T);
    __syncthreads();  // every payload store of the block before thread 0's release
    if (t0 == 0) {
      fence_scope(a);
      st_header(job.dst, job.route, job.flag, job.word);
      st_relaxed_u64(&j->done, t + 1);
    }
  }
}

// The keeper warp's pass: every credit report that is due, and every kControlNs the host's words. True when it
// sent a credit packet (else it naps: nothing it watches is on a packet's path).
__device__ bool keep(const Agent& a, Ctx& c, u64 slice_end, u64& next_control) {
  using namespace circuslink::detail;
  const bool sent = report_all(a, c);
  if (lane_id() == 0) {
    const u64 now = globaltimer_ns();
    if (now >= next_control) {
      next_control = now + kControlNs;
      // three host-mapped loads issued back to back (none waits for another's value): one PCIe round trip
      const u32 stop = ld_relaxed(a.control + kCtlStop), yield = ld_relaxed(a.control + kCtlYield);
      const u32 aborted = a.abort != nullptr ? *a.abort : 0u;
      if (stop != 0u || yield != 0u || now > slice_end) *(volatile u32*)&c.sh->quit = 1u;
      if (aborted != 0u) fail(a, c, kErrAborted, 0xFFFFFFFFu, 0, 0);
    }
  }
  __syncwarp();
  return sent;
}

// The agent: call from every thread of every block (blockDim.x a multiple of 32; block 0 routes with
// shared_bytes(ninputs, noutputs, nranks) bytes of dynamic shared memory, blocks 1..ncopy copy).
__device__ void run(const Agent& a, unsigned char* smem) {
  using namespace circuslink::detail;
  if (blockIdx.x != 0) {
    if (blockIdx.x <= a.ncopy) run_copy(a);
    return;
  }
  __shared__ Shared sh;
  __shared__ u32 launch;
  Ctx c;
  c.in = reinterpret_cast<InS*>(smem);
  c.out = reinterpret_cast<OutS*>(smem + sizeof(InS) * a.ninputs);
  c.hop = reinterpret_cast<u32*>(smem + sizeof(InS) * a.ninputs + sizeof(OutS) * a.noutputs);
  c.sh = &sh;
  c.warp = threadIdx.x / 32;
  const u32 warps = blockDim.x / 32;
  c.routers = warps > 1 ? warps - 1 : 1;
  c.keeper = warps - 1;
  const u32 lane = lane_id();
  for (u32 i = threadIdx.x; i < a.ninputs; i += blockDim.x) {  // the state the previous launch left
    const Input& in = a.inputs[i];
    const InputState& p = a.input_state[i];
    InS& s = c.in[i];
    s.ring = in.ring;
    s.seq = s.freed = p.seq;  // a launch ends with every job done and every slot handed back
    s.since = p.since;
    s.gate = 0;  // read again at the first packet
    s.mask = in.nslots - 1u;
    s.slot_bytes = in.slot_bytes;
    s.chunk = in.chunk;
    s.channel = in.kind == kInInject ? in.channel : (u32)kNoChannel;
    s.blocked = p.blocked;
    s.published = p.published;
    s.pend_head = s.npend = 0;
  }
  for (u32 o = threadIdx.x; o < a.noutputs; o += blockDim.x)
    c.out[o] = OutS{a.output_state[o].seq, a.output_state[o].cache};
  for (u32 r = threadIdx.x; r < a.nranks; r += blockDim.x) c.hop[r] = hop_word(a, r);
  if (threadIdx.x == 0) {
    sh.tick = a.ncopy ? ld_relaxed_u64(&a.copy->next) : 0ull;
    sh.quit = 0;
    sh.failed = 0;
    launch = a.ncopy ? ld_relaxed(&a.copy->launches) : 0u;
    st_relaxed(a.control + kCtlState, 1u);
  }
  __syncthreads();
  const u64 slice_end = a.slice_ns ? globaltimer_ns() + a.slice_ns : ~0ull;
  const bool routes = c.warp < c.routers && c.warp < a.ninputs;  // a routing warp that owns an input
  const bool keeps = c.warp == c.keeper;
  u64 next_control = 0;  // the keeper reads the host's words at once
  u32 pass = 0;
  while ((routes || keeps) && !ld_shared_u32(&sh.quit)) {
    u32 moved = 0;
    if (routes) {
      for (u32 i = c.warp; i < a.ninputs; i += c.routers) {
        const u32 got = serve(a, c, i);
        if (got == ~0u) break;  // fail() set quit
        moved += got;
      }
      if (ld_shared_u32(&sh.quit)) break;
      ++pass;
      if (moved == 0 && pass % kChainEvery == 0) {
        if (lane == 0) publish_chains(a, c);
        __syncwarp();
      }
    }
    if (keeps && (!routes || moved == 0 || pass % kReportEvery == 0)) {
      if (!keep(a, c, slice_end, next_control) && !routes) __nanosleep(kKeeperNapNs);
    }
  }
  // The end of a launch: every job done and every slot handed back, then the state for the next launch.
  if (c.warp < c.routers)
    for (u32 i = c.warp; i < a.ninputs; i += c.routers) give_back(a, c, i, sh.failed == 0);
  __syncthreads();
  for (u32 i = threadIdx.x; i < a.ninputs; i += blockDim.x) {
    const InS& s = c.in[i];
    a.input_state[i] = InputState{s.seq, s.since, s.blocked, s.published};
  }
  for (u32 o = threadIdx.x; o < a.noutputs; o += blockDim.x)
    a.output_state[o] = OutputState{c.out[o].seq, c.out[o].cache};
  if (threadIdx.x == 0) {
    if (a.ncopy) {
      // Every copy block of this launch must have started before the launch ends (a block that started later
      // would wait for the next launch, which waits for it): bounded, and a failure leaves them all at once.
      const u32 want = a.ncopy * (launch + 1u);
      Deadline d = Deadline::after(a.timeout_ns, a.abort);
      while (ld_relaxed(&a.copy->arrived) < want) {
        if (d.expired()) {
          fail(a, c, d.aborted() ? kErrAborted : kErrCopy, 0xFFFFFFFFu, 0, a.ncopy);
          break;
        }
      }
      if (sh.failed) st_relaxed(&a.copy->dead, 1u);
      st_relaxed_u64(&a.copy->next, ld_shared_u64(&sh.tick));
      __threadfence();
      st_relaxed(&a.copy->launches, launch + 1u);
    }
    __threadfence_system();
    st_relaxed(a.control + kCtlState, 2u);
  }
}

}  // namespace impl

// Dynamic shared memory the router block needs.
__host__ __device__ constexpr unsigned int shared_bytes(unsigned int ninputs, unsigned int noutputs,
                                                        unsigned int nranks) {
  return (unsigned int)(sizeof(impl::InS) * ninputs + sizeof(impl::OutS) * noutputs + sizeof(impl::u32) * nranks);
}

}  // namespace router
}  // namespace circuslink
