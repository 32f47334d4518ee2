// circuslink/detail/transpose_types.cuh: the device-side layout of transposing puts.
//
// The host declares these structs once, as circuslink._abi tables (circuslink/rma/_transpose/_cuda.py:
// TRANSPOSE_DESCRIPTOR, TRANSPOSE_CHAIN), packs them with the numpy dtype computed from the table,
// and checks sizes and offsets against this file (circuslink._abi.static_asserts). Change both together.
#pragma once

namespace circuslink {

// Shared memory a block reserves for one tile: the largest padded tile the host may choose
// (tile_rows * pitch * elem_bytes <= kTransposeTileBytes).
constexpr unsigned int kTransposeTileBytes = 18432;

// One transposing put: a rows x cols block of elem_bytes-byte elements, read row-major from
// `src` with leading dimension src_ld (elements), written transposed (cols x rows) to `dst`
// with leading dimension dst_ld. Cut into tiles of (1 << tile_rows_log2) x (1 << tile_cols_log2)
// source elements; tile t of this descriptor (t - tile_begin) is tile row t / tiles_across,
// tile column t % tiles_across.
struct RmaTransposeDescriptor {
  unsigned long long src;          // my source, first element
  unsigned long long dst;          // destination, first element (the target's memory mapped here)
  unsigned long long rows;
  unsigned long long cols;
  unsigned long long src_ld;       // elements between source rows
  unsigned long long dst_ld;       // elements between destination rows
  unsigned long long tile_begin;   // first tile of this descriptor in the chain (prefix sum)
  unsigned int tiles_across;       // ceil(cols / tile cols)
  unsigned int elem_bytes;         // 4, 8 or 16
  unsigned int tile_rows_log2;     // m = 1 << tile_rows_log2 (source rows per tile)
  unsigned int tile_cols_log2;     // n = 1 << tile_cols_log2 (source columns per tile)
  unsigned int pitch;              // shared-memory row pitch in elements (>= n; padded against bank conflicts)
  unsigned int reserved;
};

// The transposing puts of one queue (RmaQueue::transposes), or of a local transpose.
struct RmaTransposeChain {
  const RmaTransposeDescriptor* descs;
  unsigned long long n_descs;
  unsigned long long total_tiles;
};

}  // namespace circuslink
