"""Engine links: packet pipes between gateway ranks of different nodes, carried by an existing engine (MPI).

Inside a node ranks map each other's memory; between nodes circuslink never runs a network stack of its
own: a gateway rank hands packets to an **engine link**, whose proxy thread sends them with MPI to the
peer gateway's proxy, which writes them into that gateway's ring (docs/scale.md). A forwarding agent sees
two rings in the channel format of docs/protocol.md, like any link ring:

* the **out ring**: the agent writes packets (route word and all), the proxy sends them;
* the **in ring**: the proxy writes the peer's packets, the agent reads them.

::

    from circuslink import links
    engine = links.open_engine(world, [(0, 4)])        # collective; or a topology of nodes (its engine links)
    link = engine[4]                                    # on rank 0: the link to rank 4 (rank 4: engine[0])
    link.writer().put(route, payload)                   # host agent: one packet into the out ring
    route, word, payload = link.reader().get()          # ... and one out of the in ring
    link.sender_handle(route), link.receiver_handle()   # device agents: channel handles on the two rings
    engine.close()                                      # collective: flush, BYE / FIN, free

The rings live in host memory the proxy reads (pinned and mapped into the GPU on cuda: the link is
host-staged, as the device image's MPI is not CUDA-aware). Credits end to end: the proxy sends a packet
only while the peer's in ring has room. Every wait has the link's time-out; an MPI error or a time-out is
one line naming MPI and both ranks (:class:`circuslink.EngineError`), raised by the next host call and
recorded in the agents' ends so they stop waiting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._config import resolve_timeout
from .._lifecycle import Resource
from .._wait import Deadline
from ..channels import _cpu as _ref
from ..channels import protocol as P
from ..errors import ChannelError, ConfigError
from ._ring import SIZE_MASK, PacketReader, PacketWriter, Ring, link_layouts

DEFAULT_NSLOTS = 64
DEFAULT_CHUNK = 64 << 10

__all__ = ["DEFAULT_CHUNK", "DEFAULT_NSLOTS", "EngineLink", "EngineLinks", "PacketReader", "PacketWriter", "Ring",
           "SIZE_MASK", "link_layouts", "link_pairs", "open_engine"]


def link_pairs(world: Any, links: Any) -> list[tuple[int, int]]:
    """The engine links to open, as sorted ``(a, b)`` pairs with ``a < b``: from pairs, or from a topology of
    nodes (its engine links; its nodes must be the job's). Every pair joins ranks of different nodes."""
    from ..topology import Topology

    if isinstance(links, Topology):
        links.check_nodes(world.nodes, world.describe_nodes())
        pairs = {(min(k.src, k.dst), max(k.src, k.dst)) for k in links.links if k.engine}
    else:
        pairs = set()
        try:
            items = list(links)
        except TypeError:
            raise ConfigError("engine links: give (a, b) rank pairs or a topology of nodes") from None
        for item in items:
            try:
                a, b = item
            except (TypeError, ValueError):
                raise ConfigError(f"engine links: {item!r} is not an (a, b) pair of ranks") from None
            for r in (a, b):
                if isinstance(r, bool) or not isinstance(r, int | np.integer) or not 0 <= r < world.size:
                    raise ConfigError(f"engine links: rank {r!r} is not a rank of this world of {world.size}")
            if a == b:
                raise ConfigError(f"engine links: a link joins two ranks, got ({a}, {b})")
            pairs.add((int(min(a, b)), int(max(a, b))))
    for a, b in sorted(pairs):
        if world.node_of(a) == world.node_of(b):
            raise ConfigError(f"engine links: ranks {a} and {b} are both in node {world.node_of(a)}: the engine joins "
                              "nodes, and inside a node ranks map each other's memory")
    return sorted(pairs)


def open_engine(world: Any, links: Iterable[tuple[int, int]] | Any, *, nslots: int = DEFAULT_NSLOTS,
                chunk: int = DEFAULT_CHUNK, ll_max: int = P.LL_MAX_DEFAULT, batch: int | None = None,
                timeout: float | None = None, spin: bool = False) -> EngineLinks:
    """Collective: open the MPI engine links ``links`` (``(a, b)`` rank pairs, or a topology of nodes whose
    engine links to open) with rings of ``nslots`` slots of ``chunk``-byte bulk packets each way.

    ``batch``: most packets one MPI message carries (default a quarter ring); ``timeout``: every wait of the
    links (default ``CIRCUSLINK_TIMEOUT``); ``spin``: proxies poll without sleeping (for measurements).
    Every rank calls it with the same arguments; a rank with no link takes part and holds none.
    """
    world._check_open()
    if world.mpi_comm is None:
        raise ConfigError("engine links need MPI between the nodes: start the job with mpirun "
                          f"(this job was started by {world.launched_by}, whose ranks share no MPI communicator); "
                          "e.g. CIRCUSLINK_RANKS_PER_NODE=2 mpirun -np 4 python app.py")
    try:
        geo = P.geometry(1, 1, nslots=nslots, chunk=chunk, ll_max=ll_max, name="engine link")
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("channel engine link:", "engine links:")) from None
    batch = max(1, nslots // 4) if batch is None else batch
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= nslots:
        raise ConfigError(f"engine links: batch {batch!r} must be a number of packets in 1..nslots ({nslots})")
    limit = resolve_timeout(timeout)
    pairs = link_pairs(world, links)
    mine = (pairs, geo.nslots, geo.chunk, geo.ll_max, batch)
    everyone = world.allgather_object(mine)
    differ = [r for r, theirs in enumerate(everyone) if theirs != mine]
    if differ:
        raise ConfigError(f"open_engine is collective and needs the same links and ring shape on every rank; rank "
                          f"{differ[0]} asked for {everyone[differ[0]]}, rank {world.rank} for {mine}")
    return EngineLinks(world, pairs, geo, batch, limit, spin)


class EngineLinks(Resource):
    """This rank's engine links (``engine[peer]``), their memory, the duplicated communicator and the proxy
    thread. Close it (collective) once the agents are done with the rings."""

    _kind = "engine links"

    def __init__(self, world: Any, pairs: list[tuple[int, int]], geo: P.RingGeometry, batch: int, timeout: float,
                 spin: bool) -> None:
        from ._mpi import MpiLink, MpiProxy

        self.world = world
        self.pairs = pairs
        self.geometry = geo
        self.timeout = timeout
        peers = sorted({b if a == world.rank else a for a, b in pairs if world.rank in (a, b)})
        self.peers = peers
        out_lay, in_lay, self._stride = link_layouts(geo)
        self.nbytes = max(1, len(peers)) * self._stride
        self._memory = None
        self._proxy = None
        self._comm = None
        with world.mpi_lock:
            self._comm = world.mpi_comm.Dup()  # collective; the links' traffic never meets the user's
        try:
            if peers:
                self._memory = world.engine("circuslink.links").HostMemory(world, self.nbytes)
            self._proxy = MpiProxy(world, self._comm, timeout, spin)
            self.links: dict[int, EngineLink] = {}
            for i, peer in enumerate(peers):
                base = i * self._stride
                mem = self._memory.array[base:base + self._stride]
                out_ring = Ring(mem, out_lay, geo)
                in_ring = Ring(mem, in_lay, geo)
                link = EngineLink(self, peer, out_ring, in_ring, self._memory.ptr + base, mem)
                self.links[peer] = link
                self._proxy.add(MpiLink(self._proxy, peer, out_ring, in_ring, batch))
            self._proxy.start()
            world.barrier()  # every proxy has posted its receives
        except BaseException:
            self._release_local()
            raise
        self._register(world)

    def __getitem__(self, peer: int) -> EngineLink:
        try:
            return self.links[peer]
        except KeyError:
            raise ConfigError(f"rank {self.world.rank} has no engine link to rank {peer} (its links: "
                              f"{', '.join(map(str, self.peers)) or 'none'})") from None

    def __contains__(self, peer: int) -> bool:
        return peer in self.links

    def check(self) -> None:
        """Raise the engine's recorded failure (:class:`EngineError`), if any."""
        self._check_open("check")
        self._proxy.check()

    def discard_incoming(self) -> None:
        """This rank's agents have stopped: from now on the proxy takes whatever still arrives in the in rings
        and drops it (late credit reports of the peers' agents), so a peer's flush never waits for room."""
        if self._proxy is not None:
            self._proxy.discard = True

    def _close(self, timeout: float | None) -> None:
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        self._proxy.close(deadline)
        self._proxy.free_types()
        with self.world.mpi_lock:
            self._comm.Free()  # collective, like the Dup
        self._comm = None
        self._free_memory()

    def _release_local(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy.free_types()
        self._free_memory()

    def _free_memory(self) -> None:
        thread = getattr(self._proxy, "_thread", None)
        if self._memory is not None and not (thread is not None and thread.is_alive()):
            self._memory.release()  # never under a proxy that is still running
            self._memory = None


class EngineLink:
    """One engine link seen from this rank: the out ring (agent writes, proxy sends) and the in ring (proxy
    writes, agent reads), and the ends agents use on them."""

    def __init__(self, engine: EngineLinks, peer: int, out_ring: Ring, in_ring: Ring, ptr: int,
                 memory: np.ndarray) -> None:
        self._engine = engine
        self.peer = peer
        self.rank = engine.world.rank
        self.out_ring = out_ring
        self.in_ring = in_ring
        self.ptr = ptr  # device-visible address of this link's memory (out ring block first)
        self.memory = memory  # the same block as bytes for host agents (offsets: link_layouts)
        self.geometry = engine.geometry

    def describe(self) -> str:
        return f"engine link (MPI) rank {self.rank} <-> rank {self.peer}"

    def check(self) -> None:
        """Raise the engine's recorded failure (:class:`EngineError`), if any."""
        self._engine.check()

    # -- host agents ---------------------------------------------------------------------------------
    def writer(self) -> AgentWriter:
        """The agent's side of the out ring, packet by packet (one writer per ring)."""
        return AgentWriter(self)

    def reader(self) -> AgentReader:
        """The agent's side of the in ring, packet by packet (one reader per ring)."""
        return AgentReader(self)

    def stream_sender(self, route: int) -> _ref.CpuSender:
        """The out ring as a channel's sending end (``write_bytes``): every packet carries ``route``."""
        r = self.out_ring
        return _LinkSender(self, "engine-out", f"{self.describe()}: the out ring's writer", 0, r.geometry, r.ring,
                           r.credit, r.slot_credits, r.send_error, self._engine.timeout, route)

    def stream_receiver(self) -> _ref.CpuReceiver:
        """The in ring as a channel's receiving end (``read_bytes``)."""
        r = self.in_ring
        return _LinkReceiver(self, "engine-in", f"{self.describe()}: the in ring's reader", 0, r.geometry, r.ring,
                             r.credit, r.slot_credits, r.recv_error, self._engine.timeout, 0)

    # -- device agents -------------------------------------------------------------------------------
    def sender_handle(self, route: int, channel_id: int = 0) -> np.void:
        """``circuslink::detail::ChannelHandle`` of the out ring's writer: a device agent's ``Sender<T>``."""
        return self._handle(self.out_ring, "send", route, channel_id)

    def receiver_handle(self, channel_id: int = 0) -> np.void:
        """``circuslink::detail::ChannelHandle`` of the in ring's reader: a device agent's ``Receiver<T>``."""
        return self._handle(self.in_ring, "recv", 0, channel_id)

    def _handle(self, ring: Ring, kind: str, route: int, channel_id: int) -> np.void:
        lay, geo = ring.layout, ring.geometry
        base = self.ptr
        return P.HANDLE.pack(
            ring=base + lay.ring, credit=base + lay.ctrl + P.CTRL_CREDIT, slot_credit=base + lay.slot_credits,
            state=base + lay.ctrl + (P.CTRL_SEND_STATE if kind == "send" else P.CTRL_RECV_STATE),
            error=base + lay.ctrl + (P.CTRL_SEND_ERROR if kind == "send" else P.CTRL_RECV_ERROR),
            abort=self._engine.world.backend.abort_ptr, timeout_ns=int(self._engine.timeout * 1e9),
            nslots=geo.nslots, slot_bytes=geo.slot_bytes, chunk=geo.chunk, route=route, ll_max=geo.ll_max,
            channel_id=channel_id)

    def device_error(self) -> None:
        """Raise :class:`ChannelError` for an error a device agent recorded on either ring (after the
        engine's own failure, which comes first)."""
        self.check()
        for error, what in ((self.out_ring.send_error, "out ring's writer"),
                            (self.in_ring.recv_error, "in ring's reader")):
            code = int(error[0])
            if code != P.ERR_NONE:
                seq = int(error[2]) | (int(error[3]) << 32)
                raise ChannelError(f"{self.describe()}: the {what} {P.ERROR_TEXT[code].format(seq=seq)}")


def _agent_limit(timeout: float) -> float:
    """An agent's wait is a backstop: the proxy, whose own waits have the link's time-out and started first,
    names the stalled side (MPI, the peer's full ring) before the agent gives up."""
    return 1.25 * timeout + 1.0


class AgentWriter:
    """A host agent writing packets into the out ring (waits bounded; a failed engine ends them at once with
    its :class:`EngineError`)."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link
        self._w = PacketWriter(link.out_ring, f"{link.describe()}: the out ring")

    def put(self, route: int, payload: bytes, bulk: bool | None = None) -> None:
        """One packet: bulk when ``bulk`` (or, with None, when over 120 bytes), else low-latency."""
        self.link.check()
        self._w.put(route, payload, bulk, _agent_limit(self.link._engine.timeout),
                    lambda: f"{self.link.describe()}: the out ring stayed full (packet {self._w.seq}): the proxy "
                            "sent nothing", self.link.check)


class AgentReader:
    """A host agent reading packets from the in ring."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link
        self._r = PacketReader(link.in_ring)

    def get(self) -> tuple[int, int, bytes]:
        """The next packet: (route word, size-and-kind word, payload)."""
        self.link.check()
        return self._r.get(_agent_limit(self.link._engine.timeout),
                           lambda: f"{self.link.describe()}: no packet arrived in the in ring (packet {self._r.seq})",
                           self.link.check)

    def poll(self) -> bool:
        """Whether the next packet has arrived."""
        return self._r.poll()


class _LinkEnd:
    """The channel reference's waits, ending at once with the engine's error when the proxy fails."""

    def _wait(self, ready, code: int, seq: int) -> None:
        from .._wait import wait_until
        from ..errors import TimeoutError

        self._check_error()
        try:
            wait_until(ready, Deadline.after(_agent_limit(self.timeout_s)), self.describe, self._link.check)
        except TimeoutError:
            raise self._fail(code, seq) from None

    def _check_error(self) -> None:
        self._link.check()
        super()._check_error()


class _LinkSender(_LinkEnd, _ref.CpuSender):
    def __init__(self, link: EngineLink, *args: Any) -> None:
        self._link = link
        super().__init__(*args)

    def write_bytes(self, data: bytes) -> None:
        self._check_error()  # a failed engine says so even when the ring has room
        super().write_bytes(data)


class _LinkReceiver(_LinkEnd, _ref.CpuReceiver):
    def __init__(self, link: EngineLink, *args: Any) -> None:
        self._link = link
        super().__init__(*args)

    def read_bytes(self, nbytes: int) -> bytes:
        self._check_error()
        return super().read_bytes(nbytes)

