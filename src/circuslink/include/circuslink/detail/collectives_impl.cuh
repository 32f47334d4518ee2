// circuslink/detail/collectives_impl.cuh - device code of the collectives (see collectives.cuh).
#pragma once

#include "collectives_types.cuh"

namespace circuslink {
namespace collectives {
namespace detail {

typedef unsigned long long u64;

__device__ __forceinline__ u64 min_u64(u64 a, u64 b) { return a < b ? a : b; }

// This block's linear index in the grid and the grid's block count (1-D, 2-D or 3-D grids).
__device__ __forceinline__ unsigned int grid_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ unsigned int grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }

// [lo, hi) of segment i of `count` elements of `elem` bytes split in `parts`: whole 16-byte units
// (so every segment starts 16-byte aligned and the channel copies whole vectors), the first
// (units % parts) one unit longer, and the last also taking the elements past the last whole unit.
__device__ __forceinline__ void segment(u64 count, unsigned int elem, unsigned int parts, unsigned int i, u64& lo,
                                        u64& hi) {
  const u64 per_unit = elem >= 16 ? 1 : 16 / elem;
  const u64 units = count / per_unit, base = units / parts, extra = units % parts;
  lo = (i * base + (i < extra ? i : extra)) * per_unit;
  hi = i + 1 == parts ? count : lo + (base + (i < extra ? 1 : 0)) * per_unit;
}

// Every thread of the block: one piece to the right / from the left. Out of line on purpose: the
// channel's block copy is large, and inlined at each of the ring's call sites (three per all-reduce
// instantiation, one per dtype and op) it made NVRTC take ~4 s per instantiation; called, it is
// compiled once per module.
__device__ __noinline__ bool ring_send(const Ring& ring, const unsigned char* src, u64 bytes) {
  Sender<unsigned char> right = ring.right;
  return right.write_block(src, bytes);
}
__device__ __noinline__ bool ring_recv(const Ring& ring, unsigned char* dst, u64 bytes) {
  Receiver<unsigned char> left = ring.left;
  return left.read_block(dst, bytes);
}

// Stream `send_bytes` from `src` to the right while receiving `recv_bytes` from the left, one
// piece of each at a time. Each received piece is handed to consume(dst_offset, bytes, from)
// where `from` is the scratch buffer (reduce) or nullptr when it was read straight to `direct`.
template <class Consume>
__device__ bool exchange(const Ring& ring, const unsigned char* src, u64 send_bytes, unsigned char* direct,
                         u64 recv_bytes, Consume consume) {
  u64 sent = 0, got = 0;
  while (sent < send_bytes || got < recv_bytes) {
    if (sent < send_bytes) {
      u64 k = min_u64(ring.piece, send_bytes - sent);
      if (!ring_send(ring, src + sent, k)) return false;
      sent += k;
    }
    if (got < recv_bytes) {
      u64 k = min_u64(ring.piece, recv_bytes - got);
      unsigned char* dst = direct ? direct + got : ring.scratch;
      if (!ring_recv(ring, dst, k)) return false;
      __syncthreads();  // every thread's part of the piece has landed
      consume(got, k, direct ? nullptr : ring.scratch);
      __syncthreads();  // scratch is free again before the next read
      got += k;
    }
  }
  return true;
}

// Every thread of the block, whatever its shape (1-D, 2-D or 3-D): dst[i] = op(dst[i], from[i]).
template <class T, class Op>
__device__ void combine(T* dst, const unsigned char* from, u64 bytes, Op op) {
  const T* src = reinterpret_cast<const T*>(from);
  const u64 step = circuslink::detail::block_threads();
  for (u64 i = circuslink::detail::block_thread(); i < bytes / sizeof(T); i += step) dst[i] = op(dst[i], src[i]);
}

}  // namespace detail

// All threads of one block: data[0, n) becomes the element-wise op over every rank's data.
template <class T, class Op>
__device__ bool allreduce_block(const Ring& ring, T* data, unsigned long long n, Op op) {
  using detail::u64;
  const unsigned int size = ring.size, rank = ring.rank;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(data);
  if (size == 1 || n == 0) return true;
  if (size == 2 && n * sizeof(T) <= ring.piece) {
    // Direct: one hop. My data goes right (= to the other rank), theirs lands in scratch.
    return detail::exchange(ring, bytes, n * sizeof(T), nullptr, n * sizeof(T),
                            [&](u64 off, u64 k, const unsigned char* from) {
                              detail::combine(reinterpret_cast<T*>(bytes + off), from, k, op);
                            });
  }
  for (unsigned int step = 0; step + 1 < size; ++step) {  // reduce-scatter
    u64 s_lo, s_hi, r_lo, r_hi;
    detail::segment(n, sizeof(T), size, (rank + size - step) % size, s_lo, s_hi);
    detail::segment(n, sizeof(T), size, (rank + 2 * size - step - 1) % size, r_lo, r_hi);
    T* acc = data + r_lo;
    bool ok = detail::exchange(ring, bytes + s_lo * sizeof(T), (s_hi - s_lo) * sizeof(T), nullptr,
                               (r_hi - r_lo) * sizeof(T), [&](u64 off, u64 k, const unsigned char* from) {
                                 detail::combine(reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(acc) + off),
                                                 from, k, op);
                               });
    if (!ok) return false;
  }
  for (unsigned int step = 0; step + 1 < size; ++step) {  // all-gather
    u64 s_lo, s_hi, r_lo, r_hi;
    detail::segment(n, sizeof(T), size, (rank + 1 + size - step) % size, s_lo, s_hi);
    detail::segment(n, sizeof(T), size, (rank + size - step) % size, r_lo, r_hi);
    bool ok = detail::exchange(ring, bytes + s_lo * sizeof(T), (s_hi - s_lo) * sizeof(T), bytes + r_lo * sizeof(T),
                               (r_hi - r_lo) * sizeof(T), [](u64, u64, const unsigned char*) {});
    if (!ok) return false;
  }
  return true;
}

// Every thread of the grid: slice s of data is reduced over rings[s], s = 0 .. rings.count - 1; block b
// takes slices b, b + G, b + 2G, ... (G = blocks in the grid) in that order, on every rank, so any grid
// size covers every slice - also one smaller than rings.count, as the SM budget may force - and the
// ranks cannot deadlock: the lowest unfinished slice always has every rank's owning block at it.
template <class T, class Op>
__device__ bool allreduce_grid(const Rings& rings, T* data, unsigned long long n, Op op) {
  for (unsigned int s = detail::grid_block(); s < rings.count; s += detail::grid_blocks()) {
    detail::u64 lo, hi;
    detail::segment(n, sizeof(T), rings.count, s, lo, hi);
    if (!allreduce_block(rings[s], data + lo, hi - lo, op)) return false;
    __syncthreads();
  }
  return true;
}

// All threads of one block: root's data[0, n) on every rank, pipelined along the ring.
template <class T>
__device__ bool broadcast_block(const Ring& ring, T* data, unsigned long long n, unsigned int root) {
  if (ring.size == 1) return true;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(data);
  const unsigned int last = (root + ring.size - 1) % ring.size;  // does not forward
  const detail::u64 total = n * sizeof(T);
  for (detail::u64 lo = 0; lo < total; lo += ring.piece) {
    detail::u64 k = detail::min_u64(ring.piece, total - lo);
    if (ring.rank != root) {
      if (!detail::ring_recv(ring, bytes + lo, k)) return false;
      __syncthreads();
    }
    if (ring.rank != last && !detail::ring_send(ring, bytes + lo, k)) return false;
  }
  return true;
}

// Slices as allreduce_grid: every slice is covered whatever the grid size.
template <class T>
__device__ bool broadcast_grid(const Rings& rings, T* data, unsigned long long n, unsigned int root) {
  for (unsigned int s = detail::grid_block(); s < rings.count; s += detail::grid_blocks()) {
    detail::u64 lo, hi;
    detail::segment(n, sizeof(T), rings.count, s, lo, hi);
    if (!broadcast_block(rings[s], data + lo, hi - lo, root)) return false;
    __syncthreads();
  }
  return true;
}

// All threads of one block: returns once every rank's block has entered the barrier.
__device__ inline bool barrier_block(const Ring& ring) {
  if (ring.size == 1) return true;
  __shared__ unsigned char token[16];
  if (circuslink::detail::block_thread() == 0) token[0] = 0xB7;
  __syncthreads();
  for (int trip = 0; trip < 2; ++trip) {
    if (ring.rank == 0) {
      if (!detail::ring_send(ring, token, 1)) return false;
      if (trip == 0 && !detail::ring_recv(ring, token, 1)) return false;
    } else {
      if (!detail::ring_recv(ring, token, 1)) return false;
      __syncthreads();
      if (!(trip == 1 && ring.rank == ring.size - 1) && !detail::ring_send(ring, token, 1)) return false;
    }
  }
  __syncthreads();
  return true;
}

// All threads of one block: the barrier over the first ring of a handle (comm.device_handle()).
__device__ inline bool barrier_block(const Rings& rings) { return barrier_block(rings[0]); }

}  // namespace collectives
}  // namespace circuslink
