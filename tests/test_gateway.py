"""Gateway-routed channels: routed channels whose route crosses nodes through a relay.

In one process, :class:`RelayNet` runs every rank's forwarding agent (``channels._router_cpu.Agent``) over
plain arrays, with each relay's two rings in their own memory and a stand-in for the transport that moves
packets from a gateway's out ring into the peer gateway's in ring under the same credits (never more than the
in ring holds; out-ring slots go back once a packet has crossed). Everything is stepped in a
seeded random order: all-to-all across nodes byte for byte, routes and placements (no mapped address
crosses a node), a slow reader, a stalled receiver that holds back only its own channel, the deadlock check.
The same over MPI, as jobs, is tests/test_gateway_jobs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_routed import all_to_all, drive, random_messages

from circuslink import ConfigError
from circuslink import topology as T
from circuslink.channels import _routed as R
from circuslink.channels import protocol as P
from circuslink.channels._cpu import CpuReceiver, CpuSender
from circuslink.channels._plan import Plan
from circuslink.channels._router_cpu import Agent
from circuslink.transport._rings import PacketReader, PacketWriter, Ring, relay_layouts


class FakeProxy:
    """The transport of one relay a <-> b, in one process: packets of a's out ring land in b's in
    ring (and back), in order, headers unchanged, never more in flight than the in ring has room for."""

    def __init__(self, out_ring: Ring, in_ring: Ring, batch: int) -> None:
        self.out = PacketReader(out_ring)
        self.into = PacketWriter(in_ring)
        self.batch = batch
        self.moved = 0

    def step(self) -> int:
        moved = 0
        while moved < self.batch and self.out.poll() and self.into.free() > 0:
            seq = self.out.seq
            route, word = self.out.header(seq)
            n = word & 0xFFFFFF
            if word & P.KIND_BULK:
                self.into.write_bulk_payload(seq, np.frombuffer(self.out.payload(seq), np.uint8))
                self.into.publish_bulk(seq, route, word)
            else:
                self.into.write_ll(seq, route, word, self.out.ll_words(seq, n).copy())
            self.into.seq = self.out.seq = seq + 1
            self.out.release(self.out.seq)
            moved += 1
        self.moved += moved
        return moved


class RelayNet:
    """Every rank of a topology of nodes in this process: symmetric buffers, relays, agents, ends."""

    def __init__(self, topo: str, links: list, *, vcs=None, link_slots=2, relay_slots=2, batch=1,
                 ll_max: int = 512, report_after: float = 0.0) -> None:
        self.topo = T.parse(topo)
        self.links = links
        opts = {link.name: {"ll_max": ll_max} for link in links}
        self.plan = Plan(links, opts, self.topo, vcs, False, link_slots, relay_slots)
        router = self.plan.router
        n = self.topo.size
        self.bufs = [np.zeros(self.plan.nbytes, np.uint8) for _ in range(n)]
        self.relay: dict[tuple[int, int], np.ndarray] = {}  # (rank, peer) -> that relay's memory at rank
        self.proxies: list[FakeProxy] = []
        if router is not None and router.relay_pairs:
            geo = router.relay_geometry
            out_lay, in_lay, stride = relay_layouts(geo)
            for a, b in router.relay_pairs:
                self.relay[(a, b)] = np.zeros(stride, np.uint8)
                self.relay[(b, a)] = np.zeros(stride, np.uint8)
            for (a, b), mem in self.relay.items():
                self.proxies.append(FakeProxy(Ring(mem, out_lay, geo), Ring(self.relay[(b, a)], in_lay, geo), batch))
        self.touched: dict[int, set] = {r: set() for r in range(n)}  # rank -> addresses its agent was given

        def view_of(me: int):
            def view(rank, offset, nbytes):
                peer = R.relay_peer((rank, offset))
                self.touched[me].add(("relay", peer) if peer is not None else rank)
                if peer is not None:
                    return self.relay[(me, peer)][offset:offset + nbytes]
                return self.bufs[rank][offset:offset + nbytes]
            return view

        self.agents = [Agent(router.agent(r), view_of(r), 5.0, report_after) for r in range(n)] if router else []
        self.tx, self.rx = {}, {}
        for link, geo, lay in self.plan.entries:
            for kind in ("send", "recv"):
                w = R.placement(link, lay, kind, self.plan.routed_of(link))
                ring = self.bufs[w.ring[0]][w.ring[1]:w.ring[1] + geo.ring_bytes]
                credit = self.bufs[w.credit[0]][w.credit[1]:w.credit[1] + 8].view("<u8")
                slots = self.bufs[w.slot_credits[0]][w.slot_credits[1]:w.slot_credits[1] + 4 * geo.nslots].view("<u4")
                args = (link.name, link.name, 0, geo, ring, credit, slots, np.zeros(4, "<u4"), 1.0,
                        P.route_of(link.recv_id, link.dst_rank))
                (self.tx if kind == "send" else self.rx)[link.name] = (CpuSender if kind == "send" else CpuReceiver)(
                    *args)

    class _Stepper:
        """What ``drive`` steps: the agents and the proxies, as one list."""

        def __init__(self, net: RelayNet) -> None:
            self.items = net.agents + net.proxies

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int):
            return self.items[i]

    def driven(self):
        """A view of this net for ``test_routed.drive``: its ``agents`` step the proxies too."""
        view = type("Driven", (), {})()
        view.agents, view.tx, view.rx = self._Stepper(self), self.tx, self.rx
        return view

    def chain(self, rank: int, offset: int) -> R.Chain:
        return R.decode_chain(self.bufs[rank][offset:offset + R.CHAIN_BYTES].view("<u4"))


def _nodes_of(t) -> dict[int, int]:
    return {r: i for i, ranks in enumerate(t.nodes) for r in ranks}


@pytest.mark.parametrize("topo,vcs", [("nodes:2x2", None), ("nodes:3x2", None), ("nodes:2x(ring:4)", None),
                                      ("nodes:3x3,gw=spread", None), ("nodes:2x3,gw=2", None)])
def test_all_to_all_across_nodes_every_byte(topo, vcs, rng):
    """Every rank sends to every other several messages of random sizes (low-latency and bulk packets mixed)
    through link rings and relay rings of 2 slots; every channel delivers its bytes exactly, in order, and
    every packet between nodes crossed a relay."""
    t = T.parse(topo)
    links = all_to_all(t.size)
    net = RelayNet(topo, links, vcs=vcs)
    node = _nodes_of(t)
    crossing = [link for link in links if node[link.src_rank] != node[link.dst_rank]]
    assert crossing and all(net.plan.routed_of(link) for link in crossing)
    outcome, got, want = drive(net.driven(), random_messages(links, rng, 4), rng, patience=200)
    assert outcome == "complete"
    assert all(got[k] == want[k] for k in want)
    assert all(p.moved > 0 for p in net.proxies)


def test_routes_through_gateways_map_nothing_across_nodes():
    """On nodes:2x2 (gateways 0 and 2) and nodes:3x2: where the sender is a gateway its own agent drains the
    injection ring (first is the sender), where the receiver is the landing gateway its own agent delivers
    (last is the receiver); no mapped hop is added; every address an agent or an end uses is its own rank's,
    a mapped neighbour's in its node, or its own relay's; relays are opened only where routes
    cross."""
    t = T.parse("nodes:2x2")
    plan = Plan(all_to_all(4), {}, t, None, False, None)
    path = {(r.link.src_rank, r.link.dst_rank): r.path for r in plan.router.routed}
    assert set(path) == {(a, b) for a in range(4) for b in range(4) if a // 2 != b // 2}  # 0-1, 2-3 stay direct
    assert path[(1, 3)].ranks == (1, 0, 2, 3) and (path[(1, 3)].first, path[(1, 3)].last) == (0, 2)
    assert path[(0, 3)].ranks == (0, 2, 3) and (path[(0, 3)].first, path[(0, 3)].last) == (0, 2)
    assert path[(1, 2)].ranks == (1, 0, 2) and (path[(1, 2)].first, path[(1, 2)].last) == (0, 2)
    assert path[(0, 2)].ranks == (0, 2) and (path[(0, 2)].first, path[(0, 2)].last) == (0, 2)
    assert [h.link.network for h in path[(0, 2)].shared_hops] == [True]
    assert plan.router.relay_pairs == [(0, 2)]
    for topo in ("nodes:2x2", "nodes:3x2", "nodes:2x(ring:4)"):
        t = T.parse(topo)
        plan = Plan(all_to_all(t.size), {}, t, None, False, None)
        node = _nodes_of(t)
        for rank in range(t.size):
            mapped = set(R.mapped_neighbours(t, rank)) | {rank}
            assert all(node[m] == node[rank] for m in mapped)
            a = plan.router.agent(rank)
            addrs = [x for i in a.inputs for x in (i.ring, i.credit, i.slot_credit, i.chain) if x]
            addrs += [x for o in a.outputs if o for x in (o.ring, o.credit, o.down_chain)]
            addrs += [x for c in a.channels if c for x in (c.ring, c.board) if x]
            relayed = {R.relay_peer(x) for x in addrs if R.relay_peer(x) is not None}
            assert relayed == set(plan.router.relay_peers(rank))
            assert all(node[p] != node[rank] for p in relayed)
            assert {r for r, _ in addrs if r >= 0} <= mapped, (topo, rank)
        for link, _, lay in plan.entries:
            for kind, rank in (("send", link.src_rank), ("recv", link.dst_rank)):
                w = R.placement(link, lay, kind, plan.routed_of(link))
                assert {w.ring[0], w.credit[0], w.slot_credits[0]} <= set(R.mapped_neighbours(t, rank)) | {rank}
    # without channels between nodes no relay is opened
    inside = Plan(all_to_all(4, pairs=[(0, 1), (3, 2)]), {}, T.parse("nodes:2x2"), None, False, None)
    assert inside.router is None
    # relay ring shape: the largest routed chunk, so an agent never splits a packet
    big = Plan(all_to_all(4, depth=1 << 20), {}, T.parse("nodes:2x2"), None, False, None, 16)
    assert big.router.relay_geometry.chunk == big.router.link_chunk == 64 << 10
    assert big.router.relay_geometry.nslots == 16


def test_a_slow_reader_across_a_relay_loses_nothing(rng):
    """nodes:2x2, every rank to every rank of the other node; the readers take what arrived only every fifth
    round and relay rings hold 2 packets: the writers are held back (end-to-end credits), nothing is lost."""
    links = all_to_all(4, depth=2048, pairs=[(a, b) for a in range(4) for b in range(4) if a // 2 != b // 2])
    net = RelayNet("nodes:2x2", links)
    messages = random_messages(links, rng, 6, most=2000)  # each message fits its ring (depth 2048)
    sent = {k: 0 for k in messages}
    got = {k: bytearray() for k in messages}
    want = {k: b"".join(v) for k, v in messages.items()}
    held = 0
    steppers = net.agents + net.proxies
    for rounds in range(20000):
        for name, msgs in messages.items():
            i = sent[name]
            tx = net.tx[name]
            if i < len(msgs):
                _, sizes = P.split_write(len(msgs[i]), tx.geo)
                if tx.seq + len(sizes) <= int(tx.credit[0]) + tx.geo.nslots:
                    tx.write_bytes(msgs[i])
                    sent[name] += 1
                else:
                    held += 1
        for k in rng.permutation(len(steppers)):
            steppers[k].step()
        if rounds % 5 == 0:
            for name in messages:
                rx = net.rx[name]
                while True:
                    head = rx._slot(rx.seq) // 4
                    if int(rx.words[head + 3]) != P.flag_of(rx.seq):
                        break
                    got[name] += rx.read_bytes((int(rx.words[head + 2]) & P.NBYTES_MASK) - rx.offset)
        if all(got[k] == want[k] for k in want):
            break
    assert all(got[k] == want[k] for k in want)
    assert held > 0  # the writers did wait for credits


def test_a_stalled_receiver_holds_back_only_its_own_channel_across_a_relay(rng):
    """nodes:2x2: channels 1->3 (route 1, 0, 2, 3) and 0->3 (0, 2, 3) share the relay 0->2; 1->3's receiver
    never reads. 0->3 still delivers every byte; 1->3's packets wait in its own injection ring at rank 0, with
    a chain that says its receiver has not read (end-to-end credits); the relay rings are drained."""
    links = all_to_all(4, pairs=[(1, 3), (0, 3)])
    net = RelayNet("nodes:2x2", links)
    messages = random_messages(links, rng, 20)
    outcome, got, want = drive(net.driven(), messages, rng, readers={"c0_3"}, patience=200)
    assert outcome == "complete" and got["c0_3"] == want["c0_3"]
    for _ in range(3):
        drive(net.driven(), {}, rng, patience=4)
        for a in net.agents:
            a._publish_chains(float("inf"))
    r = net.plan.routed_of(links[0])
    assert (r.path.first, r.path.last) == (0, 2)
    chain = net.chain(0, r.lay.chain)
    assert chain.flags & R.CHAIN_GATE and chain.count == 1
    text = R.describe_chain(chain, net.plan.router, r, 0)
    assert "its packets wait at rank 0 for its receiver on rank 3 to read (end-to-end credits" in text
    for p in net.proxies:  # nothing of the stalled channel sits in a relay ring
        assert p.out.seq == p.into.seq and int(p.into.r.credit[0]) == p.into.seq
    for a in net.agents:
        for o in a.outputs:
            if o is not None:
                assert int(o.credit[0]) == o.seq


def test_a_head_blocked_on_a_relay_names_the_link(rng):
    """nodes:2x2, 1 -> 3 while the proxies are stopped: the packets wait at rank 0 in the channel's injection
    ring for room in the relay 0->2, and the chain record says so (it ends there: the landing side is
    another node's memory)."""
    links = all_to_all(4, pairs=[(1, 3)])
    net = RelayNet("nodes:2x2", links)
    messages = random_messages(links, rng, 10)
    for _ in range(200):
        for name, msgs in messages.items():
            tx = net.tx[name]
            if msgs and tx.seq < int(tx.credit[0]) + tx.geo.nslots - 3:
                tx.write_bytes(msgs.pop(0))
        for a in net.agents:
            a.step()
    for a in net.agents:
        a._publish_chains(float("inf"))
    r = net.plan.routed_of(links[0])
    text = R.describe_chain(net.chain(0, r.lay.chain), net.plan.router, r, 0)
    assert text == "its packets wait at rank 0 in the injection ring of channel c1_3 for room in 0->2 (network) vc 0"


@pytest.mark.parametrize("topo", ["nodes:2x2", "nodes:3x2", "nodes:2x(ring:4)", "nodes:4x4,gw=spread"])
def test_routed_buffers_across_nodes_are_acyclic(topo):
    """The buffers routed channels use, relays included, have no cycle with the default virtual
    channels (what open() checks); the relays are nodes of that graph."""
    t = T.parse(topo)
    plan = Plan(all_to_all(t.size), {}, t, None, False, None)
    nodes, _ = plan.router.dependencies()
    relay_ids = {k.id * plan.router.vcs for k in t.links if k.network}
    assert relay_ids & set(nodes.tolist())
    assert plan.router.cycle() == []


def test_bad_relay_options_are_one_line():
    from circuslink import channels

    class W:  # open() refuses these before any collective call
        size = 4

    for relay, message in [({"nslots": 3}, "relay nslots 3 must be a power of two in 2..65536"),
                           ({"batch": 0}, r"relay batch 0 must be a number of packets in 1..nslots \(64\)"),
                           ({"depth": 2}, r"relay: unknown option\(s\) depth \(expected nslots, batch, spin\)"),
                           ([1], "relay must be a mapping")]:
        with pytest.raises(ConfigError, match=message):
            channels._relay_options(relay)
    assert channels._relay_options(None) == {"nslots": 64, "batch": None, "spin": False}
