// Dev experiment (not shipped): which line format and which waits reach the relaxed store+poll floor,
// and what large transfers cost by ring size. Run by scripts/dev/line_variants.py as 2 ranks under MPS.
//
// Pingpong kernels: rank 0 (role 0) writes a message into rank 1's memory, rank 1 passes it back, rank 0
// receives it; one-way = loop time / (2 x iters). Flags are 64-bit (base + iteration), never reused, so no
// variant needs zeroed memory. Streaming kernels: rank 0's grid moves `total` bytes into rank 1's memory through
// a ring of `nslots` slots of `chunk` bytes (per-slot flags and credits, each warp owning its slots, no barrier),
// or straight into the destination (a put).
#include <circuslink/detail/sync.cuh>

using namespace circuslink::detail;
typedef unsigned long long u64;
typedef unsigned int u32;

struct U4 { u32 x, y, z, w; };

__device__ __forceinline__ void st_u64(void* p, u64 v) { asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ u64 ld_u64(const void* p) { u64 v; asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_v2(void* p, u64 a, u64 b) { asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory"); }
__device__ __forceinline__ void ld_v2(const void* p, u64& a, u64& b) { asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory"); }
__device__ __forceinline__ void st_v4(void* p, U4 v) { asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory"); }
__device__ __forceinline__ U4 ld_cg_v4(const void* p) { U4 v; asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ U4 ld_nc_v4(const void* p) { U4 v; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v; }
template <int kSys> __device__ __forceinline__ void fence() {
  if (kSys) asm volatile("fence.acq_rel.sys;" ::: "memory"); else asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// ---- pingpong: 8-byte units {word, flag} (today's low-latency format), k units, lane l owns units l + 32 j ------
// kEcho: 0 = the echo polls its units once and re-stores (one poll + one store); 1 = it polls the header unit
// first, broadcasts, then polls the data units (today's forward: two dependent loads); 2 = as 0, plus the work
// today's first missed poll does (a %globaltimer read and an error-word load).
template <int kEcho>
__device__ void ll8(int role, unsigned char* mine, unsigned char* peer, u32 k, u64 base, int warmup, int iters,
                    u64* times, const u32* err) {
  const u32 lane = lane_id();
  const u32 per = (k + 31) / 32;
  u64 v[9];
  for (int it = 0; it < warmup + iters; ++it) {
    const u32 flag = (u32)((base + it) * 2 + 1);
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
#pragma unroll
      for (u32 j = 0; j < 9; ++j)
        if (j < per && lane + 32 * j < k) st_u64(peer + 8 * (lane + 32 * j), (u64)(0x1000u + lane + it) | ((u64)flag << 32));
    }
    if (kEcho == 1 && role == 1) {
      u64 h = 0;
      if (lane == 1) while ((u32)((h = ld_u64(mine + 8)) >> 32) != flag) {}
      __shfl_sync(0xffffffffu, h, 1);
      __syncwarp();
    }
    bool first = true;
    while (true) {
      bool ok = true;
#pragma unroll
      for (u32 j = 0; j < 9; ++j)
        if (j < per && lane + 32 * j < k) v[j] = ld_u64(mine + 8 * (lane + 32 * j));
#pragma unroll
      for (u32 j = 0; j < 9; ++j)
        if (j < per && lane + 32 * j < k) ok = ok && (u32)(v[j] >> 32) == flag;
      if (__all_sync(0xffffffffu, ok)) break;
      if (kEcho == 2 && first) {
        first = false;
        u32 e = 0;
        if (lane == 0) { (void)globaltimer_ns(); e = *(volatile const u32*)err; }
        if (__any_sync(0xffffffffu, e != 0)) break;
      }
    }
    if (role == 1) {
#pragma unroll
      for (u32 j = 0; j < 9; ++j)
        if (j < per && lane + 32 * j < k) st_u64(peer + 8 * (lane + 32 * j), (u64)(u32)v[j] | ((u64)flag << 32));
    }
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}

// ---- pingpong: 8-byte units accessed 16 bytes a lane (two units per lane, 64 units per instruction) --------
__device__ void ll8v2(int role, unsigned char* mine, unsigned char* peer, u32 k, u64 base, int warmup, int iters,
                      u64* times) {
  const u32 lane = lane_id();
  for (int it = 0; it < warmup + iters; ++it) {
    const u32 flag = (u32)((base + it) * 2 + 1);
    const u64 fw = (u64)flag << 32;
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
      if (2 * lane < k) st_v2(peer + 16 * lane, fw | (0x1000u + lane), fw | (0x2000u + it));
    }
    u64 a = 0, b = 0;
    while (true) {
      if (2 * lane < k) ld_v2(mine + 16 * lane, a, b);
      if (__all_sync(0xffffffffu, 2 * lane >= k || ((u32)(a >> 32) == flag && (u32)(b >> 32) == flag))) break;
    }
    if (role == 1 && 2 * lane < k) st_v2(peer + 16 * lane, fw | (u32)a, fw | (u32)b);
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}

// ---- pingpong: 128-byte lines accessed 8 bytes a lane (16 lanes a line, 2 lines per instruction) ------------
__device__ void ll128u(int role, unsigned char* mine, unsigned char* peer, u32 L, u64 base, int warmup, int iters,
                       u64* times) {
  const u32 lane = lane_id(), sub = lane & 15;
  const u32 rounds = (L + 1) / 2;
  u64 a[16];
  for (int it = 0; it < warmup + iters; ++it) {
    const u64 flag = base + it + 1;
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
#pragma unroll
      for (u32 r = 0; r < 16; ++r) {
        const u32 line = 2 * r + lane / 16;
        if (r < rounds && line < L) st_u64(peer + 128 * line + 8 * sub, sub == 15 ? flag : 0x2000ull + lane + it);
      }
    }
    while (true) {
#pragma unroll
      for (u32 r = 0; r < 16; ++r) {
        const u32 line = 2 * r + lane / 16;
        if (r < rounds && line < L) a[r] = ld_u64(mine + 128 * line + 8 * sub);
      }
      bool ok = true;
#pragma unroll
      for (u32 r = 0; r < 16; ++r) {
        const u32 line = 2 * r + lane / 16;
        if (r < rounds && line < L && sub == 15) ok = ok && a[r] == flag;
      }
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if (role == 1) {
#pragma unroll
      for (u32 r = 0; r < 16; ++r) {
        const u32 line = 2 * r + lane / 16;
        if (r < rounds && line < L) st_u64(peer + 128 * line + 8 * sub, sub == 15 ? flag : a[r]);
      }
    }
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}

// ---- pingpong: 128-byte lines, flag in the last 8 bytes, 4 lines per warp instruction --------------------
// L lines (<= 32): lane l handles 16 bytes at line 4r + l/8, word pair l%8, for r < ceil(L/4).
template <int kSlow>
__device__ void ll128(int role, unsigned char* mine, unsigned char* peer, u32 L, u64 base, int warmup, int iters,
                      u64* times, const u32* err) {
  const u32 lane = lane_id(), sub = lane & 7;
  const u32 rounds = (L + 3) / 4;
  u64 a[8], b[8];
  for (int it = 0; it < warmup + iters; ++it) {
    const u64 flag = base + it + 1;
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
#pragma unroll
      for (u32 r = 0; r < 8; ++r) {
        const u32 line = 4 * r + lane / 8;
        if (r < rounds && line < L) st_v2(peer + 128 * line + 16 * sub, 0x2000ull + lane + it, sub == 7 ? flag : 0x3000ull + it);
      }
    }
    bool first = true;
    while (true) {
#pragma unroll
      for (u32 r = 0; r < 8; ++r) {
        const u32 line = 4 * r + lane / 8;
        if (r < rounds && line < L) ld_v2(mine + 128 * line + 16 * sub, a[r], b[r]);
      }
      bool ok = true;
#pragma unroll
      for (u32 r = 0; r < 8; ++r) {
        const u32 line = 4 * r + lane / 8;
        if (r < rounds && line < L && sub == 7) ok = ok && b[r] == flag;
      }
      if (__all_sync(0xffffffffu, ok)) break;
      if (kSlow && first) {
        first = false;
        u32 e = 0;
        if (lane == 0) { (void)globaltimer_ns(); e = *(volatile const u32*)err; }
        if (__any_sync(0xffffffffu, e != 0)) break;
      }
    }
    if (role == 1) {
#pragma unroll
      for (u32 r = 0; r < 8; ++r) {
        const u32 line = 4 * r + lane / 8;
        if (r < rounds && line < L) st_v2(peer + 128 * line + 16 * sub, a[r], sub == 7 ? flag : b[r]);
      }
    }
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}

// ---- pingpong: bulk in one warp: payload with 16-byte stores, a fence, then a flag ------------------------
template <int kSys>
__device__ void bulk(int role, unsigned char* mine, unsigned char* peer, u32 nbytes, u64 base, int warmup, int iters,
                     u64* times) {
  const u32 lane = lane_id(), nvec = nbytes / 16;
  unsigned char* my_flag = mine + (1u << 20);
  unsigned char* peer_flag = peer + (1u << 20);
  for (int it = 0; it < warmup + iters; ++it) {
    const u64 flag = base + it + 1;
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
      for (u32 i = lane; i < nvec; i += 32) st_v4(peer + 16ull * i, U4{i, (u32)it, 1, 2});
      __syncwarp();
      if (lane == 0) { fence<kSys>(); st_u64(peer_flag, flag); }
    }
    if (lane == 0) { while (ld_u64(my_flag) != flag) {} fence<kSys>(); }
    __syncwarp();
    if (role == 1) {
      for (u32 i = lane; i < nvec; i += 32) st_v4(peer + 16ull * i, ld_cg_v4(mine + 16ull * i));
      __syncwarp();
      if (lane == 0) { fence<kSys>(); st_u64(peer_flag, flag); }
    } else {
      U4 acc{0, 0, 0, 0};
      for (u32 i = lane; i < nvec; i += 32) { U4 v = ld_cg_v4(mine + 16ull * i); acc.x ^= v.x; }
      if (acc.x == 0xFFFFFFFFu) times[2] = acc.x;  // keep the loads
    }
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}

extern "C" __global__ void pp_ll8_one(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8<0>(role, m, p, k, base, w, n, t, e); }
extern "C" __global__ void pp_ll8_two(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8<1>(role, m, p, k, base, w, n, t, e); }
extern "C" __global__ void pp_ll8_slow(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8<2>(role, m, p, k, base, w, n, t, e); }
extern "C" __global__ void pp_ll8v2(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8v2(role, m, p, k, base, w, n, t); }
extern "C" __global__ void pp_ll128u(int role, unsigned char* m, unsigned char* p, u32 L, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll128u(role, m, p, L, base, w, n, t); }
extern "C" __global__ void pp_ll128(int role, unsigned char* m, unsigned char* p, u32 L, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll128<0>(role, m, p, L, base, w, n, t, e); }
extern "C" __global__ void pp_ll128_slow(int role, unsigned char* m, unsigned char* p, u32 L, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll128<1>(role, m, p, L, base, w, n, t, e); }
extern "C" __global__ void pp_bulk_gpu(int role, unsigned char* m, unsigned char* p, u32 nb, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) bulk<0>(role, m, p, nb, base, w, n, t); }
extern "C" __global__ void pp_bulk_sys(int role, unsigned char* m, unsigned char* p, u32 nb, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) bulk<1>(role, m, p, nb, base, w, n, t); }


// ---- pingpong: 8-byte units in 16-byte pairs, every thread of a block (many warps), up to 16 pairs a thread ----
// Pair p (units 2p, 2p + 1) belongs to thread p % T. Each thread polls its pairs; the echo re-stores them as they
// come (no block barrier); rank 0 finishes a round trip when every thread saw its pairs (one block barrier).
__device__ void ll8blk(int role, unsigned char* mine, unsigned char* peer, u32 k, u64 base, int warmup, int iters,
                       u64* times) {
  const u32 t = threadIdx.x, T = blockDim.x, pairs = (k + 1) / 2;
  u64 a[16], b[16];
  for (int it = 0; it < warmup + iters; ++it) {
    const u32 flag = (u32)((base + it) * 2 + 1);
    const u64 fw = (u64)flag << 32;
    if (role == 0) {
      if (it == warmup && t == 0) times[0] = globaltimer_ns();
#pragma unroll
      for (u32 j = 0; j < 16; ++j)
        if (t + T * j < pairs) st_v2(peer + 16 * (t + T * j), fw | (0x1000u + t), fw | (0x2000u + it));
    }
    while (true) {
      bool ok = true;
#pragma unroll
      for (u32 j = 0; j < 16; ++j)
        if (t + T * j < pairs) ld_v2(mine + 16 * (t + T * j), a[j], b[j]);
#pragma unroll
      for (u32 j = 0; j < 16; ++j)
        if (t + T * j < pairs) ok = ok && (u32)(a[j] >> 32) == flag && (u32)(b[j] >> 32) == flag;
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if (role == 1) {
#pragma unroll
      for (u32 j = 0; j < 16; ++j)
        if (t + T * j < pairs) st_v2(peer + 16 * (t + T * j), fw | (u32)a[j], fw | (u32)b[j]);
    } else {
      __syncthreads();
    }
  }
  if (role == 0 && t == 0) times[1] = globaltimer_ns();
}

// ---- pingpong: bulk by a whole block (payload, block barrier, a .gpu fence, the flag) ---------------------
__device__ void bulkblk(int role, unsigned char* mine, unsigned char* peer, u32 nbytes, u64 base, int warmup, int iters,
                        u64* times) {
  const u32 t = threadIdx.x, T = blockDim.x, nvec = nbytes / 16;
  unsigned char* my_flag = mine + (32u << 20);
  unsigned char* peer_flag = peer + (32u << 20);
  for (int it = 0; it < warmup + iters; ++it) {
    const u64 flag = base + it + 1;
    if (role == 0) {
      if (it == warmup && t == 0) times[0] = globaltimer_ns();
      for (u32 i = t; i < nvec; i += T) st_v4(peer + 16ull * i, U4{i, (u32)it, 1, 2});
      __syncthreads();
      if (t == 0) { fence<0>(); st_u64(peer_flag, flag); }
    }
    if (t == 0) { while (ld_u64(my_flag) != flag) {} fence<0>(); }
    __syncthreads();
    if (role == 1) {
      for (u32 i = t; i < nvec; i += T) st_v4(peer + 16ull * i, ld_cg_v4(mine + 16ull * i));
      __syncthreads();
      if (t == 0) { fence<0>(); st_u64(peer_flag, flag); }
    } else {
      U4 acc{0, 0, 0, 0};
      for (u32 i = t; i < nvec; i += T) { U4 v = ld_cg_v4(mine + 16ull * i); acc.x ^= v.x; }
      if (acc.x == 0xFFFFFFFFu) times[2] = acc.x;
      __syncthreads();
    }
  }
  if (role == 0 && t == 0) times[1] = globaltimer_ns();
}
extern "C" __global__ void pp_ll8blk(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { ll8blk(role, m, p, k, base, w, n, t); }
extern "C" __global__ void pp_bulkblk(int role, unsigned char* m, unsigned char* p, u32 nb, u64 base, int w, int n, u64* t, const u32* e) { bulkblk(role, m, p, nb, base, w, n, t); }


// ---- pingpong: 8-byte units, 16 bytes a lane, with the channel's bookkeeping stores after each receive ----
// kStores: after a message arrives, lane 0 stores `kStores` 4-byte words with st.volatile (a credit), into the
// peer's memory (kPeer = 1: where a channel's slot credits and counter live, the writer's side) or this rank's.
template <int kStores, int kPeer>
__device__ void ll8v2_credit(int role, unsigned char* mine, unsigned char* peer, u32 k, u64 base, int warmup,
                             int iters, u64* times) {
  const u32 lane = lane_id();
  unsigned int* credit = reinterpret_cast<unsigned int*>((kPeer ? peer : mine) + (2u << 20));
  for (int it = 0; it < warmup + iters; ++it) {
    const u32 flag = (u32)((base + it) * 2 + 1);
    const u64 fw = (u64)flag << 32;
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
      if (2 * lane < k) st_v2(peer + 16 * lane, fw | (0x1000u + lane), fw | (0x2000u + it));
    }
    u64 a = 0, b = 0;
    while (true) {
      if (2 * lane < k) ld_v2(mine + 16 * lane, a, b);
      if (__all_sync(0xffffffffu, 2 * lane >= k || ((u32)(a >> 32) == flag && (u32)(b >> 32) == flag))) break;
    }
    if (role == 1 && 2 * lane < k) st_v2(peer + 16 * lane, fw | (u32)a, fw | (u32)b);
    if (lane == 0)
      for (int s = 0; s < kStores; ++s) st_relaxed(credit + 64 * s + (it & 15), flag);
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}
extern "C" __global__ void pp_cr1_peer(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8v2_credit<1, 1>(role, m, p, k, base, w, n, t); }
extern "C" __global__ void pp_cr2_peer(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8v2_credit<2, 1>(role, m, p, k, base, w, n, t); }
extern "C" __global__ void pp_cr1_own(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8v2_credit<1, 0>(role, m, p, k, base, w, n, t); }
extern "C" __global__ void pp_cr0(int role, unsigned char* m, unsigned char* p, u32 k, u64 base, int w, int n, u64* t, const u32* e) { if (threadIdx.x < 32) ll8v2_credit<0, 0>(role, m, p, k, base, w, n, t); }

// ---- streaming ---------------------------------------------------------------------------------------
// Ring in rank 1's memory: nslots slots of `chunk` bytes at ring, flags (u64 per slot) at flags; credits (u64 per
// slot) in rank 0's memory. Packet seq goes to slot seq % nslots with flag base + seq + 1; its credit is the same
// value, stored by the reader once it copied the slot out. Warp w of W handles packets w, w + W, ...
// handshake: rank 1 stores `base` into rank 0's go word; rank 0 waits for it before its clock starts.
__device__ __forceinline__ u32 gwarp() { return (blockIdx.x * blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ u32 gwarps() { return gridDim.x * blockDim.x / 32; }

template <int kDeep>
__device__ void copy_chunk(unsigned char* dst, const unsigned char* src, u32 nb) {
  const u32 lane = lane_id(), nvec = nb / 16;
  u32 i = lane;
  if (kDeep) {
    for (; i + 224 < nvec; i += 256) {
      U4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = ld_cg_v4(src + 16ull * (i + 32 * j));
#pragma unroll
      for (int j = 0; j < 8; ++j) st_v4(dst + 16ull * (i + 32 * j), v[j]);
    }
  }
  for (; i + 96 < nvec; i += 128) {
    const U4 a = ld_cg_v4(src + 16ull * i), b = ld_cg_v4(src + 16ull * (i + 32));
    const U4 c = ld_cg_v4(src + 16ull * (i + 64)), d = ld_cg_v4(src + 16ull * (i + 96));
    st_v4(dst + 16ull * i, a); st_v4(dst + 16ull * (i + 32), b);
    st_v4(dst + 16ull * (i + 64), c); st_v4(dst + 16ull * (i + 96), d);
  }
  for (; i < nvec; i += 32) st_v4(dst + 16ull * i, ld_cg_v4(src + 16ull * i));
}

template <int kDeep>
__device__ void stream_ring_t(int role, unsigned char* ring, u64* flags, u64* credits, const unsigned char* src,
                                       unsigned char* dst, u64 msg, u32 nmsg, u32 chunk, u32 nslots, u64 base,
                                       u64* go_local, u64* go_peer, u64* times) {
  const u32 lane = lane_id(), W = gwarps(), w = gwarp();
  const u64 per_msg = (msg + chunk - 1) / chunk, npk = per_msg * nmsg;
  (void)0;
  if (role == 1) {
    if (blockIdx.x == 0 && threadIdx.x == 0) st_u64(go_peer, base);
  } else {
    if (lane == 0) while (ld_u64(go_local) != base) {}
    __syncwarp();
    if (blockIdx.x == 0 && threadIdx.x == 0) times[0] = globaltimer_ns();
  }
  for (u64 seq = w; seq < npk; seq += W) {
    const u32 s = (u32)(seq % nslots);
    const u64 off = (seq % per_msg) * chunk;
    const u32 nb = (u32)(msg - off < chunk ? msg - off : chunk);
    unsigned char* slot = ring + (u64)s * chunk;
    if (role == 0) {
      if (seq >= nslots && lane == 0) while (ld_u64(credits + s) != base + seq - nslots + 1) {}
      __syncwarp();
      copy_chunk<kDeep>(slot, src + off, nb);
      __syncwarp();
      if (lane == 0) { fence<0>(); st_u64(flags + s, base + seq + 1); }
    } else {
      if (lane == 0) { while (ld_u64(flags + s) != base + seq + 1) {} fence<0>(); }
      __syncwarp();
      copy_chunk<kDeep>(dst + off, slot, nb);
      __syncwarp();
      if (lane == 0) st_u64(credits + s, base + seq + 1);
    }
  }
  if (role == 1) {
    __syncthreads();
    if (threadIdx.x == 0) { __threadfence(); atomicMax(times + 1, globaltimer_ns()); }
  }
}

#define STREAM_RING_ARGS int role, unsigned char* ring, u64* flags, u64* credits, const unsigned char* src, \
    unsigned char* dst, u64 msg, u32 nmsg, u32 chunk, u32 nslots, u64 base, u64* go_local, u64* go_peer, u64* times
#define STREAM_RING_PASS role, ring, flags, credits, src, dst, msg, nmsg, chunk, nslots, base, go_local, go_peer, times
extern "C" __global__ void stream_ring(STREAM_RING_ARGS) { stream_ring_t<0>(STREAM_RING_PASS); }
extern "C" __global__ void stream_ring8(STREAM_RING_ARGS) { stream_ring_t<1>(STREAM_RING_PASS); }

// A put: rank 0's grid copies the message straight into rank 1's destination, then each warp raises its flag;
// rank 1 waits for every warp's flag (the NVSHMEM block-put pattern). Time: rank 0's start to rank 1's last flag.
extern "C" __global__ void stream_put(int role, u64* flags, const unsigned char* src, unsigned char* dst_peer,
                                      u64 msg, u32 nmsg, u32 chunk, u64 base, u64* go_local, u64* go_peer, u64* times) {
  const u32 lane = lane_id(), W = gwarps(), w = gwarp();
  const u64 per_msg = (msg + chunk - 1) / chunk;
  if (role == 1) {
    if (blockIdx.x == 0 && threadIdx.x == 0) st_u64(go_peer, base);
    // wait for every warp's last flag of the last message
    if (w < W && lane == 0) {
      // flags[w] counts messages done by warp w of rank 0 (rank 0 has the same W)
      while (ld_u64(flags + w) != base + nmsg) {}
    }
    __syncthreads();
    if (threadIdx.x == 0) { __threadfence(); atomicMax(times + 1, globaltimer_ns()); }
    return;
  }
  if (lane == 0) while (ld_u64(go_local) != base) {}
  __syncwarp();
  if (blockIdx.x == 0 && threadIdx.x == 0) times[0] = globaltimer_ns();
  for (u32 m = 0; m < nmsg; ++m) {
    for (u64 p = w; p < per_msg; p += W) {
      const u64 off = p * chunk;
      copy_chunk<1>(dst_peer + off, src + off, (u32)(msg - off < chunk ? msg - off : chunk));
    }
    __syncwarp();
    if (lane == 0) { fence<0>(); st_u64(flags + w, base + m + 1); }
  }
}
