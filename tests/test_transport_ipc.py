"""The ipc transport: mapped memory inside a node (the cpu back-end's shared memory here; CUDA IPC on the GPU).

Jobs of 4 ranks: every rank connected to every other (one node), random-sized puts land byte-exact once their
signal is seen, over several rounds; the device handle addresses the peer's region and my own; the memory the
channels and RMA windows take comes from it (``transport.map_memory``), mapped into the named peers only; a pair
in two nodes is refused in one line. On the GPU a kernel puts and waits through ``circuslink/transport.cuh``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

KERNELS = Path(__file__).with_name("kernels") / "transport_user.cu"

CONNECT = """
import os, numpy as np, circuslink as cl
from circuslink import transport
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
peers = [p for p in range(w.size) if p != w.rank]
group = transport.connect(w, peers, nbytes=1 << 15, nsignals=2)
assert all(group[p].transport.name == "ipc" and group[p].capabilities.mapped for p in peers)
def data(src, dst, k):
    g = np.random.default_rng([seed, src, dst, k])
    return g.integers(0, 256, int(g.integers(1, 1 << 15)), dtype=np.uint8)
for k in range(6):
    for p in peers:
        d = data(w.rank, p, k)
        group[p].put(0, d[:7])
        group[p].put_with_signal(7, d[7:], 0, k + 1)
    for p in peers:
        group[p].wait(0, k + 1)
        want = data(p, w.rank, k)
        got = np.asarray(group[p].inbox()[:len(want)])
        assert got.tobytes() == want.tobytes(), (p, k)
        group[p].signal(1, k + 1)                           # read: the peer may put round k + 1
    for p in peers:
        group[p].wait(1, k + 1)
# the device handle: my region in the peer's buffer, the peer's in mine
h = group[peers[0]].device_handle()
assert h["mode"] == 0 and h["peer"] == peers[0] and h["rank"] == w.rank and h["nsignals"] == 2
assert h["remote"] - h["remote_signals"] == h["local"] - h["local_signals"] == 256
try:
    group[peers[0]].wait(1, 10**6, timeout=0.2)
except cl.TimeoutError as exc:
    say("STALL", exc)
group.close()
buf = transport.map_memory(w, [(w.rank + 1) % w.size], 4096)
assert buf.mapped == sorted({w.rank, (w.rank + 1) % w.size})
buf.close()
say("ipc ok", w.rank)
w.close()
"""


def test_connections_inside_a_node_byte_exact(spmd):
    job = spmd(4, CONNECT, timeout=120).check()
    assert job.stdout.count("ipc ok") == 4, job.output
    assert ("STALL link rank 0 <-> rank 1 (transport ipc): waited 0.2 s for signal 1 to reach 1000000 (it is 6): "
            "rank 1 did not signal") in job.stdout, job.output


def test_a_pair_in_two_nodes_is_not_ipc(spmd):
    """Between declared nodes ipc is no candidate; forcing it is one line saying why."""
    job = spmd(4, """
        import circuslink as cl
        from circuslink import transport
        w = cl.init()
        try:
            transport.connect(w, (w.rank + 2) % 4, nbytes=64, transport="ipc")
        except cl.ConfigError as exc:
            print("REFUSED", exc, flush=True)
        w.close()
    """, env={"CIRCUSLINK_RANKS_PER_NODE": "2"}).check()
    assert ("REFUSED connect: rank 0 <-> rank 2: transport ipc cannot be used: it joins ranks up to the same node, "
            "and this pair is joined by the network") in job.stdout, job.output


def test_connect_is_collective_and_symmetric(spmd):
    job = spmd(3, """
        import circuslink as cl
        from circuslink import transport
        w = cl.init()
        for peers in ([1] if w.rank == 0 else [], None):
            try:
                transport.connect(w, peers, nbytes=64)
            except cl.ConfigError as exc:
                print("REFUSED", exc, flush=True)
        try:
            transport.connect(w, w.rank, nbytes=64)
        except cl.ConfigError as exc:
            print("SELF", exc, flush=True)
        w.close()
    """).check()
    assert ("REFUSED connect: rank 0 connects to rank 1, but rank 1 does not connect to rank 0 (a connection has two "
            "ends: each names the other)") in job.stdout
    assert "SELF connect: rank 0 cannot connect to itself" in job.stdout


@pytest.mark.gpu
def test_a_kernel_puts_and_waits_through_the_device_handle_gpu(spmd):
    """Two ranks (under MPS when they share a GPU): the kernel of tests/kernels/transport_user.cu puts 1 MiB with a
    signal into the peer's inbox and waits for the peer's, 20 rounds; every byte checked on the device."""
    job = spmd(2, f"""
        import numpy as np, cupy as cp, circuslink as cl
        from circuslink import transport
        w = cl.init()
        peer = 1 - w.rank
        conn = transport.connect(w, peer, nbytes=1 << 20, nsignals=2, timeout=30)
        kern = cl.compile(open({str(KERNELS)!r}).read()).get_function("exchange")
        scratch = cp.zeros(1 << 20, dtype=cp.uint8)
        status = cp.zeros(1, dtype=cp.int32)
        with w.backend.stream:
            kern((1,), (256,), (conn.device_handle(), scratch, np.uint64(1 << 20), np.uint64(11 + w.rank),
                                np.uint64(11 + peer), np.int32(20), status))
        w.backend.wait_stream(w.backend.stream, 60, "the exchange kernel")
        assert int(status.get()[0]) == 0, int(status.get()[0])
        conn.close()
        print("device ok", w.rank, flush=True)
        w.close()
    """, backend="cuda", timeout=240).check()
    assert job.stdout.count("device ok") == 2, job.output
