"""Routing tables computed on the host: dimension-order routing on grids, shortest paths on graphs, and
the virtual channel of every hop.

Every table is indexed ``[rank, dst]``: the rank a packet is at and the rank it goes to. The virtual channel
is a function of those two alone (see docs/routing.md, "Virtual channels"), so a forwarding agent needs only
the destination from a packet's header and one table load to forward it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._abi import PTR, U8, U16, U32, Struct
from ._model import LINK_KIND_NAMES, Link, Topology, TopologyError, _dim_name

MAX_VCS = 16  # 4 bits of the routed header (docs/routing.md, "Header")
NO_RANK = 0xFFFF  # Entry.next / Port.peer: none
NO_LINK = 0xFFFFFFFF  # Port.out_link / in_link: none
PORT_LOCAL = 0xFE  # Entry.port when dst is this rank: deliver here
PORT_NONE = 0xFF  # Entry.port when dst is unreachable

_HEADER = "circuslink/detail/route_types.cuh"
ENTRY = Struct("circuslink::route::Entry", _HEADER, [("next", U16), ("port", U8), ("vc", U8)], align=4)
PORT = Struct("circuslink::route::Port", _HEADER,
              [("out_link", U32), ("in_link", U32), ("peer", U16), ("peer_port", U16), ("kind", U8)])
TABLE = Struct("circuslink::route::Table", _HEADER,
               [("entries", PTR), ("ports", PTR), ("rank", U32), ("nranks", U32), ("nports", U32), ("vcs", U32)])


class Entry(NamedTuple):
    """``table[rank][dst]``: where a packet at ``rank`` for ``dst`` goes next (next is rank itself and port
    -1 when dst == rank; next -1 when dst is unreachable)."""

    next: int
    port: int
    vc: int


class Hop(NamedTuple):
    """One hop of a route: ``src -> dst`` over ``link`` (leaving ``src`` by ``port``) on virtual channel ``vc``."""

    src: int
    dst: int
    link: Link
    port: int
    vc: int


# ---- virtual-channel counts -----------------------------------------------------------------------

def vc_range(topology: Topology) -> tuple[int, int, int]:
    """(fewest, most, default) virtual channels ``topology`` can use. On a topology of nodes the count is
    the inner topology's times 1 or 2 classes (docs/routing.md, "Nodes"), so only those two values."""
    if topology.has_nodes:
        inner = _inner_vcs(topology)
        return inner, 2 * inner, inner * _default_classes(topology)
    if topology.is_grid:
        return (1, 2, 2) if topology.has_datelines else (1, 1, 1)
    most = max(1, min(MAX_VCS, int(_paths(topology).hops.max(initial=0))))
    return 1, most, 1


def resolve_vcs(topology: Topology, vcs: int | None) -> int:
    """``vcs`` checked against what ``topology`` can use (None: its default)."""
    lo, hi, default = vc_range(topology)
    if vcs is None:
        return default
    if isinstance(vcs, bool) or not isinstance(vcs, int | np.integer):
        raise TopologyError(f"{topology.name}: the virtual-channel count must be an integer, got {vcs!r}")
    vcs = int(vcs)
    if vcs < 1:
        raise TopologyError(f"{topology.name}: a route needs at least 1 virtual channel, got {vcs}")
    if topology.has_nodes and vcs not in (lo, hi):
        inner = topology.node_info.inner_label()
        raise TopologyError(f"{topology.name}: {vcs} virtual channels: a topology of nodes uses {lo} (one class: "
                            f"{inner}'s {lo} inside every node) or {hi} (two classes: hops toward a gateway and hops "
                            "inside the destination's node apart)")
    if vcs > hi:
        if topology.is_grid and topology.has_datelines:
            why = "it uses 1 (unsafe where a ring has 4 or more ranks) or 2 (dateline)"
        elif topology.is_grid:
            why = "it has no dateline (no ring of 3 or more ranks wraps around), so it uses exactly 1"
        elif hi == 1:
            why = "every route is 1 hop, so it uses exactly 1 (hop classes)"
        else:
            why = f"its routes take at most {hi} hops, so it can use 1..{hi} (hop classes)"
        raise TopologyError(f"{topology.name}: {vcs} virtual channels is more than it can use: {why}")
    return vcs


# ---- paths (independent of virtual channels) ------------------------------------------------------

class _Paths(NamedTuple):
    next: np.ndarray  # int32 [rank, dst]: next rank; rank itself on the diagonal; -1 unreachable
    port: np.ndarray  # int16: out port; -1 on the diagonal and unreachable
    link: np.ndarray  # int32: link id; -1 likewise
    hops: np.ndarray  # int32: hops to dst along the table; 0 on the diagonal; -1 unreachable


def _paths(topology: Topology) -> _Paths:
    cached = getattr(topology, "_paths_cache", None)
    if cached is None:
        if topology.has_nodes:
            cached = _node_paths(topology)
        else:
            cached = _grid_paths(topology) if topology.is_grid else _graph_paths(topology)
        topology._paths_cache = cached
    return cached


# ---- topologies of nodes: inner routes, gateways, one network hop ----------------------------------

def _inner_vcs(topology: Topology) -> int:
    """The virtual channels every node's inner topology routes with (its default)."""
    return max(vc_range(t)[2] for t in topology.node_info.inner)


def _default_classes(topology: Topology) -> int:
    """1 class when every node is all-to-all inside and reaches every other node through one gateway (a link
    into the gateway then only leads out of the node and a link out of it only delivers), else 2."""
    info = topology.node_info
    return 1 if info.all_to_all and info.one_gateway_per_node else 2


def _node_tables(topology: Topology) -> tuple[_Paths, np.ndarray]:
    """(paths, inner VC of every hop) of a topology of nodes (module docstring of ``_nodes``); cached.

    Same node: the inner topology's route. Other node: the inner route to this node's gateway toward the
    destination's node, the network link, then the inner route from the landing rank. The VC array holds
    the inner VC of each hop (0 on network hops); :class:`Routing` adds the class."""
    cached = getattr(topology, "_node_cache", None)
    if cached is not None:
        return cached
    info = topology.node_info
    n = topology.size
    link_id = {(k.src, k.dst): k.id for k in topology.links}
    # The inner routes, node by node, in global rank numbers (valid for pairs inside one node).
    inext = np.full((n, n), -1, dtype=np.int64)
    ilink = np.full((n, n), -1, dtype=np.int64)
    ihops = np.full((n, n), -1, dtype=np.int64)
    ivc = np.zeros((n, n), dtype=np.int64)
    for ranks, inner in zip(info.ranks, info.inner, strict=True):
        ra = np.asarray(ranks, dtype=np.int64)
        r = inner.routing()
        to_global = np.array([link_id[(ranks[k.src], ranks[k.dst])] for k in inner.links] + [-1], dtype=np.int64)
        block = np.ix_(ra, ra)
        inext[block] = np.where(r.next >= 0, ra[np.maximum(r.next, 0)], -1)
        ilink[block] = to_global[r.link]  # -1 indexes the trailing -1
        ihops[block] = r.hops
        ivc[block] = r.vc
    node = np.asarray(info.node_of, dtype=np.int64)
    nn = len(info.ranks)
    gw_src = np.full((nn, nn), -1, dtype=np.int64)
    gw_dst = np.full((nn, nn), -1, dtype=np.int64)
    gw_link = np.full((nn, nn), -1, dtype=np.int64)
    for a in range(nn):
        for b in range(nn):
            if a != b:
                src, dst = info.hop[a][b]
                gw_src[a, b], gw_dst[a, b], gw_link[a, b] = src, dst, link_id[(src, dst)]
    x = np.arange(n)[:, None]
    d = np.arange(n)[None, :]
    na, nb = node[:, None], node[None, :]
    same = na == nb
    ga, gb, gl = gw_src[na, nb], gw_dst[na, nb], gw_link[na, nb]  # -1 on same-node pairs
    at_gw = ga == x
    ga0, gb0 = np.maximum(ga, 0), np.maximum(gb, 0)
    nxt = np.where(same, inext, np.where(at_gw, gb, inext[x, ga0]))
    link = np.where(same, ilink, np.where(at_gw, gl, ilink[x, ga0]))
    to_gw, from_gw = ihops[x, ga0], ihops[gb0, d]
    cross_hops = np.where((to_gw >= 0) & (from_gw >= 0), to_gw + 1 + from_gw, -1)
    hops = np.where(same, ihops, cross_hops)
    vc = np.where(same, ivc, np.where(at_gw, 0, ivc[x, ga0]))
    nxt = np.where(hops >= 0, nxt, -1)
    link = np.where(hops >= 0, link, -1)
    port_of_link = np.array([k.port for k in topology.links] + [-1], dtype=np.int64)
    port = np.where(link >= 0, port_of_link[link], -1)
    diag = np.arange(n)
    nxt[diag, diag], link[diag, diag], port[diag, diag], hops[diag, diag], vc[diag, diag] = diag, -1, -1, 0, 0
    paths = _Paths(nxt.astype(np.int32), port.astype(np.int16), link.astype(np.int32), hops.astype(np.int32))
    topology._node_cache = (paths, vc.astype(np.int8))
    return topology._node_cache


def _node_paths(topology: Topology) -> _Paths:
    return _node_tables(topology)[0]


def _link_at(topology: Topology) -> np.ndarray:
    """``[rank, port] -> link id`` (-1 where a rank has no link on that port)."""
    at = np.full((topology.size, max(topology.nports, 1)), -1, dtype=np.int32)
    for k in topology.links:
        at[k.src, k.port] = k.id
    return at


def _grid_paths(topology: Topology) -> _Paths:
    """Dimension order (x, then y, ...); on a wrapping ring the shorter way round, + on a tie."""
    n, dims = topology.size, topology.dims
    ranks = np.arange(n)
    cur, dst = ranks[:, None], ranks[None, :]
    nxt = np.broadcast_to(cur, (n, n)).astype(np.int32).copy()
    port = np.full((n, n), -1, dtype=np.int16)
    hops = np.zeros((n, n), dtype=np.int32)
    pending = cur != dst
    stride = 1
    wraps = topology.kind in ("ring", "torus")
    for k, size in enumerate(dims):
        c_cur, c_dst = (cur // stride) % size, (dst // stride) % size
        diff = c_dst - c_cur
        if wraps and size >= 3:
            delta = diff % size
            plus = 2 * delta <= size  # the tie (delta == size / 2) goes +
            hops += np.minimum(delta, size - delta)
        else:
            plus = diff > 0
            hops += np.abs(diff)
        here = pending & (diff != 0)
        sign = np.where(plus, 1, -1)
        step = ((c_cur + sign) % size - c_cur) * stride
        nxt = np.where(here, cur + step, nxt)
        port = np.where(here, 2 * k + (~plus), port).astype(np.int16)
        pending &= ~here
        stride *= size
    link = np.where(port >= 0, _link_at(topology)[cur, np.maximum(port, 0)], -1).astype(np.int32)
    return _Paths(nxt, port, link, hops)


def shortest_distances(topology: Topology) -> np.ndarray:
    """All-pairs shortest-path lengths over link weights (float64, inf where unreachable); cached."""
    cached = getattr(topology, "_dist_cache", None)
    if cached is not None:
        return cached
    n = topology.size
    weighted = topology.weighted
    if weighted:
        dist = np.full((n, n), np.inf)
    else:
        dist = np.full((n, n), 1 << 29, dtype=np.int32)  # exact integers; 2 * sentinel still fits
    for k in topology.links:
        dist[k.src, k.dst] = min(dist[k.src, k.dst], k.weight)
    np.fill_diagonal(dist, 0)
    for m in range(n):  # Floyd-Warshall, one row and column at a time
        np.minimum(dist, dist[:, m:m + 1] + dist[m:m + 1, :], out=dist)
    if not weighted:
        dist = np.where(dist >= 1 << 29, np.inf, dist.astype(np.float64))
    topology._dist_cache = dist
    return dist


def _graph_paths(topology: Topology) -> _Paths:
    """Shortest paths; among equally short next hops, the lowest-numbered neighbour."""
    n = topology.size
    dist = shortest_distances(topology)
    nxt = np.full((n, n), -1, dtype=np.int32)
    port = np.full((n, n), -1, dtype=np.int16)
    link = np.full((n, n), -1, dtype=np.int32)
    for rank in range(n):
        out = sorted(topology.out_links(rank), key=lambda k: k.dst)
        if not out:
            continue
        peers = np.array([k.dst for k in out])
        cand = np.array([k.weight for k in out])[:, None] + dist[peers, :]
        best = cand.min(axis=0)
        tol = 1e-9 * np.maximum(1.0, np.where(np.isfinite(best), best, 0)) if topology.weighted else 0
        pick = np.argmax(cand <= best + tol, axis=0)  # first (lowest rank) of the equally short
        ok = np.isfinite(best)
        nxt[rank] = np.where(ok, peers[pick], -1)
        port[rank] = np.where(ok, np.array([k.port for k in out])[pick], -1)
        link[rank] = np.where(ok, np.array([k.id for k in out])[pick], -1)
    diag = np.arange(n)
    nxt[diag, diag], port[diag, diag], link[diag, diag] = diag, -1, -1
    return _Paths(nxt, port, link, _hops_along(nxt))


def _hops_along(nxt: np.ndarray) -> np.ndarray:
    """Hops from every rank to every destination following ``nxt`` (pointer jumping, log2(n) rounds);
    -1 where unreachable. A table whose walk does not end at its destination is a bug: say so."""
    n = len(nxt)
    cols = np.arange(n)[None, :]
    ok = nxt >= 0
    jump = np.where(ok, nxt, np.arange(n)[:, None])
    count = (ok & (jump != np.arange(n)[:, None])).astype(np.int64)
    for _ in range(max(1, int(np.ceil(np.log2(max(n, 2))))) + 1):
        count = count + count[jump, cols]
        jump = jump[jump, cols]
    if np.any(ok & (jump != cols)):
        raise TopologyError("internal error: a routing table walk does not reach its destination")
    return np.where(ok, count, -1).astype(np.int32)


# ---- the routing tables ---------------------------------------------------------------------------

class Routing:
    """The routing tables of ``topology`` with ``vcs`` virtual channels (get one with
    :meth:`Topology.routing`). Arrays are indexed ``[rank, dst]``:

    ``next`` (int32; the rank itself on the diagonal, -1 unreachable), ``port`` (int16 out port, -1 on the
    diagonal / unreachable), ``link`` (int32 link id, -1 likewise), ``vc`` (int8), ``hops`` (int32, -1
    unreachable). ``table`` holds the same as device entries (:data:`ENTRY`), ``port_table`` the ports
    (:data:`PORT`).
    """

    def __init__(self, topology: Topology, vcs: int) -> None:
        self.topology = topology
        self.vcs = vcs
        paths = _paths(topology)
        self.next, self.port, self.link, self.hops = paths
        if topology.has_nodes:
            inner_algorithms = {t.routing().algorithm for t in topology.node_info.inner if t.size > 1}
            inside = inner_algorithms.pop() if len(inner_algorithms) == 1 else "each node's own routing"
            self.algorithm = f"through gateways (to the gateway, one network hop, on; inside nodes: {inside})"
        elif topology.is_grid:
            order = ", then ".join(_dim_name(k) for k in range(len(topology.dims)))
            self.algorithm = f"dimension order ({order})" if len(topology.dims) > 1 else "shortest way"
        else:
            self.algorithm = "shortest path"
        n = topology.size
        ranks = np.arange(n)
        if topology.has_nodes:
            inner_vcs = _inner_vcs(topology)
            classes = vcs // inner_vcs
            schemes = {t.routing().scheme for t in topology.node_info.inner if t.size > 1} or {"none"}
            inside = schemes.pop() if len(schemes) == 1 else "mixed"
            self.scheme = f"{classes} class{'es' * (classes > 1)} x {inside} inside nodes"
            _, inner_vc = _node_tables(topology)
            vc = inner_vc.astype(np.int8)
            if classes == 2:
                node = np.asarray(topology.node_info.node_of)
                same = (node[:, None] == node[None, :]) & (self.link >= 0)
                vc = np.where(same, vc + inner_vcs, vc).astype(np.int8)  # hops inside the destination's node
        elif vcs == 1:
            self.scheme = "none"
            vc = np.zeros((n, n), dtype=np.int8)
        elif topology.is_grid:
            self.scheme = "dateline"
            vc = np.zeros((n, n), dtype=np.int8)
            stride = 1
            for k, size in enumerate(topology.dims):
                if size >= 3:
                    c_cur, c_dst = (ranks[:, None] // stride) % size, (ranks[None, :] // stride) % size
                    moving = (self.port // 2 == k) & (self.port >= 0)
                    plus = self.port % 2 == 0
                    # Dally & Seitz: VC 1 while the route still has to cross this ring's dateline, VC 0 after
                    must_cross = np.where(plus, c_cur > c_dst, c_cur < c_dst)
                    vc = np.where(moving & must_cross, 1, vc).astype(np.int8)
                stride *= size
        else:
            self.scheme = "hop classes"
            vc = np.where(self.hops >= 1, np.minimum(self.hops - 1, vcs - 1), 0).astype(np.int8)
        self.vc = vc

    def __repr__(self) -> str:
        return f"Routing({self.topology.name!r}, vcs={self.vcs}, {self.scheme})"

    def describe(self) -> str:
        vcs = f"{self.vcs} virtual channel{'s' if self.vcs > 1 else ''} ({self.scheme})"
        return f"{self.topology.name}: {self.algorithm}, {vcs}"

    def entry(self, rank: int, dst: int) -> Entry:
        """Where a packet at ``rank`` bound for ``dst`` goes next."""
        t = self.topology
        rank, dst = t.check_rank(rank), t.check_rank(dst, "destination")
        return Entry(int(self.next[rank, dst]), int(self.port[rank, dst]), int(self.vc[rank, dst]))

    def route(self, src: int, dst: int) -> list[Hop]:
        """The hops from ``src`` to ``dst`` (empty when src == dst). Raises :class:`TopologyError` when
        ``dst`` is unreachable from ``src``."""
        t = self.topology
        src, dst = t.check_rank(src, "source"), t.check_rank(dst, "destination")
        if self.next[src, dst] < 0:
            raise TopologyError(f"{t.name}: no route from rank {t.label(src)} to rank {t.label(dst)}: "
                                "the topology does not connect them")
        hops, at = [], src
        while at != dst:
            hops.append(Hop(at, int(self.next[at, dst]), t.links[int(self.link[at, dst])],
                            int(self.port[at, dst]), int(self.vc[at, dst])))
            at = int(self.next[at, dst])
        return hops

    @property
    def max_hops(self) -> int:
        return int(self.hops.max(initial=0))

    # ---- what the device loads ------------------------------------------------------------------

    @property
    def table(self) -> np.ndarray:
        """``(nranks, nranks)`` array of :data:`ENTRY` (4 bytes: next u16, port u8, vc u8); row ``rank`` is
        what rank loads. ``next`` is NO_RANK and ``port`` PORT_NONE where unreachable; ``port`` is
        PORT_LOCAL on the diagonal."""
        n = self.topology.size
        out = ENTRY.array(n * n).reshape(n, n)
        out["next"] = np.where(self.next >= 0, self.next, NO_RANK)
        out["port"] = np.where(self.port >= 0, self.port, PORT_NONE)
        out["port"][np.arange(n), np.arange(n)] = PORT_LOCAL
        out["vc"] = self.vc
        return out

    @property
    def port_table(self) -> np.ndarray:
        """``(nranks, nports)`` array of :data:`PORT` (16 bytes: out_link, in_link u32; peer, peer_port u16;
        kind u8: LINK_MAPPED or LINK_NETWORK), NO_LINK / NO_RANK where a port is absent."""
        t = self.topology
        out = PORT.array(t.size * max(t.nports, 1)).reshape(t.size, max(t.nports, 1))
        out["out_link"] = out["in_link"] = NO_LINK
        out["peer"] = out["peer_port"] = NO_RANK
        for rank, ports in enumerate(t.ports):
            for p, port in enumerate(ports):
                if port.peer < 0:
                    continue
                out[rank, p] = (NO_LINK if port.out_link < 0 else port.out_link,
                                NO_LINK if port.in_link < 0 else port.in_link, port.peer, port.peer_port, port.kind)
        return out

    def device_handle(self, rank: int, entries_ptr: int, ports_ptr: int) -> np.void:
        """The :data:`TABLE` handle rank ``rank`` passes to its kernels by value: pointers to its row of
        ``table`` and its row of ``port_table`` in device memory."""
        t = self.topology
        return TABLE.pack(entries=entries_ptr, ports=ports_ptr, rank=t.check_rank(rank), nranks=t.size,
                          nports=max(t.nports, 1), vcs=self.vcs)

    def to_dict(self) -> dict:
        """The tables as plain lists (for ``--json``)."""
        t = self.topology
        out = {"topology": t.name, "kind": t.kind, "ranks": t.size, "dims": list(t.dims),
               "names": t.names, "directed": t.directed, "vcs": self.vcs, "vc_scheme": self.scheme,
               "algorithm": self.algorithm, "nports": t.nports,
               "links": [_link_dict(t, k) for k in t.links],
               "next": self.next.tolist(), "port": self.port.tolist(), "vc": self.vc.tolist(),
               "hops": self.hops.tolist()}
        if t.has_nodes:
            info = t.node_info
            out["nodes"] = [{"name": name, "ranks": ranks, "gateways": t.gateways(i)}
                            for i, (name, ranks) in enumerate(zip(info.names, info.ranks, strict=True))]
            out["network_hops"] = [{"from_node": a, "to_node": b, "src": info.hop[a][b][0], "dst": info.hop[a][b][1]}
                                  for a in range(len(info.ranks)) for b in range(len(info.ranks)) if a != b]
        return out


def _link_dict(t: Topology, k: Link) -> dict:
    out = {"id": k.id, "src": k.src, "dst": k.dst, "port": k.port, "kind": k.kind,
           "carrier": LINK_KIND_NAMES[k.kind_code], "weight": k.weight, "label": t.link_label(k)}
    if t.is_grid:
        out.update(dim=k.dim, sign=k.sign, dateline=k.dateline)
    return out
