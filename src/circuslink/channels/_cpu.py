"""The cpu back-end module of the channels: the reference implementation of the protocol (docs/protocol.md).

Plain numpy over the cpu back-end's shared memory, writing byte for byte what the device code
writes. Ordering relies on x86's total store order: every numpy assignment below is a separate run
of stores, so data words (and bulk payload) are visible before the flags (and header) written after
them, and loads are not reordered with older loads, so a reader that checks flags first and reads
data after sees the data those flags publish.

The endpoint classes take plain arrays, so the test vectors drive them in one process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._wait import Deadline, wait_until
from ..errors import ChannelError, TimeoutError
from . import protocol as P
from ._routed import placement


class _End:
    def __init__(self, name: str, describe: str, channel_id: int, geo: P.RingGeometry, ring: np.ndarray,
                 credit: np.ndarray, slot_credits: np.ndarray, error: np.ndarray, timeout_s: float,
                 route: int) -> None:
        self.name = name
        self.describe = describe  # "channel X (rank r, sender to rank p)" for messages
        self.channel_id = channel_id
        self.geo = geo
        self.ring = ring  # uint8, nslots * slot_bytes, in the receiver's memory
        self.words = ring.view("<u4")
        self.credit = credit  # u64[1] in the sender's memory
        self.slot_credits = slot_credits  # u32[nslots] in the sender's memory
        self.error = error  # u32[4] in this end's memory
        self.timeout_s = timeout_s
        self.route = route
        self.watch = None  # called between polls of a wait; may raise (a routed end: its rank's relay failed)
        # rendezvous (make_end sets them for a channel opened with a window): the writer's window as mapped here,
        # the least bytes a write sends by rendezvous, the sender's rendezvous words (u64[2]: done, posted)
        self.window: np.ndarray | None = None
        self.rdv_min = 0
        self.rdv: np.ndarray | None = None

    def _slot(self, seq: int) -> int:
        return (seq % self.geo.nslots) * self.geo.slot_bytes

    def _wait(self, ready, code: int, seq: int) -> None:
        self._check_error()
        try:
            wait_until(ready, Deadline.after(self.timeout_s), self.describe, self.watch)
        except TimeoutError:
            raise self._fail(code, seq) from None

    def _record(self, code: int, seq: int) -> None:
        """This end's first failure, for the host and the peer's messages (the device's record_error)."""
        if self.error[0] == P.ERR_NONE:
            self.error[1] = self.channel_id
            self.error[2] = seq & P.FLAG_MASK
            self.error[3] = seq >> 32
            self.error[0] = code

    def _fail(self, code: int, seq: int) -> ChannelError:
        self._record(code, seq)
        what = P.ERROR_TEXT[code].format(seq=seq)
        return ChannelError(f"{self.describe}: timed out after {self.timeout_s:g} s: {what}")

    def _check_error(self) -> None:
        code = int(self.error[0])
        if code != P.ERR_NONE:
            seq = int(self.error[2]) | (int(self.error[3]) << 32)
            raise ChannelError(f"{self.describe}: an earlier operation failed and {P.ERROR_TEXT[code].format(seq=seq)}")


class CpuSender(_End):
    """Writes packets into the receiver's ring; the credit counter lives in my memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seq = 0
        self.credit_cache = 0

    def write_rendezvous(self, offset: int, nbytes: int) -> None:
        """A message of ``nbytes`` at ``offset`` in my window: one descriptor packet, then wait until the reader
        has pulled it (docs/protocol.md, Rendezvous)."""
        seq = self.seq
        self._credit_for(seq)
        r = ((int(self.rdv[0]) >> P.RDV_DONE_SHIFT) + 1) & 0xFFFFFFFF  # every earlier one has finished
        self.rdv[1] = ((seq + 1) & 0xFFFFFFFF) << 32 | r
        self._store_ll(seq, np.array([offset, nbytes], dtype="<u8").tobytes(),
                       word=P.RDV_BYTES | P.KIND_BULK | P.KIND_RDV)
        self.seq += 1
        self._wait(lambda: ((int(self.rdv[0]) >> P.RDV_DONE_SHIFT) - r) & 0xFFFFFFFF < 1 << 31,
                   P.ERR_CREDIT_TIMEOUT, seq)
        self.slot_credits[seq % self.geo.nslots] = P.flag_of(seq)  # the reader is done with the slot

    def _credit_for(self, seq: int) -> None:
        if seq < self.credit_cache + self.geo.nslots:
            return

        def ready() -> bool:
            self.credit_cache = int(self.credit[0])
            return seq < self.credit_cache + self.geo.nslots

        self._wait(ready, P.ERR_CREDIT_TIMEOUT, seq)

    def write_bytes(self, data: bytes) -> None:
        """Every call publishes all it was given: low-latency packets up to ll_max bytes, bulk above."""
        bulk, sizes = P.split_write(len(data), self.geo)
        pos = 0
        for size in sizes:
            self._credit_for(self.seq)
            (self._store_bulk if bulk else self._store_ll)(self.seq, data[pos:pos + size])
            pos += size
            self.seq += 1

    def _store_ll(self, seq: int, payload: bytes, word: int | None = None) -> None:
        n = len(payload)
        flag = P.flag_of(seq)
        units = P.LL_UNITS - 2 if P.rewrites_all(seq, self.geo.nslots) else -(-n // 4)
        padded = np.frombuffer(payload + bytes(4 * units - n), dtype="<u4")
        head = self._slot(seq) // 4
        data = self.words[head + 4:head + 4 + 2 * units].reshape(units, 2)
        data[:, 0] = padded  # data words first ...
        data[:, 1] = flag  # ... then the flags that publish them
        w = self.words
        w[head] = self.route
        w[head + 2] = n if word is None else word
        w[head + 1] = flag
        w[head + 3] = flag

    def _store_bulk(self, seq: int, payload: bytes) -> None:
        n = len(payload)
        base = self._slot(seq)
        start = base + P.LL_AREA_BYTES
        self.ring[start:start + n] = np.frombuffer(payload, dtype=np.uint8)
        self.ring[start + n:start + -(-n // 16) * 16] = 0
        flag = P.flag_of(seq)
        head = base // 4
        if P.rewrites_all(seq, self.geo.nslots):  # the low-latency units get this flag too (flag_of)
            data = self.words[head + 4:head + 4 + 2 * (P.LL_UNITS - 2)].reshape(-1, 2)
            data[:, 0] = 0
            data[:, 1] = flag
        w = self.words  # the header last: what the device's release fence orders, x86 does in order
        w[head] = self.route
        w[head + 2] = n | P.KIND_BULK
        w[head + 1] = flag
        w[head + 3] = flag


class CpuReceiver(_End):
    """Polls my ring; returns credits into the sender's memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seq = 0
        self.offset = 0  # bytes of packet `seq` already consumed

    def _header(self, seq: int) -> tuple[bool, int]:
        """Wait for packet ``seq``: its header and, for a low-latency packet, every unit it covers."""
        head = self._slot(seq) // 4
        flag = P.flag_of(seq)
        w = self.words

        def ready() -> bool:
            if w[head + 3] != flag:
                return False
            word = int(w[head + 2])
            if word & P.KIND_RDV:
                units = P.RDV_BYTES // 4  # a descriptor: a low-latency packet whose units carry their flags
            elif word & P.KIND_BULK:
                return True
            else:
                units = -(-word // 4)
            return bool(np.all(w[head + 5:head + 5 + 2 * units:2] == flag))

        if not ready():
            self._wait(ready, P.ERR_DATA_TIMEOUT, seq)
        word = int(w[head + 2])
        if word & P.KIND_RDV:
            return True, -1  # a rendezvous descriptor (read_bytes takes it)
        bulk, n = bool(word & P.KIND_BULK), word & P.NBYTES_MASK
        if not 1 <= n <= (self.geo.chunk if bulk else P.LL_PAYLOAD):
            raise ChannelError(f"{self.describe}: packet seq {seq} has a corrupt header (nbytes={n})")
        return bulk, n

    def _payload(self, seq: int, bulk: bool, start: int, stop: int) -> bytes:
        base = self._slot(seq)
        if bulk:
            s = base + P.LL_AREA_BYTES
            return self.ring[s + start:s + stop].tobytes()
        first, last = start // 4, -(-stop // 4)
        w = self.words[base // 4 + 4 + 2 * first:base // 4 + 4 + 2 * last:2]
        data = w.tobytes()
        return data[start - 4 * first:start - 4 * first + stop - start]

    def _take_rendezvous(self, seq: int, nbytes: int, have: int) -> bytes:
        """Descriptor packet seq: pull the whole message from the writer's window, hand the slot back, ack."""
        base = self._slot(seq) // 4
        units = self.words[base + 4:base + 4 + 2 * (P.RDV_BYTES // 4):2].astype("<u4")
        offset, n = (int(v) for v in units.view("<u8"))
        window = self.window
        if window is None or have or self.offset or n != nbytes or offset + n > len(window):
            self._record(P.ERR_MISUSE, seq)
            raise ChannelError(f"{self.describe}: {P.ERROR_TEXT[P.ERR_MISUSE].format(seq=seq)}: a rendezvous "
                               f"message of {n} bytes is read whole, by one read of {n} bytes (this read asked for "
                               f"{nbytes}{f', {have} taken before it' if have else ''})")
        data = window[offset:offset + n].tobytes()
        self.seq += 1
        self.credit[0] = self.seq
        self.rdv[0] += P.RDV_DONE  # one reader, all of it: the writer may reuse its source and the slot
        return data

    def read_bytes(self, nbytes: int) -> bytes:
        out = bytearray()
        while len(out) < nbytes:
            bulk, n = self._header(self.seq)
            if n < 0:
                out += self._take_rendezvous(self.seq, nbytes, len(out))
                continue
            take = min(n - self.offset, nbytes - len(out))
            out += self._payload(self.seq, bulk, self.offset, self.offset + take)
            self.offset += take
            if self.offset == n:
                self.slot_credits[self.seq % self.geo.nslots] = P.flag_of(self.seq)
                self.seq += 1
                self.offset = 0
                self.credit[0] = self.seq  # the reference returns every credit at once (the host is not the fast path)
        return bytes(out)


class CpuEnd:
    """Adapts the byte-level reference endpoints to typed arrays (the back-end module's end object)."""

    handle = None

    def __init__(self, impl: Any, dtype: np.dtype) -> None:
        self.impl = impl
        self.dtype = dtype

    @property
    def watch(self) -> Any:
        return self.impl.watch

    @watch.setter
    def watch(self, fn: Any) -> None:
        self.impl.watch = fn

    def write(self, arr: np.ndarray) -> None:
        impl, window = self.impl, self.impl.window
        if window is not None and arr.nbytes >= impl.rdv_min and arr.flags.c_contiguous:
            offset = arr.__array_interface__["data"][0] - window.__array_interface__["data"][0]
            if 0 <= offset and offset + arr.nbytes <= window.nbytes:  # from my window: the reader pulls it
                impl.write_rendezvous(offset, arr.nbytes)
                return
        impl.write_bytes(arr.tobytes())

    def read(self, n: int) -> np.ndarray:
        return np.frombuffer(self.impl.read_bytes(n * self.dtype.itemsize), dtype=self.dtype).copy()

    def check(self) -> None:
        self.impl._check_error()

    def close(self) -> None:
        return None


def make_end(channels: Any, link: Any, geo: P.RingGeometry, lay: Any, kind: str, describe: str) -> CpuEnd:
    buf = channels._buf
    where = placement(link, lay, kind, channels._plan.routed_of(link))
    me = buf.local
    ring = buf.peer(where.ring[0])[where.ring[1]:where.ring[1] + geo.ring_bytes]
    credit = buf.peer(where.credit[0])[where.credit[1]:where.credit[1] + 8].view("<u8")
    slots = where.slot_credits
    slot_credits = buf.peer(slots[0])[slots[1]:slots[1] + 4 * geo.nslots].view("<u4")
    err_off = lay.ctrl + (P.CTRL_SEND_ERROR if kind == "send" else P.CTRL_RECV_ERROR)
    error = me[err_off:err_off + 16].view("<u4")
    args = (link.name if kind == "send" else link.receiver_name, describe,
            link.send_id if kind == "send" else link.recv_id, geo, ring, credit, slot_credits, error,
            channels.host_timeout, P.route_of(link.recv_id, link.dst_rank))
    impl = CpuSender(*args) if kind == "send" else CpuReceiver(*args)
    # rendezvous (a channel opened with a window): the writer's window as this rank maps it, the sender's words
    window, impl.rdv_min = channels._plan.window_of(link) or (None, 0)
    impl.window = window.peer(link.src_rank) if window is not None else None
    ack = where.credit[1] - P.CTRL_CREDIT + P.CTRL_RDV
    impl.rdv = buf.peer(where.credit[0])[ack:ack + 16].view("<u8")
    return CpuEnd(impl, link.element.numpy_dtype)


def make_router(channels: Any) -> Any:
    """The forwarding agent of this rank (a thread) for the routed channels of ``channels``."""
    from ._router_cpu import CpuRouter

    return CpuRouter(channels)
