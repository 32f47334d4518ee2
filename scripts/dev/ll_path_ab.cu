// Dev experiment (not shipped): where the channel's small-message one-way time goes beyond the floor.
// Run by scripts/dev/ll_path_ab.py as 2 ranks under MPS.
//
// hw: a hand-written pingpong in the channel's low-latency format (16-byte units {word, flag}{word, flag}, lanes
//     0 .. lanes-1 of one warp), with the slot addressing of a ring (slot = seq mod nslots, `stride` bytes apart)
//     and optional extras of the library's path (bit 0: rank 0 loads its payload from global memory before the
//     store; bit 1: the reader stores a slot credit into the peer's memory each message; bit 2: rank 0 stores what
//     it received to a destination in global memory).
// lib_timeline: the bench's warp pingpong on the real channel API, with %globaltimer stamps per round trip: rank 0
//     before its write, after its write and after its read; rank 1 after each forward. Same GPU, one timer.
#include <circuslink/channel.cuh>

using namespace circuslink::detail;
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u32 smid() {
  u32 s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

extern "C" __global__ void hw(int role, unsigned char* mine, unsigned char* peer, u32 nslots, u32 stride, u32 lanes,
                              u32 extras, const u32* src, u32* dst, u64 base, int warmup, int iters, u64* times) {
  const u32 lane = threadIdx.x;
  if (lane >= 32) return;
  u64 a = 0, b = 0;
  for (int it = 0; it < warmup + iters; ++it) {
    const u64 seq = base + (u64)it;
    const u32 flag = (u32)seq | 1u;
    const u32 off = (nslots == 1 ? stride : ((u32)seq & (nslots - 1u)) * stride) + 16u * lane;  // nslots 1: at `stride`
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
      if (lane < lanes) {
        u32 w0 = lane, w1 = lane + 1;
        if (extras & 1u) { w0 = src[2 * lane]; w1 = src[2 * lane + 1]; }
        st_units2(peer + off, unit(w0, flag), unit(w1, flag));
      }
    }
    while (true) {
      if (lane < lanes) ld_units2(mine + off, a, b);
      const bool ok = lane >= lanes || (unit_flag(a) == flag && unit_flag(b) == flag);
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if (role == 1 && lane < lanes) st_units2(peer + off, unit((u32)a, flag), unit((u32)b, flag));
    if ((extras & 2u) && lane == 0) st_relaxed(reinterpret_cast<u32*>(peer + (64u << 20) - 4096) + ((u32)seq & 255u), flag);
    if (role == 0 && (extras & 4u) && lane < lanes) { dst[2 * lane] = (u32)a; dst[2 * lane + 1] = (u32)b; }
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
  if (lane == 0) times[2] = smid();
}

using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;

// tl: rank 0 writes 3 stamps a round trip (before write, after write, after read), rank 1 one (after forward).
extern "C" __global__ void lib_timeline(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst, u64 n, int role,
                                        int warmup, int iters, u64* times, u64* tl, int* status) {
  if (threadIdx.x >= 32) return;
  auto out = tx.session();
  auto in = rx.session();
  bool ok = true;
  const bool l0 = threadIdx.x == 0;
  if (role == 0) {
    for (int it = 0; ok && it < warmup + iters; ++it) {
      const u64 t0 = globaltimer_ns();
      if (it == warmup && l0) times[0] = t0;
      ok = out.write_warp(src, n);
      const u64 t1 = globaltimer_ns();
      ok = ok && in.read_warp(dst, n);
      const u64 t2 = globaltimer_ns();
      if (l0 && it >= warmup) {
        tl[3 * (it - warmup)] = t0;
        tl[3 * (it - warmup) + 1] = t1;
        tl[3 * (it - warmup) + 2] = t2;
      }
    }
    if (l0) times[1] = globaltimer_ns();
  } else {
    for (int it = 0; ok && it < warmup + iters; ++it) {
      ok = in.forward_warp(out, n);
      const u64 t = globaltimer_ns();
      if (l0 && it >= warmup) tl[it - warmup] = t;
    }
  }
  out.close();
  in.close();
  if (l0) times[2] = smid();
  if (!ok && l0) atomicExch(status, 0);
}

// The bench's warp pingpong without stamps, compiled in this module (the same code as pingpong_channels.cu's).
extern "C" __global__ void lib_plain(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst, u64 n, int role,
                                     int warmup, int iters, u64* times, u64* tl, int* status) {
  if (threadIdx.x >= 32) return;
  auto out = tx.session();
  auto in = rx.session();
  bool ok = true;
  if (role == 0) {
    for (int it = 0; ok && it < warmup + iters; ++it) {
      if (it == warmup && threadIdx.x == 0) times[0] = globaltimer_ns();
      ok = out.write_warp(src, n) && in.read_warp(dst, n);
    }
    if (threadIdx.x == 0) times[1] = globaltimer_ns();
  } else {
    for (int it = 0; ok && it < warmup + iters; ++it) ok = in.forward_warp(out, n);
  }
  out.close();
  in.close();
  if (threadIdx.x == 0) times[2] = smid();
  if (!ok && threadIdx.x == 0) atomicExch(status, 0);
}

// Two messages a round trip: rank 0 writes twice, then reads twice; rank 1 forwards each. The second write runs
// right after the first (the same code, warm), and the second read usually finds its packet already there: its
// time is the read's own work, no waiting. Stamps (5 a round trip): before, between and after the calls.
extern "C" __global__ void lib_twice(Tx tx, Rx rx, const unsigned char* src, unsigned char* dst, u64 n, int role,
                                     int warmup, int iters, u64* times, u64* tl, int* status) {
  if (threadIdx.x >= 32) return;
  auto out = tx.session();
  auto in = rx.session();
  bool ok = true;
  const bool l0 = threadIdx.x == 0;
  if (role == 0) {
    for (int it = 0; ok && it < warmup + iters; ++it) {
      u64 t[5];
      t[0] = globaltimer_ns();
      if (it == warmup && l0) times[0] = t[0];
      ok = out.write_warp(src, n);
      t[1] = globaltimer_ns();
      ok = ok && out.write_warp(src, n);
      t[2] = globaltimer_ns();
      ok = ok && in.read_warp(dst, n);
      t[3] = globaltimer_ns();
      ok = ok && in.read_warp(dst, n);
      t[4] = globaltimer_ns();
      if (l0 && it >= warmup)
        for (int k = 0; k < 5; ++k) tl[5 * (it - warmup) + k] = t[k];
    }
    if (l0) times[1] = globaltimer_ns();
  } else {
    for (int it = 0; ok && it < 2 * (warmup + iters); ++it) ok = in.forward_warp(out, n);
  }
  out.close();
  in.close();
  if (l0) times[2] = smid();
  if (!ok && l0) atomicExch(status, 0);
}

// The hand-written pingpong with a ring of nslots slots `stride` bytes apart (lanes 0 and 1), and mode bits that
// test why a ring costs more than one fixed slot: bit 0 .gpu-scoped relaxed accesses instead of volatile (.sys);
// bit 1 the writer also stores into the next slot's line (a unit 96 bytes in, never polled) after its packet;
// bit 2 the reader stores into the line of the slot it consumed (96 bytes in); bit 3 lanes 16-17 of the reader also
// load the next slot while lanes 0-1 poll this one.
__device__ __forceinline__ void st2_gpu(void* p, u64 a, u64 b) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ld2_gpu(const void* p, u64& a, u64& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
extern "C" __global__ void hw2(int role, unsigned char* mine, unsigned char* peer, u32 nslots, u32 stride, u32 mode,
                               u64 base, int warmup, int iters, u64* times) {
  const u32 lane = threadIdx.x;
  if (lane >= 32) return;
  const bool gpu = mode & 1u;
  u64 a = 0, b = 0;
  for (int it = 0; it < warmup + iters; ++it) {
    const u64 seq = base + (u64)it;
    const u32 flag = (u32)seq | 1u;
    const u32 slot = ((u32)seq & (nslots - 1u)) * stride, next = ((u32)(seq + 1) & (nslots - 1u)) * stride;
    const u32 off = slot + 16u * (lane & 15u);
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
      if (lane < 2) {
        if (gpu) st2_gpu(peer + off, unit(lane, flag), unit(lane + 1, flag));
        else st_units2(peer + off, unit(lane, flag), unit(lane + 1, flag));
      }
      if ((mode & 2u) && lane == 2) st_unit(peer + next + 96, 0u, flag);
    }
    while (true) {
      bool ok = true;
      if (lane < 2) {
        if (gpu) ld2_gpu(mine + off, a, b);
        else ld_units2(mine + off, a, b);
        ok = unit_flag(a) == flag && unit_flag(b) == flag;
      } else if ((mode & 8u) && lane >= 16 && lane < 18) {
        u64 x, y;
        ld_units2(mine + next + 16u * (lane - 16), x, y);
        ok = ok || x == y;
      }
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if ((mode & 4u) && lane == 2) st_unit(mine + slot + 96, 0u, flag);
    if (role == 1) {
      if (lane < 2) {
        if (gpu) st2_gpu(peer + off, unit((u32)a, flag), unit((u32)b, flag));
        else st_units2(peer + off, unit((u32)a, flag), unit((u32)b, flag));
      }
      if ((mode & 2u) && lane == 2) st_unit(peer + next + 96, 0u, flag);
    }
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
  if (lane == 0) times[2] = smid();
}
