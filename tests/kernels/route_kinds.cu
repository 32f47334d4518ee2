// The device's view of a topology of nodes (tests/test_nodes_topology.py): for every destination, what
// a forwarding agent at `table.rank` would do with a packet for it: 2 deliver here, 1 hand it to the
// relay between nodes (this rank is the gateway), 0 store it into a mapped neighbour's ring; and the next rank.
#include <circuslink/route.cuh>

extern "C" __global__ void route_kinds(circuslink::route::Table table, int* action, int* next) {
  const unsigned int dst = blockIdx.x * blockDim.x + threadIdx.x;
  if (dst >= table.nranks) return;
  const circuslink::route::Entry e = circuslink::route::next_hop(table, dst);
  action[dst] = e.port == circuslink::route::PORT_LOCAL ? 2 : circuslink::route::crosses_network(table, e) ? 1 : 0;
  next[dst] = e.next;
}
