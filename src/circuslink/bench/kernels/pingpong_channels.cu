// Channel pingpong and one-way streaming kernels (circuslink bench pingpong / stream), on the public
// device API only. Every sample is a loop of many round trips (or messages) in one launch, timed by
// %globaltimer at its two ends: the timer ticks every 32 ns or more, so single round trips are never
// timed alone. Clocks start only after a device-side handshake between the two ranks (the warm-up round
// trips of a pingpong; a ready message in a stream), so the ranks' launch skew is never timed.
//
//   pingpong: rank 0 writes n bytes, rank 1 passes them straight back from its ring (forward: no
//             staging copy), rank 0 reads them; one-way time = loop time / (2 x round trips)
//   stream:   rank 0 writes `iters` messages of n bytes back to back, rank 1 reads them and answers
//             with one 4-byte acknowledgement; time = rank 0's start to the acknowledgement
//
// times[0], times[1]: the loop's start and end on rank 0 (times[2]: SM cycles between them, warp forms).
// status: set to 0 when a call fails.
#include <circuslink/channel.cuh>
#include <circuslink/grid.cuh>

using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;
using circuslink::detail::block_thread;
using circuslink::detail::grid_warp;
using circuslink::detail::grid_warps;
using circuslink::detail::ld_relaxed;
using circuslink::detail::st_relaxed;

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
    long long cycles = 0;
    for (int it = 0; ok && it < warmup + iters; ++it) {
      if (it == warmup && threadIdx.x == 0) {
        times[0] = now_ns();
        cycles = clock64();
      }
      ok = out.write_warp(src, n) && in.read_warp(dst, n);
    }
    if (threadIdx.x == 0) {
      times[1] = now_ns();
      times[2] = clock64() - cycles;  // the SM clock while it ran (a slow clock slows every instruction)
    }
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
  const unsigned int warp = block_thread() / 32;
  bool ok = true;
  if (role == 0) {
    auto out = tx.session();
    auto in = rx.session();
    for (int it = 0; it < warmup + iters; ++it) {
      if (it == warmup && block_thread() == 0) times[0] = now_ns();
      if (warp == 0 && ok) ok = out.write_warp(src, n);
      if (warp == 1 && ok) ok = in.read_warp(dst, n);
      if (__syncthreads_or(!ok)) break;  // round trips never overlap; a failure stops both warps
    }
    if (block_thread() == 0) times[1] = now_ns();
    if (warp == 0) out.close();
    if (warp == 1) in.close();
  } else if (warp == 0) {
    auto out = tx.session();
    auto in = rx.session();
    for (int it = 0; ok && it < warmup + iters; ++it) ok = in.forward_warp(out, n);
    out.close();
    in.close();
  }
  if (!ok && (block_thread() & 31) == 0) atomicExch(status, 0);
}

// Every warp of a co-resident grid on each rank: the bandwidth path. Rank 0's warps split in two halves,
// one writing the message while the other reads the reply as it streams back, so the rings can be much
// smaller than the message (and stay in L2); rank 1's warps pass bulk packets straight back, slot to slot.
// Grid sessions keep packet numbers in registers, so no grid barrier runs between round trips: rank 0's
// writers start round trip k + 1 once its readers counted round trip k complete (`done`, zeroed).
extern "C" __global__ void pingpong_grid(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                         unsigned long long n, int role, int warmup, int iters,
                                         unsigned int* done, unsigned long long timeout_ns,
                                         unsigned long long* times, int* status) {
  const unsigned int w = grid_warp(), W = grid_warps(), lane = threadIdx.x & 31;
  bool ok = true;
  if (role == 1) {
    auto out = tx.grid_session();
    auto in = rx.grid_session();
    for (int it = 0; ok && it < warmup + iters; ++it) ok = in.forward(out, n);
    out.close();
    in.close();
  } else {
    const unsigned int writers = W / 2 > 0 ? W / 2 : 1, readers = W - writers;
    if (w < writers) {
      auto out = tx.grid_session(w, writers);
      for (int it = 0; ok && it < warmup + iters; ++it) {
        if (it > 0) {  // wait until every reading warp finished round trip it - 1 (bounded)
          const unsigned int want = (unsigned int)it * readers;
          unsigned long long deadline = 0;
          unsigned int spins = 0;
          while (ok && ld_relaxed(done) < want) {
            if (++spins == 4096) {
              spins = 0;
              const unsigned long long t = now_ns();
              if (deadline == 0) deadline = t + (timeout_ns ? timeout_ns : ~0ull / 2);
              else if (t > deadline) ok = false;
            }
          }
          ok = __all_sync(0xffffffffu, ok);
        }
        if (it == warmup && w == 0 && lane == 0) times[0] = now_ns();
        ok = ok && out.write(src, n);
      }
      out.close();
    } else {
      auto in = rx.grid_session(w - writers, readers);
      for (int it = 0; ok && it < warmup + iters; ++it) {
        ok = in.read(dst, n);
        __syncwarp();
        if (lane == 0) {
          __threadfence();
          const unsigned int before = atomicAdd(done, 1u);
          if (before + 1 == (unsigned int)(warmup + iters) * readers) times[1] = now_ns();  // the last one
        }
      }
      in.close();
    }
  }
  if (!ok && lane == 0) atomicExch(status, 0);
}

// The rendezvous kernels' blocks an SM (their register cap): 3 (80 registers) fits more blocks, at the price of
// spills (ptxas, sm_90: stream_rdv 144 bytes, pingpong_rdv 68; none at 2, where they take 114-118 registers).
// -DCIRCUSLINK_BENCH_RDV_BLOCKS_PER_SM=2 through CIRCUSLINK_DEVICE_DEFINES is the A/B (not yet run).
#ifndef CIRCUSLINK_BENCH_RDV_BLOCKS_PER_SM
#define CIRCUSLINK_BENCH_RDV_BLOCKS_PER_SM 3
#endif
#define RDV_BLOCKS_PER_SM CIRCUSLINK_BENCH_RDV_BLOCKS_PER_SM

// Every warp of a co-resident grid on each rank, through channels opened with a window: messages of at least
// rendezvous_min bytes are pulled by the reader's grid straight from the writer's window (one copy a
// direction, as NVSHMEM's put). Rank 1 reads each message into its own window (`src` there), and once its whole
// grid has it (grid barrier) writes it back from there; rank 0 writes from its window and reads the reply into
// `dst`. A write returns on each warp once the reader has pulled the message, so the next round trip cannot
// overtake this one; rank 0 stops its clock after a last grid barrier. bar: 2 zeroed u32s.
extern "C" __global__ void __launch_bounds__(256, RDV_BLOCKS_PER_SM) pingpong_rdv(Tx tx, Rx rx, unsigned char* src, unsigned char* dst, unsigned long long n,
                                        int role, int warmup, int iters, unsigned int* bar,
                                        unsigned long long timeout_ns, unsigned long long* times, int* status) {
  const unsigned int lane = threadIdx.x & 31;
  const bool first = blockIdx.x == 0 && threadIdx.x == 0;
  bool ok = true;
  auto out = tx.grid_session();
  auto in = rx.grid_session();
  for (int it = 0; ok && it < warmup + iters; ++it) {
    if (role == 0) {
      if (it == warmup && first) times[0] = now_ns();
      ok = out.write(src, n) && in.read(dst, n);
    } else {
      ok = in.read(src, n);
      ok = circuslink::grid_sync(bar, timeout_ns) && ok;  // the whole message is in before it goes back
      ok = ok && out.write(src, n);
    }
  }
  out.close();
  in.close();
  if (role == 0) {
    ok = circuslink::grid_sync(bar, timeout_ns) && ok;  // every warp has its slice of the last reply
    if (first) times[1] = now_ns();
  }
  if (!ok && lane == 0) atomicExch(status, 0);
}

// One-way streaming, one warp a side. Rank 1 first sends a ready message; rank 0 starts its clock once it
// has it, so both kernels run when the clock starts.
extern "C" __global__ void stream_warp(Tx tx, Rx rx, Tx ack_tx, Rx ack_rx, const unsigned char* src,
                                       unsigned char* dst, unsigned long long n, int role, int iters,
                                       unsigned long long* times, int* status) {
  if (threadIdx.x >= 32) return;
  bool ok = true;
  unsigned int ack = 0xAC;
  if (role == 0) {
    auto out = tx.session();
    ok = ack_rx.read_warp(reinterpret_cast<unsigned char*>(&ack), 4);  // ready
    if (threadIdx.x == 0) times[0] = now_ns();
    for (int it = 0; ok && it < iters; ++it) ok = out.write_warp(src, n);
    ok = ok && ack_rx.read_warp(reinterpret_cast<unsigned char*>(&ack), 4);
    if (threadIdx.x == 0) times[1] = now_ns();
    out.close();
  } else {
    auto in = rx.session();
    ok = ack_tx.write_warp(reinterpret_cast<const unsigned char*>(&ack), 4);
    for (int it = 0; ok && it < iters; ++it) ok = in.read_warp(dst, n);
    in.close();
    ok = ok && ack_tx.write_warp(reinterpret_cast<const unsigned char*>(&ack), 4);
  }
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}

// One-way streaming, every warp of a co-resident grid a side, through grid sessions (no barrier per
// message). The handshake: rank 1's warp 0 sends a ready message, rank 0's warp 0 takes it and opens
// `gate`; rank 0's other warps start when the gate is open. At the end each of rank 1's warps counts
// itself in `done`; the last one sends the acknowledgement, and rank 0's warp 0 stops the clock on it.
// gate and done: zeroed u32s. stream_rdv is the same for the rendezvous form, bounded as pingpong_rdv (80
// registers, 3 blocks an SM: 49 blocks at 2 ranks on one H200, where stream_grid fits 33).
__device__ __forceinline__ void stream_body(Tx tx, Rx rx, Tx ack_tx, Rx ack_rx, const unsigned char* src,
                                            unsigned char* dst, unsigned long long n, int role, int iters,
                                            unsigned int* gate, unsigned int* done, unsigned long long timeout_ns,
                                            unsigned long long* times, int* status) {
  const unsigned int w = grid_warp(), W = grid_warps(), lane = threadIdx.x & 31;
  bool ok = true;
  unsigned int ack = 0xAC;
  if (role == 0) {
    if (w == 0) {
      ok = ack_rx.read_warp(reinterpret_cast<unsigned char*>(&ack), 4);  // ready: rank 1 is running
      if (lane == 0) {
        times[0] = now_ns();
        __threadfence();
        st_relaxed(gate, 1u);
      }
    } else {
      unsigned long long deadline = 0;
      unsigned int spins = 0;
      while (ok && ld_relaxed(gate) == 0u) {
        if (++spins == 4096) {
          spins = 0;
          const unsigned long long t = now_ns();
          if (deadline == 0) deadline = t + (timeout_ns ? timeout_ns : ~0ull / 2);
          else if (t > deadline) ok = false;
        }
      }
    }
    ok = __all_sync(0xffffffffu, ok);
    auto out = tx.grid_session();
    for (int it = 0; ok && it < iters; ++it) ok = out.write(src, n);
    out.close();
    if (w == 0) {
      ok = ack_rx.read_warp(reinterpret_cast<unsigned char*>(&ack), 4) && ok;
      if (lane == 0) times[1] = now_ns();
    }
  } else {
    if (w == 0) ok = ack_tx.write_warp(reinterpret_cast<const unsigned char*>(&ack), 4);
    auto in = rx.grid_session();
    for (int it = 0; ok && it < iters; ++it) ok = in.read(dst, n);
    in.close();
    unsigned int last = 0;
    if (lane == 0) {
      __threadfence();
      last = atomicAdd(done, 1u) + 1 == W;
      if (last) __threadfence();
    }
    if (__shfl_sync(0xffffffffu, last, 0)) ok = ack_tx.write_warp(reinterpret_cast<const unsigned char*>(&ack), 4) && ok;
  }
  if (!ok && lane == 0) atomicExch(status, 0);
}
extern "C" __global__ void stream_grid(Tx tx, Rx rx, Tx ack_tx, Rx ack_rx, const unsigned char* src,
                                       unsigned char* dst, unsigned long long n, int role, int iters,
                                       unsigned int* gate, unsigned int* done, unsigned long long timeout_ns,
                                       unsigned long long* times, int* status) {
  stream_body(tx, rx, ack_tx, ack_rx, src, dst, n, role, iters, gate, done, timeout_ns, times, status);
}
extern "C" __global__ void __launch_bounds__(256, RDV_BLOCKS_PER_SM) stream_rdv(Tx tx, Rx rx, Tx ack_tx, Rx ack_rx,
    const unsigned char* src, unsigned char* dst, unsigned long long n, int role, int iters, unsigned int* gate,
    unsigned int* done, unsigned long long timeout_ns, unsigned long long* times, int* status) {
  stream_body(tx, rx, ack_tx, ack_rx, src, dst, n, role, iters, gate, done, timeout_ns, times, status);
}
