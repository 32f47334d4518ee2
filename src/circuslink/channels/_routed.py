"""Routed channels: which channels are routed, where their parts live, what each rank's forwarding agent
serves, the deadlock check of the buffers they use, and the messages that name a stall.

Back-end neutral (docs/routing.md, "Forwarding"). On a topology a channel whose ends are neighbours is an
ordinary channel (its ring is already in the receiver's memory); any other channel is **routed**:

* its sender writes into an **injection ring** in the memory of the route's first rank (``first``, a
  neighbour), with the channel's own slots, flags and credits, so the user's kernel code is unchanged;
* the agent of ``first`` drains it into the **link rings** (one per directed link and virtual channel, in
  the receiving rank's memory, multiplexing every channel that crosses the link), the agents of the ranks
  between forward packet by packet, and the agent of the route's last rank before the receiver (``last``)
  writes straight into the channel's **delivery ring** in the receiver's memory;
* end-to-end credits: ``first`` drains packet q only while the delivery ring has room for it
  (``q < consumed + nslots``), so delivery never waits and a stalled receiver holds back only its own
  injection ring. The receiver's slot credits land on a **board** in ``last``'s memory; when ``last`` is
  not ``first`` its agent sends the consumed count back to ``first`` in small routed credit packets.

A route of k hops costs k - 1 agent steps and no extra copy at either end.

**Gateways and relays** (topologies of nodes, docs/scale.md): a hop whose link has kind ``network`` joins
two nodes' gateways, whose memory is never mapped. Its upstream agent writes into the gateway's **relay**
(``circuslink.transport``): its **out ring** (local memory) instead of a link ring at the peer; the transport
carries the packets, and the landing gateway's agent reads its relay's **in ring** as the input of that port
(VC 0). Which transport carries a relay (nvshmem, mpi, ...) the agents never know: an output is a mapped
hop (stores land in the neighbour's ring, so the agent may deliver there) or a relayed one (the landing agent
delivers). Where the route's first hop is a network hop (the sender is the gateway), ``first`` is the
sender's own rank: its injection ring is local and its own agent drains it, so no mapped hop is added;
likewise ``last`` is the receiver itself when the last hop is a network hop. Relay memory is addressed as
``(-1 - peer, offset)`` (a negative rank: the relay to ``peer``, offsets of ``transport._rings.relay_layouts``).

Every part is addressed as ``(rank, offset)`` in the channels' one symmetric allocation (the same offsets on
every rank, only the owner's copy used): the cpu agent turns addresses into numpy views, the cuda back-end
into pointers. Every address an agent or an end uses is its own rank's or a neighbour's, so each rank maps
only its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from . import protocol as P

# -- the routed header: docs/routing.md, "Header of a routed packet" -------------------------------------
VC_SHIFT = 24
VC_MASK = 0x0F000000
KIND_CTRL = 0x10000000  # a credit packet (an agent's, never a user's)
ROUTED_NBYTES_MASK = 0x00FFFFFF
CREDIT_PACKET_BYTES = 8  # the consumed count, u64

LINK_SLOTS_DEFAULT = 8
RELAY_SLOTS_DEFAULT = 64  # packets each ring of a relay holds (a network's latency needs a deep pipe)
MAX_INPUTS = 1024  # per rank: the cuda agent keeps each input's state in shared memory

# -- chain records: what an agent publishes about an input whose head has waited long ---------------------
CHAIN_BYTES = 256
CHAIN_HEAD = 4  # words: count, flags, detail (packet seq, low 32 bits), cycle start + 1 (0: no cycle)
CHAIN_ENTRIES = CHAIN_BYTES // 4 - CHAIN_HEAD
CHAIN_BLOCKED = 1  # the head waits for room in the buffer named next
CHAIN_GATE = 2  # the chain ends at a channel waiting for its receiver (end-to-end credits)
CHAIN_DELIVERY = 4  # the chain ends at a delivery ring without room (should not happen: the gate prevents it)
ENTRY_CHANNEL = 0x80000000  # an entry naming a channel's injection ring (routed channel index in the low bits)

# input kinds
IN_LINK = 0
IN_INJECT = 1
# channel roles at a rank
ROLE_FIRST = 1  # drains the channel's injection ring and holds its gate
ROLE_LAST = 2  # writes the channel's delivery ring and reads its board
NO_CHANNEL = 0xFFFF
NO_INPUT = 0xFFFFFFFF  # ChannelSpec.arrival where this rank does not deliver the channel


def relay_addr(peer: int, offset: int) -> tuple[int, int]:
    """The address of byte ``offset`` in the memory of this rank's relay to ``peer``."""
    return (-1 - peer, offset)


def relay_peer(addr: tuple[int, int]) -> int | None:
    """The peer of a relay address, None for an address in the symmetric allocation."""
    return -1 - addr[0] if addr[0] < 0 else None


def mapped_neighbours(topology: Any, rank: int) -> list[int]:
    """The ranks whose memory ``rank`` maps on ``topology``: its neighbours across links of every kind but
    ``network`` (gateways of different nodes reach each other through a relay, never by mapping)."""
    from ..topology import LINK_NETWORK

    return sorted({p.peer for p in topology.ports[rank] if p.peer >= 0 and p.kind != LINK_NETWORK})


def report_after(timeout_s: float) -> float:
    """How long an input's head waits before its agent publishes what it waits on: well inside the time-out
    of the ends that wait behind it, so their errors can name it."""
    return max(0.01, min(1.0, timeout_s / 8))


def entry_of_link(link_id: int, vc: int) -> int:
    """A chain entry naming the link ring ``(link, vc)``."""
    return (link_id << 4 | vc) + 1


def entry_of_channel(index: int) -> int:
    return ENTRY_CHANNEL | index


@dataclass(frozen=True)
class RoutedLayout:
    """Byte offsets of one routed channel's parts (the first four as in protocol.ChannelLayout)."""

    ctrl: int  # control block: the sender's copy (credit, state, error) and the receiver's (state, error)
    slot_credits: int  # the sender's slot credits (written by first's agent)
    ring: int  # the delivery ring, in the receiver's copy
    end: int
    inj: int  # the injection ring, in first's copy
    board: int  # the receiver's slot credits, in last's copy (u32 per delivery slot)
    board_credit: int  # the receiver's in-order credit counter, in last's copy (not read: the board is)
    chain: int  # first's chain record of the injection ring


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def routed_layout(offset: int, geo: P.RingGeometry) -> RoutedLayout:
    base = P.layout(offset, geo)
    inj = _align(base.end, 256)
    board = inj + geo.ring_bytes
    board_credit = _align(board + 4 * geo.nslots, 8)
    chain = _align(board_credit + 8, 256)
    return RoutedLayout(base.ctrl, base.slot_credits, base.ring, chain + CHAIN_BYTES, inj, board, board_credit, chain)


@dataclass(frozen=True)
class Path:
    """The route of a routed channel: ranks from sender to receiver, the hops between, and which ranks'
    agents drain its injection ring (``first``) and fill its delivery ring (``last``)."""

    ranks: tuple[int, ...]
    hops: tuple  # topology Hop records
    first_index: int = 1  # ranks[first_index] is first: 1, or 0 where the first hop is a network hop
    last_index: int = -2  # ranks[last_index] is last: len - 2, or len - 1 where the last hop is a network hop

    @classmethod
    def of(cls, ranks: tuple[int, ...], hops: tuple) -> Path:
        """The path of ``hops``: a network hop at either end moves ``first`` / ``last`` onto the end's own rank,
        whose memory is the only one it can reach on that side."""
        first = 0 if hops[0].link.network else 1
        last = len(ranks) - 1 if hops[-1].link.network else len(ranks) - 2
        return cls(tuple(ranks), tuple(hops), first, last)

    @property
    def first(self) -> int:
        return self.ranks[self.first_index]

    @property
    def last(self) -> int:
        return self.ranks[self.last_index]

    @property
    def shared_hops(self) -> tuple:
        """The hops through shared buffers (link rings, relays): from first's agent to last's."""
        return self.hops[self.first_index:self.last_index % len(self.ranks)]

    @property
    def arrival(self) -> Any:
        """The hop on which packets reach last's agent (None when first is last: they come from its injection
        ring)."""
        return None if self.first == self.last else self.hops[self.last_index % len(self.ranks) - 1]


@dataclass(frozen=True)
class Routed:
    index: int  # dense routed-channel index (the agents' channel number)
    link: Any  # the channels' Link
    geo: P.RingGeometry
    lay: RoutedLayout
    path: Path

    @property
    def route_word(self) -> int:
        return P.route_of(self.link.recv_id, self.link.dst_rank)


# -- what each rank's agent serves ---------------------------------------------------------------------------
Addr = tuple[int, int]  # (rank, byte offset in the symmetric allocation)


@dataclass
class InputSpec:
    kind: int  # IN_LINK or IN_INJECT
    ring: Addr
    nslots: int
    slot_bytes: int
    chunk: int
    credit: Addr  # upstream's in-order credit counter (u64)
    slot_credit: Addr | None  # injection: the sender's slot credits
    chain: Addr  # this input's chain record (in this rank's memory)
    link: int  # link id (IN_LINK), -1 for an injection ring
    vc: int
    channel: int  # routed channel index (IN_INJECT), NO_CHANNEL for a link ring
    port: int = -1  # IN_LINK: the port it arrives on

    @property
    def entry(self) -> int:
        return entry_of_link(self.link, self.vc) if self.kind == IN_LINK else entry_of_channel(self.channel)


@dataclass
class OutputSpec:
    index: int  # port * vcs + vc
    ring: Addr  # the link ring at the neighbour
    nslots: int
    slot_bytes: int
    chunk: int
    credit: Addr  # consumed count written by the downstream agent, in this rank's memory
    down_chain: Addr  # the downstream agent's chain record of that ring
    link: int
    vc: int
    relay: bool = False  # the out ring of this rank's relay (a transport carries it to the peer gateway's agent)


@dataclass
class ChannelSpec:
    index: int
    role: int  # ROLE_FIRST | ROLE_LAST bits at this rank
    route: int  # recv_id | dst << 16
    nslots: int
    slot_bytes: int
    chunk: int
    first: int
    last: int
    ring: Addr | None = None  # ROLE_LAST: the delivery ring at the receiver
    board: Addr | None = None  # ROLE_LAST, or ROLE_FIRST when first == last: the board (in this rank's memory)
    arrival: int = NO_INPUT  # ROLE_LAST: the input its packets arrive on (the cuda agent's warp of that input alone
    #                          delivers and reports it); NO_INPUT elsewhere


@dataclass
class AgentTables:
    """Everything one rank's agent serves, by address (build with :meth:`RouterPlan.agent`)."""

    rank: int
    nranks: int
    vcs: int
    nports: int
    inputs: list[InputSpec]
    outputs: list[OutputSpec | None]  # index port * vcs + vc; None where the port has no link out
    channels: list[ChannelSpec | None]  # by routed channel index; None where this rank has no role
    next: np.ndarray  # int32 [dst]: next rank (this row of the routing table)
    port: np.ndarray  # int16 [dst]
    vc: np.ndarray  # int8 [dst]
    channel_of_id: dict[int, int] = field(default_factory=dict)  # recv_id -> routed channel index
    link_labels: dict[int, str] = field(default_factory=dict)


class RouterPlan:
    """The routed channels of one open() and the link rings they share (identical on every rank)."""

    def __init__(self, topology: Any, routing: Any, routed: list[Routed], offset: int, link_slots: int,
                 relay_slots: int = RELAY_SLOTS_DEFAULT) -> None:
        self.topology = topology
        self.routing = routing
        self.vcs = routing.vcs
        self.routed = routed
        self.by_recv_id = {r.link.recv_id: r for r in routed}
        self.link_slots = link_slots
        self.link_chunk = max(r.geo.chunk for r in routed)
        self.link_slot_bytes = P.LL_AREA_BYTES + self.link_chunk
        self.nports = max(topology.nports, 1)
        nrings = self.nports * self.vcs
        self.link_rings = _align(offset, 256)
        self.ring_bytes = link_slots * self.link_slot_bytes
        self.out_credits = self.link_rings + nrings * self.ring_bytes
        self.link_chains = _align(self.out_credits + 8 * nrings, 256)
        self.zero_chain = self.link_chains + nrings * CHAIN_BYTES  # never written: a chain that ends (a relay)
        self.end = self.zero_chain + CHAIN_BYTES
        # The relays routed packets cross (data routes between first and last, credit routes last -> first), as
        # sorted rank pairs with the transport their link names (None: chosen by capability); every pair is
        # opened with one ring shape: chunks of the largest routed chunk, so an agent never splits a packet.
        pairs: dict[tuple[int, int], str | None] = {}
        for r in routed:
            hops = list(r.path.shared_hops)
            if r.path.first != r.path.last:
                hops += routing.route(r.path.last, r.path.first)
            for h in hops:
                if h.link.network:
                    pairs[(min(h.src, h.dst), max(h.src, h.dst))] = h.link.transport
        self.relay_pairs = sorted(pairs)
        self.relay_transports = {pair: name for pair, name in pairs.items() if name is not None}
        self.relay_geometry = P.geometry(1, 1, nslots=relay_slots, chunk=self.link_chunk, name="relay") \
            if pairs else None

    # -- addresses --------------------------------------------------------------------------------------
    def link_ring(self, port: int, vc: int) -> int:
        return self.link_rings + (port * self.vcs + vc) * self.ring_bytes

    def out_credit(self, port: int, vc: int) -> int:
        return self.out_credits + 8 * (port * self.vcs + vc)

    def link_chain(self, port: int, vc: int) -> int:
        return self.link_chains + (port * self.vcs + vc) * CHAIN_BYTES

    def relay_peers(self, rank: int) -> list[int]:
        """The ranks this rank reaches over the relays the routed channels use."""
        return sorted({b if a == rank else a for a, b in self.relay_pairs if rank in (a, b)})

    def relay_rings(self) -> tuple[Any, Any]:
        """(out ring layout, in ring layout) inside each relay's memory."""
        from ..transport._rings import relay_layouts

        out_lay, in_lay, _ = relay_layouts(self.relay_geometry)
        return out_lay, in_lay

    def describe(self) -> str:
        text = (f"{len(self.routed)} routed channel(s) on {self.topology.name}, {self.vcs} virtual channel(s), "
                f"link rings of {self.link_slots} x {self.link_slot_bytes} B")
        if self.relay_pairs:
            text += (f", {len(self.relay_pairs)} relay(s) of {self.relay_geometry.nslots} x "
                     f"{self.relay_geometry.slot_bytes} B each way")
        return text

    def digest_items(self) -> tuple:
        return (self.topology.name, self.topology.size, len(self.topology.links), self.vcs, self.link_slots,
                tuple((r.link.name, r.path.ranks, tuple(h.vc for h in r.path.hops)) for r in self.routed),
                tuple(self.relay_pairs), tuple(sorted(self.relay_transports.items())), self.relay_geometry)

    # -- what one rank's agent serves -----------------------------------------------------------------------
    def agent(self, rank: int) -> AgentTables:
        from ..topology import LINK_NETWORK

        t, vcs = self.topology, self.vcs
        ports = t.ports[rank]
        inputs: list[InputSpec] = []
        outputs: list[OutputSpec | None] = [None] * (self.nports * vcs)
        relay_peers = self.relay_peers(rank)
        for p, port in enumerate(ports):
            if port.kind == LINK_NETWORK:
                # The network hop: VC 0 only (the routing tables put every network hop on VC 0); its input is the
                # relay's in ring, its output the out ring, both in this rank's relay memory.
                if port.peer not in relay_peers:
                    continue  # no routed packet crosses this link
                geo = self.relay_geometry
                out_lay, in_lay = self.relay_rings()
                inputs.append(InputSpec(IN_LINK, relay_addr(port.peer, in_lay.ring), geo.nslots, geo.slot_bytes,
                                        geo.chunk, relay_addr(port.peer, in_lay.ctrl + P.CTRL_CREDIT), None,
                                        (rank, self.link_chain(p, 0)), port.in_link, 0, NO_CHANNEL, p))
                outputs[p * vcs] = OutputSpec(p * vcs, relay_addr(port.peer, out_lay.ring), geo.nslots,
                                              geo.slot_bytes, geo.chunk,
                                              relay_addr(port.peer, out_lay.ctrl + P.CTRL_CREDIT),
                                              (rank, self.zero_chain), port.out_link, 0, True)
                continue
            for v in range(vcs):
                if port.in_link >= 0:  # a link ring fed by the neighbour behind p
                    inputs.append(InputSpec(IN_LINK, (rank, self.link_ring(p, v)), self.link_slots,
                                            self.link_slot_bytes, self.link_chunk,
                                            (port.peer, self.out_credit(port.peer_port, v)), None,
                                            (rank, self.link_chain(p, v)), port.in_link, v, NO_CHANNEL, p))
                if port.out_link >= 0:
                    outputs[p * vcs + v] = OutputSpec(p * vcs + v, (port.peer, self.link_ring(port.peer_port, v)),
                                                      self.link_slots, self.link_slot_bytes, self.link_chunk,
                                                      (rank, self.out_credit(p, v)),
                                                      (port.peer, self.link_chain(port.peer_port, v)),
                                                      port.out_link, v)
        channels: list[ChannelSpec | None] = [None] * len(self.routed)
        for r in self.routed:
            first, last, link, lay, geo = r.path.first, r.path.last, r.link, r.lay, r.geo
            role = (ROLE_FIRST if rank == first else 0) | (ROLE_LAST if rank == last else 0)
            if not role:
                continue
            spec = ChannelSpec(r.index, role, r.route_word, geo.nslots, geo.slot_bytes, geo.chunk, first, last)
            if role & ROLE_LAST:
                spec.ring = (link.dst_rank, lay.ring)
                spec.board = (rank, lay.board)
            channels[r.index] = spec
            if role & ROLE_FIRST:
                inputs.append(InputSpec(IN_INJECT, (rank, lay.inj), geo.nslots, geo.slot_bytes, geo.chunk,
                                        (link.src_rank, lay.ctrl + P.CTRL_CREDIT), (link.src_rank, lay.slot_credits),
                                        (rank, lay.chain), -1, 0, r.index))
        by_link = {(s.link, s.vc): k for k, s in enumerate(inputs) if s.kind == IN_LINK}
        by_channel = {s.channel: k for k, s in enumerate(inputs) if s.kind == IN_INJECT}
        for r in self.routed:
            spec = channels[r.index]
            if spec is not None and spec.role & ROLE_LAST:
                hop = r.path.arrival
                spec.arrival = by_channel[r.index] if hop is None else by_link[(hop.link.id, hop.vc)]
        if len(inputs) > MAX_INPUTS:
            raise ConfigError(f"channels.open: rank {rank}'s forwarding agent would serve {len(inputs)} input rings "
                              f"(at most {MAX_INPUTS}): fewer routed channels through one rank, please")
        routing = self.routing
        return AgentTables(rank, t.size, vcs, self.nports, inputs, outputs, channels,
                           routing.next[rank].copy(), routing.port[rank].copy(), routing.vc[rank].copy(),
                           {r.link.recv_id: r.index for r in self.routed},
                           {k.id: t.link_label(k) for k in t.links})

    # -- the deadlock check of the buffers routed channels use -----------------------------------------------
    def dependencies(self) -> tuple[np.ndarray, np.ndarray]:
        """(link-ring channels used, dependency edges) of the routed channels' data and credit routes, in
        :func:`circuslink.topology.dependencies`' numbering (``link * vcs + vc``).

        A data packet's first buffer (the injection ring) and its last (the delivery ring) are its channel's
        own; only the link rings between are shared: a route of k hops holds link rings 1 .. k-2 in turn (a
        relay at either end of the route is shared too: it is one buffer, out ring then in ring, whose head waits
        only for the landing gateway's agent). A credit packet from ``last`` to ``first`` crosses
        link rings only and is consumed at its end."""
        vcs = self.vcs
        used: set[int] = set()
        edges: set[tuple[int, int]] = set()

        def chain(buffers: list[int]) -> None:
            used.update(buffers)
            edges.update(zip(buffers, buffers[1:], strict=False))

        for r in self.routed:
            chain([h.link.id * vcs + h.vc for h in r.path.shared_hops])
            if r.path.first != r.path.last:
                chain([h.link.id * vcs + h.vc for h in self.routing.route(r.path.last, r.path.first)])
        nodes = np.array(sorted(used), dtype=np.int64)
        arr = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
        return nodes, arr

    def cycle(self) -> list[tuple[Any, int]]:
        """One cycle of (link, vc) the routed channels' buffers can wait on each other in, or []."""
        from ..topology import find_cycle

        nodes, edges = self.dependencies()
        links = self.topology.links
        return [(links[c // self.vcs], c % self.vcs) for c in find_cycle(nodes, edges)]

    def cycle_text(self, cycle: list[tuple[Any, int]]) -> str:
        t = self.topology
        parts = [f"{t.link_label(link)} vc {vc}" for link, vc in cycle]
        return ", ".join(parts) + f" (back to {parts[0]})" if parts else ""


def plan_routes(links: list, topology: Any, vcs: int | None, where: str = "channels.open") -> tuple[Any, set[str]]:
    """(routing, names of the links to route): every link whose ends are distinct and not mapped neighbours
    (gateways of different nodes are neighbours across a network link: their channels are routed through it)."""
    routing = topology.routing(vcs)
    routed = set()
    for link in links:
        for what, rank in (("sender", link.src_rank), ("receiver", link.dst_rank)):
            if rank >= topology.size:
                raise ConfigError(f"{where}: channel {link.name}: its {what} is on rank {rank}, outside the "
                                  f"topology {topology.name} (ranks 0..{topology.size - 1})")
        src, dst = link.src_rank, link.dst_rank
        if src == dst or dst in mapped_neighbours(topology, src):
            continue
        if routing.next[src, dst] < 0:
            raise ConfigError(f"{where}: channel {link.name}: rank {dst} is unreachable from rank {src} on "
                              f"topology {topology.name}")
        path = Path.of((src,) + tuple(h.dst for h in routing.route(src, dst)), tuple(routing.route(src, dst)))
        last, first = path.last, path.first
        if first != last and routing.next[last, first] < 0:
            raise ConfigError(f"{where}: channel {link.name}: its credits cannot return from rank {last} to rank "
                              f"{first} on topology {topology.name} (no route that way)")
        routed.add(link.name)
    return routing, routed


def make_routed(index: int, link: Any, geo: P.RingGeometry, lay: RoutedLayout, routing: Any) -> Routed:
    hops = tuple(routing.route(link.src_rank, link.dst_rank))
    ranks = (link.src_rank,) + tuple(h.dst for h in hops)
    return Routed(index, link, geo, lay, Path.of(ranks, hops))


# -- placements: where an end's ring and credits are -------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where one end's ring, credit counter and slot credits live, as (rank, offset)."""

    ring: Addr
    credit: Addr
    slot_credits: Addr


def placement(link: Any, lay: Any, kind: str, routed: Routed | None) -> Placement:
    """The end's view of its channel: a direct channel's ring is in the receiver's memory and its credits in
    the sender's; a routed sender writes into the injection ring at ``first``, a routed receiver returns
    credits onto the board at ``last``."""
    src, dst = link.src_rank, link.dst_rank
    credits = Placement((dst, lay.ring), (src, lay.ctrl + P.CTRL_CREDIT), (src, lay.slot_credits))
    if routed is None:
        return credits
    if kind == "send":
        return Placement((routed.path.first, lay.inj), credits.credit, credits.slot_credits)
    last = routed.path.last
    return Placement((dst, lay.ring), (last, lay.board_credit), (last, lay.board))


# -- reading chain records: the messages that name a stall ---------------------------------------------------
@dataclass
class Chain:
    count: int
    flags: int
    detail: int
    cycle_start: int  # index into entries, -1: no cycle
    entries: list[int]


def decode_chain(words: np.ndarray) -> Chain:
    """A chain record (CHAIN_BYTES / 4 little-endian u32 words) as published by an agent."""
    w = [int(x) for x in np.asarray(words, dtype=np.uint32).reshape(-1)[:CHAIN_BYTES // 4]]
    count = min(w[0], CHAIN_ENTRIES)
    return Chain(count, w[1], w[2], w[3] - 1 if w[3] else -1, w[CHAIN_HEAD:CHAIN_HEAD + count])


def encode_chain(words: np.ndarray, entries: list[int], flags: int, detail: int, cycle_start: int) -> None:
    """Publish a chain record: entries first, the count last (what readers check)."""
    n = min(len(entries), CHAIN_ENTRIES)
    words[CHAIN_HEAD:CHAIN_HEAD + n] = entries[:n]
    words[1] = flags
    words[2] = detail & 0xFFFFFFFF
    words[3] = cycle_start + 1 if 0 <= cycle_start < n else 0
    words[0] = n


def extend_chain(me: int, out_entry: int, down: Chain) -> tuple[list[int], int, int]:
    """The chain of an input whose head waits for the buffer ``out_entry``, whose own chain is ``down``:
    (entries, extra flags, cycle start). The input's own entry found downstream closes a cycle."""
    tail = down.entries if down.count else [out_entry]
    flags = down.flags & CHAIN_DELIVERY if down.count else 0
    if me in tail:
        return [me] + tail[:tail.index(me)], flags, 0
    start = down.cycle_start + 1 if down.count and down.cycle_start >= 0 else -1
    return ([me] + tail)[:CHAIN_ENTRIES], flags, start if start < CHAIN_ENTRIES else -1


def describe_entry(entry: int, plan: RouterPlan) -> str:
    if entry & ENTRY_CHANNEL:
        r = plan.routed[entry & 0xFFFF] if (entry & 0xFFFF) < len(plan.routed) else None
        return f"the injection ring of channel {r.link.name}" if r else f"channel #{entry & 0xFFFF}"
    link_id, vc = (entry - 1) >> 4, (entry - 1) & 15
    t = plan.topology
    label = t.link_label(t.links[link_id]) if 0 <= link_id < len(t.links) else f"link {link_id}"
    return f"{label} vc {vc}"


def describe_chain(chain: Chain, plan: RouterPlan, routed: Routed, at: int) -> str:
    """What a stalled routed channel waits on, in words, from the chain record of rank ``at`` (empty when
    nothing is recorded)."""
    if not chain.count or not chain.flags & CHAIN_BLOCKED:
        return ""
    names = [describe_entry(e, plan) for e in chain.entries]
    receiver = f"its receiver on rank {routed.link.dst_rank}"
    if chain.count == 1 and chain.flags & CHAIN_GATE:
        return (f"its packets wait at rank {at} for {receiver} to read (end-to-end credits, packet {chain.detail} "
                "of its injection ring): a stalled receiver holds back only its own channel")
    if chain.count == 1:
        return f"its packets wait at rank {at} in {names[0]}"
    text = f"its packets wait at rank {at} in {names[0]} for room in {names[1]}"
    if chain.cycle_start >= 0:
        start = max(chain.cycle_start, 1)
        cyc = names[start:]
        through = f" (through {', '.join(names[2:start])})" if start > 2 else ""
        text += (f", which waits{through} on (link, vc) buffers that wait on each other in a cycle: {', '.join(cyc)} "
                 f"(back to {cyc[0]}): a deadlock of the routing (its channel dependency graph has a cycle; use the "
                 "default virtual channels)")
    elif chain.count > 2:
        text += f", which waits on {', then '.join(names[2:])}"
    if chain.flags & CHAIN_DELIVERY:
        text += " (at the end: a delivery ring without room, which end-to-end credits should prevent)"
    return text


def route_text(routed: Routed) -> str:
    return "->".join(map(str, routed.path.ranks))
