// circuslink/collectives.cuh - all-reduce, broadcast and barrier inside users' kernels, over channels.
//
// A circuslink::collectives::Ring is one rank's place in a ring of byte channels: a Sender to
// rank + 1 and a Receiver from rank - 1 (mod size), plus a scratch buffer. The host makes them:
// circuslink.collectives.Comm(world).device_rings() gives an array of Rings (one per block
// that takes part); pass its pointer to your kernel. Every rank must call the same collectives
// in the same order on the same rings (as with MPI).
//
//   namespace cc = circuslink::collectives;
//   extern "C" __global__ void step(const cc::Ring* rings, unsigned int nrings, float* x, unsigned long long n) {
//     ... compute x ...
//     cc::allreduce_grid(rings, nrings, x, n, cc::Sum());   // every thread of the grid; in place
//     ... use x ...
//   }
//
// Forms: *_block (all threads of ONE block, one Ring) and *_grid (slice s of the data travels over
// rings[s]; block b takes slices b, b + gridDim.x, ...: any grid size covers every slice, and a grid
// no larger than the rank's SM budget allows, world.backend.max_blocks(...), never stalls a peer).
// Every call returns
// false if a channel wait timed out (the channel recorded an error the host raises).
//
// Algorithms: ring reduce-scatter + all-gather (2 (size - 1) hops; every segment is reduced
// once, so every rank gets bitwise the same result); for 2 ranks and data that fits one piece,
// a direct exchange (1 hop; op(a, b) == op(b, a) bitwise for sum / max / min, so both ranks
// still agree). Broadcast is a pipelined chain from the root; barrier two trips of a token.
// Data flows in pieces of at most half a channel's ring, alternating one write to the right
// and one read from the left, which cannot deadlock (see circuslink/collectives/_algorithms.py).
#pragma once

#include "detail/collectives_types.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "detail/collectives_impl.cuh"
#endif
