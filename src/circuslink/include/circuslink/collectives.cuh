// circuslink/collectives.cuh - collectives inside users' kernels: over shared memory (Team) or channels (Rings).
//
// Team (ranks that map each other's memory: one GPU under MPS, one node): comm.device_team() on the
// host, by value. Every thread of the grid calls (the grid co-resident: world.backend.max_blocks /
// launch_resident), every rank the same calls in the same order; each returns false on every thread
// when a wait timed out, and the rank's error record names the peer and the slot (comm.check()).
//
//   cc::allreduce(team, in, out, n, op)    one-shot up to team.oneshot_max bytes (LL lines into every peer's
//   cc::allreduce(team, data, n, op)       slots, one round trip), two-shot above (reduce-scatter + all-gather
//                                          loading the peers' stages in place); out may be in
//   cc::allreduce_oneshot / allreduce_twoshot(team, in, out, n, op)    a chosen algorithm
//   cc::allreduce_stage(team, n, op)       in place on cc::stage<T>(team)[0, n) (symmetric memory; no copy in)
//   cc::reduce_scatter(team, in, out, count, op)  in: size blocks of count; out: block rank, reduced
//   cc::all_gather(team, in, out, count)   out[q * count + i] = rank q's in[i]
//   cc::broadcast(team, data, n, root)     cc::barrier(team)
// Ops cc::Sum / Max / Min over any arithmetic T and cc::bf16; every rank folds in rank order, so all get
// bitwise the same result (and the same as the cpu back-end).
//
// Rings (any ranks, routed topologies too):
// A kernel receives a circuslink::collectives::Rings handle by value: on the host,
// circuslink.collectives.Comm(world).device_handle(nbytes) (a 16-byte struct CuPy passes as it is).
// It names `count` rings of byte channels; each Ring is one rank's place in one ring (a Sender to
// rank + 1, a Receiver from rank - 1, mod size, plus scratch). Every rank must call the same
// collectives in the same order on the same handle (as with MPI).
//
//   namespace cc = circuslink::collectives;
//   template <class T>
//   __global__ void step(cc::Rings rings, T* x, unsigned long long n, int* failed) {
//     ... compute x ...
//     if (!cc::allreduce_grid(rings, x, n, cc::Sum())) *failed = 1;   // every thread of the grid; in place
//     ... use x ...
//   }
//
// Forms:
//   *_block(const Ring&, ...)   every thread of ONE block, over one ring
//   *_grid(const Rings&, ...)   every thread of the grid: slice s of the data travels over rings[s];
//                               block b takes slices b, b + G, ... (G blocks), so any grid size covers
//                               every slice. A grid whose blocks wait on peers must fit at once in the
//                               rank's SM budget: size it with world.backend.max_blocks(kernel, threads).
//   barrier_block(const Rings&) every thread of one block, over rings[0]
// Blocks of any shape (1-D, 2-D or 3-D) of at least 32 threads: threads are numbered linearly.
// Every call returns false, on every thread of the group, if a channel wait timed out (the channel
// recorded an error that the host raises as circuslink.ChannelError naming it: comm.check()).
//
// Algorithms: ring reduce-scatter + all-gather (2 (size - 1) hops; every segment is reduced
// once, so every rank gets bitwise the same result); for 2 ranks and data that fits one piece,
// a direct exchange (1 hop; op(a, b) == op(b, a) bitwise for sum / max / min, so both ranks
// still agree). Broadcast is a pipelined chain from the root; barrier two trips of a token.
// Data flows in pieces of at most half a channel's ring, alternating one write to the right
// and one read from the left, which cannot deadlock (docs/collectives.md explains why).
#pragma once

#include "detail/collectives_types.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "detail/collectives_impl.cuh"
#include "detail/team_impl.cuh"
#endif
