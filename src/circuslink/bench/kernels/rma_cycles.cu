// circuslink bench rma: device-driven cycles, as a user kernel runs them, through the public device
// API only (<circuslink/rma.cuh> and the queue's device handle, passed by value).
//
//   bench_rma_device_cycles: block 0 runs one handshake cycle (untimed: every rank's kernel has started and
//   cycled once before any clock starts, so launch skew between processes stays out of the figure), then
//   `samples` samples of `ops` x (rma_start, rma_wait), each timed with %globaltimer.
//   out[0] = cycles after the handshake that succeeded, out[1 + s] = nanoseconds of sample s. A cycle that
//   fails stops the loop; the host raises the recorded error with queue.check_device().
#include <circuslink/rma.cuh>

__device__ __forceinline__ unsigned long long bench_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

extern "C" __global__ void bench_rma_device_cycles(circuslink::RmaHandle queue, unsigned long long ops,
                                                   unsigned long long samples, unsigned long long* out) {
  if (blockIdx.x != 0) return;
  const bool first = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  unsigned long long done = 0;
  bool ok = circuslink::rma_start(queue) && circuslink::rma_wait(queue);  // the handshake
  for (unsigned long long s = 0; ok && s < samples; ++s) {
    const unsigned long long t0 = bench_globaltimer_ns();
    for (unsigned long long i = 0; i < ops; ++i) {
      if (!circuslink::rma_start(queue) || !circuslink::rma_wait(queue)) {
        ok = false;
        break;
      }
      ++done;
    }
    if (first && ok) out[1 + s] = bench_globaltimer_ns() - t0;
  }
  if (first) out[0] = done;
}
