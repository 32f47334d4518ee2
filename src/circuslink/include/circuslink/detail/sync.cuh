// circuslink/detail/sync.cuh: the memory-ordering and timing primitives every circuslink
// device component uses (probe, channels, RMA queues, tracer), so that "relaxed",
// "release" and "acquire" mean one thing everywhere and every wait can time out.
#pragma once

namespace circuslink {
namespace detail {

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

// A deadline for device-side waits. Reading %globaltimer costs more than a poll, so it
// is read once every `kCheckEvery` calls of expired().
struct Deadline {
  unsigned long long limit_ns;  // absolute; 0 means "never"
  unsigned int polls;
  static constexpr unsigned int kCheckEvery = 32;

  __device__ __forceinline__ static Deadline after(unsigned long long timeout_ns) {
    Deadline d;
    d.limit_ns = timeout_ns ? globaltimer_ns() + timeout_ns : 0ull;
    d.polls = 0;
    return d;
  }
  // True once the deadline has passed (the clock is read every kCheckEvery calls).
  __device__ __forceinline__ bool expired() {
    if (limit_ns == 0ull || (++polls % kCheckEvery) != 0) return false;
    return globaltimer_ns() > limit_ns;
  }
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
