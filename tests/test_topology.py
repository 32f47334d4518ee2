"""Topologies, routing tables, virtual channels, the dependency check, the forwarding simulation and
`circuslink route`. CPU only, no ranks started; every check is against an independent reference written
here (coordinates, BFS / Dijkstra, routes enumerated one by one), never against the code's own tables.
"""

from __future__ import annotations

import heapq
import itertools
import json
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from conftest import NVCC_TIMEOUT_S

from circuslink import _abi, cli
from circuslink import topology as T
from circuslink.topology import TopologyError

REPO = Path(__file__).resolve().parents[1]
INCLUDE = REPO / "src" / "circuslink" / "include"
NVCC = shutil.which("nvcc")

GRIDS = ["ring:1", "ring:2", "ring:3", "ring:8", "line:1", "line:2", "line:5", "mesh:3x4", "mesh:1x3",
         "torus:4x4", "torus:3x3", "torus:2x3", "torus:5x2", "torus:4x4x2", "mesh:2x2x2"]


# ---- references ---------------------------------------------------------------------------------

def grid_shape(spec: str) -> tuple[str, list[int]]:
    kind, dims = spec.split(":")
    return kind, [int(d) for d in dims.split("x")]


def coords(rank: int, dims: list[int]) -> list[int]:
    out = []
    for d in dims:
        out.append(rank % d)
        rank //= d
    return out


def rank_at(c: list[int], dims: list[int]) -> int:
    rank, stride = 0, 1
    for ci, d in zip(c, dims, strict=True):
        rank += ci * stride
        stride *= d
    return rank


def grid_neighbours(spec: str, rank: int) -> set[int]:
    kind, dims = grid_shape(spec)
    wrap = kind in ("ring", "torus")
    out = set()
    c = coords(rank, dims)
    for k, d in enumerate(dims):
        for s in (1, -1):
            v = c[k] + s
            if 0 <= v < d or (wrap and d >= 3):
                cc = list(c)
                cc[k] = v % d
                if cc != c:
                    out.add(rank_at(cc, dims))
    return out


def dor_route(spec: str, src: int, dst: int) -> list[tuple[int, int, int, int]]:
    """(from, to, dim, sign) hops of dimension-order routing, the shorter way round, + on a tie."""
    kind, dims = grid_shape(spec)
    wrap = kind in ("ring", "torus")
    c, goal, hops = coords(src, dims), coords(dst, dims), []
    for k, d in enumerate(dims):
        if wrap and d >= 3:
            fwd = (goal[k] - c[k]) % d
            sign = 1 if fwd <= d - fwd else -1
        else:
            sign = 1 if goal[k] > c[k] else -1
        while c[k] != goal[k]:
            before = rank_at(c, dims)
            c[k] = (c[k] + sign) % d
            hops.append((before, rank_at(c, dims), k, sign))
    return hops


def bfs_hops(t: T.Topology) -> list[list[int]]:
    out = []
    for s in range(t.size):
        dist = {s: 0}
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for k in t.out_links(u):
                if k.dst not in dist:
                    dist[k.dst] = dist[u] + 1
                    queue.append(k.dst)
        out.append([dist.get(d, -1) for d in range(t.size)])
    return out


def dijkstra(t: T.Topology, src: int) -> list[float]:
    dist = [float("inf")] * t.size
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        du, u = heapq.heappop(heap)
        if du > dist[u]:
            continue
        for k in t.out_links(u):
            if du + k.weight < dist[k.dst]:
                dist[k.dst] = du + k.weight
                heapq.heappush(heap, (dist[k.dst], k.dst))
    return dist


def brute_dependencies(r: T.Routing) -> set[tuple[int, int]]:
    """Every (held, requested) (link * vcs + vc) pair, from every route listed hop by hop."""
    out = set()
    for s, d in itertools.permutations(range(r.topology.size), 2):
        if r.next[s, d] < 0:
            continue
        hops = r.route(s, d)
        for a, b in itertools.pairwise(hops):
            out.add((a.link.id * r.vcs + a.vc, b.link.id * r.vcs + b.vc))
    return out


def random_graph(rng: np.random.Generator, n: int, extra: int, directed: bool = False,
                 weighted: bool = False) -> T.Topology:
    """A connected random graph: a random spanning tree (or directed ring) plus extra links."""
    perm = rng.permutation(n).tolist()
    pairs = set()
    if directed:
        pairs |= {(perm[i], perm[(i + 1) % n]) for i in range(n)}
    else:
        pairs |= {tuple(sorted((perm[i], perm[int(rng.integers(0, i))]))) for i in range(1, n)}
    for _ in range(extra):
        a, b = (int(x) for x in rng.choice(n, 2, replace=False))
        pairs.add((a, b) if directed else tuple(sorted((a, b))))
    links = [{"a": a, "b": b, "weight": int(rng.integers(1, 4)) if weighted else 1} for a, b in sorted(pairs)]
    return T.graph(n, links, directed=directed, name="random")


# ---- topologies ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", GRIDS)
def test_grid_ranks_links_ports_and_neighbours(spec):
    t = T.parse(spec)
    kind, dims = grid_shape(spec)
    assert t.size == int(np.prod(dims)) and t.kind == kind and t.dims == tuple(dims) and t.name == spec
    assert t.names == [str(r) for r in range(t.size)]
    expected = {(r, nb) for r in range(t.size) for nb in grid_neighbours(spec, r)}
    assert {(k.src, k.dst) for k in t.links} == expected
    assert len(t.links) == len(expected), "no parallel links (a ring of 2 has one link each way)"
    assert [k.id for k in t.links] == list(range(len(t.links)))
    for k in t.links:
        c, n = coords(k.src, dims), coords(k.dst, dims)
        assert k.port == 2 * k.dim + (k.sign < 0)
        assert (n[k.dim] - c[k.dim]) % dims[k.dim] == k.sign % dims[k.dim]
        assert k.dateline == (abs(n[k.dim] - c[k.dim]) > 1), k
        assert k.kind == "direct" and k.weight == 1
    for r in range(t.size):
        assert t.neighbours(r) == sorted(grid_neighbours(spec, r))
        assert t.coords(r) == tuple(coords(r, dims))
    assert t.has_datelines == (kind in ("ring", "torus") and max(dims) >= 3)


def test_constructors_and_strings_agree():
    pairs = [(T.torus(4, 4), "torus:4x4"), (T.mesh(3, 2), "mesh:3x2"), (T.ring(5), "ring:5"),
             (T.line(4), " line:4 "), (T.torus(2, 2, 2), "TORUS:2x2x2")]
    for built, text in pairs:
        parsed = T.parse(text)
        assert parsed.links == built.links and parsed.name == built.name
    t = T.parse("torus:4x4")
    assert T.parse(t) is t


def test_custom_graph_from_json_and_edge_list_agree(tmp_path):
    doc = {"nodes": [{"name": "a"}, "b", "c", {"name": "d"}],
           "links": [["a", "b"], {"a": "b", "b": "c", "kind": "pcie", "weight": 2}, ["c", "d"], ["d", "a"]]}
    (tmp_path / "net.json").write_text(json.dumps(doc))
    (tmp_path / "net.txt").write_text("# the same network\na b\nb c kind=pcie weight=2  # slow\n\nc d\nd a\n")
    j, e = T.parse(str(tmp_path / "net.json")), T.load(str(tmp_path / "net.txt"))
    for t in (j, e):
        assert t.kind == "graph" and t.names == ["a", "b", "c", "d"] and not t.directed
        assert [(k.src, k.dst, k.port, k.kind, k.weight) for k in t.links] == [
            (0, 1, 0, "direct", 1), (0, 3, 1, "direct", 1), (1, 0, 0, "direct", 1), (1, 2, 1, "pcie", 2),
            (2, 1, 0, "pcie", 2), (2, 3, 1, "direct", 1), (3, 0, 0, "direct", 1), (3, 2, 1, "direct", 1)]
        assert t.neighbours(0) == [1, 3] and t.rank_of("c") == 2 and t.rank_of(2) == 2
    assert j.groups() == e.groups() == {} and j.group(2) is None and not j.has_nodes  # see test_nodes_topology.py
    # a count of nodes, and integer names in an edge list are the ranks themselves
    assert T.from_json('{"nodes": 3, "links": [[0, 1], [1, 2]]}').names == ["0", "1", "2"]
    t = T.from_edge_list("2 1\n1 0\n")
    assert t.names == ["0", "1", "2"] and {(k.src, k.dst) for k in t.links} == {(0, 1), (1, 0), (1, 2), (2, 1)}
    assert T.from_edge_list("b a\nc\n").names == ["b", "a", "c"]  # first appearance; 'c' on its own


def test_directed_graph_ports_cover_both_directions():
    t = T.from_edge_list("directed\na b\nb c\nc a\n")
    assert t.directed and len(t.links) == 3
    assert t.neighbours(0) == [1, 2]  # b (out) and c (in): credits of c->a are stored into c's memory
    assert [(p.peer, p.out_link >= 0, p.in_link >= 0) for p in t.ports[0]] == [(1, True, False), (2, False, True)]
    r = t.routing()
    assert [h.dst for h in r.route(0, 2)] == [1, 2]
    assert r.hops.tolist() == bfs_hops(t)


# ---- routing tables -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", GRIDS)
def test_grid_routes_are_dimension_order_the_shorter_way_round(spec):
    t = T.parse(spec)
    r = t.routing()
    for s, d in itertools.product(range(t.size), repeat=2):
        want = dor_route(spec, s, d)
        got = r.route(s, d)
        assert [(h.src, h.dst, h.link.dim, h.link.sign) for h in got] == want, (s, d)
        assert all(h.link.src == h.src and h.link.dst == h.dst and h.port == h.link.port for h in got)
        assert r.hops[s, d] == len(want)
        e = r.entry(s, d)
        assert e == ((s, -1, 0) if s == d else (want[0][1], got[0].port, got[0].vc))
    assert r.hops.tolist() == bfs_hops(t), "dimension order is minimal on grids"


@pytest.mark.parametrize("spec", ["ring:4", "ring:5", "ring:8", "torus:4x4", "torus:3x3", "torus:5x4", "torus:4x3x3"])
def test_dateline_vc_is_1_until_the_ring_is_crossed_and_0_after(spec):
    r = T.routing(spec)
    assert (r.vcs, r.scheme) == (2, "dateline")
    for s, d in itertools.permutations(range(r.topology.size), 2):
        hops = r.route(s, d)
        for i, h in enumerate(hops):
            crossing_ahead = any(g.link.dateline for g in hops[i:] if g.link.dim == h.link.dim)
            assert h.vc == int(crossing_ahead), (s, d, i)


def test_one_vc_and_lines_use_vc_0_only():
    for spec, vcs in [("torus:4x4", 1), ("line:6", None), ("mesh:4x3", None), ("torus:2x2", None)]:
        r = T.routing(spec, vcs)
        assert r.vcs == 1 and not r.vc.any()


@pytest.mark.parametrize("directed,weighted", [(False, False), (True, False), (False, True)])
def test_graph_routes_are_shortest_with_the_lowest_neighbour_on_ties(rng, directed, weighted):
    for _ in range(4):
        t = random_graph(rng, int(rng.integers(2, 14)), int(rng.integers(0, 10)), directed, weighted)
        r = t.routing()
        dist = [dijkstra(t, s) for s in range(t.size)]
        for s, d in itertools.permutations(range(t.size), 2):
            cost = sum(h.link.weight for h in r.route(s, d))
            assert cost == pytest.approx(dist[s][d])
            # the next hop: the lowest-numbered neighbour on some shortest path
            best = min(k.dst for k in t.out_links(s) if k.weight + dist[k.dst][d] == pytest.approx(dist[s][d]))
            assert r.next[s, d] == best
        if not weighted:
            assert r.hops.tolist() == bfs_hops(t)


def test_weights_steer_around_a_slow_link():
    t = T.graph(["a", "b", "c"], [("a", "b"), {"a": "b", "b": "c", "weight": 1}, {"a": "a", "b": "c", "weight": 5}])
    assert [h.dst for h in t.route(0, 2)] == [1, 2]
    t = T.graph(["a", "b", "c"], [("a", "b"), {"a": "b", "b": "c", "weight": 9}, {"a": "a", "b": "c", "weight": 5}])
    assert [h.dst for h in t.route(0, 2)] == [2]


@pytest.mark.parametrize("spec", ["torus:4x4", "mesh:3x2", "ring:5", "line:3", "nodes:2x4",
                                  "nodes:3x(ring:3),gw=spread"])
def test_device_tables_hold_the_routes(spec):
    t = T.parse(spec)
    r = t.routing()
    table, ports = r.table, r.port_table
    assert table.dtype == T.ENTRY.dtype and table.dtype.itemsize == 4 and table.shape == (t.size, t.size)
    # Port is 16 bytes: kind (u8, at 12) was appended after the 12 bytes of issue 12's layout
    assert ports.dtype == T.PORT.dtype and ports.dtype.itemsize == 16 and ports.shape == (t.size, t.nports)
    assert [T.PORT.offsets[f] for f in ("out_link", "in_link", "peer", "peer_port", "kind")] == [0, 4, 8, 10, 12]
    for s, d in itertools.product(range(t.size), repeat=2):
        e = table[s, d]
        if s == d:
            assert (e["next"], e["port"], e["vc"]) == (s, T.PORT_LOCAL, 0)
            continue
        hop = r.route(s, d)[0]
        assert (e["next"], e["port"], e["vc"]) == (hop.dst, hop.port, hop.vc)
        p = ports[s, e["port"]]
        assert (p["peer"], p["out_link"]) == (hop.dst, hop.link.id)
        assert p["kind"] == (T.LINK_NETWORK if hop.link.kind == "network" else T.LINK_MAPPED)
        back = ports[hop.dst, p["peer_port"]]
        assert back["peer"] == s and back["out_link"] == p["in_link"]  # the port at the peer faces back
        assert t.links[int(p["in_link"])].src == hop.dst and t.links[int(p["in_link"])].dst == s
    handle = r.device_handle(t.size - 1, 0x1000, 0x2000)
    assert handle.dtype == T.TABLE.dtype and handle.dtype.itemsize == 32
    assert (handle["entries"], handle["ports"]) == (0x1000, 0x2000)
    assert (handle["rank"], handle["nranks"], handle["nports"], handle["vcs"]) == (t.size - 1, t.size, t.nports, r.vcs)


def test_port_tables_of_graphs_face_back(rng):
    for directed in (False, True):
        t = random_graph(rng, 9, 6, directed=directed)
        ports = t.routing().port_table
        assert ports.shape == (t.size, max(len(t.neighbours(r)) for r in range(t.size)))
        for rank in range(t.size):
            peers = [int(p["peer"]) for p in ports[rank] if p["peer"] != T.NO_RANK]
            assert peers == t.neighbours(rank)  # a port per neighbour, in rank order
            for p in ports[rank][:len(peers)]:
                back = ports[p["peer"], p["peer_port"]]
                assert back["peer"] == rank and back["out_link"] == p["in_link"] and back["in_link"] == p["out_link"]
                if p["out_link"] != T.NO_LINK:
                    k = t.links[int(p["out_link"])]
                    assert (k.src, k.dst, k.port) == (rank, p["peer"], list(ports[rank]["peer"]).index(p["peer"]))


def test_unreachable_entries_in_the_device_table():
    r = T.from_edge_list("a b\nc d\n").routing()
    assert (r.table[0, 2]["next"], r.table[0, 2]["port"]) == (T.NO_RANK, T.PORT_NONE)
    assert r.next[0, 2] == -1 and r.hops[0, 2] == -1


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_device_structs_match_the_header(tmp_path):
    src = tmp_path / "abi.cu"
    src.write_text(_abi.static_asserts([T.ENTRY, T.PORT, T.TABLE]))
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(src), "-o",
                           str(tmp_path / "abi.o")], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- virtual channels and the dependency check --------------------------------------------------

@pytest.mark.parametrize("spec,vcs,acyclic", [
    ("torus:4x4", 2, True), ("torus:4x4", 1, False), ("ring:4", 1, False), ("ring:8", 1, False),
    ("ring:8", 2, True), ("torus:3x3", 1, True), ("torus:3x5", 1, False), ("torus:4x4x2", 2, True),
    ("line:4", 1, True), ("mesh:4x4", 1, True), ("mesh:3x2x2", 1, True), ("torus:2x2", 1, True), ("ring:1", 1, True),
])
def test_dependency_graph_and_cycle_check(spec, vcs, acyclic):
    r = T.routing(spec, vcs)
    result = T.check(r)
    used, edges = T.dependencies(r)
    assert {tuple(e) for e in edges.tolist()} == brute_dependencies(r)
    assert result.acyclic == acyclic and result.dependencies == len(edges) and result.channels == len(used)
    if acyclic:
        assert result.cycle == [] and result.text().startswith("acyclic: ")
        return
    cyc = result.cycle
    assert len(cyc) >= 2
    dep = brute_dependencies(r)
    for (a, va), (b, vb) in zip(cyc, cyc[1:] + cyc[:1], strict=True):
        assert a.dst == b.src and (a.id * r.vcs + va, b.id * r.vcs + vb) in dep
    text = result.text()
    assert text.startswith("cycle: ") and all(T.parse(spec).link_label(k) in text for k, _ in cyc)


def test_torus_cycle_with_one_vc_is_a_whole_ring():
    cyc = T.check("torus:4x4", 1).cycle
    assert len(cyc) == 4 and len({(k.dim, k.sign) for k, _ in cyc}) == 1
    assert sum(k.dateline for k, _ in cyc) == 1 and all(vc == 0 for _, vc in cyc)


def test_graph_cycles_and_hop_classes(rng):
    ring6 = T.from_edge_list("0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n")
    assert T.vc_range(ring6) == (1, 3, 1)
    assert not T.check(ring6).acyclic and "--vcs 3" in T.check(ring6).text()
    assert T.check(ring6, 3).acyclic and T.check(ring6, 2).acyclic  # the most is enough, not always needed
    r = ring6.routing(3)
    assert r.scheme == "hop classes" and (r.vc == np.where(r.hops > 0, r.hops - 1, 0)).all()
    for _ in range(6):  # hop classes with as many VCs as the longest route make any graph acyclic
        t = random_graph(rng, int(rng.integers(3, 12)), int(rng.integers(0, 8)), directed=bool(rng.integers(2)))
        r = t.routing(T.vc_range(t)[1])
        assert T.check(r).acyclic or r.max_hops > T.MAX_VCS
        assert {tuple(e) for e in T.dependencies(r)[1].tolist()} == brute_dependencies(r)


def test_find_cycle_is_deterministic_and_minimal_first():
    nodes = np.arange(6)
    assert T.find_cycle(nodes, np.array([[0, 1], [1, 2], [2, 3]])) == []
    assert T.find_cycle(nodes, np.array([[0, 1], [1, 2], [4, 3], [3, 5], [5, 4]])) == [3, 5, 4]
    assert T.find_cycle(nodes, np.array([[2, 2]])) == [2]


# ---- the forwarding simulation ------------------------------------------------------------------

def all_to_all(n: int, packets: int) -> list[tuple[int, int, int]]:
    return [(s, d, packets) for s in range(n) for d in range(n) if s != d]


def assert_delivered_once_in_order(result: T.SimResult, messages) -> None:
    assert result.complete and not result.deadlocked and result.remaining == 0
    assert result.delivered == [list(range(m[2])) for m in messages]


@pytest.mark.parametrize("spec", ["torus:4x4", "torus:3x3"])
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_all_to_all_with_dateline_vcs_completes(spec, seed):
    t = T.parse(spec)
    messages = all_to_all(t.size, 3)
    result = T.simulate(t, None, messages, buffer_slots=1, seed=seed)
    assert result.routing.vcs == 2
    assert_delivered_once_in_order(result, messages)
    # each packet: injected, forwarded hop by hop, delivered
    assert result.moves == sum(3 * (len(t.route(s, d)) + 1) for s, d, _ in messages)


def test_all_to_all_with_one_vc_deadlocks_and_names_the_cycle():
    t = T.parse("torus:4x4")
    result = T.simulate(t, 1, all_to_all(16, 3), buffer_slots=1)
    assert result.deadlocked and not result.complete and result.remaining > 0
    dep = brute_dependencies(t.routing(1))
    cyc = result.cycle
    assert len(cyc) >= 2
    for (a, va), (b, vb) in zip(cyc, cyc[1:] + cyc[:1], strict=True):
        assert a.dst == b.src and (a.id + va, b.id + vb) in dep  # a cycle of the dependency graph
    assert "deadlock after" in result.text() and t.link_label(cyc[0][0]) in result.text()
    delivered = sum(map(len, result.delivered))
    assert delivered + result.remaining == 3 * 240


@pytest.mark.parametrize("spec,vcs", [("line:4", None), ("mesh:3x3", None), ("mesh:4x2", None),
                                      ("torus:3x3", 1), ("ring:6", 2)])
def test_acyclic_routings_complete(spec, vcs):
    t = T.parse(spec)
    messages = all_to_all(t.size, 4)
    for seed in (None, 7):
        assert_delivered_once_in_order(T.simulate(t, vcs, messages, buffer_slots=1, seed=seed), messages)


def test_simulation_agrees_with_the_check_on_random_graphs(rng):
    for _ in range(5):
        t = random_graph(rng, int(rng.integers(3, 9)), int(rng.integers(0, 6)), directed=bool(rng.integers(2)))
        vcs = int(rng.integers(1, T.vc_range(t)[1] + 1))
        messages = [(s, d, int(rng.integers(0, 4))) for s in range(t.size) for d in range(t.size)]
        result = T.simulate(t, vcs, messages, buffer_slots=int(rng.integers(1, 3)), seed=int(rng.integers(1 << 30)))
        if T.check(t, vcs).acyclic:
            assert_delivered_once_in_order(result, messages)
        elif result.deadlocked:
            dep = brute_dependencies(t.routing(vcs))
            for (a, va), (b, vb) in zip(result.cycle, result.cycle[1:] + result.cycle[:1], strict=True):
                assert (a.id * vcs + va, b.id * vcs + vb) in dep


def test_simulation_edge_cases():
    r = T.simulate("ring:3", None, [(1, 1, 2), (0, 2), (2, 0, 0)], buffer_slots=4)
    assert r.complete and r.delivered == [[0, 1], [0], []]
    assert T.simulate("line:2", None, [], 1).complete


# ---- bad input: one line each -------------------------------------------------------------------

BAD_STRINGS = [
    ("torus:4y4", r"malformed topology 'torus:4y4': expected torus:XxY with positive integers, e\.g\. torus:4x4"),
    ("ring:0", r"ring:0: a ring needs at least 1 rank, got 0"),
    ("line:0", r"line:0: a line needs at least 1 rank"),
    ("mesh:1x0", r"mesh:1x0: every dimension needs at least 1 rank, got 0"),
    ("mesh:4", r"expected mesh:XxY \(for one dimension use line:4\)"),
    ("ring:4x4", r"malformed topology 'ring:4x4': expected ring:N"),
    ("torus:", r"malformed topology 'torus:'"),
    ("torus:-4x4", r"malformed topology"),
    ("tree:4", r"unknown topology kind 'tree' in 'tree:4' \(known: ring, line, mesh, torus"),
    ("torus:64x64", r"torus:64x64 has 4096 ranks; circuslink routes at most 1024 ranks"),
    ("torus:99999999999x2", r"circuslink routes at most 1024 ranks"),
    ("", r"empty topology"),
    ("no-such-file.json", r"no such topology file 'no-such-file.json'"),
]


@pytest.mark.parametrize("text,message", BAD_STRINGS, ids=[b[0] or "empty" for b in BAD_STRINGS])
def test_bad_topology_strings(text, message):
    with pytest.raises(TopologyError, match=message) as info:
        T.parse(text)
    assert "\n" not in str(info.value)


BAD_FILES = [
    ("self.txt", "a b\nb b\n", r"self\.txt:2: self-loop: node 'b' linked to itself"),
    ("dup.txt", "a b\nb c\nb a\n", r"dup\.txt:3: duplicate link b-a \(first at .*dup\.txt:1\)"),
    ("dupd.txt", "directed\na b\nb a\na b\n", r"dupd\.txt:4: duplicate link a->b"),
    ("args.txt", "a b\na b c\n", r"args\.txt:2: expected 'a b \[kind=K\] \[weight=W\]'"),
    ("opt.txt", "a b colour=red\n", r"opt\.txt:1: unknown option 'colour'"),
    ("weight.txt", "a b weight=x\n", r"weight\.txt:1: weight 'x' is not a number"),
    ("zero.txt", "a b weight=0\n", r"zero\.txt:1: weight must be a positive number up to 1e\+09, got 0\.0"),
    ("late.txt", "a b\ndirected\n", r"late\.txt:2: 'directed' must come before any node or link"),
    ("empty.txt", "# nothing\n", r"empty\.txt: no nodes"),
    ("big.txt", "0 5000\n", r"rank 5000 is too large"),
    ("bad.json", '{"nodes": ["a", "b"],\n "links": [["a", "b"],\n}', r"bad\.json:3:1: not valid JSON: Expecting value"),
    ("list.json", '[1, 2]', r"list\.json: expected a JSON object"),
    ("unknown.json", '{"nodes": ["a", "b"], "links": [["a", "x"]]}',
     r"unknown\.json: links\[0\]: link to unknown node 'x' \(nodes: a, b\)"),
    ("key.json", '{"nodes": ["a"], "links": [], "colour": 1}', r"key\.json: unknown key 'colour'"),
    ("nolinks.json", '{"nodes": ["a"]}', r"nolinks\.json: missing 'links'"),
    ("nodes.json", '{"nodes": "a", "links": []}', r"'nodes' must be a list of names or a count, got a JSON string"),
    ("twice.json", '{"nodes": ["a", "a"], "links": []}', r"node 'a' is listed twice \(ranks 0 and 1\)"),
    ("name.json", '{"nodes": [true], "links": []}', r"nodes\[0\]: a node name is a string or an integer"),
    ("link3.json", '{"nodes": ["a", "b"], "links": [["a", "b", "c"]]}', r"links\[0\]: a link is \[a, b\]"),
    ("linkkey.json", '{"nodes": ["a", "b"], "links": [{"a": "a", "to": "b"}]}', r"links\[0\]: unknown key 'to'"),
    ("kind.json", '{"nodes": ["a", "b"], "links": [{"a": "a", "b": "b", "kind": 3}]}', r"kind must be a short word"),
    ("neg.json", '{"nodes": ["a", "b"], "links": [{"a": "a", "b": "b", "weight": -1}]}',
     r"weight must be a positive number up to 1e\+09, got -1"),
    ("huge.json", '{"nodes": ["a", "b"], "links": [{"a": "a", "b": "b", "weight": 1e400}]}',
     r"weight must be a positive number up to 1e\+09, got inf"),
    ("digits.json", '{"nodes": ["a", "b"], "links": [{"a": "a", "b": "b", "weight": ' + "9" * 5000 + "}]}",
     r"digits\.json: not valid JSON: Exceeds the limit"),
    ("dir.json", '{"nodes": ["a", "b"], "links": [], "directed": "yes"}', r"'directed' must be true or false"),
    ("count.json", '{"nodes": 0, "links": []}', r"a topology has 1\.\.1024 nodes, got 0"),
    ("deep.json", "[" * 100000 + "]" * 100000, r"deep\.json: "),
    ("loop.json", '{"nodes": ["a", "b"], "links": [{"a": "b", "b": "b"}]}', r"links\[0\]: self-loop"),
]


@pytest.mark.parametrize("name,text,message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_topology_files(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TopologyError, match=message) as info:
        T.parse(str(path))
    assert "\n" not in str(info.value)


def test_unreadable_files(tmp_path, monkeypatch):
    from circuslink.topology import _files

    monkeypatch.setattr(_files, "MAX_FILE_BYTES", 8)
    (tmp_path / "long.txt").write_text("a b\nb c\nc d\n")
    with pytest.raises(TopologyError, match=r"long\.txt: too large for a topology file"):
        T.parse(str(tmp_path / "long.txt"))
    monkeypatch.undo()
    (tmp_path / "bin.txt").write_bytes(b"a b\n\x00\x01")
    (tmp_path / "latin.txt").write_bytes(b"a b\nc \xe9\n")
    for name, message in [("bin.txt", r"not a text file"), ("latin.txt", r"latin\.txt:2: not UTF-8 text"),
                          (".", r"is a folder, not a topology file")]:
        with pytest.raises(TopologyError, match=message):
            T.parse(str(tmp_path / name))


def test_bad_ranks_counts_and_routes():
    t = T.parse("torus:4x4")
    with pytest.raises(TopologyError, match=r"topology torus:4x4 has 16 ranks, but the job has 8: a topology "
                                            r"names every rank \(run with -n 16\)"):
        t.check_nranks(8)
    t.check_nranks(16)
    with pytest.raises(TopologyError, match=r"torus:4x4: rank 16 is outside 0\.\.15 \(16 ranks\)"):
        t.neighbours(16)
    with pytest.raises(TopologyError, match=r"destination -1 is outside 0\.\.15"):
        t.route(0, -1)
    with pytest.raises(TopologyError, match=r"no node 'q'"):
        t.rank_of("q")
    disc = T.from_edge_list("a b\nc d\n", "two.txt")
    with pytest.raises(TopologyError, match=r"topology two\.txt is not connected: no path from rank 0 \(a\) to "
                                            r"rank 2 \(c\)"):
        disc.check_connected()
    with pytest.raises(TopologyError, match=r"no route from rank 1 \(b\) to rank 3 \(d\)"):
        disc.route(1, 3)
    assert disc.reachable(0, 1) and not disc.reachable(0, 3)
    with pytest.raises(TopologyError, match=r"message 0 destination 9 is outside"):
        T.simulate("ring:4", None, [(0, 9)], 1)
    with pytest.raises(TopologyError, match=r"no route from rank 0 \(a\) to rank 2 \(c\)"):
        T.simulate(disc, None, [(0, 2)], 1)
    with pytest.raises(TopologyError, match=r"message 0: expected \(src, dst\)"):
        T.simulate("ring:4", None, [(0,)], 1)
    with pytest.raises(TopologyError, match=r"buffer_slots must be a positive integer, got 0"):
        T.simulate("ring:4", None, [(0, 1)], 0)


@pytest.mark.parametrize("spec,vcs,message", [
    ("torus:4x4", 0, r"torus:4x4: a route needs at least 1 virtual channel, got 0"),
    ("torus:4x4", 3, r"torus:4x4: 3 virtual channels is more than it can use: it uses 1 \(unsafe where a ring has "
                     r"4 or more ranks\) or 2 \(dateline\)"),
    ("line:4", 2, r"line:4: 2 virtual channels is more than it can use: it has no dateline"),
    ("mesh:4x4", 2, r"mesh:4x4: 2 virtual channels .* it has no dateline"),
    ("torus:2x2", 2, r"it has no dateline"),
    ("ring:6", 1.5, r"the virtual-channel count must be an integer"),
])
def test_bad_virtual_channel_counts(spec, vcs, message):
    with pytest.raises(TopologyError, match=message):
        T.routing(spec, vcs)


def test_bad_virtual_channel_count_on_graphs():
    with pytest.raises(TopologyError, match=r"5 virtual channels .* its routes take at most 3 hops, so it can use "
                                            r"1\.\.3 \(hop classes\)"):
        T.from_edge_list("0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n", "r6").routing(5)
    with pytest.raises(TopologyError, match=r"every route is 1 hop, so it uses exactly 1"):
        T.from_edge_list("a b\nb c\nc a\n").routing(2)


# ---- the command --------------------------------------------------------------------------------

def route(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["route", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_cli_show_tables_path_and_json(capsys, tmp_path):
    code, out, _ = route(capsys, "show", "torus:3x3")
    assert code == 0 and "torus:3x3: 9 ranks, 18 bidirectional links" in out and "2 virtual channels (dateline)" in out
    assert out.count("\nrank ") == 9 and "rank 4 (x=1, y=1): neighbours 5 (+x), 3 (-x), 7 (+y), 1 (-y)" in out
    code, out, _ = route(capsys, "show", "torus:4x4", "--from", "3", "--to", "9")
    assert code == 0 and out.splitlines()[0].startswith("torus:4x4: rank 3 -> rank 9: 4 hops")
    assert "hop 1: 3 -> 0  link 12 3->0 (+x, dateline)  port +x  vc 1" in out
    code, out, _ = route(capsys, "show", "torus:4x4", "--from", "3", "--to", "9", "--json")
    data = json.loads(out)
    assert [(h["src"], h["dst"], h["vc"]) for h in data["hops"]] == [(3, 0, 1), (0, 1, 0), (1, 5, 0), (5, 9, 0)]
    code, out, _ = route(capsys, "show", "mesh:3x2", "--json", str(tmp_path / "t.json"))
    data = json.loads((tmp_path / "t.json").read_text())
    r = T.routing("mesh:3x2")
    assert code == 0 and data["next"] == r.next.tolist() and data["vc"] == r.vc.tolist() and "rank 5" in out
    code, out, _ = route(capsys, "show", "ring:5", "--rank", "2", "--json")
    assert code == 0 and json.loads(out)["next"] == T.routing("ring:5").next[2].tolist()
    net = tmp_path / "net.txt"
    net.write_text("a b\nb c\nc d\n")
    code, out, _ = route(capsys, "show", str(net), "--from", "a", "--to", "d")
    assert code == 0 and "rank 0 (a) -> rank 3 (d): 3 hops" in out


def test_cli_check_exit_codes(capsys, tmp_path):
    code, out, _ = route(capsys, "check", "torus:4x4")
    assert code == 0 and out.startswith("acyclic: torus:4x4 with 2 virtual channels (dateline)")
    code, out, _ = route(capsys, "check", "torus:4x4", "--vcs", "1")
    assert code == 1 and out.startswith("cycle: torus:4x4 with 1 virtual channel")
    assert "  0->1 (+x) vc 0\n  1->2 (+x) vc 0\n  2->3 (+x) vc 0\n  3->0 (+x, dateline) vc 0\n" in out
    code, out, _ = route(capsys, "check", "line:4")
    assert code == 0 and out.startswith("acyclic: line:4 with 1 virtual channel")
    code, out, _ = route(capsys, "check", "torus:3x3", "--vcs", "1")
    assert code == 0 and "note: safe with 1 virtual channel only because" in out
    code, out, _ = route(capsys, "check", "ring:8", "--vcs", "1", "--json")
    data = json.loads(out)
    assert code == 1 and not data["acyclic"] and len(data["cycle"]) == 8


BAD_CLI = [
    (["check", "torus:4y4"], "malformed topology 'torus:4y4'"),
    (["check", "ring:0"], "ring:0: a ring needs at least 1 rank"),
    (["show", "mesh:1x0"], "mesh:1x0: every dimension needs at least 1 rank"),
    (["check", "torus:4x4", "--vcs", "0"], "at least 1 virtual channel, got 0"),
    (["check", "torus:4x4", "--vcs", "3"], "3 virtual channels is more than it can use"),
    (["check", "line:4", "--vcs", "2"], "line:4: 2 virtual channels is more than it can use"),
    (["show", "torus:4x4", "--from", "0"], "give both --from A and --to B"),
    (["show", "torus:4x4", "--from", "0", "--to", "16"], "torus:4x4: rank 16 is outside 0..15"),
    (["show", "torus:4x4", "--rank", "x"], "torus:4x4: no node 'x'"),
    (["check", "DISC"], "is not connected: no path from rank 0 (a) to rank 2 (c)"),
    (["show", "SELF"], ":1: self-loop: node 'a' linked to itself"),
    (["check", "missing.json"], "no such topology file 'missing.json'"),
]


@pytest.mark.parametrize("argv,message", BAD_CLI, ids=[" ".join(a) for a, _ in BAD_CLI])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, message):
    (tmp_path / "disc.txt").write_text("a b\nc d\n")
    (tmp_path / "self.txt").write_text("a a\n")
    argv = [str(tmp_path / "disc.txt") if a == "DISC" else str(tmp_path / "self.txt") if a == "SELF" else a
            for a in argv]
    code, out, err = route(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("circuslink: error: ") and message in err, err


def test_cli_survives_random_garbage_files(capsys, tmp_path, rng):
    """Files of random bytes, mangled JSON and mangled edge lists: exit 0, 1 or 2, never a traceback."""
    good_json = json.dumps({"nodes": ["a", "b", "c", "d"], "links": [["a", "b"], ["b", "c"], {"a": "c", "b": "d",
                                                                                              "weight": 2}]})
    good_edges = "a b\nb c kind=nvlink\nc d weight=3\nd a\n"
    alphabet = list('{}[]",:0123456789abc \n#=-.xyz\\tn') + ["true", "null", "nodes", "links", "weight="]
    for i in range(60):
        choice = i % 3
        if choice == 0:
            data = bytes(rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8))
        else:
            base = list(good_json if choice == 1 else good_edges)
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(0, len(base) + 1))
                if rng.integers(2):
                    base[pos:pos + int(rng.integers(0, 3))] = []
                else:
                    base.insert(pos, alphabet[int(rng.integers(len(alphabet)))])
            data = "".join(base).encode()
        path = tmp_path / f"g{i}{'.json' if choice == 1 else '.txt'}"
        path.write_bytes(data)
        for sub in (["check"], ["show"]):
            code, out, err = route(capsys, *sub, str(path))
            assert code in (0, 1, 2), (data, err)
            if code == 2:
                assert err.count("\n") == 1 and err.startswith("circuslink: error: "), (data, err)


def test_cli_entry_point_exit_codes(tmp_path):
    """The installed command path (python -m circuslink) returns 0 / 1 / 2 as documented."""
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "circuslink", "route", *argv], capture_output=True,
                              text=True, timeout=60)
    assert run("check", "torus:4x4").returncode == 0
    assert run("check", "ring:6", "--vcs", "1").returncode == 1
    bad = run("show", "torus:4y4")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
