// The 2-D 5-point Jacobi stencil of examples/stencil with its halos through NVSHMEM: the NVSHMEM baseline
// of `circuslink bench stencil`.
//
// Built and run by circuslink.bench.baselines.nvshmem_stencil (_nvshmem.py has the nvcc and mpirun command
// lines; NVSHMEM_DISABLE_NVLS=1 always). The same problem, layout and kernels' structure as
// examples/stencil/kernels.cu, so that only the halo transport differs:
//   - a PE's block is (lx + 2) x (ly + 2) cells, x the slow axis, ghosts around; the process grid PXxPY
//     splits axis k among the PEs of dimension k as evenly as it goes (the first n % P parts one cell
//     more), PE = px + PX * py; a mesh: no neighbour past the domain's edge, whose frame stays fixed;
//   - launch form, an iteration = two launches: block 0's warps 0..3 exchange one direction each (pack
//     the edge, nvshmemx_putmem_signal_warp into the neighbour's receive slot, wait for the neighbour's
//     signal, unpack into the ghosts) while every other thread updates the cells that need no ghost;
//     then the cells beside the ghosts;
//   - persistent form: the same two phases in one cooperative launch, a grid barrier
//     (cooperative_groups) between them, as many blocks as may stay resident beside the other PEs on the
//     GPU (the rule of circuslink's max_blocks: all SMs' blocks alone, else half of a 1/k share); or, where a
//     PE's block fits one block's shared memory, the on-chip kernel as the channel stencil picks it: one block
//     holds both buffers in shared memory for the run, __syncthreads between the phases
//     (persistent_kernel=auto|grid|onchip, the rows' "kernel");
// Time per iteration of the persistent forms is on the device's clock, as the channel stencil's: the kernel stamps
// %globaltimer as iteration timed_from (the PE count: every PE has provably started by then) begins and after the
// last; "event_us" is the same loop timed by events after an MPI barrier (launch skew included).
// Receive slots are double-buffered by the iteration's parity and the signal of direction d is set to
// the iteration + 1: a neighbour writes slot (it + 2) % 2 again only after it received this PE's halo of
// iteration it + 1, which this PE sends after it unpacked iteration it.
//
// The update is CELL_UPDATE (the default below is examples/stencil's cell_update(); tests/test_baselines.py
// checks the two agree). Domains up to `check_cells` cells are checked bit for bit: every PE runs the whole
// domain on its own GPU with the same update and compares its block.
//
// Output: one JSON object per line on PE 0's stdout ({"info": ...}, then one row per domain x dtype x form);
// errors go to stderr as "nvshmem_stencil: PE n: ..." and the job aborts.
//
// Arguments (key=value): domains=NXxNY:PXxPY,... dtypes=float32,float64 forms=launch,persistent iters=N
// warmup=N samples=N seed=N check_cells=N persistent_kernel=auto|grid|onchip

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define BASELINE_PROGRAM "nvshmem_stencil"
#include "nvshmem_common.cuh"

#ifndef CELL_UPDATE
#define CELL_UPDATE(xm, xp, ym, yp) (T(0.25) * ((xm + xp) + (ym + yp)))
#endif

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
// The persistent form's block size and interior cells a thread, as the channel stencil (examples/stencil) sizes
// its grid, so that both forms run the same grid on the same domain.
constexpr int kPersistentThreads = 512;
constexpr int kCellsPerThread = 1;
constexpr int kExchangeThreads = 4 * 32;  // one warp a direction, in block 0
constexpr int kOnchipThreads = 512;       // the on-chip kernel's one block, as the channel stencil's

// ---- the kernels (the structure of examples/stencil/kernels.cu) ----------------------------------------------
template <typename T>
__device__ __forceinline__ void update(const T* u, T* v, int ly, int i, int j) {
  const long long w = ly + 2, c = i * w + j;
  const T xm = u[c - w], xp = u[c + w], ym = u[c - 1], yp = u[c + 1];
  v[c] = CELL_UPDATE(xm, xp, ym, yp);
}

__device__ __forceinline__ long long edge_cell(int d, int k, int lx, int ly) {
  const long long w = ly + 2;
  switch (d) {
    case 0: return lx * w + (k + 1);
    case 1: return 1 * w + (k + 1);
    case 2: return (k + 1) * w + ly;
    default: return (k + 1) * w + 1;
  }
}
__device__ __forceinline__ long long ghost_cell(int d, int k, int lx, int ly) {
  const long long w = ly + 2;
  switch (d) {
    case 0: return (lx + 1) * w + (k + 1);
    case 1: return 0 * w + (k + 1);
    case 2: return (k + 1) * w + (ly + 1);
    default: return (k + 1) * w + 0;
  }
}

// What a PE's kernels need to exchange: its neighbours (-1: none) and the symmetric buffers.
template <typename T>
struct Halo {
  int peer[4];     // +x, -x, +y, -y
  int face;        // cells a slot holds (the longest edge of any PE's block)
  T* send;         // symmetric, [4][face]: this PE's packed edges
  T* recv;         // symmetric, [4][2][face]: what the neighbour in direction d sent, by iteration parity
  uint64_t* sig;   // symmetric, [4]: iteration + 1 of the last halo that arrived from direction d
};

// One full warp: pack the edge toward d, put it with its signal into the neighbour's slot for the direction
// it sees this PE in (d ^ 1), wait for the neighbour's halo of this iteration, unpack it into the ghosts.
template <typename T>
__device__ void exchange(const Halo<T>& h, int d, T* u, int lx, int ly, long long it) {
  const int peer = h.peer[d];
  if (peer < 0) return;
  const int n = d < 2 ? ly : lx;
  const int lane = threadIdx.x & 31;
  const int parity = (int)(it & 1);
  T* out = h.send + (size_t)d * h.face;
  for (int k = lane; k < n; k += 32) out[k] = u[edge_cell(d, k, lx, ly)];
  __syncwarp();
  T* remote = h.recv + ((size_t)(d ^ 1) * 2 + parity) * h.face;
  nvshmemx_putmem_signal_warp(remote, out, (size_t)n * sizeof(T), h.sig + (d ^ 1), (uint64_t)(it + 1),
                              NVSHMEM_SIGNAL_SET, peer);
  if (lane == 0) {
    nvshmem_signal_wait_until(h.sig + d, NVSHMEM_CMP_GE, (uint64_t)(it + 1));
    __threadfence();
  }
  __syncwarp();
  const T* in = h.recv + ((size_t)d * 2 + parity) * h.face;
  for (int k = lane; k < n; k += 32) u[ghost_cell(d, k, lx, ly)] = __ldcg(in + k);  // L2: never a stale line
}

template <typename T>
__device__ void interior(const T* u, T* v, int lx, int ly, int me, int workers) {
  const int nx = lx - 2, ny = ly - 2;
  if (nx <= 0 || ny <= 0) return;
  const int di = workers / ny, dj = workers % ny;  // row by row, as the channel stencil walks them
  int i = me / ny, j = me % ny;
#pragma unroll 4
  for (; i < nx; i += di) {
    update(u, v, ly, 2 + i, 2 + j);
    j += dj;
    if (j >= ny) {
      j -= ny;
      ++i;
    }
  }
}

template <typename T>
__device__ void exchange_and_interior(const Halo<T>& h, T* u, T* v, int lx, int ly, long long it) {
  const int warp = threadIdx.x / 32;
  if (blockIdx.x == 0 && warp < 4) {
    exchange(h, warp, u, lx, ly, it);
    return;
  }
  interior(u, v, lx, ly, blockIdx.x * blockDim.x + threadIdx.x - kExchangeThreads,
           gridDim.x * blockDim.x - kExchangeThreads);
}

template <typename T>
__device__ void frame(const T* u, T* v, int lx, int ly, long long me, long long threads) {
  if (lx <= 2 || ly <= 2) {
    for (long long t = me; t < (long long)lx * ly; t += threads) update(u, v, ly, 1 + (int)(t / ly), 1 + (int)(t % ly));
    return;
  }
  const long long count = 2LL * ly + 2LL * (lx - 2);
  for (long long t = me; t < count; t += threads) {
    if (t < ly) {
      update(u, v, ly, 1, 1 + (int)t);
    } else if (t < 2 * ly) {
      update(u, v, ly, lx, 1 + (int)(t - ly));
    } else {
      const long long r = t - 2 * ly;
      update(u, v, ly, 2 + (int)(r / 2), (r % 2) == 0 ? 1 : ly);
    }
  }
}

template <typename T>
__global__ void jacobi_exchange_interior(Halo<T> h, T* u, T* v, int lx, int ly, long long it) {
  exchange_and_interior(h, u, v, lx, ly, it);
}

template <typename T>
__global__ void jacobi_frame(const T* u, T* v, int lx, int ly) {
  frame(u, v, lx, ly, (long long)blockIdx.x * blockDim.x + threadIdx.x, (long long)gridDim.x * blockDim.x);
}

// Iterations [first, first + iters) in one cooperative launch. block_frame: block 0 updates the frame after its
// exchange and one grid barrier an iteration is enough, as the channel stencil does on the same domains.
template <typename T>
__global__ void __launch_bounds__(kPersistentThreads)
    jacobi_persistent(Halo<T> h, T* u, T* v, int lx, int ly, long long first, int iters,
                      int block_frame, unsigned long long* clocks, int timed_from) {
  cg::grid_group grid = cg::this_grid();
  const long long me = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long threads = (long long)gridDim.x * blockDim.x;
  for (int i = 0; i < iters; ++i) {
    if (i == timed_from && me == 0) clocks[0] = global_timer_ns();
    exchange_and_interior(h, u, v, lx, ly, first + i);
    if (block_frame) {
      if (blockIdx.x == 0) {
        __syncthreads();
        frame(u, v, lx, ly, threadIdx.x, blockDim.x);
      }
      grid.sync();
    } else {
      grid.sync();
      frame(u, v, lx, ly, me, threads);
      grid.sync();
    }
    T* t = u;
    u = v;
    v = t;
  }
  if (me == 0) clocks[1] = global_timer_ns();
}

// Iterations [first, first + iters) in one launch of one block, both buffers in dynamic shared memory (the channel
// stencil's jacobi_onchip, with NVSHMEM's exchange); the latest step goes back to u after an even number of
// iterations, to v after an odd one.
template <typename T>
__global__ void __launch_bounds__(kOnchipThreads)
    jacobi_onchip(Halo<T> h, T* u, T* v, int lx, int ly, long long first, int iters, unsigned long long* clocks,
                  int timed_from) {
  extern __shared__ __align__(16) unsigned char onchip_cells[];
  const long long cells = (long long)(lx + 2) * (ly + 2);
  T* su = reinterpret_cast<T*>(onchip_cells);
  T* sv = su + cells;
  for (long long c = threadIdx.x; c < cells; c += blockDim.x) {
    const T x = u[c];
    su[c] = x;
    sv[c] = x;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  for (int i = 0; i < iters; ++i) {
    if (i == timed_from && threadIdx.x == 0) clocks[0] = global_timer_ns();
    if (warp < 4) exchange(h, warp, su, lx, ly, first + i);
    else interior(su, sv, lx, ly, threadIdx.x - kExchangeThreads, blockDim.x - kExchangeThreads);
    __syncthreads();
    frame(su, sv, lx, ly, threadIdx.x, blockDim.x);
    __syncthreads();
    T* t = su;
    su = sv;
    sv = t;
  }
  if (threadIdx.x == 0) clocks[1] = global_timer_ns();
  T* out = iters % 2 == 0 ? u : v;
  for (long long c = threadIdx.x; c < cells; c += blockDim.x) out[c] = su[c];
}

// The whole domain on one GPU, one step (the check's reference).
template <typename T>
__global__ void jacobi_whole(const T* u, T* v, int nx, int ny) {
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < (long long)nx * ny;
       t += (long long)gridDim.x * blockDim.x)
    update(u, v, ny, 1 + (int)(t / ny), 1 + (int)(t % ny));
}

// splitmix64 of (seed, global cell): the initial value of cell (i, j) of the domain with its frame, in [0, 1).
// Cells [x0, x0 + bx) x [y0, y0 + by) of the framed domain of width ny + 2 into a bx x by array.
template <typename T>
__global__ void fill_initial(T* out, long long x0, long long y0, int bx, int by, int ny, unsigned long long seed) {
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < (long long)bx * by;
       t += (long long)gridDim.x * blockDim.x) {
    const long long i = x0 + t / by, j = y0 + t % by;
    out[t] = (T)((double)(mix64(seed ^ mix64((unsigned long long)(i * (ny + 2) + j))) >> 11) * 0x1.0p-53);
  }
}

// The bits of a value (a bit-for-bit comparison: no NaN or -0 subtleties).
__device__ __forceinline__ unsigned long long bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ unsigned long long bits(double x) { return (unsigned long long)__double_as_longlong(x); }

// Cells of the PE's interior that differ from the reference's.
template <typename T>
__global__ void count_mismatches(const T* block, const T* whole, int lx, int ly, long long x0, long long y0, int ny,
                                 unsigned long long* bad) {
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < (long long)lx * ly;
       t += (long long)gridDim.x * blockDim.x) {
    const long long i = t / ly, j = t % ly;
    const T a = block[(i + 1) * (ly + 2) + (j + 1)], b = whole[(x0 + i + 1) * (ny + 2) + (y0 + j + 1)];
    if (bits(a) != bits(b)) atomicAdd(bad, 1ull);
  }
}

// ---- the host ------------------------------------------------------------------------------------------------
struct Domain {
  int nx, ny, px, py;
};

struct Options {
  std::vector<Domain> domains;
  bool f32 = true, f64 = true, launch = true, persistent = true;
  long long iters = 50, warmup = 5, samples = 10;
  unsigned long long seed = 1;
  long long check_cells = 1 << 20;
  std::string persistent_kernel = "auto";  // auto: on chip where a PE's block fits one block's shared memory
};

static long long parse_number(const std::string& key, const std::string& value) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 0) fail("argument %s=%s is not a number", key.c_str(), value.c_str());
  return v;
}

static std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

static Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const auto [key, value] = key_value(argv[i]);
    if (key == "domains") {
      for (const std::string& tok : split(value, ',')) {
        Domain d;
        if (std::sscanf(tok.c_str(), "%dx%d:%dx%d", &d.nx, &d.ny, &d.px, &d.py) != 4 || d.nx < 1 || d.ny < 1 ||
            d.px < 1 || d.py < 1)
          fail("domains: %s is not NXxNY:PXxPY", tok.c_str());
        if (d.nx < d.px || d.ny < d.py) fail("domains: %s has fewer cells than PEs along an axis", tok.c_str());
        o.domains.push_back(d);
      }
    } else if (key == "dtypes") {
      o.f32 = value.find("float32") != std::string::npos;
      o.f64 = value.find("float64") != std::string::npos;
    } else if (key == "forms") {
      o.launch = value.find("launch") != std::string::npos;
      o.persistent = value.find("persistent") != std::string::npos;
    } else if (key == "iters") {
      o.iters = parse_number(key, value);
    } else if (key == "warmup") {
      o.warmup = parse_number(key, value);
    } else if (key == "samples") {
      o.samples = parse_number(key, value);
    } else if (key == "seed") {
      o.seed = (unsigned long long)parse_number(key, value);
    } else if (key == "check_cells") {
      o.check_cells = parse_number(key, value);
    } else if (key == "persistent_kernel") {
      if (value != "auto" && value != "grid" && value != "onchip")
        fail("persistent_kernel=%s: choose auto, grid or onchip", value.c_str());
      o.persistent_kernel = value;
    } else {
      fail("unknown argument %s", key.c_str());
    }
  }
  if (o.domains.empty()) fail("no domains given (domains=NXxNY:PXxPY,...)");
  if (o.iters < 1 || o.samples < 1) fail("iters and samples must be positive");
  if (!(o.f32 || o.f64) || !(o.launch || o.persistent)) fail("no dtype or no form chosen");
  return o;
}

// (start, count) of part `index` of n cells split into `parts` as evenly as they go (circuslink's split_extent).
static void split_extent(int n, int parts, int index, int& start, int& count) {
  const int base = n / parts, extra = n % parts;
  start = index * base + std::min(index, extra);
  count = base + (index < extra ? 1 : 0);
}

struct Gpu {
  int device, sms, local_pes;
  size_t shared_limit;  // the most shared memory one block may have (the opt-in limit)
};

template <typename T>
static void run_case(const Options& o, const Domain& dom, const char* dtype, bool persistent, const Gpu& gpu,
                     int me, int npes, unsigned long long seed) {
  if (dom.px * dom.py != npes) fail("domain %dx%d: the process grid %dx%d needs %d PEs, not %d", dom.nx, dom.ny,
                                    dom.px, dom.py, dom.px * dom.py, npes);
  const int cx = me % dom.px, cy = me / dom.px;
  int x0, lx, y0, ly;
  split_extent(dom.nx, dom.px, cx, x0, lx);
  split_extent(dom.ny, dom.py, cy, y0, ly);
  const int face = std::max((dom.nx + dom.px - 1) / dom.px, (dom.ny + dom.py - 1) / dom.py);

  Halo<T> h;
  h.peer[0] = cx + 1 < dom.px ? me + 1 : -1;
  h.peer[1] = cx > 0 ? me - 1 : -1;
  h.peer[2] = cy + 1 < dom.py ? me + dom.px : -1;
  h.peer[3] = cy > 0 ? me - dom.px : -1;
  h.face = face;
  h.send = (T*)nvshmem_malloc(4 * (size_t)face * sizeof(T));
  h.recv = (T*)nvshmem_malloc(8 * (size_t)face * sizeof(T));
  h.sig = (uint64_t*)nvshmem_calloc(4, sizeof(uint64_t));
  if (!h.send || !h.recv || !h.sig) fail("nvshmem_malloc of %zu B failed (raise NVSHMEM_SYMMETRIC_SIZE)",
                                         12 * (size_t)face * sizeof(T));

  const size_t cells = (size_t)(lx + 2) * (ly + 2);
  T *u, *v;
  CHECK_CUDA(cudaMalloc(&u, cells * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&v, cells * sizeof(T)));
  fill_initial<T><<<1024, 256>>>(u, x0, y0, lx + 2, ly + 2, dom.ny, seed);
  CHECK_CUDA(cudaMemcpy(v, u, cells * sizeof(T), cudaMemcpyDeviceToDevice));

  const long long interior = (long long)std::max(0, lx - 2) * std::max(0, ly - 2);
  const long long frame_cells = (long long)lx * ly - interior;
  const long long cap = 8LL * gpu.sms;
  const int launch_blocks = 1 + (int)std::min((interior + kThreads - 1) / kThreads, cap);
  const int frame_blocks = (int)std::max(1LL, std::min((frame_cells + kThreads - 1) / kThreads, cap));
  int per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, jacobi_persistent<T>, kPersistentThreads, 0));
  const long long resident = gpu.local_pes <= 1 ? (long long)per_sm * gpu.sms
                                                : std::max(1LL, (long long)per_sm * gpu.sms / (2LL * gpu.local_pes));
  const long long need = (interior + 128 + kCellsPerThread * kPersistentThreads - 1) / (kCellsPerThread * kPersistentThreads);
  // The on-chip kernel where the block of cells fits one block's shared memory (the channel stencil's rule).
  const size_t onchip_bytes = 2 * cells * sizeof(T);
  cudaFuncAttributes onchip_attr;
  CHECK_CUDA(cudaFuncGetAttributes(&onchip_attr, jacobi_onchip<T>));
  const bool fits = onchip_bytes + onchip_attr.sharedSizeBytes <= gpu.shared_limit;
  const bool onchip = persistent && o.persistent_kernel != "grid" && (fits || o.persistent_kernel == "onchip");
  if (onchip && !fits)
    fail("persistent_kernel=onchip: a block of %dx%d cells needs %zu B of shared memory, past one block's %zu B", lx,
         ly, onchip_bytes + onchip_attr.sharedSizeBytes, gpu.shared_limit);
  if (onchip)
    CHECK_CUDA(cudaFuncSetAttribute(jacobi_onchip<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)onchip_bytes));
  const int persistent_blocks = onchip ? 1 : (int)std::max(1LL, std::min(need, resident));
  CHECK_CUDA(cudaDeviceSynchronize());
  nvshmem_barrier_all();

  long long step = 0;  // iterations run so far (the signals' values)
  T* cur[2] = {u, v};
  int at = 0;
  unsigned long long* clocks;  // the persistent kernels' stamps: iteration timed_from's start, the end
  CHECK_CUDA(cudaMalloc(&clocks, 2 * sizeof(unsigned long long)));
  int timed_from = 0;
  auto steps = [&](long long n) {
    timed_from = (int)std::min((long long)npes, n - 1);
    if (onchip) {
      jacobi_onchip<T><<<1, kOnchipThreads, onchip_bytes>>>(h, cur[at], cur[1 - at], lx, ly, step, (int)n, clocks,
                                                            timed_from);
      at = (int)((at + n) % 2);
    } else if (persistent) {
      T* a = cur[at];
      T* b = cur[1 - at];
      int ilx = lx, ily = ly, in = (int)n, block_frame = frame_cells <= kPersistentThreads;
      long long first = step;
      void* args[] = {&h, &a, &b, &ilx, &ily, &first, &in, &block_frame, &clocks, &timed_from};
      CHECK_CUDA(cudaLaunchCooperativeKernel((void*)jacobi_persistent<T>, dim3(persistent_blocks), dim3(kPersistentThreads),
                                             args, 0, 0));
      at = (int)((at + n) % 2);
    } else {
      for (long long i = 0; i < n; ++i) {
        jacobi_exchange_interior<T><<<launch_blocks, kThreads>>>(h, cur[at], cur[1 - at], lx, ly, step + i);
        jacobi_frame<T><<<frame_blocks, kThreads>>>(cur[at], cur[1 - at], lx, ly);
        at = 1 - at;
      }
    }
    CHECK_CUDA(cudaGetLastError());
    step += n;
  };

  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  if (o.warmup > 0) steps(o.warmup);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> mine(o.samples), slowest(o.samples), mine_events(o.samples), slowest_events(o.samples);
  for (long long s = 0; s < o.samples; ++s) {
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_CUDA(cudaEventRecord(start));
    steps(o.iters);
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    mine_events[s] = (double)ms * 1e3 / (double)o.iters;  // us an iteration
    mine[s] = mine_events[s];
    if (persistent) {  // the device's clock from iteration timed_from on
      unsigned long long stamp[2];
      CHECK_CUDA(cudaMemcpy(stamp, clocks, sizeof(stamp), cudaMemcpyDeviceToHost));
      mine[s] = (double)(stamp[1] - stamp[0]) * 1e-3 / (double)(o.iters - timed_from);
    }
  }
  MPI_Allreduce(mine.data(), slowest.data(), (int)o.samples, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(mine_events.data(), slowest_events.data(), (int)o.samples, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  bool checked = false;
  if ((long long)dom.nx * dom.ny <= o.check_cells) {
    const size_t whole = (size_t)(dom.nx + 2) * (dom.ny + 2);
    T *a, *b;
    CHECK_CUDA(cudaMalloc(&a, whole * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&b, whole * sizeof(T)));
    fill_initial<T><<<1024, 256>>>(a, 0, 0, dom.nx + 2, dom.ny + 2, dom.ny, seed);
    CHECK_CUDA(cudaMemcpy(b, a, whole * sizeof(T), cudaMemcpyDeviceToDevice));
    for (long long i = 0; i < step; ++i) {
      jacobi_whole<T><<<1024, 256>>>(a, b, dom.nx, dom.ny);
      std::swap(a, b);
    }
    unsigned long long* bad;
    CHECK_CUDA(cudaMalloc(&bad, sizeof(unsigned long long)));
    CHECK_CUDA(cudaMemset(bad, 0, sizeof(unsigned long long)));
    count_mismatches<T><<<1024, 256>>>(cur[at], a, lx, ly, x0, y0, dom.ny, bad);
    unsigned long long mismatches = 0, all = 0;
    CHECK_CUDA(cudaMemcpy(&mismatches, bad, sizeof(mismatches), cudaMemcpyDeviceToHost));
    MPI_Allreduce(&mismatches, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (all) fail("%s %s %dx%d on %dx%d: %llu cell(s) differ from the one-GPU reference after %lld steps",
                  persistent ? "persistent" : "launch", dtype, dom.nx, dom.ny, dom.px, dom.py, all, step);
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFree(bad));
    checked = true;
  }

  if (me == 0) {
    const double med = median_of(slowest), best = *std::min_element(slowest.begin(), slowest.end());
    const int big_x = (dom.nx + dom.px - 1) / dom.px, big_y = (dom.ny + dom.py - 1) / dom.py;
    const size_t halo_bytes = npes > 1 ? 2 * (size_t)(big_x + big_y) * sizeof(T) : 0;
    char timing[96] = "";
    if (persistent)
      std::snprintf(timing, sizeof(timing), ", \"event_us\": %.4f, \"timed_from\": %d", median_of(slowest_events),
                    timed_from);
    std::printf("{\"impl\": \"nvshmem-%s\", \"bytes\": %zu, \"dtype\": \"%s\", \"domain\": \"%dx%d\", "
                "\"grid\": \"mesh:%dx%d\", \"nranks\": %d, \"local\": \"%dx%d\", \"time_per_iter_us\": %.4f, "
                "\"min_us\": %.4f, \"gcells_per_s\": %.4f, \"iters\": %lld, \"samples\": %lld, \"blocks\": %d%s%s%s}\n",
                persistent ? "persistent" : "launch", halo_bytes, dtype, dom.nx, dom.ny, dom.px, dom.py, npes, big_x,
                big_y, med, best, (double)dom.nx * dom.ny / (med * 1e-6) / 1e9, o.iters, o.samples,
                persistent ? persistent_blocks : launch_blocks, timing,
                onchip ? ", \"kernel\": \"onchip\"" : persistent ? ", \"kernel\": \"grid\"" : "",
                checked ? ", \"checked\": true" : "");
    std::fflush(stdout);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaFree(clocks));
  CHECK_CUDA(cudaDeviceSynchronize());
  nvshmem_barrier_all();  // every put into this case's buffers is done on every PE before they go
  CHECK_CUDA(cudaFree(u));
  CHECK_CUDA(cudaFree(v));
  nvshmem_free(h.send);
  nvshmem_free(h.recv);
  nvshmem_free(h.sig);
}

int main(int argc, char** argv) {
  const Job job = start_job(&argc, &argv);
  const Options o = parse(argc, argv);

  const int ndev = gpu_count();
  Gpu gpu;
  gpu.device = job.local_rank % ndev;
  gpu.local_pes = 0;  // PEs of this node on this GPU (PEs take GPUs round-robin by local rank)
  for (int r = 0; r < job.local_size; ++r) gpu.local_pes += r % ndev == gpu.device ? 1 : 0;
  CHECK_CUDA(cudaSetDevice(gpu.device));  // before nvshmem_init, which binds this PE to the current GPU
  nvshmem_init();                          // NVSHMEM_BOOTSTRAP=MPI: the MPI job started above
  const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, gpu.device));
  gpu.sms = prop.multiProcessorCount;  // under an MPS share, the capped count
  gpu.shared_limit = prop.sharedMemPerBlockOptin;

  if (me == 0) {
    std::printf("{\"info\": {\"nvshmem_header_version\": \"%d.%d.%d\", \"gpu\": \"%s\", \"sms\": %d, \"npes\": %d, "
                "\"pes_on_gpu\": %d, \"iters\": %lld, \"warmup\": %lld, \"samples\": %lld}}\n",
                NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION, prop.name,
                gpu.sms, npes, gpu.local_pes, o.iters, o.warmup, o.samples);
    std::fflush(stdout);
  }
  unsigned long long case_index = 0;
  for (const Domain& dom : o.domains) {
    for (int t = 0; t < 2; ++t) {
      if (!(t == 0 ? o.f32 : o.f64)) continue;
      for (int f = 0; f < 2; ++f) {
        if (!(f == 0 ? o.launch : o.persistent)) continue;
        const unsigned long long seed = o.seed + 0x1000003ull * (++case_index);
        if (t == 0) run_case<float>(o, dom, "float32", f == 1, gpu, me, npes, seed);
        else run_case<double>(o, dom, "float64", f == 1, gpu, me, npes, seed);
      }
    }
  }
  nvshmem_finalize();
  MPI_Finalize();
  return 0;
}
