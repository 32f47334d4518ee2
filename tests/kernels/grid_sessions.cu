// Kernels of tests/test_channels_sessions_gpu.py, on the public device API only: grid sessions (many grid
// calls per launch with no grid barrier between them) and multi-packet low-latency reads and forwards.
#include <circuslink/channel.cuh>

using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;

// Rank 0: every warp of the grid writes messages m = 0..nmsgs-1 of sizes[m] bytes from src + offsets[m]
// through one grid session. Rank 1: every warp reads them into dst + offsets[m] through one grid session.
extern "C" __global__ void session_stream(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                          const unsigned long long* offsets, const unsigned long long* sizes,
                                          unsigned int nmsgs, int role, int* status) {
  bool ok = true;
  if (role == 0) {
    auto s = tx.grid_session();
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = s.write(src + offsets[m], sizes[m]);
    s.close();
  } else {
    auto s = rx.grid_session();
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = s.read(dst + offsets[m], sizes[m]);
    s.close();
  }
  if (!ok && (threadIdx.x & 31) == 0) atomicExch(status, 0);
}

// Rank 0: the first half of the grid's warps write the messages, the other half read them back (after rank 1
// passed them on with a grid session's forward): a ring far smaller than the messages streams through.
extern "C" __global__ void session_echo(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                        const unsigned long long* offsets, const unsigned long long* sizes,
                                        unsigned int nmsgs, int role, int* status) {
  const unsigned int w = circuslink::detail::grid_warp(), W = circuslink::detail::grid_warps();
  bool ok = true;
  if (role == 1) {
    auto out = tx.grid_session();
    auto in = rx.grid_session();
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = in.forward(out, sizes[m]);
    out.close();
    in.close();
  } else if (w < W / 2) {
    auto out = tx.grid_session(w, W / 2);
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = out.write(src + offsets[m], sizes[m]);
    out.close();
  } else {
    auto in = rx.grid_session(w - W / 2, W - W / 2);
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = in.read(dst + offsets[m], sizes[m]);
    in.close();
  }
  if (!ok && (threadIdx.x & 31) == 0) atomicExch(status, 0);
}

// One warp a side: rank 0 writes message m (sizes[m] bytes, low-latency or bulk by size) and reads it back in
// pieces of reads[m] bytes; rank 1 passes every message back whole with forward_warp.
extern "C" __global__ void warp_echo(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst,
                                     const unsigned long long* offsets, const unsigned long long* sizes,
                                     const unsigned long long* reads, unsigned int nmsgs, int role, int* status) {
  if (threadIdx.x >= 32) return;
  auto out = tx.session();
  auto in = rx.session();
  bool ok = true;
  for (unsigned int m = 0; ok && m < nmsgs; ++m) {
    if (role == 0) {
      ok = out.write_warp(src + offsets[m], sizes[m]);
      for (unsigned long long got = 0; ok && got < sizes[m];) {
        const unsigned long long k = reads[m] < sizes[m] - got ? reads[m] : sizes[m] - got;
        ok = in.read_warp(dst + offsets[m] + got, k);
        got += k;
      }
    } else {
      ok = in.forward_warp(out, sizes[m]);
    }
  }
  out.close();
  in.close();
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}

// Rank 0: every warp of the grid writes message m of sizes[m] bytes from (from_window[m] ? win : plain) +
// offsets[m] through one grid session (a channel opened with a window: large messages from the window go by
// rendezvous, the others through the ring). Rank 1: every warp reads them into dst + offsets[m].
extern "C" __global__ void session_stream_window(Tx tx, Rx rx, const unsigned char* win, const unsigned char* plain,
                                                 unsigned char* dst, const unsigned long long* offsets,
                                                 const unsigned long long* sizes, const unsigned char* from_window,
                                                 unsigned int nmsgs, int role, int* status) {
  bool ok = true;
  if (role == 0) {
    auto s = tx.grid_session();
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = s.write((from_window[m] ? win : plain) + offsets[m], sizes[m]);
    s.close();
  } else {
    auto s = rx.grid_session();
    for (unsigned int m = 0; ok && m < nmsgs; ++m) ok = s.read(dst + offsets[m], sizes[m]);
    s.close();
  }
  if (!ok && (threadIdx.x & 31) == 0) atomicExch(status, 0);
}

// One grid write of n bytes from src (rank 0), for a reader that does not take rendezvous messages.
extern "C" __global__ void grid_write_once(Tx tx, const unsigned char* src, unsigned long long n, int* status) {
  if (!tx.write_grid(src, n) && (threadIdx.x & 31) == 0) atomicExch(status, 0);
}
