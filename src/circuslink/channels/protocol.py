"""The channel protocol's numbers, layouts and device structs, in one place (docs/protocol.md explains them).

The device side is ``include/circuslink/detail/channel_types.cuh`` and ``channel_impl.cuh``; the cpu
reference is ``channels/_cpu.py``. The ABI tables below (``HANDLE``, ``SEND_STATE``, ``RECV_STATE``)
are checked against the header by nvcc (tests/test_abi.py). The wire format itself is written twice,
once per side (device, cpu reference); the shared test vectors (tests/vectors) come from a third,
independent encoder written from docs/protocol.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _abi as abi
from ..errors import ConfigError

# -- the slot ------------------------------------------------------------------------------------
# [0, 256): the low-latency area, 32 units of 8 bytes {word, flag}; units 0 and 1 are the header
#           {route, flag} {nbytes | kind, flag}; units 2..31 carry 4 payload bytes each (120 bytes)
# [256, 256 + chunk): the bulk area (a bulk packet's payload, published by its header)
UNIT_BYTES = 8
LL_UNITS = 32
LL_AREA_BYTES = LL_UNITS * UNIT_BYTES  # 256
LL_PAYLOAD = (LL_UNITS - 2) * 4  # 120
KIND_BULK = 0x80000000  # in header word 2, with nbytes
NBYTES_MASK = 0x7FFFFFFF
# With KIND_BULK: a rendezvous descriptor, a low-latency packet of RDV_BYTES (the message's offset in the
# writer's window and its size, u64 each, little-endian); the reader pulls the message from the window
KIND_RDV = 0x40000000
RDV_BYTES = 16
# The sender's rendezvous words (CTRL_RDV): `done` counts finished messages in units of RDV_DONE (each reading
# warp adds 1, the group's first RDV_DONE - warps more, so a message adds RDV_DONE once every warp took it);
# `posted` = (seq + 1 mod 2^32) << 32 | r for descriptor seq, the channel's r-th rendezvous message
RDV_DONE_SHIFT = 20
RDV_DONE = 1 << RDV_DONE_SHIFT
REWRITE_PERIOD = 1 << 31  # the first lap after every multiple rewrites every unit of its slots

MIN_CHUNK = 256
MAX_CHUNK = 1 << 20
MAX_RING_BYTES = (1 << 32) - 1  # slot offsets are 32-bit on the device
# Writes of up to this many bytes travel as low-latency packets, larger ones as bulk packets: where
# the two cost the same one-way time, measured by `circuslink bench pingpong` (its "switch" rows).
LL_MAX_DEFAULT = 1024
# Grid writes of at least this many bytes from a channel's window go by rendezvous (docs/protocol.md): where
# the pull overtook the ring's grid form in `bench pingpong` on one H200 (2 ranks under MPS, 2026-11-29: 256 KiB
# ring 3.77 us one-way against the pull's 4.74; 512 KiB 7.52 against 5.19; 1 MiB 7.58 against 6.01).
RDV_MIN_DEFAULT = 512 << 10

# control block (per channel, 128 bytes, in every rank's copy; each field used on its owner)
CTRL_BYTES = 128
CTRL_CREDIT = 0  # u64, sender's copy: slots consumed in order (written by the receiver)
CTRL_SEND_STATE = 16  # SendState
CTRL_RECV_STATE = 48  # RecvState
CTRL_SEND_ERROR = 80  # u32 code, u32 channel id, u32 seq lo, u32 seq hi
CTRL_RECV_ERROR = 96
CTRL_RDV = 112  # sender's copy: u64 done, u64 posted (see RDV_DONE); unused in the receiver's

ERR_NONE = 0
ERR_DATA_TIMEOUT = 1
ERR_CREDIT_TIMEOUT = 2
ERR_MISUSE = 3
ERR_ABORTED = 4
ERR_CLAIMED = 0xFFFFFFFF  # a record whose fields are being written (the device publishes the code last)
ERROR_TEXT = {
    ERR_DATA_TIMEOUT: "waited for data (packet seq {seq}) from its sender",
    ERR_CREDIT_TIMEOUT: "waited for credits (to write packet seq {seq}): its reader stopped consuming",
    ERR_MISUSE: "was misused at packet seq {seq} (write_grid must be read by read_grid of the same n, a "
                "forward must take whole packets, and a rendezvous message is read by a grid read, never forwarded)",
    ERR_ABORTED: "was waiting at packet seq {seq} when the host gave up on the kernel",
}

FLAG_MASK = 0xFFFFFFFF

# What a kernel receives: circuslink::detail::ChannelHandle (detail/channel_types.cuh), by value.
HANDLE = abi.Struct("circuslink::detail::ChannelHandle", "circuslink/detail/channel_types.cuh", [
    ("ring", abi.PTR), ("credit", abi.PTR), ("slot_credit", abi.PTR), ("state", abi.PTR), ("error", abi.PTR),
    ("abort", abi.PTR), ("timeout_ns", abi.U64), ("nslots", abi.U32), ("slot_bytes", abi.U32),
    ("chunk", abi.U32), ("route", abi.U32), ("ll_max", abi.U32), ("channel_id", abi.U32), ("flags", abi.U32),
    ("rdv_min", abi.U32), ("window", abi.PTR), ("window_bytes", abi.U64)])
# ChannelHandle.flags: every rank the channel's packets touch is on one GPU, so bulk packets fence at .gpu
# scope instead of .sys (a handle without it is always safe: links in host memory, peers on other GPUs)
HANDLE_GPU_SCOPE = 1
HANDLE_DTYPE = HANDLE.dtype
SEND_STATE = abi.Struct("circuslink::detail::SendState", "circuslink/detail/channel_types.cuh", [
    ("seq", abi.U64), ("credit_cache", abi.U64), ("departed", abi.U32), ("pad", abi.U32)])
RECV_STATE = abi.Struct("circuslink::detail::RecvState", "circuslink/detail/channel_types.cuh", [
    ("seq", abi.U64), ("offset", abi.U32), ("departed", abi.U32), ("returned", abi.U64)])


def flag_of(seq: int) -> int:
    """Packet ``seq``'s flag: never 0, and unlike its slot's previous occupants' (docs/protocol.md)."""
    return (seq & FLAG_MASK) | 1


def rewrites_all(seq: int, nslots: int) -> bool:
    """Packets of the first lap after each multiple of 2^31 write all 30 data units of their slot, so
    no unit survives long enough (2^32 packets) for its flag to come round again."""
    return seq % REWRITE_PERIOD < nslots


def route_of(recv_id: int, dst_rank: int) -> int:
    if not 0 <= recv_id < (1 << 16) or not 0 <= dst_rank < (1 << 16):
        raise ConfigError(f"route: channel id {recv_id} and rank {dst_rank} must each fit in 16 bits")
    return recv_id | (dst_rank << 16)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass(frozen=True)
class RingGeometry:
    """How one channel's ring is shaped."""

    nslots: int
    chunk: int  # bulk payload capacity of one packet
    ll_max: int  # writes of at most this many bytes go as low-latency packets

    @property
    def slot_bytes(self) -> int:
        return LL_AREA_BYTES + self.chunk

    @property
    def ring_bytes(self) -> int:
        return self.nslots * self.slot_bytes

    def describe(self) -> str:
        return f"{self.nslots} slots, {self.chunk} B bulk packets, low-latency writes up to {self.ll_max} B"


def geometry(depth: int, element_bytes: int, nslots: int | None = None, chunk: int | None = None,
             ll_max: int | None = None, name: str = "?") -> RingGeometry:
    """Ring shape for a channel of ``depth`` elements of ``element_bytes`` (docs/protocol.md, Sizing)."""
    ring_payload = max(1, depth * element_bytes)
    if chunk is None:
        # at least 8 packets in flight so writer and reader overlap; small rings use small packets
        chunk = max(MIN_CHUNK, min(64 << 10, _pow2_floor(ring_payload // 8)))
    if not isinstance(chunk, int) or chunk % 16 or not MIN_CHUNK <= chunk <= MAX_CHUNK:
        raise ConfigError(f"channel {name}: chunk {chunk!r} must be a multiple of 16 bytes in "
                          f"{MIN_CHUNK}..{MAX_CHUNK}")
    if ll_max is None:
        ll_max = LL_MAX_DEFAULT
    if not isinstance(ll_max, int) or not 0 <= ll_max < KIND_BULK:
        raise ConfigError(f"channel {name}: ll_max {ll_max!r} must be a number of bytes >= 0")
    if nslots is None:
        # The ring holds `depth` elements whichever packets carry them: bulk packets carry `chunk`
        # bytes a slot, low-latency ones 120. (A pingpong whose message outgrew the ring in
        # low-latency packets stalled on the H100: each side's writer waited for the other's reader.)
        ll_bytes = min(ring_payload, ll_max)
        nslots = max(4, _next_pow2(-(-ring_payload // chunk)), _next_pow2(-(-ll_bytes // LL_PAYLOAD)))
    elif not isinstance(nslots, int) or nslots < 2 or nslots & (nslots - 1) or nslots > (1 << 24):
        raise ConfigError(f"channel {name}: nslots {nslots!r} must be a power of two in 2..2^24")
    geo = RingGeometry(nslots, chunk, ll_max)
    if geo.ring_bytes > MAX_RING_BYTES:
        # the device computes slot offsets in 32 bits (detail/channel_impl.cuh, slot_of)
        raise ConfigError(f"channel {name}: a ring of {nslots} slots of {geo.slot_bytes} bytes is "
                          f"{geo.ring_bytes} bytes; rings hold at most {MAX_RING_BYTES} (4 GiB - 1): "
                          "give fewer slots, a smaller chunk or a smaller depth")
    return geo


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


def split_write(nbytes: int, geo: RingGeometry) -> tuple[bool, list[int]]:
    """(bulk?, payload sizes) of the packets one write call of ``nbytes`` produces."""
    bulk = nbytes > geo.ll_max
    capacity = geo.chunk if bulk else LL_PAYLOAD
    full, tail = divmod(nbytes, capacity)
    return bulk, [capacity] * full + ([tail] if tail else [])


# -- routed channels: what a forwarding agent serves (detail/router_types.cuh; channels/_routed.py) ---------
_ROUTER = "circuslink/detail/router_types.cuh"
ROUTER_INPUT = abi.Struct("circuslink::router::Input", _ROUTER, [
    ("ring", abi.PTR), ("credit", abi.PTR), ("slot_credit", abi.PTR), ("chain", abi.PTR), ("nslots", abi.U32),
    ("slot_bytes", abi.U32), ("chunk", abi.U32), ("kind", abi.U32), ("channel", abi.U32), ("entry", abi.U32),
    ("pad0", abi.U32), ("pad1", abi.U32)])
ROUTER_OUTPUT = abi.Struct("circuslink::router::Output", _ROUTER, [
    ("ring", abi.PTR), ("credit", abi.PTR), ("down_chain", abi.PTR), ("nslots", abi.U32), ("slot_bytes", abi.U32),
    ("entry", abi.U32), ("kind", abi.U32)])
ROUTER_CHANNEL = abi.Struct("circuslink::router::Channel", _ROUTER, [
    ("ring", abi.PTR), ("board", abi.PTR), ("nslots", abi.U32), ("slot_bytes", abi.U32), ("route", abi.U32),
    ("role", abi.U32), ("first", abi.U32), ("arrival", abi.U32)])
ROUTER_STATE = abi.Struct("circuslink::router::ChannelState", _ROUTER, [
    ("delivered", abi.U64), ("consumed", abi.U64), ("reported", abi.U64), ("gate", abi.U64)])
ROUTER_INPUT_STATE = abi.Struct("circuslink::router::InputState", _ROUTER, [
    ("seq", abi.U64), ("since", abi.U64), ("blocked", abi.U32), ("published", abi.U32)])
ROUTER_OUTPUT_STATE = abi.Struct("circuslink::router::OutputState", _ROUTER, [("seq", abi.U64), ("cache", abi.U64)])
ROUTER_JOB = abi.Struct("circuslink::router::Job", _ROUTER, [
    ("src", abi.PTR), ("dst", abi.PTR), ("posted", abi.U64), ("done", abi.U64), ("nb", abi.U32), ("route", abi.U32),
    ("word", abi.U32), ("flag", abi.U32), ("rewrite", abi.U32), ("pad0", abi.U32), ("pad1", abi.U32),
    ("pad2", abi.U32)])
ROUTER_COPY_STATE = abi.Struct("circuslink::router::CopyState", _ROUTER, [
    ("next", abi.U64), ("launches", abi.U32), ("arrived", abi.U32), ("dead", abi.U32), ("pad0", abi.U32),
    ("pad1", abi.U32), ("pad2", abi.U32)])
ROUTER_AGENT = abi.Struct("circuslink::router::Agent", _ROUTER, [
    ("inputs", abi.PTR), ("outputs", abi.PTR), ("channels", abi.PTR), ("state", abi.PTR), ("input_state", abi.PTR),
    ("output_state", abi.PTR), ("entries", abi.PTR), ("channel_of_id", abi.PTR), ("reporters", abi.PTR),
    ("control", abi.PTR), ("abort", abi.PTR), ("timeout_ns", abi.U64), ("report_after_ns", abi.U64),
    ("slice_ns", abi.U64), ("jobs", abi.PTR), ("copy", abi.PTR), ("njobs", abi.U32), ("ncopy", abi.U32),
    ("flags", abi.U32), ("pad", abi.U32), ("ninputs", abi.U32), ("noutputs", abi.U32),
    ("nchannels", abi.U32), ("nids", abi.U32), ("rank", abi.U32), ("nranks", abi.U32), ("vcs", abi.U32),
    ("nreporters", abi.U32)])
ROUTER_HOP_MAPPED = 0  # Output.kind: a link ring in the neighbour's mapped memory (the agent may deliver there)
ROUTER_HOP_RELAY = 1  # Output.kind: the out ring of this gateway's relay (a transport carries it; the landing agent
#                       delivers)
ROUTER_GPU_SCOPE = 1  # Agent.flags: every rank shares this GPU (bulk fences at .gpu scope)
# the agent's dynamic shared memory per input, per output and per rank (router_types.cuh: kSharedPer*, the sizes
# of router_impl.cuh's InS, OutS and hop table word)
ROUTER_SHARED_PER_INPUT = 168
ROUTER_SHARED_PER_OUTPUT = 16
ROUTER_SHARED_PER_RANK = 4
