// CIRCUS Fig. 2 on GPUs: read, +1, write. In CIRCUS each stage is an OpenCL kernel joined to the
// next by a channel; here the stage on rank 1 reads a tile from one channel, adds 1 and writes it
// to the next, tile after tile, so computation and communication overlap as the data streams.
// The header comes from `circuslink gen app.xml --name pipeline` (main.py runs it).
#include "pipeline_channels.cuh"

#define TILE 960  // elements per step: 32 LL packets of 120 bytes

// rank 1: the +1 stage (one warp).
extern "C" __global__ void plus_one(pipeline::feed_in_t in, pipeline::result_out_t out, unsigned long long n,
                                    int* ok) {
  __shared__ int tile[TILE];
  for (unsigned long long i = 0; i < n; i += TILE) {
    const unsigned int k = (unsigned int)(n - i < TILE ? n - i : TILE);
    if (!in.read_warp(tile, k)) { if (threadIdx.x == 0) *ok = 0; return; }
    for (unsigned int j = threadIdx.x; j < k; j += 32) tile[j] += 1;  // the computation
    __syncwarp();
    if (!out.write_warp(tile, k)) { if (threadIdx.x == 0) *ok = 0; return; }
  }
}

// rank 0: warp 0 feeds the pipeline, warp 1 collects its output (at the same time, so rings
// smaller than the data cannot deadlock it).
extern "C" __global__ void feed_and_collect(pipeline::feed_out_t feed, pipeline::result_in_t result,
                                            const int* src, int* dst, unsigned long long n, int* ok) {
  const unsigned int warp = threadIdx.x / 32;
  for (unsigned long long i = 0; i < n; i += TILE) {
    const unsigned long long k = n - i < TILE ? n - i : TILE;
    const bool done = warp == 0 ? feed.write_warp(src + i, k) : result.read_warp(dst + i, k);
    if (!done) { if ((threadIdx.x & 31) == 0) *ok = 0; return; }
  }
}
