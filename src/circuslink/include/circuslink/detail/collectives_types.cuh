// circuslink/detail/collectives_types.cuh - the Ring handle and the reduction operators.
//
// The layout of Ring is mirrored by circuslink/collectives/_device.py (RING_DTYPE); change both.
#pragma once

#include <circuslink/channel.cuh>  // via -I<include>, which NVRTC and nvcc both get

namespace circuslink {
namespace collectives {

struct Ring {
  Sender<unsigned char> right;    // byte channel to rank + 1
  Receiver<unsigned char> left;   // byte channel from rank - 1
  unsigned char* scratch;         // `piece` bytes of this rank's device memory (data from the left)
  unsigned long long piece;       // bytes per piece: a multiple of 16, at most half the ring
  unsigned int rank;
  unsigned int size;
};

struct Sum {
  template <class T> CIRCUSLINK_HD T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T> CIRCUSLINK_HD T operator()(T a, T b) const { return a < b ? b : a; }
};
struct Min {
  template <class T> CIRCUSLINK_HD T operator()(T a, T b) const { return b < a ? b : a; }
};

}  // namespace collectives
}  // namespace circuslink
