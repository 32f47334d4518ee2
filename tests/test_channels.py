"""CIRCUS channels on the cpu back-end (the protocol's reference implementation).

Multi-rank properties run as 2 ranks through the spmd fixture; the byte-level protocol (test
vectors, packing) runs in one process against the endpoint classes directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from circuslink import ChannelError, ConfigError, SpecError
from circuslink.channels import protocol as P
from circuslink.channels.cpu import CpuReceiver, CpuSender

VECTORS = json.loads((Path(__file__).parent / "vectors" / "channel_rings.json").read_text())["vectors"]


def _pair(geo: P.RingGeometry, route: int = 0x0001_0007, timeout: float = 5.0):
    """A sender and a receiver sharing arrays in this process (credit, ring, slot credits)."""
    ring = np.zeros(geo.ring_bytes, dtype=np.uint8)
    credit = np.zeros(1, dtype="<u8")
    slots = np.zeros(geo.nslots, dtype="<u4")
    tx = CpuSender("tx", "channel tx", 7, geo, ring, credit, slots, np.zeros(4, "<u4"), timeout, route)
    rx = CpuReceiver("rx", "channel rx", 7, geo, ring, credit, slots, np.zeros(4, "<u4"), timeout, route)
    return tx, rx, ring, credit


@pytest.mark.parametrize("vec", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vectors_cpu(vec):
    geo = P.RingGeometry(P.MODES[vec["mode"]], vec["nslots"], vec["slot_bytes"], vec["payload"])
    tx, _, ring, credit = _pair(geo, P.route_of(vec["recv_id"], vec["dst_rank"]))
    credit[0] = 1 << 40  # the reader keeps up: the vectors cover wrap-around
    tx.seq = tx.credit_cache = vec["first_seq"]
    for data in vec["writes"]:
        tx.write_bytes(bytes.fromhex(data))
    assert tx.seq - vec["first_seq"] == vec["packets"]
    assert ring.tobytes().hex() == vec["ring"]


def test_vectors_roundtrip_cpu():
    """The vector streams read back exactly, with reads split differently from the writes."""
    import threading

    rng = np.random.default_rng()
    for vec in VECTORS:
        geo = P.RingGeometry(P.MODES[vec["mode"]], vec["nslots"], vec["slot_bytes"], vec["payload"])
        tx, rx, _, credit = _pair(geo)
        tx.seq = tx.credit_cache = rx.seq = credit[0] = vec["first_seq"]
        stream = b"".join(bytes.fromhex(d) for d in vec["writes"])
        writes = [bytes.fromhex(d) for d in vec["writes"]]
        writer = threading.Thread(target=lambda tx=tx, writes=writes: [tx.write_bytes(d) for d in writes])
        writer.start()
        got = bytearray()
        while len(got) < len(stream):
            got += rx.read_bytes(int(rng.integers(1, len(stream) - len(got) + 1)))
        writer.join()
        assert bytes(got) == stream, vec["name"]


@pytest.mark.parametrize("first_seq", [0, 6, (1 << 31) - 1, 1 << 31, (1 << 32) + 9])
def test_header_layout_by_hand(rng, first_seq):
    """One packet spelled out: header {route, flag, nbytes, flag}, then LL lines {lo, flag, hi, flag};
    lines past nbytes are written (zeros) only on the first lap after a multiple of 2^31."""
    geo = P.geometry(8, 8, mode="ll")  # 2 slots
    tx, _, ring, credit = _pair(geo, route=P.route_of(0x1234, 3))
    tx.seq = tx.credit_cache = credit[0] = first_seq
    payload = rng.integers(0, 256, 20, dtype=np.uint8).tobytes()
    tx.write_bytes(payload)
    flag = (first_seq & 0xFFFFFFFF) | 1
    slot = ring[(first_seq % 2) * 256:(first_seq % 2 + 1) * 256]
    words = slot.view("<u4")
    assert list(words[:4]) == [0x0003_1234, flag, 20, flag]
    rewrite = first_seq % (1 << 31) < geo.nslots
    nlines = 15 if rewrite else 3
    lines = words[4:4 + 4 * nlines].reshape(nlines, 4)
    assert (lines[:, 1] == flag).all() and (lines[:, 3] == flag).all()
    data = np.ascontiguousarray(lines[:, 0::2]).tobytes()
    assert data[:20] == payload and not any(data[20:])
    assert not slot[16 * (1 + nlines):].any()  # lines past nbytes are not written, except on a rewrite lap


def test_flags_are_never_zero_and_differ_from_the_previous_occupants():
    for nslots in (2, 4, 1024):
        for seq in (0, 1, nslots, (1 << 31) - 1, (1 << 32) - 1, 1 << 32, (1 << 33) + 5, (1 << 64) - 1):
            assert P.flag_of(seq) != 0
            for k in range(1, 8):
                if seq >= k * nslots:
                    assert P.flag_of(seq) != P.flag_of(seq - k * nslots)


def test_reader_ahead_of_the_writer_at_flag_wrap(rng):
    """At seq 2^32 - 1 the old flag (seq + 1) mod 2^32 was 0, which a zeroed ring already holds: a
    reader that polled before the writer stored read a packet of 0 bytes. It must wait."""
    import threading
    import time

    for mode in ("ll", "bw"):
        geo = P.geometry(64, 4, mode=mode, nslots=4, chunk=256 if mode == "bw" else None)
        tx, rx, ring, credit = _pair(geo)
        first = (1 << 32) - 1
        tx.seq = tx.credit_cache = rx.seq = credit[0] = first
        data = rng.integers(0, 256, 3 * geo.payload + 17, dtype=np.uint8).tobytes()

        def late_writer(tx=tx, data=data):
            time.sleep(0.05)
            tx.write_bytes(data)

        writer = threading.Thread(target=late_writer)
        writer.start()
        got = rx.read_bytes(len(data))
        writer.join()
        assert got == data, mode


def test_rewrite_lap_refreshes_every_line(rng):
    """Lines a short packet leaves alone keep the flag of the packet that last wrote them. A line last
    written 2^32 packets ago would carry the flag expected now; every slot's lines are therefore all
    rewritten on the first lap after each multiple of 2^31, so no line is ever that old."""
    geo = P.geometry(64, 1, mode="ll", nslots=4)
    tx, _, ring, credit = _pair(geo)
    start = (1 << 31) - 2 * geo.nslots
    tx.seq = tx.credit_cache = start
    credit[0] = 1 << 40
    for _ in range(2 * geo.nslots):  # two laps of 1-byte packets: one data line each
        tx.write_bytes(bytes([int(rng.integers(0, 256))]))
    words = ring.view("<u4").reshape(geo.nslots, 64)
    assert all((words[s, 4 + 4 * 2::4] != P.flag_of(start + geo.nslots + s)).all() for s in range(geo.nslots))
    for _ in range(geo.nslots):  # the rewrite lap
        tx.write_bytes(bytes([int(rng.integers(0, 256))]))
    for s in range(geo.nslots):
        flag = P.flag_of((1 << 31) + s)
        lines = words[s, 4:].reshape(15, 4)
        assert (lines[:, 1] == flag).all() and (lines[:, 3] == flag).all(), s
        assert not lines[1:, 0::2].any()  # zeros past the packet's one byte


def test_fresh_random_packing_matches_encoder():
    """CpuSender and the reference encoder agree for random geometries, element sizes and calls."""
    rng = np.random.default_rng()
    for _ in range(20):
        mode = str(rng.choice(["ll", "bw"]))
        elem = int(rng.choice([1, 2, 4, 8, 12, 16, 64]))
        chunk = int(rng.choice([16, 64, 256])) if mode == "bw" else None
        geo = P.geometry(1, elem, mode=mode, nslots=int(rng.choice([2, 4, 8])), chunk=chunk)
        tx, _, ring, credit = _pair(geo, route=P.route_of(int(rng.integers(0, 65536)), int(rng.integers(0, 16))))
        credit[0] = 1 << 40
        expect = np.zeros_like(ring)
        seq = 0
        for _ in range(int(rng.integers(1, 6))):
            data = rng.integers(0, 256, elem * int(rng.integers(1, 50)), dtype=np.uint8).tobytes()
            tx.write_bytes(data)
            sizes, pos, pieces = P.split_write(len(data), geo.payload), 0, []
            for s in sizes:
                pieces.append(data[pos:pos + s])
                pos += s
            seq = P.encode_packets(geo, tx.route, expect, seq, pieces)
        assert ring.tobytes() == expect.tobytes()


def test_elements_straddle_packets():
    """16-byte elements in 120-byte LL packets: 7.5 per packet, the eighth split across two."""
    geo = P.geometry(64, 16, mode="ll")
    tx, rx, ring, _ = _pair(geo)
    elems = np.random.default_rng().integers(0, 2**32, (16, 4), dtype=np.uint32)
    tx.write_bytes(elems.tobytes())
    assert tx.seq == 3  # 256 bytes: 120 + 120 + 16
    words = ring.view("<u4")
    assert [int(words[k * 64 + 2]) for k in range(3)] == [120, 120, 16]
    back = np.frombuffer(rx.read_bytes(256), dtype=np.uint32).reshape(16, 4)
    assert (back == elems).all()


def test_writer_never_overwrites_unread():
    geo = P.geometry(1, 8, mode="ll", nslots=2)
    tx, rx, _, _ = _pair(geo, timeout=0.3)
    data = np.random.default_rng().integers(0, 256, 240, dtype=np.uint8).tobytes()
    tx.write_bytes(data)  # two full packets fill the ring
    with pytest.raises(ChannelError, match=r"channel tx: timed out .* waited for credits"):
        tx.write_bytes(b"x")
    assert rx.read_bytes(240) == data  # nothing was overwritten


def test_geometry_errors():
    with pytest.raises(ConfigError, match="mode"):
        P.geometry(8, 8, mode="fast", name="c")
    with pytest.raises(ConfigError, match="power of two"):
        P.geometry(8, 8, nslots=3, name="c")
    with pytest.raises(ConfigError, match="multiple of 16"):
        P.geometry(8, 8, mode="bw", chunk=100, name="c")


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
        for mode in ("ll", "bw"):
            k = len(links)
            links.append(Link(f"{t.name}_{mode}_out", f"{t.name}_{mode}_in", 2 * k, 2 * k + 1, k % 2, 1 - k % 2,
                              t, 300))
    opts = {l.name: {"mode": l.name.split("_")[-2], **({"chunk": 256} if "_bw_" in l.name else {})} for l in links}
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
    opts = {{"tx": {{"mode": mode, "nslots": 4, **({{"chunk": 64}} if mode == "bw" else {{}})}}}}
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


@pytest.mark.parametrize("mode", ["ll", "bw"])
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
        ch["full_out"].write(np.arange(60, dtype=np.uint32))   # fills its 2-slot ring exactly
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
        channels.open(w, [link], options={"zz": {"mode": "ll"}})
    with pytest.raises(ConfigError, match="unknown option"):
        channels.open(w, [link], options={"a": {"speed": 1}})
    ch = channels.open(w, [link])
    with pytest.raises(ChannelError, match="no channel end called 'q'"):
        ch["q"]
    with pytest.raises(ChannelError, match="channel a: write.. got float64"):
        ch["a"].write(np.zeros(3))
    with pytest.raises(ConfigError, match="device_handle"):
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


def test_handle_and_state_layout_match_the_header(tmp_path):
    """protocol.HANDLE_DTYPE and the CTRL_* offsets agree with detail/channel_types.cuh (compiled as host C++)."""
    import shutil
    import subprocess

    from circuslink import include_dir

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    fields = P.HANDLE_DTYPE.names
    src = tmp_path / "layout.cpp"
    src.write_text(
        "#include <cstdio>\n#include <cstddef>\n#include <circuslink/channel.cuh>\n"
        "using H = circuslink::detail::ChannelHandle;\n"
        "using S = circuslink::detail::SendState;\nusing R = circuslink::detail::RecvState;\n"
        "int main() {\n"
        + "".join(f'  std::printf("{f} %zu %zu\\n", offsetof(H, {f}), sizeof(((H*)0)->{f}));\n' for f in fields)
        + '  std::printf("sizeof %zu\\n", sizeof(H));\n'
        + '  std::printf("send_state %zu departed %zu\\n", sizeof(S), offsetof(S, departed));\n'
        + '  std::printf("recv_state %zu offset %zu departed %zu returned %zu\\n", sizeof(R), offsetof(R, offset),'
          ' offsetof(R, departed), offsetof(R, returned));\n'
        + "  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cxx, "-std=c++17", f"-I{include_dir()}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    for line, name in zip(out, fields, strict=False):
        f, off, size = line.split()
        assert (f, int(off), int(size)) == (name, P.HANDLE_DTYPE.fields[name][1], P.HANDLE_DTYPE[name].itemsize)
    assert out[len(fields)] == f"sizeof {P.HANDLE_DTYPE.itemsize}"
    # the state structs fit between their control-block offsets
    assert out[len(fields) + 1] == "send_state 24 departed 16"
    assert P.CTRL_SEND_STATE + 24 <= P.CTRL_RECV_STATE
    assert out[len(fields) + 2] == "recv_state 24 offset 8 departed 12 returned 16"
    assert P.CTRL_RECV_STATE + 24 <= P.CTRL_SEND_ERROR and P.CTRL_SEND_ERROR + 16 <= P.CTRL_RECV_ERROR
    assert P.CTRL_RECV_ERROR + 16 <= P.CTRL_BYTES
