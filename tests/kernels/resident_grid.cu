// A persistent kernel whose register count the test sets (-maxrregcount): 224 floats stay live across
// grid barriers, so at a low cap most spill to the stack (as a user's fused kernel with 86 registers and a
// 472 B stack did) and at 255 it takes nearly the whole register file of a block. Every round each block
// arrives once; after the barrier block 0 checks that every block of the grid arrived: a grid that was not
// resident times out in grid_sync instead.
#include <circuslink/grid.cuh>

#define LIVE 224

extern "C" __global__ void resident_rounds(circuslink::GridBarrier bar, const float* in, float* out,
                                           unsigned int* arrivals, int rounds, int* failed) {
  float v[LIVE];
#pragma unroll
  for (int k = 0; k < LIVE; ++k) v[k] = in[(threadIdx.x + k) & 255];
  for (int r = 0; r < rounds; ++r) {
#pragma unroll
    for (int k = 0; k < LIVE; ++k) v[k] = v[k] * v[(k + 1) % LIVE] + 1.0f;
    if (threadIdx.x == 0) atomicAdd(arrivals, 1u);
    if (!circuslink::grid_sync(bar)) {
      if (threadIdx.x == 0) atomicExch(failed, 1);
      return;
    }
    if (threadIdx.x == 0 && blockIdx.x == 0 &&
        *static_cast<volatile unsigned int*>(arrivals) != gridDim.x * (unsigned int)(r + 1))
      atomicExch(failed, 2);
    if (!circuslink::grid_sync(bar)) {  // nobody arrives for the next round before block 0 has counted
      if (threadIdx.x == 0) atomicExch(failed, 1);
      return;
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < LIVE; ++k) s += v[k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
