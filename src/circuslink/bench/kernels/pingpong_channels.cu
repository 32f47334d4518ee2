// Channel pingpong and one-way streaming kernels (circuslink bench pingpong / stream), on the public
// device API only. Every sample is a loop of many round trips (or messages) in one launch, timed by
// %globaltimer at its two ends: the timer ticks every 32 ns or more, so single round trips are never
// timed alone. The first `warmup` round trips of a launch absorb the two ranks' launch skew.
//
//   pingpong: rank 0 writes n bytes, rank 1 passes them straight back from its ring (forward: no
//             staging copy), rank 0 reads them; one-way time = loop time / (2 x round trips)
//   stream:   rank 0 writes `iters` messages of n bytes back to back, rank 1 reads them and answers
//             with one 4-byte acknowledgement; time = rank 0's start to the acknowledgement
//
// times[0], times[1]: the loop's start and end on rank 0. status: set to 0 when a call fails.
#include <circuslink/channel.cuh>
#include <circuslink/grid.cuh>

using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;

__device__ __forceinline__ unsigned long long now_ns() { return circuslink::detail::globaltimer_ns(); }

// One warp on each rank: the latency path (sessions keep the ends' state in registers).
extern "C" __global__ void pingpong_warp(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                         unsigned long long n, int role, int warmup, int iters,
                                         unsigned long long* times, int* status) {
  if (threadIdx.x >= 32) return;
  auto out = tx.session();
  auto in = rx.session();
  bool ok = true;
  if (role == 0) {
    for (int it = 0; ok && it < warmup + iters; ++it) {
      if (it == warmup && threadIdx.x == 0) times[0] = now_ns();
      ok = out.write_warp(src, n) && in.read_warp(dst, n);
    }
    if (threadIdx.x == 0) times[1] = now_ns();
  } else {
    for (int it = 0; ok && it < warmup + iters; ++it) ok = in.forward_warp(out, n);
  }
  out.close();
  in.close();
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}

// The same with separate writing and reading warps on rank 0 (64 threads): rings smaller than the
// message work, since rank 0 reads the reply while it still writes (the 4-slot ring run).
extern "C" __global__ void pingpong_warp2(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                          unsigned long long n, int role, int warmup, int iters,
                                          unsigned long long* times, int* status) {
  const unsigned int warp = circuslink::detail::block_thread() / 32;
  bool ok = true;
  if (role == 0) {
    auto out = tx.session();
    auto in = rx.session();
    for (int it = 0; it < warmup + iters; ++it) {
      if (it == warmup && circuslink::detail::block_thread() == 0) times[0] = now_ns();
      if (warp == 0 && ok) ok = out.write_warp(src, n);
      if (warp == 1 && ok) ok = in.read_warp(dst, n);
      if (__syncthreads_or(!ok)) break;  // round trips never overlap; a failure stops both warps
    }
    if (circuslink::detail::block_thread() == 0) times[1] = now_ns();
    if (warp == 0) out.close();
    if (warp == 1) in.close();
  } else if (warp == 0) {
    auto out = tx.session();
    auto in = rx.session();
    for (int it = 0; ok && it < warmup + iters; ++it) ok = in.forward_warp(out, n);
    out.close();
    in.close();
  }
  if (!ok && (circuslink::detail::block_thread() & 31) == 0) atomicExch(status, 0);
}

// Every warp of a co-resident grid on each rank: the bandwidth path (bulk packets spread over warps).
extern "C" __global__ void pingpong_grid(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                         unsigned long long n, int role, int warmup, int iters,
                                         unsigned int* bar, unsigned long long timeout_ns,
                                         unsigned long long* times, int* status) {
  bool ok = true;
  for (int it = 0; ok && it < warmup + iters; ++it) {
    if (role == 0) {
      if (it == warmup && blockIdx.x == 0 && threadIdx.x == 0) times[0] = now_ns();
      ok = tx.write_grid(src, n) && rx.read_grid(dst, n);
    } else {
      ok = rx.forward_grid(tx, n);
    }
    ok = circuslink::grid_sync(bar, timeout_ns) && ok;  // the next grid call starts where this one left
  }
  if (role == 0 && blockIdx.x == 0 && threadIdx.x == 0) times[1] = now_ns();
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}

// One-way streaming, one warp a side.
extern "C" __global__ void stream_warp(Tx tx, Rx rx, Tx ack_tx, Rx ack_rx, const unsigned char* src,
                                       unsigned char* dst, unsigned long long n, int role, int iters,
                                       unsigned long long* times, int* status) {
  if (threadIdx.x >= 32) return;
  bool ok = true;
  unsigned int ack = 0xAC;
  if (role == 0) {
    auto out = tx.session();
    if (threadIdx.x == 0) times[0] = now_ns();
    for (int it = 0; ok && it < iters; ++it) ok = out.write_warp(src, n);
    ok = ok && ack_rx.read_warp(reinterpret_cast<unsigned char*>(&ack), 4);
    if (threadIdx.x == 0) times[1] = now_ns();
    out.close();
  } else {
    auto in = rx.session();
    for (int it = 0; ok && it < iters; ++it) ok = in.read_warp(dst, n);
    in.close();
    ok = ok && ack_tx.write_warp(reinterpret_cast<const unsigned char*>(&ack), 4);
  }
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}

// One-way streaming, every warp of a co-resident grid a side.
extern "C" __global__ void stream_grid(Tx tx, Rx rx, Tx ack_tx, Rx ack_rx, const unsigned char* src,
                                       unsigned char* dst, unsigned long long n, int role, int iters,
                                       unsigned int* bar, unsigned long long timeout_ns,
                                       unsigned long long* times, int* status) {
  bool ok = true;
  __shared__ unsigned int ack;
  if (threadIdx.x == 0) ack = 0xAC;
  if (role == 0 && blockIdx.x == 0 && threadIdx.x == 0) times[0] = now_ns();
  for (int it = 0; ok && it < iters; ++it) {
    ok = role == 0 ? tx.write_grid(src, n) : rx.read_grid(dst, n);
    ok = circuslink::grid_sync(bar, timeout_ns) && ok;
  }
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    if (role == 0) {
      ok = ok && ack_rx.read_warp(reinterpret_cast<unsigned char*>(&ack), 4);
      if (threadIdx.x == 0) times[1] = now_ns();
    } else {
      ok = ok && ack_tx.write_warp(reinterpret_cast<const unsigned char*>(&ack), 4);
    }
  }
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}
