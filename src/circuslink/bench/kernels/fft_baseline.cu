// The slab FFT baseline's local transpose (bench/fft_baseline.py compiles it with NVRTC; the NVSHMEM
// program bench/baselines/fft_slab_nvshmem.cu includes it): the textbook coalesced transpose that FFT
// libraries pack their send buffers with. 32 x 32 tiles through shared memory padded to 33 columns (no
// bank conflicts), 32 x 8 threads a block, each thread 4 elements per phase; blocks stride over the
// tiles, so any matrix size takes one launch with a bounded grid.
//
//   dst[c * dst_ld + r] = src[r * src_ld + c]     for r < rows, c < cols
//
// fft_transpose8 moves 8-byte elements (complex64), fft_transpose16 16-byte ones (complex128). The bytes
// are copied, never computed on.

#define FFT_TILE 32
#define FFT_ROWS_PER_PASS 8

template <typename T>
__device__ __forceinline__ void fft_tiled_transpose(T* __restrict__ dst, unsigned long long dst_ld,
                                                    const T* __restrict__ src, unsigned long long src_ld,
                                                    unsigned long long rows, unsigned long long cols) {
  __shared__ T tile[FFT_TILE][FFT_TILE + 1];
  const unsigned long long across = (cols + FFT_TILE - 1) / FFT_TILE;
  const unsigned long long tiles = across * ((rows + FFT_TILE - 1) / FFT_TILE);
  const unsigned int tx = threadIdx.x, ty = threadIdx.y;
  for (unsigned long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const unsigned long long r0 = (t / across) * FFT_TILE, c0 = (t % across) * FFT_TILE;
    // read: a warp takes 32 consecutive columns of one source row (coalesced)
#pragma unroll
    for (unsigned int k = 0; k < FFT_TILE; k += FFT_ROWS_PER_PASS) {
      const unsigned long long r = r0 + ty + k, c = c0 + tx;
      if (r < rows && c < cols) tile[ty + k][tx] = src[r * src_ld + c];
    }
    __syncthreads();
    // write: a warp takes 32 consecutive rows of one source column, a row of the destination (coalesced)
#pragma unroll
    for (unsigned int k = 0; k < FFT_TILE; k += FFT_ROWS_PER_PASS) {
      const unsigned long long c = c0 + ty + k, r = r0 + tx;
      if (r < rows && c < cols) dst[c * dst_ld + r] = tile[tx][ty + k];
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(FFT_TILE * FFT_ROWS_PER_PASS)
    fft_transpose8(unsigned long long* dst, unsigned long long dst_ld, const unsigned long long* src,
                   unsigned long long src_ld, unsigned long long rows, unsigned long long cols) {
  fft_tiled_transpose<unsigned long long>(dst, dst_ld, src, src_ld, rows, cols);
}

extern "C" __global__ void __launch_bounds__(FFT_TILE * FFT_ROWS_PER_PASS)
    fft_transpose16(ulonglong2* dst, unsigned long long dst_ld, const ulonglong2* src, unsigned long long src_ld,
                    unsigned long long rows, unsigned long long cols) {
  fft_tiled_transpose<ulonglong2>(dst, dst_ld, src, src_ld, rows, cols);
}
