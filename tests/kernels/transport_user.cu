// A user's kernel on a Connection's device handle (public device API only: circuslink/transport.cuh), used by
// tests/test_transport_ipc.py on the GPU: every round the block puts `n` bytes into the peer's inbox with a
// signal, then waits for the peer's signal of the same round and checks the bytes it put (the peer's pattern).
#include <circuslink/transport.cuh>

__device__ __forceinline__ unsigned char pattern(unsigned long long seed, unsigned long long i) {
  unsigned long long z = seed + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  return (unsigned char)(z >> 56);
}

extern "C" __global__ void exchange(circuslink::transport::Handle h, unsigned char* scratch, unsigned long long n,
                                    unsigned long long my_seed, unsigned long long peer_seed, int rounds,
                                    int* status) {
  namespace t = circuslink::transport;
  for (int r = 1; r <= rounds; ++r) {
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) scratch[i] = pattern(my_seed + r, i);
    __syncthreads();
    unsigned int rc = t::put_with_signal_block(h, 0, scratch, n, 0, (unsigned long long)r);
    if (rc == t::kOk && threadIdx.x == 0) rc = t::wait(h, 0, (unsigned long long)r);
    __shared__ unsigned int shared_rc;
    if (threadIdx.x == 0) shared_rc = rc;
    __syncthreads();
    if (shared_rc != t::kOk) {
      if (threadIdx.x == 0) *status = -(int)shared_rc;
      return;
    }
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x)
      if (h.local[i] != pattern(peer_seed + r, i)) atomicExch(status, 1000 + r);
    __syncthreads();
    // the peer may overwrite my inbox in round r + 1 only after I read round r: a second signal says so
    if (threadIdx.x == 0) {
      t::signal(h, 1, (unsigned long long)r);
      t::wait(h, 1, (unsigned long long)r);
    }
    __syncthreads();
  }
}
