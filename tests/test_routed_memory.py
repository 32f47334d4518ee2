"""Neighbour-only mapping: ``world.alloc(nbytes, peers=...)`` maps only the named ranks' buffers (a direct
network), every mapped byte is the peer's, and touching an unmapped rank is one clear line."""

from __future__ import annotations

import pytest
from conftest import BACKENDS

NEIGHBOURS = """
    import os, numpy as np, circuslink as cl
    w = cl.init()
    xp = w.xp
    rng = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]) + w.rank)
    n = w.size
    peers = [(w.rank - 1) % n, (w.rank + 1) % n]          # a ring: each rank maps its two neighbours
    buf = w.alloc(1 << 16, peers=peers)
    assert buf.mapped == sorted({w.rank, *peers}), buf.mapped
    mine = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    buf.local[:] = xp.asarray(mine)
    every = w.allgather_object(mine.tobytes())
    w.barrier()
    for r in peers:
        got = buf.peer(r)
        got = got.get() if hasattr(got, "get") else got
        assert got.tobytes() == every[r], f"rank {w.rank} misread rank {r}"
        assert buf.ptr(r) != 0
    w.barrier()                                            # every read is done before the stores below
    # a store through a neighbour's mapping lands in its memory
    nxt = (w.rank + 1) % n
    buf.peer(nxt)[:8] = xp.asarray(np.full(8, w.rank + 1, np.uint8))
    w.backend.synchronize()
    w.barrier()
    got = buf.local[:8]
    got = got.get() if hasattr(got, "get") else got
    assert list(got) == [(w.rank - 1) % n + 1] * 8
    far = (w.rank + 2) % n
    for call in (lambda: buf.peer(far), lambda: buf.ptr(far)):
        try:
            call()
        except cl.ConfigError as exc:
            print("ERR", exc)
        else:
            raise AssertionError("an unmapped rank's memory was handed out")
    assert buf.ptrs[far] == 0
    full = w.alloc(4096)                                   # no peers: every rank, as before
    assert full.mapped == list(range(n))
    w.close()
    print("mapping ok", w.rank)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_alloc_maps_only_the_peers(spmd, backend):
    job = spmd(4, NEIGHBOURS, backend=backend).check()
    assert job.stdout.count("mapping ok") == 4
    errs = [line for line in job.stdout.splitlines() if "ERR " in line]
    assert len(errs) == 8
    assert any("rank 0 maps only ranks 0, 1, 3 of this symmetric buffer (allocated with peers=...): rank 2's "
               "memory is not mapped here" in e for e in errs), errs


def test_alloc_refuses_bad_peers(spmd):
    job = spmd(2, """
        import circuslink as cl
        w = cl.init()
        for bad in ([5], ["a"], 3, [True]):
            try:
                w.alloc(64, peers=bad)
            except cl.ConfigError as exc:
                print("ERR", exc)
        b = w.alloc(64, peers=[w.rank])          # itself only: a rank without neighbours
        assert b.mapped == [w.rank]
        w.close()
    """).check()
    errs = [line for line in job.stdout.splitlines() if "ERR " in line]
    assert len(errs) == 8
    for text in ("alloc: peers holds 5, which is not a rank of this world (0..1)",
                 "alloc: peers must be an iterable of ranks or None, got 3",
                 "alloc: peers holds True, which is not a rank of this world (0..1)"):
        assert sum(e.endswith("ERR " + text) for e in errs) == 2, (text, errs)
