"""A fake third transport (tests/fake_transport.py, registered by the job itself) carries routed channels end to
end between declared nodes, under circuslink's own launcher (no MPI anywhere): the registry chooses it because the
job forces it, the generic relay moves the packets over its put-with-signal, and no subsystem knows its name.
Nothing it made is left behind (its shared-memory segments are gone after the job).
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent

JOB = f"""
import os, sys, threading, numpy as np, circuslink as cl
sys.path.insert(0, {str(TESTS)!r})
from fake_transport import FakeTransport
from circuslink import channels, transport
from circuslink.channels import Link, element_type
def say(*a): os.write(1, (" ".join(map(str, a)) + chr(10)).encode())  # one write: lines never interleave
transport.register("fake", FakeTransport)
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
byte = element_type("uchar")
pairs = [(a, b) for a in range(w.size) for b in range(w.size) if a != b and a // 2 != b // 2]
links = [Link(f"c{{a}}_{{b}}", f"c{{a}}_{{b}}_in", 2 * k, 2 * k + 1, a, b, byte, 2048)
         for k, (a, b) in enumerate(pairs)]
ch = channels.open(w, links, topology="nodes:2x2", link_slots=2, relay={{"nslots": 4, "batch": 2}}, timeout=30)
if w.rank in (0, 2):                                      # the gateways: a relay each, carried by the fake
    assert ch.relays.transports() == {{2 - w.rank: "fake"}}, ch.relays.transports()
def data(link, i):
    g = np.random.default_rng([seed, link.send_id, i])
    return g.integers(0, 256, int(g.integers(1, 3000)), dtype=np.uint8)
mine = [l for l in links if l.src_rank == w.rank]
def send():
    for i in range(4):
        for l in mine:
            ch[l.name].write(data(l, i))
th = threading.Thread(target=send)
th.start()
for i in range(4):
    for l in links:
        if l.dst_rank == w.rank:
            want = data(l, i)
            assert ch[l.receiver_name].read(want.size).tobytes() == want.tobytes(), (l.name, i)
th.join()
ch.close()
say("fake ok", w.rank, w.launched_by)
w.close()
"""


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("clfake-")} if os.path.isdir("/dev/shm") else set()


def test_a_fake_transport_carries_routed_channels_between_nodes(spmd):
    before = _segments()
    job = spmd(4, JOB, env={"CIRCUSLINK_RANKS_PER_NODE": "2", "CIRCUSLINK_TRANSPORT": "fake"}, timeout=180).check()
    for r in range(4):
        assert f"fake ok {r} circuslink run" in job.stdout, job.output
    assert _segments() == before and "leaked" not in job.output  # no segment outlives the job


def test_ranks_that_choose_differently_are_told_in_one_line(spmd):
    """The choice is collective: two ranks that measured different figures (here, recorded by hand) would pick
    different transports for their pair; connect refuses in one line instead of hanging in two collectives."""
    job = spmd(4, f"""
        import sys, circuslink as cl
        sys.path.insert(0, {str(TESTS)!r})
        from fake_transport import FakeTransport
        from circuslink import transport
        transport.register("fake-a", type("A", (FakeTransport,), {{}}))
        transport.register("fake-b", type("B", (FakeTransport,), {{}}))
        w = cl.init()
        if w.rank == 0:
            transport.record_figures(w, "fake-b", 1.0, 10.0)   # only rank 0 believes fake-b is faster
        try:
            transport.connect(w, (w.rank + 2) % 4, nbytes=64)
        except cl.ConfigError as exc:
            print("REFUSED", exc, flush=True)
        w.close()
    """, env={"CIRCUSLINK_RANKS_PER_NODE": "2"}, timeout=120).check()
    assert ("REFUSED connect: ranks chose different transports: for ranks 0 <-> 2 rank 0 takes fake-b, rank 1 "
            "fake-a (record the same figures and register the same transports on every rank)") in job.stdout, job.output
