"""The channel dependency graph of a routing and its cycle check (Dally & Seitz).

Nodes are ``(link, vc)`` pairs; an edge ``(l1, v1) -> (l2, v2)`` exists when some route holds ``l1`` on VC
``v1`` and requests ``l2`` on VC ``v2`` next. Routing is deadlock-free when the graph is acyclic.
Because the tables are indexed by ``(rank, dst)`` only, the edges are exactly: for every ``(prev, dst)`` whose
next hop ``cur`` is not ``dst``, ``(link[prev,dst], vc[prev,dst]) -> (link[cur,dst], vc[cur,dst])``
(``prev`` is itself a source of a route through that hop), so the graph is built without listing routes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._model import Link
from ._routing import Routing


@dataclass
class CheckResult:
    """The outcome of :func:`check`: ``acyclic``, one ``cycle`` of ``(link, vc)`` when not, and the size of
    the dependency graph (``channels`` used by some route, ``dependencies`` between them)."""

    routing: Routing
    acyclic: bool
    channels: int
    dependencies: int
    cycle: list[tuple[Link, int]] = field(default_factory=list)

    def text(self) -> str:
        """What ``circuslink route check`` prints."""
        r = self.routing
        t = r.topology
        vcs = f"{r.vcs} virtual channel{'s' if r.vcs > 1 else ''} ({r.scheme})"
        head = f"{t.name} with {vcs}, {r.algorithm}"
        if self.acyclic:
            text = (f"acyclic: {head}: {self.channels} (link, vc) channels, {self.dependencies} dependencies, "
                    "no cycle: deadlock-free")
            if t.is_grid and t.has_datelines and r.vcs == 1:
                text += ("\nnote: safe with 1 virtual channel only because no route takes 2 hops around a ring "
                         "(rings of 3 ranks); rings of 4 or more need the dateline's 2")
            return text
        lines = [f"cycle: {head}: these {len(self.cycle)} (link, vc) channels wait on each other in a cycle "
                 "(each route holds one and requests the next):"]
        lines += [f"  {t.link_label(link)} vc {vc}" for link, vc in self.cycle]
        first, vc0 = self.cycle[0]
        lines.append(f"  (back to {t.link_label(first)} vc {vc0})")
        lines.append(f"hint: {_hint(r)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        r = self.routing
        return {"topology": r.topology.name, "vcs": r.vcs, "vc_scheme": r.scheme, "algorithm": r.algorithm,
                "acyclic": self.acyclic, "channels": self.channels, "dependencies": self.dependencies,
                "cycle": [{"link": link.id, "src": link.src, "dst": link.dst, "label": r.topology.link_label(link),
                           "vc": vc} for link, vc in self.cycle]}


def _hint(r: Routing) -> str:
    t = r.topology
    if t.has_nodes:
        from ._routing import vc_range

        lo, hi, _ = vc_range(t)
        if r.vcs == lo:
            return (f"--vcs {hi} (two classes: hops toward a gateway and hops inside the destination's node on "
                    "separate virtual channels)")
        return "the routing inside a node has a cycle of its own: check the topology inside the nodes"
    if t.is_grid:
        return "use 2 virtual channels (the default on rings and tori): the dateline breaks every ring's cycle"
    most = r.max_hops
    if most <= 16 and r.vcs < most:
        return (f"--vcs {most} (hop classes: a packet with h hops left uses VC h-1) makes any routing acyclic; "
                "or change the links")
    return "shortest paths on this graph can deadlock; change the links or route on a subgraph"


def dependencies(routing: Routing) -> tuple[np.ndarray, np.ndarray]:
    """(channels used, dependency edges): channel ids ``link * vcs + vc`` (sorted, unique) and an ``(m, 2)``
    array of ``(held, requested)`` channel ids (sorted, unique)."""
    nxt, link, vc = routing.next, routing.link, routing.vc.astype(np.int64)
    n, vcs = len(nxt), routing.vcs
    moving = link >= 0
    used = np.unique(link[moving].astype(np.int64) * vcs + vc[moving])
    dst = np.broadcast_to(np.arange(n)[None, :], (n, n))
    cur = np.where(moving, nxt, 0)
    onward = moving & (cur != dst)
    held = link[onward].astype(np.int64) * vcs + vc[onward]
    c, d = cur[onward], dst[onward]
    requested = link[c, d].astype(np.int64) * vcs + vc[c, d]
    span = max(1, len(routing.topology.links) * vcs)
    codes = np.unique(held * span + requested)  # one int per edge: a 1-D unique is much faster than axis=0
    return used, np.stack([codes // span, codes % span], axis=1)


def find_cycle(nodes: np.ndarray, edges: np.ndarray) -> list[int]:
    """One cycle of the directed graph (node ids in order, starting at its smallest), or [] when acyclic.
    Deterministic: depth-first from the smallest node, successors in increasing order."""
    if not len(edges):
        return []
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    edges = edges[order]
    succ: dict[int, list[int]] = {}
    for a, b in edges.tolist():
        succ.setdefault(a, []).append(b)
    state: dict[int, int] = {}  # 1: on the current path, 2: finished
    for start in nodes.tolist():
        if state.get(start):
            continue
        path, iters = [start], [iter(succ.get(start, ()))]
        pos = {start: 0}
        state[start] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
                continue
            s = state.get(nxt)
            if s == 1:
                cycle = path[pos[nxt]:]
                k = cycle.index(min(cycle))
                return cycle[k:] + cycle[:k]
            if s is None:
                state[nxt] = 1
                pos[nxt] = len(path)
                path.append(nxt)
                iters.append(iter(succ.get(nxt, ())))
    return []


def check(routing: Routing) -> CheckResult:
    """Build the channel dependency graph of ``routing`` and look for a cycle."""
    used, edges = dependencies(routing)
    cycle = find_cycle(used, edges)
    links = routing.topology.links
    return CheckResult(routing, not cycle, len(used), len(edges),
                       [(links[c // routing.vcs], c % routing.vcs) for c in cycle])
