// Kernels of transposing puts outside a start launch (circuslink/rma/_transpose/_cuda.py compiles
// this file with NVRTC):
//
//   circuslink_transpose_chainN: every block turns its share of a chain's tiles (block b takes
//       tiles b, b + gridDim.x, ...). The graph launch runs it as the node between the copies and
//       the signal; local transposes (the tile model's calibration, the local-transpose baseline
//       of the benchmarks) run it on a chain whose destination is this rank's own memory.
#include <circuslink/transpose.cuh>

template <unsigned int kElemBytes>
__device__ __forceinline__ void chain_kernel(const circuslink::RmaTransposeChain* chain) {
  circuslink::detail::transpose_chain<kElemBytes>(*chain, blockIdx.x, gridDim.x);
}
// circuslink_transpose_chainN: every descriptor has N-byte elements (0: mixed sizes).
extern "C" __global__ void __launch_bounds__(256, 4) circuslink_transpose_chain4(
    const circuslink::RmaTransposeChain* c) {
  chain_kernel<4>(c);
}
extern "C" __global__ void __launch_bounds__(256, 4) circuslink_transpose_chain8(
    const circuslink::RmaTransposeChain* c) {
  chain_kernel<8>(c);
}
extern "C" __global__ void __launch_bounds__(256, 4) circuslink_transpose_chain16(
    const circuslink::RmaTransposeChain* c) {
  chain_kernel<16>(c);
}
extern "C" __global__ void circuslink_transpose_chain0(const circuslink::RmaTransposeChain* c) { chain_kernel<0>(c); }

