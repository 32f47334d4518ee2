// Dev experiment (rdv_pingpong.py): a rendezvous pingpong written by hand, to size what a channel's large
// message gains when the reader pulls straight from the writer's buffer (one copy a direction, as NVSHMEM's
// put) instead of staging through a ring (the grid form: writer -> ring, the echo ring -> ring, reader
// ring -> buffer: three copies a round trip).
//
// Rank 0 posts "message it is ready in my `send`" (a word in rank 1's memory), rank 1's blocks pull it into
// their `send` (the echo buffer), each block adds 1 to rank 0's ack word when its slice is in, a grid barrier,
// then rank 1 posts the reply and rank 0's blocks pull it into `recv`, acking into rank 1's word. A writer
// reuses its buffer only once every block of the reader has acked. Every wait: thread 0 of a block polls,
// the others wait at the block barrier. Words (u32, symmetric, zeroed): [0] posted-to-me, [1] acks-to-me,
// [2..3] the grid barrier.
#include <circuslink/grid.cuh>

typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// thread 0 waits for *p >= want (bounded), then the block goes on. RDV_POLL_WARPS: every warp's lane 0 polls
// instead, the non-first warps of the grid backing off up to 256 ns (the library's wait_many), no block barrier.
#ifndef RDV_POLL_WARPS
#define RDV_POLL_WARPS 0
#endif
__device__ __forceinline__ bool block_wait(const u32* p, u32 want, int* failed) {
#if RDV_POLL_WARPS
  int okw = 1;
  if ((threadIdx.x & 31) == 0) {
    const bool leader = blockIdx.x == 0 && threadIdx.x == 0;
    const u64 deadline = now_ns() + 5000000000ull;
    u32 spins = 0, ns = 0;
    while ((int)(ld_acquire(p) - want) < 0) {
      if (!leader) {
        __nanosleep(ns);
        ns = ns < 256 ? 2 * ns + 32 : 256;
      }
      if (++spins == 1024) {
        spins = 0;
        if (now_ns() > deadline) {
          okw = 0;
          atomicExch(failed, 1);
          break;
        }
      }
    }
  }
  return __shfl_sync(0xffffffffu, okw, 0) != 0;
#else
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    const u64 deadline = now_ns() + 5000000000ull;
    u32 spins = 0;
    while ((int)(ld_acquire(p) - want) < 0) {
      if (++spins == 1024) {
        spins = 0;
        if (now_ns() > deadline) {
          ok = 0;
          atomicExch(failed, 1);
          break;
        }
      }
    }
  }
  __syncthreads();
  return ok != 0;
#endif
}

// the block's slice of [0, n) (16-byte units, n a multiple of 16), DEPTH loads in flight a thread.
// RDV_SLICE_WARP: each warp its own slice (the library's rdv_recv); RDV_STORE_PLAIN: plain stores, not st.cg.
#ifndef RDV_SLICE_WARP
#define RDV_SLICE_WARP 0
#endif
#ifndef RDV_STORE_PLAIN
#define RDV_STORE_PLAIN 0
#endif
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
#if RDV_STORE_PLAIN
  *p = v;
#else
  __stcg(p, v);
#endif
}
template <int DEPTH>
__device__ __forceinline__ void pull(uint4* __restrict__ dst, const uint4* __restrict__ src, u64 n16) {
#if RDV_SLICE_WARP
  const u32 parts = gridDim.x * (blockDim.x / 32), me = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const u32 T = 32, t = threadIdx.x & 31;
#else
  const u32 parts = gridDim.x, me = blockIdx.x;
  const u32 T = blockDim.x, t = threadIdx.x;
#endif
  const u64 per = (n16 + parts - 1) / parts;
  const u64 lo = per * me, hi = lo + per < n16 ? lo + per : n16;
  u64 i = lo + t;
  for (; i + (DEPTH - 1) * T < hi; i += DEPTH * T) {
    uint4 v[DEPTH];
#pragma unroll
    for (int k = 0; k < DEPTH; ++k) v[k] = __ldcg(src + i + k * T);
#pragma unroll
    for (int k = 0; k < DEPTH; ++k) store16(dst + i + k * T, v[k]);
  }
  for (; i < hi; i += T) store16(dst + i, __ldcg(src + i));
}

// RDV_ARRIVE_WARP: every warp fences and adds 1 to the peer's ack word (the library's rdv_recv), not one
// release-add a block after a block barrier
#ifndef RDV_ARRIVE_WARP
#define RDV_ARRIVE_WARP 0
#endif
__device__ __forceinline__ void arrive(u32* p) {
#if RDV_ARRIVE_WARP
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
    __threadfence();
    atomicAdd(p, 1u);
  }
#else
  __syncthreads();
  if (threadIdx.x == 0) red_release_add(p, 1u);
#endif
}
__device__ __forceinline__ u32 arrivals_per_round() {
  return RDV_ARRIVE_WARP ? gridDim.x * (blockDim.x / 32) : gridDim.x;
}

extern "C" __global__ void rdv_pingpong(int role, u32* my_words, u32* peer_words, const unsigned char* peer_send,
                                        unsigned char* my_send, unsigned char* my_recv, u64 n, int warmup,
                                        int iters, u64* times, int* failed) {
  const u64 n16 = n / 16;
  u32* bar = my_words + 2;
  for (int it = 0; it < warmup + iters; ++it) {
    const u32 round = (u32)it + 1;
    if (role == 0) {
      if (it == warmup && blockIdx.x == 0 && threadIdx.x == 0) times[0] = now_ns();
      if (blockIdx.x == 0 && threadIdx.x == 0) st_release(peer_words + 0, round);  // "my send holds it"
      // the reply: wait for rank 1's post, pull its send into my recv, ack
      if (!block_wait(my_words + 0, round, failed)) return;
      pull<8>(reinterpret_cast<uint4*>(my_recv), reinterpret_cast<const uint4*>(peer_send), n16);
      arrive(peer_words + 1);
      // the round trip is over when my whole grid has the reply
      if (!circuslink::grid_sync(bar, 5000000000ull)) return;
    } else {
      // the echo: my send is free once rank 0 acked the previous reply
      if (!block_wait(my_words + 0, round, failed)) return;
      if (it > 0 && !block_wait(my_words + 1, (u32)it * arrivals_per_round(), failed)) return;
      pull<8>(reinterpret_cast<uint4*>(my_send), reinterpret_cast<const uint4*>(peer_send), n16);
      arrive(peer_words + 1);  // rank 0 may reuse its send
      if (!circuslink::grid_sync(bar, 5000000000ull)) return;
      if (blockIdx.x == 0 && threadIdx.x == 0) st_release(peer_words + 0, round);  // "my send holds the reply"
    }
  }
  if (role == 0 && blockIdx.x == 0 && threadIdx.x == 0) times[1] = now_ns();
}
