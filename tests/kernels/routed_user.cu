// Kernels of tests/test_routed_gpu.py, on the public device API only: routed channels take the same
// circuslink::Sender<T> / Receiver<T> calls as direct ones.
#include <circuslink/channel.cuh>
#include <circuslink/warp_ends.cuh>

using Handle = circuslink::detail::ChannelHandle;
using Ends = circuslink::WarpEnds<unsigned char>;  // the end a warp visited last stays open
using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;
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

// Every lane: message m of the channel whose sender id is id, n bytes, into buf.
__device__ void stage(unsigned char* buf, unsigned int id, unsigned int m, unsigned int n, unsigned int seed) {
  for (unsigned int k = threadIdx.x & 31u; k < n; k += 32) buf[k] = pattern(id, m, k, seed);
  __syncwarp();
}

// progress[e]: messages end e finished; this bit set: the end stopped there (stalled or failed).
constexpr unsigned int kStopped = 0x80000000u;

// One warp per block; the rank's ends are e = 0..nsend-1 (sends[e]) then nsend..nsend+nrecv-1 (recvs[e - nsend]),
// and warp b serves ends b, b + G, b + 2G, ... (G = gridDim.x, as many as the rank may have resident, which
// may be far fewer than its ends) with the non-blocking calls, round after round, so no end waits on another
// end of its own warp. Every end writes / reads nmsgs messages; sizes[id * nmsgs + m]: bytes of message m of
// the channel whose sender id is id (each one write: at most the ring's packets, the host checks). A sender's
// message is staged in its scratch (scratch_bytes an end) once and retried from there; a receiver checks every
// byte against the hash and counts wrong ones into *bad. Nothing hangs: an end with no progress for stall_ns
// (the channel's time-out; 0: none) makes the blocking call once, which either goes on or times out and records
// the error that names the end; after such a failure the warp's other ends that stall stop without a call.
// progress[] (zeroed) and since[] are the ends' bookkeeping, read by the host after the kernel.
extern "C" __global__ void exchange(const Handle* sends, const unsigned int* send_ids, unsigned int nsend,
                                    const Handle* recvs, const unsigned int* recv_ids, unsigned int nrecv,
                                    const unsigned int* sizes, unsigned int nmsgs, unsigned int seed,
                                    unsigned char* scratch, unsigned int scratch_bytes, unsigned long long stall_ns,
                                    unsigned int* progress, unsigned long long* since, unsigned int* bad) {
  if (threadIdx.x >= 32) return;
  const unsigned int lane = threadIdx.x, ends = nsend + nrecv;
  unsigned long long now = Ends::now_ns();
  for (unsigned int e = blockIdx.x; e < ends; e += gridDim.x) {
    if (e < nsend && nmsgs) stage(scratch + (unsigned long long)e * scratch_bytes, send_ids[e], 0,
                                  sizes[send_ids[e] * nmsgs], seed);
    if (lane == 0) since[e] = now;
  }
  __syncwarp();
  Ends visits;
  bool failed = false;  // a call of this warp failed, its error recorded for the host
  unsigned int wrong = 0;
  for (bool pending = true; pending;) {
    pending = false;
    now = Ends::now_ns();
    for (unsigned int e = blockIdx.x; e < ends; e += gridDim.x) {
      const unsigned int m = progress[e];  // the same on every lane: lane 0 stored it before a __syncwarp
      if (m >= nmsgs) continue;  // done, or stopped (kStopped)
      pending = true;
      const bool stalled = stall_ns != 0 && now - since[e] >= stall_ns;
      if (stalled && failed) {  // already reported: the rank's check raises that error
        if (lane == 0) progress[e] = m | kStopped;
        __syncwarp();
        continue;
      }
      const bool sender = e < nsend;
      const Handle& h = sender ? sends[e] : recvs[e - nsend];
      const unsigned int id = sender ? send_ids[e] : recv_ids[e - nsend];
      const unsigned int n = sizes[id * nmsgs + m];
      unsigned char* buf = scratch + (unsigned long long)e * scratch_bytes;
      // the blocking call once the end has stalled, else the try call
      const bool moved = sender ? visits.write(Tx{h}, e, buf, n, stalled) : visits.read(Rx{h}, e, buf, n, stalled);
      if (moved) {
        if (sender && m + 1 < nmsgs) {
          stage(buf, id, m + 1, sizes[id * nmsgs + m + 1], seed);  // the write copied buf into the ring
        } else if (!sender) {
          for (unsigned int k = lane; k < n; k += 32) wrong += buf[k] != pattern(id, m, k, seed) ? 1u : 0u;
        }
        if (lane == 0) {
          progress[e] = m + 1;
          since[e] = now;
        }
      } else if (stalled || (sender ? Ends::failed(Tx{h}) : Ends::failed(Rx{h}))) {
        failed = true;  // the blocking call timed out, or the try call found misuse: recorded either way
        if (lane == 0) progress[e] = m | kStopped;
      }
      __syncwarp();
      if (stalled) {  // the blocking call kept this warp from its other ends for up to the time-out
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

// Every thread of a co-resident grid writes / reads n elements (bulk packets spread over the warps).
extern "C" __global__ void grid_write(circuslink::Sender<u4v> tx, const u4v* src, unsigned long long n, int* ok) {
  if (!tx.write_grid(src, n) && threadIdx.x == 0) atomicExch(ok, 0);
}
extern "C" __global__ void grid_read(circuslink::Receiver<u4v> rx, u4v* dst, unsigned long long n, int* ok) {
  if (!rx.read_grid(dst, n) && threadIdx.x == 0) atomicExch(ok, 0);
}
