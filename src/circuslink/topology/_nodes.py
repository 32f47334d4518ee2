"""Topologies of nodes: ranks grouped into nodes, mapped links inside a node, network links between nodes.

A job that outgrows one machine keeps its channel code: inside a node ranks map each other's memory (the
links of an *inner* topology: ``full`` for one NVSwitch machine, a ring, a torus, or a file's own links);
between nodes a packet goes from its source to a **gateway** rank of its node, over a **transport** between
nodes (nvshmem or mpi: ``circuslink.transport``) to a gateway of the destination node, and on to its
destination. This is the route of the PCIe + optical FPGA router (FPGA1 -PCIe-> FPGA2 -optical-> FPGA3,
forwarding at the gateway) and of NCCL's PXN (NVLink to the GPU next to the right NIC, then the network);
see docs/scale.md.

Forms:

* ``nodes:NxK``: N nodes of K ranks, every rank of a node linked to every other (``full:K`` inside);
  node i holds ranks iK .. iK+K-1;
* ``nodes:Nx(INNER)``: the same with any kind:dims topology inside each node (``nodes:2x(ring:4)``);
* a suffix ``,gw=G`` picks the gateway: local rank G of every node (default 0), or ``gw=spread``: packets
  from node A to node B leave from A's local rank ``B mod K`` (rail-aligned, as PXN spreads node pairs over
  the GPUs next to each NIC);
* :func:`nodes` in Python also takes the job's node lists (``world.nodes``) and per-node gateways;
* a file whose ranks each name their ``node``: mapped links inside nodes, ``kind=network`` links between
  them; the network links' ends are the gateways.

One network link joins the gateways of each pair of nodes, both ways; every route between nodes takes
exactly one network hop. Routing tables are indexed ``(rank, dst)`` like every other topology:

* same node: the inner topology's own route;
* other node: the inner route to this node's gateway toward the destination's node, then the network link,
  then the inner route from the landing gateway.

Virtual channels: the inner topology's VCs, times one or two **classes**. With two classes, hops of
packets inside their destination's node use the upper class and hops toward a gateway the lower one (the
network hop uses VC 0); a packet never goes from the upper class back to the lower one, so with the inner
topology's own VCs deadlock-free, the whole is: inner hops toward a gateway -> network -> inner hops inside
the destination node, a chain without a cycle. One class suffices when nodes are all-to-all inside and each
node has one gateway (a link into the gateway then only leads out of the node, a link out of it only
delivers); with spread gateways a link between two gateways carries both kinds of hop, and one class has a
cycle (``route check nodes:4x4,gw=spread --vcs 1`` prints it). ``route check`` proves either way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ._model import (
    MAX_RANKS,
    NETWORK_KIND,
    Link,
    Topology,
    TopologyError,
    _span,
    full,
    parse_spec_string,
)

_NODES_RE = re.compile(r"^nodes:\s*([0-9]+)\s*x\s*(?:([0-9]+)|\((.*)\))\s*(?:,\s*gw\s*=\s*([A-Za-z0-9_]+)\s*)?$",
                       re.IGNORECASE)
_EXAMPLE = "nodes:2x4, nodes:2x(ring:4) or nodes:8x8,gw=spread"


@dataclass
class NodeInfo:
    """What a topology of nodes adds to its links: which ranks form each node, the topology inside each node
    (over local ranks 0..k-1, mapped links only) and, for every ordered pair of nodes, the network hop."""

    ranks: list[list[int]]  # node -> its ranks, ascending
    names: list[str]
    inner: list[Topology]  # node -> its inner topology over local ranks
    hop: list[list[tuple[int, int]]]  # hop[A][B] = (gateway rank in A, landing rank in B); (-1, -1) when A == B
    gateway_rule: str  # how gateways were chosen, for messages
    node_of: list[int] = field(default_factory=list)  # rank -> node

    def __post_init__(self) -> None:
        if not self.node_of:
            size = sum(len(r) for r in self.ranks)
            self.node_of = [0] * size
            for i, ranks in enumerate(self.ranks):
                for r in ranks:
                    self.node_of[r] = i

    @property
    def all_to_all(self) -> bool:
        """Every node's inner topology links every ordered pair of its ranks."""
        return all(len(t.links) == t.size * (t.size - 1) for t in self.inner)

    @property
    def one_gateway_per_node(self) -> bool:
        """Every node sends all its traffic out through one rank, and receives it on that rank."""
        n = len(self.ranks)
        return all(len({self.hop[a][b][0] for b in range(n) if b != a} | {self.hop[b][a][1] for b in range(n)
                                                                            if b != a}) <= 1 for a in range(n))

    def inner_label(self) -> str:
        names = {t.name for t in self.inner}
        return names.pop() if len(names) == 1 else "each node's own links"

    def describe(self) -> str:
        """``2 nodes of 4 ranks (full:4 inside); gateways rank 0 of each node: node 0 = ranks 0-3 (gateway 0), ...``."""
        sizes = {len(r) for r in self.ranks}
        shape = f"{len(self.ranks)} node{'s' * (len(self.ranks) != 1)}" + (
            f" of {len(self.ranks[0])} ranks" if len(sizes) == 1 else "")
        parts = []
        for i, ranks in enumerate(self.ranks):
            gws = sorted({self.hop[i][j][0] for j in range(len(self.ranks)) if j != i})
            label = f"node {i}" if self.names[i] == f"node{i}" else f"node {i} ({self.names[i]})"
            gw = f" (gateway{'s' * (len(gws) != 1)} {', '.join(map(str, gws))})" if gws else ""
            parts.append(f"{label} = ranks {_span(ranks)}{gw}")
        return f"{shape} ({self.inner_label()} inside; gateways: {self.gateway_rule}): " + ", ".join(parts)


# ---- constructors -------------------------------------------------------------------------------

def nodes(layout: int | Sequence[Sequence[int]], inner: int | str | Topology | None = None, *,
          gateway: int | str | Sequence[int] = 0, name: str | None = None, transport: str | None = None) -> Topology:
    """A topology of nodes joined through gateways.

    ``layout``: a node count N (with ``inner`` giving the nodes' size or topology; node i holds ranks
    iK..iK+K-1), or the nodes' rank lists (e.g. ``world.nodes``; every rank 0..n-1 exactly once).
    ``inner``: K (every rank of a node linked to every other, ``full:K``), a kind:dims string or a
    :class:`Topology` of the node's size; None with rank lists: ``full`` of each node's size.
    ``gateway``: the local rank every node's traffic leaves from (default 0), ``"spread"`` (node A reaches
    node B from its local rank ``B mod K``) or one local rank per node. ``transport``: the transport every network
    link names (None: the registry chooses one by capability when channels open).
    """
    if transport is not None:
        from ..transport import names as transports

        if transport not in transports():
            raise TopologyError(f"nodes: unknown transport {transport!r} (choose one of {', '.join(transports())})")
    if isinstance(layout, bool):
        raise TopologyError(f"nodes: a node count or the nodes' rank lists, not {layout!r}")
    if isinstance(layout, int | np.integer):
        count = int(layout)
        if count < 1:
            raise TopologyError(f"nodes: a topology of nodes needs at least 1 node, got {count}")
        if inner is None:
            raise TopologyError("nodes: give the ranks per node or the topology inside a node (nodes(2, 4), "
                                "nodes(2, 'ring:4'))")
        proto = _inner_topology(inner, None)
        k = proto.size
        if count * k > MAX_RANKS:
            raise TopologyError(f"nodes:{count}x{k} has {count * k} ranks; circuslink routes at most {MAX_RANKS}")
        lists = [list(range(i * k, (i + 1) * k)) for i in range(count)]
        inners = [proto] * count
        auto = f"nodes:{count}x{k}" if proto.kind == "full" else f"nodes:{count}x({proto.name})"
    else:
        lists = _check_lists(layout)
        if inner is None:
            inners = [full(len(r)) for r in lists]
        else:
            proto = _inner_topology(inner, None)
            for i, ranks in enumerate(lists):
                if len(ranks) != proto.size:
                    raise TopologyError(f"nodes: node {i} has {len(ranks)} ranks but the topology inside nodes, "
                                        f"{proto.name}, has {proto.size}")
            inners = [proto] * len(lists)
        equal = len({len(r) for r in lists}) == 1
        blocks = equal and all(r == list(range(i * len(r), (i + 1) * len(r))) for i, r in enumerate(lists))
        if blocks and (inner is None or isinstance(inner, int)):
            auto = f"nodes:{len(lists)}x{len(lists[0])}"
        elif blocks:
            auto = f"nodes:{len(lists)}x({inners[0].name})"
        else:
            auto = "nodes:" + "|".join(_span(r) for r in lists)
    hop, rule, suffix = _gateways(lists, gateway, name or auto)
    over = f" over {transport}" if transport is not None else ""
    return _assemble(lists, [f"node{i}" for i in range(len(lists))], inners, hop, rule,
                     (name or (auto + suffix)) + over, transport)


def parse_nodes(text: str) -> Topology:
    """``nodes:NxK``, ``nodes:Nx(INNER)`` with an optional ``,gw=G`` / ``,gw=spread``."""
    m = _NODES_RE.match(text)
    if not m:
        raise TopologyError(f"malformed topology {text!r}: expected nodes:NxK or nodes:Nx(INNER) with an optional "
                            f",gw=G or ,gw=spread, e.g. {_EXAMPLE}")
    count_text, k_text, inner_text, gw_text = m.groups()
    if len(count_text) > 6 or (k_text and len(k_text) > 6):
        raise TopologyError(f"{text}: too many ranks; circuslink routes at most {MAX_RANKS}")
    count = int(count_text)
    if count < 1:
        raise TopologyError(f"{text}: a topology of nodes needs at least 1 node, got {count}")
    if k_text is not None:
        k = int(k_text)
        if k < 1:
            raise TopologyError(f"{text}: a node needs at least 1 rank, got {k}")
        inner: int | Topology = k
    else:
        if not inner_text.strip():
            raise TopologyError(f"malformed topology {text!r}: empty topology inside the parentheses, e.g. {_EXAMPLE}")
        inner = _inner_topology(inner_text.strip(), text)
    gateway: int | str = 0
    if gw_text is not None:
        gateway = "spread" if gw_text.lower() == "spread" else _gw_int(gw_text, text)
    size = count * (inner if isinstance(inner, int) else inner.size)
    if size > MAX_RANKS:
        raise TopologyError(f"{text} has {size} ranks; circuslink routes at most {MAX_RANKS} ranks")
    return nodes(count, inner, gateway=gateway, name=text)


def _gw_int(text: str, where: str) -> int:
    if not text.isdigit():
        raise TopologyError(f"{where}: gw={text!r}: a gateway is a local rank (gw=0) or gw=spread")
    return int(text)


def _inner_topology(inner: int | str | Topology, where: str | None) -> Topology:
    if isinstance(inner, bool):
        raise TopologyError(f"nodes: the topology inside a node is a size, a string or a Topology, not {inner!r}")
    if isinstance(inner, int | np.integer):
        if inner < 1:
            raise TopologyError(f"nodes: a node needs at least 1 rank, got {inner}")
        return full(int(inner))
    if isinstance(inner, str):
        try:
            topo = parse_spec_string(inner)
        except TopologyError as exc:
            raise TopologyError(f"{where or 'nodes'}: inside a node: {exc}") from None
    elif isinstance(inner, Topology):
        topo = inner
    else:
        raise TopologyError(f"nodes: the topology inside a node is a size, a string or a Topology, not "
                            f"{type(inner).__name__}")
    if topo.has_nodes:
        raise TopologyError(f"{where or 'nodes'}: a topology of nodes ({topo.name}) cannot sit inside a node")
    if any(k.network for k in topo.links):
        raise TopologyError(f"{where or 'nodes'}: {topo.name} has network links; inside a node links are mapped")
    return topo


def _check_lists(layout: Sequence[Sequence[int]]) -> list[list[int]]:
    try:
        lists = [sorted(int(r) for r in ranks) for ranks in layout]
    except (TypeError, ValueError):
        raise TopologyError("nodes: the layout is a node count or a list of rank lists (e.g. world.nodes)") from None
    if not lists:
        raise TopologyError("nodes: no nodes")
    seen: dict[int, int] = {}
    for i, ranks in enumerate(lists):
        if not ranks:
            raise TopologyError(f"nodes: node {i} has no ranks")
        for r in ranks:
            if r in seen:
                raise TopologyError(f"nodes: rank {r} is in two nodes (node {seen[r]} and node {i})")
            seen[r] = i
    size = len(seen)
    if size > MAX_RANKS:
        raise TopologyError(f"nodes: {size} ranks; circuslink routes at most {MAX_RANKS} ranks")
    missing = sorted(set(range(size)) - set(seen))
    if missing:
        raise TopologyError(f"nodes: rank {missing[0]} is in no node (the nodes hold {size} ranks: every rank "
                            f"0..{size - 1} belongs to exactly one)")
    return lists


def _gateways(lists: list[list[int]], gateway: int | str | Sequence[int],
              name: str) -> tuple[list[list[tuple[int, int]]], str, str]:
    """(hop[A][B], the rule in words, the name suffix) for a gateway choice."""
    n = len(lists)
    if isinstance(gateway, str):
        if gateway.lower() != "spread":
            raise TopologyError(f"{name}: gateway {gateway!r}: a local rank (0), one per node, or 'spread'")

        def local(a: int, b: int) -> int:
            return b % len(lists[a])

        rule, suffix = "node A reaches node B from its local rank B mod K (spread)", ",gw=spread"
    else:
        if isinstance(gateway, bool):
            raise TopologyError(f"{name}: gateway {gateway!r}: a local rank (0), one per node, or 'spread'")
        per_node = [gateway] * n if isinstance(gateway, int | np.integer) else list(gateway)
        if len(per_node) != n:
            raise TopologyError(f"{name}: {len(per_node)} gateways for {n} nodes: give one local rank per node")
        for i, g in enumerate(per_node):
            if isinstance(g, bool) or not isinstance(g, int | np.integer):
                raise TopologyError(f"{name}: the gateway of node {i} must be a local rank, got {g!r}")
            if not 0 <= g < len(lists[i]):
                raise TopologyError(f"{name}: node {i} has no local rank {g} for its gateway (it has "
                                    f"{len(lists[i])} ranks: 0..{len(lists[i]) - 1})")

        def local(a: int, b: int) -> int:
            return int(per_node[a])

        if len(set(per_node)) == 1:
            g = int(per_node[0])
            rule = f"local rank {g} of each node"
            suffix = f",gw={g}" if g else ""
        else:
            rule = "per node: " + ", ".join(f"node {i}: local rank {g}" for i, g in enumerate(per_node))
            suffix = ""
    hop = [[(-1, -1) if a == b else (lists[a][local(a, b)], lists[b][local(b, a)]) for b in range(n)]
           for a in range(n)]
    return hop, rule, suffix


def _assemble(lists: list[list[int]], names: list[str], inners: list[Topology], hop: list[list[tuple[int, int]]],
              rule: str, name: str, transport: str | None = None) -> Topology:
    """The topology: inner links node by node, one network link each way per pair of nodes, ports numbered by
    neighbour rank (as on graphs)."""
    size = sum(len(r) for r in lists)
    pairs: dict[tuple[int, int], tuple[str, float]] = {}
    for ranks, inner in zip(lists, inners, strict=True):
        for k in inner.links:
            pairs[(ranks[k.src], ranks[k.dst])] = (k.kind, k.weight)
    for a in range(len(lists)):
        for b in range(len(lists)):
            if a != b:
                src, dst = hop[a][b]
                pairs[(src, dst)] = (NETWORK_KIND, 1.0)
                pairs[(dst, src)] = (NETWORK_KIND, 1.0)  # every network link both ways
    neighbours: list[set[int]] = [set() for _ in range(size)]
    for src, dst in pairs:
        neighbours[src].add(dst)
        neighbours[dst].add(src)
    port_of = [{nb: p for p, nb in enumerate(sorted(nbs))} for nbs in neighbours]
    links = [Link(i, src, dst, port_of[src][dst], kind=kind, weight=weight,
                  transport=transport if kind == NETWORK_KIND else None)
             for i, ((src, dst), (kind, weight)) in enumerate(sorted(pairs.items()))]
    info = NodeInfo([list(r) for r in lists], names, list(inners), hop, rule)
    return Topology("nodes", [str(r) for r in range(size)], links, name=name, node_info=info)


def from_file_nodes(topology: Topology, node_names: list[str], where: str) -> Topology:
    """A file's graph whose ranks each name their node (links already checked: mapped inside nodes, network
    between them) as a topology of nodes. Every pair of nodes must be joined by an network link; the lowest
    ``(a, b)`` network link from node A to node B carries A's traffic to B."""
    order: list[str] = []
    for g in node_names:
        if g not in order:
            order.append(g)  # nodes numbered by their lowest rank
    index = {g: i for i, g in enumerate(order)}
    lists: list[list[int]] = [[] for _ in order]
    for r, g in enumerate(node_names):
        lists[index[g]].append(r)
    local = [{r: i for i, r in enumerate(ranks)} for ranks in lists]
    inners = []
    for i, ranks in enumerate(lists):
        inside = [(local[i][k.src], local[i][k.dst], k.kind, k.weight) for k in topology.links
                  if not k.network and k.src in local[i] and k.dst in local[i]]
        inners.append(_inner_graph(len(ranks), inside, f"{where}: node {order[i]}", topology.directed))
    n = len(lists)
    hop: list[list[tuple[int, int]]] = [[(-1, -1)] * n for _ in range(n)]
    node_of = {r: i for i, ranks in enumerate(lists) for r in ranks}
    for k in sorted((k for k in topology.links if k.network), key=lambda k: (k.src, k.dst)):
        a, b = node_of[k.src], node_of[k.dst]
        if hop[a][b] == (-1, -1):
            hop[a][b] = (k.src, k.dst)
    for a in range(n):
        for b in range(n):
            if a != b and hop[a][b] == (-1, -1):
                raise TopologyError(f"{where}: node {order[a]} has no gateway to node {order[b]}: no network link "
                                    f"from a rank of {order[a]} to a rank of {order[b]} (a route between nodes "
                                    "takes one network hop between their gateways: add a link with kind=network)")
    info = NodeInfo(lists, order, inners, hop, "the ends of the network links")
    return Topology("nodes", topology.names, topology.links, name=topology.name, directed=topology.directed,
                    node_info=info)


def _inner_graph(size: int, links: list[tuple[int, int, str, float]], name: str, directed: bool) -> Topology:
    neighbours: list[set[int]] = [set() for _ in range(size)]
    for src, dst, _, _ in links:
        neighbours[src].add(dst)
        neighbours[dst].add(src)
    port_of = [{nb: p for p, nb in enumerate(sorted(nbs))} for nbs in neighbours]
    out = [Link(i, src, dst, port_of[src][dst], kind=kind, weight=weight)
           for i, (src, dst, kind, weight) in enumerate(sorted(links))]
    return Topology("graph", [str(r) for r in range(size)], out, name=name, directed=directed)
