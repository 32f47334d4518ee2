// circuslink/transpose.cuh: UZURA's transposing put, called from inside a kernel.
//
// Copy a rows x cols block of 4-, 8- or 16-byte elements from `src` (row-major, leading
// dimension src_ld elements) to `dst` transposed (cols x rows, leading dimension dst_ld):
//     dst[c * dst_ld + r] = src[r * src_ld + c]
// `dst` is usually a peer's memory mapped here (SymmetricBuffer.ptr(peer), or a window's), so
// the matrix lands in the peer already transposed; it may also be local memory.
//
//   #include <circuslink/transpose.cuh>
//   __global__ void k(float2* peer, const float2* mine, unsigned long long n) {
//     circuslink::transpose_put(peer, n, mine, n, n, n, blockIdx.x, gridDim.x);  // tiles shared by the grid
//     // make the data visible before telling the peer (a flag, a channel, an RMA counter):
//     __threadfence_system();
//   }
//
// Block-cooperative: every thread of the calling block calls it with the same arguments (any
// block shape; it synchronises the block). `part` / `parts` share the block's tiles among
// several blocks: block `part` of `parts` turns tiles part, part + parts, ...; the default (0, 1)
// has one block do everything. Tiles are read coalesced, turned in shared memory (padded rows,
// free of bank conflicts) and written coalesced; the kernel reserves kTransposeTileBytes
// (18 KiB) of static shared memory per block for it. Fixed tiles: 64 x 64 for 4-byte elements,
// 32 x 64 for 8-byte, 32 x 32 for 16-byte (the RMA queues' tiles come from the tile model).
// 16-byte elements must be 16-byte aligned (cuDoubleComplex / double2 are).
// Completion is the caller's: the stores are ordinary stores into the peer, ordered for it by
// __threadfence_system() before whatever signal the peer waits on.
#pragma once

// rma.cuh included after this header runs a queue's transposing puts in rma_start.
#define CIRCUSLINK_TRANSPOSE_PUTS 1

#include "detail/transpose_impl.cuh"

namespace circuslink {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename T>
__device__ __forceinline__ void transpose_put(T* dst, unsigned long long dst_ld, const T* src,
                                              unsigned long long src_ld, unsigned long long rows,
                                              unsigned long long cols, unsigned long long part = 0,
                                              unsigned long long parts = 1) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16,
                "circuslink::transpose_put moves 4-, 8- or 16-byte elements");
  using W = typename detail::TransposeWord<sizeof(T)>::type;
  // Tiles with both bursts >= 256 bytes and an odd pitch (n + 1): conflict-free in both phases.
  constexpr unsigned int m_log2 = sizeof(T) == 4 ? 6 : 5;
  constexpr unsigned int n_log2 = sizeof(T) == 16 ? 5 : 6;
  constexpr unsigned int pitch = (1u << n_log2) + 1u;
  static_assert((1u << m_log2) * pitch * sizeof(T) <= kTransposeTileBytes, "tile exceeds the shared buffer");
  const unsigned long long across = (cols + (1ull << n_log2) - 1) >> n_log2;
  const unsigned long long down = (rows + (1ull << m_log2) - 1) >> m_log2;
  const unsigned long long tiles = across * down;
  for (unsigned long long k = part; k < tiles; k += parts) {
    detail::transpose_block_tile<W>(reinterpret_cast<unsigned long long>(dst), dst_ld,
                                    reinterpret_cast<unsigned long long>(src), src_ld, rows, cols, k, across, m_log2,
                                    n_log2, pitch);
  }
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace circuslink
