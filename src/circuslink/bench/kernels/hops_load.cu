// The many-to-many load of circuslink bench hops --load, on the public device API only: every rank sends to
// every other at once over the channels of an all-to-all opened on a topology (direct to neighbours, routed
// beyond), with the number of messages per channel drawn by the host from a seeded random destination pattern.
//
// One warp per block, one block per channel end of the rank (sends first, then receives), all in one launch:
// every end of every rank runs at once, so no end waits on a kernel not yet started (the grid must be
// co-resident: the host sizes it against channels.max_blocks). Word k of message m on the channel src -> dst
// is load_word(seed, src << 16 | dst, m, k) (little-endian; a message's last word is cut to its length): the
// sender computes it, the receiver recomputes it and counts every wrong byte.
//
// The handshake before the clock: each sending warp first writes a 4-byte ready word; each receiving warp reads
// its ready word and counts it in sync[0]. The warp that counts the last one (every peer's kernel is running)
// records times[0] and opens the gate (sync[1]) on which the sending warps wait; the last warp of the rank to
// finish (sync[2]) records times[1]. The host takes the slowest rank's times[1] - times[0].
//
// sync: 3 zeroed u32s. bad: a zeroed u64 (wrong bytes). status: set to 0 when a channel call fails.
#include <circuslink/channel.cuh>

using Handle = circuslink::detail::ChannelHandle;
using circuslink::detail::ld_relaxed;
using circuslink::detail::st_relaxed;

namespace {

constexpr unsigned int kReady = 0x4C4F4144u;  // "LOAD"

__device__ __forceinline__ unsigned long long now_ns() { return circuslink::detail::globaltimer_ns(); }

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

// Lane 0 counts this warp done; the rank's last warp stops the clock.
__device__ __forceinline__ void finish(unsigned int lane, unsigned int* done, unsigned int warps,
                                       unsigned long long* times) {
  if (lane == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) + 1 == warps) times[1] = now_ns();
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
                                             unsigned long long* bad, int* status) {
  if (threadIdx.x >= 32 || blockIdx.x >= nsend + nrecv) return;
  const unsigned int lane = threadIdx.x;
  const unsigned int nwords = (nbytes + 3) / 4;
  unsigned int* buf = scratch + (unsigned long long)blockIdx.x * scratch_words;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(buf);
  bool ok = true;
  if (blockIdx.x < nsend) {
    circuslink::Sender<unsigned char> tx{sends[blockIdx.x]};
    const unsigned int pair = rank << 16 | send_peers[blockIdx.x], count = send_counts[blockIdx.x];
    if (lane == 0) buf[0] = kReady;
    __syncwarp();
    ok = tx.write_warp(bytes, 4);
    unsigned long long deadline = 0;
    unsigned int spins = 0;
    while (ok && ld_relaxed(&sync[1]) == 0u) {  // the gate: every peer is running
      if (++spins == 4096) {
        spins = 0;
        const unsigned long long t = now_ns();
        if (deadline == 0) deadline = t + (timeout_ns ? timeout_ns : ~0ull / 2);
        else if (t > deadline) ok = false;
      }
    }
    ok = __all_sync(0xffffffffu, ok);
    auto s = tx.session();
    for (unsigned int m = 0; ok && m < count; ++m) {
      for (unsigned int k = lane; k < nwords; k += 32) buf[k] = load_word(seed, pair, m, k);
      __syncwarp();
      ok = s.write_warp(bytes, nbytes);
      __syncwarp();
    }
    s.close();
  } else {
    const unsigned int j = blockIdx.x - nsend;
    circuslink::Receiver<unsigned char> rx{recvs[j]};
    const unsigned int pair = recv_peers[j] << 16 | rank, count = recv_counts[j];
    ok = rx.read_warp(bytes, 4);
    __syncwarp();
    unsigned long long wrong = lane == 0 && !(ok && buf[0] == kReady) ? 4ull : 0ull;
    if (lane == 0 && atomicAdd(&sync[0], 1u) + 1 == nrecv) {
      times[0] = now_ns();
      __threadfence();
      st_relaxed(&sync[1], 1u);
    }
    auto s = rx.session();
    for (unsigned int m = 0; ok && m < count; ++m) {
      ok = s.read_warp(bytes, nbytes);
      __syncwarp();
      for (unsigned int k = lane; ok && k < nwords; k += 32) {
        const unsigned int left = nbytes - 4 * k;
        const unsigned int mask = left >= 4 ? 0xFFFFFFFFu : (1u << (8 * left)) - 1u;
        wrong += wrong_bytes((buf[k] ^ load_word(seed, pair, m, k)) & mask);
      }
      __syncwarp();
    }
    s.close();
    if (wrong) atomicAdd(bad, wrong);
  }
  finish(lane, &sync[2], nsend + nrecv, times);
  if (!ok && lane == 0) atomicExch(status, 0);
}
