// The channel soak's kernel (tests/soak/channels_soak.py): one block per channel end of this rank.
//
// Every message's size and bytes are a pure function of (seed, channel, message index), so the
// writer generates them and the reader checks every byte without any other communication. Sizes
// are log-uniform from 8 B to 1 MiB; readers pause at random between messages (0 to 40 us), so
// writers keep running into full rings and flow control is exercised all the time.
#include <circuslink/channel.cuh>

namespace cd = circuslink::detail;
typedef unsigned long long u64;
typedef unsigned int u32;

struct SoakEnd {            // one end of this rank (host: tests/soak/channels_soak.py END)
  circuslink::Sender<unsigned char> tx;   // the handle (a Receiver has the same layout)
  u64 messages;             // how many messages this channel carries
  u32 channel;              // channel number (seeds its sizes and bytes)
  u32 is_sender;
};

__device__ __forceinline__ u64 mix64(u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ u64 message_bytes(u64 seed, u32 channel, u64 m) {
  const u64 h = mix64(seed ^ mix64(((u64)channel << 40) ^ m));
  const double exponent = 3.0 + 17.0 * (double)(h >> 11) * (1.0 / 9007199254740992.0);  // 2^3 .. 2^20
  u64 n = (u64)exp2(exponent);
  return n < 8 ? 8 : (n > (1ull << 20) ? (1ull << 20) : n);
}
__device__ __forceinline__ u32 message_word(u64 seed, u32 channel, u64 m, u64 i) {
  return (u32)mix64(seed ^ mix64(((u64)channel << 40) ^ m) ^ (i * 0xD1B54A32D192ED03ull));
}

extern "C" __global__ void soak(const SoakEnd* ends, unsigned char* scratch, u64 scratch_bytes, u64 seed,
                                u64* received, u64* mismatches, int* failed) {
  const SoakEnd e = ends[blockIdx.x];
  unsigned char* buf = scratch + blockIdx.x * scratch_bytes;
  u32* words = reinterpret_cast<u32*>(buf);
  __shared__ u64 bad;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (u64 m = 0; m < e.messages; ++m) {
    const u64 n = message_bytes(seed, e.channel, m);
    const u64 nwords = (n + 3) / 4;
    if (e.is_sender) {
      for (u64 i = threadIdx.x; i < nwords; i += blockDim.x) words[i] = message_word(seed, e.channel, m, i);
      __syncthreads();
      if (!e.tx.write_block(buf, n)) { if (threadIdx.x == 0) atomicExch(failed, 1); return; }
    } else {
      circuslink::Receiver<unsigned char> rx;
      rx.h = e.tx.h;
      const u64 pause = mix64(seed ^ 0x5A5Aull ^ mix64(((u64)e.channel << 40) ^ m)) % 4;
      if (pause == 0 && threadIdx.x == 0) {  // a quarter of the messages: the reader dawdles
        const u64 t0 = cd::globaltimer_ns(), wait = mix64(seed + m) % 40000;
        while (cd::globaltimer_ns() - t0 < wait) {}
      }
      __syncthreads();
      if (!rx.read_block(buf, n)) { if (threadIdx.x == 0) atomicExch(failed, 2); return; }
      __syncthreads();
      u64 mine = 0;
      for (u64 i = threadIdx.x; i < n / 4; i += blockDim.x) mine += words[i] != message_word(seed, e.channel, m, i);
      if (threadIdx.x == 0 && (n & 3)) {  // the tail bytes of the last word
        const u32 want = message_word(seed, e.channel, m, n / 4);
        for (u64 b = 0; b < (n & 3); ++b) mine += buf[4 * (n / 4) + b] != (unsigned char)(want >> (8 * b));
      }
      if (mine) atomicAdd(&bad, mine);
      __syncthreads();
      if (threadIdx.x == 0) received[blockIdx.x] = m + 1;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) mismatches[blockIdx.x] = bad;
}
