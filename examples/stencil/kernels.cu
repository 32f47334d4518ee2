// A 2-D 5-point Jacobi stencil whose halos travel through circuslink channels from inside the kernel.
//
// A rank's block is an array of (lx + 2) x (ly + 2) cells, x the slow axis: cell (i, j) at i * (ly + 2) + j,
// interior 1 <= i <= lx, 1 <= j <= ly, ghost cells around (the neighbours' edges, or the fixed boundary).
// CELL_UPDATE(xm, xp, ym, yp) is the update, traced from stencil.py's cell_update() and put in front of this
// file by stencil.compile_kernels(): one definition for numpy and for these kernels.
//
// Launch form, one iteration = two launches on one stream:
//   jacobi_exchange_interior  block 0's warps 0..3 exchange the halo of one direction each (+x, -x, +y, -y)
//                             while every other thread updates the cells that need no ghost cell
//   jacobi_frame              the cells beside the ghosts, once the halos are in
// Persistent form, one launch for every iteration: the same two phases separated by grid_sync, on a grid
// launched with world.backend.launch_resident (every block resident at once); on a small block of cells, block 0
// updates the frame right after its exchange, and one grid_sync an iteration is enough.
// On-chip persistent form (jacobi_onchip), for a rank's block that fits one SM's shared memory: one block holds
// both buffers there for the whole run; the same two phases separated by __syncthreads, so no grid barrier and
// no cell's trip through L2 in any iteration.
//
// Timing: the persistent kernels stamp the device's clock (%globaltimer, one clock for every process on a GPU)
// into clocks[0] as iteration timed_from begins and into clocks[1] after the last, when clocks is not null. The
// host divides by the iterations between: time per iteration from inside the kernel, after a handshake (a rank's
// iteration k waits for its neighbours' halos of iteration k, so once timed_from reaches the process grid's
// diameter every rank has provably started: docs/user-kernels.md), so neither launch latency nor one rank's late
// start is counted.
//
// Every channel call and every grid_sync returns false on failure (a time-out or the host's abort); the
// kernels then set *failed and leave together, and the host raises the channel's recorded error.
#include <circuslink/channel.cuh>
#include <circuslink/grid.cuh>
#include <circuslink/halo.cuh>

#ifndef CELL_UPDATE
#error "CELL_UPDATE(xm, xp, ym, yp) comes from stencil.py (cell_update_cxx()): compile through stencil.compile_kernels()"
#endif

namespace {

constexpr int kExchangeThreads = 4 * 32;  // one warp a direction, in block 0

__device__ __forceinline__ unsigned long long device_clock_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// STENCIL_PHASES (a dev build, scripts/dev/stencil_phases.py): the on-chip kernel sums, for lane 0 of warps 0..4,
// the clock64 cycles each phase of an iteration takes, into clocks[2 + 8 * warp + phase].
#ifdef STENCIL_PHASES
#define PHASE_MARK(k)                                                           \
  do {                                                                          \
    const long long now_ = clock64();                                           \
    phase_sum[k] += now_ - phase_at;                                            \
    phase_at = now_;                                                            \
  } while (0)
#else
#define PHASE_MARK(k) \
  do {                \
  } while (0)
#endif

template <typename T>
__device__ __forceinline__ void update(const T* u, T* v, int ly, int i, int j) {
  const long long w = ly + 2, c = i * w + j;
  const T xm = u[c - w], xp = u[c + w], ym = u[c - 1], yp = u[c + 1];
  v[c] = CELL_UPDATE(xm, xp, ym, yp);
}

// Cell k of the edge sent toward direction d (+x 0, -x 1, +y 2, -y 3), and of the ghost row or column the
// halo from direction d lands in.
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

// Edges of at most this many cells are packed in shared memory (the channel calls take shared or global
// buffers): the write then loads its payload from shared memory and the unpack reads the halo from there, where
// global staging would add two round trips through L2 to every exchange. Longer edges stage in send / recv.
constexpr int kSharedEdge = 128;

// One full warp: send this rank's edge toward d through tx, receive the neighbour's through rx into the ghosts: in
// place toward +-x (rows), packed and unpacked through staging toward +-y (columns). The write comes first on both
// sides; a channel deeper than one edge never makes it wait. The ends are Sender / Receiver (each call loads the
// end's state from global memory and stores it back) or, in a kernel that exchanges every iteration with the same
// warp, sessions (the state stays in registers). One call site for each of write and read: a second would double
// the inlined channel code and spill registers.
template <typename T, typename Tx, typename Rx>
__device__ bool exchange_through(Tx& tx, Rx& rx, int d, T* u, int lx, int ly, T* send, T* recv,
                                 long long* phase_sum = nullptr, long long phase_at = 0) {
  __shared__ T staged[4][2][kSharedEdge];  // [direction][out, in][cell]
  const int n = d < 2 ? ly : lx;
  const int face = lx > ly ? lx : ly;
  const bool row = d < 2, small = n <= kSharedEdge;
  T* out = row ? u + edge_cell(d, 0, lx, ly) : small ? staged[d][0] : send + d * face;
  T* in = row ? u + ghost_cell(d, 0, lx, ly) : small ? staged[d][1] : recv + d * face;
  const unsigned int lane = threadIdx.x & 31u;
  if (!row) {
    for (int k = lane; k < n; k += 32) out[k] = u[edge_cell(d, k, lx, ly)];
    __syncwarp();
  }
  if (!tx.write_warp(out, n)) return false;
  PHASE_MARK(0);
  if (!rx.read_warp(in, n)) return false;
  PHASE_MARK(1);
  if (!row) {
    __syncwarp();
    for (int k = lane; k < n; k += 32) u[ghost_cell(d, k, lx, ly)] = in[k];
  }
  PHASE_MARK(2);
  return true;
}

// The same through the plain ends of direction d, copied out of the handle first: calling through halo.to[d]
// itself would copy the whole handle (about 1 KB) to every thread's stack (docs/user-kernels.md, "What each call
// costs").
template <typename T>
__device__ bool exchange(const circuslink::Halo<T>& halo, int d, T* u, int lx, int ly, T* send, T* recv) {
  if (!halo.has(d)) return true;
  const circuslink::Sender<T> tx = halo.to[d];
  const circuslink::Receiver<T> rx = halo.from[d];
  return exchange_through(tx, rx, d, u, lx, ly, send, recv);
}

// The cells that need no ghost cell, 2..lx-1 x 2..ly-1: worker `me` of `workers` takes me, me + workers, ...
template <typename T>
__device__ void interior(const T* u, T* v, int lx, int ly, int me, int workers) {
  const int nx = lx - 2, ny = ly - 2;
  if (nx <= 0 || ny <= 0) return;
  // Cells me, me + workers, ... of the nx x ny interior, row by row: one division before the loop, none in it
  // (two per cell were a good part of a small domain's time).
  const int di = workers / ny, dj = workers % ny;
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

// Phase 1: block 0's first four warps exchange; the other threads update the interior.
template <typename T>
__device__ void exchange_and_interior(const circuslink::Halo<T>& halo, T* u, T* v, int lx, int ly, T* send,
                                      T* recv, int* failed) {
  const int warp = threadIdx.x / 32;
  if (blockIdx.x == 0 && warp < 4) {
    if (!exchange(halo, warp, u, lx, ly, send, recv) && (threadIdx.x & 31u) == 0) atomicExch(failed, 1);
    return;
  }
  interior(u, v, lx, ly, blockIdx.x * blockDim.x + threadIdx.x - kExchangeThreads,
           gridDim.x * blockDim.x - kExchangeThreads);
}

// Phase 2: the cells beside the ghost cells (the whole block when it is 1 or 2 cells thin), by every thread.
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

}  // namespace

template <typename T>
__global__ void jacobi_exchange_interior(circuslink::Halo<T> halo, T* u, T* v, int lx, int ly, T* send, T* recv,
                                         int* failed) {
  exchange_and_interior(halo, u, v, lx, ly, send, recv, failed);
}

template <typename T>
__global__ void jacobi_frame(const T* u, T* v, int lx, int ly) {
  frame(u, v, lx, ly, (long long)blockIdx.x * blockDim.x + threadIdx.x, (long long)gridDim.x * blockDim.x);
}

// Every iteration in one launch. Every thread reaches every grid_sync (a failed exchange only sets *failed).
// *failed is read right after a barrier and looked at just before the next one: every block then leaves at the
// same barrier, and the load's round trip through L2 hides behind an iteration's work instead of adding to it (an
// iteration after a failure runs to its end: its channel calls fail at once, as the channel's error is recorded).
// block_frame (a frame of at most one cell a thread of block 0): block 0 updates the frame itself once its warps
// have the halos (its own barrier), so an iteration needs one grid barrier, not two. On a small domain the grid
// barrier is most of an iteration's time; on a large one the frame is better spread over the grid.
// At most kPersistentThreads a block: the channel calls take up to 160 registers a thread, which would leave a
// block of more threads no room; the bound keeps it to 128 (a few bytes spill).
constexpr int kPersistentThreads = 512;
template <typename T>
__global__ void __launch_bounds__(kPersistentThreads)
    jacobi_persistent(circuslink::Halo<T> halo, T* u, T* v, int lx, int ly, T* send, T* recv, int* failed,
                      circuslink::GridBarrier bar, int iters, int block_frame, unsigned long long* clocks,
                      int timed_from) {
  const long long me = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long threads = (long long)gridDim.x * blockDim.x;
  // Block 0's warp d < 4 exchanges with the neighbour in direction d every iteration, through sessions (the
  // on-chip kernel says why).
  const int warp = threadIdx.x / 32;
  const bool exchange_warp = blockIdx.x == 0 && warp < 4;
  const bool exchanger = exchange_warp && halo.has(warp);
  circuslink::SendSession<T> tx{};
  circuslink::RecvSession<T> rx{};
  if (exchanger) {
    tx = halo.to[warp].session();
    rx = halo.from[warp].session();
  }
  int stop = 0;  // *failed as read after the last barrier: the same in every block
  for (int it = 0; it < iters; ++it) {
    if (it == timed_from && me == 0 && clocks != nullptr) clocks[0] = device_clock_ns();
    if (exchange_warp) {
      if (exchanger && !exchange_through(tx, rx, warp, u, lx, ly, send, recv) && (threadIdx.x & 31u) == 0)
        atomicExch(failed, 1);
    } else {
      interior(u, v, lx, ly, me - kExchangeThreads, threads - kExchangeThreads);
    }
    if (block_frame && blockIdx.x == 0) {
      __syncthreads();  // the halos are in this block's ghost cells
      frame(u, v, lx, ly, threadIdx.x, blockDim.x);
    }
    if (stop) return;
    if (!circuslink::grid_sync(bar)) {
      if (me == 0) atomicExch(failed, 1);
      return;
    }
    stop = *static_cast<volatile int*>(failed);
    if (!block_frame) {
      frame(u, v, lx, ly, me, threads);
      if (stop) return;
      if (!circuslink::grid_sync(bar)) {
        if (me == 0) atomicExch(failed, 1);
        return;
      }
    }
    T* t = u;
    u = v;
    v = t;
  }
  if (me == 0 && clocks != nullptr) clocks[1] = device_clock_ns();
  if (exchanger) {  // the ends' state back to global memory, for the next launch
    tx.close();
    rx.close();
  }
}

// Every iteration in one launch of one block, both buffers (ghosts included) in dynamic shared memory:
// 2 x (lx + 2) x (ly + 2) cells, which stencil.py checks against the SM's opt-in limit before it picks this form.
// Why: on a small block a grid form's iteration is mostly its grid barrier and the round trips of every cell
// through L2 (measured on one H200: 2.1 us an iteration at 64x64 on one rank with no exchange at all); here the
// barriers are the block's own and the cells are a shared-memory load away. The phases are the grid form's:
// warps 0..3 exchange (the halos land in the ghost cells in shared memory) while the others update the interior,
// then every thread updates the frame. The latest step goes back to u after an even number of iterations, to v
// after an odd one, where the grid form leaves it.
constexpr int kOnchipThreads = 512;
template <typename T>
__global__ void __launch_bounds__(kOnchipThreads)
    jacobi_onchip(circuslink::Halo<T> halo, T* u, T* v, int lx, int ly, T* send, T* recv, int* failed, int iters,
                  unsigned long long* clocks, int timed_from) {
  extern __shared__ __align__(16) unsigned char onchip_cells[];
  const long long cells = (long long)(lx + 2) * (ly + 2);
  T* su = reinterpret_cast<T*>(onchip_cells);
  T* sv = su + cells;
  // A failed exchange of iteration it sets stop[it % 2] (and *failed, for the host) before the iteration's first
  // barrier; every thread reads it after the second. Two flags: iteration it + 1's exchange may fail before a
  // slower thread has read iteration it's flag, and must not change what that thread reads. In shared memory: a
  // read of *failed would be a trip to L2 every iteration.
  __shared__ int stop[2];
  if (threadIdx.x < 2) stop[threadIdx.x] = 0;
  for (long long c = threadIdx.x; c < cells; c += blockDim.x) {
    const T x = u[c];
    su[c] = x;
    sv[c] = x;  // the ghosts past the domain's edge stay fixed in both buffers
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  // Warp d < 4 exchanges with the neighbour in direction d, if any, every iteration: it holds both ends as sessions
  // for the whole launch, so no call loads or stores an end's state (measured on one H200, 2 ranks, 8x8 a rank:
  // a plain write_warp took 0.8 us of a 2 us iteration, the most of it those two trips through L2).
  const bool exchanger = warp < 4 && halo.has(warp);
  circuslink::SendSession<T> tx{};
  circuslink::RecvSession<T> rx{};
  if (exchanger) {
    tx = halo.to[warp].session();
    rx = halo.from[warp].session();
  }
#ifdef STENCIL_PHASES
  long long phase_sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  long long phase_at = clock64();
#else
  long long* const phase_sum = nullptr;
  const long long phase_at = 0;
#endif
  for (int it = 0; it < iters; ++it) {
    if (it == timed_from && threadIdx.x == 0 && clocks != nullptr) clocks[0] = device_clock_ns();
#ifdef STENCIL_PHASES
    phase_at = clock64();
#endif
    if (warp < 4) {
      if (exchanger && !exchange_through(tx, rx, warp, su, lx, ly, send, recv, phase_sum, phase_at) &&
          (threadIdx.x & 31u) == 0) {
        atomicExch(failed, 1);
        stop[it % 2] = 1;
      }
#ifdef STENCIL_PHASES
      phase_at = clock64();
#endif
    } else {
      interior(su, sv, lx, ly, threadIdx.x - kExchangeThreads, blockDim.x - kExchangeThreads);
      PHASE_MARK(3);
    }
    __syncthreads();  // the halos are in the ghost cells
    PHASE_MARK(4);
    frame(su, sv, lx, ly, threadIdx.x, blockDim.x);
    PHASE_MARK(5);
    __syncthreads();  // the step is whole, and nothing reads su any more
    PHASE_MARK(6);
    if (stop[it % 2]) return;  // every thread leaves after the same iteration
    T* t = su;
    su = sv;
    sv = t;
  }
  if (threadIdx.x == 0 && clocks != nullptr) clocks[1] = device_clock_ns();
  if (exchanger) {  // the ends' state back to global memory, for the next launch
    tx.close();
    rx.close();
  }
#ifdef STENCIL_PHASES
  if ((threadIdx.x & 31u) == 0 && warp < 5 && clocks != nullptr)
    for (int k = 0; k < 8; ++k) clocks[2 + 8 * warp + k] = (unsigned long long)phase_sum[k];
#endif
  T* out = iters % 2 == 0 ? u : v;
  for (long long c = threadIdx.x; c < cells; c += blockDim.x) out[c] = su[c];
}

template __global__ void jacobi_exchange_interior<float>(circuslink::Halo<float>, float*, float*, int, int, float*,
                                                         float*, int*);
template __global__ void jacobi_exchange_interior<double>(circuslink::Halo<double>, double*, double*, int, int,
                                                          double*, double*, int*);
template __global__ void jacobi_frame<float>(const float*, float*, int, int);
template __global__ void jacobi_frame<double>(const double*, double*, int, int);
template __global__ void jacobi_persistent<float>(circuslink::Halo<float>, float*, float*, int, int, float*, float*,
                                                  int*, circuslink::GridBarrier, int, int, unsigned long long*, int);
template __global__ void jacobi_persistent<double>(circuslink::Halo<double>, double*, double*, int, int, double*,
                                                   double*, int*, circuslink::GridBarrier, int, int,
                                                   unsigned long long*, int);
template __global__ void jacobi_onchip<float>(circuslink::Halo<float>, float*, float*, int, int, float*, float*, int*,
                                              int, unsigned long long*, int);
template __global__ void jacobi_onchip<double>(circuslink::Halo<double>, double*, double*, int, int, double*, double*,
                                               int*, int, unsigned long long*, int);
