"""Gateway-routed channels as jobs: routed channels that cross declared nodes through the gateways and a real
relay (the mpi transport's compiled progress thread), on the cpu back-end, started by mpirun and by
``circuslink run --ranks-per-node K`` (which starts the job by mpirun when mpirun and mpi4py are installed).

Each job: seeded random sizes, every byte checked; the slow reader; the stalled receiver that holds back only
its own channel; the refusal, in one line, where no mpirun starts the job. The same decisions in one process
with stand-in proxies are tests/test_gateway.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from circuslink import launcher

NODES_2 = {"CIRCUSLINK_RANKS_PER_NODE": "2"}

ALL_TO_ALL = """
import os, threading, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
n, seed = w.size, int(os.environ["CIRCUSLINK_TEST_SEED"])
assert len(w.nodes) == n // 2, w.describe_nodes()
byte, u4 = element_type("uchar"), element_type("uint4")
pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
links = [Link(f"c{a}_{b}", f"c{a}_{b}_in", 2 * k, 2 * k + 1, a, b, u4 if k % 2 else byte, 512)
         for k, (a, b) in enumerate(pairs)]
ch = channels.open(w, links, topology=f"nodes:{n // 2}x2", link_slots=2, relay={"nslots": 4, "batch": 2})
assert ch._buf.mapped == w.nodes[w.node], ch._buf.mapped          # no memory mapped across nodes
gateways = [node[0] for node in w.nodes]
assert (ch.relays.peers if ch.relays else []) == ([g for g in gateways if g != w.rank] if w.rank in gateways else [])
assert set(ch.relays.transports().values() if ch.relays else []) <= {"mpi"}
def data(link, i):
    g = np.random.default_rng([seed, link.send_id, i])
    return g.integers(0, 256, int(g.integers(1, 1500)) * link.element.nbytes, dtype=np.uint8)
mine = [l for l in links if l.src_rank == w.rank]
errors = []
def send():
    try:
        for i in range(COUNT):
            for l in mine:
                ch[l.name].write(data(l, i).view(l.element.numpy_dtype))
    except Exception as exc:
        errors.append(exc)
th = threading.Thread(target=send)
th.start()
for i in range(COUNT):
    for l in links:
        if l.dst_rank == w.rank:
            want = data(l, i)
            got = ch[l.receiver_name].read(want.size // l.element.nbytes)
            assert np.asarray(got).tobytes() == want.tobytes(), (l.name, i)
th.join()
if errors:
    raise errors[0]
crossing = sum(1 for l in links if w.node_of(l.src_rank) != w.node_of(l.dst_rank) and ch.route(l.name))
ch.close()
say("routed ok", w.rank, crossing, w.launched_by)
w.close()
"""


def _circuslink_run(tmp_path, seed: int, n: int, code: str, *run_args: str, env: dict | None = None,
                    timeout: float = 120) -> subprocess.CompletedProcess:
    """``circuslink run -n N RUN_ARGS -- python job.py`` (the launch path spmd does not take options for)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(code))
    full = dict(os.environ, CIRCUSLINK_TEST_SEED=str(seed), CIRCUSLINK_BACKEND="cpu")
    full.setdefault("CIRCUSLINK_TIMEOUT", "60")
    full.pop("CIRCUSLINK_RANKS_PER_NODE", None)
    full.pop(launcher.ENV_LAUNCHER, None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "circuslink", "run", "-n", str(n), *run_args, "--",
                           sys.executable, str(script)], capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=str(tmp_path))


def _crossing(n: int) -> int:
    """Channels of the all-to-all between ranks of different nodes (2 ranks a node): all routed."""
    return n * (n - 2)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [4, 6])
def test_all_to_all_across_nodes_under_mpirun(spmd, n):
    """2 and 3 declared nodes of 2 ranks under mpirun: every rank to every other (byte and uint4 channels,
    low-latency and bulk packets, link rings of 2 slots, relay rings of 4); every byte checked against a
    seeded generator; only the node's memory is mapped; relays only between gateways, carried by mpi."""
    job = spmd(n, ALL_TO_ALL.replace("COUNT", "3"), launcher="mpirun", env=NODES_2, timeout=150).check()
    for r in range(n):
        assert f"routed ok {r} {_crossing(n)} mpirun" in job.stdout, job.output


@pytest.mark.mpi
def test_circuslink_run_ranks_per_node_starts_the_job_by_mpirun(tmp_path, seed):
    """``circuslink run -n 4 --ranks-per-node 2``: the job is started by mpirun (it says so), its lines are
    tagged [rank] as circuslink run tags them, and routed channels cross the nodes byte for byte."""
    job = _circuslink_run(tmp_path, seed, 4, ALL_TO_ALL.replace("COUNT", "2"), "--ranks-per-node", "2")
    assert job.returncode == 0, job.stdout + job.stderr
    assert ("circuslink run: 4 ranks in 2 nodes of 2 ranks (declared by --ranks-per-node 2): node 0 = ranks 0-1, "
            "node 1 = ranks 2-3; started by mpirun; between nodes: transport mpi (chosen by capability: proxied, up "
            "to the network)") in job.stderr
    for r in range(4):
        assert f"[{r}] routed ok {r} 8 mpirun\n" in job.stdout, job.stdout


REFUSED = """
import circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
w = cl.init()
try:
    channels.open(w, [Link("x", "x_in", 0, 1, 1, 3, element_type("uchar"), 256)], topology="nodes:2x2")
except cl.ConfigError as exc:
    print("REFUSED", exc, flush=True)
w.close()
"""

REFUSAL = ("REFUSED channels.open: channel x goes from rank 1 (node 0) to rank 3 (node 1) through the gateways, and "
           "no transport joins nodes in this job (mpi: it needs a job started by mpirun (MPI between the ranks); "
           "nvshmem: it needs a back-end that runs kernels (GPUs)); this job was started by circuslink run ({why}): "
           "start it under mpirun (circuslink run --ranks-per-node K does so by itself when mpirun and mpi4py are "
           "installed), e.g. CIRCUSLINK_RANKS_PER_NODE=2 mpirun -np 4 python app.py")


def test_routed_channels_between_nodes_need_mpirun_in_one_line(tmp_path, seed, spmd):
    """Without mpirun starting the job a routed channel between nodes is refused, before any allocation, in
    one line that says why mpirun did not start it: --launcher circuslink, or nodes declared by the variable."""
    job = _circuslink_run(tmp_path, seed, 4, REFUSED, "--ranks-per-node", "2", "--launcher", "circuslink")
    assert job.returncode == 0, job.stderr
    assert job.stdout.count(REFUSAL.format(why="--launcher circuslink was asked for")) == 4, job.stdout
    job = spmd(4, REFUSED, env=NODES_2).check()
    why = "its nodes were declared by CIRCUSLINK_RANKS_PER_NODE, not by --ranks-per-node"
    assert job.stdout.count(REFUSAL.format(why=why)) == 4, job.stdout


def test_choose_launcher(monkeypatch):
    """Who starts a job: mpirun for nodes --ranks-per-node declares when mpirun and mpi4py are there; the reason
    when not (which the routed open names); bad choices in one line."""
    monkeypatch.delenv(launcher.ENV_LAUNCHER, raising=False)
    monkeypatch.setattr(launcher, "mpirun_available", lambda: True)
    assert launcher.choose_launcher(None, 2) == (True, None)
    assert launcher.choose_launcher("auto", 1) == (False, None)
    assert launcher.choose_launcher("mpirun", 1) == (True, None)
    assert launcher.choose_launcher("circuslink", 3) == (False, "--launcher circuslink was asked for")
    assert launcher.choose_launcher(None, 2, declared_here=False)[0] is False
    monkeypatch.setenv(launcher.ENV_LAUNCHER, "circuslink")
    assert launcher.choose_launcher(None, 2)[0] is False
    monkeypatch.setattr(launcher, "mpirun_available", lambda: False)
    monkeypatch.setattr(launcher.shutil, "which", lambda name: None)
    assert launcher.choose_launcher("auto", 2) == (False, "mpirun is not on PATH")
    with pytest.raises(launcher.ConfigError, match=r"^--launcher mpirun: mpirun is not on PATH$"):
        launcher.choose_launcher("mpirun", 2)
    with pytest.raises(launcher.ConfigError, match=r"^--launcher 'ssh': choose one of auto, mpirun, circuslink"):
        launcher.choose_launcher("ssh", 2)


def _pumped(data: bytes, mode: str) -> str:
    import io
    import threading

    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    sink = io.StringIO()
    with os.fdopen(r, "rb") as stream:
        launcher._pump_tagged(stream, sink, mode, threading.Lock())
    return sink.getvalue()


def test_openmpi_tagged_output_becomes_rank_lines():
    """mpirun --tag-output tags each chunk a rank writes; the launcher joins each rank's chunks into lines."""
    data = (b"mpirun says\n[1,0]<stdout>:he[1,3]<stdout>:x[1,0]<stdout>:llo\n[1,3]<stdout>:y\nz[1,3]<stdout>:\n"
            b"[1,2]<stderr>:a\nb\n[1,1]<stdout>:no newline")
    assert _pumped(data, "all") == "mpirun says\n[0] hello\n[3] xy\n[3] z\n[2] a\n[2] b\n[1] no newline\n"
    assert _pumped(data, "others") == "mpirun says\nhello\n[3] xy\n[3] z\n[2] a\n[2] b\n[1] no newline\n"


SLOW_READER = """
import os, threading, time, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
from circuslink._wait import wait_until
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
ch = channels.open(w, [Link("a", "a_in", 0, 1, 1, 3, element_type("uchar"), 1024)], topology="nodes:2x2",
                   link_slots=2, relay={"nslots": 2, "batch": 1})
rng = np.random.default_rng(seed)
msgs = [rng.integers(0, 256, int(rng.integers(1, 1025)), dtype=np.uint8) for _ in range(60)]
if w.rank == 1:
    done = [0]
    def write():
        for m in msgs:
            ch["a"].write(m)
            done[0] += 1
    th = threading.Thread(target=write)
    th.start()
    # the reader has not started: the writer stops, held by the channel's end-to-end credits
    wait_until(lambda: done[0] > 0, 30, "the first write")
    time.sleep(0.5)
    held = done[0]
    time.sleep(0.3)
    assert held == done[0] < len(msgs), (held, done[0])
    w.barrier()
    th.join()
    say("writer held at", held, "of", len(msgs))
elif w.rank == 3:
    w.barrier()
    for i, m in enumerate(msgs):
        if i % 7 == 0:
            time.sleep(0.01)                       # a slow consumer
        assert ch["a_in"].read(m.size).tobytes() == m.tobytes(), i
    say("reader got", len(msgs))
else:
    w.barrier()
ch.close()
w.close()
"""


@pytest.mark.mpi
def test_a_slow_reader_across_a_relay_holds_the_writer_and_loses_nothing(spmd):
    """nodes:2x2 under mpirun, 1 -> 3 (1, 0, relay, 2, 3), relay rings of 2 packets: while the reader waits
    the writer stops (end-to-end credits: it never fills the relay), then a slow reader gets every byte."""
    job = spmd(4, SLOW_READER, launcher="mpirun", env=NODES_2, timeout=120).check()
    assert "reader got 60" in job.stdout, job.output
    assert "writer held at" in job.stdout


STALLED = """
import os, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
byte = element_type("uchar")
links = [Link("stuck", "stuck_in", 0, 1, 1, 3, byte, 256), Link("live", "live_in", 2, 3, 0, 3, byte, 256)]
ch = channels.open(w, links, topology="nodes:2x2", link_slots=2, relay={"nslots": 2, "batch": 1}, timeout=3)
rng = np.random.default_rng(seed)
live = [rng.integers(0, 256, int(rng.integers(1, 257)), dtype=np.uint8) for _ in range(40)]
if w.rank == 1:
    try:
        for _ in range(64):
            ch["stuck"].write(np.arange(200, dtype=np.uint8))   # rank 3 never reads it
    except cl.ChannelError as exc:
        say("ERR", exc)
elif w.rank == 0:
    for m in live:
        ch["live"].write(m)
elif w.rank == 3:
    for i, m in enumerate(live):
        assert ch["live_in"].read(m.size).tobytes() == m.tobytes(), i
    say("live got", len(live))
w.barrier(timeout=30)
ch.close()
w.close()
"""


@pytest.mark.mpi
def test_a_stalled_receiver_holds_back_only_its_own_channel_across_a_relay(spmd):
    """nodes:2x2 under mpirun: 1 -> 3 and 0 -> 3 share the relay 0 -> 2; rank 3 never reads 1 -> 3. Every
    byte of 0 -> 3 arrives; 1 -> 3's writer times out, and its error says the packets wait at gateway 0 for the
    receiver on rank 3 (end-to-end credits), not for the relay."""
    job = spmd(4, STALLED, launcher="mpirun", env=NODES_2, timeout=120, job_timeout=90).check()
    assert "live got 40" in job.stdout, job.output
    err = next(line for line in job.stdout.splitlines() if line.startswith("ERR"))
    assert "channel stuck (id 0, rank 1, sender to rank 3, routed 1->0->2->3): timed out after 3 s" in err, err
    assert "its packets wait at rank 0 for its receiver on rank 3 to read (end-to-end credits" in err, err


LATE_CREDITS = """
import os, threading, time, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
byte = element_type("uchar")
# 8 channels from node 1 to node 0: their credits go back from gateway 0 (last) to gateway 2 (first)
pairs = [(a, b) for a in (2, 3) for b in (0, 1)] * 2
links = [Link(f"c{k}", f"c{k}_in", 2 * k, 2 * k + 1, a, b, byte, 256) for k, (a, b) in enumerate(pairs)]
ch = channels.open(w, links, topology="nodes:2x2", relay={"nslots": 2, "batch": 1}, timeout=20)
if w.rank == 0:  # rank 0's agent holds back its credit reports until rank 2's agent has stopped
    agent, router = ch._router.agent, ch._router
    held, report = threading.Event(), agent._report_all
    agent._report_all = lambda: report() if held.is_set() else None
    stop = router.stop
    def late_stop(timeout):
        time.sleep(1.0)                           # rank 2 stops its agent meanwhile
        held.set()                                # 8 reports now, for a relay ring of 2 slots
        time.sleep(0.5)
        stop(timeout)
    router.stop = late_stop
for k, (a, b) in enumerate(pairs):
    if w.rank == a:
        ch[f"c{k}"].write(np.full(100, k, np.uint8))
    if w.rank == b:
        assert (ch[f"c{k}_in"].read(100) == k).all()
ch.close()
say("closed", w.rank)
w.close()
"""


@pytest.mark.mpi
def test_closing_while_a_peer_still_sends_credit_reports(spmd):
    """nodes:2x2: gateway 0's agent sends its 8 last credit reports only after gateway 2's agent has stopped, into
    a relay ring of 2 slots: the transport at 2 takes and drops them, and every rank closes."""
    job = spmd(4, LATE_CREDITS, launcher="mpirun", env=NODES_2, timeout=120, job_timeout=90).check()
    assert job.stdout.count("closed") == 4, job.output


# ---- failures ------------------------------------------------------------------------------------

DIES = """
import os, signal, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
w = cl.init()
ch = channels.open(w, [Link("a", "a_in", 0, 1, 1, 3, element_type("uchar"), 4096)], topology="nodes:2x2")
if w.rank == 1:
    for i in range(10**6):
        ch["a"].write(np.full(1000, i % 251, np.uint8))
if w.rank == 3:
    for i in range(20):
        assert (ch["a_in"].read(1000) == i % 251).all()
    if os.environ["HOW"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("rank three gives up")
w.barrier(timeout=300)
"""


@pytest.mark.mpi
def test_a_rank_killed_in_another_node_during_a_routed_transfer_is_named(spmd):
    """nodes:2x2 under mpirun, 1 -> 3 through both gateways; the receiver is killed mid-transfer: the job ends
    at once (not at a time-out), and mpirun's notice names rank 3."""
    job = spmd(4, DIES, launcher="mpirun", env=dict(NODES_2, HOW="kill"), job_timeout=60)
    assert job.returncode != 0
    assert "process rank 3 with PID" in job.output and "exited on signal 9" in job.output, job.output


@pytest.mark.mpi
def test_a_rank_failing_in_another_node_during_a_routed_transfer_is_named_by_circuslink_run(tmp_path, seed):
    """The same under ``circuslink run --ranks-per-node 2`` (started by mpirun), the receiver raising: its own
    line names it and its node, and circuslink run says the job failed."""
    job = _circuslink_run(tmp_path, seed, 4, DIES, "--ranks-per-node", "2", env={"HOW": "raise"}, timeout=60)
    assert job.returncode != 0
    assert ("circuslink: rank 3 (node 1) failed (RuntimeError: rank three gives up); aborting the MPI job"
            in job.stderr), job.stderr
    assert "circuslink run: the job (started by mpirun) failed with exit code" in job.stderr


RELAY_FAILS = """
import os, numpy as np, circuslink as cl
from mpi4py import MPI
from circuslink import channels
from circuslink.channels import Link, element_type
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
w = cl.init()
byte = element_type("uchar")
links = [Link("a", "a_in", 0, 1, 0, 3, byte, 4096), Link("b", "b_in", 2, 3, 1, 3, byte, 4096)]
ch = channels.open(w, links, topology="nodes:2x2", relay={"nslots": 4, "batch": 1}, timeout=3)
if w.rank == 0:
    ch.relays[2]._group._inject_fault(3, MPI.ERR_TRUNCATE)  # the progress thread's third MPI send fails
w.barrier()
name = {0: "a", 1: "b"}.get(w.rank)
if name:
    try:
        for i in range(200):
            ch[name].write(np.full(1000, i, np.uint8))
    except cl.Error as exc:
        say("ERR", w.rank, type(exc).__name__, exc)
    if w.rank == 0:
        try:
            ch["a"].check()                        # every later call says so at once
        except cl.TransportError as exc:
            say("AGAIN", exc)
w.barrier(timeout=30)
ch.release_local()
w.close()
"""


@pytest.mark.mpi
def test_a_transport_error_during_routed_transfers_names_the_link_and_the_transport(spmd):
    """nodes:2x2: gateway 0's MPI fails while 0 -> 3 and 1 -> 3 cross: the gateway's writes end at once with the
    transport's one line (link, ranks 0 and 2, mpi, the MPI error); rank 1, which holds no relay, times out with
    an error that says its packets wait at rank 0 for the relay 0->2."""
    job = spmd(4, RELAY_FAILS, launcher="mpirun", env=NODES_2, timeout=120, job_timeout=90).check()
    err = next(x for x in job.stdout.splitlines() if x.startswith("ERR 0"))[len("ERR 0 TransportError "):]
    # which send is the third (a batch's meta, its bulk data, a credit) depends on timing
    assert re.fullmatch(r"link rank 0 <-> rank 2 \(transport mpi\): MPI error in sending "
                        r"(packets \d+\.\.\d+ to rank 2|control): "
                        r"MPI_ERR_TRUNCATE: message truncated \(error class 15\)", err), err
    assert f"AGAIN {err}" in job.stdout, job.output
    line = next(x for x in job.stdout.splitlines() if x.startswith("ERR 1"))
    assert line.startswith("ERR 1 ChannelError channel b (id 2, rank 1, sender to rank 3, routed 1->0->2->3): "
                           "timed out after 3 s"), line
    assert line.endswith("its packets wait at rank 0 in the injection ring of channel b for room in 0->2 (network) "
                         "vc 0"), line


@pytest.mark.mpi
def test_circuslink_run_transport_forces_the_transport_between_nodes(tmp_path, seed):
    """``--transport mpi``: the ranks get CIRCUSLINK_TRANSPORT and the nodes line says it is forced; an unknown
    name is one line before any rank starts."""
    job = _circuslink_run(tmp_path, seed, 4, ALL_TO_ALL.replace("COUNT", "1"), "--ranks-per-node", "2",
                          "--transport", "mpi")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "; started by mpirun; between nodes: transport mpi (forced by CIRCUSLINK_TRANSPORT" in job.stderr
    assert job.stdout.count("routed ok") == 4
    bad = _circuslink_run(tmp_path, seed, 4, "pass", "--ranks-per-node", "2", "--transport", "ucx")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == ("circuslink: error: --transport 'ucx': choose one of ipc, mpi, nvshmem (a plug-in the ranks "
                          "register themselves: set CIRCUSLINK_TRANSPORT instead)\n")
