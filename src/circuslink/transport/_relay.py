"""Relays: packet pipes between gateway ranks of different nodes, carried by a transport (docs/scale.md).

A forwarding agent sees a relay as two rings in the channel format of docs/protocol.md, like any link ring:

* the **out ring**: the agent writes packets (route word and all); the transport carries them;
* the **in ring**: the transport writes the peer's packets; the agent reads them.

Packet ``s`` of this rank's out ring becomes packet ``s`` of the peer's in ring, headers unchanged. Credits end
to end: a packet crosses only while the peer's in ring has room, and the out ring's slots go back to the agent
once their packets have left. Every wait has the relays' time-out; a failure is one line naming the link, both
ranks and the transport (:class:`circuslink.TransportError`), raised by the next host call and recorded in the
agents' ends (error code "aborted"), so device and host agents stop waiting at once.

This module holds what every transport's relays share (:class:`Relay`, :class:`RelayGroup`, the host agents'
packet ends) and the **generic relay** (:class:`GenericRelays`): a host thread per gateway that moves packets
with its connections' put-with-signal, for transports that bring no compiled relay of their own (a plug-in, the
tests' fake). The mpi transport's relay is compiled (``mpi_progress.cpp``), the nvshmem one a proxy kernel.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from .._lifecycle import Resource
from .._wait import Deadline
from ..channels import protocol as P
from ..errors import ChannelError, ConfigError, TransportError
from ._base import Part, describe_link
from ._rings import LL_WORDS, SIZE_MASK, PacketReader, PacketWriter, Ring, relay_layouts


def agent_limit(timeout: float) -> float:
    """A host agent's wait is a backstop: the transport, whose own waits have the relays' time-out and started
    first, names the stalled side before the agent gives up."""
    return 1.25 * timeout + 1.0


class Relay:
    """This rank's relay to one peer gateway: its two rings, where they are, and the ends agents use on them.

    ``memory``: the relay's block as bytes the host can read (numpy; a cupy array where the rings live in device
    memory); ``ptr``: its device-visible address (out ring first, offsets of :func:`relay_layouts`)."""

    def __init__(self, group: RelayGroup, peer: int, memory: Any, ptr: int) -> None:
        self._group = group
        self.peer = peer
        self.rank = group.world.rank
        self.geometry = group.geometry
        self.memory = memory
        self.ptr = ptr
        out_lay, in_lay, _ = relay_layouts(self.geometry)
        self.out_ring = Ring(memory, out_lay, self.geometry)
        self.in_ring = Ring(memory, in_lay, self.geometry)

    @property
    def transport(self) -> Any:
        return self._group.transport

    @property
    def timeout(self) -> float:
        return self._group.timeout

    def describe(self) -> str:
        return describe_link(self.rank, self.peer, self.transport.name)

    def check(self) -> None:
        """Raise the transport's recorded failure (:class:`TransportError`), if any."""
        self._group.check()

    def view(self, offset: int, nbytes: int) -> Any:
        """Bytes ``offset .. offset + nbytes`` of the relay's block (host agents address the rings this way)."""
        return self.memory[offset:offset + nbytes]

    # -- host agents ---------------------------------------------------------------------------------
    def writer(self) -> AgentWriter:
        """The agent's side of the out ring, packet by packet (one writer per ring)."""
        return AgentWriter(self)

    def reader(self) -> AgentReader:
        """The agent's side of the in ring, packet by packet (one reader per ring)."""
        return AgentReader(self)

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
            abort=self._group.world.backend.abort_ptr, timeout_ns=int(self.timeout * 1e9),
            nslots=geo.nslots, slot_bytes=geo.slot_bytes, chunk=geo.chunk, route=route, ll_max=geo.ll_max,
            channel_id=channel_id, flags=0)  # never HANDLE_GPU_SCOPE: a host thread or a peer reads these rings

    def device_error(self) -> None:
        """Raise :class:`ChannelError` for an error a device agent recorded on either ring (after the
        transport's own failure, which comes first)."""
        self.check()
        for error, what in ((self.out_ring.send_error, "out ring's writer"),
                            (self.in_ring.recv_error, "in ring's reader")):
            words = [int(x) for x in error[:4]]
            if words[0] != P.ERR_NONE:
                seq = words[2] | (words[3] << 32)
                text = P.ERROR_TEXT.get(words[0], "failed (error code {code})").format(seq=seq, code=words[0])
                raise ChannelError(f"{self.describe()}: the {what} {text}")

    def tell_agents(self, sent: int, received: int) -> None:
        """Record ERR_ABORTED in the agents' ends (out ring: the writer; in ring: the reader), so device and host
        agents stop waiting at once (host memory only: a device-memory relay's proxy kernel does it itself)."""
        if not isinstance(self.memory, np.ndarray):
            return
        for error, seq in ((self.out_ring.send_error, sent), (self.in_ring.recv_error, received)):
            if error[0] == P.ERR_NONE:
                error[1] = 0
                error[2] = seq & 0xFFFFFFFF
                error[3] = seq >> 32
                error[0] = P.ERR_ABORTED


class AgentWriter:
    """A host agent writing packets into the out ring (waits bounded; a failed transport ends them at once)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._w = PacketWriter(relay.out_ring, f"{relay.describe()}: the out ring")

    def put(self, route: int, payload: bytes, bulk: bool | None = None) -> None:
        """One packet: bulk when ``bulk`` (or, with None, when over 120 bytes), else low-latency."""
        self.relay.check()
        self._w.put(route, payload, bulk, agent_limit(self.relay.timeout),
                    lambda: f"{self.relay.describe()}: the out ring stayed full (packet {self._w.seq}): the "
                            "transport sent nothing", self.relay.check)


class AgentReader:
    """A host agent reading packets from the in ring."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._r = PacketReader(relay.in_ring)

    def get(self) -> tuple[int, int, bytes]:
        """The next packet: (route word, size-and-kind word, payload)."""
        self.relay.check()
        return self._r.get(agent_limit(self.relay.timeout),
                           lambda: f"{self.relay.describe()}: no packet arrived in the in ring (packet {self._r.seq})",
                           self.relay.check)

    def poll(self) -> bool:
        """Whether the next packet has arrived."""
        return self._r.poll()


class RelayGroup(Part):
    """One transport's relays of one :func:`~circuslink.transport.open_relays` on this rank (``group.relays``)."""

    def __init__(self, transport: Any, world: Any, geometry: P.RingGeometry, timeout: float) -> None:
        self.transport = transport
        self.world = world
        self.geometry = geometry
        self.timeout = timeout
        self.relays: dict[int, Relay] = {}
        self.error: TransportError | None = None
        self.device_blocks = 0  # blocks of a proxy kernel this group keeps resident on the rank's GPU

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def discard_incoming(self) -> None:
        """This rank's agents have stopped: from now on what still arrives is taken and dropped (the peers'
        agents' last credit reports), so a peer's flush never waits for room no agent frees."""


class Relays(Resource):
    """This rank's relays of one :func:`~circuslink.transport.open_relays` (``relays[peer]``), whatever their
    transports, and the parts that close them. Close it (collective) once the agents are done with the rings."""

    _kind = "relays"

    def __init__(self, world: Any, geometry: P.RingGeometry, timeout: float, groups: list[RelayGroup]) -> None:
        self.world = world
        self.geometry = geometry
        self.timeout = timeout
        self._groups = groups
        self.relays = {peer: relay for g in groups for peer, relay in g.relays.items()}
        self.peers = sorted(self.relays)
        self.device_blocks = sum(g.device_blocks for g in groups)  # SMs kernels that wait on peers leave free
        self._register(world)

    def __getitem__(self, peer: int) -> Relay:
        try:
            return self.relays[peer]
        except KeyError:
            raise ConfigError(f"rank {self.world.rank} has no relay to rank {peer} (its relays: "
                              f"{', '.join(map(str, self.peers)) or 'none'})") from None

    def __contains__(self, peer: int) -> bool:
        return peer in self.relays

    def transports(self) -> dict[int, str]:
        """``{peer: transport name}`` of this rank's relays."""
        return {peer: relay.transport.name for peer, relay in self.relays.items()}

    def check(self) -> None:
        """Raise the first recorded failure of this rank's relays (:class:`TransportError`), if any."""
        for g in self._groups:
            g.check()

    def discard_incoming(self) -> None:
        """This rank's agents have stopped: what still arrives is taken and dropped from now on."""
        for g in self._groups:
            g.discard_incoming()

    def _close(self, timeout: float | None) -> None:
        """Collective: flush every relay, say goodbye to the peers, free the rings."""
        errors = []
        for g in self._groups:
            try:
                g.close(timeout)
            except BaseException as exc:  # close the others, then raise the first
                errors.append(exc)
        if errors:
            raise errors[0]

    def _release_local(self) -> None:
        for g in self._groups:
            g.release_local()


# -- the generic relay: a host thread, over any transport's connections ----------------------------------------
SIG_ARRIVED, SIG_CREDIT, SIG_BYE = 0, 1, 2  # signal words: packets put, packets consumed, 1 + packets sent at close
_STAGE_HEAD = 16  # a staged packet: route, size-and-kind word, then its payload (LL: the 30 words; bulk: bytes)


def _stage_bytes(geo: P.RingGeometry) -> int:
    return _STAGE_HEAD + -(-max(geo.chunk, 4 * LL_WORDS) // 16) * 16


class _GenericLink:
    """One relay's state in the generic relay thread: packets out of the out ring go through the connection into
    the peer's staging slots, with a signal counting them; the peer's thread publishes them in its in ring."""

    def __init__(self, relay: Relay, connection: Any, batch: int) -> None:
        self.relay = relay
        self.conn = connection
        self.out = PacketReader(relay.out_ring)
        self.into = PacketWriter(relay.in_ring)
        self.geo = relay.geometry
        self.stage = _stage_bytes(self.geo)
        self.batch = batch
        self.reported = 0
        self.blocked_since: float | None = None
        self.bye_sent = False
        self.done = False
        self.close_since: float | None = None

    def fail(self, what: str) -> TransportError:
        return TransportError(f"{self.relay.describe()}: {what}")

    def progress(self, now: float, closing: bool, discard: bool, timeout: float) -> bool:
        signals = self.conn.signals()
        moved = self._send(now, int(signals[SIG_CREDIT]), timeout)
        moved |= self._receive(int(signals[SIG_ARRIVED]))
        consumed = self.into.consumed()  # the counter, or further by slot credits (a grid agent's)
        if discard and consumed < self.into.seq:
            self.into.r.credit[0] = consumed = self.into.seq  # no agent reads any more: take and drop
        if consumed > self.reported and (consumed - self.reported >= max(1, self.geo.nslots // 4)
                                         or consumed == self.into.seq):
            self.conn.signal(SIG_CREDIT, consumed)
            self.reported = consumed
            moved = True
        if closing:
            moved |= self._close_step(now, int(signals[SIG_BYE]), timeout)
        return moved

    def _send(self, now: float, consumed: int, timeout: float) -> bool:
        out, moved = self.out, 0
        while moved < self.batch and out.poll(out.seq):
            seq = out.seq
            if seq - consumed >= self.geo.nslots:
                if self.blocked_since is None:
                    self.blocked_since = now
                elif now - self.blocked_since > timeout:
                    raise self.fail(f"rank {self.conn.peer}'s in ring stayed full for {timeout:g} s (its agent "
                                    f"stopped taking packets; packet {seq} waits to cross)")
                break
            route, word = out.header(seq)
            n = word & SIZE_MASK
            if not 1 <= n <= (self.geo.chunk if word & P.KIND_BULK else P.LL_PAYLOAD):
                raise self.fail(f"packet {seq} in this rank's out ring has a corrupt header (size {n})")
            payload = np.frombuffer(out.payload(seq), dtype=np.uint8)
            image = np.zeros(_STAGE_HEAD + len(payload), dtype=np.uint8)
            image[:8].view("<u4")[:] = (route, word)
            image[_STAGE_HEAD:] = payload
            self.conn.put_with_signal((seq % self.geo.nslots) * self.stage, image, SIG_ARRIVED, seq + 1)
            out.seq = seq + 1
            out.release(out.seq)  # put returns once the source may be reused: the slot goes back
            moved += 1
        if moved or not out.poll(out.seq):
            self.blocked_since = None
        return moved > 0

    def _receive(self, arrived: int) -> bool:
        into, moved = self.into, False
        inbox = None
        while into.seq < arrived:
            seq = into.seq
            if inbox is None:
                inbox = np.asarray(self.conn.inbox())
            at = (seq % self.geo.nslots) * self.stage
            route, word = (int(x) for x in inbox[at:at + 8].view("<u4"))
            n = word & SIZE_MASK
            payload = inbox[at + _STAGE_HEAD:at + _STAGE_HEAD + n]
            if word & P.KIND_BULK:
                into.write_bulk_payload(seq, payload)
                into.publish_bulk(seq, route, word)
            else:
                words = np.frombuffer(payload.tobytes() + bytes(-n % 4), dtype="<u4")
                into.write_ll(seq, route, word, words)
            into.seq = seq + 1
            moved = True
        return moved

    def _close_step(self, now: float, peer_bye: int, timeout: float) -> bool:
        if self.close_since is None:
            self.close_since = now
        moved = False
        if not self.bye_sent and not self.out.poll(self.out.seq):
            self.conn.signal(SIG_BYE, self.out.seq + 1)
            self.bye_sent = moved = True
        if self.bye_sent and peer_bye and self.into.seq == peer_bye - 1:
            self.conn.flush()
            self.done = True
            return True
        if now - self.close_since > timeout:
            if not self.bye_sent:
                why = f"packet {self.out.seq} could not cross: rank {self.conn.peer}'s in ring stayed full"
            elif not peer_bye:
                why = f"rank {self.conn.peer} did not close its end"
            else:
                why = f"packets from rank {self.conn.peer} did not all arrive ({self.into.seq} of {peer_bye - 1})"
            raise self.fail(f"closing timed out after {timeout:g} s: {why}")
        return moved


class GenericRelays(RelayGroup):
    """The generic relays of one transport on this rank: rings in host memory the device can reach, one host
    thread moving packets over the transport's connections (see the module docstring)."""

    def __init__(self, transport: Any, world: Any, peers: list[int], geometry: P.RingGeometry, batch: int,
                 timeout: float, spin: bool) -> None:
        from . import connect

        super().__init__(transport, world, geometry, timeout)
        self.spin = spin
        self._discard = False
        self._closing = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        _, _, stride = relay_layouts(geometry)
        self._memory = world.backend.host_memory(max(1, len(peers)) * stride) if peers else None
        self._connections = connect(world, peers, nbytes=geometry.nslots * _stage_bytes(geometry), nsignals=3,
                                    transport=transport.name, timeout=timeout)
        self._links: list[_GenericLink] = []
        for i, peer in enumerate(peers):
            memory = self._memory.array[i * stride:(i + 1) * stride]
            relay = Relay(self, peer, memory, self._memory.ptr + i * stride)
            self.relays[peer] = relay
            self._links.append(_GenericLink(relay, self._connections[peer], batch))
        if self._links:
            self._thread = threading.Thread(target=self._run, name=f"circuslink-relay-{world.rank}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        idle = 0
        try:
            self.world.backend.bind_thread()  # its device calls run in this rank's context (its own SMs)
            while not self._stop.is_set():
                now = time.monotonic()
                closing = self._closing.is_set()
                moved = False
                for link in self._links:
                    if not link.done:
                        moved |= link.progress(now, closing, self._discard, self.timeout)
                if all(link.done for link in self._links):
                    return
                idle = 0 if moved else idle + 1
                if not moved and not self.spin:
                    time.sleep(0 if idle < 2000 else 200e-6)
        except BaseException as exc:  # noqa: BLE001 - recorded, then raised on the host's next call
            self.error = exc if isinstance(exc, TransportError) else TransportError(
                f"relay (transport {self.transport.name}) of rank {self.world.rank}: {type(exc).__name__}: {exc}")
            for link in self._links:
                link.relay.tell_agents(link.out.seq, link.into.seq)

    def discard_incoming(self) -> None:
        self._discard = True

    def close(self, timeout: float | None) -> None:
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        self._closing.set()
        if self._thread is not None:
            self._thread.join(deadline.remaining() + 1.0)
            if self._thread.is_alive():
                self._stop.set()
                self._thread.join(2.0)
                if self.error is None:
                    pending = [link.relay.peer for link in self._links if not link.done]
                    self.error = TransportError(f"relay (transport {self.transport.name}) of rank {self.world.rank}: "
                                                f"closing the links to rank(s) {', '.join(map(str, pending))} did not "
                                                f"finish within {deadline.limit:g} s")
        try:
            self.check()
        finally:
            self._connections.close(deadline.remaining() + 1.0)
            self._free()

    def release_local(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        self._connections.release_local()
        self._free()

    def _free(self) -> None:
        if self._memory is not None and not (self._thread is not None and self._thread.is_alive()):
            self._memory.release()
            self._memory = None


def open_generic_relays(transport: Any, world: Any, peers: list[int], geometry: P.RingGeometry, batch: int,
                        timeout: float, spin: bool) -> tuple[RelayGroup, dict[int, Relay]]:
    group = GenericRelays(transport, world, peers, geometry, batch, timeout, spin)
    return group, group.relays

