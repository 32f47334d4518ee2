"""Routed channels on the cpu back-end: forwarding agents, end-to-end credits, deadlock behaviour.

Two levels. In one process, :class:`Net` runs every rank's agent (``channels._router_cpu.Agent``) over plain
arrays, with the reference endpoints (``CpuSender`` / ``CpuReceiver``) at the channel ends, stepped in a
seeded random order: deterministic, fast, and able to stop in a deadlock and look at it. As jobs (spmd), the
public API: ``channels.open(world, links, topology=...)`` with host write/read on ranks that map only their
neighbours. Every byte is checked against seeded random inputs; ``topology.simulate`` is the model (every
packet once, in order, per channel; a cycle of full buffers when the routing allows one).
"""

from __future__ import annotations

import numpy as np
import pytest

from circuslink import ConfigError
from circuslink import topology as T
from circuslink.channels import Link, element_type
from circuslink.channels import _routed as R
from circuslink.channels import protocol as P
from circuslink.channels._cpu import CpuReceiver, CpuSender
from circuslink.channels._plan import Plan
from circuslink.channels._router_cpu import Agent, report_due

BYTE = element_type("uchar")


def all_to_all(n: int, depth: int = 8192, pairs=None) -> list[Link]:
    pairs = pairs or [(a, b) for a in range(n) for b in range(n) if a != b]
    return [Link(f"c{a}_{b}", f"c{a}_{b}_in", 2 * k, 2 * k + 1, a, b, BYTE, depth) for k, (a, b) in enumerate(pairs)]


class Net:
    """Every rank of a topology in this process: buffers, agents and channel ends."""

    def __init__(self, topo: str, links: list[Link], *, vcs=None, allow_cycles=False, link_slots=None,
                 ll_max: int = 512, report_after: float = 0.0) -> None:
        self.topo = T.parse(topo)
        self.links = links
        opts = {link.name: {"ll_max": ll_max} for link in links}
        self.plan = Plan(links, opts, self.topo, vcs, allow_cycles, link_slots)
        n = self.topo.size
        self.bufs = [np.zeros(self.plan.nbytes, np.uint8) for _ in range(n)]

        def view(rank, offset, nbytes):
            return self.bufs[rank][offset:offset + nbytes]

        router = self.plan.router
        self.agents = [Agent(router.agent(r), view, 5.0, report_after) for r in range(n)] if router else []
        self.tx, self.rx = {}, {}
        for link, geo, lay in self.plan.entries:
            for kind in ("send", "recv"):
                w = R.placement(link, lay, kind, self.plan.routed_of(link))
                ring = view(*w.ring, geo.ring_bytes)
                credit = view(*w.credit, 8).view("<u8")
                slots = view(*w.slot_credits, 4 * geo.nslots).view("<u4")
                args = (link.name, link.name, 0, geo, ring, credit, slots, np.zeros(4, "<u4"), 1.0,
                        P.route_of(link.recv_id, link.dst_rank))
                (self.tx if kind == "send" else self.rx)[link.name] = (CpuSender if kind == "send" else CpuReceiver)(
                    *args)

    def chain(self, rank: int, offset: int) -> R.Chain:
        return R.decode_chain(self.bufs[rank][offset:offset + R.CHAIN_BYTES].view("<u4"))


def _ready_bytes(rx: CpuReceiver) -> int:
    """Bytes of the receiver's next packet that have arrived (0: none): a read of them never waits."""
    head = rx._slot(rx.seq) // 4
    if int(rx.words[head + 3]) != P.flag_of(rx.seq):
        return 0
    return (int(rx.words[head + 2]) & P.NBYTES_MASK) - rx.offset


def _can_write(tx: CpuSender, nbytes: int) -> bool:
    _, sizes = P.split_write(nbytes, tx.geo)
    return tx.seq + len(sizes) <= int(tx.credit[0]) + tx.geo.nslots


def drive(net: Net, messages: dict[str, list[bytes]], rng, readers: set[str] | None = None, patience: int = 60,
          whole: bool = False):
    """Write every message (each when its ring has room), step the agents in a random order, read whatever
    arrived (``whole``: a message only once all its packets are there, as try_read does); until everything is
    read ("complete") or nothing moves for ``patience`` rounds ("stall")."""
    sent = {k: 0 for k in messages}
    taken = {k: 0 for k in messages}
    got = {k: bytearray() for k in messages}
    want = {k: b"".join(v) for k, v in messages.items()}
    readers = set(messages) if readers is None else readers
    idle = rounds = 0
    while True:
        moved = 0
        for name, msgs in messages.items():
            i = sent[name]
            if i < len(msgs) and _can_write(net.tx[name], len(msgs[i])):
                net.tx[name].write_bytes(msgs[i])
                sent[name] += 1
                moved += 1
        for r in rng.permutation(len(net.agents)):
            moved += net.agents[r].step()
        for name in readers:
            rx = net.rx[name]
            while whole and taken[name] < len(messages[name]):
                n = len(messages[name][taken[name]])
                packets = len(P.split_write(n, rx.geo)[1])
                if _ready_packets(rx, packets) < packets:
                    break
                got[name] += rx.read_bytes(n)
                taken[name] += 1
                moved += 1
            while not whole and (k := _ready_bytes(rx)):
                got[name] += rx.read_bytes(k)
                moved += 1
        rounds += 1
        if all(got[k] == want[k] for k in readers) and all(sent[k] == len(messages[k]) for k in readers):
            return "complete", got, want
        idle = idle + 1 if not moved else 0
        if idle > patience:
            return "stall", got, want


def random_messages(links, rng, count: int, most: int = 3000) -> dict[str, list[bytes]]:
    return {link.name: [rng.integers(0, 256, int(rng.integers(1, most)), dtype=np.uint8).tobytes()
                        for _ in range(count)] for link in links}


@pytest.mark.parametrize("topo,vcs", [("line:4", None), ("torus:3x3", None), ("torus:3x3", 1), ("ring:8", None),
                                      ("torus:4x4", None), ("mesh:3x2", None)])
def test_all_to_all_in_process_every_byte(topo, vcs, rng):
    """Every rank sends to every other several messages of random sizes (low-latency and bulk packets mixed)
    through link rings of 2 slots; every channel delivers its bytes exactly, in order."""
    t = T.parse(topo)
    links = all_to_all(t.size)
    net = Net(topo, links, vcs=vcs, link_slots=2)
    routed = [link for link in links if net.plan.routed_of(link)]
    assert routed and all(link.dst_rank not in t.neighbours(link.src_rank) for link in routed)
    for link in routed:  # each routed channel follows the routing tables hop by hop
        path = net.plan.routed_of(link).path
        assert [h.src for h in path.hops] + [link.dst_rank] == list(path.ranks)
        assert path.hops == tuple(t.routing(vcs).route(link.src_rank, link.dst_rank))
    outcome, got, want = drive(net, random_messages(links, rng, 5), rng)
    assert outcome == "complete"
    assert all(got[k] == want[k] for k in want)


def test_all_to_all_with_whole_message_calls_every_byte(rng):
    """torus:4x4 all-to-all as the GPU exchange kernel runs it (tests/test_routed_gpu.py): channels of 4096 bytes,
    link rings of 4 slots, and ends that only ever move whole messages (a write when the credits for all its
    packets are there, a read when all its packets have arrived: try_write / try_read). Every message fits its
    ring, so such calls always go eventually; the agents deliver every byte."""
    links = all_to_all(16, depth=4096)
    net = Net("torus:4x4", links, link_slots=4, ll_max=P.LL_MAX_DEFAULT)
    messages = random_messages(links, rng, 6)
    for link, geo, _ in net.plan.entries:
        assert max(len(P.split_write(len(m), geo)[1]) for m in messages[link.name]) <= geo.nslots
    outcome, got, want = drive(net, messages, rng, whole=True)
    assert outcome == "complete"
    assert all(got[k] == want[k] for k in want)


def test_every_rank_maps_only_its_neighbours():
    """Every address an agent or an end of a routed channel uses is its own rank's or a neighbour's."""
    t = T.parse("torus:4x4")
    links = all_to_all(16)
    plan = Plan(links, {}, t, None, False, None)
    for rank in range(16):
        ok = set(t.neighbours(rank)) | {rank}
        a = plan.router.agent(rank)
        addrs = [x for i in a.inputs for x in (i.ring, i.credit, i.slot_credit, i.chain) if x]
        addrs += [x for o in a.outputs if o for x in (o.ring, o.credit, o.down_chain)]
        addrs += [x for c in a.channels if c for x in (c.ring, c.board) if x]
        assert {r for r, _ in addrs} <= ok, rank
    for link, _, lay in plan.entries:
        for kind, rank in (("send", link.src_rank), ("recv", link.dst_rank)):
            w = R.placement(link, lay, kind, plan.routed_of(link))
            assert {w.ring[0], w.credit[0], w.slot_credits[0]} <= set(t.neighbours(rank)) | {rank}


def test_unsafe_ring_deadlocks_and_the_chain_names_the_cycle(rng):
    """ring:8 with 1 virtual channel: every rank sends 4 hops forward (0->4, 1->5, ...) through link rings of 2
    slots. The routing can deadlock, so open() refuses it unless allow_cycles=True; run anyway, the link rings
    fill into a cycle, and the chain the agents publish names its (link, vc) buffers: the +x ring. With the
    default dateline virtual channels the same traffic completes."""
    links = all_to_all(8, pairs=[(r, (r + 4) % 8) for r in range(8)])
    with pytest.raises(ConfigError, match=r"can deadlock: these \(link, vc\) buffers can wait on each other in a "
                                          r"cycle: .*allow_cycles=True"):
        Net("ring:8", links, vcs=1, link_slots=2)
    messages = random_messages(links, rng, 12)
    net = Net("ring:8", links, vcs=1, allow_cycles=True, link_slots=2)
    outcome, _, _ = drive(net, messages, np.random.default_rng(0))
    assert outcome == "stall"
    for _ in range(10):  # the chains travel one hop per publication
        for a in net.agents:
            a._publish_chains(float("inf"))
    plan = net.plan.router
    texts = []
    for link in links:
        r = net.plan.routed_of(link)
        chain = net.chain(r.path.first, r.lay.chain)
        if chain.count:
            assert chain.cycle_start >= 1
            cycle = chain.entries[chain.cycle_start:]
            ids = [((e - 1) >> 4) * plan.vcs + ((e - 1) & 15) for e in cycle]
            _, edges = plan.dependencies()
            edge_set = {tuple(e) for e in edges.tolist()}
            pairs = zip(ids, ids[1:] + ids[:1], strict=True)
            assert all((a, b) in edge_set for a, b in pairs), "not a cycle of the routing"
            assert {T.parse("ring:8").links[i // plan.vcs].sign for i in ids} in ({1}, {-1})
            texts.append(R.describe_chain(chain, plan, r, r.path.first))
    assert texts and all("wait on each other in a cycle" in t and "(back to " in t for t in texts)
    assert any("1->2 (+x) vc 0" in t and "7->0 (+x, dateline) vc 0" in t for t in texts), texts[0]
    safe = Net("ring:8", links, link_slots=2)
    outcome, got, want = drive(safe, messages, np.random.default_rng(0))
    assert outcome == "complete" and got == want


def test_a_stalled_receiver_blocks_only_its_own_channel(rng):
    """line:5: channels 0->4 and 1->4 share the link rings 2->3 (and 0->4 also 1->2); 0->4's receiver never
    reads. 1->4 still delivers every byte, and 0->4's packets wait in its own injection ring, with a chain that
    says its receiver has not read (end-to-end credits), not a link."""
    links = all_to_all(5, pairs=[(0, 4), (1, 4)])
    net = Net("line:5", links, link_slots=2)
    messages = random_messages(links, rng, 20)
    outcome, got, want = drive(net, messages, rng, readers={"c1_4"})
    assert outcome == "complete" and got["c1_4"] == want["c1_4"]
    for _ in range(3):
        drive(net, {}, rng, patience=2)
        for a in net.agents:
            a._publish_chains(float("inf"))
    r = net.plan.routed_of(links[0])
    chain = net.chain(r.path.first, r.lay.chain)
    assert chain.flags & R.CHAIN_GATE and chain.count == 1
    assert "wait at rank 1 for its receiver on rank 4 to read" in R.describe_chain(chain, net.plan.router, r, 1)
    # nothing of the stalled channel sits in a shared link ring: every link ring's reader is level with its writer
    for a in net.agents:
        for o in a.outputs:
            if o is not None:
                assert int(o.credit[0]) == o.seq


def test_report_due_rule():
    """A credit report goes to first when the receiver's count moved by a quarter ring, or moved at all while
    first may be out of room (everything the last report let it drain was delivered); never without progress."""
    assert not report_due(10, 10, 26, 16)  # no progress: never, even with first out of room
    assert not report_due(13, 10, 13, 16)  # 3 < a quarter of 16, and first still has room
    assert report_due(14, 10, 14, 16)  # a quarter ring
    assert report_due(11, 10, 26, 16)  # first drained its whole window: any progress
    assert report_due(1, 0, 1, 2) and report_due(1, 0, 1, 4)  # a quarter of a small ring is one packet


def _pingpong(net: Net, rounds: int, nbytes: int, rng) -> None:
    """ping 0 -> 3 and pong 3 -> 0 in turn, one message in flight, the agents stepped in a random order."""
    for i in range(rounds):
        for tx, rx in (("ping", "ping"), ("pong", "pong")):
            msg = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
            net.tx[tx].write_bytes(msg)
            for _ in range(200):
                for r in rng.permutation(len(net.agents)):
                    net.agents[r].step()
                if _ready_bytes(net.rx[rx]) == nbytes:
                    break
            assert net.rx[rx].read_bytes(nbytes) == msg, (rx, i)


def test_a_pingpong_sends_a_credit_packet_every_quarter_ring(rng):
    """line:4, a pingpong 0 -> 3 -> 0 (one message in flight): last reports the receiver's count to first every
    quarter ring, not beside every message (the credit packets share the link rings with the replies); every
    byte arrives."""
    links = [Link(name, f"{name}_in", 2 * k, 2 * k + 1, a, b, BYTE, 16384) for k, (name, a, b) in
             enumerate([("ping", 0, 3), ("pong", 3, 0)])]
    net = Net("line:4", links, link_slots=8)
    quarter = net.plan.routed_of(links[0]).geo.nslots // 4
    assert quarter >= 2
    taken = []  # the channel id of every credit packet first consumed
    for a in net.agents:
        a._take_credit = (lambda f: lambda inp, q, rid: (taken.append(rid), f(inp, q, rid)))(a._take_credit)
    rounds = 64
    _pingpong(net, rounds, 8, rng)
    for link in links:
        assert rounds // quarter - 1 <= taken.count(link.recv_id) <= rounds // quarter, (link.name, taken)


def _ready_packets(rx: CpuReceiver, most: int) -> int:
    """Packets from the receiver's next one on whose headers have arrived (up to ``most``)."""
    n = 0
    while n < most:
        head = rx._slot(rx.seq + n) // 4
        if int(rx.words[head + 3]) != P.flag_of(rx.seq + n):
            break
        n += 1
    return n


def test_a_sender_out_of_room_gets_credit_for_any_progress(rng):
    """line:4, one channel 0 -> 3 whose reader takes a message only once all its packets are there (as try_read
    does): a 1-packet message, then one of a whole ring's packets. The second fills the end-to-end window but
    for its last packet, which first may drain only once it hears that the first message was consumed: one
    packet of progress, less than the quarter ring that reports otherwise wait for. It arrives."""
    links = [Link("c", "c_in", 0, 1, 0, 3, BYTE, 8192)]
    net = Net("line:4", links, link_slots=2)
    geo = net.plan.routed_of(links[0]).geo
    assert geo.nslots // 4 >= 2
    msgs = [rng.integers(0, 256, 8, dtype=np.uint8).tobytes(),
            rng.integers(0, 256, geo.nslots * geo.chunk, dtype=np.uint8).tobytes()]
    packets = [1, geo.nslots]
    got = []
    for msg, n in zip(msgs, packets, strict=True):
        assert _can_write(net.tx["c"], len(msg))
        net.tx["c"].write_bytes(msg)
        for _ in range(100):
            for r in rng.permutation(len(net.agents)):
                net.agents[r].step()
            if _ready_packets(net.rx["c"], n) == n:
                break
        assert _ready_packets(net.rx["c"], n) == n, f"message {len(got)}: its packets never all arrived"
        got.append(net.rx["c"].read_bytes(len(msg)))
    assert got == msgs


def test_neighbours_are_direct_and_routes_need_a_topology():
    t = T.parse("torus:4x4")
    links = all_to_all(16, pairs=[(0, 1), (0, 3), (0, 4), (0, 12), (0, 5), (0, 10), (5, 5)])
    plan = Plan(links, {}, t, None, False, None)
    assert {link.name for link in links if plan.routed_of(link)} == {"c0_5", "c0_10"}
    assert plan.routed_of(links[5]).path.ranks == (0, 1, 2, 6, 10)
    assert Plan(links, {}, None, None, False, None).router is None
    with pytest.raises(ConfigError, match=r"link_slots 3 must be a power of two in 2\.\.65536"):
        Plan(links, {}, t, None, False, 3)
    with pytest.raises(ConfigError, match="outside the topology torus:3x3"):
        Plan(links, {}, T.parse("torus:3x3"), None, False, None)
    acyclic = Plan(all_to_all(16), {}, t, None, False, None)  # dateline VCs: accepted
    assert acyclic.router.cycle() == []
    # Only link rings between a route's first and last hops are shared (those two are the channel's own), so
    # on torus:4x4 (at most 2 hops per ring) no route holds one ring link while requesting the next: the
    # buffers routed channels use are acyclic even with 1 VC, though the tables' full graph is not.
    assert not T.check(t, 1).acyclic
    assert Plan(all_to_all(16), {}, t, 1, False, None).router.cycle() == []
    assert Plan(all_to_all(9), {}, T.parse("torus:3x3"), 1, False, None).router.cycle() == []
    with pytest.raises(ConfigError, match=r"torus:8x2 with 1 virtual channel\(s\) can deadlock"):
        Plan(all_to_all(16), {}, T.parse("torus:8x2"), 1, False, None)


def test_chain_records_round_trip():
    words = np.zeros(R.CHAIN_BYTES // 4, "<u4")
    R.encode_chain(words, [R.entry_of_channel(3), 17, 33], R.CHAIN_BLOCKED, 99, 1)
    c = R.decode_chain(words)
    assert (c.count, c.flags, c.detail, c.cycle_start, c.entries) == (3, R.CHAIN_BLOCKED, 99, 1, [
        R.entry_of_channel(3), 17, 33])
    down = R.Chain(2, R.CHAIN_BLOCKED, 0, 0, [17, 33])  # 17 waits for 33 waits for 17
    assert R.extend_chain(R.entry_of_channel(3), 17, down) == ([R.entry_of_channel(3), 17, 33], 0, 1)
    assert R.extend_chain(33, 17, R.Chain(1, R.CHAIN_BLOCKED, 0, -1, [17])) == ([33, 17], 0, -1)
    assert R.extend_chain(17, 33, R.Chain(2, R.CHAIN_BLOCKED, 0, -1, [33, 17])) == ([17, 33], 0, 0)
    assert R.extend_chain(5, 6, R.Chain(0, 0, 0, -1, [])) == ([5, 6], 0, -1)


# -- as jobs: the public API on ranks that map only their neighbours ------------------------------------------
ROUTED_JOB = """
    import os, threading, numpy as np, circuslink as cl
    from circuslink import channels
    from circuslink.channels import Link, element_type
    w = cl.init()
    topo = "{topo}"
    n = w.size
    byte, u4 = element_type("uchar"), element_type("uint4")
    pairs = {pairs}
    links = [Link(f"c{{a}}_{{b}}", f"c{{a}}_{{b}}_in", 2 * k, 2 * k + 1, a, b, u4 if k % 2 else byte, 512)
             for k, (a, b) in enumerate(pairs)]
    ch = channels.open(w, links, topology=topo, vcs={vcs}, link_slots={link_slots}, allow_cycles={allow})
    assert ch._buf.mapped == sorted(set(ch.topology.neighbours(w.rank)) | {{w.rank}})
    seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
    def data(link, i):
        g = np.random.default_rng([seed, link.send_id, i])
        nb = link.element.nbytes
        return g.integers(0, 256, int(g.integers(1, {most})) * nb, dtype=np.uint8)
    mine = [l for l in links if l.src_rank == w.rank]
    errors = []
    def send():
        try:
            for i in range({count}):
                for l in mine:
                    ch[l.name].write(data(l, i).view(l.element.numpy_dtype))
        except Exception as exc:
            errors.append(exc)
    th = threading.Thread(target=send)
    th.start()
    try:
        for i in range({count}):
            for l in links:
                if l.dst_rank == w.rank:
                    want = data(l, i)
                    got = ch[l.receiver_name].read(want.size // l.element.nbytes)
                    assert np.asarray(got).tobytes() == want.tobytes(), (l.name, i)
    except cl.ChannelError as exc:
        errors.append(exc)
    th.join()
    for exc in errors:
        print("CHANNEL-ERROR", exc)
    if not errors:
        ch.close()
        w.close()
        print("routed ok", w.rank, sum(1 for l in links if ch.route(l.name)))
"""


def _job(topo: str, pairs, vcs=None, link_slots=8, allow=False, count=3, most=300) -> str:
    return ROUTED_JOB.format(topo=topo, pairs=pairs, vcs=vcs, link_slots=link_slots, allow=allow, count=count,
                             most=most)


@pytest.mark.parametrize("topo,n", [("line:4", 4), ("torus:3x3", 9)])
def test_all_to_all_jobs(spmd, topo, n):
    """As ranks: every rank to every other, host write (in a thread) and read, byte and uint4 channels,
    low-latency and bulk packets, link rings of 2 slots; every byte checked against a seeded generator."""
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    job = spmd(n, _job(topo, pairs, link_slots=2)).check()
    assert job.stdout.count("routed ok") == n, job.output
    assert "CHANNEL-ERROR" not in job.output


def test_a_stalled_receiver_times_out_naming_it(spmd):
    """line:3, 0->2 routed through rank 1; rank 2 never reads: rank 0's write times out, and the error says
    the packets wait at rank 1 for the receiver on rank 2, not for a link."""
    job = spmd(3, """
        import numpy as np, circuslink as cl
        from circuslink import channels
        from circuslink.channels import Link, element_type
        w = cl.init()
        ch = channels.open(w, [Link("a", "a_in", 0, 1, 0, 2, element_type("uchar"), 256)], topology="line:3",
                           timeout=3)
        if w.rank == 0:
            assert ch.route("a") == [0, 1, 2]
            try:
                for _ in range(64):
                    ch["a"].write(np.arange(200, dtype=np.uint8))
            except cl.ChannelError as exc:
                print("ERR", exc)
        w.barrier(timeout=30)
        ch.close()
        w.close()
    """, env={"CIRCUSLINK_TIMEOUT": "30"}).check()
    err = next(line for line in job.stdout.splitlines() if "ERR" in line)
    assert "channel a (id 0, rank 0, sender to rank 2, routed 0->1->2): timed out after 3 s: waited for credits" in err
    assert "its packets wait at rank 1 for its receiver on rank 2 to read (end-to-end credits" in err


def test_spec_topology_routes_channels(spmd, tmp_path):
    """A spec's <topology> element routes its channels with no other change: app.xml on line:4."""
    (tmp_path / "app.xml").write_text("""<circus>
  <topology>line:4</topology>
  <channel name="far_out" type="uint" id="0" write-to="1" rank="0" depth="64"/>
  <channel name="far_in" type="uint" id="1" read-from="0" rank="3" depth="64"/>
  <channel name="back_out" type="uint" id="2" write-to="3" rank="3" depth="64"/>
  <channel name="back_in" type="uint" id="3" read-from="2" rank="0" depth="64"/>
</circus>
""")
    job = spmd(4, f"""
        import numpy as np, circuslink as cl
        from circuslink import channels, spec
        w = cl.init()
        ch = channels.open(w, spec.load({str(tmp_path / "app.xml")!r}, nranks=w.size))
        assert ch.route("far_out") == [0, 1, 2, 3] and ch.route("back_in") == [3, 2, 1, 0]
        x = np.arange(1000, dtype=np.uint32)
        if w.rank == 0:
            ch["far_out"].write(x)
            assert (ch["back_in"].read(1000) == x + 1).all()
        if w.rank == 3:
            ch["back_out"].write(ch["far_in"].read(1000) + 1)
        ch.close()
        w.close()
        print("spec ok", w.rank)
    """).check()
    assert job.stdout.count("spec ok") == 4


def test_unsafe_job_completes_or_names_the_cycle(spmd):
    """ring:8 with 1 virtual channel and allow_cycles=True, every rank 4 hops forward, many bulk packets
    through link rings of 2 slots: the job either completes (every byte checked) or its writers time out
    with an error naming the (link, vc) buffers of the cycle; it never hangs."""
    pairs = [(r, (r + 4) % 8) for r in range(8)]
    code = _job("ring:8", pairs, vcs=1, link_slots=2, allow=True, count=40, most=2000).replace(
        "ch = channels.open(w, links,", "ch = channels.open(w, links, timeout=4,")
    job = spmd(8, code, env={"CIRCUSLINK_TIMEOUT": "60"})
    errors = [line for line in job.stdout.splitlines() if "CHANNEL-ERROR" in line]
    if errors:
        assert any("wait on each other in a cycle: " in e and "(back to " in e for e in errors), errors
    else:
        assert job.returncode == 0 and job.stdout.count("routed ok") == 8, job.output
