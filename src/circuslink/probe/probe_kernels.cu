// Kernels of `circuslink probe`: the physical floor between two GPUs.
// Bandwidth: SM stores into / loads from a peer's memory with 16-byte vectors.
// Latency: a one-thread flag pingpong in three flavours (relaxed volatile stores polled
// locally, release/acquire stores polled locally, and stores kept local while the peer
// polls remotely). Every wait gives up after `timeout_ns` and sets *error.
#include <circuslink/detail/sync.cuh>

using circuslink::detail::Deadline;
using circuslink::detail::globaltimer_ns;

extern "C" __global__ void store_bw(int4* __restrict__ dst, unsigned long long n_vec, int salt) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    dst[i] = make_int4((int)i, salt, (int)(i >> 32), ~salt);
  }
}

extern "C" __global__ void load_bw(const int4* __restrict__ src, unsigned long long n_vec, int* __restrict__ sink) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  int acc = 0;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    int4 v = __ldcv(src + i);  // bypass L1/L2 so the bytes really cross the link
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) sink[0] = acc;  // keeps the loads alive; practically never taken
}

// mode 0: relaxed store into the peer's flag, poll my own flag.
// mode 1: the same with st.release.sys / ld.acquire.sys.
// mode 2: "pull": store into my own flag, poll the peer's flag remotely.
template <int kMode>
__device__ __forceinline__ void put_flag(unsigned int* mine, unsigned int* peers, unsigned int v) {
  if (kMode == 0) circuslink::detail::st_relaxed(peers, v);
  if (kMode == 1) circuslink::detail::st_release_sys(peers, v);
  if (kMode == 2) circuslink::detail::st_relaxed(mine, v);
}
template <int kMode>
__device__ __forceinline__ unsigned int get_flag(unsigned int* mine, unsigned int* peers) {
  if (kMode == 0) return circuslink::detail::ld_relaxed(mine);
  if (kMode == 1) return circuslink::detail::ld_acquire_sys(mine);
  return circuslink::detail::ld_relaxed(peers);
}

template <int kMode>
__device__ void pingpong(unsigned int* mine, unsigned int* peers, unsigned int base, int warmup, int iters,
                         int initiator, unsigned long long timeout_ns, unsigned long long* out_ns, int* error) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  Deadline deadline = Deadline::after(timeout_ns);
  unsigned long long t0 = 0;
  for (int i = 1; i <= warmup + iters; ++i) {
    if (i == warmup + 1) t0 = globaltimer_ns();
    const unsigned int v = base + (unsigned int)i;
    if (initiator) put_flag<kMode>(mine, peers, v);
    if (!circuslink::detail::spin_until([&] { return get_flag<kMode>(mine, peers) == v; }, deadline)) {
      *error = i;
      return;
    }
    if (!initiator) put_flag<kMode>(mine, peers, v);
  }
  *out_ns = globaltimer_ns() - t0;
}

extern "C" __global__ void pingpong_relaxed(unsigned int* mine, unsigned int* peers, unsigned int base, int warmup,
                                            int iters, int initiator, unsigned long long timeout_ns,
                                            unsigned long long* out_ns, int* error) {
  pingpong<0>(mine, peers, base, warmup, iters, initiator, timeout_ns, out_ns, error);
}
extern "C" __global__ void pingpong_acqrel(unsigned int* mine, unsigned int* peers, unsigned int base, int warmup,
                                           int iters, int initiator, unsigned long long timeout_ns,
                                           unsigned long long* out_ns, int* error) {
  pingpong<1>(mine, peers, base, warmup, iters, initiator, timeout_ns, out_ns, error);
}
extern "C" __global__ void pingpong_pull(unsigned int* mine, unsigned int* peers, unsigned int base, int warmup,
                                         int iters, int initiator, unsigned long long timeout_ns,
                                         unsigned long long* out_ns, int* error) {
  pingpong<2>(mine, peers, base, warmup, iters, initiator, timeout_ns, out_ns, error);
}
