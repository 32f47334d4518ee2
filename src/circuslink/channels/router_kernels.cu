// The forwarding agent kernel of the cuda back-end (channels/_router_cuda.py launches one block per rank on
// its own stream while routed channels are open).
#include <circuslink/router.cuh>

extern "C" __global__ void __launch_bounds__(512, 1) circuslink_router_agent(circuslink::router::Agent a) {
  extern __shared__ __align__(16) unsigned char smem[];
  circuslink::router::run_agent(a, smem);
}
