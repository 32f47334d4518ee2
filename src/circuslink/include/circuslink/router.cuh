// circuslink/router.cuh - the forwarding agent of routed channels (docs/routing.md, "Forwarding").
//
// circuslink starts one agent per rank when channels on a topology include routed ones (channels.open with
// a topology, or a spec's <topology>), and stops it at close: kernels never call it. A routed channel's ends
// are the same circuslink::Sender<T> / Receiver<T> as any other (channel.cuh); the agent moves its packets
// between the ranks of its route. What it serves, per rank, is circuslink::router::Agent
// (detail/router_types.cuh), built by the host from the routing tables (route.cuh).
//
//     extern "C" __global__ void agent(circuslink::router::Agent a) {   // 1 + a.ncopy blocks, blockDim.x % 32 == 0
//       extern __shared__ __align__(16) unsigned char smem[];          // router::shared_bytes(...) bytes
//       circuslink::router::run_agent(a, smem);
//     }
#pragma once

#include "detail/router_types.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "detail/router_impl.cuh"

namespace circuslink {
namespace router {

// Serve this rank's inputs until the host sets the stop or yield word (or the abort word); every thread of the grid.
__device__ __forceinline__ void run_agent(const Agent& a, unsigned char* smem) { impl::run(a, smem); }

}  // namespace router
}  // namespace circuslink
#endif
