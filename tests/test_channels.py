"""CIRCUS channels on the cpu back-end (the protocol's reference implementation).

Multi-rank properties run as 2 ranks through the spmd fixture; the byte-level protocol (test
vectors, packing) runs in one process against the endpoint classes directly. The vectors and the
random packing checks compare with tests/vectors/make_vectors.py, an encoder written from
docs/protocol.md that shares no code with the cpu reference.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from circuslink import ChannelError, ConfigError, SpecError
from circuslink.channels import protocol as P
from circuslink.channels._cpu import CpuReceiver, CpuSender

VECTORS_DIR = Path(__file__).parent / "vectors"
VECTORS = json.loads((VECTORS_DIR / "channel_rings.json").read_text())["vectors"]
sys.path.insert(0, str(VECTORS_DIR))
import make_vectors as independent  # noqa: E402


def _pair(geo: P.RingGeometry, route: int = 0x0001_0007, timeout: float = 5.0, first_seq: int = 0):
    """A sender and a receiver sharing arrays in this process (credit, ring, slot credits)."""
    ring = np.zeros(geo.ring_bytes, dtype=np.uint8)
    credit = np.zeros(1, dtype="<u8")
    slots = np.zeros(geo.nslots, dtype="<u4")
    tx = CpuSender("tx", "channel tx", 7, geo, ring, credit, slots, np.zeros(4, "<u4"), timeout, route)
    rx = CpuReceiver("rx", "channel rx", 7, geo, ring, credit, slots, np.zeros(4, "<u4"), timeout, route)
    tx.seq = tx.credit_cache = rx.seq = first_seq
    credit[0] = first_seq
    return tx, rx, ring, credit


def _geo(vec) -> P.RingGeometry:
    return P.geometry(1, 1, nslots=vec["nslots"], chunk=vec["chunk"], ll_max=vec["ll_max"])


@pytest.mark.parametrize("vec", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vectors_cpu(vec):
    geo = _geo(vec)
    tx, _, ring, credit = _pair(geo, P.route_of(vec["recv_id"], vec["dst_rank"]), first_seq=vec["first_seq"])
    credit[0] = 1 << 40  # the reader keeps up: the vectors cover wrap-around
    for data in vec["writes"]:
        tx.write_bytes(bytes.fromhex(data))
    assert tx.seq - vec["first_seq"] == vec["packets"]
    assert ring.tobytes().hex() == vec["ring"]


def test_vectors_roundtrip_cpu(rng):
    """The vector streams read back exactly, with reads split differently from the writes."""
    for vec in VECTORS:
        tx, rx, _, _ = _pair(_geo(vec), first_seq=vec["first_seq"])
        stream = b"".join(bytes.fromhex(d) for d in vec["writes"])
        writes = [bytes.fromhex(d) for d in vec["writes"]]
        writer = threading.Thread(target=lambda tx=tx, writes=writes: [tx.write_bytes(d) for d in writes])
        writer.start()
        got = bytearray()
        while len(got) < len(stream):
            got += rx.read_bytes(int(rng.integers(1, len(stream) - len(got) + 1)))
        writer.join()
        assert bytes(got) == stream, vec["name"]


def test_random_packing_matches_the_independent_encoder(rng):
    """CpuSender and the encoder written from the protocol document agree for random geometries,
    element sizes, switch points and write calls, from random starting packets."""
    for _ in range(40):
        nslots = int(rng.choice([2, 4, 8]))
        chunk = int(rng.choice([256, 512, 1024]))
        ll_max = int(rng.choice([0, 64, 120, 1024]))
        first = int(rng.choice([0, 3, (1 << 31) - 2, (1 << 32) - 1, 12345678901]))
        geo = P.geometry(1, 1, nslots=nslots, chunk=chunk, ll_max=ll_max)
        route = P.route_of(int(rng.integers(0, 65536)), int(rng.integers(0, 16)))
        tx, _, ring, credit = _pair(geo, route=route, first_seq=first)
        credit[0] = 1 << 40
        expect = np.zeros_like(ring)
        seq = first
        elem = int(rng.choice([1, 2, 4, 8, 12, 16, 64]))
        for _ in range(int(rng.integers(1, 6))):
            data = rng.integers(0, 256, elem * int(rng.integers(1, 80)), dtype=np.uint8).tobytes()
            tx.write_bytes(data)
            seq = independent.encode(expect, nslots, chunk, ll_max, route, seq, data)
        assert tx.seq == seq and ring.tobytes() == expect.tobytes()


@pytest.mark.parametrize("first_seq", [0, 6, (1 << 31) - 1, 1 << 31, (1 << 32) + 9])
def test_low_latency_packet_by_hand(rng, first_seq):
    """One low-latency packet spelled out: units {route, flag} {nbytes, flag}, then {4 bytes, flag} each;
    units past nbytes are written (zeros) only on the first lap after a multiple of 2^31."""
    geo = P.geometry(1, 1, nslots=2, chunk=256)
    tx, _, ring, _ = _pair(geo, route=P.route_of(0x1234, 3), first_seq=first_seq)
    payload = rng.integers(0, 256, 20, dtype=np.uint8).tobytes()
    tx.write_bytes(payload)
    flag = (first_seq & 0xFFFFFFFF) | 1
    slot = ring[(first_seq % 2) * geo.slot_bytes:(first_seq % 2 + 1) * geo.slot_bytes]
    words = slot.view("<u4")
    assert list(words[:4]) == [0x0003_1234, flag, 20, flag]
    rewrite = first_seq % (1 << 31) < geo.nslots
    units = words[4:4 + 2 * (30 if rewrite else 5)].reshape(-1, 2)
    assert (units[:, 1] == flag).all()
    assert units[:, 0].tobytes()[:20] == payload and not units[5:, 0].any()
    written = 8 * (2 + len(units))
    assert not slot[written:].any()  # units past nbytes and the bulk area are not written


def test_bulk_packet_by_hand(rng):
    """A write longer than ll_max: payload in the bulk area (zero padded to 16), then the header with
    the bulk bit; the low-latency units are not touched outside a rewrite lap."""
    geo = P.geometry(1, 1, nslots=4, chunk=512, ll_max=16)
    tx, _, ring, _ = _pair(geo, route=P.route_of(9, 1), first_seq=6)
    payload = rng.integers(0, 256, 700, dtype=np.uint8).tobytes()
    tx.write_bytes(payload)
    assert tx.seq == 8  # 512 + 188
    for k, (seq, part) in enumerate(((6, payload[:512]), (7, payload[512:]))):
        slot = ring[(seq % 4) * geo.slot_bytes:(seq % 4 + 1) * geo.slot_bytes]
        assert list(slot[:16].view("<u4")) == [P.route_of(9, 1), seq | 1, len(part) | P.KIND_BULK, seq | 1], k
        assert not slot[16:P.LL_AREA_BYTES].any()
        body = slot[P.LL_AREA_BYTES:].tobytes()
        assert body[:len(part)] == part and not any(body[len(part):])


def test_flags_are_never_zero_and_differ_from_the_previous_occupants():
    for nslots in (2, 4, 1024):
        for seq in (0, 1, nslots, (1 << 31) - 1, (1 << 32) - 1, 1 << 32, (1 << 33) + 5, (1 << 64) - 1):
            assert P.flag_of(seq) != 0
            for k in range(1, 8):
                if seq >= k * nslots:
                    assert P.flag_of(seq) != P.flag_of(seq - k * nslots)


@pytest.mark.parametrize("ll_max", [1 << 20, 0])
def test_reader_ahead_of_the_writer_at_flag_wrap(rng, ll_max):
    """At seq 2^32 - 1 the old flag (seq + 1) mod 2^32 was 0, which a zeroed ring already holds: a
    reader that polled before the writer stored read a packet of 0 bytes. It must wait."""
    geo = P.geometry(64, 4, nslots=4, chunk=256, ll_max=ll_max)
    tx, rx, _, _ = _pair(geo, first_seq=(1 << 32) - 1)
    data = rng.integers(0, 256, 3 * 120 + 17, dtype=np.uint8).tobytes()

    def late_writer():
        time.sleep(0.05)
        tx.write_bytes(data)

    writer = threading.Thread(target=late_writer)
    writer.start()
    got = rx.read_bytes(len(data))
    writer.join()
    assert got == data


@pytest.mark.parametrize("ll_max", [1024, 0])
def test_rewrite_lap_refreshes_every_unit(rng, ll_max):
    """Units a short packet leaves alone keep the flag of the packet that last wrote them. A unit last
    written 2^32 packets ago would carry the flag expected now; every slot's units are therefore all
    rewritten on the first lap after each multiple of 2^31, by low-latency and bulk packets alike."""
    geo = P.geometry(1, 1, nslots=4, chunk=256, ll_max=ll_max)
    start = (1 << 31) - 2 * geo.nslots
    tx, _, ring, credit = _pair(geo, first_seq=start)
    credit[0] = 1 << 40
    words = ring.view("<u4").reshape(geo.nslots, -1)
    for _ in range(2 * geo.nslots):  # two laps of 1-byte packets: at most one data unit each
        tx.write_bytes(bytes([int(rng.integers(0, 256))]))
    assert all((words[s, 4 + 2 * 2:64:2] != P.flag_of(start + geo.nslots + s)).all() for s in range(geo.nslots))
    for _ in range(geo.nslots):  # the rewrite lap
        tx.write_bytes(bytes([int(rng.integers(0, 256))]))
    for s in range(geo.nslots):
        units = words[s, 4:64].reshape(30, 2)
        assert (units[:, 1] == P.flag_of((1 << 31) + s)).all(), s
        assert not units[1:, 0].any()  # zeros past the packet's byte


def test_one_channel_carries_both_kinds(rng):
    """Writes up to ll_max go low-latency, longer ones bulk; the reader's calls ignore the boundaries."""
    geo = P.geometry(1, 1, nslots=8, chunk=512, ll_max=100)
    tx, rx, _, _ = _pair(geo)
    writes = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, 100, 101, 1500, 7, 512, 99)]
    kinds = []
    for w in writes:
        before = tx.seq
        tx.write_bytes(w)
        kinds.append("bulk" if len(w) > 100 else "ll")
        assert tx.seq - before == -(-len(w) // (512 if len(w) > 100 else 120))
        got = rx.read_bytes(len(w))
        assert got == w
    assert kinds == ["ll", "ll", "bulk", "bulk", "ll", "bulk", "ll"]


def test_elements_straddle_packets(rng):
    """16-byte elements in 120-byte low-latency packets: 7.5 per packet, the eighth split across two."""
    geo = P.geometry(64, 16, chunk=256, ll_max=1 << 20)
    tx, rx, ring, _ = _pair(geo)
    elems = rng.integers(0, 2**32, (16, 4), dtype=np.uint32)
    tx.write_bytes(elems.tobytes())
    assert tx.seq == 3  # 256 bytes: 120 + 120 + 16
    words = ring.view("<u4").reshape(geo.nslots, -1)
    assert [int(words[k, 2]) for k in range(3)] == [120, 120, 16]
    back = np.frombuffer(rx.read_bytes(256), dtype=np.uint32).reshape(16, 4)
    assert (back == elems).all()


def test_writer_never_overwrites_unread(rng):
    geo = P.geometry(1, 8, nslots=2, chunk=256)
    tx, rx, _, _ = _pair(geo, timeout=0.3)
    data = rng.integers(0, 256, 240, dtype=np.uint8).tobytes()
    tx.write_bytes(data)  # two full packets fill the ring
    with pytest.raises(ChannelError, match=r"channel tx: timed out .* waited for credits"):
        tx.write_bytes(b"x")
    assert rx.read_bytes(240) == data  # nothing was overwritten


@pytest.mark.parametrize("ll_max", [None, 0, 1 << 30])
def test_a_write_of_depth_elements_fits_without_a_reader(rng, ll_max):
    """``depth`` is a promise whichever packets carry the bytes: a write of a whole depth completes
    before the reader starts (a one-warp pingpong relies on it; with 120-byte low-latency packets
    in a ring sized for bulk ones it stalled on the GPU)."""
    for _ in range(20):
        elem = int(rng.choice([1, 4, 8, 16]))
        depth = int(rng.integers(1, 3000))
        opts = {} if ll_max is None else {"ll_max": ll_max}
        if rng.random() < 0.5:
            opts["chunk"] = 256
        geo = P.geometry(depth, elem, **opts)
        tx, rx, _, _ = _pair(geo, timeout=0.3)
        data = rng.integers(0, 256, depth * elem, dtype=np.uint8).tobytes()
        tx.write_bytes(data)  # no reader yet: must not wait for credits
        assert rx.read_bytes(len(data)) == data, (depth, elem, opts)


def test_geometry_errors():
    with pytest.raises(ConfigError, match="power of two"):
        P.geometry(8, 8, nslots=3, name="c")
    with pytest.raises(ConfigError, match="multiple of 16"):
        P.geometry(8, 8, chunk=300, name="c")
    with pytest.raises(ConfigError, match="ll_max"):
        P.geometry(8, 8, ll_max=-1, name="c")
    geo = P.geometry(1 << 20, 4)  # defaults: big packets for a big ring, at least 8 in flight
    assert geo.chunk == 64 << 10 and geo.nslots >= 8 and geo.ll_max == P.LL_MAX_DEFAULT


# ---- multi-rank ---------------------------------------------------------------------------------

ORDERING = """
    import numpy as np, circuslink as cl
    from circuslink import channels
    from circuslink.spec import Link, element_type, struct_type
    w = cl.init()
    types = [element_type("uchar"), element_type("ushort"), element_type("uint"), element_type("double"),
             struct_type("s12", [("a", element_type("uint")), ("b", element_type("float")),
                                 ("c", element_type("int"))]),
             element_type("uint4"), element_type("uint16")]
    links = []
    for i, t in enumerate(types):
        for mode in ("ll", "bulk", "mixed"):
            k = len(links)
            links.append(Link(f"{t.name}_{mode}_out", f"{t.name}_{mode}_in", 2 * k, 2 * k + 1, k % 2, 1 - k % 2,
                              t, 300))
    LL_MAX = {"ll": 1 << 20, "bulk": 0, "mixed": 200}   # every write low-latency, every write bulk, or both
    opts = {l.name: {"ll_max": LL_MAX[l.name.split("_")[-2]], "chunk": 256} for l in links}
    ch = channels.open(w, links, options=opts)
    seed = w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32)))   # fresh each run, same on both ranks
    rng = np.random.default_rng(seed)
    plans = {l.name: [int(x) for x in rng.integers(1, 400, 6)] for l in links}
    datas = {}
    for l in links:
        total = sum(plans[l.name])
        raw = rng.integers(0, 256, total * l.element.nbytes, dtype=np.uint8)
        datas[l.name] = raw.view(l.element.numpy_dtype)
    # Interleave: every rank writes a piece of each of its channels, then reads some of each of its own,
    # so writers and readers of both ranks progress together (rings are smaller than the streams).
    pos_w = {l.name: 0 for l in links}
    pos_r = {l.name: 0 for l in links}
    got = {l.name: [] for l in links}
    read_rng = np.random.default_rng()
    for step in range(6):
        for l in links:
            if l.src_rank == w.rank:
                n = plans[l.name][step]
                ch[l.name].write(datas[l.name][pos_w[l.name]:pos_w[l.name] + n])
                pos_w[l.name] += n
            else:
                want = sum(plans[l.name][:step + 1]) - pos_r[l.name]
                while want > 0:
                    n = int(read_rng.integers(1, want + 1))
                    part = ch[l.receiver_name].read(n)
                    assert part.dtype == l.element.numpy_dtype and part.shape == (n,)
                    got[l.name].append(part)
                    pos_r[l.name] += n
                    want -= n
    for l in links:
        if l.dst_rank == w.rank:
            back = np.concatenate(got[l.name])
            assert back.tobytes() == datas[l.name].tobytes(), l.name
    w.barrier()
    ch.close()
    w.close()
    print("ordering ok", w.rank)
"""


def test_ordering_exactly_once_all_types(spmd):
    job = spmd(2, ORDERING).check()
    assert job.stdout.count("ordering ok") == 2


MANY = """
    import numpy as np, circuslink as cl
    from circuslink import channels
    from circuslink.spec import Link, element_type
    w = cl.init()
    N = 64
    links = [Link(f"c{i}_out", f"c{i}_in", 2 * i, 2 * i + 1, 0, 1, element_type("uint"), 60) for i in range(N)]
    ch = channels.open(w, links, timeout=30)
    rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
    data = [rng.integers(0, 2**32, 900, dtype=np.uint32) for _ in range(N)]
    stalled = 17
    cap = ch[links[0].name if w.rank == 0 else links[0].receiver_name].geometry.nslots * 30  # uints per ring
    if w.rank == 0:
        # Fill the stalled channel's ring completely: its reader will not read it until the end.
        ch[f"c{stalled}_out"].write(data[stalled][:cap])
        for rnd in range(9):
            for i in range(N):
                if i != stalled:
                    ch[f"c{i}_out"].write(data[i][rnd * 100:(rnd + 1) * 100])
        w.barrier()
        ch[f"c{stalled}_out"].write(data[stalled][cap:])
    else:
        got = {i: [] for i in range(N)}
        for rnd in range(9):
            for i in range(N):
                if i != stalled:
                    got[i].append(ch[f"c{i}_in"].read(100))
        w.barrier()   # every other channel delivered while the stalled one sat full
        got[stalled].append(ch[f"c{stalled}_in"].read(900))
        for i in range(N):
            assert np.concatenate(got[i]).tobytes() == data[i].tobytes(), i
    ch.close()
    w.close()
    print("many ok", w.rank)
"""


def test_64_channels_and_a_stalled_one(spmd):
    job = spmd(2, MANY).check()
    assert job.stdout.count("many ok") == 2


SLOW_READER = """
    import time, numpy as np, circuslink as cl
    from circuslink import channels
    from circuslink.spec import Link, element_type
    w = cl.init()
    mode = "{mode}"
    link = Link("tx", "rx", 1, 2, 0, 1, element_type("ulong"), 1)
    opts = {{"tx": {{"nslots": 4, "chunk": 256, "ll_max": {{"ll": 1 << 20, "bulk": 0}}[mode]}}}}
    ch = channels.open(w, [link], options=opts)
    rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
    data = rng.integers(0, 2**63, 3000, dtype=np.uint64)
    if w.rank == 0:
        t = time.monotonic()
        for k in range(0, 3000, 500):
            ch["tx"].write(data[k:k + 500])
        print("writer took", round(time.monotonic() - t, 3))
    else:
        got = []
        for k in range(60):
            time.sleep(0.002)     # a slow reader: the writer must wait, never overwrite
            got.append(ch["rx"].read(50))
        assert np.concatenate(got).tobytes() == data.tobytes()
    ch.close()
    w.close()
    print("slow ok", w.rank)
"""


@pytest.mark.parametrize("mode", ["ll", "bulk"])
def test_slow_reader_tiny_ring(spmd, mode):
    job = spmd(2, SLOW_READER.format(mode=mode)).check()
    assert job.stdout.count("slow ok") == 2


TIMEOUT = """
    import numpy as np, circuslink as cl
    from circuslink import channels, ChannelError
    from circuslink.spec import Link, element_type
    w = cl.init()
    links = [Link("quiet_out", "quiet_in", 5, 6, 0, 1, element_type("uint"), 8),
             Link("full_out", "full_in", 7, 8, 0, 1, element_type("uint"), 8)]
    ch = channels.open(w, links, timeout=0.5)
    if w.rank == 1:
        try:
            ch["quiet_in"].read(1)
        except ChannelError as e:
            print("ERR", e)
    else:
        ch["full_out"].write(np.arange(120, dtype=np.uint32))   # 4 packets: fills its 4-slot ring exactly
        try:
            ch["full_out"].write(np.arange(1, dtype=np.uint32))
        except ChannelError as e:
            print("ERR", e)
    w.barrier()
    ch.close()
    w.close()
"""


def test_timeouts_name_the_channel(spmd):
    job = spmd(2, TIMEOUT).check()
    assert "channel quiet_in (id 6, rank 1, receiver from rank 0): timed out after 0.5 s: waited for data" \
        in job.stdout
    assert "channel full_out (id 7, rank 0, sender to rank 1): timed out after 0.5 s: waited for credits" \
        in job.stdout


def test_open_errors_single_rank():
    import circuslink as cl
    from circuslink import channels
    from circuslink.spec import Link, element_type

    w = cl.init("cpu")
    link = Link("a", "b", 0, 1, 0, 0, element_type("uint"), 8)
    with pytest.raises(SpecError, match="rank 3 is outside"):
        channels.open(w, [Link("x", "y", 0, 1, 0, 3, element_type("uint"), 8)])
    with pytest.raises(ConfigError, match="options name channel 'zz'"):
        channels.open(w, [link], options={"zz": {"nslots": 4}})
    with pytest.raises(ConfigError, match="unknown option"):
        channels.open(w, [link], options={"a": {"speed": 1}})
    ch = channels.open(w, [link])
    with pytest.raises(ChannelError, match="no channel end called 'q'"):
        ch["q"]
    with pytest.raises(ChannelError, match="channel a: write.. got float64"):
        ch["a"].write(np.zeros(3))
    with pytest.raises(ChannelError, match="device_handle.. is for kernels"):
        ch["a"].device_handle()
    x = np.random.default_rng().integers(0, 2**32, 5, dtype=np.uint32)
    ch["a"].write(x.view(np.float32))  # same size: the bytes travel as they are
    assert ch["b"].read(5).tobytes() == x.tobytes()
    v = channels.open(w, [Link("v", "vi", 2, 3, 0, 0, element_type("uint4"), 8)])
    rows = np.random.default_rng().integers(0, 2**32, (6, 4), dtype=np.uint32)
    v["v"].write(rows)  # rows of 4 uints make up one uint4 element each
    back = v["vi"].read(6)
    assert back.dtype == element_type("uint4").numpy_dtype and back.tobytes() == rows.tobytes()
    with pytest.raises(ChannelError, match="channel v: write.. got uint32 elements"):
        v["v"].write(rows[:, :3])
    v.close()
    ch.close()
    with pytest.raises(ChannelError, match="closed"):
        ch["a"]


@pytest.mark.parametrize("nslots, chunk", [(1 << 24, 1 << 20), (1 << 12, 1 << 20)])
def test_rings_of_4_gib_or_more_are_refused(nslots, chunk):
    """The device computes slot offsets in 32 bits: a ring of 4 GiB or more would wrap them, so open refuses it."""
    with pytest.raises(ConfigError, match="4 GiB"):
        P.geometry(1, 1, nslots=nslots, chunk=chunk, name="big")
    fits = P.geometry(1, 1, nslots=1 << 11, chunk=1 << 20, name="fits")  # 2 GiB + 512 KiB
    assert fits.ring_bytes < P.MAX_RING_BYTES


def test_gpu_scoped_fences_only_when_every_rank_shares_one_gpu():
    """Bulk packets fence at .gpu scope only where every rank's memory is one GPU's (same host and PCI bus id);
    anything else (no GPU, two GPUs, one rank unknown) keeps the safe .sys scope."""
    from circuslink.channels import shares_one_gpu

    assert shares_one_gpu(["host:0000:19:00.0"] * 4)
    assert not shares_one_gpu(["host:0000:19:00.0", "host:0000:3b:00.0"])
    assert not shares_one_gpu(["a:0000:19:00.0", "b:0000:19:00.0"])  # same bus id on two hosts
    assert not shares_one_gpu([None, None])
    assert not shares_one_gpu([])
