// Host stand-in for circuslink/detail/sync.cuh, for the RMA emulation (tests/test_rma_session.py puts it in place
// of the real one in a copy of the include tree): the same names, on host threads. Relaxed and volatile accesses
// are relaxed atomics, release / acquire are release / acquire atomics, fences are seq_cst fences. A low-latency
// line is stored and loaded as two 8-byte atomics, each half with its flag: the GPU's 16-byte access is one, and
// the protocol needs only each half whole, so the emulation is the weaker machine. Waits yield the core after each
// round of polls (more spinning threads than cores).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace circuslink {
namespace detail {

inline unsigned int lane_id() { return block_thread_of_emulation() & 31u; }
inline unsigned int block_thread() { return block_thread_of_emulation(); }
inline unsigned int block_threads() { return block_threads_of_emulation(); }

inline unsigned long long globaltimer_ns() {
  return static_cast<unsigned long long>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

template <typename T>
inline std::atomic_ref<T> at(T* p) { return std::atomic_ref<T>(*p); }
template <typename T>
inline std::atomic_ref<T> at(const T* p) { return std::atomic_ref<T>(*const_cast<T*>(p)); }
template <typename T>
inline std::atomic_ref<T> at(const volatile T* p) { return std::atomic_ref<T>(*const_cast<T*>(p)); }

inline void st_relaxed(unsigned int* p, unsigned int v) { at(p).store(v, std::memory_order_relaxed); }
inline unsigned int ld_relaxed(const unsigned int* p) { return at(p).load(std::memory_order_relaxed); }
inline void st_relaxed_u64(unsigned long long* p, unsigned long long v) { at(p).store(v, std::memory_order_relaxed); }
inline unsigned long long ld_relaxed_u64(const unsigned long long* p) { return at(p).load(std::memory_order_relaxed); }

inline void ll_store(uint4* p, unsigned int d0, unsigned int d1, unsigned int flag) {
  auto* half = reinterpret_cast<unsigned long long*>(p);
  at(half).store(d0 | (static_cast<unsigned long long>(flag) << 32), std::memory_order_relaxed);
  at(half + 1).store(d1 | (static_cast<unsigned long long>(flag) << 32), std::memory_order_relaxed);
}
inline uint4 ll_load(const uint4* p) {
  auto* half = reinterpret_cast<const unsigned long long*>(p);
  const unsigned long long a = at(half).load(std::memory_order_relaxed), b = at(half + 1).load(std::memory_order_relaxed);
  return uint4{static_cast<unsigned int>(a), static_cast<unsigned int>(a >> 32), static_cast<unsigned int>(b),
               static_cast<unsigned int>(b >> 32)};
}

inline void st_release_sys(unsigned int* p, unsigned int v) { at(p).store(v, std::memory_order_release); }
inline unsigned int ld_acquire_sys(const unsigned int* p) { return at(p).load(std::memory_order_acquire); }
inline void st_release_sys_u64(unsigned long long* p, unsigned long long v) { at(p).store(v, std::memory_order_release); }
inline unsigned long long ld_acquire_sys_u64(const unsigned long long* p) { return at(p).load(std::memory_order_acquire); }
inline void st_release_gpu(unsigned int* p, unsigned int v) { at(p).store(v, std::memory_order_release); }
inline unsigned int ld_acquire_gpu(const unsigned int* p) { return at(p).load(std::memory_order_acquire); }
inline void st_release_gpu_u64(unsigned long long* p, unsigned long long v) { at(p).store(v, std::memory_order_release); }
inline unsigned long long ld_acquire_gpu_u64(const unsigned long long* p) { return at(p).load(std::memory_order_acquire); }
inline void fence_acq_rel_sys() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void fence_acq_rel_gpu() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// The device's Deadline, its logic as in sync.cuh (a poll count backstop, the clock every kCheckEvery polls).
struct Deadline {
  unsigned long long limit_ns;
  unsigned long long timeout_ns;
  unsigned long long checks_left;
  const volatile unsigned int* abort;
  unsigned int polls;
  static constexpr unsigned int kCheckEvery = 32;

  static Deadline after(unsigned long long timeout_ns, const volatile unsigned int* abort = nullptr) {
    Deadline d;
    d.polls = 0;
    d.abort = abort;
    d.limit_ns = 0ull;
    d.timeout_ns = timeout_ns;
    d.checks_left = timeout_ns == 0ull ? 0ull : timeout_ns / kCheckEvery + 1ull;
    return d;
  }
  bool expired() {
    if ((++polls % kCheckEvery) != 0) return false;
    if (abort != nullptr && at(abort).load(std::memory_order_relaxed) != 0u) return true;
    if (timeout_ns == 0ull) return false;
    if (--checks_left == 0ull) return true;
    const unsigned long long now = globaltimer_ns();
    if (limit_ns == 0ull) {
      limit_ns = timeout_ns > ~0ull - now ? ~0ull : now + timeout_ns;
      return false;
    }
    return now > limit_ns;
  }
  bool aborted() const { return abort != nullptr && at(abort).load(std::memory_order_relaxed) != 0u; }
};

template <typename Ready>
inline bool spin_until(Ready ready, Deadline& deadline) {
  while (true) {
    for (int k = 0; k < 8; ++k) {
      if (ready()) return true;
    }
    std::this_thread::yield();
    if (deadline.expired()) return false;
  }
}

}  // namespace detail
}  // namespace circuslink
