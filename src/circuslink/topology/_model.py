"""Topologies as data: ranks, directed links with ports and kinds, and their constructors.

A :class:`Topology` is plain data. Built-in kinds are grids: ``line:N`` and ``mesh:XxY`` (no wrap-around),
``ring:N`` and ``torus:XxY`` (wrap-around in every dimension of 3 or more ranks); ``full:N`` (every rank
linked to every other); and ``nodes:NxK`` / ``nodes:Nx(INNER)`` (ranks grouped into nodes, joined between
nodes by network links through gateway ranks: :mod:`circuslink.topology._nodes`). Custom graphs come from
:func:`graph` (Python) or a file (:mod:`circuslink.topology._files`). Routing lives in ``_routing``.

Every link has a kind: the word ``network`` marks a link between nodes that a transport carries (docs/scale.md:
nvshmem or mpi, chosen by capability, or the one the link names in its ``transport``); every
other word (``direct``, the default; ``mapped``, ``nvlink``, ``pcie``... as labels) is a link through
mapped memory. Ports carry the code (:data:`LINK_MAPPED`, :data:`LINK_NETWORK`) for the device.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError

KINDS = ("ring", "line", "mesh", "torus")  # the grids (spec files name them as kind="..." dims="...")
STRING_KINDS = (*KINDS, "full", "nodes")  # every kind:dims string
MAX_RANKS = 1024  # the host computes full ranks x ranks tables; the header's dst_rank field has 16 bits
MAX_LINKS = 1 << 16
DEFAULT_LINK_KIND = "direct"
NETWORK_KIND = "network"  # the link kind between nodes, carried by a transport (circuslink.transport)
LINK_MAPPED = 0  # Port.kind: the peer's memory is mapped (loads and stores)
LINK_NETWORK = 1  # Port.kind: packets cross into the gateway's relay, which a transport carries to the peer's
LINK_KIND_NAMES = {LINK_MAPPED: "mapped", LINK_NETWORK: NETWORK_KIND}
DIM_NAMES = "xyzw"
_SPEC_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*:(.*)$")
_DIMS_RE = re.compile(r"^[0-9]+(x[0-9]+)*$")


class TopologyError(ConfigError):
    """A topology, a routing request or a virtual-channel count is invalid; the message names what."""


@dataclass(frozen=True)
class Link:
    """One directed physical link ``src -> dst`` leaving ``src`` through ``port``.

    ``id`` indexes :attr:`Topology.links`. A bidirectional connection is two links. On grids ``dim`` is
    the dimension (0 = x), ``sign`` the direction (+1 or -1) and ``dateline`` marks the wrap-around link
    of a ring (the one from the last coordinate to 0 going +, from 0 to the last going -). ``transport``: the
    transport a network link names (a file's ``transport=mpi``), None where the registry chooses one.
    """

    id: int
    src: int
    dst: int
    port: int
    kind: str = DEFAULT_LINK_KIND
    weight: float = 1.0
    dim: int = -1
    sign: int = 0
    dateline: bool = False
    transport: str | None = None

    @property
    def network(self) -> bool:
        """True when a transport between nodes carries this link: it joins two nodes and maps no memory."""
        return self.kind == NETWORK_KIND

    @property
    def kind_code(self) -> int:
        """:data:`LINK_NETWORK` or :data:`LINK_MAPPED` (what the device's port table holds)."""
        return LINK_NETWORK if self.network else LINK_MAPPED


class Port(NamedTuple):
    """One port of a rank: the neighbour behind it, the link ids each way (-1: none) and the links' kind
    (:data:`LINK_MAPPED` or :data:`LINK_NETWORK`)."""

    peer: int
    out_link: int
    in_link: int
    peer_port: int
    kind: int = LINK_MAPPED


class Topology:
    """Ranks ``0..size-1`` joined by directed links. Build one with :func:`parse`, :func:`ring`,
    :func:`line`, :func:`mesh`, :func:`torus`, :func:`graph` or :func:`load`."""

    def __init__(self, kind: str, names: Sequence[str], links: Sequence[Link], *, name: str,
                 dims: tuple[int, ...] = (), directed: bool = False,
                 groups: Sequence[str | None] | None = None, node_info: Any = None) -> None:
        self.kind = kind
        self.name = name
        self.dims = tuple(dims)
        self.directed = directed
        self.names = list(names)
        self.links = list(links)
        self.node_info = node_info  # _nodes.NodeInfo for kind "nodes": ranks per node, inner topologies, hops
        if node_info is not None:
            groups = [node_info.names[node_info.node_of[r]] for r in range(len(self.names))]
        self._groups = list(groups) if groups is not None else [None] * len(self.names)
        self._rank_by_name = {n: r for r, n in enumerate(self.names)}
        self._out: list[list[Link]] = [[] for _ in self.names]
        self._in: list[list[Link]] = [[] for _ in self.names]
        for link in self.links:
            self._out[link.src].append(link)
            self._in[link.dst].append(link)
        for out in self._out:
            out.sort(key=lambda k: k.port)
        self._routings: dict[int, Any] = {}

    # ---- shape ------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The number of ranks."""
        return len(self.names)

    @property
    def is_grid(self) -> bool:
        return self.kind in KINDS

    @property
    def nports(self) -> int:
        """Ports per rank: 2 per dimension on grids (+x, -x, +y, -y, ...), the most neighbours of a rank else."""
        if self.is_grid:
            return 2 * len(self.dims)
        return max((len(ports) for ports in self.ports), default=0)

    @cached_property
    def ports(self) -> list[list[Port]]:
        """``ports[rank][p]``: the neighbour behind port p, the links out of and into it, and the port at the
        neighbour that faces back (-1 where absent). A port is one neighbour: on grids a direction, on graphs
        the neighbours (linked to or from the rank) in rank order. The device's port table holds the same."""
        out: list[list[Port]] = []
        peers_of = [self.neighbours(r) for r in range(self.size)]
        port_at = [{peer: p for p, peer in enumerate(peers)} for peers in peers_of]
        for rank in range(self.size):
            if self.is_grid:
                ports = [Port(-1, -1, -1, -1) for _ in range(2 * len(self.dims))]
                for k in self._out[rank]:
                    back = next(i for i in self._in[rank] if i.src == k.dst and i.port == k.port ^ 1)
                    ports[k.port] = Port(k.dst, k.id, back.id, k.port ^ 1)
            else:
                out_to = {k.dst: k for k in self._out[rank]}
                in_from = {k.src: k for k in self._in[rank]}
                ports = []
                for peer in peers_of[rank]:
                    fwd, back = out_to.get(peer), in_from.get(peer)
                    ports.append(Port(peer, fwd.id if fwd else -1, back.id if back else -1, port_at[peer][rank],
                                      (fwd or back).kind_code))
            out.append(ports)
        return out

    @cached_property
    def weighted(self) -> bool:
        return any(link.weight != 1 for link in self.links)

    @cached_property
    def has_datelines(self) -> bool:
        """True when some ring of the topology wraps around (a torus dimension of 3 or more ranks)."""
        return any(link.dateline for link in self.links)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, {self.size} ranks, {len(self.links)} links)"

    def describe(self) -> str:
        """One line: name, ranks, links and kinds (and, with nodes, the nodes and their gateways)."""
        kinds = sorted({link.kind for link in self.links})
        pairs = len(self.links) if self.directed else len({frozenset((k.src, k.dst)) for k in self.links})
        what = "directed links" if self.directed else "bidirectional links"
        kind_text = f" ({', '.join(kinds)})" if kinds and kinds != [DEFAULT_LINK_KIND] else ""
        text = f"{self.name}: {self.size} ranks, {pairs} {what}{kind_text}"
        if self.node_info is not None:
            text += "; " + self.node_info.describe()
        return text

    # ---- ranks and names --------------------------------------------------------------------------

    def check_rank(self, rank: int, what: str = "rank") -> int:
        """``rank`` as an int, or :class:`TopologyError` when it is not a rank of this topology."""
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
            raise TopologyError(f"{self.name}: {what} {rank!r} is not an integer rank")
        if not 0 <= rank < self.size:
            raise TopologyError(f"{self.name}: {what} {rank} is outside 0..{self.size - 1} ({self.size} ranks)")
        return int(rank)

    def check_nranks(self, nranks: int) -> None:
        """Raise :class:`TopologyError` unless the job's rank count equals the topology's size."""
        if nranks != self.size:
            raise TopologyError(f"topology {self.name} has {self.size} ranks, but the job has {nranks}: "
                                f"a topology names every rank (run with -n {self.size})")

    def rank_of(self, node: str | int) -> int:
        """The rank of a node, by name (a file's node name; built-in kinds name ranks by number) or rank."""
        key = str(node).strip()
        if key in self._rank_by_name:
            return self._rank_by_name[key]
        if re.fullmatch(r"[0-9]+", key):
            return self.check_rank(int(key))
        shown = ", ".join(self.names[:8]) + (", ..." if self.size > 8 else "")
        raise TopologyError(f"{self.name}: no node {key!r} (nodes: {shown})")

    def label(self, rank: int) -> str:
        """How messages name a rank: its number, and its node name when that differs."""
        name = self.names[rank]
        return str(rank) if name == str(rank) else f"{rank} ({name})"

    def coords(self, rank: int) -> tuple[int, ...]:
        """Grid coordinates of ``rank`` (x varies fastest: rank = x + X * y); ``()`` on graphs."""
        self.check_rank(rank)
        out, rest = [], rank
        for d in self.dims if self.is_grid else ():
            out.append(rest % d)
            rest //= d
        return tuple(out)

    def group(self, rank: int) -> str | None:
        """The name of the node a rank belongs to (a file's ``"node"``, ``node0``... for ``nodes:``); None
        when the topology has no nodes."""
        return self._groups[self.check_rank(rank)]

    def groups(self) -> dict[str, list[int]]:
        """Node name -> its ranks (empty when the topology has no nodes)."""
        out: dict[str, list[int]] = {}
        for rank, g in enumerate(self._groups):
            if g is not None:
                out.setdefault(g, []).append(rank)
        return out

    # ---- nodes ------------------------------------------------------------------------------------

    @property
    def has_nodes(self) -> bool:
        """True for a topology of nodes (``nodes:...`` or a file giving each rank a ``node``)."""
        return self.node_info is not None

    @property
    def nodes(self) -> list[list[int]]:
        """Every node's ranks, ascending (one node of every rank when the topology has no nodes)."""
        if self.node_info is None:
            return [list(range(self.size))]
        return [list(r) for r in self.node_info.ranks]

    @property
    def node_names(self) -> list[str]:
        return list(self.node_info.names) if self.node_info is not None else ["node0"]

    def node_of(self, rank: int) -> int:
        """The node index of ``rank`` (0 when the topology has no nodes)."""
        rank = self.check_rank(rank)
        return self.node_info.node_of[rank] if self.node_info is not None else 0

    def gateway(self, src_node: int, dst_node: int) -> tuple[int, int]:
        """``(a, b)``: packets from node ``src_node`` to node ``dst_node`` leave from gateway rank ``a`` over
        the network link ``a -> b`` and land on rank ``b`` (a gateway of ``dst_node``)."""
        info = self.node_info
        n = len(info.ranks) if info is not None else 1
        for what, node in (("source node", src_node), ("destination node", dst_node)):
            if isinstance(node, bool) or not isinstance(node, int | np.integer) or not 0 <= node < n:
                raise TopologyError(f"{self.name}: {what} {node!r} is outside 0..{n - 1} ({n} nodes)")
        if src_node == dst_node or info is None:
            raise TopologyError(f"{self.name}: a route inside node {src_node} takes no gateway")
        return info.hop[src_node][dst_node]

    def gateways(self, node: int | None = None) -> list[int]:
        """The gateway ranks (ranks with an network link) of ``node``, or of every node, sorted."""
        ranks = {k.src for k in self.links if k.network} | {k.dst for k in self.links if k.network}
        if node is not None:
            ranks &= set(self.nodes[node])
        return sorted(ranks)

    def check_nodes(self, nodes: Sequence[Sequence[int]], how: str = "") -> None:
        """Raise :class:`TopologyError` unless ``nodes`` (a job's nodes, e.g. ``world.nodes``) group the ranks
        as this topology does (``how`` says where the job's nodes come from, for the message)."""
        self.check_nranks(sum(len(n) for n in nodes))
        mine = [sorted(n) for n in self.nodes]
        theirs = [sorted(int(r) for r in n) for n in nodes]
        if sorted(mine) == sorted(theirs):
            return
        job_of = {r: i for i, n in enumerate(theirs) for r in n}
        for i, ranks in enumerate(mine):
            if sorted(theirs[job_of[ranks[0]]]) != ranks:
                other = theirs[job_of[ranks[0]]]
                raise TopologyError(
                    f"topology {self.name} puts ranks {_span(ranks)} in node {i}, but the job's node of rank "
                    f"{ranks[0]} holds ranks {_span(other)}{f' ({how})' if how else ''}: declare the same nodes "
                    "(circuslink run --ranks-per-node K, CIRCUSLINK_RANKS_PER_NODE=K) or use a topology of the "
                    "job's nodes")

    # ---- links ------------------------------------------------------------------------------------

    def out_links(self, rank: int) -> list[Link]:
        """Links leaving ``rank``, by port."""
        return list(self._out[self.check_rank(rank)])

    def in_links(self, rank: int) -> list[Link]:
        """Links arriving at ``rank``."""
        return list(self._in[self.check_rank(rank)])

    def neighbours(self, rank: int) -> list[int]:
        """Ranks whose memory ``rank`` maps: those it has a link to or from (a sender stores packets into
        the next rank's memory and that rank returns credits into the sender's), sorted."""
        rank = self.check_rank(rank)
        return sorted({k.dst for k in self._out[rank]} | {k.src for k in self._in[rank]})

    def link(self, src: int, dst: int) -> Link:
        """The link ``src -> dst`` (the lowest port when several exist)."""
        for k in self._out[self.check_rank(src)]:
            if k.dst == dst:
                return k
        raise TopologyError(f"{self.name}: no link from rank {self.label(src)} to rank {dst}")

    def port_label(self, rank: int, port: int) -> str:
        """``+x``/``-y`` on grids, ``pN`` elsewhere."""
        if self.is_grid and port >= 0:
            return f"{'+-'[port % 2]}{_dim_name(port // 2)}"
        return f"p{port}"

    def link_label(self, link: Link) -> str:
        """``a->b (+x)`` or ``a->b (nvlink)``: how messages name a link."""
        extra = [self.port_label(link.src, link.port)] if self.is_grid else []
        if link.kind != DEFAULT_LINK_KIND:
            extra.append(link.kind)
        if link.dateline:
            extra.append("dateline")
        return f"{self.names[link.src]}->{self.names[link.dst]}" + (f" ({', '.join(extra)})" if extra else "")

    # ---- reachability and routing -----------------------------------------------------------------

    @cached_property
    def _reach(self) -> np.ndarray:
        """Boolean ``reach[src, dst]``: some path of links leads from src to dst."""
        if self.is_grid:
            return np.ones((self.size, self.size), dtype=bool)  # grids are connected by construction
        if self.node_info is not None:  # routes between nodes take exactly one network hop: follow the tables
            from ._routing import _paths

            return _paths(self).next >= 0
        from ._routing import shortest_distances

        return np.isfinite(shortest_distances(self))

    def reachable(self, src: int, dst: int) -> bool:
        """Whether some path of links leads from ``src`` to ``dst``."""
        return bool(self._reach[self.check_rank(src), self.check_rank(dst, "destination")])

    def unreachable_pair(self) -> tuple[int, int] | None:
        """The first ``(src, dst)`` (in rank order) with no path, or None when strongly connected."""
        bad = np.argwhere(~self._reach)
        return (int(bad[0][0]), int(bad[0][1])) if len(bad) else None

    def check_connected(self) -> None:
        """Raise :class:`TopologyError` naming an unreachable pair unless every rank reaches every rank."""
        pair = self.unreachable_pair()
        if pair is not None:
            src, dst = pair
            raise TopologyError(f"topology {self.name} is not connected: no path from rank {self.label(src)} "
                                f"to rank {self.label(dst)}")

    def routing(self, vcs: int | None = None):
        """The routing tables with ``vcs`` virtual channels (None: the topology's default); cached."""
        from ._routing import Routing, resolve_vcs

        vcs = resolve_vcs(self, vcs)
        if vcs not in self._routings:
            self._routings[vcs] = Routing(self, vcs)
        return self._routings[vcs]

    def route(self, src: int, dst: int, vcs: int | None = None) -> list:
        """The hops from ``src`` to ``dst`` (see :meth:`Routing.route`)."""
        return self.routing(vcs).route(src, dst)


def _span(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _dim_name(d: int) -> str:
    return DIM_NAMES[d] if d < len(DIM_NAMES) else f"d{d}"


# ---- grids ----------------------------------------------------------------------------------------

def _grid(kind: str, dims: Sequence[int], wrap: bool) -> Topology:
    dims = tuple(int(d) for d in dims)
    name = f"{kind}:{'x'.join(map(str, dims))}"
    if not dims:
        raise TopologyError(f"{name}: give at least one dimension")
    for d in dims:
        if d < 1:
            raise TopologyError(f"{name}: every dimension must be at least 1, got {d}")
    size = math.prod(dims)
    if size > MAX_RANKS:
        raise TopologyError(f"{name} has {size} ranks; circuslink routes at most {MAX_RANKS} ranks")
    strides = [math.prod(dims[:k]) for k in range(len(dims))]
    links: list[Link] = []
    for rank in range(size):
        coords = [(rank // strides[k]) % dims[k] for k in range(len(dims))]
        for k, n in enumerate(dims):
            for sign in (+1, -1):
                c = coords[k] + sign
                dateline = False
                if not 0 <= c < n:
                    # a ring of 2 has one link each way (its wrap-around would duplicate it)
                    if not (wrap and n >= 3):
                        continue
                    c %= n
                    dateline = True
                if n < 2:
                    continue
                dst = rank + (c - coords[k]) * strides[k]
                links.append(Link(len(links), rank, dst, 2 * k + (0 if sign > 0 else 1), dim=k, sign=sign,
                                  dateline=dateline))
    return Topology(kind, [str(r) for r in range(size)], links, name=name, dims=dims)


def ring(n: int) -> Topology:
    """``ring:N``: ranks 0..N-1, each linked both ways to its successor mod N."""
    return _grid("ring", (n,), wrap=True)


def line(n: int) -> Topology:
    """``line:N``: ranks 0..N-1 in a row, each linked both ways to the next."""
    return _grid("line", (n,), wrap=False)


def mesh(*dims: int) -> Topology:
    """``mesh:XxY`` (any number of dimensions): rank = x + X * y, links both ways between grid neighbours."""
    return _grid("mesh", dims, wrap=False)


def torus(*dims: int) -> Topology:
    """``torus:XxY``: a mesh whose every dimension of 3 or more ranks also wraps around."""
    return _grid("torus", dims, wrap=True)


def full(n: int) -> Topology:
    """``full:N``: every rank linked both ways to every other (one NVSwitch machine). Ports number a rank's
    neighbours in rank order, as on graphs."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= MAX_RANKS:
        raise TopologyError(f"full:{n}: a full topology has 1..{MAX_RANKS} ranks, got {n!r}")
    n = int(n)
    links = []
    for src in range(n):
        for dst in range(n):
            if dst != src:
                links.append(Link(len(links), src, dst, dst - (dst > src)))
    return Topology("full", [str(r) for r in range(n)], links, name=f"full:{n}")


_BUILDERS = {"ring": ring, "line": line, "mesh": mesh, "torus": torus}
_EXAMPLES = {"ring": "ring:8", "line": "line:4", "mesh": "mesh:4x4", "torus": "torus:4x4", "full": "full:8"}


def parse_spec_string(text: str) -> Topology:
    """A ``kind:dims`` string (``ring:8``, ``line:4``, ``mesh:4x4``, ``torus:4x4``, ``torus:4x4x2``, ``full:8``,
    ``nodes:2x4``, ``nodes:2x(ring:4)``, ``nodes:8x8,gw=spread``)."""
    m = _SPEC_RE.match(text)
    if not m:
        raise TopologyError(f"malformed topology {text!r}: expected ring:N, line:N, mesh:XxY, torus:XxY, full:N, "
                            "nodes:NxK or a file")
    kind, dims_text = m.group(1).lower(), m.group(2).strip().lower()
    if kind == "nodes":
        from ._nodes import parse_nodes

        return parse_nodes(text.strip())
    if kind not in (*KINDS, "full"):
        raise TopologyError(f"unknown topology kind {m.group(1)!r} in {text.strip()!r} (known: "
                            f"{', '.join(STRING_KINDS)}; no file of that name either)")
    one_d = kind in ("ring", "line", "full")
    if not _DIMS_RE.match(dims_text) or (one_d and "x" in dims_text):
        form = f"{kind}:N" if one_d else f"{kind}:XxY"
        raise TopologyError(f"malformed topology {text.strip()!r}: expected {form} with positive integers, "
                            f"e.g. {_EXAMPLES[kind]}")
    dims = [int(d) for d in dims_text.split("x")]
    if any(len(part) > 6 for part in dims_text.split("x")) or math.prod(dims) > MAX_RANKS:
        raise TopologyError(f"{kind}:{dims_text} has {math.prod(dims)} ranks; circuslink routes at most "
                            f"{MAX_RANKS} ranks")
    if kind in ("mesh", "torus") and len(dims) < 2:
        # mesh:4 would be line:4; say so rather than guess
        raise TopologyError(f"malformed topology {text.strip()!r}: expected {kind}:XxY (for one dimension use "
                            f"{'line' if kind == 'mesh' else 'ring'}:{dims[0]})")
    for d in dims:
        if d < 1:
            what = {"ring": "a ring", "line": "a line", "full": "a full topology"}.get(kind, "every dimension")
            raise TopologyError(f"{kind}:{dims_text}: {what} needs at least 1 rank, got {d}")
    if kind == "full":
        return full(dims[0])
    return _BUILDERS[kind](*dims)


def parse(source: str | os.PathLike | Topology, base_dir: str | os.PathLike | None = None) -> Topology:
    """A topology from a ``kind:dims`` string or a file path (JSON or edge list; see docs/routing.md).

    An existing file wins over the string form; a relative path is looked up under ``base_dir`` when given.
    Raises :class:`TopologyError` with one line naming the problem.
    """
    from ._files import load

    if isinstance(source, Topology):
        return source
    if isinstance(source, os.PathLike):
        return load(_resolve(os.fspath(source), base_dir))
    if not isinstance(source, str):
        raise TopologyError(f"a topology is a string such as torus:4x4 or a file path, not {type(source).__name__}")
    text = source.strip()
    if not text:
        raise TopologyError("empty topology: expected ring:N, line:N, mesh:XxY, torus:XxY or a file")
    if "\0" in text:
        raise TopologyError(f"a topology string or file name holds a NUL character: {text[:40]!r}")
    path = _resolve(text, base_dir)
    if os.path.exists(path):
        return load(path)
    if _SPEC_RE.match(text):  # "word:..." that is no file: a kind:dims string (its errors say so)
        return parse_spec_string(text)
    return load(path)  # reports the missing file


def _resolve(path: str, base_dir: str | os.PathLike | None) -> str:
    if base_dir is None or os.path.isabs(path):
        return path
    return os.path.join(os.fspath(base_dir), path)


# ---- custom graphs --------------------------------------------------------------------------------

def graph(nodes: Iterable[Any] | int, links: Iterable[Any], *, directed: bool = False,
          name: str = "graph", groups: Sequence[str | None] | None = None) -> Topology:
    """A custom topology: ``nodes`` (names, ranks in order; or a count N for ranks 0..N-1) and ``links``
    (``(a, b)`` pairs or dicts ``{"a", "b", "kind", "weight"}``), bidirectional unless ``directed``.

    Ports on each rank number its out-links by destination rank. Raises :class:`TopologyError` for an
    unknown node, a self-loop, a duplicate link, a bad weight or kind.
    """
    from ._files import build_graph

    return build_graph(nodes, links, directed=directed, name=name, groups=groups, where=name)
