// Channel pingpong kernels (circuslink bench pingpong). Timed inside the kernels with
// %globaltimer, CIRCUS's definitions: t0 = first word out, t1 = first word of the reply back,
// t2 = last word of the reply back; latency = (t1 - t0) / 2, time = latency + (t2 - t1).
//
// Both kernels hold the channel ends' states in registers for the whole launch (the *_st forms)
// so that no state load sits on the latency path, and stage small messages in shared memory, as
// a kernel would send what it has just computed.
#include <circuslink/channel.cuh>

namespace cd = circuslink::detail;
using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;

#define PP_SMEM_BYTES 8192

// Low-latency mode, one launch for all iterations.
// role 0 (rank 0): 64 threads; warp 0 sends, warp 1 receives (so a ring smaller than the message
// cannot deadlock the pingpong). role 1 (rank 1): 32 threads; echoes in pieces of `piece` bytes
// (piece <= PP_SMEM_BYTES), so the reply streams back while the message still arrives.
// times: 3 x iters u64 (t0, t1, t2) written by role 0. status: set to 0 on a failed call.
extern "C" __global__ void pingpong_ll(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                       unsigned long long n, unsigned long long piece, int role, int iters,
                                       unsigned long long* times, int* status) {
  __shared__ __align__(16) unsigned char sbuf[PP_SMEM_BYTES];
  const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x & 31u;
  cd::SendState sst = cd::load_send_state(tx.h);
  cd::RecvState rst = cd::load_recv_state(rx.h);
  bool ok = true;
  if (role == 0) {
    const unsigned char* from = src;
    if (n <= PP_SMEM_BYTES) {
      for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) sbuf[i] = src[i];
      from = sbuf;
    }
    __syncthreads();
    for (int it = 0; it < iters; ++it) {
      if (warp == 0) {
        const unsigned long long t0 = cd::globaltimer_ns();
        ok = cd::ll_write_st<cd::WarpG>(tx.h, sst, from, n);
        if (lane == 0) times[3 * it] = t0;
      } else if (warp == 1) {
        unsigned long long seen = 1;
        if (lane == 0) {
          seen = cd::peek_packet(rx.h, rst.seq) ? 1 : 0;
          times[3 * it + 1] = cd::globaltimer_ns();
        }
        ok = cd::WarpG::bcast(seen) != 0 && cd::ll_read_warp_st(rx.h, rst, dst, n);
        if (lane == 0) times[3 * it + 2] = cd::globaltimer_ns();
      }
      if (__syncthreads_or(!ok)) break;  // iterations never overlap; a failure stops both warps
    }
    if (threadIdx.x == 0) cd::save_send_state(tx.h, sst);
    if (threadIdx.x == 32) cd::save_recv_state(rx.h, rst);
  } else if (warp == 0) {
    for (int it = 0; ok && it < iters; ++it) {
      for (unsigned long long off = 0; ok && off < n; off += piece) {
        const unsigned long long k = n - off < piece ? n - off : piece;
        ok = cd::ll_read_warp_st(rx.h, rst, sbuf, k) && cd::ll_write_st<cd::WarpG>(tx.h, sst, sbuf, k);
      }
    }
    if (lane == 0) {
      cd::save_send_state(tx.h, sst);
      cd::save_recv_state(rx.h, rst);
    }
  }
  if (!ok) atomicExch(status, 0);
}

// Bandwidth mode, one launch per iteration (the stream orders them; timing is inside).
// Packets are spread over warps (the grid forms of channel.cuh). role 0: 2G blocks; the warps of
// blocks [0, G) send packets w, w + W, ... (W = G * warps per block); the warps of blocks
// [G, 2G) receive the reply. role 1: G blocks; warp w receives packet p and sends it straight
// back (streaming echo). times: 3 u64 for this iteration, preset to (max, max, 0): t0 = min over
// senders' starts, t1 = min over receivers' first packets, t2 = max over receivers' ends.
extern "C" __global__ void pingpong_bw(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                       unsigned char* echo, unsigned long long n, int role, unsigned int G,
                                       unsigned long long* times, int* status) {
  const unsigned int lane = threadIdx.x & 31u;
  const unsigned int wpb = blockDim.x / 32;
  const unsigned int W = G * wpb;
  const unsigned int w = (blockIdx.x % G) * wpb + threadIdx.x / 32;  // warp index within its role
  const unsigned long long chunk = tx.h.payload;
  const unsigned long long npk = (n + chunk - 1) / chunk;
  bool ok = true;
  if (role == 0 && blockIdx.x < G) {
    const unsigned long long base = cd::grid_base(tx.h);
    if (lane == 0) atomicMin(times, cd::globaltimer_ns());
    for (unsigned long long p = w; ok && p < npk; p += W) {
      const unsigned long long off = p * chunk;
      ok = cd::grid_send_packet(tx.h, src + off, base + p, (unsigned int)(n - off < chunk ? n - off : chunk));
    }
    cd::grid_leave(tx.h, base, npk, false, W);
  } else if (role == 0) {
    const unsigned long long base = cd::grid_base(rx.h);
    for (unsigned long long p = w; ok && p < npk; p += W) {
      if (p == w) {
        unsigned long long seen = 1;
        if (lane == 0) {
          seen = cd::peek_packet(rx.h, base + p) ? 1 : 0;
          atomicMin(times + 1, cd::globaltimer_ns());
        }
        ok = cd::WarpG::bcast(seen) != 0;
        if (!ok) break;
      }
      const unsigned long long off = p * chunk;
      ok = cd::grid_recv_packet(rx.h, dst + off, base + p, (unsigned int)(n - off < chunk ? n - off : chunk));
    }
    if (lane == 0 && w < npk) atomicMax(times + 2, cd::globaltimer_ns());
    cd::grid_leave(rx.h, base, npk, true, W);
  } else {
    const unsigned long long rbase = cd::grid_base(rx.h);
    const unsigned long long sbase = cd::grid_base(tx.h);
    for (unsigned long long p = w; ok && p < npk; p += W) {
      const unsigned long long off = p * chunk;
      const unsigned int nb = (unsigned int)(n - off < chunk ? n - off : chunk);
      ok = cd::grid_recv_packet(rx.h, echo + off, rbase + p, nb) && cd::grid_send_packet(tx.h, echo + off, sbase + p, nb);
    }
    cd::grid_leave(rx.h, rbase, npk, true, W);
    cd::grid_leave(tx.h, sbase, npk, false, W);
  }
  if (!ok && lane == 0) atomicExch(status, 0);
}
