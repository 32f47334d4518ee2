// circuslink/detail/sync.cuh: the memory-ordering and timing primitives every circuslink
// device component uses (probe, channels, RMA queues, tracer), so that "relaxed",
// "release" and "acquire" mean one thing everywhere and every wait can time out.
#pragma once

namespace circuslink {
namespace detail {

// This thread's lane in its warp. Not threadIdx.x & 31: warps are cut from the linear thread index,
// so in a 16x16 block warp 0 holds threads (0..15, 0) and (0..15, 1), whose threadIdx.x repeat.
__device__ __forceinline__ unsigned int lane_id() {
  unsigned int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// The calling thread's index within its block, for any block shape (1-D, 2-D or 3-D).
__device__ __forceinline__ unsigned int block_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
__device__ __forceinline__ unsigned int block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

// Nanoseconds from the GPU's global timer (the same clock on every SM of a GPU).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Relaxed (volatile) 32-bit store and load: no ordering, but never cached in registers.
__device__ __forceinline__ void st_relaxed(unsigned int* p, unsigned int v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int ld_relaxed(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// One low-latency (LL) line: {data0, flag, data1, flag}, stored and loaded as one 16-byte vector (each 8-byte
// half carries its own flag, so a half seen with the flag has its data). The one-shot all-reduce's slots and
// the RMA queues' staging carry these: the flag travels with the data, so no fence orders them.
__device__ __forceinline__ void ll_store(uint4* p, unsigned int d0, unsigned int d1, unsigned int flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1), "r"(flag)
               : "memory");
}
__device__ __forceinline__ uint4 ll_load(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)
               : "memory");
  return v;
}

// System-scope release store / acquire load: everything written before the release is
// visible to a thread (on any GPU or the host) that acquires the value.
__device__ __forceinline__ void st_release_sys(unsigned int* p, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int ld_acquire_sys(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire_sys_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The same at .gpu scope: enough when writer and reader are on one GPU (ranks under MPS share its L2),
// and far cheaper: a .sys fence waits until earlier writes reach the system's coherence point.
__device__ __forceinline__ void st_release_gpu(unsigned int* p, unsigned int v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int ld_acquire_gpu(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire_gpu_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// A deadline for device-side waits. Reading %globaltimer costs more than a poll, so it
// is read once every `kCheckEvery` calls of expired(). Two backstops make sure a wait ends:
// `now + timeout` saturates instead of wrapping (a huge time-out means "very long", never "already
// over"), and a poll count gives up even if the timer stopped advancing (one call of expired() per
// nanosecond of time-out at most: every poll costs far more than a nanosecond, so the count never
// ends a wait that the clock would have let run).
//
// The host can end every wait of its process at once: `abort` points at a word in host-mapped
// memory that the host sets when its own, bounded wait for a kernel gives up (for example on a
// dead peer with a device time-out of 0, "never"). A wait that sees it returns as if timed out.
#ifndef CIRCUSLINK_DEADLINE_ABORT_EVERY
#define CIRCUSLINK_DEADLINE_ABORT_EVERY 1
#endif
struct Deadline {
  unsigned long long limit_ns;    // absolute, set at the first clock check; 0 until then
  unsigned long long timeout_ns;  // 0 means "never"
  unsigned long long checks_left; // the backstop: clock checks until it says yes regardless of the clock
  const volatile unsigned int* abort;  // host-mapped; may be null
  unsigned int polls;
  static constexpr unsigned int kCheckEvery = 32;
  static constexpr unsigned int kAbortEvery = CIRCUSLINK_DEADLINE_ABORT_EVERY;

  // No clock read here: a wait that is satisfied by its first polls (the latency path of every
  // protocol) never reads %globaltimer. The limit counts from the first check, kCheckEvery polls
  // in, which moves it later by those polls' time (well under a microsecond).
  __device__ __forceinline__ static Deadline after(unsigned long long timeout_ns,
                                                   const volatile unsigned int* abort = nullptr) {
    Deadline d;
    d.polls = 0;
    d.abort = abort;
    d.limit_ns = 0ull;
    d.timeout_ns = timeout_ns;
    d.checks_left = timeout_ns == 0ull ? 0ull : timeout_ns / kCheckEvery + 1ull;  // >= timeout_ns calls
    return d;
  }
  // True once the deadline has passed or the host aborted (both read every kCheckEvery calls; the abort word,
  // in host memory, every CIRCUSLINK_DEADLINE_ABORT_EVERY-th check: an experiment switch, 1 by default. The
  // waits of the grid forms and the rendezvous read it at every 16th check, since hundreds of waiting warps
  // reading it queued (BENCHMARKS.md, fourteenth session); a grid barrier has one waiter a block).
  __device__ __forceinline__ bool expired() {
    if ((++polls % kCheckEvery) != 0) return false;
    if (abort != nullptr && (kAbortEvery == 1u || polls % (kCheckEvery * kAbortEvery) == 0u) && *abort != 0u)
      return true;
    if (timeout_ns == 0ull) return false;
    if (--checks_left == 0ull) return true;
    const unsigned long long now = globaltimer_ns();
    if (limit_ns == 0ull) {
      limit_ns = timeout_ns > ~0ull - now ? ~0ull : now + timeout_ns;
      return false;
    }
    return now > limit_ns;
  }
  __device__ __forceinline__ bool aborted() const { return abort != nullptr && *abort != 0u; }
};

// Spin until ready() holds or the deadline passes; false on time-out. The deadline is
// consulted only every 8 polls, so that the hot loop is a bare load-compare-branch: on
// NVLink a busier loop measurably delays noticing the flag (about 25 ns a round trip).
template <typename Ready>
__device__ __forceinline__ bool spin_until(Ready ready, Deadline& deadline) {
  while (true) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (ready()) return true;
    }
    if (deadline.expired()) return false;
  }
}

}  // namespace detail
}  // namespace circuslink
