"""Grid sessions and low-latency rounds on GPUs (kernels: tests/kernels/grid_sessions.cu, public API only).

* many grid calls in one launch through a grid session, no grid barrier between them, through a ring far
  smaller than the data, every byte checked;
* a grid split in a writing half and a reading half against a forwarding grid on the peer;
* one warp a side: messages of random sizes (one, a few and many low-latency packets, and bulk) passed back
  whole by forward_warp and read back whole or in random pieces, aligned and not.

Run on the device machine (ranks share its GPU under MPS).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

COMMON = r'''
import os
from pathlib import Path
import cupy as cp, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.spec import Link, element_type
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
rng = np.random.default_rng(seed)
mod = cl.compile(Path("KERNELS").read_text())
def layout(sizes):
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    return offsets, int(np.sum(sizes))
def run(name, grid, threads, tx, rx, src, dst, offsets, sizes, extra=()):
    status = cp.ones(1, dtype=cp.int32)
    mod.get_function(name)((grid,), (threads,), (tx.device_handle(), rx.device_handle(), src, dst,
                           cp.asarray(offsets), cp.asarray(sizes), *extra, np.uint32(len(sizes)),
                           np.int32(w.rank), status))
    tx.channels.wait_kernel(cp.cuda.get_current_stream(), lambda: name)
    rx.check()
    tx.check()
    assert int(status.get()[0]) == 1, f"{name}: a channel call failed on rank {w.rank} (seed {seed})"
'''

STREAM = COMMON + r'''
byte = element_type("uchar")
links = [Link("a", "a_in", 1, 2, 0, 1, byte, 1), Link("b", "b_in", 3, 4, 1, 0, byte, 1)]
ch = channels.open(w, links, options={"a": {"nslots": 16, "chunk": 4096, "ll_max": 0},
                                      "b": {"nslots": 16, "chunk": 4096, "ll_max": 0}}, timeout=30)
for rep in range(2):
    # every draw on every rank, in the same order: both ranks agree on sizes and data
    sizes = rng.integers(1, 200_000, size=int(rng.integers(5, 40))).astype(np.uint64)
    offsets, total = layout(sizes)
    data = cp.asarray(rng.integers(0, 256, total, dtype=np.uint8))
    grids = [int(g) for g in rng.integers(1, 9, 4)]  # rank 0 / rank 1 grid for the stream, then for the echo
    # one direction: session_stream (rank 0 writes, rank 1 reads), each rank's grid a different size
    if w.rank == 0:
        run("session_stream", grids[0], 256, ch["a"], ch["b_in"], data, cp.zeros(1, cp.uint8), offsets, sizes)
    else:
        out = cp.zeros(total, dtype=cp.uint8)
        run("session_stream", grids[1], 128, ch["b"], ch["a_in"], cp.zeros(1, cp.uint8), out, offsets, sizes)
        assert bool((out == data).all()), f"session_stream: wrong bytes (seed {seed})"
    w.barrier()
    # both ways: rank 0 splits its grid in writers and readers, rank 1 forwards with a grid session
    out = cp.zeros(total, dtype=cp.uint8)
    if w.rank == 0:
        run("session_echo", max(2, grids[2]), 256, ch["a"], ch["b_in"], data, out, offsets, sizes)
        assert bool((out == data).all()), f"session_echo: wrong bytes (seed {seed})"
    else:
        run("session_echo", grids[3], 256, ch["b"], ch["a_in"], out, out, offsets, sizes)
    w.barrier()
ch.close()
w.close()
print("sessions ok", w.rank)
'''

WARP = COMMON + r'''
byte = element_type("uchar")
links = [Link("a", "a_in", 1, 2, 0, 1, byte, 8192), Link("b", "b_in", 3, 4, 1, 0, byte, 8192)]
ch = channels.open(w, links, options={"a": {"ll_max": 2048}, "b": {"ll_max": 2048}}, timeout=30)
# low-latency messages of 1..16 packets (and some bulk ones), read back whole or in random pieces; half of them
# whole 8-byte words at 8-byte aligned addresses (the few-packet path's aligned loads and stores), the rest not
sizes = np.concatenate([rng.integers(1, 2049, 80), rng.integers(2049, 6000, 6)]).astype(np.uint64)
rng.shuffle(sizes)
words = rng.random(sizes.size) < 0.5
sizes[words] = (sizes[words] + 7) // 8 * 8
reads = np.array([int(s) if rng.random() < 0.5 else int(rng.integers(1, int(s) + 1)) for s in sizes],
                 dtype=np.uint64)
offsets = np.concatenate([[0], np.cumsum((sizes + 8) // 8 * 8)[:-1]]).astype(np.uint64)
offsets[~words] += 1  # the others start one byte past a word
total = int(offsets[-1] + sizes[-1])
host = rng.integers(0, 256, total, dtype=np.uint8)
gaps = np.ones(total, dtype=bool)  # the padding between messages stays 0 on both sides
for o, n in zip(offsets, sizes):
    gaps[int(o):int(o + n)] = False
host[gaps] = 0
data = cp.asarray(host)
out = cp.zeros(total, dtype=cp.uint8)
if w.rank == 0:
    run("warp_echo", 1, 32, ch["a"], ch["b_in"], data, out, offsets, sizes, extra=(cp.asarray(reads),))
    assert bool((out == data).all()), f"warp_echo: wrong bytes (seed {seed})"
else:
    run("warp_echo", 1, 32, ch["b"], ch["a_in"], out, out, offsets, sizes, extra=(cp.asarray(reads),))
ch.close()
w.close()
print("warp echo ok", w.rank)
'''


def _kernels() -> str:
    from pathlib import Path

    return str(Path(__file__).parent / "kernels" / "grid_sessions.cu")


def test_grid_sessions_stream_and_echo_gpu(spmd):
    job = spmd(2, STREAM.replace("KERNELS", _kernels()), backend="cuda", env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    assert job.stdout.count("sessions ok") == 2


def test_warp_rounds_and_forward_gpu(spmd):
    job = spmd(2, WARP.replace("KERNELS", _kernels()), backend="cuda", env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    assert job.stdout.count("warp echo ok") == 2
