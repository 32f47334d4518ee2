// Dev experiment (not yet run on a GPU): how fast can one rank's small block of a 2-D 5-point Jacobi stencil
// iterate when its cells are spread over the SMs of one thread-block cluster instead of one block? The on-chip
// persistent stencil (examples/stencil, jacobi_onchip) keeps a 64x64 float64 block in one SM's shared memory, and
// its compute alone takes 1.31 us an iteration on an H200 (2026-11-29), 4.7x the relaxed store+poll floor: most of
// the small-domain target's budget before any exchange. Here each of C blocks of a cluster holds a slab of rows
// (plus a ghost row above and below) in its shared memory; an iteration updates the slab, then every block copies
// its neighbours' edge rows into its ghost rows through distributed shared memory, between two cluster barriers.
// No channels: the compute-and-barrier floor only, for C = 1, 2, 4, 8 (the largest portable cluster).
//
//   nvcc -std=c++17 -arch=sm_90a -o cluster_stencil scripts/dev/cluster_stencil.cu
//   ./cluster_stencil [lx=64] [ly=64] [iters=2000]
//
// Prints, per C: us an iteration on the device's clock (median of 10 launches), and whether the result is bit for
// bit the same as a one-thread host reference (the same update, the same order of operations).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "dev_check.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cg = cooperative_groups;


constexpr int kThreads = 512;

__host__ __device__ inline double cell_update(double xm, double xp, double ym, double yp) {
  return 0.25 * ((xm + xp) + (ym + yp));
}

__device__ inline unsigned long long clock_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// u: (lx + 2) x (ly + 2) with its fixed frame. Block r of the cluster owns rows [r0, r1) of 1..lx; its shared
// memory holds rows r0 - 1 .. r1 (ghost rows at both ends), twice (the two buffers).
__global__ void cluster_jacobi(double* u, int lx, int ly, int iters, unsigned long long* clocks) {
  extern __shared__ double slab[];
  cg::cluster_group cluster = cg::this_cluster();
  const int c = (int)cluster.num_blocks(), r = (int)cluster.block_rank();
  const int w = ly + 2;
  const int r0 = 1 + (int)((long long)r * lx / c), r1 = 1 + (int)((long long)(r + 1) * lx / c);
  const int rows = r1 - r0 + 2;  // with the ghost rows
  const int most = (lx + c - 1) / c + 2;  // every block's buffers are laid out for the tallest slab
  double* buf[2] = {slab, slab + (size_t)most * w};
  for (int t = threadIdx.x; t < rows * w; t += blockDim.x) {
    const double x = u[(size_t)(r0 - 1) * w + t];
    buf[0][t] = x;
    buf[1][t] = x;
  }
  cluster.sync();
  int cur = 0;
  for (int it = 0; it < iters; ++it) {
    if (it == 1 && r == 0 && threadIdx.x == 0) clocks[0] = clock_ns();
    const double* a = buf[cur];
    double* b = buf[1 - cur];
    for (int t = threadIdx.x; t < (rows - 2) * ly; t += blockDim.x) {
      const int i = 1 + t / ly, j = 1 + t % ly;
      const int k = i * w + j;
      b[k] = cell_update(a[k - w], a[k + w], a[k - 1], a[k + 1]);
    }
    cluster.sync();  // every slab's new rows are written
    // ghost rows of b from the neighbours' edge rows (the domain's frame rows stay as loaded)
    if (r > 0) {
      const double* up = cluster.map_shared_rank(buf[1 - cur], r - 1);
      const int up_rows = (1 + (int)((long long)r * lx / c)) - (1 + (int)((long long)(r - 1) * lx / c)) + 2;
      for (int j = threadIdx.x; j < w; j += blockDim.x) b[j] = up[(size_t)(up_rows - 2) * w + j];
    }
    if (r < c - 1) {
      const double* down = cluster.map_shared_rank(buf[1 - cur], r + 1);
      for (int j = threadIdx.x; j < w; j += blockDim.x) b[(size_t)(rows - 1) * w + j] = down[(size_t)w + j];
    }
    cluster.sync();  // every ghost row is in, and nobody reads a before it is overwritten
    cur = 1 - cur;
  }
  if (r == 0 && threadIdx.x == 0) clocks[1] = clock_ns();
  for (int t = threadIdx.x + w; t < (rows - 1) * w; t += blockDim.x) u[(size_t)(r0 - 1) * w + t] = buf[cur][t];
}

int main(int argc, char** argv) {
  const int lx = argc > 1 ? std::atoi(argv[1]) : 64, ly = argc > 2 ? std::atoi(argv[2]) : 64;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 2000;
  const int w = ly + 2;
  std::vector<double> u0((size_t)(lx + 2) * w);
  srand(12345);
  for (auto& x : u0) x = (double)rand() / RAND_MAX;
  std::vector<double> want = u0, next = u0;
  for (int it = 0; it < iters; ++it) {
    for (int i = 1; i <= lx; ++i)
      for (int j = 1; j <= ly; ++j) {
        const int k = i * w + j;
        next[k] = cell_update(want[k - w], want[k + w], want[k - 1], want[k + 1]);
      }
    std::swap(want, next);
  }
  double* u;
  unsigned long long* clocks;
  CHECK(cudaMalloc(&u, u0.size() * sizeof(double)));
  CHECK(cudaMalloc(&clocks, 2 * sizeof(unsigned long long)));
  for (int c : {1, 2, 4, 8}) {
    if (c > lx) break;
    const int most = (lx + c - 1) / c + 2;
    const size_t smem = 2 * (size_t)most * w * sizeof(double);
    CHECK(cudaFuncSetAttribute(cluster_jacobi, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(c);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = c;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    std::vector<double> us;
    bool exact = true;
    for (int s = 0; s < 10; ++s) {
      CHECK(cudaMemcpy(u, u0.data(), u0.size() * sizeof(double), cudaMemcpyHostToDevice));
      CHECK(cudaLaunchKernelEx(&cfg, cluster_jacobi, u, lx, ly, iters, clocks));
      CHECK(cudaDeviceSynchronize());
      unsigned long long t[2];
      CHECK(cudaMemcpy(t, clocks, sizeof(t), cudaMemcpyDeviceToHost));
      us.push_back((double)(t[1] - t[0]) * 1e-3 / (iters - 1));
      std::vector<double> got(u0.size());
      CHECK(cudaMemcpy(got.data(), u, got.size() * sizeof(double), cudaMemcpyDeviceToHost));
      exact = exact && std::memcmp(got.data(), want.data(), got.size() * sizeof(double)) == 0;
    }
    std::sort(us.begin(), us.end());
    std::printf("{\"lx\": %d, \"ly\": %d, \"cluster\": %d, \"us_per_iter\": %.4f, \"min_us\": %.4f, \"exact\": %s}\n", lx,
                ly, c, us[us.size() / 2], us[0], exact ? "true" : "false");
  }
  return 0;
}
