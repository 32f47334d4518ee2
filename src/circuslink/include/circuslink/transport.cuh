// circuslink/transport.cuh - put, put-with-signal, signal, wait and flush on a Connection, from device code.
//
// The host opens the connection (circuslink.transport.connect) and passes conn.device_handle() by value:
//
//   #include <circuslink/transport.cuh>
//   __global__ void step(circuslink::transport::Handle c, const float* x, size_t n) {
//     namespace t = circuslink::transport;
//     t::put_with_signal_block(c, 0, x, n * sizeof(float), 0, epoch);   // the block copies, one thread signals
//     if (threadIdx.x == 0 && t::wait(c, 0, epoch) != t::kOk) { /* timed out: the host's check names it */ }
//   }
//
// A handle whose transport is device-initiated and mapped (mode kModeStore: the ipc transport inside a node)
// stores straight into the peer's inbox. A proxied handle (kModeProxy: mpi, or nvshmem across nodes, whose
// device calls need nvcc's relocatable device code that NVRTC-compiled kernels do not link) returns kErrProxied
// from put and signal; wait and the local inbox work on every handle. Ordering: put_with_signal makes the
// data visible to the peer before the signal (a system-scope release), so a peer that waits for the signal
// and then reads its inbox sees the bytes.
#pragma once

#include "detail/sync.cuh"
#include "detail/transport_types.cuh"

namespace circuslink {
namespace transport {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ bool in_range(const Handle& h, unsigned long long offset, unsigned long long nbytes) {
  return offset <= h.nbytes && nbytes <= h.nbytes - offset;
}

// Copy `nbytes` from `src` into the peer's inbox at `offset`, cooperatively by `count` threads of which the
// caller is `index` (16-byte vectors where both ends are aligned, bytes otherwise). No ordering.
__device__ __forceinline__ void copy_range(unsigned char* dst, const unsigned char* src, unsigned long long nbytes,
                                           unsigned int index, unsigned int count) {
  const bool vec = ((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src)) & 15ull) == 0;
  unsigned long long done = 0;
  if (vec) {
    const unsigned long long n16 = nbytes / 16ull;
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (unsigned long long i = index; i < n16; i += count) d[i] = s[i];
    done = n16 * 16ull;
  }
  for (unsigned long long i = done + index; i < nbytes; i += count) dst[i] = src[i];
}

// One thread: put `nbytes` of `src` into the peer's inbox at `offset`.
__device__ __forceinline__ unsigned int put(const Handle& h, unsigned long long offset, const void* src,
                                            unsigned long long nbytes) {
  if (h.mode != kModeStore) return kErrProxied;
  if (!in_range(h, offset, nbytes)) return kErrRange;
  copy_range(h.remote + offset, static_cast<const unsigned char*>(src), nbytes, 0u, 1u);
  return kOk;
}

// One thread: set the peer's signal word `index` to `value`, after every store this thread made before.
__device__ __forceinline__ unsigned int signal(const Handle& h, unsigned int index, unsigned long long value) {
  if (h.mode != kModeStore) return kErrProxied;
  if (index >= h.nsignals) return kErrRange;
  __threadfence_system();
  circuslink::detail::st_release_sys_u64(h.remote_signals + index, value);
  return kOk;
}

// One thread: put, then signal (the data is visible to the peer before the signal).
__device__ __forceinline__ unsigned int put_with_signal(const Handle& h, unsigned long long offset, const void* src,
                                                        unsigned long long nbytes, unsigned int index,
                                                        unsigned long long value) {
  const unsigned int rc = put(h, offset, src, nbytes);
  return rc != kOk ? rc : signal(h, index, value);
}

// Every thread of the block (any shape): put cooperatively, then thread 0 signals after a block barrier.
// Returns the same code on every thread.
__device__ __forceinline__ unsigned int put_with_signal_block(const Handle& h, unsigned long long offset,
                                                              const void* src, unsigned long long nbytes,
                                                              unsigned int index, unsigned long long value) {
  using circuslink::detail::block_thread;
  using circuslink::detail::block_threads;
  if (h.mode != kModeStore) return kErrProxied;
  if (!in_range(h, offset, nbytes) || index >= h.nsignals) return kErrRange;
  copy_range(h.remote + offset, static_cast<const unsigned char*>(src), nbytes, block_thread(), block_threads());
  __threadfence_system();
  __syncthreads();
  if (block_thread() == 0) circuslink::detail::st_release_sys_u64(h.remote_signals + index, value);
  return kOk;
}

// One thread: wait until my signal word `index` is at least `value` (the handle's time-out; the host's abort
// word ends it too). What the peer put before signalling is visible to this thread afterwards.
__device__ __forceinline__ unsigned int wait(const Handle& h, unsigned int index, unsigned long long value) {
  if (index >= h.nsignals) return kErrRange;
  circuslink::detail::Deadline d = circuslink::detail::Deadline::after(h.timeout_ns, h.abort);
  const unsigned long long* word = h.local_signals + index;
  const bool ok = circuslink::detail::spin_until(
      [&] { return circuslink::detail::ld_acquire_sys_u64(word) >= value; }, d);
  if (ok) return kOk;
  return d.aborted() ? kErrAborted : kErrTimeout;
}

// Every store of this thread is visible system-wide (mapped handles need nothing more for completion).
__device__ __forceinline__ void flush(const Handle&) { __threadfence_system(); }

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace transport
}  // namespace circuslink
