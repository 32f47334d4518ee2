"""The channel protocol's numbers and layouts, in one place (docs/protocol.md explains them).

Mirrored by ``include/circuslink/detail/channel_types.cuh``; change both together. The
pure encoder :func:`encode_packets` writes packets into a ring array exactly as the device
and the cpu back-end do, and is what the shared test vectors are made from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _abi as abi
from ..errors import ConfigError

MODE_LL = 0
MODE_BW = 1
MODES = {"ll": MODE_LL, "bw": MODE_BW}

LINE_BYTES = 16
LL_LINES = 16
LL_SLOT_BYTES = LL_LINES * LINE_BYTES  # 256
LL_LINE_PAYLOAD = 8
LL_PAYLOAD = (LL_LINES - 1) * LL_LINE_PAYLOAD  # 120
BW_HEADER_BYTES = 16
BW_DEFAULT_CHUNK = 64 << 10
BW_MIN_CHUNK = 256
AUTO_LL_MAX_RING = 64 << 10  # payload bytes: rings up to this size default to LL

# control block (per channel, 128 bytes, in every rank's copy; each field used on its owner)
CTRL_BYTES = 128
CTRL_CREDIT = 0  # u64, sender's copy: packets consumed in order (written by the receiver)
CTRL_SEND_STATE = 16  # u64 seq, u64 credit_cache, u32 departed, u32 pad
CTRL_RECV_STATE = 48  # u64 seq, u32 offset, u32 departed, u64 returned
CTRL_SEND_ERROR = 80  # u32 code, u32 channel id, u32 seq lo, u32 seq hi
CTRL_RECV_ERROR = 96

ERR_NONE = 0
ERR_DATA_TIMEOUT = 1
ERR_CREDIT_TIMEOUT = 2
ERR_MISUSE = 3
ERR_ABORTED = 4
ERROR_TEXT = {
    ERR_DATA_TIMEOUT: "waited for data (packet seq {seq}) from its sender",
    ERR_CREDIT_TIMEOUT: "waited for credits (to write packet seq {seq}): its reader stopped consuming",
    ERR_MISUSE: "was misused at packet seq {seq} (write_grid must be read by read_grid of the same n)",
    ERR_ABORTED: "was waiting at packet seq {seq} when the host gave up on the kernel",
}

FLAG_MASK = 0xFFFFFFFF

# What a kernel receives: circuslink::detail::ChannelHandle (detail/channel_types.cuh), by value.
HANDLE = abi.Struct("circuslink::detail::ChannelHandle", "circuslink/detail/channel_types.cuh", [
    ("ring", abi.PTR), ("credit", abi.PTR), ("slot_credit", abi.PTR), ("state", abi.PTR), ("error", abi.PTR),
    ("abort", abi.PTR), ("timeout_ns", abi.U64), ("nslots", abi.U32), ("slot_bytes", abi.U32),
    ("payload", abi.U32), ("route", abi.U32), ("mode", abi.U32), ("channel_id", abi.U32)])
HANDLE_DTYPE = HANDLE.dtype
SEND_STATE = abi.Struct("circuslink::detail::SendState", "circuslink/detail/channel_types.cuh", [
    ("seq", abi.U64), ("credit_cache", abi.U64), ("departed", abi.U32), ("pad", abi.U32)])
RECV_STATE = abi.Struct("circuslink::detail::RecvState", "circuslink/detail/channel_types.cuh", [
    ("seq", abi.U64), ("offset", abi.U32), ("departed", abi.U32), ("returned", abi.U64)])


REWRITE_PERIOD = 1 << 31  # LL: the first lap after every multiple of this writes every line of its slots


def flag_of(seq: int) -> int:
    """Packet ``seq``'s flag: never 0, and unlike its slot's previous occupants' (docs/protocol.md)."""
    return (seq & FLAG_MASK) | 1


def ll_rewrites_all(seq: int, nslots: int) -> bool:
    """LL packets of the first lap after each multiple of 2^31 write all 15 data lines, so no line
    survives long enough (2^32 packets) for its flag to come round again."""
    return seq % REWRITE_PERIOD < nslots


def ll_lines(seq: int, nbytes: int, nslots: int) -> int:
    """Data lines an LL packet writes: those below ``nbytes``, or all of them on a rewrite lap."""
    return LL_LINES - 1 if ll_rewrites_all(seq, nslots) else -(-nbytes // LL_LINE_PAYLOAD)


def route_of(recv_id: int, dst_rank: int) -> int:
    if not 0 <= recv_id < (1 << 16) or not 0 <= dst_rank < (1 << 16):
        raise ConfigError(f"route: channel id {recv_id} and rank {dst_rank} must each fit in 16 bits")
    return recv_id | (dst_rank << 16)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class RingGeometry:
    """How one channel's ring is shaped."""

    mode: int
    nslots: int
    slot_bytes: int
    payload: int  # payload capacity of one packet

    @property
    def ring_bytes(self) -> int:
        return self.nslots * self.slot_bytes

    @property
    def mode_name(self) -> str:
        return "ll" if self.mode == MODE_LL else "bw"


def geometry(depth: int, element_bytes: int, mode: str = "auto", nslots: int | None = None,
             chunk: int | None = None, name: str = "?") -> RingGeometry:
    """Ring shape for a channel of ``depth`` elements of ``element_bytes`` (see docs/protocol.md, Sizing)."""
    if mode not in ("auto", "ll", "bw"):
        raise ConfigError(f"channel {name}: mode {mode!r} must be 'auto', 'll' or 'bw'")
    ring_payload = depth * element_bytes
    if mode == "auto":
        mode = "ll" if ring_payload <= AUTO_LL_MAX_RING else "bw"
    if mode == "ll":
        if chunk is not None:
            raise ConfigError(f"channel {name}: 'chunk' applies to mode 'bw' only")
        payload, slot_bytes = LL_PAYLOAD, LL_SLOT_BYTES
    else:
        if chunk is None:
            chunk = BW_DEFAULT_CHUNK
            # keep at least 4 slots so writer and reader overlap
            while chunk > BW_MIN_CHUNK and ring_payload < 4 * chunk:
                chunk //= 2
        if chunk % 16 or chunk < 16:
            raise ConfigError(f"channel {name}: chunk {chunk} must be a positive multiple of 16 bytes")
        payload, slot_bytes = chunk, BW_HEADER_BYTES + chunk
    if nslots is None:
        nslots = max(2, _next_pow2(-(-ring_payload // payload)))
    elif nslots < 2 or nslots & (nslots - 1):
        # two at least: a reader polls the packet after the one it holds, which needs its own slot
        raise ConfigError(f"channel {name}: nslots {nslots} must be a power of two, at least 2")
    return RingGeometry(MODES[mode], nslots, slot_bytes, payload)


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class ChannelLayout:
    """Byte offsets of one channel's parts inside the symmetric allocation."""

    ctrl: int
    slot_credits: int
    ring: int
    end: int


def layout(offset: int, geo: RingGeometry) -> ChannelLayout:
    ctrl = _align(offset, 256)
    slot_credits = ctrl + CTRL_BYTES
    ring = _align(slot_credits + 4 * geo.nslots, 256)
    return ChannelLayout(ctrl, slot_credits, ring, ring + geo.ring_bytes)


# -- the encoder (reference for test vectors) -----------------------------------------------------
def packet_image(geo: RingGeometry, seq: int, route: int, payload: bytes) -> list[tuple[int, bytes]]:
    """The (offset within the slot, bytes) stores that put packet ``seq`` carrying ``payload`` in its slot."""
    n = len(payload)
    if not 1 <= n <= geo.payload:
        raise ConfigError(f"packet payload of {n} bytes is outside 1..{geo.payload}")
    flag = flag_of(seq)
    header = np.array([route, flag, n, flag], dtype="<u4").tobytes()
    if geo.mode == MODE_LL:
        stores = []
        nlines = ll_lines(seq, n, geo.nslots)
        padded = payload + bytes(nlines * LL_LINE_PAYLOAD - n)
        words = np.frombuffer(padded, dtype="<u4").reshape(nlines, 2)
        lines = np.empty((nlines, 4), dtype="<u4")
        lines[:, 0] = words[:, 0]
        lines[:, 1] = flag
        lines[:, 2] = words[:, 1]
        lines[:, 3] = flag
        stores.append((LINE_BYTES, lines.tobytes()))
        stores.append((0, header))
        return stores
    padded = payload + bytes(_align(n, 16) - n)
    return [(BW_HEADER_BYTES, padded), (0, header)]


def encode_packets(geo: RingGeometry, route: int, ring: np.ndarray, first_seq: int,
                   pieces: list[bytes]) -> int:
    """Store packets carrying ``pieces`` (one per packet) from ``first_seq`` into ``ring``; return next seq."""
    seq = first_seq
    for piece in pieces:
        base = (seq % geo.nslots) * geo.slot_bytes
        for off, data in packet_image(geo, seq, route, piece):
            ring[base + off: base + off + len(data)] = np.frombuffer(data, dtype=np.uint8)
        seq += 1
    return seq


def split_write(nbytes: int, capacity: int) -> list[int]:
    """Payload sizes of the packets one write call of ``nbytes`` produces."""
    full, tail = divmod(nbytes, capacity)
    return [capacity] * full + ([tail] if tail else [])
