// circuslink/detail/route_types.cuh - the routing table layouts a forwarding agent loads.
//
// Declared once on the host in circuslink/topology/_routing.py (ENTRY, PORT, TABLE, circuslink._abi
// tables); tests/test_topology.py compiles static_asserts of both against this file. Change both together.
// The host computes the tables (docs/routing.md); plain structs, visible to host C++ as well as device code.
#pragma once

namespace circuslink {
namespace route {

enum : unsigned int {
  NO_RANK = 0xFFFFu,         // Entry::next, Port::peer, Port::peer_port: none
  NO_LINK = 0xFFFFFFFFu,     // Port::out_link / in_link: none
  PORT_LOCAL = 0xFEu,        // Entry::port when the packet is at its destination: deliver here
  PORT_NONE = 0xFFu,         // Entry::port when the destination is unreachable
  MAX_VCS = 16u              // virtual channels fit the routed header's 4-bit field
};

// Port::kind: how packets cross the link behind a port (docs/routing.md, "Nodes").
enum : unsigned char {
  LINK_MAPPED = 0u,  // the peer's memory is mapped: store packets into its ring, as on every link
  LINK_NETWORK = 1u  // the link joins two nodes: hand packets to this gateway's relay (its out ring; a
                     // transport carries them into the peer gateway's in ring)
};

// table[rank][dst]: where a packet at `rank` bound for `dst` goes next. 4 bytes: one 32-bit load.
struct alignas(4) Entry {
  unsigned short next;  // the next rank (rank itself when dst == rank)
  unsigned char port;   // out port at this rank (PORT_LOCAL, PORT_NONE)
  unsigned char vc;     // virtual channel of the hop leaving by `port`
};

// ports[rank][p]: the neighbour behind port p. Input buffers are indexed (port, vc) in every rank's
// symmetric allocation, so a hop out of port p on VC v writes the peer's buffer (peer_port, v).
struct Port {
  unsigned int out_link;     // link id rank -> peer (NO_LINK: none, e.g. a one-way link the other way)
  unsigned int in_link;      // link id peer -> rank
  unsigned short peer;       // the neighbour's rank (NO_RANK: the port is unused)
  unsigned short peer_port;  // the port at the peer that faces this rank
  unsigned char kind;        // LINK_MAPPED or LINK_NETWORK (appended: the fields above keep their offsets)
};

// What a kernel receives by value: this rank's row of the table and its ports, in device memory.
struct Table {
  const Entry* entries;  // nranks entries: entries[dst]
  const Port* ports;     // nports entries
  unsigned int rank;
  unsigned int nranks;
  unsigned int nports;
  unsigned int vcs;
};

}  // namespace route
}  // namespace circuslink
