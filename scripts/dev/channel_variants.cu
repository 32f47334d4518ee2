// Dev experiment (not shipped): where a channel pingpong's one-way time goes, by A/B variants of the bench's
// warp kernel on the real channel API. Run by scripts/dev/channel_variants.py as 2 ranks under MPS.
#include <circuslink/channel.cuh>

using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;
__device__ __forceinline__ unsigned long long now_ns() { return circuslink::detail::globaltimer_ns(); }

// kSrcShared: rank 0 writes from shared memory (no global load before the store); kDstShared: it reads into
// shared memory; kEcho: 0 = forward_warp, 1 = read_warp then write_warp (through shared memory).
template <int kSrcShared, int kDstShared, int kEcho>
__device__ void pp(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst, unsigned long long n, int role,
                   int warmup, int iters, unsigned long long* times, int* status) {
  __shared__ __align__(16) unsigned char sbuf[2][4096];
  if (threadIdx.x >= 32) return;
  for (unsigned i = threadIdx.x; i < n && i < 4096; i += 32) sbuf[0][i] = src[i];
  __syncwarp();
  const unsigned char* s = kSrcShared ? sbuf[0] : src;
  unsigned char* d = kDstShared ? sbuf[1] : dst;
  auto out = tx.session();
  auto in = rx.session();
  bool ok = true;
  if (role == 0) {
    long long c0 = 0;
    for (int it = 0; ok && it < warmup + iters; ++it) {
      if (it == warmup && threadIdx.x == 0) { times[0] = now_ns(); c0 = clock64(); }
      ok = out.write_warp(s, n) && in.read_warp(d, n);
    }
    if (threadIdx.x == 0) { times[1] = now_ns(); times[2] = clock64() - c0; }
    __syncwarp();
    if (kDstShared) for (unsigned i = threadIdx.x; i < n && i < 4096; i += 32) dst[i] = sbuf[1][i];
  } else {
    for (int it = 0; ok && it < warmup + iters; ++it) {
      if (kEcho == 0) ok = in.forward_warp(out, n);
      else ok = in.read_warp(sbuf[1], n) && out.write_warp(sbuf[1], n);
    }
  }
  out.close();
  in.close();
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}
#define ARGS Tx tx, Rx rx, const unsigned char* src, unsigned char* dst, unsigned long long n, int role, int w, int it, unsigned long long* t, int* st
#define PASS tx, rx, src, dst, n, role, w, it, t, st
extern "C" __global__ void v_bench(ARGS) { pp<0, 0, 0>(PASS); }
extern "C" __global__ void v_src_shared(ARGS) { pp<1, 0, 0>(PASS); }
extern "C" __global__ void v_both_shared(ARGS) { pp<1, 1, 0>(PASS); }
extern "C" __global__ void v_read_write_echo(ARGS) { pp<1, 1, 1>(PASS); }
