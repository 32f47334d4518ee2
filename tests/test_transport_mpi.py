"""The mpi transport: its compiled progress thread moves relay packets and connection puts over MPI.

Under mpirun (2 declared nodes x 2 ranks, and 3 x 2): random packets of every size and both kinds cross both
ways at once through relays, byte-exact and in order; a paused reader holds the writer to exactly two rings of
packets (its in ring and the writer's out ring) and nothing is lost; channel ends on a relay's rings; a reader
that never reads and an MPI call that fails end in one line naming the link, both ranks and the transport;
connections put, put-with-signal, signal, wait and flush byte-exact; the progress thread is built once and cached.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from circuslink import BackendError
from circuslink.channels import protocol as P
from circuslink.transport import Context, _build
from circuslink.transport import mpi as tmpi

NODES_2X2 = {"CIRCUSLINK_RANKS_PER_NODE": "2", "CIRCUSLINK_TRANSPORT": "mpi"}


# ---- under mpirun -----------------------------------------------------------------------------------

CROSS = """
import os, threading, numpy as np, circuslink as cl
from circuslink import transport
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
gateways = [n[0] for n in w.nodes]              # local rank 0 of each node, every pair of them joined
eng = transport.open_relays(w, [(a, b) for a in gateways for b in gateways if a < b], nslots=NSLOTS, chunk=1024,
                            batch=BATCH)
assert sorted(eng.peers) == ([g for g in gateways if g != w.rank] if w.rank in gateways else [])
assert set(eng.transports().values()) <= {"mpi"}

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
from circuslink import transport
from circuslink._wait import wait_until
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
N = 8
eng = transport.open_relays(w, [(0, 2)], nslots=N, chunk=512, batch=2)
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
from circuslink import transport
from circuslink.channels import _cpu as ref, protocol as P
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
eng = transport.open_relays(w, [(1, 3)], nslots=8, chunk=256, ll_max=200)
rng = np.random.default_rng(seed)
sizes = [1, 119, 120, 121, 200, 201, 1000, 3000, 7]
data = [rng.bytes(n) for n in sizes]
if w.rank in (1, 3):
    link = eng[4 - w.rank]
    o, i = link.out_ring, link.in_ring   # the channel reference's ends on the relay's rings
    if w.rank == 1:
        tx = ref.CpuSender("tx", "out ring", 0, o.geometry, o.ring, o.credit, o.slot_credits, o.send_error, 30.0,
                           P.route_of(9, 3))
        for d in data:
            tx.write_bytes(d)                      # low-latency up to 200 bytes, bulk above
        say("sent")
    else:
        rx = ref.CpuReceiver("rx", "in ring", 0, i.geometry, i.ring, i.credit, i.slot_credits, i.recv_error, 30.0, 0)
        for d in data:
            assert rx.read_bytes(len(d)) == d
        say("stream ok")
eng.close()
w.close()
"""


@pytest.mark.mpi
def test_channel_ends_on_the_rings(spmd):
    """The channel reference's ends write the out ring and read the in ring: low-latency and bulk packets
    cross byte for byte (a relay carries the channel format unchanged)."""
    job = spmd(4, STREAMS, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    assert "stream ok" in job.stdout


GRID_AGENT = """
import os, sys, numpy as np, circuslink as cl
from circuslink import transport
from circuslink._wait import wait_until
from circuslink.channels import protocol as P
from circuslink.transport._rings import PacketReader
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
REGISTER
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
N, M = 8, 6  # ring slots; packets of one grid call (its warps take them in any order)
eng = transport.open_relays(w, [(0, 2)], nslots=N, chunk=512, batch=2, timeout=10)
rng = np.random.default_rng(seed)
pk = [(i, rng.bytes(int(rng.integers(1, 513)))) for i in range(8 * M)]  # 48 packets: six rings' worth
if w.rank == 0:
    wr = eng[2].writer()
    for route, data in pk:
        wr.put(route, data)
    say("sent", len(pk))
elif w.rank == 2:
    ring = eng[0].in_ring
    rd = PacketReader(ring)  # reads only: the credits are given back below, as a grid session does
    order = np.random.default_rng(seed + 1)
    for base in range(0, len(pk), M):
        for seq in (base + order.permutation(M)).tolist():  # the warps of the call, in any order
            wait_until(lambda: rd.poll(seq), 20, f"packet {seq} in rank 2's in ring")
            route, word = rd.header(seq)
            assert (route, rd.payload(seq)) == pk[seq], seq
            ring.slot_credits[seq % N] = P.flag_of(seq)  # grid_recv_packet: this packet's slot credit, at once
    ring.credit[0] = len(pk)  # the session's close: the in-order counter, only now
    say("grid agent got", len(pk))
w.barrier()
eng.close()
w.close()
"""


@pytest.mark.parametrize("transport_name", [pytest.param("mpi", marks=pytest.mark.mpi), "fake"])
def test_a_grid_agent_that_gives_back_slot_credits_only_keeps_packets_crossing(spmd, transport_name):
    """A grid session reads a relay's in ring as it reads any ring: its warps store each packet's slot credit as they
    take it, in any order, and the in-order counter only at close. The transport counts those slot credits as room
    (the counter alone left rank 0's relay waiting for room after one ring: the GPU's grid pingpong through an mpi
    relay stalled at its second message, "packet 1490 waits to cross"). Over the mpi transport's compiled relay, and
    the generic relay (the tests' fake transport)."""
    register = ""
    if transport_name == "fake":
        register = (f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\nfrom fake_transport import "
                    "FakeTransport\ntransport.register('fake', FakeTransport)")
    code = GRID_AGENT.replace("REGISTER", register)
    env = dict(NODES_2X2, CIRCUSLINK_TRANSPORT=transport_name)
    job = spmd(4, code, launcher="mpirun" if transport_name == "mpi" else "circuslink", env=env, timeout=120).check()
    assert "sent 48" in job.stdout and "grid agent got 48" in job.stdout, job.output


STALL = """
import os, circuslink as cl
from circuslink import transport
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
eng = transport.open_relays(w, [(0, 2)], nslots=4, chunk=256, timeout=2)
if w.rank == 0:
    wr = eng[2].writer()
    try:
        for i in range(100):
            wr.put(i, b"x" * 10)                     # rank 2 never reads
    except cl.TransportError as exc:
        say("ERROR", exc)
w.barrier()
eng.release_local()
w.close()
"""


@pytest.mark.mpi
def test_a_reader_that_never_reads_times_out_naming_the_link_and_the_transport(spmd):
    job = spmd(4, STALL, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    line = next(x for x in job.stdout.splitlines() if x.startswith("ERROR"))
    assert line == ("ERROR link rank 0 <-> rank 2 (transport mpi): rank 2's in ring stayed full for 2 s (its agent "
                    "stopped taking packets; packet 4 waits to cross)"), line


MPI_FAILS = """
import os, circuslink as cl
from mpi4py import MPI
from circuslink import transport
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
eng = transport.open_relays(w, [(0, 2)], nslots=4, chunk=256)
if w.rank == 0:
    eng[2]._group._inject_fault(3, MPI.ERR_TRUNCATE)  # the progress thread's third MPI send fails
    wr, rd = eng[2].writer(), eng[2].reader()
    try:
        for i in range(50):
            wr.put(i, b"y" * 200)
        rd.get()
    except cl.TransportError as exc:
        say("ERROR", exc)
    try:
        eng[2].writer().put(0, b"z")  # every later call says so at once
    except cl.TransportError as exc:
        say("AGAIN", exc)
    say("agent record", int(eng[2].out_ring.send_error[0]))
w.barrier()
eng.release_local()
w.close()
"""


@pytest.mark.mpi
def test_an_mpi_error_is_one_line_naming_the_link_and_the_transport(spmd):
    job = spmd(4, MPI_FAILS, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    want = ("link rank 0 <-> rank 2 (transport mpi): MPI error in sending packets 1..1 to rank 2: MPI_ERR_TRUNCATE: "
            "message truncated (error class 15)")
    assert f"ERROR {want}" in job.stdout and f"AGAIN {want}" in job.stdout, job.output
    assert f"agent record {P.ERR_ABORTED}" in job.stdout  # device agents stop waiting too


OPEN_ERRORS = """
import os, circuslink as cl
from circuslink import transport
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
for args, kwargs in [(([(0, 1)],), {}), (([(0, 0)],), {}), (([(0, 9)],), {}), ((["x"],), {}),
                     (([(0, 2)],), {"batch": 0}), (([(0, 2)],), {"nslots": 3}), (([(0, 2)],), {"transport": "ucx"}),
                     (([(0, 2)],), {"transport": "ipc"})]:
    try:
        transport.open_relays(w, *args, **kwargs)
    except cl.ConfigError as exc:
        say("REFUSED", exc)
try:
    transport.open_relays(w, [(0, 2)] if w.rank else [(0, 3)])
except cl.ConfigError as exc:
    say("DIFFER", exc)
w.close()
"""


@pytest.mark.mpi
def test_bad_relays_are_refused_in_one_line(spmd):
    job = spmd(4, OPEN_ERRORS, launcher="mpirun", env=NODES_2X2, timeout=120).check()
    out = job.stdout
    assert "REFUSED relays: ranks 0 and 1 are both in node 0: relays join nodes" in out
    assert "REFUSED relays: a relay joins two ranks, got (0, 0)" in out
    assert "REFUSED relays: rank 9 is not a rank of this world of 4" in out
    assert "REFUSED relays: 'x' is not an (a, b) pair of ranks" in out
    assert "REFUSED relays: batch 0 must be a number of packets in 1..nslots (64)" in out
    assert "REFUSED relays: nslots 3 must be a power of two" in out
    assert "REFUSED unknown transport 'ucx': choose one of ipc, mpi, nvshmem" in out
    assert ("REFUSED relays: rank 0 <-> rank 2: transport ipc cannot be used: it joins ranks up to the same node, and "
            "this pair is joined by the network") in out
    assert "DIFFER open_relays is collective and needs the same pairs and ring shape on every rank" in out


def test_relays_need_a_transport_between_nodes(spmd):
    """Under circuslink run (no MPI between the ranks) on the cpu back-end nothing joins nodes: one line per
    transport saying why."""
    job = spmd(4, """
        import circuslink as cl
        from circuslink import transport
        w = cl.init()
        try:
            transport.open_relays(w, [(0, 2)])
        except cl.ConfigError as exc:
            print("REFUSED", exc)
        w.close()
    """, env={"CIRCUSLINK_RANKS_PER_NODE": "2"}).check()
    assert ("REFUSED relays: rank 0 <-> rank 2: no transport joins ranks across the network in this job (mpi: it "
            "needs a job started by mpirun (MPI between the ranks); nvshmem: it needs a back-end that runs kernels "
            "(GPUs))") in job.stdout


CONNECT = """
import os, numpy as np, circuslink as cl
from circuslink import transport
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
peers = [p for p in range(w.size) if p != w.rank]          # everyone to everyone: inside nodes and across
group = transport.connect(w, peers, nbytes=1 << 16, nsignals=4, transport="mpi")
def data(src, dst, k):
    g = np.random.default_rng([seed, src, dst, k])
    return g.integers(0, 256, int(g.integers(1, 20000)), dtype=np.uint8)
for k in range(5):                                       # 5 rounds: put, put-with-signal, then the peer reads
    for p in peers:
        conn = group[p]
        d = data(w.rank, p, k)
        half = len(d) // 2
        conn.put(0, d[:half])                            # no signal: ordered before the next signal anyway
        conn.put_with_signal(half, d[half:], 1, k + 1)
    for p in peers:
        conn = group[p]
        assert conn.wait(1, k + 1) == k + 1
        want = data(p, w.rank, k)
        assert bytes(conn.inbox()[:len(want)]) == want.tobytes(), (p, k)
    w.barrier()                                          # everyone has read round k before round k + 1 lands
for p in peers:
    group[p].signal(3, 1000 + w.rank)
    group[p].flush()
for p in peers:
    assert group[p].wait(3, 1000 + p) == 1000 + p
    assert group[p].capabilities.proxied and group[p].transport.name == "mpi"
try:
    group[peers[0]].put(1 << 16, b"x")
except cl.ConfigError as exc:
    say("RANGE", exc)
group.close()
say("connections ok", w.rank)
w.close()
"""


@pytest.mark.mpi
def test_connections_put_signal_wait_flush_byte_exact(spmd):
    """4 ranks in 2 declared nodes, every rank connected to every other over mpi: 5 rounds of random-sized puts
    (a plain put, then a put-with-signal) land byte-exact once the signal is seen; signals and flush; a put past
    the inbox is one line."""
    job = spmd(4, CONNECT, launcher="mpirun", env=NODES_2X2, timeout=150).check()
    assert job.stdout.count("connections ok") == 4, job.output
    assert ("RANGE link rank 0 <-> rank 1 (transport mpi): a put of 1 bytes at offset 65536 does not fit the peer's "
            "inbox of 65536 bytes") in job.stdout


def test_the_progress_thread_is_built_once_and_cached(tmp_path, monkeypatch):
    """The progress thread is compiled on first use into the user's cache folder, named by the hash of its source and
    command; a second build finds it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = _build.build_cached("transport", "libcircuslink_mpi", tmpi.SOURCE, tmpi._command)
    assert first.parent == tmp_path / "circuslink" / "transport" and first.name.startswith("libcircuslink_mpi-")
    stamp = first.stat().st_mtime_ns
    assert _build.build_cached("transport", "libcircuslink_mpi", tmpi.SOURCE, tmpi._command) == first
    assert first.stat().st_mtime_ns == stamp


def test_no_compiler_is_one_line(monkeypatch):
    """Without any C++ compiler the mpi transport says so in one line, as the reason it cannot run."""
    monkeypatch.setattr(_build.shutil, "which", lambda name, path=None: None)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(BackendError, match=r"^no C\+\+ compiler to build against MPI \(looked for mpicxx"):
        _build.find_mpi_cxx()
    why = tmpi.MpiTransport.unavailable(Context(runs_kernels=False, under_mpi=True))
    assert why.startswith("its progress thread cannot be built: no C++ compiler") and "\n" not in why
    assert tmpi.MpiTransport.unavailable(Context(runs_kernels=False, under_mpi=False)) == \
        "it needs a job started by mpirun (MPI between the ranks)"


# ---- on the GPU (run on the device machine: ranks share its GPU under MPS) ------------------------

@pytest.mark.gpu
@pytest.mark.mpi
def test_packets_cross_on_pinned_rings_gpu(spmd):
    """On cuda: rings in pinned, mapped host memory; host agents, every byte checked."""
    code = CROSS.replace("NSLOTS", "8").replace("BATCH", "2").replace("COUNT", "200")
    job = spmd(4, code, backend="cuda", launcher="mpirun", env=NODES_2X2, timeout=240).check()
    assert "crossed 0 1" in job.stdout and "crossed 2 1" in job.stdout


DEVICE_AGENTS = """
import os, numpy as np, cupy as cp, circuslink as cl
from circuslink import transport
from circuslink.bench.pingpong import GRID_THREADS, KERNELS
from circuslink.channels import protocol as P
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())
LINK_TIMEOUT = 20  # every device wait on the relay's rings, and the progress threads' waits
w = cl.init()
eng = transport.open_relays(w, [(0, 2)], nslots=16, chunk=64 << 10, timeout=LINK_TIMEOUT, transport="mpi")
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
            times = cp.zeros(3, dtype=cp.uint64)  # the warp forms also store their SM cycles in times[2]
            src = cp.random.RandomState(n).randint(0, 256, n, dtype=cp.uint8)
            dst = cp.zeros(n, dtype=cp.uint8)
            args = (tx, rx, src, dst, np.uint64(n), np.int32(role), np.int32(2), np.int32(20))
            if form == "grid":
                blocks = max(1, min(most, 4))
                mod.get_function("pingpong_grid")((blocks,), (GRID_THREADS,), args + (
                    cp.zeros(2, dtype=cp.uint32), np.uint64(LINK_TIMEOUT * 10**9), times, status))
            else:
                mod.get_function("pingpong_" + form)((1,), (64 if form == "warp2" else 32,), args + (times, status))
        # Longer than the device waits, so that a stalled ring ends the kernel with its own error, raised naming
        # the link, before the host gives up (and then the host's time-out names the link as well).
        try:
            w.backend.wait_stream(stream, 2 * LINK_TIMEOUT + 5,
                                  lambda: f"device agents {form} {n} on rank {w.rank} ({link.describe()})")
        finally:
            link.device_error()
        assert int(status.get()[0]) == 1, (form, n)
        if role == 0:
            assert bool(cp.array_equal(src, dst).get()), (form, n)
            t0, t1 = (int(v) for v in times.get()[:2])
            say("OK", form, n, f"{(t1 - t0) / 40 / 1e3:.2f} us one-way")
# Ranks 1 and 3 wait here while 0 and 2 compile and measure (seconds when healthy): longer than a stalled ring
# takes to end rank 0's or 2's kernel with an error naming the link, which must be the failure reported.
w.barrier(timeout=120)
eng.close()
w.close()
"""


@pytest.mark.gpu
@pytest.mark.mpi
def test_device_agents_pingpong_through_an_mpi_relay_gpu(spmd):
    """Kernels on the two gateways use the rings' channel handles as any channel end (one warp; separate
    writing and reading warps for a message larger than a ring; a co-resident grid); every byte checked."""
    job = spmd(4, DEVICE_AGENTS, backend="cuda", launcher="mpirun", env=NODES_2X2, timeout=300).check()
    for form, n in [("warp", 8), ("warp", 120), ("warp", 4096), ("warp", 1 << 20), ("warp2", 3 << 20),
                    ("grid", 1 << 20)]:
        assert f"OK {form} {n} " in job.stdout, job.output
