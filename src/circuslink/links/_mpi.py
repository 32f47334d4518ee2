"""The MPI engine: one proxy thread per gateway rank moves packets between its rings and MPI.

Per engine link (this rank <-> a peer gateway of another node), on one duplicated communicator:

* **out**: the proxy reads packets the agent published in the out ring, batches consecutive ones of one
  kind (never past the ring's end), and sends each batch as a **meta** message (tag 1: count, first
  sequence number, every packet's two header words, low-latency payloads) followed, for bulk packets, by a
  **bulk** message (tag 2) sent straight from the ring's bulk areas (a strided MPI datatype: no copy).
  Slots go back to the agent when the sends complete.
* **in**: the proxy keeps a receive posted for the peer's meta; on arrival it posts the bulk receive
  straight into the in ring's bulk areas of the same slots, and when that completes it publishes the
  packets in order (low-latency units with their flags; bulk headers after the payload), as any writer
  of the channel format does. Packet ``s`` of the peer's out ring is packet ``s`` of this in ring.
* **credits**: the proxy sends a packet only while the peer's in ring has room (``sent - consumed <
  nslots``, so never more in flight than the receiving ring holds); the peer returns its agent's
  consumed count in **control** messages (tag 3) every quarter ring and whenever its agent has drained.
* **closing**: each side sends ``BYE(total sent)`` once its sends are complete, then ``FIN`` once it has
  sent BYE and received the peer's; it is done when it has the peer's FIN and has published everything
  the peer sent. FIN is the last control message each way, so nothing is left unmatched.

Every MPI call holds ``world.mpi_lock`` (MPI runs SERIALIZED: the main thread and this one take turns).
Every wait is bounded by the link's time-out; a failure is recorded once, as one line naming MPI and both
ranks, on every link of the proxy, and the agents' ends are told (their error records), so nothing waits
for a dead engine.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from ..channels import protocol as P
from ..errors import EngineError
from ._ring import LL_WORDS, SIZE_MASK, PacketReader, PacketWriter, Ring

TAG_META, TAG_BULK, TAG_CTRL = 1, 2, 3
CTRL_CREDIT, CTRL_BYE, CTRL_FIN = 1, 2, 3
_META_HEAD = 4  # words: count, kind (1 bulk), first seq lo, first seq hi
_SPIN_POLLS = 2000  # idle polls before the back-off yields / sleeps (mode "backoff")
_SLEEP_MAX_S = 500e-6


class _Batch:
    __slots__ = ("first", "count", "requests", "keep", "since")

    def __init__(self, first: int, count: int, requests: list, keep: list) -> None:
        self.first, self.count, self.requests, self.keep = first, count, requests, keep
        self.since = time.monotonic()


class _Incoming:
    __slots__ = ("first", "count", "bulk", "headers", "words", "request", "since")

    def __init__(self, first: int, count: int, bulk: bool, headers: np.ndarray, words: np.ndarray | None,
                 request: Any) -> None:
        self.first, self.count, self.bulk, self.headers, self.words, self.request = (
            first, count, bulk, headers, words, request)
        self.since = time.monotonic()


class MpiLink:
    """The proxy's state for one engine link (used by the proxy thread only, under the MPI lock)."""

    def __init__(self, proxy: MpiProxy, peer: int, out_ring: Ring, in_ring: Ring, max_batch: int) -> None:
        self.proxy = proxy
        self.peer = peer
        self.rank = proxy.rank
        self.out = PacketReader(out_ring)
        self.into = PacketWriter(in_ring)
        self.geo = out_ring.geometry
        self.max_batch = max_batch
        self.remote_consumed = 0  # the peer's agent has taken this many of our packets
        self.inflight: deque[_Batch] = deque()
        self.incoming: deque[_Incoming] = deque()
        self.expected = 0  # next packet number the peer sends
        self.reported = 0  # consumed count last sent to the peer
        self.ctrl_sends: list[tuple[Any, np.ndarray]] = []
        self.meta_words = _META_HEAD + max_batch * (2 + LL_WORDS)
        self.meta_buf = np.zeros(self.meta_words, dtype="<u4")
        self.ctrl_buf = np.zeros(3, dtype="<u8")
        self.meta_req = None
        self.ctrl_req = None
        self.blocked_since: float | None = None  # a packet waits for the peer's room
        self.closing = False
        self.bye_sent = self.fin_sent = False
        self.peer_total: int | None = None  # packets the peer sent in all (from its BYE)
        self.peer_fin = False
        self.done = False
        self.close_since: float | None = None
        self.sent = 0  # packets sent (their sends complete or not)

    # -- naming ---------------------------------------------------------------------------------
    def name(self) -> str:
        return f"engine link (MPI) rank {self.rank} <-> rank {self.peer}"

    def fail(self, what: str) -> EngineError:
        return EngineError(f"{self.name()}: {what}")

    # -- MPI calls, errors named ------------------------------------------------------------------
    def _mpi(self, what: str, fn, *args):
        try:
            return fn(*args)
        except self.proxy.MPI.Exception as exc:
            raise self.fail(f"MPI error in {what}: {_mpi_text(exc)}") from None

    def start(self) -> None:
        comm = self.proxy.comm
        self.meta_req = self._mpi("posting the meta receive", comm.Irecv, [self.meta_buf, self.proxy.MPI.BYTE],
                                  self.peer, TAG_META)
        self.ctrl_req = self._mpi("posting the control receive", comm.Irecv, [self.ctrl_buf, self.proxy.MPI.BYTE],
                                  self.peer, TAG_CTRL)

    # -- one round of progress; True when something moved ------------------------------------------
    def progress(self, now: float) -> bool:
        moved = self._send_out(now)
        moved |= self._complete_sends(now)
        moved |= self._receive(now)
        moved |= self._publish(now)
        if self.proxy.discard and int(self.into.r.credit[0]) < self.into.seq:
            self.into.r.credit[0] = self.into.seq  # no agent reads any more: what arrives is taken and dropped
            moved = True
        moved |= self._control(now)
        moved |= self._report_credits()
        if self.closing:
            moved |= self._close_steps(now)
        return moved

    def _send_out(self, now: float) -> bool:
        out, geo = self.out, self.geo
        seq = out.seq
        if not out.poll(seq):
            self.blocked_since = None
            return False
        if seq - self.remote_consumed >= geo.nslots:
            if self.blocked_since is None:
                self.blocked_since = now
            elif now - self.blocked_since > self.proxy.timeout:
                raise self.fail(f"rank {self.peer}'s in ring stayed full for {self.proxy.timeout:g} s (its agent "
                                f"stopped taking packets; packet {seq} waits to cross)")
            return False
        self.blocked_since = None
        _, word0 = out.header(seq)
        bulk = bool(word0 & P.KIND_BULK)
        room = min(self.max_batch, geo.nslots - (seq - self.remote_consumed), geo.nslots - seq % geo.nslots)
        count = 1
        while count < room and out.poll(seq + count) and bool(out.header(seq + count)[1] & P.KIND_BULK) == bulk:
            count += 1
        meta = np.zeros(_META_HEAD + 2 * count + (0 if bulk else count * LL_WORDS), dtype="<u4")
        meta[0], meta[1], meta[2], meta[3] = count, int(bulk), seq & 0xFFFFFFFF, seq >> 32
        at, longest = _META_HEAD + 2 * count, 0
        for i in range(count):
            route, word = out.header(seq + i)
            n = word & SIZE_MASK
            if not 1 <= n <= (geo.chunk if bulk else P.LL_PAYLOAD):
                raise self.fail(f"packet {seq + i} in this rank's out ring has a corrupt header (size {n})")
            meta[_META_HEAD + 2 * i], meta[_META_HEAD + 2 * i + 1] = route, word
            longest = max(longest, n)
            if not bulk:
                words = out.ll_words(seq + i, n)
                meta[at:at + len(words)] = words
                at += len(words)
        meta = meta[:at]
        MPI, comm = self.proxy.MPI, self.proxy.comm
        what = f"sending packets {seq}..{seq + count - 1} to rank {self.peer}"
        requests = [self._mpi(what, comm.Isend, [meta, MPI.BYTE], self.peer, TAG_META)]
        if bulk:
            block = -(-longest // 16) * 16
            dtype = self.proxy.strided(count, block, geo.slot_bytes)
            ring = out.r.ring[out.r.bulk_offset(seq):]
            requests.append(self._mpi(what, comm.Isend, [ring, 1, dtype], self.peer, TAG_BULK))
        self.inflight.append(_Batch(seq, count, requests, [meta]))
        out.seq = seq + count
        self.sent = out.seq
        return True

    def _complete_sends(self, now: float) -> bool:
        moved = False
        while self.inflight:
            batch = self.inflight[0]
            what = f"sending packets {batch.first}..{batch.first + batch.count - 1} to rank {self.peer}"
            if not all(self._mpi(what, r.Test) for r in batch.requests):
                if now - batch.since > self.proxy.timeout:
                    raise self.fail(f"MPI send of packets {batch.first}..{batch.first + batch.count - 1} to rank "
                                    f"{self.peer} did not complete within {self.proxy.timeout:g} s (rank "
                                    f"{self.peer}'s proxy stopped receiving)")
                break
            self.inflight.popleft()
            self.out.release(batch.first + batch.count)  # the agent may reuse the slots
            moved = True
        return moved

    def _receive(self, now: float) -> bool:
        if self.meta_req is None or not self._mpi("receiving meta", self.meta_req.Test):
            return False
        m = self.meta_buf
        count, bulk, first = int(m[0]), bool(m[1]), int(m[2]) | (int(m[3]) << 32)
        if not 1 <= count <= self.max_batch or first != self.expected:
            raise self.fail(f"rank {self.peer} sent packets out of order or corrupt (count {count}, first {first}, "
                            f"expected {self.expected})")
        headers = m[_META_HEAD:_META_HEAD + 2 * count].reshape(count, 2).copy()
        geo, ring = self.geo, self.into.r
        words, request = None, None
        sizes = headers[:, 1] & SIZE_MASK
        limit = geo.chunk if bulk else P.LL_PAYLOAD
        if sizes.min() < 1 or sizes.max() > limit or bool(np.any(headers[:, 1] & P.KIND_BULK)) != bulk:
            raise self.fail(f"rank {self.peer} sent a corrupt header in packets {first}..{first + count - 1}")
        if first % geo.nslots + count > geo.nslots:
            raise self.fail(f"rank {self.peer} sent a batch across the ring's end (packets {first}..)")
        if bulk:
            block = -(-int(sizes.max()) // 16) * 16
            dtype = self.proxy.strided(count, block, geo.slot_bytes)
            view = ring.ring[ring.bulk_offset(first):]
            request = self._mpi(f"receiving packets {first}..{first + count - 1} from rank {self.peer}",
                                self.proxy.comm.Irecv, [view, 1, dtype], self.peer, TAG_BULK)
        else:
            nwords = int(np.sum(-(-sizes // 4)))
            words = m[_META_HEAD + 2 * count:_META_HEAD + 2 * count + nwords].copy()
        self.incoming.append(_Incoming(first, count, bulk, headers, words, request))
        self.expected = first + count
        self.meta_req = self._mpi("posting the meta receive", self.proxy.comm.Irecv,
                                  [self.meta_buf, self.proxy.MPI.BYTE], self.peer, TAG_META)
        return True

    def _publish(self, now: float) -> bool:
        moved = False
        into = self.into
        while self.incoming:
            inc = self.incoming[0]
            if inc.request is not None and not self._mpi("receiving bulk data", inc.request.Test):
                if now - inc.since > self.proxy.timeout:
                    raise self.fail(f"MPI receive of packets {inc.first}..{inc.first + inc.count - 1} from rank "
                                    f"{self.peer} did not complete within {self.proxy.timeout:g} s")
                break
            at = 0
            for i in range(inc.count):
                seq = inc.first + i
                route, word = int(inc.headers[i, 0]), int(inc.headers[i, 1])
                if inc.bulk:
                    into.publish_bulk(seq, route, word)
                else:
                    k = -(-(word & SIZE_MASK) // 4)
                    into.write_ll(seq, route, word, inc.words[at:at + k])
                    at += k
            into.seq = inc.first + inc.count
            self.incoming.popleft()
            moved = True
        return moved

    def _control(self, now: float) -> bool:
        moved = False
        while self.ctrl_req is not None and self._mpi("receiving control", self.ctrl_req.Test):
            kind, a = int(self.ctrl_buf[0]), int(self.ctrl_buf[1])
            if kind == CTRL_CREDIT:
                self.remote_consumed = max(self.remote_consumed, a)
            elif kind == CTRL_BYE:
                self.peer_total = a
            elif kind == CTRL_FIN:
                self.peer_fin = True
            else:
                raise self.fail(f"rank {self.peer} sent an unknown control message ({kind})")
            moved = True
            # FIN is the peer's last control message: no receive is left posted after it
            self.ctrl_req = None if self.peer_fin else self._mpi(
                "posting the control receive", self.proxy.comm.Irecv, [self.ctrl_buf, self.proxy.MPI.BYTE],
                self.peer, TAG_CTRL)
        self.ctrl_sends = [(r, b) for r, b in self.ctrl_sends if not self._mpi("sending control", r.Test)]
        return moved

    def _send_ctrl(self, kind: int, value: int) -> None:
        buf = np.array([kind, value, 0], dtype="<u8")
        req = self._mpi("sending control", self.proxy.comm.Isend, [buf, self.proxy.MPI.BYTE], self.peer, TAG_CTRL)
        self.ctrl_sends.append((req, buf))

    def _report_credits(self) -> bool:
        if self.peer_total is not None:
            return False  # the peer has sent everything: it needs no more room
        consumed = int(self.into.r.credit[0])
        if consumed <= self.reported:
            return False
        drained = consumed == self.into.seq
        if consumed - self.reported >= max(1, self.geo.nslots // 4) or drained:
            self._send_ctrl(CTRL_CREDIT, consumed)
            self.reported = consumed
            return True
        return False

    def _close_steps(self, now: float) -> bool:
        if self.close_since is None:
            self.close_since = now
        moved = False
        if not self.bye_sent and not self.inflight and not self.out.poll(self.out.seq):
            self._send_ctrl(CTRL_BYE, self.sent)
            self.bye_sent = moved = True
        if self.bye_sent and self.peer_total is not None and not self.fin_sent:
            self._send_ctrl(CTRL_FIN, 0)
            self.fin_sent = moved = True
        if (self.fin_sent and self.peer_fin and self.into.seq == self.peer_total and not self.ctrl_sends
                and not self.incoming):
            self._finish()
            return True
        if now - self.close_since > self.proxy.timeout:
            if not self.bye_sent:
                why = (f"packet {self.out.seq} could not cross: rank {self.peer}'s in ring stayed full"
                       if self.out.poll(self.out.seq) else "its last sends did not complete")
            elif self.peer_total is None or not self.peer_fin:
                why = f"rank {self.peer} did not close its end"
            else:
                why = f"packets from rank {self.peer} did not all arrive ({self.into.seq} of {self.peer_total})"
            raise self.fail(f"closing timed out after {self.proxy.timeout:g} s: {why}")
        return moved

    def _finish(self) -> None:
        if self.meta_req is not None:
            self.meta_req.Cancel()
            self.meta_req.Wait()
            self.meta_req = None
        self.done = True

    def abandon(self) -> None:
        """After a failure: cancel what is posted, without waiting for the peer."""
        for req in (self.meta_req, self.ctrl_req):
            if req is not None:
                try:
                    req.Cancel()
                    req.Free()
                except Exception:  # noqa: BLE001 - the engine already failed; leave the rest to MPI_Finalize
                    pass
        self.meta_req = self.ctrl_req = None

    def tell_agents(self) -> None:
        """Record ERR_ABORTED in the agents' ends (out ring: the writer; in ring: the reader), so device and
        host agents stop waiting at once."""
        for error, seq in ((self.out.r.send_error, self.out.seq), (self.into.r.recv_error, self.into.seq)):
            if error[0] == P.ERR_NONE:
                error[1] = 0
                error[2] = seq & 0xFFFFFFFF
                error[3] = seq >> 32
                error[0] = P.ERR_ABORTED


class MpiProxy:
    """One thread per gateway rank: progress on every engine link of the rank, under ``world.mpi_lock``."""

    def __init__(self, world: Any, comm: Any, timeout: float, spin: bool) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.world = world
        self.rank = world.rank
        self.comm = comm
        self.lock = world.mpi_lock
        self.timeout = timeout
        self.spin = spin
        self.links: list[MpiLink] = []
        self.error: EngineError | None = None
        self._types: dict[tuple[int, int, int], Any] = {}
        self._stop = threading.Event()
        self._closing = threading.Event()
        self.discard = False  # set once this rank's agents have stopped (EngineLinks.discard_incoming)
        self._thread: threading.Thread | None = None

    def strided(self, count: int, block: int, stride: int):
        """The MPI datatype of ``count`` blocks of ``block`` bytes, ``stride`` apart (the bulk areas of
        consecutive slots); made once per shape."""
        key = (count, block, stride)
        dtype = self._types.get(key)
        if dtype is None:
            dtype = self.MPI.BYTE.Create_vector(count, block, stride)
            dtype.Commit()
            self._types[key] = dtype
        return dtype

    def add(self, link: MpiLink) -> None:
        self.links.append(link)

    def start(self) -> None:
        with self.lock:
            for link in self.links:
                link.start()
        self._thread = threading.Thread(target=self._run, name=f"circuslink-engine-proxy-{self.rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        idle, sleep = 0, 20e-6
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                moved = False
                with self.lock:
                    if self._closing.is_set():
                        for link in self.links:
                            link.closing = True
                    for link in self.links:
                        if not link.done:
                            moved |= link.progress(now)
                if all(link.done for link in self.links):
                    return
                if moved or self.spin:
                    idle, sleep = 0, 20e-6
                    if self.spin and not moved:
                        time.sleep(0)  # hand the GIL to a host agent of this process
                    continue
                idle += 1
                if idle < _SPIN_POLLS:
                    time.sleep(0)
                else:
                    time.sleep(sleep)
                    sleep = min(2 * sleep, _SLEEP_MAX_S)
        except BaseException as exc:  # noqa: BLE001 - recorded, then raised on the host's next call
            self.error = exc if isinstance(exc, EngineError) else EngineError(
                f"engine (MPI) proxy of rank {self.rank}: {type(exc).__name__}: {exc}")
            with self.lock:
                for link in self.links:
                    link.tell_agents()
                    link.abandon()

    def check(self) -> None:
        """Raise the proxy's recorded failure, if any."""
        if self.error is not None:
            raise self.error

    def close(self, deadline) -> None:
        """Flush, say BYE and FIN on every link, and stop the thread (bounded by ``deadline``)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline.remaining()) + 1.0)
            if self._thread.is_alive():
                self._stop.set()
                self._thread.join(2.0)
                if self.error is None:
                    pending = [link.peer for link in self.links if not link.done]
                    self.error = EngineError(f"engine (MPI) proxy of rank {self.rank}: closing the links to rank(s) "
                                             f"{', '.join(map(str, pending))} did not finish within "
                                             f"{deadline.limit:g} s")
        self.check()

    def stop(self) -> None:
        """Stop at once (the error path): no handshake."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        with self.lock:
            for link in self.links:
                if not link.done:
                    link.tell_agents()
                    link.abandon()

    def free_types(self) -> None:
        with self.lock:
            for dtype in self._types.values():
                try:
                    dtype.Free()
                except Exception:  # noqa: BLE001 - freeing is best effort once the links are down
                    pass
            self._types.clear()


def _mpi_text(exc: Any) -> str:
    try:
        return f"{exc.Get_error_string().strip()} (error class {exc.Get_error_class()})"
    except Exception:  # noqa: BLE001 - a fake or broken exception still gets named
        return str(exc)
