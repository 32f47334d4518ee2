// circuslink/detail/transpose_impl.cuh: the inline code behind circuslink/transpose.cuh and the
// transposing puts of RMA queues (circuslink/rma.cuh, rma_kernels.cu, transpose_kernels.cu).
// Block-cooperative calls number threads by their linear index (detail::block_thread()), so any
// block shape works.
//
// One tile at a time, a whole block: read an m x n tile of the source row by row (consecutive
// threads take consecutive elements: coalesced), store it in shared memory at a padded pitch,
// then write it column by column of the tile, which are rows of the destination (consecutive
// threads take consecutive destination elements: coalesced stores into the peer). The pitch is
// padded so that both phases hit distinct banks (the host picks it per tile shape by simulating
// the 32 banks; the device call's fixed tiles use n + 1 with n even).
#pragma once

#include "sync.cuh"
#include "transpose_types.cuh"

namespace circuslink {
namespace detail {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

struct alignas(16) TransposeVec16 {
  unsigned long long x, y;
};

// The machine word that moves one element of a given size (bit-exact, no arithmetic).
template <unsigned int Bytes>
struct TransposeWord;
template <>
struct TransposeWord<4> {
  using type = unsigned int;
};
template <>
struct TransposeWord<8> {
  using type = unsigned long long;
};
template <>
struct TransposeWord<16> {
  using type = TransposeVec16;
};

// The block's tile buffer: one per block, whichever function of the kernel uses it.
__device__ __forceinline__ unsigned char* transpose_tile_buffer() {
  __shared__ __align__(16) unsigned char buffer[kTransposeTileBytes];
  return buffer;
}

// Elements each thread keeps in flight per phase (independent loads before their stores):
// about 32 bytes a thread whatever the element size.
template <typename W>
struct TransposeUnroll {
  static constexpr unsigned int value = sizeof(W) >= 16 ? 4u : 8u;
};

// Turn one tile: rows_here x cols_here source elements (<= m x n) at `src` (leading dimension
// src_ld) to `dst` (leading dimension dst_ld), transposed, through `tile` (pitch elements a row).
// Every thread of the block calls it (it synchronises the block twice).
template <typename W>
__device__ __forceinline__ void transpose_tile(W* dst, unsigned long long dst_ld, const W* src,
                                               unsigned long long src_ld, unsigned int rows_here,
                                               unsigned int cols_here, unsigned int m_log2, unsigned int n_log2,
                                               unsigned int pitch, W* tile, unsigned int tid,
                                               unsigned int nthreads) {
  constexpr unsigned int kU = TransposeUnroll<W>::value;
  const unsigned int n_mask = (1u << n_log2) - 1u;
  const unsigned int m_mask = (1u << m_log2) - 1u;
  if ((nthreads & n_mask) == 0u && (nthreads & m_mask) == 0u) {
    // The usual case (block size a multiple of both tile sides): each thread keeps one column of
    // the read and one row of the write and steps with a constant stride.
    // Read phase: a warp reads along a source row (consecutive c), coalesced.
    const unsigned int c = tid & n_mask, r_step = nthreads >> n_log2;
    if (c < cols_here) {
      for (unsigned int r = tid >> n_log2; r < rows_here; r += kU * r_step) {
        const W* from = src + r * src_ld + c;
        const unsigned long long from_step = r_step * src_ld;
        W v[kU];
#pragma unroll
        for (unsigned int u = 0; u < kU; ++u) {
          if (r + u * r_step < rows_here) v[u] = from[u * from_step];
        }
#pragma unroll
        for (unsigned int u = 0; u < kU; ++u) {
          if (r + u * r_step < rows_here) tile[(r + u * r_step) * pitch + c] = v[u];
        }
      }
    }
    __syncthreads();
    // Write phase: a warp writes along a destination row (consecutive r), coalesced.
    const unsigned int r = tid & m_mask, c_step = nthreads >> m_log2;
    if (r < rows_here) {
      for (unsigned int c0 = tid >> m_log2; c0 < cols_here; c0 += kU * c_step) {
        W* to = dst + c0 * dst_ld + r;
        const unsigned long long to_step = c_step * dst_ld;
        W v[kU];
#pragma unroll
        for (unsigned int u = 0; u < kU; ++u) {
          if (c0 + u * c_step < cols_here) v[u] = tile[r * pitch + c0 + u * c_step];
        }
#pragma unroll
        for (unsigned int u = 0; u < kU; ++u) {
          if (c0 + u * c_step < cols_here) to[u * to_step] = v[u];
        }
      }
    }
    __syncthreads();  // the buffer is free for the next tile
    return;
  }
  // Any other block size: element e of the tile is (e / n, e % n) when read, (e % m, e / m) when written.
  const unsigned int count = 1u << (m_log2 + n_log2);
  for (unsigned int e = tid; e < count; e += nthreads) {
    const unsigned int r = e >> n_log2, c = e & n_mask;
    if (r < rows_here && c < cols_here) tile[r * pitch + c] = src[r * src_ld + c];
  }
  __syncthreads();
  for (unsigned int e = tid; e < count; e += nthreads) {
    const unsigned int c = e >> m_log2, r = e & m_mask;
    if (r < rows_here && c < cols_here) dst[c * dst_ld + r] = tile[r * pitch + c];
  }
  __syncthreads();
}

// Tile k of a block described by (src, dst, rows, cols, lds) cut into 2^m_log2 x 2^n_log2 tiles,
// `across` tiles per tile row.
template <typename W>
__device__ __forceinline__ void transpose_block_tile(unsigned long long dst_addr, unsigned long long dst_ld,
                                                     unsigned long long src_addr, unsigned long long src_ld,
                                                     unsigned long long rows, unsigned long long cols,
                                                     unsigned long long k, unsigned long long across,
                                                     unsigned int m_log2, unsigned int n_log2,
                                                     unsigned int pitch) {
  const unsigned long long r0 = (k / across) << m_log2;
  const unsigned long long c0 = (k % across) << n_log2;
  const unsigned long long m = 1ull << m_log2, n = 1ull << n_log2;
  const unsigned int rows_here = static_cast<unsigned int>(rows - r0 < m ? rows - r0 : m);
  const unsigned int cols_here = static_cast<unsigned int>(cols - c0 < n ? cols - c0 : n);
  const W* src = reinterpret_cast<const W*>(src_addr) + r0 * src_ld + c0;
  W* dst = reinterpret_cast<W*>(dst_addr) + c0 * dst_ld + r0;
  transpose_tile<W>(dst, dst_ld, src, src_ld, rows_here, cols_here, m_log2, n_log2, pitch,
                    reinterpret_cast<W*>(transpose_tile_buffer()), block_thread(), block_threads());
}

__device__ __forceinline__ void transpose_descriptor_tile(const RmaTransposeDescriptor& d, unsigned long long k) {
  switch (d.elem_bytes) {
    case 4:
      transpose_block_tile<unsigned int>(d.dst, d.dst_ld, d.src, d.src_ld, d.rows, d.cols, k, d.tiles_across,
                                         d.tile_rows_log2, d.tile_cols_log2, d.pitch);
      break;
    case 8:
      transpose_block_tile<unsigned long long>(d.dst, d.dst_ld, d.src, d.src_ld, d.rows, d.cols, k, d.tiles_across,
                                               d.tile_rows_log2, d.tile_cols_log2, d.pitch);
      break;
    default:
      transpose_block_tile<TransposeVec16>(d.dst, d.dst_ld, d.src, d.src_ld, d.rows, d.cols, k, d.tiles_across,
                                           d.tile_rows_log2, d.tile_cols_log2, d.pitch);
      break;
  }
}

// Blocks share the chain's tiles: this block (`part` of `parts`) turns tiles part, part + parts, ...
// Block-uniform: every thread of the block calls it with the same arguments. kElemBytes is the
// element size of every descriptor of the chain (4, 8, 16), or 0 for a chain of mixed sizes: a
// kernel for one size needs about half the registers of the mixed one (occupancy).
template <unsigned int kElemBytes>
__device__ __forceinline__ void transpose_chain(const RmaTransposeChain& chain, unsigned long long part,
                                                unsigned long long parts) {
  for (unsigned long long t = part; t < chain.total_tiles; t += parts) {
    // The descriptor holding tile t: the last one whose tile_begin <= t.
    unsigned long long lo = 0, hi = chain.n_descs;
    while (hi - lo > 1) {
      const unsigned long long mid = (lo + hi) / 2;
      if (chain.descs[mid].tile_begin <= t) lo = mid; else hi = mid;
    }
    const RmaTransposeDescriptor& d = chain.descs[lo];
    if constexpr (kElemBytes == 0) {
      transpose_descriptor_tile(d, t - d.tile_begin);
    } else {
      transpose_block_tile<typename TransposeWord<kElemBytes>::type>(
          d.dst, d.dst_ld, d.src, d.src_ld, d.rows, d.cols, t - d.tile_begin, d.tiles_across, d.tile_rows_log2,
          d.tile_cols_log2, d.pitch);
    }
  }
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace detail
}  // namespace circuslink
