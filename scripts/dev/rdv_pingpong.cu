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

// thread 0 waits for *p >= want (bounded), then the block goes on
__device__ __forceinline__ bool block_wait(const u32* p, u32 want, int* failed) {
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
}

// the block's slice of [0, n) (16-byte units, n a multiple of 16), DEPTH loads in flight a thread
template <int DEPTH>
__device__ __forceinline__ void pull(uint4* __restrict__ dst, const uint4* __restrict__ src, u64 n16) {
  const u64 per = (n16 + gridDim.x - 1) / gridDim.x;
  const u64 lo = per * blockIdx.x, hi = lo + per < n16 ? lo + per : n16;
  const u32 T = blockDim.x;
  u64 i = lo + threadIdx.x;
  for (; i + (DEPTH - 1) * T < hi; i += DEPTH * T) {
    uint4 v[DEPTH];
#pragma unroll
    for (int k = 0; k < DEPTH; ++k) v[k] = __ldcg(src + i + k * T);
#pragma unroll
    for (int k = 0; k < DEPTH; ++k) __stcg(dst + i + k * T, v[k]);
  }
  for (; i < hi; i += T) __stcg(dst + i, __ldcg(src + i));
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
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(peer_words + 1, 1u);
      // the round trip is over when my whole grid has the reply
      if (!circuslink::grid_sync(bar, 5000000000ull)) return;
    } else {
      // the echo: my send is free once rank 0 acked the previous reply
      if (!block_wait(my_words + 0, round, failed)) return;
      if (it > 0 && !block_wait(my_words + 1, (u32)it * gridDim.x, failed)) return;
      pull<8>(reinterpret_cast<uint4*>(my_send), reinterpret_cast<const uint4*>(peer_send), n16);
      __syncthreads();
      if (threadIdx.x == 0) red_release_add(peer_words + 1, 1u);  // rank 0 may reuse its send
      if (!circuslink::grid_sync(bar, 5000000000ull)) return;
      if (blockIdx.x == 0 && threadIdx.x == 0) st_release(peer_words + 0, round);  // "my send holds the reply"
    }
  }
  if (role == 0 && blockIdx.x == 0 && threadIdx.x == 0) times[1] = now_ns();
}
