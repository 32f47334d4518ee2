// CIRCUS's allreduce-like pipeline (bench/allreduce_like.py): A streams its vector to B, B adds its
// own as the data arrives and streams the sum back, striped over G channel pairs, one per block: A's
// blocks [0, G) write slice g of a into channel a->b g, blocks [G, 2G) read the sums of slice g back
// (and check them); B's block g reads slice g, adds b and writes the sum back, chunk by chunk, so
// receiving, adding and sending overlap inside the stream and across blocks. Every write up to the
// channel's ll_max goes as low-latency packets, larger ones as bulk packets (one protocol). Timing is
// %globaltimer inside A's kernel, `reps` times in one launch (the first absorb the launch skew).
// Public device API only (channel.cuh, grid.cuh, trace.cuh).
#include <circuslink/channel.cuh>
#include <circuslink/grid.cuh>
#include <circuslink/trace.cuh>

namespace tr = circuslink::trace;
typedef unsigned int u32;
typedef unsigned long long u64;

// Slice g of G of an n-element vector: contiguous, 4-element (16-byte) aligned.
__device__ __forceinline__ void slice_of(u64 n, u32 g, u32 G, u64& lo, u64& hi) {
  u64 quads = (n + 3) / 4, per = (quads + G - 1) / G;
  lo = per * 4 * g < n ? per * 4 * g : n;
  hi = per * 4 * (g + 1) < n ? per * 4 * (g + 1) : n;
}

__device__ __forceinline__ void fail(volatile int* failed, int code) {
  if (threadIdx.x == 0) *failed = code;
}

// Every block of A meets here between repetitions (A's grid fits its SM share: co-resident).
__device__ __forceinline__ bool meet(u32* bar, u64 timeout_ns, volatile int* failed) {
  return circuslink::grid_sync(bar, timeout_ns) && !*failed;
}

// times[3 * rep + 0, 1, 2] = t0 (A starts sending), t1 (first element of the sum back), t2 (last back)
extern "C" __global__ void __launch_bounds__(512, 2) ar_like_a(const circuslink::Sender<u32>* tx, const circuslink::Receiver<u32>* rx,
                                     u32 G, const u32* a, const u32* b_check, u32* out, u64 n, u64 chunk,
                                     u32 reps, u64* times, u64* mismatches, u32* bar, u64 timeout_ns,
                                     tr::Handle trace, volatile int* failed) {
  const bool writer = blockIdx.x < G;
  const u32 g = writer ? blockIdx.x : blockIdx.x - G;
  u64 lo, hi;
  slice_of(n, g, G, lo, hi);
  tr::record_block(trace, tr::KERNEL, tr::PHASE_BEGIN, 0);
  for (u32 rep = 0; rep < reps; ++rep) {
    if (!meet(bar, timeout_ns, failed)) { fail(failed, 4); return; }
    if (blockIdx.x == 0 && threadIdx.x == 0) times[3 * rep] = tr::now_ns();
    if (writer) {
      circuslink::Sender<u32> t = tx[g];
      for (u64 off = lo; off < hi; off += chunk) {
        u64 c = hi - off < chunk ? hi - off : chunk;
        if (!t.write_block(a + off, c)) { fail(failed, 2); return; }
        tr::record_block(trace, tr::SEND, tr::PHASE_INSTANT, g);
      }
    } else {
      circuslink::Receiver<u32> r = rx[g];
      u64 bad = 0;
      if (g == 0 && lo < hi && threadIdx.x == 0) {
        // t1: the first packet of the sum is here (its header valid), before it is copied out. A
        // rep starts on a packet boundary: B's writes and these reads move the same whole slices.
        if (r.session().peek()) times[3 * rep + 1] = tr::now_ns();
      }
      __syncthreads();  // warp 0 reconverges before the (warp-synchronous) LL read
      for (u64 off = lo; off < hi;) {
        u64 c = hi - off < chunk ? hi - off : chunk;
        if (!r.read_block(out + off, c)) { fail(failed, 3); return; }
        __syncthreads();
        tr::record_block(trace, tr::RECV, tr::PHASE_INSTANT, g);
        for (u64 i = off + threadIdx.x; i < off + c; i += blockDim.x) bad += out[i] != a[i] + b_check[i];
        off += c;
      }
      if (bad) atomicAdd(mismatches, bad);
      __syncthreads();
      if (threadIdx.x == 0) atomicMax(times + 3 * rep + 2, tr::now_ns());
    }
  }
  tr::record_block(trace, tr::KERNEL, tr::PHASE_END, 0);
}

extern "C" __global__ void __launch_bounds__(512, 2) ar_like_b(const circuslink::Receiver<u32>* rx, const circuslink::Sender<u32>* tx,
                                     u32 G, const u32* b, u32* tmp, u64 n, u64 chunk, u32 reps,
                                     tr::Handle trace, volatile int* failed) {
  const u32 g = blockIdx.x;
  u64 lo, hi;
  slice_of(n, g, G, lo, hi);
  circuslink::Receiver<u32> r = rx[g];
  circuslink::Sender<u32> t = tx[g];
  tr::record_block(trace, tr::KERNEL, tr::PHASE_BEGIN, 1);
  for (u32 rep = 0; rep < reps; ++rep) {
    for (u64 off = lo; off < hi; off += chunk) {
      u64 c = hi - off < chunk ? hi - off : chunk;
      if (!r.read_block(tmp + off, c)) { fail(failed, 3); return; }
      __syncthreads();
      tr::record_block(trace, tr::RECV, tr::PHASE_INSTANT, g);
      tr::record_block(trace, tr::COMPUTE, tr::PHASE_BEGIN, g);
      for (u64 i = off + threadIdx.x; i < off + c; i += blockDim.x) tmp[i] += b[i];
      __syncthreads();
      tr::record_block(trace, tr::COMPUTE, tr::PHASE_END, g);
      if (!t.write_block(tmp + off, c)) { fail(failed, 2); return; }
      tr::record_block(trace, tr::SEND, tr::PHASE_INSTANT, g);
    }
  }
  tr::record_block(trace, tr::KERNEL, tr::PHASE_END, 1);
}
