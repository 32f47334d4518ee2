// circuslink bench rma: device-driven cycles, as a user kernel runs them, through the public device
// API only (<circuslink/rma.cuh> and the queue's device handle, passed by value).
//
//   bench_rma_device_cycles: block 0 runs `iters` x (rma_start, rma_wait) in one launch and times them
//   with %globaltimer. out[0] = cycles that succeeded, out[1] = nanoseconds for all of them. A cycle
//   that fails stops the loop; the host raises the recorded error with queue.check_device().
#include <circuslink/rma.cuh>

__device__ __forceinline__ unsigned long long bench_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

extern "C" __global__ void bench_rma_device_cycles(circuslink::RmaHandle queue, unsigned long long iters,
                                                   unsigned long long* out) {
  if (blockIdx.x != 0) return;
  const unsigned long long t0 = bench_globaltimer_ns();
  unsigned long long done = 0;
  for (unsigned long long i = 0; i < iters; ++i) {
    if (!circuslink::rma_start(queue)) break;
    if (!circuslink::rma_wait(queue)) break;
    ++done;
  }
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    out[0] = done;
    out[1] = bench_globaltimer_ns() - t0;
  }
}
