"""Packets in a ring of the channel format (docs/protocol.md), read and written whole, headers kept.

A channel end moves a byte stream; a forwarding hop moves **packets**: the route word (destination rank and
channel) and the size-and-kind word travel with the payload, so the next hop knows where the packet goes.
These classes read and write one ring packet by packet on the host, byte for byte as the channel ends do
(``channels/_cpu.py``: data before the flags that publish them, bulk payload before its header; x86's total
store order keeps the host's stores in that order, and the device's fences order its own). A relay
(``_relay.py``) reads its out ring with a :class:`PacketReader` and writes its in ring with a
:class:`PacketWriter`; host agents use the other halves. The mpi transport's compiled progress thread
(``mpi_progress.cpp``) and the nvshmem proxy kernel (``nvshmem_proxy.cu``) do the same in compiled code.

Sizes: ``nbytes = word2 & 0xFFFFFF`` (a packet holds at most a 1 MiB chunk), so a routed header that keeps
its virtual channel in bits 24..27 of word 2 (docs/routing.md) crosses unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._wait import Deadline, wait_until
from ..channels import protocol as P

SIZE_MASK = 0x00FFFFFF  # payload bytes in header word 2 (bits 24..27 may hold a routed packet's VC)
LL_WORDS = P.LL_UNITS - 2  # 30 payload words of a low-latency packet


def relay_layouts(geometry: P.RingGeometry) -> tuple[P.ChannelLayout, P.ChannelLayout, int]:
    """Where one relay's two rings sit in its block of memory: (out ring, in ring, block bytes).
    Each ring has a channel's layout (control block with the credit counter and both ends' error records,
    slot credits, slots); the forwarding agents address them by these offsets (docs/routing.md)."""
    out_lay = P.layout(0, geometry)
    in_lay = P.layout(out_lay.end, geometry)
    return out_lay, in_lay, -(-in_lay.end // 4096) * 4096


class Ring:
    """One ring in host-visible memory: its slots, the credit counter and slot credits (in the writer's
    memory: here the same block) and the error records of both ends, at the offsets of ``layout``."""

    def __init__(self, memory: np.ndarray, layout: P.ChannelLayout, geometry: P.RingGeometry) -> None:
        self.geometry = geometry
        self.layout = layout
        self.nslots = geometry.nslots
        self.slot_bytes = geometry.slot_bytes
        self.ring = memory[layout.ring:layout.ring + geometry.ring_bytes]
        self.words = self.ring.view("<u4")
        ctrl = layout.ctrl
        self.credit = memory[ctrl + P.CTRL_CREDIT:ctrl + P.CTRL_CREDIT + 8].view("<u8")
        self.slot_credits = memory[layout.slot_credits:layout.slot_credits + 4 * geometry.nslots].view("<u4")
        self.send_error = memory[ctrl + P.CTRL_SEND_ERROR:ctrl + P.CTRL_SEND_ERROR + 16].view("<u4")
        self.recv_error = memory[ctrl + P.CTRL_RECV_ERROR:ctrl + P.CTRL_RECV_ERROR + 16].view("<u4")

    def head(self, seq: int) -> int:
        """Word index of packet ``seq``'s slot."""
        return (seq % self.nslots) * self.slot_bytes // 4

    def bulk_offset(self, seq: int) -> int:
        """Byte offset (in ``ring``) of packet ``seq``'s bulk area."""
        return (seq % self.nslots) * self.slot_bytes + P.LL_AREA_BYTES


class PacketReader:
    """Reads a ring packet by packet (the reader's side): :meth:`poll` says whether packet ``seq`` is
    published, :meth:`header` / :meth:`payload` read it, :meth:`release` returns slots to the writer."""

    def __init__(self, ring: Ring) -> None:
        self.r = ring
        self.seq = 0  # next packet to read
        self.released = 0  # packets whose slots went back to the writer

    def poll(self, seq: int | None = None) -> bool:
        """Whether packet ``seq`` (default: the next) is published: its header and, for a low-latency
        packet, every unit its size covers."""
        seq = self.seq if seq is None else seq
        w = self.r.words
        head = self.r.head(seq)
        flag = P.flag_of(seq)
        if w[head + 3] != flag:
            return False
        word = int(w[head + 2])
        if word & P.KIND_BULK:
            return True
        units = -(-(word & SIZE_MASK) // 4)
        return bool(np.all(w[head + 5:head + 5 + 2 * units:2] == flag))

    def header(self, seq: int) -> tuple[int, int]:
        """(route word, size-and-kind word) of a published packet."""
        head = self.r.head(seq)
        return int(self.r.words[head]), int(self.r.words[head + 2])

    def ll_words(self, seq: int, nbytes: int) -> np.ndarray:
        """The payload words (uint32) of a published low-latency packet: ceil(nbytes / 4) of them."""
        head = self.r.head(seq)
        return self.r.words[head + 4:head + 4 + 2 * (-(-nbytes // 4)):2]

    def payload(self, seq: int) -> bytes:
        """The payload of a published packet."""
        _, word = self.header(seq)
        n = word & SIZE_MASK
        if word & P.KIND_BULK:
            at = self.r.bulk_offset(seq)
            return self.r.ring[at:at + n].tobytes()
        return self.ll_words(seq, n).tobytes()[:n]

    def release(self, upto: int) -> None:
        """Give the slots of packets before ``upto`` back to the writer: slot credits, then the counter."""
        for seq in range(self.released, upto):
            self.r.slot_credits[seq % self.r.nslots] = P.flag_of(seq)
        if upto > self.released:
            self.released = upto
            self.r.credit[0] = upto

    def get(self, deadline: Deadline | float | None, what: str | Callable[[], str],
            check: Callable[[], None] | None = None) -> tuple[int, int, bytes]:
        """Wait for the next packet, take it and give its slot back: (route, size-and-kind word, payload)."""
        seq = self.seq
        wait_until(lambda: self.poll(seq), deadline, what, check)
        route, word = self.header(seq)
        data = self.payload(seq)
        self.seq = seq + 1
        self.release(self.seq)
        return route, word, data


def consumed_from(ring: Ring, known: int, written: int) -> int:
    """How many packets of ``ring`` its reader has given back, in order, given that at least ``known`` have and
    ``written`` were written: the reader's in-order counter and, past it, every packet whose slot credit is back.

    Readers return credits two ways (docs/protocol.md, Credits): every form stores each consumed packet's slot
    credit at once; the warp, block and thread forms store the in-order counter every half ring and before they
    wait, but the grid forms (several warps, each taking its own packets) only when a call or a grid session ends.
    A writer that waited for the counter alone would stop one ring into a grid session; this is what a relay's
    transport counts as room in the in ring. A stale slot credit (an earlier lap's packet) never matches:
    ``flag_of(seq)`` differs from ``flag_of(seq - k * nslots)``."""
    done = max(known, int(ring.credit[0]))
    while done < written and int(ring.slot_credits[done % ring.nslots]) == P.flag_of(done):
        done += 1
    return done


class PacketWriter:
    """Writes a ring packet by packet (the writer's side), with the header words given: the stores of
    ``channels/_cpu.py`` in their order. Credits: packet ``seq`` may be written once ``seq < consumed +
    nslots``, where ``consumed`` counts what the reader gave back (:func:`consumed_from`)."""

    def __init__(self, ring: Ring, name: str = "ring") -> None:
        self.r = ring
        self.name = name  # how errors name the ring
        self.seq = 0  # next packet to write
        self._consumed = 0

    def consumed(self) -> int:
        """Packets the reader has given back, in order (its counter, or further by its slot credits)."""
        self._consumed = consumed_from(self.r, self._consumed, self.seq)
        return self._consumed

    def free(self) -> int:
        """Slots the reader has given back and no packet holds."""
        return self.consumed() + self.r.nslots - self.seq

    def write_ll(self, seq: int, route: int, word: int, words: np.ndarray) -> None:
        """Publish low-latency packet ``seq``: data units (word, flag), then the header units."""
        n = word & SIZE_MASK
        flag = P.flag_of(seq)
        head = self.r.head(seq)
        w = self.r.words
        units = LL_WORDS if P.rewrites_all(seq, self.r.nslots) else -(-n // 4)
        data = w[head + 4:head + 4 + 2 * units].reshape(units, 2)
        data[:len(words), 0] = words
        data[len(words):, 0] = 0
        data[:, 1] = flag
        w[head] = route
        w[head + 2] = word
        w[head + 1] = flag
        w[head + 3] = flag

    def write_bulk_payload(self, seq: int, payload: bytes | np.ndarray) -> None:
        """Copy a bulk packet's payload into its slot (zero padded to 16 bytes), before :meth:`publish_bulk`."""
        data = np.frombuffer(payload, dtype=np.uint8) if isinstance(payload, bytes | bytearray) else payload
        at = self.r.bulk_offset(seq)
        n = len(data)
        self.r.ring[at:at + n] = data
        self.r.ring[at + n:at + -(-n // 16) * 16] = 0

    def publish_bulk(self, seq: int, route: int, word: int) -> None:
        """Publish bulk packet ``seq`` whose payload is in its slot: the header, last."""
        flag = P.flag_of(seq)
        head = self.r.head(seq)
        w = self.r.words
        if P.rewrites_all(seq, self.r.nslots):
            data = w[head + 4:head + 4 + 2 * LL_WORDS].reshape(-1, 2)
            data[:, 0] = 0
            data[:, 1] = flag
        w[head] = route
        w[head + 2] = word
        w[head + 1] = flag
        w[head + 3] = flag

    def put(self, route: int, payload: bytes, bulk: bool | None, deadline: Deadline | float | None,
            what: str | Callable[[], str], check: Callable[[], None] | None = None) -> None:
        """Wait for a free slot and write one packet (bulk when ``bulk`` or, with None, over 120 bytes)."""
        n = len(payload)
        bulk = n > P.LL_PAYLOAD if bulk is None else bulk
        limit = self.r.geometry.chunk if bulk else P.LL_PAYLOAD
        if not 1 <= n <= limit:
            from ..errors import ConfigError

            raise ConfigError(f"{self.name}: a {'bulk' if bulk else 'low-latency'} packet holds 1..{limit} bytes, "
                              f"got {n}")
        seq = self.seq
        wait_until(lambda: self.free() > 0, deadline, what, check)
        if bulk:
            self.write_bulk_payload(seq, payload)
            self.publish_bulk(seq, route, n | P.KIND_BULK)
        else:
            words = np.frombuffer(payload + bytes(-n % 4), dtype="<u4")
            self.write_ll(seq, route, n, words)
        self.seq = seq + 1
