// The nvshmem transport's library: NVSHMEM's bootstrap and memory for circuslink, host-initiated put / signal /
// quiet on a stream for Connections, and the proxy kernel that carries relays between gateways with no host in
// the loop (docs/architecture.md, "The nvshmem transport"). circuslink/transport/nvshmem.py builds it with nvcc
// -rdc against the nvidia-nvshmem-cu13 package at first use (cached by source hash) and loads it with ctypes.
// Without NVSHMEM's headers on the include path it compiles to nothing, so the package's compile check of every
// .cu file passes on machines without NVSHMEM.
//
// Why a proxy kernel: circuslink compiles user kernels and its forwarding agent with NVRTC, which does not link
// NVSHMEM's relocatable device library, so the agent cannot call nvshmem_put itself. It writes packets into its
// relay's out ring in the symmetric heap (local GPU memory) exactly as into any link ring; this kernel, built
// with nvcc -rdc, runs beside it on the gateway's GPU and moves them:
//   * one block per relay polls the out ring; for a batch of published packets of one kind (never past the ring's
//     end, only while the peer's in ring has room: packet - credit_from_peer < nslots) the block puts each bulk
//     payload into the same slot of the peer's in ring (nvshmemx_putmem_nbi_block), completes them (quiet), then
//     puts each slot's low-latency area, header included, and completes those: the header lands after its
//     payload, and a low-latency packet's units each carry their flag, as in every ring of the channel format;
//   * then it returns the slots to the agent (slot credits, then the in-order counter), as a reader does;
//   * it signals the agent's consumed count of its own in ring to the peer (nvshmemx_signal_op into the peer's
//     credit_from_peer) every eighth of a ring and whenever it has nothing to send: the peer's end-to-end credits.
//     The count is the in ring's credit counter and, past it, every packet whose slot credit the agent gave back
//     (agent_consumed): grid agents store the counter only when a call or grid session ends;
//   * closing (the host says so once this rank's agent has stopped): when its out ring is drained it signals
//     goodbye (1 + packets sent) to the peer; it is done when it has the peer's goodbye and every packet the
//     peer sent has arrived (and, with no agent left, been taken and dropped), reporting credits until then.
// The kernel runs in slices (ProxyArgs::slice_ns) that the host relaunches back to back, keeping its state in
// device memory, so that device-wide synchronizations elsewhere in the process return. Every wait is bounded: a
// packet that waits for room past the time-out, a corrupt header or the host's abort word ends the relay with an
// error code in the host-mapped control words and ERR_ABORTED in both rings' error records (the agents stop).
#include <circuslink/detail/sync.cuh>
#include <circuslink/detail/transport_types.cuh>

#if defined(__has_include)
#if __has_include(<nvshmem.h>) && __has_include(<nvshmemx.h>)
#define CIRCUSLINK_HAVE_NVSHMEM 1
#endif
#endif

#ifdef CIRCUSLINK_HAVE_NVSHMEM
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstring>

namespace {

using u32 = unsigned int;
using u64 = unsigned long long;
using circuslink::transport::ProxyArgs;
using circuslink::transport::RelayEntry;
using circuslink::transport::RelayState;
namespace t = circuslink::transport;
namespace d = circuslink::detail;

constexpr u32 kLlArea = 256;        // the low-latency area of a slot (32 units of 8 bytes)
constexpr u32 kLlPayload = 120;     // bytes a low-latency packet carries
constexpr u32 kKindBulk = 0x80000000u;
constexpr u32 kSizeMask = 0x00FFFFFFu;
constexpr u32 kErrAbortedRing = 4;  // the channel protocol's ERR_ABORTED
constexpr u32 kErrClaimedRing = 0xFFFFFFFFu;  // its ERR_CLAIMED: a record whose fields are being written
constexpr u32 kThreads = 256;
constexpr u32 kControlEvery = 64;   // passes between reads of the host-mapped control and abort words

__device__ __forceinline__ u32 flag_of(u64 seq) { return (u32)(seq & 0xFFFFFFFFull) | 1u; }

__device__ __forceinline__ unsigned char* slot(unsigned char* ring, const RelayEntry& r, u64 seq) {
  return ring + (seq % r.nslots) * (u64)r.slot_bytes;
}

// Whether packet `seq` of `ring` is published (its header and, for a low-latency packet, every unit it covers);
// its size-and-kind word in *word.
__device__ bool published(unsigned char* ring, const RelayEntry& r, u64 seq, u32* word) {
  const u32* w = reinterpret_cast<const u32*>(slot(ring, r, seq));
  const u32 flag = flag_of(seq);
  if (d::ld_acquire_sys(w + 3) != flag) return false;
  *word = d::ld_relaxed(w + 2);
  if (*word & kKindBulk) return true;
  const u32 units = ((*word & kSizeMask) + 3u) / 4u;
  for (u32 u = 0; u < units && u < 30u; ++u)
    if (d::ld_relaxed(w + 5 + 2 * u) != flag) return false;
  return true;
}

__device__ void record(const ProxyArgs& a, const RelayEntry& r, u32 relay, u32 code, u64 seq, u64 received) {
  if (atomicCAS(a.claim, 0u, 1u) == 0u) {  // device memory: host-mapped words get plain stores only
    a.control[t::kProxyErrRelay] = relay + 1u;
    a.control[t::kProxyErrSeqLo] = (u32)(seq & 0xFFFFFFFFull);
    a.control[t::kProxyErrSeqHi] = (u32)(seq >> 32);
    __threadfence_system();
    d::st_release_sys(a.control + t::kProxyError, code);
  }
  u32* errors[2] = {r.out_send_error, r.in_recv_error};
  const u64 seqs[2] = {seq, received};
  for (int k = 0; k < 2; ++k) {
    // claimed as the agents claim it (detail/channel_impl.cuh, record_error): the first failure wins
    if (atomicCAS(errors[k], 0u, kErrClaimedRing) != 0u) continue;
    errors[k][1] = 0u;
    errors[k][2] = (u32)(seqs[k] & 0xFFFFFFFFull);
    errors[k][3] = (u32)(seqs[k] >> 32);
    __threadfence_system();
    d::st_release_sys(errors[k], kErrAbortedRing);
  }
}

// My agent's consumed count of my in ring: its credit counter and, past it, every packet whose slot credit is back
// (docs/protocol.md, Credits). Every reader stores each packet's slot credit at once; the grid forms store the
// counter only when a call or grid session ends, so the counter alone would stop the peer one ring into a grid
// session. An earlier lap's slot credit never matches (flag_of(s - k nslots) != flag_of(s)); at most a ring ahead.
__device__ u64 agent_consumed(const RelayEntry& r, RelayState& st) {
  u64 done = d::ld_acquire_sys_u64(r.in_credit);
  done = done > st.consumed ? done : st.consumed;
  u32 k = 0;
  for (; k < r.nslots && d::ld_relaxed(r.in_slot_credits + done % r.nslots) == flag_of(done); ++k) ++done;
  if (k > 0) d::fence_acq_rel_sys();  // acquire: the agent's loads of those slots came before their credits
  st.consumed = done;
  return done;
}

struct Decision {
  u64 first;
  u32 count;
  u32 bulk;
  u32 exit;
  u32 sizes[64];  // payload bytes of each packet of the batch (batch <= 64)
};

}  // namespace

// One block per relay; see the file's comment.
extern "C" __global__ void __launch_bounds__(kThreads, 1) circuslink_nvshmem_proxy(ProxyArgs a) {
  const u32 b = blockIdx.x;
  if (b >= a.nrelays) return;
  const RelayEntry r = a.relays[b];
  RelayState& st = a.state[b];
  if (st.done) return;  // closed in an earlier slice
  __shared__ Decision dec;
  const u64 start = d::globaltimer_ns();
  u32 pass = 0;
  while (true) {
    if (threadIdx.x == 0) {
      dec.count = 0;
      dec.exit = 0;
      const bool control = (pass++ % kControlEvery) == 0;
      if (control) {
        if (a.control[t::kProxyError] != 0u || a.control[t::kProxyStop] != 0u ||
            d::globaltimer_ns() - start > a.slice_ns)
          dec.exit = 1;
        if (a.abort != nullptr && *a.abort != 0u) {
          record(a, r, b, t::kProxyErrAborted, st.sent, st.discarded);
          dec.exit = 1;
        }
      }
      const bool closing = a.control[t::kProxyClosing] != 0u, discard = a.control[t::kProxyDiscard] != 0u;
      // my in ring: with no agent left, take and drop what arrives, so the peer's last puts find room
      u64 consumed = agent_consumed(r, st);
      if (discard) {
        u32 word;
        u64 s = consumed > st.discarded ? consumed : st.discarded;
        while (published(r.in_slots, r, s, &word)) ++s;
        if (s > consumed) {
          d::st_release_sys_u64(r.in_credit, s);
          consumed = s;
        }
        st.discarded = s;
      }
      // my out ring: the next batch
      u32 word = 0;
      const u64 seq = st.sent;
      if (!dec.exit && published(r.out_slots, r, seq, &word)) {
        const u64 room_credit = d::ld_acquire_sys_u64(r.credit_from_peer);
        if (seq - room_credit >= r.nslots) {
          const u64 now = d::globaltimer_ns();
          if (st.blocked_since == 0) {
            st.blocked_since = now;
          } else if (a.timeout_ns != 0 && now - st.blocked_since > a.timeout_ns) {
            record(a, r, b, t::kProxyErrFull, seq, consumed);
            dec.exit = 1;
          }
        } else {
          st.blocked_since = 0;
          const u64 room = r.nslots - (seq - room_credit);
          const u64 to_end = r.nslots - seq % r.nslots;
          u64 most = r.batch < room ? r.batch : room;
          most = most < to_end ? most : to_end;
          most = most < 64 ? most : 64;
          const u32 bulk = (word & kKindBulk) ? 1u : 0u;
          u32 count = 0;
          u32 w = word;
          while (count < most && (count == 0 || published(r.out_slots, r, seq + count, &w)) &&
                 ((w & kKindBulk) ? 1u : 0u) == bulk) {
            const u32 n = w & kSizeMask;
            if (n < 1u || n > (bulk ? r.chunk : kLlPayload)) {
              record(a, r, b, t::kProxyErrHeader, seq + count, consumed);
              dec.exit = 1;
              count = 0;
              break;
            }
            dec.sizes[count++] = n;
          }
          dec.first = seq;
          dec.count = count;
          dec.bulk = bulk;
        }
      }
      // end-to-end credits: my agent's consumed count of my in ring, to the peer
      if (!dec.exit && consumed > st.reported &&
          (consumed - st.reported >= (r.nslots / 8u ? r.nslots / 8u : 1u) || dec.count == 0)) {
        nvshmemx_signal_op(reinterpret_cast<uint64_t*>(r.credit_at_peer), consumed, NVSHMEM_SIGNAL_SET, r.pe);
        st.reported = consumed;
      }
      // closing: goodbye once nothing is left to put (this rank's agent has stopped writing); done once the
      // peer's goodbye is here and everything it sent has arrived
      if (!dec.exit && closing && dec.count == 0) {
        if (st.bye == 0 && !published(r.out_slots, r, st.sent, &word)) {
          nvshmem_quiet();
          st.bye = st.sent + 1;
          nvshmemx_signal_op(reinterpret_cast<uint64_t*>(r.credit_at_peer) + 1, st.bye, NVSHMEM_SIGNAL_SET, r.pe);
        }
        const u64 peer_bye = d::ld_acquire_sys_u64(r.credit_from_peer + 1);
        if (st.bye != 0 && peer_bye != 0 && consumed >= peer_bye - 1) {
          nvshmem_quiet();
          dec.exit = 2;
        }
      }
    }
    __syncthreads();
    if (dec.exit) {
      if (dec.exit == 2 && threadIdx.x == 0) {
        __threadfence_system();
        st.done = 1;
      }
      return;
    }
    if (dec.count == 0) continue;
    // the payloads first, complete; then the low-latency areas (headers) of the same slots, complete
    if (dec.bulk) {
      for (u32 i = 0; i < dec.count; ++i) {
        const u64 s = dec.first + i;
        const size_t bytes = ((size_t)dec.sizes[i] + 15u) / 16u * 16u;
        nvshmemx_putmem_nbi_block(slot(r.peer_in_slots, r, s) + kLlArea, slot(r.out_slots, r, s) + kLlArea, bytes,
                                  r.pe);
      }
      nvshmem_quiet();
      __syncthreads();
    }
    for (u32 i = 0; i < dec.count; ++i) {
      const u64 s = dec.first + i;
      nvshmemx_putmem_nbi_block(slot(r.peer_in_slots, r, s), slot(r.out_slots, r, s), kLlArea, r.pe);
    }
    nvshmem_quiet();
    __syncthreads();
    if (threadIdx.x == 0) {  // the slots go back to the agent: slot credits, then the in-order counter
      const u64 upto = dec.first + dec.count;
      for (u64 s = dec.first; s < upto; ++s) d::st_relaxed(r.out_slot_credits + s % r.nslots, flag_of(s));
      __threadfence_system();
      d::st_release_sys_u64(r.out_credit, upto);
      st.sent = upto;
    }
    __syncthreads();
  }
}

extern "C" {

int circuslink_nvshmem_uid_size() { return (int)sizeof(nvshmemx_uniqueid_t); }

int circuslink_nvshmem_get_uid(void* out) {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  const int rc = nvshmemx_get_uniqueid(&id);
  std::memcpy(out, &id, sizeof id);
  return rc;
}

// Every rank of the job, with the unique id rank 0 made (the world's store carries it): no MPI bootstrap needed.
int circuslink_nvshmem_init(const void* uid, int rank, int npes) {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  std::memcpy(&id, uid, sizeof id);
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  const int rc = nvshmemx_set_attr_uniqueid_args(rank, npes, &id, &attr);
  if (rc != 0) return rc;
  return nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
}

void circuslink_nvshmem_finalize() { nvshmem_finalize(); }
int circuslink_nvshmem_my_pe() { return nvshmem_my_pe(); }

// Collective: a zeroed symmetric buffer (null when the heap is too small).
void* circuslink_nvshmem_malloc(unsigned long long nbytes) {
  void* p = nvshmem_malloc(nbytes);
  if (p != nullptr) cudaMemset(p, 0, nbytes);
  cudaDeviceSynchronize();
  nvshmem_barrier_all();
  return p;
}

void circuslink_nvshmem_free(void* p) { nvshmem_free(p); }  // collective

// `p` of PE `pe` as a pointer this process may load and store (null: not reachable by load/store).
void* circuslink_nvshmem_ptr(void* p, int pe) { return nvshmem_ptr(p, pe); }

int circuslink_nvshmem_put(void* dst, const void* src, unsigned long long nbytes, int pe, void* stream) {
  nvshmemx_putmem_on_stream(dst, src, nbytes, pe, static_cast<cudaStream_t>(stream));
  return (int)cudaGetLastError();
}

int circuslink_nvshmem_put_signal(void* dst, const void* src, unsigned long long nbytes, void* sig,
                                  unsigned long long value, int pe, void* stream) {
  nvshmemx_putmem_signal_on_stream(dst, src, nbytes, static_cast<uint64_t*>(sig), value, NVSHMEM_SIGNAL_SET, pe,
                                   static_cast<cudaStream_t>(stream));
  return (int)cudaGetLastError();
}

int circuslink_nvshmem_signal(void* sig, unsigned long long value, int pe, void* stream) {
  nvshmemx_signal_op_on_stream(static_cast<uint64_t*>(sig), value, NVSHMEM_SIGNAL_SET, pe,
                               static_cast<cudaStream_t>(stream));
  return (int)cudaGetLastError();
}

int circuslink_nvshmem_quiet(void* stream) {
  nvshmemx_quiet_on_stream(static_cast<cudaStream_t>(stream));
  return (int)cudaGetLastError();
}

// One slice of the proxy kernel on `stream`: `args` points at a ProxyArgs in host memory (copied by value).
int circuslink_nvshmem_proxy_launch(const void* args, void* stream) {
  ProxyArgs a;
  std::memcpy(&a, args, sizeof a);
  circuslink_nvshmem_proxy<<<a.nrelays, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return (int)cudaGetLastError();
}

int circuslink_nvshmem_proxy_args_bytes() { return (int)sizeof(ProxyArgs); }
int circuslink_nvshmem_relay_entry_bytes() { return (int)sizeof(RelayEntry); }

}  // extern "C"

#endif  // CIRCUSLINK_HAVE_NVSHMEM
