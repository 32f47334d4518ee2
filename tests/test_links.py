"""Engine links (issue 13): packet pipes between gateway ranks of different nodes over MPI.

In one process: the packet reader and writer write and read the channel format byte for byte as the
channel reference does. Under mpirun (2 declared nodes x 2 ranks, and 3 x 2): random packets of every
size and both kinds cross both ways at once, byte-exact and in order; a paused reader holds the writer
to exactly two rings of packets (its in ring and the writer's out ring) and nothing is lost; a reader that
never reads and an MPI call that fails end in one line naming MPI and both ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

from circuslink.channels import _cpu as ref
from circuslink.channels import protocol as P
from circuslink.links import PacketReader, PacketWriter, Ring

NODES_2X2 = {"CIRCUSLINK_RANKS_PER_NODE": "2"}


def _ring(geo: P.RingGeometry) -> tuple[np.ndarray, Ring]:
    lay = P.layout(0, geo)
    mem = np.zeros(lay.end, dtype=np.uint8)
    return mem, Ring(mem, lay, geo)


def test_packets_and_channel_ends_write_the_same_bytes(rng):
    """A packet writer given the packets a channel write call makes leaves the ring byte-identical to the
    channel reference's; the channel reader reads the packet writer's ring, the packet reader the channel's."""
    geo = P.geometry(1, 1, nslots=4, chunk=256, ll_max=300)
    mem_ch, ring_ch = _ring(geo)
    mem_pk, ring_pk = _ring(geo)
    route = P.route_of(7, 3)
    tx = ref.CpuSender("t", "test sender", 1, geo, ring_ch.ring, ring_ch.credit, ring_ch.slot_credits,
                       ring_ch.send_error, 5.0, route)
    rx_pk = PacketReader(ring_ch)
    writer = PacketWriter(ring_pk)
    rx_ch = ref.CpuReceiver("r", "test receiver", 1, geo, ring_pk.ring, ring_pk.credit, ring_pk.slot_credits,
                            ring_pk.recv_error, 5.0, 0)
    for size in [1, 5, 120, 121, 300, 301, 1000, 4, 256, 257, 99]:
        data = rng.bytes(size)
        bulk, sizes = P.split_write(size, geo)
        tx.write_bytes(data)
        at = 0
        for n in sizes:
            writer.put(route, data[at:at + n], bulk, 5.0, "packet writer")
            at += n
        assert np.array_equal(mem_ch, mem_pk)  # the same stores: identical rings, credits untouched
        got = b""
        for n in sizes:
            r, word, payload = rx_pk.get(5.0, "packet reader")
            assert r == route and (word & P.KIND_BULK != 0) == bulk and word & 0xFFFFFF == n
            got += payload
        assert got == data
        assert rx_ch.read_bytes(size) == data
        ring_ch.credit[0] = rx_pk.seq  # the packet reader gave the slots back; mirror the channel's credits
    assert writer.seq == tx.seq == rx_pk.seq


def test_packet_reader_waits_for_every_unit_of_a_low_latency_packet():
    geo = P.geometry(1, 1, nslots=2, chunk=256)
    _, ring = _ring(geo)
    writer, reader = PacketWriter(ring), PacketReader(ring)
    writer.put(5, bytes(range(100)), False, 5.0, "w")
    head = ring.head(0)
    ring.words[head + 5 + 2 * 20] = 0  # unit 22's flag not there yet: the packet is not complete
    assert not reader.poll()
    ring.words[head + 5 + 2 * 20] = P.flag_of(0)
    assert reader.poll() and reader.get(5.0, "r")[2] == bytes(range(100))


# ---- under mpirun -----------------------------------------------------------------------------------

CROSS = """
import os, threading, numpy as np, circuslink as cl
from circuslink import links, topology
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
t = topology.nodes(w.nodes)                      # full inside each node, gateways = local rank 0
eng = links.open_engine(w, t, nslots=NSLOTS, chunk=1024, batch=BATCH)
gateways = [n[0] for n in w.nodes]
assert sorted(eng.peers) == ([g for g in gateways if g != w.rank] if w.rank in gateways else [])

def packets(src, dst):
    rng = np.random.default_rng([seed, src, dst])
    out = []
    for i in range(COUNT):
        bulk = bool(rng.integers(2))
        n = int(rng.integers(1, 1025 if bulk else 121))
        out.append((int(rng.integers(0, 2**32)), rng.bytes(n), bulk))
    return out

errors = []
def run(link):
    try:
        sent, want = packets(w.rank, link.peer), packets(link.peer, w.rank)
        reader = link.reader()
        got = []
        def take():
            for _ in want:
                got.append(reader.get())
        th = threading.Thread(target=take)
        th.start()
        writer = link.writer()
        for route, data, bulk in sent:
            writer.put(route, data, bulk)
        th.join()
        assert len(got) == len(want)
        for i, ((route, data, bulk), (r, word, d)) in enumerate(zip(want, got)):
            assert (r, d, bool(word & 0x80000000)) == (route, data, bulk), f"packet {i} from {link.peer}"
    except BaseException as exc:
        errors.append(exc)

threads = [threading.Thread(target=run, args=(eng[p],)) for p in eng.peers]
for th in threads: th.start()
for th in threads: th.join()
if errors: raise errors[0]
eng.close()
say("crossed", w.rank, len(eng.peers))
w.close()
"""


@pytest.mark.mpi
@pytest.mark.parametrize("nranks,nslots,batch", [(4, 4, 1), (4, 16, 4), (6, 8, 8)])
def test_random_packets_cross_both_ways_byte_exact(spmd, nranks, nslots, batch):
    code = CROSS.replace("NSLOTS", str(nslots)).replace("BATCH", str(batch)).replace("COUNT", "300")
    job = spmd(nranks, code, launcher="mpirun", env=NODES_2X2, timeout=150).check()
    gateways = list(range(0, nranks, 2))
    for g in gateways:
        assert f"crossed {g} {len(gateways) - 1}" in job.stdout, job.output
    for r in range(1, nranks, 2):
        assert f"crossed {r} 0" in job.stdout


BACK_PRESSURE = """
import os, threading, time, numpy as np, circuslink as cl
from circuslink import links
from circuslink._wait import wait_until
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
N = 8
eng = links.open_engine(w, [(0, 2)], nslots=N, chunk=512, batch=2)
rng = np.random.default_rng(seed)
pk = [(i, rng.bytes(int(rng.integers(1, 513)))) for i in range(5 * N)]
if w.rank == 0:
    link, done = eng[2], [0]
    def write():
        wr = link.writer()
        for route, data in pk:
            wr.put(route, data)
            done[0] += 1
    th = threading.Thread(target=write)
    th.start()
    # the reader is paused: the in ring (N) and the out ring (N) fill, and the writer stops there
    wait_until(lambda: done[0] >= 2 * N, 30, "the writer filling both rings")
    time.sleep(0.5)
    assert done[0] == 2 * N, done[0]
    w.barrier()
    th.join()
    say("writer held at", 2 * N)
elif w.rank == 2:
    link = eng[0]
    rd = link.reader()
    w.barrier()
    # exactly the in ring's N packets arrived while the reader was paused
    assert all(rd._r.poll(s) for s in range(N)) and not rd._r.poll(N)
    for i, (route, data) in enumerate(pk):
        if i % 7 == 0:
            time.sleep(0.01)                       # a slow consumer
        r, word, d = rd.get()
        assert (r, d) == (route, data), i
    say("reader got", len(pk))
else:
    w.barrier()
eng.close()
w.close()
"""


@pytest.mark.mpi
def test_slow_reader_holds_the_writer_and_loses_nothing(spmd):
    job = spmd(4, BACK_PRESSURE, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    assert "writer held at 16" in job.stdout and "reader got 40" in job.stdout


STREAMS = """
import os, numpy as np, circuslink as cl
from circuslink import links
from circuslink.channels import protocol as P
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
eng = links.open_engine(w, [(1, 3)], nslots=8, chunk=256, ll_max=200)
rng = np.random.default_rng(seed)
sizes = [1, 119, 120, 121, 200, 201, 1000, 3000, 7]
data = [rng.bytes(n) for n in sizes]
if w.rank in (1, 3):
    link = eng[4 - w.rank]
    if w.rank == 1:
        tx = link.stream_sender(P.route_of(9, 3))
        for d in data:
            tx.write_bytes(d)                      # low-latency up to 200 bytes, bulk above
        say("sent")
    else:
        rx = link.stream_receiver()
        for d in data:
            assert rx.read_bytes(len(d)) == d
        say("stream ok")
eng.close()
w.close()
"""


@pytest.mark.mpi
def test_channel_stream_ends_on_the_rings(spmd):
    job = spmd(4, STREAMS, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    assert "stream ok" in job.stdout


STALL = """
import os, circuslink as cl
from circuslink import links
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
eng = links.open_engine(w, [(0, 2)], nslots=4, chunk=256, timeout=2)
if w.rank == 0:
    wr = eng[2].writer()
    try:
        for i in range(100):
            wr.put(i, b"x" * 10)                     # rank 2 never reads
    except cl.EngineError as exc:
        say("ERROR", exc)
w.barrier()
eng.release_local()
w.close()
"""


@pytest.mark.mpi
def test_a_reader_that_never_reads_times_out_naming_mpi_and_both_ranks(spmd):
    job = spmd(4, STALL, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    line = next(x for x in job.stdout.splitlines() if x.startswith("ERROR"))
    assert line == ("ERROR engine link (MPI) rank 0 <-> rank 2: rank 2's in ring stayed full for 2 s (its agent "
                    "stopped taking packets; packet 4 waits to cross)"), line


MPI_FAILS = """
import os, circuslink as cl
from mpi4py import MPI
from circuslink import links
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
eng = links.open_engine(w, [(0, 2)], nslots=4, chunk=256)

class Faulty:                                      # the engine's MPI fails on the third send
    def __init__(self, comm):
        self.comm, self.sends = comm, 0
    def Isend(self, *args):
        self.sends += 1
        if self.sends == 3:
            raise MPI.Exception(MPI.ERR_TRUNCATE)
        return self.comm.Isend(*args)
    def __getattr__(self, name):
        return getattr(self.comm, name)

if w.rank == 0:
    eng._proxy.comm = Faulty(eng._proxy.comm)
    wr, rd = eng[2].writer(), eng[2].reader()
    try:
        for i in range(50):
            wr.put(i, b"y" * 200)
        rd.get()
    except cl.EngineError as exc:
        say("ERROR", exc)
    try:
        eng[2].stream_sender(0).write_bytes(b"z")  # every later call says so at once
    except cl.EngineError as exc:
        say("AGAIN", exc)
    say("agent record", int(eng[2].out_ring.send_error[0]))
w.barrier()
eng.release_local()
w.close()
"""


@pytest.mark.mpi
def test_an_mpi_error_is_one_line_naming_mpi_and_both_ranks(spmd):
    job = spmd(4, MPI_FAILS, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    want = ("engine link (MPI) rank 0 <-> rank 2: MPI error in sending packets 1..1 to rank 2: MPI_ERR_TRUNCATE: "
            "message truncated (error class 15)")
    assert f"ERROR {want}" in job.stdout and f"AGAIN {want}" in job.stdout, job.output
    assert f"agent record {P.ERR_ABORTED}" in job.stdout  # device agents stop waiting too


OPEN_ERRORS = """
import os, circuslink as cl
from circuslink import links
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
for args, kwargs in [(([(0, 1)],), {}), (([(0, 0)],), {}), (([(0, 9)],), {}), ((["x"],), {}),
                     (([(0, 2)],), {"batch": 0}), (([(0, 2)],), {"nslots": 3})]:
    try:
        links.open_engine(w, *args, **kwargs)
    except cl.ConfigError as exc:
        say("REFUSED", exc)
try:
    links.open_engine(w, [(0, 2)] if w.rank else [(0, 3)])
except cl.ConfigError as exc:
    say("DIFFER", exc)
w.close()
"""


@pytest.mark.mpi
def test_bad_engine_links_are_refused_in_one_line(spmd):
    job = spmd(4, OPEN_ERRORS, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    out = job.stdout
    assert "REFUSED engine links: ranks 0 and 1 are both in node 0: the engine joins nodes" in out
    assert "REFUSED engine links: a link joins two ranks, got (0, 0)" in out
    assert "REFUSED engine links: rank 9 is not a rank of this world of 4" in out
    assert "REFUSED engine links: 'x' is not an (a, b) pair of ranks" in out
    assert "REFUSED engine links: batch 0 must be a number of packets in 1..nslots (64)" in out
    assert "REFUSED engine links: nslots 3 must be a power of two" in out
    assert "DIFFER open_engine is collective and needs the same links and ring shape on every rank" in out


def test_engine_links_need_mpirun(spmd):
    job = spmd(4, """
        import circuslink as cl
        from circuslink import links
        w = cl.init()
        try:
            links.open_engine(w, [(0, 2)])
        except cl.ConfigError as exc:
            print("REFUSED", exc)
        w.close()
    """, env=NODES_2X2).check()
    assert ("REFUSED engine links need MPI between the nodes: start the job with mpirun (this job was started by "
            "circuslink run, whose ranks share no MPI communicator)") in job.stdout


# ---- on the GPU (run on the device machine: ranks share its GPU under MPS) ------------------------

@pytest.mark.gpu
@pytest.mark.mpi
def test_packets_cross_on_pinned_rings_gpu(spmd):
    """The cuda engine: rings in pinned, mapped host memory; host agents, every byte checked."""
    code = CROSS.replace("NSLOTS", "8").replace("BATCH", "2").replace("COUNT", "200")
    job = spmd(4, code, backend="cuda", launcher="mpirun", env=NODES_2X2, timeout=240).check()
    assert "crossed 0 1" in job.stdout and "crossed 2 1" in job.stdout


DEVICE_AGENTS = """
import os, numpy as np, cupy as cp, circuslink as cl
from circuslink import links
from circuslink.bench.pingpong import GRID_THREADS, KERNELS
from circuslink.channels import protocol as P
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())
w = cl.init()
eng = links.open_engine(w, [(0, 2)], nslots=16, chunk=64 << 10, timeout=20)
if w.rank in (0, 2):
    role, link = (0, eng[2]) if w.rank == 0 else (1, eng[0])
    mod = cl.compile(KERNELS.read_text())
    most = w.backend.max_blocks(mod.get_function("pingpong_grid"), GRID_THREADS)
    tx, rx = link.sender_handle(P.route_of(0, 2 - w.rank)), link.receiver_handle()
    stream = w.backend.stream
    for n, form in [(8, "warp"), (120, "warp"), (4096, "warp"), (1 << 20, "warp"), (3 << 20, "warp2"),
                    (1 << 20, "grid")]:
        with stream:
            status = cp.ones(1, dtype=cp.int32)
            times = cp.zeros(2, dtype=cp.uint64)
            src = cp.random.RandomState(n).randint(0, 256, n, dtype=cp.uint8)
            dst = cp.zeros(n, dtype=cp.uint8)
            args = (tx, rx, src, dst, np.uint64(n), np.int32(role), np.int32(2), np.int32(20))
            if form == "grid":
                blocks = max(1, min(most, 4))
                mod.get_function("pingpong_grid")((blocks,), (GRID_THREADS,), args + (
                    cp.zeros(2, dtype=cp.uint32), np.uint64(20 * 10**9), times, status))
            else:
                mod.get_function("pingpong_" + form)((1,), (64 if form == "warp2" else 32,), args + (times, status))
        w.backend.wait_stream(stream, 60, lambda: f"device agents {form} {n} on rank {w.rank}")
        link.device_error()
        assert int(status.get()[0]) == 1, (form, n)
        if role == 0:
            assert bool(cp.array_equal(src, dst).get()), (form, n)
            t0, t1 = (int(v) for v in times.get())
            say("OK", form, n, f"{(t1 - t0) / 40 / 1e3:.2f} us one-way")
w.barrier()
eng.close()
w.close()
"""


@pytest.mark.gpu
@pytest.mark.mpi
def test_device_agents_pingpong_through_the_engine_gpu(spmd):
    """Kernels on the two gateways use the rings' channel handles as any channel end (one warp; separate
    writing and reading warps for a message larger than a ring; a co-resident grid); every byte checked."""
    job = spmd(4, DEVICE_AGENTS, backend="cuda", launcher="mpirun", env=NODES_2X2, timeout=300).check()
    for form, n in [("warp", 8), ("warp", 120), ("warp", 4096), ("warp", 1 << 20), ("warp2", 3 << 20),
                    ("grid", 1 << 20)]:
        assert f"OK {form} {n} " in job.stdout, job.output
