// Kernels of tests/test_rma_cuda.py, on the public device API only: a ring of queues each writing [0, 1024) to the
// right neighbour's [4096, 5120) and 16 blocks of 24 B at stride 32 from 1024 to its 6144 at stride 40, driven
// from the kernel for `cycles` cycles, every received byte checked (out[0]: wrong bytes, out[1]: cycles done;
// the session form's out[2]: whether its session took the queue). Any block shape: the device API numbers
// threads by their linear index.
#include <circuslink/rma.cuh>

__device__ unsigned char value(unsigned long long rank, unsigned long long cycle, unsigned long long i) {
  unsigned long long x = (rank * 0x9E3779B97F4A7C15ull) ^ (cycle * 0xBF58476D1CE4E5B9ull) ^ (i * 0x94D049BB133111EBull);
  x ^= x >> 31; x *= 0xD6E8FEB86774B5D3ull; x ^= x >> 29;
  return (unsigned char)(x >> 24);
}
__device__ unsigned int thread_in_block() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
__device__ unsigned int threads_in_block() { return blockDim.x * blockDim.y * blockDim.z; }

// This cycle's sources, by every thread.
__device__ void fill(unsigned char* win, unsigned long long me, unsigned long long c) {
  for (unsigned int i = thread_in_block(); i < 2048; i += threads_in_block()) win[i] = value(me, c, i);
}
// Wrong bytes among this thread's share of what arrived from the left neighbour; the bytes between the strided
// blocks keep their poison (0xA5).
__device__ unsigned long long check(const unsigned char* win, unsigned long long left, unsigned long long c) {
  const unsigned int t = thread_in_block(), nt = threads_in_block();
  unsigned long long bad = 0;
  for (unsigned int i = t; i < 1024; i += nt) bad += win[4096 + i] != value(left, c, i);
  for (unsigned int i = t; i < 16 * 24; i += nt) {
    unsigned int b = i / 24, k = i % 24;
    bad += win[6144 + b * 40 + k] != value(left, c, 1024 + b * 32 + k);
  }
  for (unsigned int i = t; i < 15 * 16; i += nt) {
    unsigned int b = i / 16, k = i % 16;
    bad += win[6144 + b * 40 + 24 + k] != 0xA5;
  }
  return bad;
}

// rma_start / rma_wait.
extern "C" __global__ void user_cycles(circuslink::RmaHandle q, unsigned char* win, unsigned long long me,
                                       unsigned long long left, unsigned long long first,
                                       unsigned long long cycles, unsigned long long* out) {
  unsigned long long bad = 0, done = 0;
  for (unsigned long long c = first; c < first + cycles; ++c) {
    fill(win, me, c);
    __syncthreads();
    if (!circuslink::rma_start(q)) break;
    if (!circuslink::rma_wait(q)) break;
    bad += check(win, left, c);
    __syncthreads();  // everyone has read this epoch's bytes before the next start lets them change
    ++done;
  }
  atomicAdd(&out[0], bad);
  if (thread_in_block() == 0) out[1] = done;
}

// The same through an rma_session (its start meets the block's threads, so no barrier before it).
extern "C" __global__ void session_cycles(circuslink::RmaHandle q, unsigned char* win, unsigned long long me,
                                          unsigned long long left, unsigned long long first,
                                          unsigned long long cycles, unsigned long long* out) {
  unsigned long long bad = 0, done = 0;
  circuslink::RmaSession s = circuslink::rma_session(q);
  for (unsigned long long c = first; c < first + cycles; ++c) {
    fill(win, me, c);
    if (!s.start()) break;
    if (!s.wait()) break;
    bad += check(win, left, c);
    __syncthreads();  // everyone has read this epoch's bytes before the next start's sources change
    ++done;
  }
  s.close();
  atomicAdd(&out[0], bad);
  if (thread_in_block() == 0) {
    out[1] = done;
    out[2] = s.taken;
  }
}
