// A user's kernel of tests/test_trace.py: COMPUTE spans per warp and a KERNEL span per block.
#include <circuslink/trace.cuh>

namespace tr = circuslink::trace;

extern "C" __global__ void traced(tr::Handle h, unsigned int steps, float* x) {
  if (threadIdx.x == 0) tr::kernel_begin(h);
  for (unsigned int s = 0; s < steps; ++s) {
    tr::record_warp(h, tr::COMPUTE, tr::PHASE_BEGIN, s);
    for (int i = 0; i < 64; ++i) x[blockIdx.x * blockDim.x + threadIdx.x] += 1.0f;
    tr::record_warp(h, tr::COMPUTE, tr::PHASE_END, s);
  }
  if (threadIdx.x == 0) tr::kernel_end(h);
}

// Every other call of the device API, from a block of any shape: one USER + 2 instant per block
// (record_block), and a USER + 3 span from the block's first thread (begin / end, by linear index).
extern "C" __global__ void every_call(tr::Handle h) {
  tr::record_block(h, tr::USER + 2, tr::PHASE_INSTANT, 7);
  const unsigned int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  if (t == 0) {
    tr::begin(h, tr::USER + 3, 1);
    tr::instant(h, tr::CREDITS, 9);
    tr::end(h, tr::USER + 3, 1);
  }
}
