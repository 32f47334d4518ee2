"""The cpu reference implementation of the channel protocol (docs/protocol.md).

Plain numpy over the cpu back-end's shared memory, writing byte for byte what the device
code writes. Ordering relies on x86's total store order: every numpy assignment below is a
separate run of stores, so data words are visible before the flag words written after them
(and loads are not reordered with older loads, so a reader that checks flags first then reads
data sees the data those flags publish).

The endpoint classes take plain arrays, so the test vectors drive them in one process.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import ChannelError
from . import protocol as P

_SPIN_POLLS = 50  # polls before the first sleep: a peer usually answers within microseconds
_SLEEP_MIN_S = 20e-6
_SLEEP_MAX_S = 2e-3  # the machine is shared: a waiting rank must not burn a core


class _Waiter:
    """Polls ``ready()`` with back-off until it holds or ``timeout_s`` passes."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def wait(self, ready) -> bool:
        if ready():
            return True
        deadline = time.monotonic() + self.timeout_s
        polls, sleep = 0, _SLEEP_MIN_S
        while True:
            if ready():
                return True
            polls += 1
            if polls > _SPIN_POLLS:
                if time.monotonic() > deadline:
                    return ready()
                time.sleep(sleep)
                sleep = min(2 * sleep, _SLEEP_MAX_S)


class _End:
    def __init__(self, name: str, describe: str, channel_id: int, geo: P.RingGeometry, ring: np.ndarray,
                 credit: np.ndarray, slot_credits: np.ndarray, error: np.ndarray, timeout_s: float,
                 route: int) -> None:
        self.name = name
        self.describe = describe  # "channel X (rank r, sender to rank p)" for messages
        self.channel_id = channel_id
        self.geo = geo
        self.ring = ring  # uint8, nslots * slot_bytes, in the receiver's memory
        self.ring_u32 = ring.view("<u4")
        self.credit = credit  # u64[1] in the sender's memory
        self.slot_credits = slot_credits  # u32[nslots] in the sender's memory
        self.error = error  # u32[4] in this end's memory
        self.timeout_s = timeout_s
        self.route = route
        self._waiter = _Waiter(timeout_s)

    def _fail(self, code: int, seq: int) -> ChannelError:
        if self.error[0] == P.ERR_NONE:
            self.error[1] = self.channel_id
            self.error[2] = seq & P.FLAG_MASK
            self.error[3] = seq >> 32
            self.error[0] = code
        what = P.ERROR_TEXT[code].format(seq=seq)
        return ChannelError(f"{self.describe}: timed out after {self.timeout_s:g} s: {what}")

    def _check_error(self) -> None:
        code = int(self.error[0])
        if code != P.ERR_NONE:
            seq = int(self.error[2]) | (int(self.error[3]) << 32)
            raise ChannelError(f"{self.describe}: an earlier operation failed and {P.ERROR_TEXT[code].format(seq=seq)}")


class CpuSender(_End):
    """Writes packets into the receiver's ring; the credit counter lives in my memory."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seq = 0
        self.credit_cache = 0

    def _credit_for(self, seq: int) -> None:
        if seq < self.credit_cache + self.geo.nslots:
            return
        self._check_error()

        def ready() -> bool:
            self.credit_cache = int(self.credit[0])
            return seq < self.credit_cache + self.geo.nslots

        if not self._waiter.wait(ready):
            raise self._fail(P.ERR_CREDIT_TIMEOUT, seq)

    def write_bytes(self, data: bytes) -> None:
        geo = self.geo
        pos = 0
        for size in P.split_write(len(data), geo.payload):
            self._credit_for(self.seq)
            self._store_packet(self.seq, data[pos:pos + size])
            pos += size
            self.seq += 1

    def _store_packet(self, seq: int, payload: bytes) -> None:
        geo = self.geo
        base = (seq % geo.nslots) * geo.slot_bytes
        flag = P.flag_of(seq)
        n = len(payload)
        ring, words = self.ring, self.ring_u32
        if geo.mode == P.MODE_LL:
            nlines = P.ll_lines(seq, n, geo.nslots)
            padded = np.frombuffer(payload + bytes(nlines * P.LL_LINE_PAYLOAD - n), dtype="<u4").reshape(nlines, 2)
            lines = words[(base + P.LINE_BYTES) // 4:(base + P.LINE_BYTES) // 4 + 4 * nlines].reshape(nlines, 4)
            lines[:, 0::2] = padded  # data words first ...
            lines[:, 1::2] = flag  # ... then the flags that publish them
        else:
            padded_n = -(-n // 16) * 16
            start = base + P.BW_HEADER_BYTES
            ring[start:start + n] = np.frombuffer(payload, dtype=np.uint8)
            ring[start + n:start + padded_n] = 0
        head = base // 4
        words[head] = self.route
        words[head + 2] = n
        words[head + 1] = flag
        words[head + 3] = flag


class CpuReceiver(_End):
    """Polls my ring; returns credits into the sender's memory."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seq = 0
        self.offset = 0  # bytes of packet `seq` already consumed

    def _header(self, seq: int) -> int:
        """Wait for packet ``seq``'s header and every line it covers; return its nbytes."""
        geo = self.geo
        head = (seq % geo.nslots) * geo.slot_bytes // 4
        flag = P.flag_of(seq)
        words = self.ring_u32

        def ready() -> bool:
            if words[head + 1] != flag or words[head + 3] != flag:
                return False
            if geo.mode == P.MODE_LL:
                n = int(words[head + 2])
                nlines = -(-n // P.LL_LINE_PAYLOAD)
                lines = words[head + 4:head + 4 + 4 * nlines].reshape(nlines, 4)
                return bool(np.all(lines[:, 1::2] == flag))
            return True

        if not ready():
            self._check_error()
            if not self._waiter.wait(ready):
                raise self._fail(P.ERR_DATA_TIMEOUT, seq)
        n = int(words[head + 2])
        if not 1 <= n <= geo.payload:
            raise ChannelError(f"{self.describe}: packet seq {seq} has a corrupt header (nbytes={n})")
        return n

    def _payload(self, seq: int, start: int, stop: int) -> bytes:
        geo = self.geo
        base = (seq % geo.nslots) * geo.slot_bytes
        if geo.mode == P.MODE_LL:
            first, last = start // P.LL_LINE_PAYLOAD, -(-stop // P.LL_LINE_PAYLOAD)
            w = self.ring_u32[(base + P.LINE_BYTES) // 4 + 4 * first:(base + P.LINE_BYTES) // 4 + 4 * last]
            data = np.ascontiguousarray(w.reshape(-1, 4)[:, 0::2]).tobytes()
            skip = start - first * P.LL_LINE_PAYLOAD
            return data[skip:skip + stop - start]
        s = base + P.BW_HEADER_BYTES
        return self.ring[s + start:s + stop].tobytes()

    def read_bytes(self, nbytes: int) -> bytes:
        out = bytearray()
        while len(out) < nbytes:
            n = self._header(self.seq)
            take = min(n - self.offset, nbytes - len(out))
            out += self._payload(self.seq, self.offset, self.offset + take)
            self.offset += take
            if self.offset == n:
                self._consumed(self.seq)
                self.seq += 1
                self.offset = 0
        return bytes(out)

    def _consumed(self, seq: int) -> None:
        if self.geo.mode == P.MODE_BW:
            self.slot_credits[seq % self.geo.nslots] = P.flag_of(seq)
        self.credit[0] = seq + 1
