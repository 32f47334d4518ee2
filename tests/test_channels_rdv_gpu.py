"""Rendezvous messages on GPUs (kernels: tests/kernels/grid_sessions.cu, public API only).

* a channel opened with a window: a grid session writes messages of random sizes, from the window (large
  ones go by rendezvous: the reader's grid pulls them) and from plain memory (through the ring), aligned
  and not, many more than the ring has slots; the reader's grid is of another size; every byte checked;
* a reader that cannot take a rendezvous message (the host API's read) fails with the misuse named, and the
  writer waiting for it times out naming its channel, instead of hanging.

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
byte = element_type("uchar")
'''

MIXED = COMMON + r'''
RDV_MIN = 4096
total_cap = 32 << 20  # 24 messages of up to 600 KB, 12 small ones, their padding
win = w.alloc(total_cap)
links = [Link("a", "a_in", 1, 2, 0, 1, byte, 1)]
ch = channels.open(w, links, options={"a": {"nslots": 8, "chunk": 4096, "ll_max": 0, "window": win,
                                            "rendezvous_min": RDV_MIN}}, timeout=30)
for rep in range(2):
    # every draw on every rank, in the same order: both ranks agree on sizes and data
    sizes = np.concatenate([rng.integers(1, RDV_MIN, 12), rng.integers(RDV_MIN, 600_000, 24)]).astype(np.uint64)
    rng.shuffle(sizes)
    offsets = np.concatenate([[0], np.cumsum((sizes + 16) // 16 * 16)[:-1]]).astype(np.uint64)
    odd = rng.random(sizes.size) < 0.3
    offsets[odd] += rng.integers(1, 16, int(odd.sum())).astype(np.uint64)  # not 16-byte aligned: the byte path
    total = int(offsets[-1] + sizes[-1]) + 16
    assert total <= total_cap
    from_window = (rng.random(sizes.size) < 0.75).astype(np.uint8)
    host = rng.integers(0, 256, total, dtype=np.uint8)
    grids = [int(g) for g in rng.integers(1, 17, 2)]
    status = cp.ones(1, dtype=cp.int32)
    args = (cp.asarray(offsets), cp.asarray(sizes), cp.asarray(from_window), np.uint32(sizes.size),
            np.int32(w.rank), status)
    if w.rank == 0:
        win.local[:total] = cp.asarray(host)
        plain = cp.asarray(host)
        handle = ch["a"].device_handle()
        mod.get_function("session_stream_window")((grids[0],), (256,), (handle, handle, win.local, plain,
                                                                          cp.zeros(1, cp.uint8)) + args)
        ch["a"].channels.wait_kernel(cp.cuda.get_current_stream(), lambda: "writer")
        ch["a"].check()
    else:
        out = cp.zeros(total, dtype=cp.uint8)
        handle = ch["a_in"].device_handle()
        mod.get_function("session_stream_window")((grids[1],), (128,), (handle, handle, cp.zeros(1, cp.uint8),
                                                                          cp.zeros(1, cp.uint8), out) + args)
        ch["a_in"].channels.wait_kernel(cp.cuda.get_current_stream(), lambda: "reader")
        ch["a_in"].check()
        got, want = out.get(), host
        for m, (o, n) in enumerate(zip(offsets, sizes)):
            o, n = int(o), int(n)
            assert np.array_equal(got[o:o + n], want[o:o + n]), (
                f"message {m} ({n} B, {'window' if from_window[m] else 'plain'}, offset {o}): wrong bytes "
                f"(seed {seed}, grids {grids})")
    assert int(status.get()[0]) == 1, f"a channel call failed on rank {w.rank} (seed {seed})"
    w.barrier()
ch.close()
win.close()
w.close()
print("rendezvous ok", w.rank)
'''

MISREAD = COMMON + r'''
from circuslink.errors import ChannelError
win = w.alloc(1 << 20)
links = [Link("a", "a_in", 1, 2, 0, 1, byte, 1 << 16)]
ch = channels.open(w, links, options={"a": {"window": win, "rendezvous_min": 65536}}, timeout=3)
if w.rank == 0:
    status = cp.ones(1, dtype=cp.int32)
    mod.get_function("grid_write_once")((4,), (256,), (ch["a"].device_handle(), win.local, np.uint64(1 << 20), status))
    try:
        ch["a"].channels.wait_kernel(cp.cuda.get_current_stream(), lambda: "writer")
        ch["a"].check()
    except ChannelError as exc:
        print("writer:", exc)
else:
    try:
        ch["a_in"].read(1 << 20)
    except ChannelError as exc:
        print("reader:", exc)
w.barrier(timeout=60)
print("done", w.rank)
w.close()
'''


def _kernels() -> str:
    from pathlib import Path

    return str(Path(__file__).parent / "kernels" / "grid_sessions.cu")


def test_rendezvous_and_ring_messages_mixed_byte_exact_gpu(spmd):
    job = spmd(2, MIXED.replace("KERNELS", _kernels()), backend="cuda", env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    assert job.stdout.count("rendezvous ok") == 2


def test_a_reader_that_cannot_pull_fails_naming_the_misuse_and_the_writer_times_out_gpu(spmd):
    job = spmd(2, MISREAD.replace("KERNELS", _kernels()), backend="cuda", env={"CIRCUSLINK_TIMEOUT": "20"}).check()
    assert job.stdout.count("done") == 2
    assert "reader:" in job.stdout and "rendezvous message is read by a grid read" in job.stdout
    assert "writer:" in job.stdout and "channel a" in job.stdout
