"""The non-blocking device calls (try_write, try_read, test) on GPUs: kernels tests/kernels/nonblocking.cu,
public API only, 2 ranks under MPS, seeded messages of random sizes (low-latency of one and several packets,
and bulk), every byte checked.

* a ring of 16 slots takes exactly the messages whose packets fit while the reader has not started; the first
  try_write that does not fit returns false at once and writes nothing (the reader never sees it);
* test / test_warp say true for exactly the bytes that arrived; try_read_warp reads them (in pieces that start
  inside a packet) and returns false, moving nothing, for a message that never came;
* tx.test() says whether everything written was consumed;
* both sides at once, each only polling try_* calls (warp, block and one-thread forms), through the same ring:
  every byte arrives (a reader that only polls still hands its credits back).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

PROGRAM = r'''
import os
from pathlib import Path
import cupy as cp, numpy as np, circuslink as cl
from circuslink import channels
from circuslink.spec import Link, element_type
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
rng = np.random.default_rng(seed)
mod = cl.compile(Path("KERNELS").read_text())
NSLOTS, CHUNK, LL_MAX, LL_PAYLOAD = 16, 4096, 1024, 120
byte = element_type("uchar")
links = [Link("a", "a_in", 1, 2, 0, 1, byte, 1), Link("b", "b_in", 3, 4, 1, 0, byte, 1)]
opts = {"nslots": NSLOTS, "chunk": CHUNK, "ll_max": LL_MAX}
ch = channels.open(w, links, options={"a": opts, "b": opts}, timeout=30)
tx, rx = (ch["a"], ch["b_in"]) if w.rank == 0 else (ch["b"], ch["a_in"])
# every draw on every rank in the same order: both agree on sizes and data
sizes = np.concatenate([rng.integers(1, 121, 8), rng.integers(121, LL_MAX + 1, 8),
                        rng.integers(LL_MAX + 1, 6000, 4)]).astype(np.uint64)
rng.shuffle(sizes)
offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
total = int(sizes.sum())
data = rng.integers(0, 256, total, dtype=np.uint8)
poison = rng.integers(0, 256, total, dtype=np.uint8)
splits = np.array([int(rng.integers(1, int(s) + 1)) if s > 1 else 1 for s in sizes], dtype=np.uint64)
packets = [(-(-int(s) // LL_PAYLOAD)) if s <= LL_MAX else -(-int(s) // CHUNK) for s in sizes]
fits = int(np.searchsorted(np.cumsum(packets), NSLOTS, side="right"))  # messages whose packets all fit the ring
arrived = int(sizes[:fits].sum())
d_off, d_sizes, d_splits = cp.asarray(offsets), cp.asarray(sizes), cp.asarray(splits)
out = cp.zeros(16, dtype=cp.int32)
stream = cp.cuda.get_current_stream()

def wait(what):
    ch.wait_kernel(stream, what)
    rx.check()
    tx.check()
    return [int(v) for v in out.get()]

if w.rank == 0:
    mod.get_function("fill")((1,), (32,), (tx.device_handle(), cp.asarray(data), d_off, d_sizes,
                                           np.uint32(len(sizes)), out))
    got = wait("fill")
    assert got == [1, fits, 0, 0] + [0] * 12, (got, fits, seed)
w.barrier()
if w.rank == 1:
    dst = cp.asarray(poison)
    mod.get_function("drain")((1,), (32,), (rx.device_handle(), dst, d_off, d_sizes, d_splits, np.uint32(fits),
                                            np.uint32(len(sizes)), np.uint64(arrived), out))
    got = wait("drain")
    want = [1, 0, 1, 0, 1, 0, 0, 0, 0]
    assert got[:9] == want, (got[:9], want, fits, seed)
    host = dst.get()
    assert host[:arrived].tobytes() == data[:arrived].tobytes(), f"drain: wrong bytes (seed {seed})"
    assert host[arrived:].tobytes() == poison[arrived:].tobytes(), f"drain: a false try_read moved bytes (seed {seed})"
w.barrier()
if w.rank == 0:
    out.fill(0)
    mod.get_function("after")((1,), (1,), (tx.device_handle(), out))
    assert wait("after")[0] == 1, f"tx.test() after the reader drained the ring (seed {seed})"
w.barrier()
# both at once: the rest, each side polling only
buf = cp.asarray(data) if w.rank == 0 else cp.asarray(poison)
out.fill(0)
writer = np.int32(w.rank == 0)
mod.get_function("stream")((1,), (128,), (tx.device_handle(), rx.device_handle(), writer, buf, d_off, d_sizes,
                                          np.uint32(fits), np.uint32(len(sizes)), out))
got = wait("stream")
assert got[:2] == [1, 0], (got[:2], w.rank, seed)
if w.rank == 1:
    host = buf.get()
    assert host[arrived:].tobytes() == data[arrived:].tobytes(), f"stream: wrong bytes (seed {seed})"
ch.close()
w.close()
print("try ok", w.rank)
'''


def test_try_write_try_read_test_gpu(spmd):
    from pathlib import Path

    kernels = str(Path(__file__).parent / "kernels" / "nonblocking.cu")
    job = spmd(2, PROGRAM.replace("KERNELS", kernels), backend="cuda", env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    assert job.stdout.count("try ok") == 2
