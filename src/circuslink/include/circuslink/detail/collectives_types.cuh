// circuslink/detail/collectives_types.cuh - the Ring record, the Rings handle and the reduction operators.
//
// The host's ABI tables of Ring and Rings are circuslink/collectives/_layout.py (RING, RINGS);
// tests/test_abi.py checks that both sides agree. Plain structs: visible to host C++ as well.
#pragma once

#include <circuslink/channel.cuh>  // via -I<include>, which NVRTC and nvcc both get

namespace circuslink {
namespace collectives {

// One rank's place in one ring of byte channels.
struct Ring {
  Sender<unsigned char> right;    // byte channel to rank + 1
  Receiver<unsigned char> left;   // byte channel from rank - 1
  unsigned char* scratch;         // `piece` bytes of this rank's device memory (data from the left)
  unsigned long long piece;       // bytes per piece: a multiple of 16, at most half the ring
  unsigned int rank;
  unsigned int size;
};

// What a kernel receives (16 bytes, by value): comm.device_handle(nbytes) on the host. `rings`
// points at `count` Ring records in this rank's device memory; slice s of a *_grid call travels
// over rings[s].
struct Rings {
  const Ring* rings;
  unsigned int count;
  unsigned int pad;

  CIRCUSLINK_HD const Ring& operator[](unsigned int i) const { return rings[i]; }
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
