"""The forwarding agent of the cpu back-end: the reference of ``detail/router_impl.cuh``.

One :class:`Agent` per rank serves the input rings of its rank (link rings and the injection rings of the
routed channels whose route starts through it), pass after pass, never waiting on an output: an input
whose head cannot move (its next buffer is full, or its channel's receiver has not freed room) is skipped
and tried again next pass, so one blocked head never holds up another input. Same memory layout, same
stores in the same order as the device agent (data words before the flags that publish them, a bulk
payload before its header; x86's total store order gives the ordering the device gets from one 8-byte
store or a release fence).

:class:`Agent` works on numpy views given by a ``view(rank, offset, nbytes)`` function, so tests can run
several ranks' agents in one process over plain arrays and step them by hand (:meth:`Agent.step`);
:class:`CpuRouter` runs one in a thread of its rank.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _routed as R
from . import protocol as P

BURST = 8  # packets of one input per visit: enough to amortize a pass, few enough to stay fair
REPORT_EVERY = 8  # busy passes between looks at the credit reports (idle passes always look; the device's keeper
#                   warp looks every pass of its own)
_IDLE_SLEEP_MIN_S = 20e-6
_IDLE_SLEEP_MAX_S = 2e-3


def report_due(count: int, reported: int, delivered: int, nslots: int) -> bool:
    """Whether ``last`` sends ``first`` a credit report (``report_due`` in detail/router_impl.cuh, the same rule):
    the receiver's consumed count moved by a quarter ring since the last report, or it moved at all while ``first``
    may be out of room (every packet the last report let it drain has been delivered: ``first`` drains packet q only
    while q < reported + nslots). A sender waiting for room always gets it; a channel with room to spare (a
    pingpong) costs a credit packet every quarter ring, not one beside every message."""
    return count > reported and (count - reported >= max(1, nslots // 4) or delivered - reported >= nslots)


class AgentError(Exception):
    """A forwarding agent met a packet it cannot handle (a corrupt header, an unknown channel)."""


class _Ring:
    """A ring of slots as u8 and little-endian u32 views."""

    def __init__(self, arr: np.ndarray, nslots: int, slot_bytes: int, chunk: int) -> None:
        self.u8 = arr
        self.w = arr.view("<u4")
        self.nslots = nslots
        self.slot_bytes = slot_bytes
        self.chunk = chunk

    def base(self, seq: int) -> int:
        return (seq % self.nslots) * self.slot_bytes


class _In:
    def __init__(self, spec: R.InputSpec, view: Callable) -> None:
        self.spec = spec
        self.ring = _Ring(view(*spec.ring, spec.nslots * spec.slot_bytes), spec.nslots, spec.slot_bytes, spec.chunk)
        self.credit = view(*spec.credit, 8).view("<u8")
        self.slot_credit = None if spec.slot_credit is None else view(*spec.slot_credit, 4 * spec.nslots).view("<u4")
        self.chain = view(*spec.chain, R.CHAIN_BYTES).view("<u4")
        self.seq = 0
        self.blocked: Any = None  # None, ("gate", channel), ("deliver", channel) or ("out", output index)
        self.since = 0.0
        self.published = False


class _Out:
    def __init__(self, spec: R.OutputSpec, view: Callable) -> None:
        self.spec = spec
        self.ring = _Ring(view(*spec.ring, spec.nslots * spec.slot_bytes), spec.nslots, spec.slot_bytes, spec.chunk)
        self.credit = view(*spec.credit, 8).view("<u8")
        self.down_chain = view(*spec.down_chain, R.CHAIN_BYTES).view("<u4")
        self.seq = 0
        self.cache = 0

    def room(self) -> bool:
        if self.seq < self.cache + self.ring.nslots:
            return True
        self.cache = int(self.credit[0])
        return self.seq < self.cache + self.ring.nslots


class _Chan:
    def __init__(self, spec: R.ChannelSpec, view: Callable) -> None:
        self.spec = spec
        self.ring = None if spec.ring is None else _Ring(view(*spec.ring, spec.nslots * spec.slot_bytes),
                                                         spec.nslots, spec.slot_bytes, spec.chunk)
        self.board = None if spec.board is None else view(*spec.board, 4 * spec.nslots).view("<u4")
        self.delivered = 0  # ROLE_LAST: packets written into the delivery ring
        self.consumed = 0  # ROLE_LAST: the receiver's in-order consumed count, scanned from the board
        self.reported = 0  # ROLE_LAST (first != last): the count last sent to first
        self.gate = 0  # ROLE_FIRST: the receiver's consumed count as known here

    def scan(self) -> int:
        """Advance ``consumed`` over the board's slot credits (any read form stores them, in or out of order)."""
        n, p = self.spec.nslots, self.consumed
        while p < self.delivered and int(self.board[p % n]) == P.flag_of(p):
            p += 1
        self.consumed = p
        return p


class Agent:
    """One rank's forwarding agent (see the module docstring); ``step()`` runs one pass."""

    def __init__(self, tables: R.AgentTables, view: Callable[[int, int, int], np.ndarray], timeout_s: float,
                 report_after_s: float) -> None:
        self.t = tables
        self.rank = tables.rank
        self.vcs = tables.vcs
        self.inputs = [_In(s, view) for s in tables.inputs]
        self.outputs = [None if s is None else _Out(s, view) for s in tables.outputs]
        self.chans = [None if s is None else _Chan(s, view) for s in tables.channels]
        self.timeout_s = timeout_s
        self.report_after_s = report_after_s
        self.rr = 0
        self.passes = 0
        self.moved = 0  # packets moved so far (forwarded, delivered, credit packets consumed)

    # -- one pass --------------------------------------------------------------------------------------
    def step(self) -> int:
        """Serve every input once (up to BURST packets each), round robin; return the packets moved."""
        moved = 0
        n = len(self.inputs)
        for k in range(n):
            moved += self._serve(self.inputs[(self.rr + k) % n])
        self.rr = (self.rr + 1) % max(n, 1)
        self.passes += 1
        if not moved or self.passes % REPORT_EVERY == 0:
            self._report_all()
        if not moved:
            self._publish_chains(time.monotonic())
        self.moved += moved
        return moved

    def _serve(self, inp: _In) -> int:
        done = 0
        while done < BURST:
            q = inp.seq
            ring = inp.ring
            head = ring.base(q) // 4
            flag = P.flag_of(q)
            w = ring.w
            if int(w[head + 3]) != flag or int(w[head + 1]) != flag:
                break
            route, word = int(w[head]), int(w[head + 2])
            bulk, ctrl = bool(word & P.KIND_BULK), bool(word & R.KIND_CTRL)
            nb = word & R.ROUTED_NBYTES_MASK
            dst, rid = route >> 16, route & 0xFFFF
            self._check_header(inp, q, route, word, nb, bulk, ctrl, dst)
            if inp.spec.kind == R.IN_INJECT:
                ch = self.chans[inp.spec.channel]
                if q >= ch.gate + ch.spec.nslots and not self._refresh_gate(ch, q):
                    self._block(inp, ("gate", inp.spec.channel))
                    break
            if ctrl and dst == self.rank:  # a credit packet for a channel whose injection ring drains here
                self._take_credit(inp, q, rid)
                self._consumed(inp, q)
                done += 1
                continue
            nxt, port, vc = int(self.t.next[dst]), int(self.t.port[dst]), int(self.t.vc[dst])
            if not ctrl and self._delivers(dst, nxt, port, vc):  # the last hop: straight into the delivery ring
                c = inp.spec.channel if inp.spec.kind == R.IN_INJECT else self.t.channel_of_id.get(rid, -1)
                ch = self.chans[c] if 0 <= c < len(self.chans) else None
                if ch is None or ch.ring is None:
                    raise AgentError(f"rank {self.rank}: {self._name(inp)} packet {q}: channel id {rid} is not "
                                     "delivered from this rank")
                d = ch.delivered
                n = ch.spec.nslots
                if d >= n and int(ch.board[d % n]) != P.flag_of(d - n):
                    self._block(inp, ("deliver", c))
                    break
                self._copy(inp, q, ch.ring, d, route, nb | (P.KIND_BULK if bulk else 0), nb, bulk)
                ch.delivered = d + 1
                self._consumed(inp, q)
                if ch.spec.first != self.rank:
                    self._report(c, ch)
            else:
                out = self.outputs[port * self.vcs + vc] if port >= 0 else None
                if out is None:
                    raise AgentError(f"rank {self.rank}: {self._name(inp)} packet {q}: no link out toward rank {dst}")
                if not out.room():
                    self._block(inp, ("out", out.spec.index))
                    break
                out_word = nb | (P.KIND_BULK if bulk else 0) | (R.KIND_CTRL if ctrl else 0) | (vc << R.VC_SHIFT)
                self._copy(inp, q, out.ring, out.seq, route, out_word, nb, bulk)
                out.seq += 1
                self._consumed(inp, q)
            done += 1
        return done

    def _delivers(self, dst: int, nxt: int, port: int, vc: int) -> bool:
        """Whether a data packet for ``dst`` is delivered here: it is at its destination (it crossed a relay into
        the receiver's own agent), or one mapped hop from it. A last hop through a relay goes into the relay's
        out ring like any other hop; the landing agent delivers."""
        if dst == self.rank:
            return True
        if nxt != dst:
            return False
        out = self.outputs[port * self.vcs + vc] if port >= 0 else None
        return out is None or not out.spec.relay

    def _check_header(self, inp: _In, q: int, route: int, word: int, nb: int, bulk: bool, ctrl: bool,
                      dst: int) -> None:
        limit = inp.ring.chunk if bulk else P.LL_PAYLOAD
        if not 1 <= nb <= limit or dst >= self.t.nranks or (ctrl and nb != R.CREDIT_PACKET_BYTES) \
                or (word & 0x60000000):
            raise AgentError(f"rank {self.rank}: {self._name(inp)} packet {q} has a corrupt header "
                             f"(route {route:#x}, word {word:#x})")
        if inp.spec.kind == R.IN_INJECT and (ctrl or word & R.VC_MASK):
            raise AgentError(f"rank {self.rank}: {self._name(inp)} packet {q}: a sender wrote routing bits "
                             f"(word {word:#x})")

    # -- moving one packet ---------------------------------------------------------------------------------
    def _copy(self, inp: _In, q: int, out: _Ring, s: int, route: int, out_word: int, nb: int, bulk: bool) -> None:
        src, dst = inp.ring, out
        sb, db = src.base(q), dst.base(s)
        flag = P.flag_of(s)
        w = dst.w
        head = db // 4
        rewrite = P.rewrites_all(s, dst.nslots)
        if bulk:
            at, fro = db + P.LL_AREA_BYTES, sb + P.LL_AREA_BYTES
            dst.u8[at:at + nb] = src.u8[fro:fro + nb]
            dst.u8[at + nb:at + -(-nb // 16) * 16] = 0
            if rewrite:
                data = w[head + 4:head + 4 + 2 * (P.LL_UNITS - 2)].reshape(-1, 2)
                data[:, 0] = 0
                data[:, 1] = flag
        else:
            units = -(-nb // 4)
            sw = src.w[sb // 4 + 4:sb // 4 + 4 + 2 * units].reshape(units, 2)
            want = P.flag_of(q)
            if not np.all(sw[:, 1] == want):  # units lag their header (a one-thread writer): wait, bounded
                self._wait_units(inp, q, sw, want)
            payload = sw[:, 0].copy()
            n_units = P.LL_UNITS - 2 if rewrite else units
            data = w[head + 4:head + 4 + 2 * n_units].reshape(n_units, 2)
            data[:units, 0] = payload
            data[units:, 0] = 0
            data[:, 1] = flag
        w[head] = route
        w[head + 2] = out_word
        w[head + 1] = flag
        w[head + 3] = flag

    def _wait_units(self, inp: _In, q: int, units: np.ndarray, want: int) -> None:
        from .._wait import wait_until
        from ..errors import TimeoutError

        try:
            wait_until(lambda: bool(np.all(units[:, 1] == want)), self.timeout_s or 3600.0, "packet units")
        except TimeoutError:
            raise AgentError(f"rank {self.rank}: {self._name(inp)} packet {q}: its header arrived but its "
                             f"data did not within {self.timeout_s:g} s") from None

    def _consumed(self, inp: _In, q: int) -> None:
        """Hand input packet q back to its writer: its slot credit (injection rings) and the in-order count."""
        if inp.slot_credit is not None:
            inp.slot_credit[q % inp.ring.nslots] = P.flag_of(q)
        inp.seq = q + 1
        inp.credit[0] = q + 1
        if inp.blocked is not None:
            inp.blocked = None
        if inp.published:
            inp.chain[0] = 0
            inp.published = False

    def _block(self, inp: _In, why: Any) -> None:
        if inp.blocked != why:
            inp.blocked = why
            inp.since = time.monotonic()

    # -- end-to-end credits -------------------------------------------------------------------------------
    def _refresh_gate(self, ch: _Chan, q: int) -> bool:
        """first == last: the board is here; read it. Otherwise the gate moves only with credit packets."""
        if ch.board is not None:
            ch.gate = ch.scan()
        return q < ch.gate + ch.spec.nslots

    def _take_credit(self, inp: _In, q: int, rid: int) -> None:
        c = self.t.channel_of_id.get(rid, -1)
        ch = self.chans[c] if 0 <= c < len(self.chans) else None
        if ch is None or not ch.spec.role & R.ROLE_FIRST:
            raise AgentError(f"rank {self.rank}: {self._name(inp)} packet {q}: a credit packet for channel id {rid}, "
                             "which does not start its route here")
        head = inp.ring.base(q) // 4
        w = inp.ring.w
        units = w[head + 4:head + 8].reshape(2, 2)
        if not np.all(units[:, 1] == P.flag_of(q)):
            self._wait_units(inp, q, units, P.flag_of(q))
        count = int(units[0, 0]) | int(units[1, 0]) << 32
        ch.gate = max(ch.gate, count)

    def _report_all(self) -> None:
        for c, ch in enumerate(self.chans):
            if ch is not None and ch.spec.role & R.ROLE_LAST and ch.spec.first != self.rank:
                self._report(c, ch)

    def _report(self, c: int, ch: _Chan) -> None:
        """ROLE_LAST, first elsewhere: send the receiver's consumed count to first when :func:`report_due`."""
        count = ch.scan()
        if not report_due(count, ch.reported, ch.delivered, ch.spec.nslots):
            return
        first = ch.spec.first
        port, vc = int(self.t.port[first]), int(self.t.vc[first])
        out = self.outputs[port * self.vcs + vc] if port >= 0 else None
        if out is None or not out.room():
            return  # next pass: a credit packet never waits in place of the agent
        s = out.seq
        flag = P.flag_of(s)
        w = out.ring.w
        head = out.ring.base(s) // 4
        n_units = P.LL_UNITS - 2 if P.rewrites_all(s, out.ring.nslots) else 2
        data = w[head + 4:head + 4 + 2 * n_units].reshape(n_units, 2)
        data[:, 0] = 0
        data[:2, 0] = (count & 0xFFFFFFFF, count >> 32)
        data[:, 1] = flag
        w[head] = (ch.spec.route & 0xFFFF) | first << 16
        w[head + 2] = R.CREDIT_PACKET_BYTES | R.KIND_CTRL | vc << R.VC_SHIFT
        w[head + 1] = flag
        w[head + 3] = flag
        out.seq = s + 1
        ch.reported = count

    # -- what a stalled input waits on -------------------------------------------------------------------
    def _publish_chains(self, now: float) -> None:
        for inp in self.inputs:
            if inp.blocked is None or now - inp.since < self.report_after_s:
                continue
            kind, which = inp.blocked
            me = inp.spec.entry
            if kind == "gate":
                entries, flags, start = [me], R.CHAIN_GATE, -1
            elif kind == "deliver":
                entries, flags, start = [me], R.CHAIN_DELIVERY, -1
            else:
                out = self.outputs[which]
                down = R.decode_chain(out.down_chain)
                entries, flags, start = R.extend_chain(me, R.entry_of_link(out.spec.link, out.spec.vc), down)
            R.encode_chain(inp.chain, entries, flags | R.CHAIN_BLOCKED, inp.seq, start)
            inp.published = True

    def _name(self, inp: _In) -> str:
        s = inp.spec
        if s.kind == R.IN_INJECT:
            return f"the injection ring of routed channel #{s.channel}"
        return f"link ring {self.t.link_labels.get(s.link, s.link)} vc {s.vc}"


class CpuRouter:
    """One rank's agent, run by a thread from open() to close(); errors are kept for :meth:`check`."""

    def __init__(self, channels: Any) -> None:
        plan = channels._plan.router
        buf = channels._buf
        relays = channels._relays

        def view(rank: int, offset: int, nbytes: int) -> np.ndarray:
            peer = R.relay_peer((rank, offset))
            if peer is not None:  # a relay's ring in this rank's memory (the transport's other side)
                return relays[peer].view(offset, nbytes)
            return buf.peer(rank)[offset:offset + nbytes]

        timeout = channels.timeout or channels.host_timeout
        self.agent = Agent(plan.agent(channels.world.rank), view, channels.timeout, R.report_after(timeout))
        self.rank = channels.world.rank
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"circuslink-agent-{self.rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sleep = _IDLE_SLEEP_MIN_S
        try:
            while not self._stop.is_set():
                if self.agent.step():
                    sleep = _IDLE_SLEEP_MIN_S
                    continue
                # Idle: back off (ranks share few cores, and a spinning agent starves the peer it waits for).
                self._stop.wait(sleep)
                sleep = min(2 * sleep, _IDLE_SLEEP_MAX_S)
        except AgentError as exc:
            self.error = str(exc)
        except Exception as exc:  # a bug: keep it for check() rather than die silently in a thread
            self.error = f"rank {self.rank}: forwarding agent failed: {type(exc).__name__}: {exc}"

    def check(self) -> str | None:
        """The agent's error, if it stopped on one."""
        return self.error

    def stop(self, timeout: float | None) -> None:
        self._stop.set()
        self._thread.join(timeout)

