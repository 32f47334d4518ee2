// circuslink bench rma: device-driven cycles, as a user kernel runs them, through the public device
// API only (<circuslink/rma.cuh> and the queue's device handle, passed by value).
//
//   bench_rma_device_cycles: one block runs one handshake cycle (untimed: every rank's kernel has started
//   and cycled once before any clock starts, so launch skew between processes stays out of the figure),
//   then `samples` samples of `ops` x (rma_start, rma_wait), each timed with %globaltimer.
//   bench_rma_device_cycles_grid: the same with every block of a co-resident grid (rma_start_grid,
//   rma_wait_grid): chains too large for one block's copies.
//   bench_rma_device_session_cycles: the one-block cycles through an rma_session.
//   out[0] = cycles after the handshake that succeeded, out[1 + s] = nanoseconds of sample s. A cycle that
//   fails stops the loop; the host raises the recorded error with queue.check_device().
//
// One cycle's critical path (2 ranks, the queue posting at start): my post's trip to the peer is
// overlapped with the peer's; then my stores, one release and the arrival's trip; so a cycle is two
// one-way trips (the peer's post of e, my arrival of e) plus one release fence and the block barriers.
#include <circuslink/rma.cuh>

__device__ __forceinline__ unsigned long long bench_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <typename Cycle>
__device__ __forceinline__ void bench_cycles(Cycle cycle, unsigned long long ops, unsigned long long samples,
                                             unsigned long long* out, bool timer) {
  unsigned long long done = 0;
  bool ok = cycle();  // the handshake
  for (unsigned long long s = 0; ok && s < samples; ++s) {
    const unsigned long long t0 = bench_globaltimer_ns();
    for (unsigned long long i = 0; i < ops; ++i) {
      if (!cycle()) {
        ok = false;
        break;
      }
      ++done;
    }
    if (timer && ok) out[1 + s] = bench_globaltimer_ns() - t0;
  }
  if (timer) out[0] = done;
}

extern "C" __global__ void bench_rma_device_cycles(circuslink::RmaHandle queue, unsigned long long ops,
                                                   unsigned long long samples, unsigned long long* out) {
  if (blockIdx.x != 0) return;
  const bool first = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  bench_cycles([&] { return circuslink::rma_start(queue) && circuslink::rma_wait(queue); }, ops, samples, out,
               first);
}

// The same cycles through an rma_session (one block; low-latency queues a block of its threads holds): the queue's
// epoch and every address in registers for the launch (bench rma's rma-device-session rows).
extern "C" __global__ void bench_rma_device_session_cycles(circuslink::RmaHandle queue, unsigned long long ops,
                                                           unsigned long long samples, unsigned long long* out) {
  if (blockIdx.x != 0) return;
  const bool first = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  circuslink::RmaSession s = circuslink::rma_session(queue);
  bench_cycles([&] { return s.start() && s.wait(); }, ops, samples, out, first);
  s.close();
}

// At most 128 registers: two blocks of 256 per SM.
extern "C" __global__ void __launch_bounds__(256, 2) bench_rma_device_cycles_grid(circuslink::RmaHandle queue, circuslink::GridBarrier bar,
                                                        unsigned long long ops, unsigned long long samples,
                                                        unsigned long long* out) {
  const bool first = blockIdx.x == 0 && threadIdx.x == 0;
  bench_cycles([&] {
    return circuslink::rma_start_grid(queue, bar) && circuslink::rma_wait_grid(queue, bar);
  }, ops, samples, out, first);
}
