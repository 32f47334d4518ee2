// The forwarding agent kernel of the cuda back-end (channels/_router_cuda.py keeps a grid of 1 + ncopy blocks per
// rank resident on its own stream while routed channels are open). Two blocks an SM (_router_cuda.BLOCKS_PER_SM).
#include <circuslink/router.cuh>

extern "C" __global__ void __launch_bounds__(512, 2) circuslink_router_agent(circuslink::router::Agent a) {
  extern __shared__ __align__(16) unsigned char smem[];
  circuslink::router::run_agent(a, smem);
}
