"""Topologies, routing tables, virtual channels and the deadlock check (docs/routing.md).

    from circuslink import topology
    t = topology.parse("torus:4x4")           # or ring:8, line:4, mesh:4x4, full:8, a JSON or edge-list file
    n = topology.parse("nodes:2x4")           # 2 nodes of 4 (all-to-all inside), network links between gateways
    n.nodes, n.gateway(0, 1)                  # [[0, 1, 2, 3], [4, 5, 6, 7]], (0, 4)
    topology.nodes(world.nodes, "ring:2")     # the job's own nodes (world.nodes), a ring inside each
    t.neighbours(5)                           # the ranks whose memory rank 5 maps
    r = t.routing()                           # dimension order, 2 dateline virtual channels on tori
    r.entry(0, 10)                            # Entry(next=1, port=0, vc=0): table[rank][dst]
    [(h.src, h.dst, h.vc) for h in r.route(0, 10)]
    topology.check(r).acyclic                 # the channel dependency graph has no cycle
    topology.simulate(t, 2, [(0, 10, 4)], buffer_slots=2).delivered

Pure host-side data: nothing here allocates memory or talks to other ranks.
"""

from __future__ import annotations

from ._deadlock import CheckResult, dependencies, find_cycle
from ._deadlock import check as _check
from ._files import from_edge_list, from_json
from ._files import load as load
from ._model import (
    KINDS,
    LINK_KIND_NAMES,
    LINK_MAPPED,
    LINK_NETWORK,
    MAX_RANKS,
    NETWORK_KIND,
    STRING_KINDS,
    Link,
    Port,
    Topology,
    TopologyError,
    full,
    graph,
    line,
    mesh,
    parse,
    parse_spec_string,
    ring,
    torus,
)
from ._nodes import NodeInfo, nodes
from ._routing import (
    ENTRY,
    MAX_VCS,
    NO_LINK,
    NO_RANK,
    PORT,
    PORT_LOCAL,
    PORT_NONE,
    TABLE,
    Entry,
    Hop,
    Routing,
    vc_range,
)
from ._simulate import SimResult, simulate


def routing(topology: Topology | str, vcs: int | None = None) -> Routing:
    """The routing tables of ``topology`` (a Topology, a ``kind:dims`` string or a file) with ``vcs``
    virtual channels (None: 2 with datelines on rings and tori, else 1)."""
    return parse(topology).routing(vcs)


def check(topology: Topology | str | Routing, vcs: int | None = None) -> CheckResult:
    """Build the channel dependency graph of the routes and look for a cycle (see :class:`CheckResult`)."""
    r = topology if isinstance(topology, Routing) else routing(topology, vcs)
    return _check(r)


__all__ = [
    "NETWORK_KIND",
    "ENTRY",
    "KINDS",
    "LINK_NETWORK",
    "LINK_KIND_NAMES",
    "LINK_MAPPED",
    "MAX_RANKS",
    "MAX_VCS",
    "NO_LINK",
    "NO_RANK",
    "PORT",
    "PORT_LOCAL",
    "PORT_NONE",
    "STRING_KINDS",
    "TABLE",
    "CheckResult",
    "Entry",
    "Hop",
    "Link",
    "NodeInfo",
    "Port",
    "Routing",
    "SimResult",
    "Topology",
    "TopologyError",
    "check",
    "dependencies",
    "find_cycle",
    "from_edge_list",
    "from_json",
    "full",
    "graph",
    "line",
    "load",
    "mesh",
    "nodes",
    "parse",
    "parse_spec_string",
    "ring",
    "routing",
    "simulate",
    "torus",
    "vc_range",
]
