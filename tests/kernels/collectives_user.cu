// Users' kernels of tests/test_collectives.py: the device API as a program calls it, with a
// Comm's by-value handle (comm.device_handle()). Instantiated by name: fused<float>, grid_calls<int>, ...
#include <circuslink/collectives.cuh>

namespace cc = circuslink::collectives;

__device__ __forceinline__ unsigned int linear_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ unsigned int linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
__device__ __forceinline__ unsigned int block_size() { return blockDim.x * blockDim.y * blockDim.z; }

// Compute, all-reduce inside the kernel, keep computing: the fused pattern the device API is for.
// Block b owns part b of x (an even split of its own) and reduces it over rings[b] with the block form,
// so no block reads what another wrote. Any block shape.
template <class T>
__global__ void fused(cc::Rings rings, int rank, T* x, unsigned long long n, int* status) {
  const unsigned long long b = linear_block(), parts = rings.count, base = n / parts, extra = n % parts;
  if (b >= parts) return;
  const unsigned long long lo = b * base + (b < extra ? b : extra), hi = lo + base + (b < extra ? 1 : 0);
  for (unsigned long long i = lo + linear_thread(); i < hi; i += block_size()) x[i] = (T)(rank + 1) * (T)(i % 1000);
  __syncthreads();
  if (!cc::allreduce_block(rings[b], x + lo, hi - lo, cc::Sum())) {
    if (linear_thread() == 0) atomicExch(status, 1);
    return;
  }
  __syncthreads();
  for (unsigned long long i = lo + linear_thread(); i < hi; i += block_size()) x[i] *= (T)2;
}

// The grid forms with whatever grid the host chose (fewer blocks than rings included): x becomes the
// sum over ranks, y root's y; then block 0 of every rank meets in a barrier over rings[0].
template <class T>
__global__ void grid_calls(cc::Rings rings, T* x, unsigned long long n, T* y, unsigned long long m,
                           unsigned int root, int* status) {
  bool ok = cc::allreduce_grid(rings, x, n, cc::Sum());
  if (ok) ok = cc::broadcast_grid(rings, y, m, root);
  if (ok && linear_block() == 0) ok = cc::barrier_block(rings);
  if (!ok && linear_thread() == 0) atomicExch(status, 1);
}

// The shared-memory team (comm.device_team()) in a user's grid: compute, all-reduce by size in place,
// keep computing; then the symmetric form on the stage (write the stage, allreduce_stage, read it),
// a reduce-scatter and a barrier. Every thread of a co-resident grid (launch_resident).
template <class T>
__global__ void __launch_bounds__(512) team_fused(cc::Team team, int rank, T* x, unsigned long long n, T* y,
                                                  unsigned long long m, T* part, int* status) {
  const unsigned long long g = (unsigned long long)linear_block() * block_size() + linear_thread();
  const unsigned long long step = (unsigned long long)gridDim.x * gridDim.y * gridDim.z * block_size();
  for (unsigned long long i = g; i < n; i += step) x[i] = (T)(rank + 1) * (T)(i % 1000);
  bool ok = cc::barrier(team) && cc::allreduce(team, x, n, cc::Sum());  // the barrier: every block wrote x
  T* stage = cc::stage<T>(team);
  for (unsigned long long i = g; ok && i < m; i += step) stage[i] = (T)(rank + 1);
  ok = ok && cc::barrier(team) && cc::allreduce_stage<T>(team, m, cc::Max());
  for (unsigned long long i = g; ok && i < m; i += step) y[i] = stage[i];
  ok = ok && cc::barrier(team) && cc::reduce_scatter(team, x, part, n / team.size, cc::Min());
  if (!ok && linear_thread() == 0) atomicExch(status, 1);
}
