// circuslink/route.cuh - routing table look-ups for forwarding agents (the tables: docs/routing.md).
//
//   circuslink::route::Entry e = circuslink::route::next_hop(table, dst);
//   if (e.port == circuslink::route::PORT_LOCAL) { /* deliver */ }
//   else if (circuslink::route::crosses_network(table, e)) { /* into this gateway's relay out ring */ }
//   else { /* into e.next's ring (ports[e.port].peer_port, e.vc) */ }
#pragma once

#include "detail/route_types.cuh"

namespace circuslink {
namespace route {

// The table entry for `dst` at this rank; PORT_NONE when dst is out of range or unreachable.
__device__ __forceinline__ Entry next_hop(const Table& t, unsigned int dst) {
  if (dst >= t.nranks) return Entry{(unsigned short)NO_RANK, (unsigned char)PORT_NONE, 0};
  return t.entries[dst];
}

// The port behind an entry (nullptr for PORT_LOCAL / PORT_NONE).
__device__ __forceinline__ const Port* port_of(const Table& t, const Entry& e) {
  return e.port < t.nports ? &t.ports[e.port] : nullptr;
}

// Whether the hop of an entry crosses to another node through a transport (the gateway's relay
// carries it) rather than into a mapped neighbour's ring.
__device__ __forceinline__ bool crosses_network(const Table& t, const Entry& e) {
  const Port* p = port_of(t, e);
  return p != nullptr && p->kind == LINK_NETWORK;
}

}  // namespace route
}  // namespace circuslink
