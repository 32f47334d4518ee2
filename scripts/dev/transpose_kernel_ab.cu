// Dev experiment: the transposing put's tile kernel (circuslink/detail/transpose_impl.cuh) against the copy
// ceiling, one process alone on the GPU: a rows x cols 8-byte block (default 4096 x 8192: one rank's slab of a
// 8192^2 complex64 FFT, 256 MiB) transposed into another buffer, by tile shape and grid, beside
// cudaMemcpyAsync (device to device) and a 16-byte copy kernel of the same bytes. Prints JSON lines: us a
// transpose (median of 20, events), GB/s (bytes once), and whether the result is right.
//   nvcc -std=c++17 -arch=sm_90a -I src/circuslink/include -o tk scripts/dev/transpose_kernel_ab.cu
#include <circuslink/transpose.cuh>
#include <cuda_runtime.h>

#include "dev_check.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>


using W = unsigned long long;
namespace cd = circuslink::detail;

template <unsigned M_LOG2, unsigned N_LOG2>
__global__ void __launch_bounds__(256, 4) tiled(W* dst, const W* src, unsigned long long rows,
                                                 unsigned long long cols, unsigned pitch) {
  const unsigned long long across = (cols + (1ull << N_LOG2) - 1) >> N_LOG2;
  const unsigned long long tiles = across * ((rows + (1ull << M_LOG2) - 1) >> M_LOG2);
  for (unsigned long long k = blockIdx.x; k < tiles; k += gridDim.x)
    cd::transpose_block_tile<W>((unsigned long long)dst, rows, (unsigned long long)src, cols, rows, cols, k, across,
                                M_LOG2, N_LOG2, pitch);
}

__global__ void copy16(uint4* dst, const uint4* src, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void fill(W* a, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    a[i] = i * 0x9E3779B97F4A7C15ull;
}

__global__ void check(const W* t, unsigned long long rows, unsigned long long cols, unsigned long long* bad) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < rows * cols;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long c = i / rows, r = i % rows;  // t[c * rows + r] = src[r * cols + c]
    if (t[i] != (r * cols + c) * 0x9E3779B97F4A7C15ull) atomicAdd(bad, 1ull);
  }
}

template <typename F>
static float time_us(F&& f, cudaStream_t s) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  f();
  std::vector<float> v;
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaEventRecord(a, s));
    f();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    v.push_back(ms * 1e3f);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <unsigned M, unsigned N>
static void run_tile(W* dst, const W* src, unsigned long long rows, unsigned long long cols, int sms,
                     unsigned long long* bad, cudaStream_t s) {
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tiled<M, N>, 256, 0));
  const unsigned pitch = (1u << N) + 1u;
  const unsigned long long tiles = ((rows >> M) + 1) * ((cols >> N) + 1);
  for (int waves : {1, 2, 8, 0}) {
    const unsigned long long grid = waves ? std::min<unsigned long long>(tiles, (unsigned long long)waves * per_sm * sms)
                                          : tiles;
    const float us = time_us([&] { tiled<M, N><<<(unsigned)grid, 256, 0, s>>>(dst, src, rows, cols, pitch); }, s);
    CHECK(cudaMemsetAsync(bad, 0, 8, s));
    check<<<1024, 256, 0, s>>>(dst, rows, cols, bad);
    unsigned long long nbad = 0;
    CHECK(cudaMemcpyAsync(&nbad, bad, 8, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemsetAsync(dst, 0, rows * cols * 8, s));
    std::printf("{\"what\": \"tile\", \"tile\": \"%ux%u\", \"per_sm\": %d, \"grid\": %llu, \"us\": %.1f, "
                "\"GBps\": %.0f, \"exact\": %s}\n", 1u << M, 1u << N, per_sm, grid, us,
                rows * cols * 8 / (us * 1e3), nbad ? "false" : "true");
  }
}

int main(int argc, char** argv) {
  const unsigned long long rows = argc > 1 ? std::atoll(argv[1]) : 4096, cols = argc > 2 ? std::atoll(argv[2]) : 8192;
  const size_t bytes = rows * cols * 8;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  W *src, *dst;
  unsigned long long* bad;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMalloc(&bad, 8));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  fill<<<1024, 256, 0, s>>>(src, rows * cols);
  float us = time_us([&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); }, s);
  std::printf("{\"what\": \"memcpy\", \"us\": %.1f, \"GBps\": %.0f}\n", us, bytes / (us * 1e3));
  for (int waves : {1, 4}) {
    us = time_us([&] { copy16<<<waves * sms * 8, 256, 0, s>>>((uint4*)dst, (const uint4*)src, bytes / 16); }, s);
    std::printf("{\"what\": \"copy16\", \"waves\": %d, \"us\": %.1f, \"GBps\": %.0f}\n", waves, us, bytes / (us * 1e3));
  }
  run_tile<5, 6>(dst, src, rows, cols, sms, bad, s);
  run_tile<6, 5>(dst, src, rows, cols, sms, bad, s);
  run_tile<7, 4>(dst, src, rows, cols, sms, bad, s);
  run_tile<4, 7>(dst, src, rows, cols, sms, bad, s);
  run_tile<5, 5>(dst, src, rows, cols, sms, bad, s);
  return 0;
}
