"""Persistent grids on a GPU shared by 1, 2 or 4 ranks under MPS: a kernel of 32..240 registers a thread (its
cap set with -maxrregcount, the rest spilled to the stack) sized by ``world.backend.max_blocks`` and launched
with ``launch_resident`` passes 200 grid barriers (``grid_sync`` on a ``GridBarrier`` handle) on every rank at
once, with every block of the grid counted at each; one block more than fits is refused in one line before it
runs. The kernel is tests/kernels/resident_grid.cu; the rule is checked for every register count on the cpu
by tests/test_occupancy.py."""

from __future__ import annotations

from pathlib import Path

import pytest

KERNELS = Path(__file__).parent / "kernels" / "resident_grid.cu"

JOB = """
import numpy as np, cupy as cp, circuslink as cl
w = cl.init()
source = open({kernels!r}).read()
stream = cp.cuda.Stream(non_blocking=True)
for cap in {caps}:
    fn = cl.compile(source, options=[f"-maxrregcount={{cap}}"]).get_function("resident_rounds")
    assert fn.num_regs <= cap, (fn.num_regs, cap)
    blocks = w.backend.max_blocks(fn, 256)
    bar = w.backend.grid_barrier(timeout=20)
    w.barrier()
    with stream:
        inp = cp.asarray(np.linspace(0.5, 1.0, 256, dtype=np.float32))
        out = cp.zeros(blocks * 256, cp.float32)
        arrivals = cp.zeros(1, cp.uint32)
        failed = cp.zeros(1, cp.int32)
    w.backend.launch_resident(fn, blocks, 256, (bar.device_handle(), inp, out, arrivals, np.int32(200), failed),
                              stream=stream)
    what = f"resident_rounds ({{fn.num_regs}} registers, {{blocks}} blocks) on rank {{w.rank}}"
    w.backend.wait_stream(stream, 60, what)
    assert int(failed.get()[0]) == 0, f"{{what}}: failed with {{int(failed.get()[0])}}"
    assert int(arrivals.get()[0]) == 200 * blocks
    try:
        w.backend.launch_resident(fn, blocks + 1, 256, (bar.device_handle(), inp, out, arrivals, np.int32(1), failed),
                                  stream=stream)
        raise AssertionError("a grid one block larger than fits was launched")
    except cl.BackendError as exc:
        assert f"a persistent grid of {{blocks + 1}} blocks cannot be resident" in str(exc), exc
        assert f"{{blocks}} fit ({{fn.num_regs}} registers a thread" in str(exc), exc
    print(f"rank {{w.rank}}: {{fn.num_regs}} registers, {{fn.local_size_bytes}} B of stack: {{blocks}} blocks resident")
w.close()
"""


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_persistent_grids_of_any_register_count_stay_resident(spmd, ranks):
    caps = [32, 64, 86, 128, 168, 255]
    job = spmd(ranks, JOB.format(kernels=str(KERNELS), caps=caps), backend="cuda", timeout=400)
    job.check()
    assert job.output.count("blocks resident") == ranks * len(caps), job.output
