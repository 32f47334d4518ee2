// Dev experiment: what one start-to-wait cycle of a small RMA chain (8 words of 8 bytes, two ranks in a
// ring) costs in each protocol, written by hand (rma_variants.py). One warp; lane k < 8 handles word k.
// Every kernel runs `warmup + iters` cycles and records lane 0's clock after the warm-up and at the end.
//
//   fenced     the library's protocol (post at start): release-store my post to the peer, acquire-poll the
//              peer's post, store the 8 words into the peer's destination, release-store the arrival,
//              acquire-poll mine
//   fenced_wp  the same, the post sent at wait (right after my arrival is seen): the post leaves the
//              start's critical path, the peer may write while my user still reads (the queue's
//              post_at_wait option)
//   ll_post    post as `fenced`, then each word goes as one 16-byte line {data, epoch} into the peer's
//              staging; the wait polls its 8 lines (a lane each) and copies them to the destination: no
//              fence, the flag travels with the data
//   ll_credit  the same lines with no post at all: staging of `kDepth` epochs, and the origin waits for the
//              target's consumed count only when it is kDepth epochs ahead (a credit, rarely on the path)
//   bare       one relaxed flag store and its poll, no data: the protocol's floor
#include <circuslink/collectives.cuh>

using circuslink::detail::globaltimer_ns;
using u64 = unsigned long long;

namespace {

constexpr u64 kPost = 0, kArrival = 64, kConsumed = 128, kDst = 4096, kStaging = 8192;
constexpr unsigned int kWords = 8, kDepth = 8;

__device__ __forceinline__ u64* at(u64 base, u64 off) { return reinterpret_cast<u64*>(base + off); }
__device__ __forceinline__ void st_release(u64* p, u64 v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed(u64* p, u64 v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ld_acquire(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 ld_relaxed(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned int sm_id() {
  unsigned int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

}  // namespace

// mine / peer: this rank's buffer and the peer's (mapped); src: 8 words of mine; base: the first epoch
// (the host moves it past every epoch used, so nothing is reset between launches).
template <int kMode>
__device__ void cycles(u64 mine, u64 peer, const u64* src, u64 base, int warmup, int iters, u64* times) {
  const unsigned int lane = threadIdx.x;
  const u64 word = lane < kWords ? src[lane] : 0ull;
  u64 t0 = 0;
  if (kMode == 1 && lane == 0) st_release(at(peer, kPost), base);  // the first epoch's post
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t0 = globaltimer_ns();
    const u64 e = base + static_cast<u64>(i);
    if (kMode == 0 || kMode == 1) {  // fenced, fenced_wp
      if (kMode == 0 && lane == 0) st_release(at(peer, kPost), e);
      if (lane == 0) while (ld_acquire(at(mine, kPost)) < e) {}
      __syncwarp();
      if (lane < kWords) *at(peer, kDst + 8 * lane) = word + e;
      __syncwarp();
      if (lane == 0) {
        st_release(at(peer, kArrival), e);
        while (ld_acquire(at(mine, kArrival)) < e) {}
        if (kMode == 1) st_release(at(peer, kPost), e + 1);
      }
      __syncwarp();
    } else if (kMode == 2 || kMode == 3) {  // ll_post, ll_credit
      if (kMode == 2) {
        if (lane == 0) st_relaxed(at(peer, kPost), e);
        if (lane == 0) while (ld_relaxed(at(mine, kPost)) < e) {}
      } else if (lane == 0 && e - base >= kDepth) {
        while (ld_relaxed(at(peer, kConsumed)) + kDepth <= e) {}  // (peer's consumed count, read in its memory)
      }
      __syncwarp();
      const u64 slot = kStaging + ((e % kDepth) * kWords + lane) * 16;
      const u64 v = word + e;
      if (lane < kWords) {
        circuslink::detail::ll_store(reinterpret_cast<uint4*>(peer + slot), static_cast<unsigned int>(v),
                                     static_cast<unsigned int>(v >> 32),
                                     static_cast<unsigned int>(e));
        uint4 got;
        do {
          got = circuslink::detail::ll_load(reinterpret_cast<const uint4*>(mine + slot));
        } while (got.y != static_cast<unsigned int>(e) || got.w != static_cast<unsigned int>(e));
        *at(mine, kDst + 8 * lane) = static_cast<u64>(got.x) | (static_cast<u64>(got.z) << 32);
      }
      __syncwarp();
      if (kMode == 3 && lane == 0) st_relaxed(at(mine, kConsumed), e + 1);
    } else {  // bare
      if (lane == 0) {
        st_relaxed(at(peer, kArrival), e);
        while (ld_relaxed(at(mine, kArrival)) < e) {}
      }
      __syncwarp();
    }
  }
  if (lane == 0) {
    times[0] = t0;
    times[1] = globaltimer_ns();
    times[2] = sm_id();
  }
}

#define VARIANT(name, mode)                                                                                \
  extern "C" __global__ void name(u64 mine, u64 peer, const u64* src, u64 base, int warmup, int iters,     \
                                  u64* times) {                                                            \
    cycles<mode>(mine, peer, src, base, warmup, iters, times);                                             \
  }
VARIANT(fenced, 0)
VARIANT(fenced_wp, 1)
VARIANT(ll_post, 2)
VARIANT(ll_credit, 3)
VARIANT(bare, 4)
