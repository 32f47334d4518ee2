"""The cuda back-end module of the channels: device handles, and the host API through one-block kernels.

``write`` / ``read`` launch one block of ``host_kernels.cu`` (the same device calls users' kernels
make) on the world's stream, wait for it (bounded, through the back-end), and turn an error the
device recorded into :class:`circuslink.ChannelError`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ChannelError
from . import protocol as P
from ._routed import placement

_HOST_THREADS = 256
_KERNELS = Path(__file__).with_name("host_kernels.cu")


@functools.lru_cache(maxsize=4)
def _kernels(device: int):
    from ..device_code import compile

    module = compile(_KERNELS.read_text())
    return module.get_function("circuslink_channel_write"), module.get_function("circuslink_channel_read")


def make_handle(channels: Any, link: Any, geo: P.RingGeometry, lay: Any, kind: str) -> np.void:
    """The ``circuslink::detail::ChannelHandle`` of one end (a numpy scalar, passed to kernels by value). A
    routed channel's ends look like any other: the sender's ring is the injection ring at the route's first
    rank, the receiver's credits go onto the board at its last (docs/routing.md)."""
    buf, me = channels._buf, channels._world.rank
    where = placement(link, lay, kind, channels._plan.routed_of(link))
    window, least = channels._plan.window_of(link) or (None, 0)
    return P.HANDLE.pack(
        # the writer's window as this end's GPU maps it: the writer's own buffer on both ends
        window=window.ptr(link.src_rank) if window is not None else 0,
        window_bytes=window.nbytes if window is not None else 0, rdv_min=least,
        ring=buf.ptr(where.ring[0]) + where.ring[1],
        credit=buf.ptr(where.credit[0]) + where.credit[1],
        slot_credit=buf.ptr(where.slot_credits[0]) + where.slot_credits[1],
        state=buf.ptr(me) + lay.ctrl + (P.CTRL_SEND_STATE if kind == "send" else P.CTRL_RECV_STATE),
        error=buf.ptr(me) + lay.ctrl + (P.CTRL_SEND_ERROR if kind == "send" else P.CTRL_RECV_ERROR),
        abort=channels._world.backend.abort_ptr,
        timeout_ns=int(channels.timeout * 1e9),
        nslots=geo.nslots, slot_bytes=geo.slot_bytes, chunk=geo.chunk,
        route=P.route_of(link.recv_id, link.dst_rank), ll_max=geo.ll_max,
        channel_id=link.send_id if kind == "send" else link.recv_id,
        flags=P.HANDLE_GPU_SCOPE if channels.one_gpu else 0)


class CudaEnd:
    def __init__(self, channels: Any, link: Any, geo: P.RingGeometry, lay: Any, kind: str,
                 describe: str) -> None:
        self.channels = channels
        self.link = link
        self.layout = lay
        self.kind = kind
        self.dtype = link.element.numpy_dtype
        self.describe = describe
        self.timeout = channels.timeout
        self.geometry = geo
        self.handle = make_handle(channels, link, geo, lay, kind)
        off = lay.ctrl + (P.CTRL_SEND_ERROR if kind == "send" else P.CTRL_RECV_ERROR)
        self._error = channels._buf.local[off:off + 16]

    def _launch(self, which: int, ptr_arg: Any, nbytes: int) -> None:
        world = self.channels._world
        kernel = _kernels(world.device)[which]
        stream = world.backend.stream
        world.backend.after_caller()  # the argument arrays were made on the caller's stream
        with stream:
            kernel((1,), (_HOST_THREADS,), (self.handle, ptr_arg, np.uint64(nbytes)))
        what = "write" if which == 0 else "read"
        world.backend.wait_stream(stream, self.channels.kernel_wait_s,
                                  lambda: f"{self.describe}: its {what} kernel did not finish")
        self.check()

    def write(self, arr: Any) -> None:
        import cupy as cp

        if isinstance(arr, cp.ndarray):
            raw = cp.ascontiguousarray(arr).reshape(-1).view(cp.uint8)
        else:  # numpy (structured and void dtypes have no cupy equivalent: move the bytes)
            raw = cp.asarray(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
        if raw.size:
            self._launch(0, raw, raw.size)

    def read(self, n: int) -> Any:
        import cupy as cp

        out = cp.empty(n * self.dtype.itemsize, dtype=cp.uint8)
        if n:
            self._launch(1, out, out.size)
        if self.dtype.names is None and self.dtype.kind != "V":
            return out.view(self.dtype)
        return out.get().view(self.dtype)  # structured / void elements have no cupy dtype: numpy

    def check(self) -> None:
        rec = self._error.get().view("<u4")
        code = int(rec[0])
        if code != P.ERR_NONE:
            seq = int(rec[2]) | (int(rec[3]) << 32)
            what = P.ERROR_TEXT.get(code, "failed (error code {code})").format(seq=seq, code=code)
            if code in (P.ERR_MISUSE, P.ERR_ABORTED):
                raise ChannelError(f"{self.describe}: {what}")
            raise ChannelError(f"{self.describe}: timed out after {self.timeout:g} s: {what}"
                               f"{self._peer_position(code)}{self._slot_report(code, seq)}")

    def _peer_position(self, code: int) -> str:
        """What the other end's control block says (its calls' last saved position), to tell a peer
        that stopped early from one that never came; empty where its memory is not mapped here."""
        link, lay = self.link, self.layout
        peer, off, did = ((link.src_rank, P.CTRL_SEND_STATE, "written") if code == P.ERR_DATA_TIMEOUT
                          else (link.dst_rank, P.CTRL_RECV_STATE, "consumed"))
        try:
            words = self._read_u32s((peer, lay.ctrl + off), 8)
            seq = int(words[0]) | (int(words[1]) << 32)
        except Exception:  # noqa: BLE001 - a diagnostic only
            return ""
        return f" (rank {peer}'s end had {did} {seq} packets as of its last finished call)"

    def _read_u32s(self, rank_offset: tuple[int, int], nbytes: int) -> np.ndarray:
        rank, off = rank_offset
        buf = self.channels._buf
        mem = buf.local if rank == self.channels._world.rank else buf.peer(rank)
        return mem[off:off + nbytes].get().view("<u4")

    def _slot_report(self, code: int, seq: int) -> str:
        """What the ring slot (or its credit) of the packet that was waited for holds, relative to that
        packet: tells a packet that never came (the slot still holds the previous lap's) from one that
        came and was overwritten, or a credit that was never returned from one returned for another lap.
        Flags are protocol.flag_of of the packet number."""
        geo = self.geometry
        slot = seq & (geo.nslots - 1)
        try:
            where = placement(self.link, self.layout, self.kind, self.channels._plan.routed_of(self.link))
            if code == P.ERR_DATA_TIMEOUT:
                ring_rank, ring_off = where.ring
                unit1 = self._read_u32s((ring_rank, ring_off + slot * geo.slot_bytes), 16)
                flag, what = int(unit1[3]), "header"
                want = P.flag_of(seq)
            elif code == P.ERR_CREDIT_TIMEOUT:
                cr_rank, cr_off = where.slot_credits
                flag, what = int(self._read_u32s((cr_rank, cr_off + 4 * slot), 4)[0]), "credit"
                want = P.flag_of(seq - geo.nslots)
            else:
                return ""
        except Exception:  # noqa: BLE001 - a diagnostic only
            return ""
        return describe_slot(seq, slot, flag, want, geo.nslots, what)

    def close(self) -> None:
        return None


def describe_slot(seq: int, slot: int, flag: int, want: int, nslots: int, what: str) -> str:
    """The clause of a time-out message that says whose ``what`` ("header" or "credit") ring slot ``slot``
    holds: ``flag`` was read, ``want`` is the flag the wait for packet ``seq`` needed."""
    if flag == 0:
        return f"; its ring slot {slot} has no {what} yet"
    behind = (want - flag + (1 << 31)) % (1 << 32) - (1 << 31)  # packets: > 0 older than awaited
    laps = -behind / nslots  # > 0: a later lap than awaited (overwritten), < 0: an earlier one (never came)
    return (f"; its ring slot {slot} holds the {what} of packet ~{seq - behind} "
            f"({laps:+g} laps from the one awaited, {nslots} slots)")


def make_end(channels: Any, link: Any, geo: P.RingGeometry, lay: Any, kind: str, describe: str) -> CudaEnd:
    return CudaEnd(channels, link, geo, lay, kind, describe)


def make_router(channels: Any) -> Any:
    """The forwarding agent of this rank (a persistent one-block kernel) for the routed channels of ``channels``."""
    from ._router_cuda import CudaRouter

    return CudaRouter(channels)
