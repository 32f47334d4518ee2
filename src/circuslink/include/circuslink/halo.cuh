// circuslink/halo.cuh - a rank's halo channels on a process grid, indexed by direction.
//
// The host opens them in one call and passes the handle by value (docs/user-kernels.md):
//
//   halo = cl.channels.open_halo(world, "mesh:2x2", "float", depth=2 * edge)     # Python, collective
//   fn(grid, block, (halo.device_handle(), ...))
//
//   __global__ void exchange(circuslink::Halo<float> halo, const float* east_edge, float* east_halo, ...) {
//     if (threadIdx.x < 32 && halo.has(circuslink::kPlusX)) {               // one full warp
//       halo.to[circuslink::kPlusX].write_warp(east_edge, ny);             // toward +x
//       halo.from[circuslink::kPlusX].read_warp(east_halo, ny);            // what the +x neighbour sent
//     }
//   }
//
// Directions are 2*dim toward +dim and 2*dim+1 toward -dim (+x 0, -x 1, +y 2, -y 3, +z 4, -z 5), as the
// topologies number their ports; x varies fastest in the rank (rank = x + X * (y + Y * z)). to[d] and
// from[d] are the channel ends of circuslink/channel.cuh, so every call, guarantee and failure rule of
// Sender<T> / Receiver<T> holds; a direction without a neighbour (past a mesh's boundary) has zeroed ends
// that must not be used: ask has(d) first.
#pragma once

#include "channel.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CIRCUSLINK_HALO_HD __host__ __device__
#else
#define CIRCUSLINK_HALO_HD
#endif

namespace circuslink {

enum Direction : int { kPlusX = 0, kMinusX = 1, kPlusY = 2, kMinusY = 3, kPlusZ = 4, kMinusZ = 5 };
constexpr int kHaloDirections = 6;

// The direction a neighbour in direction d sees this rank in.
CIRCUSLINK_HALO_HD constexpr int opposite(int d) { return d ^ 1; }

// The host's table of this struct is circuslink.channels._halo.HALO (tests/test_abi.py checks both agree).
template <typename T>
struct Halo {
  Sender<T> to[kHaloDirections];    // to[d]: this rank's end toward the neighbour in direction d
  Receiver<T> from[kHaloDirections];  // from[d]: the end that receives what the neighbour in direction d sends
  unsigned int present;             // bit d set: a neighbour in direction d
  unsigned int dims;                // dimensions of the process grid (1..3)

  CIRCUSLINK_HALO_HD bool has(int d) const { return ((present >> d) & 1u) != 0u; }
};

}  // namespace circuslink
