"""Topologies of nodes (issue 13): nodes:NxK, nodes:Nx(INNER), gateways, network links, files with a node per
rank, the hierarchical tables, their virtual-channel classes, the deadlock check and `circuslink route` on them.

References are written here: a route between nodes is the inner route to the gateway the test computes from
the documented rule, one network hop, and the inner route from the landing rank; inner routes of grids come
from the grid routing, which tests/test_topology.py checks against its own references.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from circuslink import cli
from circuslink import topology as T
from circuslink.topology import TopologyError


def local_gateway(rule, a: int, b: int, k: int) -> int:
    """The documented gateway rule: local rank G of every node, or node A reaches node B from B mod K."""
    return b % k if rule == "spread" else rule


def reference_route(lists, inner, rule, s: int, d: int) -> list[tuple[int, int]]:
    """Hops (src, dst) of the route s -> d, from the node lists, the inner topology and the gateway rule."""
    node = {r: i for i, ranks in enumerate(lists) for r in ranks}
    loc = {r: ranks.index(r) for ranks in lists for r in ranks}

    def inside(n: int, x: int, y: int) -> list[tuple[int, int]]:
        if x == y:
            return []
        if inner is None:  # all-to-all
            return [(x, y)]
        return [(lists[n][h.src], lists[n][h.dst]) for h in inner.route(loc[x], loc[y])]

    a, b = node[s], node[d]
    if a == b:
        return inside(a, s, d)
    ga = lists[a][local_gateway(rule, a, b, len(lists[a]))]
    gb = lists[b][local_gateway(rule, b, a, len(lists[b]))]
    return inside(a, s, ga) + [(ga, gb)] + inside(b, gb, d)


CASES = [
    ("nodes:2x4", [[0, 1, 2, 3], [4, 5, 6, 7]], None, 0),
    ("nodes:3x2", [[0, 1], [2, 3], [4, 5]], None, 0),
    ("nodes:2x4,gw=3", [[0, 1, 2, 3], [4, 5, 6, 7]], None, 3),
    ("nodes:4x4,gw=spread", [list(range(i, i + 4)) for i in range(0, 16, 4)], None, "spread"),
    ("nodes:2x(ring:4)", [[0, 1, 2, 3], [4, 5, 6, 7]], "ring:4", 0),
    ("nodes:3x(torus:3x3),gw=spread", [list(range(i, i + 9)) for i in range(0, 27, 9)], "torus:3x3", "spread"),
    ("nodes:2x(line:3),gw=2", [[0, 1, 2], [3, 4, 5]], "line:3", 2),
]


@pytest.mark.parametrize("spec,lists,inner,rule", CASES, ids=[c[0] for c in CASES])
def test_routes_go_source_gateway_network_gateway_destination(spec, lists, inner, rule):
    t = T.parse(spec)
    inner_t = T.parse(inner) if inner else None
    assert t.kind == "nodes" and t.has_nodes and t.nodes == lists and t.size == sum(map(len, lists))
    r = t.routing()
    for s, d in itertools.product(range(t.size), repeat=2):
        hops = r.route(s, d)
        assert [(h.src, h.dst) for h in hops] == reference_route(lists, inner_t, rule, s, d), (s, d)
        network = [h for h in hops if h.link.kind == "network"]
        assert len(network) == (t.node_of(s) != t.node_of(d))  # exactly one network hop between nodes
        for h in hops:
            assert h.link.src == h.src and h.link.dst == h.dst
            assert (t.node_of(h.src) != t.node_of(h.dst)) == h.link.network  # mapped inside, network between
        assert r.hops[s, d] == len(hops)
    for a, b in itertools.permutations(range(len(lists)), 2):
        src, dst = t.gateway(a, b)
        assert src == lists[a][local_gateway(rule, a, b, len(lists[a]))]
        assert dst == lists[b][local_gateway(rule, b, a, len(lists[b]))]
        assert t.link(src, dst).network and t.link(dst, src).network
    network_links = [k for k in t.links if k.network]
    pairs = {frozenset((t.node_of(k.src), t.node_of(k.dst))) for k in network_links}
    assert len(pairs) == len(lists) * (len(lists) - 1) // 2 and len(network_links) == 2 * len(pairs)
    assert T.check(r).acyclic  # the default virtual channels are deadlock-free


@pytest.mark.parametrize("spec,lists,inner,rule", CASES, ids=[c[0] for c in CASES])
def test_two_classes_keep_hops_inside_the_destination_apart(spec, lists, inner, rule):
    t = T.parse(spec)
    lo, hi, default = T.vc_range(t)
    inner_vcs = T.vc_range(T.parse(inner))[2] if inner else 1
    assert (lo, hi) == (inner_vcs, 2 * inner_vcs)
    one_gateway = rule != "spread"
    assert default == (lo if inner is None and one_gateway else hi)
    r = t.routing(hi)
    for s, d in itertools.product(range(t.size), repeat=2):
        for h in r.route(s, d):
            if h.link.network:
                assert h.vc == 0
            elif t.node_of(h.src) == t.node_of(d):
                assert inner_vcs <= h.vc < 2 * inner_vcs  # the upper class, inside the destination's node
            else:
                assert 0 <= h.vc < inner_vcs  # toward a gateway
    assert T.check(r).acyclic


def test_spread_gateways_need_two_classes():
    """With spread gateways a link between two gateways carries hops toward a gateway and last hops: one
    class has a cycle through three nodes' network links; two classes break it."""
    t = T.parse("nodes:4x4,gw=spread")
    one = T.check(t.routing(1))
    assert not one.acyclic and sum(link.network for link, _ in one.cycle) >= 2
    assert "--vcs 2 (two classes" in one.text()
    assert T.check(t.routing(2)).acyclic
    # every ring inside a node routes with its dateline's 2 VCs: classes multiply them
    assert T.check(T.parse("nodes:2x(ring:4)").routing(4)).acyclic


@pytest.mark.parametrize("spec", ["nodes:2x4", "nodes:3x2", "nodes:4x4,gw=spread", "nodes:2x(ring:4)",
                                  "nodes:2x(torus:3x3),gw=spread"])
def test_all_to_all_traffic_completes_in_order(spec, seed):
    t = T.parse(spec)
    messages = [(s, d, 3) for s in range(t.size) for d in range(t.size) if s != d]
    for s in (None, seed):
        result = T.simulate(t, None, messages, buffer_slots=1, seed=s)
        assert result.complete, result.text()
        assert all(got == [0, 1, 2] for got in result.delivered)


def test_device_ports_say_which_links_cross_the_network():
    t = T.parse("nodes:2x4")
    ports = t.routing().port_table
    for rank in range(t.size):
        for p, port in enumerate(t.ports[rank]):
            assert ports[rank, p]["kind"] == port.kind
            assert port.kind == (T.LINK_NETWORK if t.node_of(port.peer) != t.node_of(rank) else T.LINK_MAPPED)
    assert [p.peer for p in t.ports[0] if p.kind == T.LINK_NETWORK] == [4]
    assert all(p.kind == T.LINK_MAPPED for p in t.ports[1])  # not a gateway
    # grids and graphs: every port is mapped
    assert all(p.kind == T.LINK_MAPPED for ports in T.parse("torus:3x3").ports for p in ports)


def test_job_node_lists_any_order_and_check_nodes():
    # mpirun --map-by node puts consecutive ranks on different hosts
    t = T.nodes([[0, 2, 4], [1, 3, 5]], "ring:3")
    assert t.nodes == [[0, 2, 4], [1, 3, 5]] and t.gateway(0, 1) == (0, 1) and t.gateway(1, 0) == (1, 0)
    assert [(h.src, h.dst) for h in t.routing().route(2, 5)] == [(2, 0), (0, 1), (1, 5)]
    t.check_nodes([[0, 2, 4], [1, 3, 5]])
    t.check_nodes([[1, 3, 5], [0, 2, 4]])  # node order does not matter
    with pytest.raises(TopologyError, match=r"puts ranks 0,2,4 in node 0, but the job's node of rank 0 holds "
                                            r"ranks 0-2 \(declared by X\)"):
        t.check_nodes([[0, 1, 2], [3, 4, 5]], "declared by X")
    with pytest.raises(TopologyError, match="has 6 ranks, but the job has 4"):
        t.check_nodes([[0, 1], [2, 3]])
    assert T.nodes(2, 4).name == "nodes:2x4" and T.nodes([[0, 1], [2, 3]]).name == "nodes:2x2"
    assert T.nodes(2, 3, gateway=[2, 1]).gateway(0, 1) == (2, 4)
    plain = T.parse("torus:4x4")
    assert plain.nodes == [list(range(16))] and not plain.has_nodes and plain.gateways() == []
    plain.check_nodes([list(range(16))])


def test_nodes_from_files_json_and_edge_list_agree(tmp_path):
    doc = {"name": "two-hosts",
           "nodes": [{"name": "g0", "node": "host0"}, {"name": "g1", "node": "host0"},
                     {"name": "g2", "node": "host1"}, {"name": "g3", "group": "host1"}],
           "links": [["g0", "g1"], ["g2", "g3"], {"a": "g1", "b": "g2", "kind": "network"}]}
    (tmp_path / "net.json").write_text(json.dumps(doc))
    (tmp_path / "net.txt").write_text("g0 node=host0\ng1 node=host0\ng2 node=host1\ng3 node=host1\n"
                                      "g0 g1\ng2 g3 kind=nvlink\ng1 g2 kind=network\n")
    for path in ("net.json", "net.txt"):
        t = T.parse(str(tmp_path / path))
        assert t.kind == "nodes" and t.nodes == [[0, 1], [2, 3]] and t.node_names == ["host0", "host1"]
        assert t.gateway(0, 1) == (1, 2) and t.gateway(1, 0) == (2, 1) and t.gateways() == [1, 2]
        assert [(h.src, h.dst, h.link.kind) for h in t.routing().route(0, 3)][1] == (1, 2, "network")
        assert t.groups() == {"host0": [0, 1], "host1": [2, 3]} and t.group(3) == "host1"
        assert T.check(t).acyclic
    # a network link may name its transport (else the registry chooses one by capability)
    named = T.from_edge_list("a node=x\nb node=y\na b kind=network transport=mpi\n")
    assert {(k.src, k.dst, k.transport) for k in named.links} == {(0, 1, "mpi"), (1, 0, "mpi")}
    # several network links between two nodes: the lowest (a, b) carries the traffic
    t = T.from_edge_list("a node=x\nb node=x\nc node=y\nd node=y\na b\nc d\nb d kind=network\na c kind=network\n")
    assert t.gateway(0, 1) == (0, 2) and t.gateway(1, 0) == (2, 0) and t.gateways() == [0, 1, 2, 3]


BAD_STRINGS = [
    ("nodes:0x4", "needs at least 1 node, got 0"),
    ("nodes:2x0", "a node needs at least 1 rank, got 0"),
    ("nodes:2y4", "malformed topology 'nodes:2y4': expected nodes:NxK or nodes:Nx(INNER)"),
    ("nodes:2x()", "empty topology inside the parentheses"),
    ("nodes:2x(tree:4)", "nodes:2x(tree:4): inside a node: unknown topology kind 'tree'"),
    ("nodes:2x(nodes:2x2)", "a topology of nodes (nodes:2x2) cannot sit inside a node"),
    ("nodes:2x4,gw=4", "node 0 has no local rank 4 for its gateway (it has 4 ranks: 0..3)"),
    ("nodes:2x4,gw=x", "gw='x': a gateway is a local rank (gw=0) or gw=spread"),
    ("nodes:2x4,gw=", "malformed topology"),
    ("nodes:64x32", "has 2048 ranks; circuslink routes at most 1024"),
    ("full:0", "full:0: a full topology needs at least 1 rank"),
]


@pytest.mark.parametrize("text,message", BAD_STRINGS, ids=[b[0] for b in BAD_STRINGS])
def test_bad_node_strings(text, message):
    with pytest.raises(TopologyError, match=_re(message)):
        T.parse(text)


BAD_FILES = [
    ("half.json", {"nodes": [{"name": "a", "node": "h0"}, "b"], "links": [["a", "b"]]},
     "'b' (rank 1) has no node while others have one: give every rank its node"),
    ("both.json", {"nodes": [{"name": "a", "node": "h0", "group": "h0"}], "links": []},
     "nodes[0]: give 'node' or 'group' (its older name), not both"),
    ("inside.json", {"nodes": [{"name": "a", "node": "h0"}, {"name": "b", "node": "h0"}],
                     "links": [{"a": "a", "b": "b", "kind": "network"}]},
     "links[0]: link a-b has kind=network but both ranks are in node h0"),
    ("across.json", {"nodes": [{"name": "a", "node": "h0"}, {"name": "b", "node": "h1"}],
                     "links": [{"a": "a", "b": "b", "kind": "ethernet"}]},
     "links[0]: link a-b joins node h0 and node h1 but has kind=ethernet: a transport between nodes carries links "
     "between nodes (write kind=network)"),
    ("named.txt", "a node=h0\nb node=h0\na b kind=nvlink transport=mpi\n",
     "named.txt:3: link a-b names transport=mpi but has kind=nvlink: a transport is named on links between nodes "
     "(kind=network) only"),
    ("unknown.json", {"nodes": [{"name": "a", "node": "h0"}, {"name": "b", "node": "h1"}],
                      "links": [{"a": "a", "b": "b", "kind": "network", "transport": "ucx"}]},
     "links[0]: link a-b: unknown transport 'ucx' (choose one of ipc, mpi, nvshmem"),
    ("nonodes.json", {"nodes": ["a", "b"], "links": [{"a": "a", "b": "b", "kind": "network"}]},
     "link a-b has kind=network, which joins nodes, but no rank names its node"),
    ("nogw.json", {"nodes": [{"name": "a", "node": "h0"}, {"name": "b", "node": "h1"},
                             {"name": "c", "node": "h2"}],
                   "links": [{"a": "a", "b": "b", "kind": "network"}, {"a": "b", "b": "c", "kind": "network"}]},
     "node h0 has no gateway to node h2: no network link from a rank of h0 to a rank of h2"),
    ("two.txt", "a node=h0\nb node=h1\na node=h1\na b kind=network\n", "two.txt:3: node 'a' is in two nodes: h0 ("),
    ("opt.txt", "a b node=h0\n", "'node=' goes on a line of its own"),
    ("empty.txt", "a node=\n", "node= needs a name"),
    ("badopt.txt", "a weight=3\n", "unknown option 'weight' (known: node)"),
]


@pytest.mark.parametrize("name,content,message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_node_files(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(json.dumps(content) if isinstance(content, dict) else content)
    with pytest.raises(TopologyError, match=_re(message)):
        T.load(str(path))


def test_bad_python_layouts_and_virtual_channels():
    for layout, message in [([[0, 1], [1, 2]], "rank 1 is in two nodes (node 0 and node 1)"),
                            ([[0, 1], [3]], "rank 2 is in no node"),
                            ([[0], []], "node 1 has no ranks")]:
        with pytest.raises(TopologyError, match=_re(message)):
            T.nodes(layout)
    with pytest.raises(TopologyError, match=_re("3 gateways for 2 nodes")):
        T.nodes(2, 4, gateway=[0, 1, 2])
    with pytest.raises(TopologyError, match=_re("node 1 has 3 ranks but the topology inside nodes, ring:2, has 2")):
        T.nodes([[0, 1], [2, 3, 4]], "ring:2")
    with pytest.raises(TopologyError, match=_re("give the ranks per node or the topology inside a node")):
        T.nodes(2)
    with pytest.raises(TopologyError, match=_re("3 virtual channels: a topology of nodes uses 2 (one class: "
                                                "ring:4's 2 inside every node) or 4 (two classes")):
        T.parse("nodes:2x(ring:4)").routing(3)
    t = T.parse("nodes:2x4")
    with pytest.raises(TopologyError, match=_re("source node 2 is outside 0..1 (2 nodes)")):
        t.gateway(2, 0)
    with pytest.raises(TopologyError, match=_re("a route inside node 1 takes no gateway")):
        t.gateway(1, 1)


def _re(text: str) -> str:
    import re

    return re.escape(text)


# ---- the command --------------------------------------------------------------------------------

def route(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["route", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_route_show_prints_kinds_nodes_and_gateways(capsys):
    code, out, _ = route(capsys, "show", "nodes:2x4")
    assert code == 0
    assert ("nodes:2x4: 8 ranks, 13 bidirectional links (direct, network); 2 nodes of 4 ranks (full:4 inside; "
            "gateways: local rank 0 of each node): node 0 = ranks 0-3 (gateway 0), node 1 = ranks 4-7 (gateway 4)"
            in out)
    assert "rank 0 [node 0, gateway to node 1]: neighbours 1 (p0), 2 (p1), 3 (p2), 4 (p3, network)" in out
    assert "rank 5 [node 1]: neighbours 4 (p0), 6 (p1), 7 (p2)" in out
    lines = out.splitlines()
    rank1 = lines.index("rank 1 [node 0]: neighbours 0 (p0), 2 (p1), 3 (p2)")
    assert lines[rank1 + 1].split() == ["dst", "next", "port", "vc", "hops", "kind"]
    assert lines[rank1 + 5].split() == ["4", "0", "p0", "0", "2", "mapped"]
    rank0 = next(i for i, line in enumerate(lines) if line.startswith("rank 0 "))
    assert lines[rank0 + 5].split() == ["4", "4", "p3", "0", "1", "network"]
    assert lines[rank0 + 6].split() == ["5", "4", "p3", "0", "2", "network"]
    code, out, _ = route(capsys, "show", "nodes:2x(ring:4)", "--from", "1", "--to", "6")
    assert code == 0 and "rank 1 -> rank 6: 4 hops" in out
    assert "  hop 2: 0 -> 4  link 2 0->4 (network)  port p2  vc 0  network  node 0" in out
    assert "  hop 3: 4 -> 5  link 10 4->5  port p1  vc 2  mapped  node 1" in out
    code, out, _ = route(capsys, "show", "nodes:2x4", "--json")
    data = json.loads(out)
    assert data["nodes"] == [{"name": "node0", "ranks": [0, 1, 2, 3], "gateways": [0]},
                             {"name": "node1", "ranks": [4, 5, 6, 7], "gateways": [4]}]
    assert {"from_node": 0, "to_node": 1, "src": 0, "dst": 4} in data["network_hops"]
    assert {(k["src"], k["dst"]) for k in data["links"] if k["carrier"] == "network"} == {(0, 4), (4, 0)}


def test_route_check_on_nodes(capsys):
    code, out, _ = route(capsys, "check", "nodes:4x4,gw=spread")
    assert code == 0 and out.startswith("acyclic: nodes:4x4,gw=spread with 2 virtual channels (2 classes")
    code, out, _ = route(capsys, "check", "nodes:4x4,gw=spread", "--vcs", "1")
    assert code == 1 and "(network) vc 0" in out and "hint: --vcs 2 (two classes" in out
    code, out, err = route(capsys, "check", "nodes:2x(ring:4)", "--vcs", "3")
    assert code == 2 and "3 virtual channels: a topology of nodes uses 2" in err
    code, out, err = route(capsys, "show", "nodes:2x4,gw=9")
    assert code == 2 and err.count("\n") == 1 and "node 0 has no local rank 9 for its gateway" in err


def test_tables_for_a_big_machine_are_fast_and_consistent():
    """Cygnus-like 32 nodes x 2 and 8 x 8 with spread gateways: full tables, every route checked by walking."""
    for spec in ("nodes:32x2", "nodes:8x8,gw=spread"):
        t = T.parse(spec)
        r = t.routing()
        assert T.check(r).acyclic
        n = t.size
        node = np.array([t.node_of(x) for x in range(n)])
        cross = node[:, None] != node[None, :]
        assert (r.hops[cross] >= 1).all() and (r.hops[cross] <= 3).all() and (r.hops[~cross] <= 1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["nodes:2x4", "nodes:3x(ring:3),gw=spread"])
def test_device_agents_see_network_hops_gpu(spec):
    """A kernel reads its rank's row of the table and the port table: network hops are exactly the hops whose
    link kind is network (route::crosses_network), deliveries exactly the diagonal."""
    from pathlib import Path

    import cupy as cp

    import circuslink as cl

    t = T.parse(spec)
    r = t.routing()
    module = cl.compile((Path(__file__).with_name("kernels") / "route_kinds.cu").read_text())
    entries = cp.asarray(r.table.view(np.uint8))
    ports = cp.asarray(r.port_table.view(np.uint8))
    row_bytes, port_row = r.table.dtype.itemsize * t.size, r.port_table.dtype.itemsize * r.port_table.shape[1]
    for rank in range(t.size):
        action = cp.full(t.size, -1, dtype=cp.int32)
        nxt = cp.full(t.size, -1, dtype=cp.int32)
        handle = r.device_handle(rank, entries.data.ptr + rank * row_bytes, ports.data.ptr + rank * port_row)
        module.get_function("route_kinds")((1,), (128,), (handle, action, nxt))
        got, want_next = action.get(), nxt.get()
        for dst in range(t.size):
            if dst == rank:
                assert got[dst] == 2
                continue
            hop = r.route(rank, dst)[0]
            assert got[dst] == int(hop.link.network) and want_next[dst] == hop.dst, (rank, dst)
