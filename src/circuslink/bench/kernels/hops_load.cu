// The many-to-many load of circuslink bench hops --load, on the public device API only: every rank sends to
// every other at once over the channels of an all-to-all opened on a topology (direct to neighbours, routed
// beyond), with the number of messages per channel drawn by the host from a seeded random destination pattern.
//
// One warp per block, all in one launch: the rank's channel ends (sends first, then receives) are e = 0 ..
// nsend + nrecv - 1, and warp b serves ends b, b + G, b + 2G, ... (G = gridDim.x: as many warps as the rank may
// have resident beside its forwarding agent, channels.max_blocks; the host sizes it). A warp with one end makes
// the blocking calls; a warp with several visits them in turn with the try calls (false at once, nothing moved,
// when the call would wait), so no end waits on another end of its own warp and every end of every rank runs
// at once. Word k of message m on the channel src -> dst is load_word(seed, src << 16 | dst, m, k)
// (little-endian; a message's last word is cut to its length): the sender computes it, the receiver recomputes
// it and counts every wrong byte.
//
// The handshake before the clock: each sending end first writes a 4-byte ready word; each receiving end reads
// its ready word and counts it in sync[0]. The warp that counts the last one (every peer's kernel is running)
// records times[0] and opens the gate (sync[1]) that the sending ends wait on; the rank's last end to finish
// (sync[2]) records times[1]. The host takes the slowest rank's times[1] - times[0].
//
// Nothing hangs: an end with no progress for timeout_ns (0: none) makes the blocking call, which goes on or
// times out recording the error that names the end (an end at a gate that never opened stops unrecorded); once a
// warp has such a failure its other stalled ends stop without a call. sync: 3 zeroed u32s. bad: a zeroed u64
// (wrong bytes). status: set to 0 when an end stops. progress (zeroed) and since: one word of each an end.
#include <circuslink/channel.cuh>
#include <circuslink/warp_ends.cuh>

using Handle = circuslink::detail::ChannelHandle;
using Ends = circuslink::WarpEnds<unsigned char>;
using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;
using circuslink::detail::ld_relaxed;
using circuslink::detail::st_relaxed;

namespace {

constexpr unsigned int kReady = 0x4C4F4144u;  // "LOAD"
constexpr unsigned int kStopped = 0x80000000u;  // in progress[e]: the end stopped (stalled or failed)

// The payload's word k (the host's reference: circuslink.bench.hops.load_payload).
__device__ __forceinline__ unsigned int load_word(unsigned int seed, unsigned int pair, unsigned int m,
                                                  unsigned int k) {
  unsigned int x = seed ^ (pair * 0x9E3779B1u) ^ (m * 0x85EBCA77u) ^ (k * 0xC2B2AE3Du);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  x *= 0x297A2D39u;
  x ^= x >> 15;
  return x;
}

__device__ __forceinline__ unsigned int wrong_bytes(unsigned int x) {
  return (x & 0xFFu ? 1u : 0u) + (x & 0xFF00u ? 1u : 0u) + (x & 0xFF0000u ? 1u : 0u) + (x & 0xFF000000u ? 1u : 0u);
}

// Every lane: message m of the pair into buf.
__device__ __forceinline__ void stage(unsigned int* buf, unsigned int seed, unsigned int pair, unsigned int m,
                                      unsigned int nwords) {
  for (unsigned int k = threadIdx.x & 31u; k < nwords; k += 32) buf[k] = load_word(seed, pair, m, k);
  __syncwarp();
}

// Whether the rank's gate is open (lane 0's load, the same answer on every lane).
__device__ __forceinline__ bool gate_open(const unsigned int* sync) {
  return __shfl_sync(0xffffffffu, (threadIdx.x & 31u) == 0 ? ld_relaxed(&sync[1]) : 0u, 0) != 0u;
}

// Lane 0 counts an end done (or stopped); the rank's last stops the clock.
__device__ __forceinline__ void finish(unsigned int lane, unsigned int* done, unsigned int ends,
                                       unsigned long long* times) {
  if (lane == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) + 1 == ends) times[1] = circuslink::detail::globaltimer_ns();
  }
}

}  // namespace

extern "C" __global__ void load_many_to_many(const Handle* sends, const unsigned int* send_peers,
                                             const unsigned int* send_counts, unsigned int nsend,
                                             const Handle* recvs, const unsigned int* recv_peers,
                                             const unsigned int* recv_counts, unsigned int nrecv, unsigned int rank,
                                             unsigned int nbytes, unsigned int seed, unsigned int* scratch,
                                             unsigned int scratch_words, unsigned int* sync,
                                             unsigned long long timeout_ns, unsigned long long* times,
                                             unsigned long long* bad, int* status, unsigned int* progress,
                                             unsigned long long* since) {
  if (threadIdx.x >= 32) return;
  const unsigned int lane = threadIdx.x, ends = nsend + nrecv;
  const unsigned int nwords = (nbytes + 3) / 4;
  const bool alone = gridDim.x >= ends;  // a warp an end: the blocking calls, as fast as the channel goes
  unsigned long long now = Ends::now_ns();
  for (unsigned int e = blockIdx.x; e < nsend; e += gridDim.x) {
    if (lane == 0) scratch[(unsigned long long)e * scratch_words] = kReady;  // step 0: the ready word
  }
  for (unsigned int e = blockIdx.x; e < ends; e += gridDim.x) {
    if (lane == 0) since[e] = now;
  }
  __syncwarp();
  Ends visits;  // the end visited last stays open (circuslink/warp_ends.cuh)
  bool failed = false;  // a call of this warp failed, its error recorded for the host
  unsigned long long wrong = 0;
  for (bool pending = true; pending;) {
    pending = false;
    now = Ends::now_ns();
    for (unsigned int e = blockIdx.x; e < ends; e += gridDim.x) {
      const bool sender = e < nsend;
      const unsigned int j = sender ? e : e - nsend;
      const unsigned int count = sender ? send_counts[j] : recv_counts[j];
      const unsigned int step = progress[e];  // 0: the ready word, 1 + m: message m
      if (step > count) continue;  // done, or stopped (kStopped)
      pending = true;
      const bool stalled = timeout_ns != 0 && now - since[e] >= timeout_ns;
      const bool gated = sender && step > 0 && !gate_open(sync);
      unsigned int* buf = scratch + (unsigned long long)e * scratch_words;
      bool moved = false;
      bool stop = stalled && (failed || gated);  // already reported, or a gate that never opened
      const bool block = !stop && !gated && (alone || stalled);
      if (!stop && !gated) {
        const unsigned int n = step == 0 ? 4u : nbytes;
        unsigned char* bytes = reinterpret_cast<unsigned char*>(buf);
        moved = sender ? visits.write(Tx{sends[j]}, e, bytes, n, block) : visits.read(Rx{recvs[j]}, e, bytes, n, block);
        // a blocking call that gave up, or a try call that found misuse: recorded either way
        stop = !moved && (block || (sender ? Ends::failed(Tx{sends[j]}) : Ends::failed(Rx{recvs[j]})));
        failed = failed || stop;
      }
      if (moved) {
        const unsigned int pair = sender ? rank << 16 | send_peers[j] : recv_peers[j] << 16 | rank;
        if (sender && step < count) {
          stage(buf, seed, pair, step, nwords);  // the write copied buf into the ring: message `step` next
        } else if (!sender && step == 0) {
          if (lane == 0 && buf[0] != kReady) wrong += 4;
          if (lane == 0 && atomicAdd(&sync[0], 1u) + 1 == nrecv) {
            times[0] = circuslink::detail::globaltimer_ns();
            __threadfence();
            st_relaxed(&sync[1], 1u);
          }
        } else if (!sender) {
          for (unsigned int k = lane; k < nwords; k += 32) {
            const unsigned int left = nbytes - 4 * k;
            const unsigned int mask = left >= 4 ? 0xFFFFFFFFu : (1u << (8 * left)) - 1u;
            wrong += wrong_bytes((buf[k] ^ load_word(seed, pair, step - 1, k)) & mask);
          }
        }
        if (lane == 0) {
          progress[e] = step + 1;
          since[e] = now;
        }
        if (step == count) finish(lane, &sync[2], ends, times);
      } else if (stop) {
        if (lane == 0) {
          progress[e] = step | kStopped;
          atomicExch(status, 0);
        }
        finish(lane, &sync[2], ends, times);
      }
      __syncwarp();
      if (block && !alone) {  // a blocking call kept this warp from its other ends for up to the time-out
        now = Ends::now_ns();
        for (unsigned int f = blockIdx.x; f < ends; f += gridDim.x)
          if (lane == 0) since[f] = now;
        __syncwarp();
      }
    }
  }
  visits.close();
  if (wrong) atomicAdd(bad, wrong);
}
