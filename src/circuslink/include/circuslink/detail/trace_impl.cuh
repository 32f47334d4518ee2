// circuslink/detail/trace_impl.cuh - device code of the tracer (included by trace.cuh).
#pragma once

#include "sync.cuh"
#include "trace_types.cuh"

namespace circuslink {
namespace trace {

// The recording clock: %globaltimer, the one time source every circuslink component uses.
__device__ __forceinline__ unsigned long long now_ns() { return detail::globaltimer_ns(); }

__device__ __forceinline__ unsigned int block_index_() {
  unsigned long long b = blockIdx.x + (unsigned long long)gridDim.x *
                         (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
  return b > 0xFFFFull ? 0xFFFFu : (unsigned int)b;
}

// Record one event from the calling thread. Bounded cost: one atomicAdd + one 16-byte store.
__device__ __forceinline__ void record(const Handle& h, unsigned int event, unsigned int phase,
                                       unsigned int arg) {
  if (h.records == nullptr) return;
  unsigned long long t = now_ns();
  unsigned long long slot = atomicAdd(h.cursor, 1ull);
  if (slot >= h.capacity) return;  // full: dropped, and counted by the cursor itself
  unsigned long long word = (unsigned long long)(((event & MAX_EVENT) | (phase << PHASE_SHIFT)) & 0xFFFFu) |
                            ((unsigned long long)block_index_() << 16) |
                            ((unsigned long long)arg << 32);
  Record* r = h.records + slot;
  // One 16-byte store (records are 16-byte aligned); "memory" keeps it from drifting across
  // the channel operations it marks.
  asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(r), "l"(t), "l"(word) : "memory");
}

__device__ __forceinline__ void instant(const Handle& h, unsigned int event, unsigned int arg = 0) {
  record(h, event, PHASE_INSTANT, arg);
}
__device__ __forceinline__ void begin(const Handle& h, unsigned int event, unsigned int arg = 0) {
  record(h, event, PHASE_BEGIN, arg);
}
__device__ __forceinline__ void end(const Handle& h, unsigned int event, unsigned int arg = 0) {
  record(h, event, PHASE_END, arg);
}
__device__ __forceinline__ void kernel_begin(const Handle& h, unsigned int kernel_id = 0) {
  begin(h, KERNEL, kernel_id);
}
__device__ __forceinline__ void kernel_end(const Handle& h, unsigned int kernel_id = 0) {
  end(h, KERNEL, kernel_id);
}

// Called by every active lane of a warp; the lowest active lane records once.
__device__ __forceinline__ void record_warp(const Handle& h, unsigned int event, unsigned int phase,
                                            unsigned int arg) {
  unsigned int active = __activemask();
  unsigned int lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  if (lane == (unsigned int)(__ffs(active) - 1)) record(h, event, phase, arg);
}

// Called by every thread of a block; thread 0 records once. No barrier: callers that need
// the event to mark "the whole block reached here" put their own __syncthreads() first.
__device__ __forceinline__ void record_block(const Handle& h, unsigned int event, unsigned int phase,
                                             unsigned int arg) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) record(h, event, phase, arg);
}

}  // namespace trace
}  // namespace circuslink
