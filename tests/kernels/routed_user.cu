// Kernels of tests/test_routed_gpu.py, on the public device API only: routed channels take the same
// circuslink::Sender<T> / Receiver<T> calls as direct ones.
#include <circuslink/channel.cuh>

using Handle = circuslink::detail::ChannelHandle;
using u4v = circuslink::vec<unsigned int, 4>;

// Byte k of message m of the channel whose sender id is `id` (a hash: both sides compute it).
__device__ __forceinline__ unsigned char pattern(unsigned int id, unsigned int m, unsigned int k, unsigned int seed) {
  unsigned int x = seed ^ (id * 0x9E3779B1u) ^ (m * 0x85EBCA77u) ^ (k * 0xC2B2AE3Du);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  x *= 0x297A2D39u;
  x ^= x >> 15;
  return (unsigned char)(x >> 24);
}

// One warp per block. Block b < nsend writes the messages of sends[b] (a session); block nsend + j reads those
// of recvs[j] and counts wrong bytes into *bad. sizes[id * nmsgs + m]: bytes of message m of the channel whose
// sender id is id. Every channel end of the rank in one launch, so no end waits on a kernel not yet started.
extern "C" __global__ void exchange(const Handle* sends, const unsigned int* send_ids, unsigned int nsend,
                                    const Handle* recvs, const unsigned int* recv_ids, unsigned int nrecv,
                                    const unsigned int* sizes, unsigned int nmsgs, unsigned int seed,
                                    unsigned char* scratch, unsigned int scratch_bytes, unsigned int* bad,
                                    int* status) {
  if (threadIdx.x >= 32) return;
  const unsigned int lane = threadIdx.x;
  unsigned char* buf = scratch + (unsigned long long)blockIdx.x * scratch_bytes;
  bool ok = true;
  if (blockIdx.x < nsend) {
    circuslink::Sender<unsigned char> tx{sends[blockIdx.x]};
    const unsigned int id = send_ids[blockIdx.x];
    auto s = tx.session();
    for (unsigned int m = 0; ok && m < nmsgs; ++m) {
      const unsigned int n = sizes[id * nmsgs + m];
      for (unsigned int k = lane; k < n; k += 32) buf[k] = pattern(id, m, k, seed);
      __syncwarp();
      ok = s.write_warp(buf, n);
      __syncwarp();
    }
    s.close();
  } else if (blockIdx.x < nsend + nrecv) {
    const unsigned int j = blockIdx.x - nsend;
    circuslink::Receiver<unsigned char> rx{recvs[j]};
    const unsigned int id = recv_ids[j];
    auto s = rx.session();
    unsigned int wrong = 0;
    for (unsigned int m = 0; ok && m < nmsgs; ++m) {
      const unsigned int n = sizes[id * nmsgs + m];
      ok = s.read_warp(buf, n);
      __syncwarp();
      for (unsigned int k = lane; ok && k < n; k += 32) wrong += buf[k] != pattern(id, m, k, seed) ? 1u : 0u;
      __syncwarp();
    }
    s.close();
    if (wrong) atomicAdd(bad, wrong);
  }
  if (!ok && lane == 0) atomicExch(status, 0);
}

// Every thread of a co-resident grid writes / reads n elements (bulk packets spread over the warps).
extern "C" __global__ void grid_write(circuslink::Sender<u4v> tx, const u4v* src, unsigned long long n, int* ok) {
  if (!tx.write_grid(src, n) && threadIdx.x == 0) atomicExch(ok, 0);
}
extern "C" __global__ void grid_read(circuslink::Receiver<u4v> rx, u4v* dst, unsigned long long n, int* ok) {
  if (!rx.read_grid(dst, n) && threadIdx.x == 0) atomicExch(ok, 0);
}
