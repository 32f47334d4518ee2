"""An exact CPU emulation of the device channel algorithms (detail/channel_impl.cuh), no GPU needed.

Each device form (LL: write warp/block/thread, read warp/thread; BW: write/read of any group) is
re-stated here with the same index arithmetic, the same state save/restore between calls (the
control block's SendState / RecvState bytes), the same credit rules and the same 16-byte store
granularity. Writer and reader run as two generators interleaved at random at every store and
every poll (a warp's 32 lane loads are separate events, so a reader can see half a packet), the
way two GPUs interleave. A run that stops making progress is a deadlock and fails with both
sides' positions, which is how the multi-launch deadlock of the first GPU run was found: the LL
writer waited for credits for a whole batch of packets (up to nslots) while the LL warp reader
held the last written packet until the next one arrived.

Keep this file in step with channel_impl.cuh: it is a model, it does not run the CUDA code.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from circuslink.channels import protocol as P

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1


class Deadlock(AssertionError):
    pass


def flag_of(seq: int) -> int:
    return (seq & M32) | 1


class Chan:
    """One channel's device memory: ring (receiver side), credit counter, slot credits, end states."""

    def __init__(self, geo: P.RingGeometry, route: int = 0x0001_0003) -> None:
        self.geo = geo
        self.ring = np.zeros(geo.ring_bytes, dtype=np.uint8)
        self.ring32 = self.ring.view("<u4")
        self.credit = 0
        self.slot_credit = [0] * geo.nslots
        self.ctrl = np.zeros(P.CTRL_BYTES, dtype=np.uint8)  # one block stands for both ranks' copies
        self.route = route
        self.progress = 0  # bumped on every store: the deadlock detector watches it

    # SendState at +16: u64 seq, u64 credit_cache; RecvState at +48: u64 seq, u32 offset, u32 departed,
    # u64 returned (as channel_types.cuh lays them out; load_/save_*_state move exactly these words)
    def load_send(self) -> dict:
        w = self.ctrl[P.CTRL_SEND_STATE:P.CTRL_SEND_STATE + 24].view("<u8")
        return {"seq": int(w[0]), "cache": int(w[1])}

    def save_send(self, st: dict) -> None:
        w = self.ctrl[P.CTRL_SEND_STATE:P.CTRL_SEND_STATE + 24].view("<u8")
        w[0], w[1] = st["seq"], st["cache"]

    def load_recv(self) -> dict:
        b = self.ctrl[P.CTRL_RECV_STATE:P.CTRL_RECV_STATE + 24]
        return {"seq": int(b[0:8].view("<u8")[0]), "offset": int(b[8:12].view("<u4")[0]),
                "returned": int(b[16:24].view("<u8")[0])}

    def save_recv(self, st: dict) -> None:
        b = self.ctrl[P.CTRL_RECV_STATE:P.CTRL_RECV_STATE + 24]
        b[0:8].view("<u8")[0] = st["seq"]
        b[8:12].view("<u4")[0] = st["offset"]
        b[16:24].view("<u8")[0] = st["returned"]

    def slot(self, seq: int) -> int:
        return (seq & (self.geo.nslots - 1)) * self.geo.slot_bytes

    def st16(self, addr: int, words: tuple[int, int, int, int]) -> None:
        self.ring32[addr // 4:addr // 4 + 4] = words
        self.progress += 1

    def ld16(self, addr: int) -> tuple[int, int, int, int]:
        return tuple(int(x) for x in self.ring32[addr // 4:addr // 4 + 4])


def _spin(ready):
    """wait_for: poll until ready() holds, yielding 'blocked' between polls."""
    while not ready():
        yield "blocked"


def _poll_line(ch: Chan, addr: int, flag: int):
    """wait_for on one 16-byte line until both its flags are `flag`; returns the line's words."""
    while True:
        v = ch.ld16(addr)
        if v[1] == flag and v[3] == flag:
            return v
        yield "blocked"


# ---- sender ---------------------------------------------------------------------------------------
def _credit_for(ch: Chan, st: dict, seq: int):
    """credit_for: leader waits until packet seq may be written (seq < consumed + nslots)."""
    n = ch.geo.nslots
    if seq < st["cache"] + n:
        return

    def ready():
        st["cache"] = ch.credit
        return seq < st["cache"] + n

    yield from _spin(ready)


def _credits_from(ch: Chan, st: dict, seq: int, want: int):
    """credits_from: wait for packet seq's credit only; return how many of `want` packets may go now."""
    n = ch.geo.nslots
    if seq + want > st["cache"] + n and seq < st["cache"] + n:
        st["cache"] = ch.credit  # one fresh look, no wait: the batch may be larger than the cache says
    yield from _credit_for(ch, st, seq)
    return min(want, st["cache"] + n - seq)


def ll_write(ch: Chan, gsize: int, src: bytes, old_batching: bool = False):
    """ll_write<G> (G of gsize threads): packets of <= 120 bytes, 16 lanes a packet, lines stored in any order."""
    st = ch.load_send()
    nbytes = len(src)
    if nbytes == 0:
        return
    npk = -(-nbytes // P.LL_PAYLOAD)
    per_iter = gsize // 16 if gsize >= 16 else 1
    per_iter = min(per_iter, ch.geo.nslots)
    base = 0
    while base < npk:
        if old_batching:  # the first GPU run's code: credits for the whole batch before any store
            last = min(base + per_iter, npk) - 1
            yield from _credit_for(ch, st, st["seq"] + last)
            cnt = last - base + 1
        else:
            cnt = yield from _credits_from(ch, st, st["seq"] + base, min(per_iter, npk - base))
        stores = []
        for it in range(cnt * 16):
            p, line = base + it // 16, it % 16
            seq = st["seq"] + p
            off = p * P.LL_PAYLOAD
            nb = min(nbytes - off, P.LL_PAYLOAD)
            slot = ch.slot(seq)
            flag = flag_of(seq)
            if line == 0:
                stores.append((slot, (ch.route, flag, nb, flag)))
            elif (line - 1) * 8 < nb:
                lo_b = off + (line - 1) * 8
                chunk = src[lo_b:min(lo_b + 8, off + nb)].ljust(8, b"\0")
                lo, hi = int.from_bytes(chunk[:4], "little"), int.from_bytes(chunk[4:], "little")
                stores.append((slot + line * 16, (lo, flag, hi, flag)))
        random.shuffle(stores)  # no fence: lanes' stores land in any order
        for addr, words in stores:
            ch.st16(addr, words)
            yield "stored"
        base += cnt
    st["seq"] += npk
    ch.save_send(st)


def bw_write(ch: Chan, src: bytes):
    """bw_write<G>: per packet, wait for its credit, store the payload vectors (any order), fence, header."""
    st = ch.load_send()
    pay = ch.geo.payload
    for off in range(0, len(src), pay):
        nb = min(len(src) - off, pay)
        yield from _credit_for(ch, st, st["seq"])
        slot = ch.slot(st["seq"])
        body = src[off:off + nb].ljust(-(-nb // 16) * 16, b"\0")
        vecs = list(range(len(body) // 16))
        random.shuffle(vecs)
        for i in vecs:
            ch.ring[slot + 16 + 16 * i: slot + 32 + 16 * i] = np.frombuffer(body[16 * i:16 * i + 16], np.uint8)
            ch.progress += 1
            yield "stored"
        flag = flag_of(st["seq"])
        ch.st16(slot, (ch.route, flag, nb, flag))  # after __threadfence_system
        yield "stored"
        st["seq"] += 1
    ch.save_send(st)


# ---- receiver -------------------------------------------------------------------------------------
def _return_credits(ch: Chan, st: dict) -> None:
    if st["seq"] != st["returned"]:
        ch.credit = st["seq"]
        ch.progress += 1
        st["returned"] = st["seq"]


def ll_read_warp(ch: Chan, out: bytearray, nbytes: int):
    """ll_read_warp: lanes 0-15 poll packet seq's lines, lanes 16-31 packet seq + 1 (each load its own event)."""
    st = ch.load_recv()
    done = 0
    while done < nbytes:
        need = nbytes - done
        while True:
            v = [None] * 32
            order = list(range(32))
            random.shuffle(order)
            for lane in order:
                j, line = lane // 16, lane % 16
                v[lane] = ch.ld16(ch.slot(st["seq"] + j) + line * 16)
                yield "polled"
            flags_ok = [v[ln][1] == flag_of(st["seq"] + ln // 16) and v[ln][3] == flag_of(st["seq"] + ln // 16)
                        for ln in range(32)]
            hdr0, hdr1 = flags_ok[0], flags_ok[16]
            if not hdr0:  # the idle-poll vote: nothing is consumable before packet seq's header
                yield "blocked"
                continue
            nb0, nb1 = v[0][2], v[16][2]
            need1 = ((nb0 - st["offset"]) & M32) < need
            mine = []
            for lane in range(32):
                j, line = lane // 16, lane % 16
                if j == 1 and not need1:
                    mine.append(True)
                else:
                    hdr, nb = (True, nb0) if j == 0 else (hdr1, nb1)
                    mine.append(hdr and (line == 0 or (line - 1) * 8 >= nb or flags_ok[lane]))
            if all(mine):
                break
            yield "blocked"
        take0 = min((nb0 - st["offset"]) & M32, need)
        take1 = min(need - take0, nb1) if need1 else 0
        for lane in range(32):
            j, line = lane // 16, lane % 16
            if line == 0:
                continue
            lo, hi = (line - 1) * 8, line * 8
            from_b = st["offset"] if j == 0 else 0
            to_b = st["offset"] + take0 if j == 0 else take1
            a, b = max(lo, from_b), min(hi, to_b)
            if a < b:
                dpos = done + (a - st["offset"] if j == 0 else take0 + a)
                word = (v[lane][0] | (v[lane][2] << 32)).to_bytes(8, "little")
                out[len(out) - nbytes + dpos:len(out) - nbytes + dpos + (b - a)] = word[a - lo:b - lo]
        done += take0 + take1
        if need1 or st["offset"] + take0 == nb0:
            st["seq"] += 1
            st["offset"] = 0
            if take1 > 0:
                if take1 == nb1:
                    st["seq"] += 1
                else:
                    st["offset"] = take1
        else:
            st["offset"] += take0
        _return_credits(ch, st)
    ch.save_recv(st)


def ll_read_thread(ch: Chan, out: bytearray, nbytes: int):
    """ll_read_thread: header, then each needed line, one load at a time."""
    st = ch.load_recv()
    done = 0
    while done < nbytes:
        seq, flag = st["seq"], flag_of(st["seq"])
        slot = ch.slot(seq)
        nb = (yield from _poll_line(ch, slot, flag))[2]
        take = min((nb - st["offset"]) & M32, nbytes - done)
        from_b, to_b = st["offset"], st["offset"] + take
        line = 1 + from_b // 8
        while (line - 1) * 8 < to_b:
            lv = yield from _poll_line(ch, slot + line * 16, flag)
            lo, hi = (line - 1) * 8, line * 8
            a, b = max(lo, from_b), min(hi, to_b)
            word = (lv[0] | (lv[2] << 32)).to_bytes(8, "little")
            dpos = len(out) - nbytes + done + (a - from_b)
            out[dpos:dpos + b - a] = word[a - lo:b - lo]
            line += 1
        done += take
        st["offset"] += take
        if st["offset"] == nb:
            st["seq"] += 1
            st["offset"] = 0
            _return_credits(ch, st)
    ch.save_recv(st)


def bw_read(ch: Chan, out: bytearray, nbytes: int):
    """bw_read<G>: leader polls the header, the group copies [offset, offset + take), credits when consumed."""
    st = ch.load_recv()
    done = 0
    while done < nbytes:
        seq, flag = st["seq"], flag_of(st["seq"])
        slot = ch.slot(seq)
        nb = (yield from _poll_line(ch, slot, flag))[2]
        take = min(nb - st["offset"], nbytes - done)
        s = slot + 16 + st["offset"]
        dpos = len(out) - nbytes + done
        out[dpos:dpos + take] = ch.ring[s:s + take].tobytes()
        done += take
        st["offset"] += take
        if st["offset"] == nb:
            ch.slot_credit[seq & (ch.geo.nslots - 1)] = flag_of(seq)
            st["seq"] += 1
            st["offset"] = 0
            _return_credits(ch, st)
    ch.save_recv(st)


# ---- the device forms, as the GPU tests launch them ---------------------------------------------------
def write_form(ch: Chan, form: str, src: bytes, elem: int, old_batching: bool = False):
    ll = ch.geo.mode == P.MODE_LL
    if form == "w_thread":  # one call (one packet at least) per element
        for i in range(0, len(src), elem):
            yield from (ll_write(ch, 1, src[i:i + elem], old_batching) if ll else bw_write(ch, src[i:i + elem]))
    else:
        gsize = 32 if form == "w_warp" else 256
        yield from (ll_write(ch, gsize, src, old_batching) if ll else bw_write(ch, src))


def read_form(ch: Chan, form: str, out: bytearray, n: int, elem: int):
    ll = ch.geo.mode == P.MODE_LL
    if form == "r_thread":
        for _ in range(n):
            out += bytes(elem)
            yield from (ll_read_thread(ch, out, elem) if ll else bw_read(ch, out, elem))
    else:  # r_warp, r_block (LL: warp 0 reads for the block)
        out += bytes(n * elem)
        yield from (ll_read_warp(ch, out, n * elem) if ll else bw_read(ch, out, n * elem))


def run_pair(writer, reader, ch: Chan, rng: random.Random, patience: int = 4000) -> None:
    """Interleave two generators at random; raise Deadlock when neither stores nor consumes for long."""
    live = {"writer": writer, "reader": reader}
    last_progress, idle = ch.progress, 0
    while live:
        name = rng.choice(sorted(live))
        try:
            next(live[name])
        except StopIteration:
            del live[name]
        if ch.progress != last_progress:
            last_progress, idle = ch.progress, 0
        else:
            idle += 1
            if idle > patience:
                raise Deadlock(f"no progress: {sorted(live)} still waiting; credit={ch.credit} "
                               f"send={ch.load_send()} recv={ch.load_recv()}")


def stream_case(mode: str, elem: int, seed: int, nslots: int = 4, chunk: int = 256, old_batching: bool = False,
                wplan=None, rplan=None) -> None:
    """The GPU test's stream: 6 writes of 1..199 elements (warp / block / thread forms in turn), reads of
    1..149 elements (warp / block / thread in turn), all on one channel of `nslots` slots."""
    r = random.Random(seed)
    random.seed(seed)
    geo = P.geometry(64, elem, mode=mode, nslots=nslots, chunk=chunk if mode == "bw" else None)
    ch = Chan(geo)
    calls = wplan or [r.randint(1, 199) for _ in range(6)]
    total = sum(calls)
    data = bytes(r.getrandbits(8) for _ in range(total * elem))
    wforms, rforms = ["w_warp", "w_block", "w_thread"], ["r_warp", "r_block", "r_thread"]

    def writer():
        pos = 0
        for i, n in enumerate(calls):
            form = wforms[i % 3] if n * elem < 4096 or wforms[i % 3] != "w_thread" else "w_warp"
            yield from write_form(ch, form, data[pos * elem:(pos + n) * elem], elem, old_batching)
            pos += n

    out = bytearray()

    def reader():
        pos, i = 0, 0
        splits = iter(rplan) if rplan else None
        while pos < total:
            n = min(total - pos, next(splits) if splits else r.randint(1, 149))
            yield from read_form(ch, rforms[i % 3], out, n, elem)
            pos += n
            i += 1

    run_pair(writer(), reader(), ch, r)
    assert bytes(out) == data, f"{mode} elem {elem} seed {seed}: stream differs"


# ---- tests -----------------------------------------------------------------------------------------
def test_old_ll_batching_deadlocks_as_on_the_gpu():
    """The first GPU run's failure, reproduced: a block writer (per_iter = nslots) and a warp reader whose
    read spans the last written packet and the next one wait on each other."""
    # 16-byte elements: a warp write of 10 (160 B: packets 0, 1 of 120 + 40 B); a read of 9 (144 B) leaves
    # packet 1 part-read, the next read of 2 needs packet 2 while holding 1 (credit counter = 1); the block
    # write of 30 (480 B = 4 packets = nslots) waited for credits for packets 2..5, i.e. counter >= 2.
    with pytest.raises(Deadlock):
        stream_case("ll", 16, 1, old_batching=True, wplan=[10, 30, 1, 1, 1, 1], rplan=[9, 2] + [9] * 5)
    stream_case("ll", 16, 1, wplan=[10, 30, 1, 1, 1, 1], rplan=[9, 2] + [9] * 5)


@pytest.mark.parametrize("mode", ["ll", "bw"])
def test_stream_forms_emulated(mode):
    """Random splits and forms, every element size, rings of 4 (and 2) slots: exactly once, in order, no deadlock."""
    seeds = np.random.SeedSequence().generate_state(1)[0]
    base = int(seeds)
    for k, elem in enumerate([1, 2, 4, 8, 12, 16, 64]):
        for nslots in (2, 4):
            stream_case(mode, elem, base + 7 * k + nslots, nslots=nslots)


def test_slow_reader_tiny_ring_emulated():
    """test_slow_reader_tiny_ring_gpu[ll]'s shape: one block write of 3000 ulongs, warp reads of 100.

    The old batching deadlocks here (the GPU reported: writer waits to write seq 19, reader for seq 16)."""
    with pytest.raises(Deadlock):
        _slow(0, old_batching=True)
    for seed in range(2):
        _slow(seed)


def _slow(seed: int, old_batching: bool = False) -> None:
    r = random.Random(seed)
    random.seed(seed)
    ch = Chan(P.geometry(1, 8, mode="ll", nslots=4))
    data = bytes(r.getrandbits(8) for _ in range(3000 * 8))
    out = bytearray()

    def writer():
        yield from write_form(ch, "w_block", data, 8, old_batching)

    def reader():
        for _ in range(30):
            yield from read_form(ch, "r_warp", out, 100, 8)

    run_pair(writer(), reader(), ch, r)
    assert bytes(out) == data
