"""``circuslink bench rma`` end to end on the cpu back-end (CI runs it with --quick)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


def _bench(tmp_path, nranks):
    out = tmp_path / "rma.json"
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    cmd = [sys.executable, "-m", "circuslink", "bench", "rma", "-n", str(nranks), "--quick", "--backend", "cpu",
           "--sizes", "8,2K", "--chains", "1,8", "--iters", "5", "--warmup", "1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_bench_rma_quick_cpu(tmp_path):
    data = _bench(tmp_path, 2)
    assert data["benchmark"] == "rma" and data["nranks"] == 2 and data["floor"]["backend"] == "cpu"
    ours = [r for r in data["rows"] if r["impl"] == "rma-host"]
    # every layout x chain x size, each with a positive time and consistent bandwidth
    assert {(r["layout"], r["chain"], r["bytes"]) for r in ours} == {
        (lay, c, s) for lay in ("contiguous", "strided") for c in (1, 8) for s in (8, 2048)}
    for r in ours:
        assert r["neighbours"] == 1 and r["total_bytes"] == r["chain"] * r["bytes"] and "skipped" not in r
    impls = {r["impl"] for r in data["rows"]}
    assert {"mpi3-rma", "mpi-persistent-p2p", "nccl-grouped-sendrecv"} <= impls
    # The cpu back-end runs no kernels: no graphed or device-driven rows, NCCL skipped saying why.
    assert not impls & {"rma-host-graphed", "rma-device"}
    nccl = [r for r in data["rows"] if r["impl"] == "nccl-grouped-sendrecv"]
    assert nccl and all(r["skipped"] == "needs GPUs (the cuda back-end)" for r in nccl)


def test_bench_rma_verification_catches_wrong_bytes(rng):
    """Every row is checked against the origins' sources: a byte that lands wrong fails the run."""
    import numpy as np

    import circuslink as cl
    from circuslink import rma
    from circuslink.bench.rma import _Bench, _layout

    world = cl.init(backend="cpu")
    results = type("R", (), {"add": lambda self, **kw: None})()
    bench = _Bench(world, [1024], [2], 1, 0, results)
    win = rma.window_alloc(world, bench.nbytes)
    for layout in ("contiguous", "strided"):
        seed = int(rng.integers(1 << 31))
        bench._fill(win, seed)
        q = bench._declare(rma, win, layout, 2, 1024)
        q.commit()
        bench._cycles(q, 1)
        bench._verify(win, layout, 2, 1024, seed)  # what arrived is right
        count, block, _, dst_stride = _layout(layout, 1024)
        at = bench.src_bytes + 3 * 1024 + (count - 1) * dst_stride + int(rng.integers(block))  # write 1, last block
        win.local[at] ^= np.uint8(1 + rng.integers(255))
        with pytest.raises(cl.RmaError, match=rf"bench rma: rank 0 received wrong bytes from rank 0 \({layout}, "
                                              r"chain 2, 1024 B, write 1, block "):
            bench._verify(win, layout, 2, 1024, seed)
        q.free()
    win.free()


def test_bench_rma_rejects_bad_chains(tmp_path):
    cmd = [sys.executable, "-m", "circuslink", "bench", "rma", "--backend", "cpu", "--chains", "1,x"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env=dict(os.environ, CIRCUSLINK_TIMEOUT="30"))
    assert proc.returncode != 0
    assert "--chains '1,x': bad chain length 'x'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_rma_ring_of_four_cpu(tmp_path):
    """Each rank writes to both neighbours (issue 6's ring); every impl verifies what arrived from each."""
    data = _bench(tmp_path, 4)
    assert data["nranks"] == 4
    timed = [r for r in data["rows"] if "skipped" not in r]
    wanted = {"rma-host", "mpi3-rma", "mpi-persistent-p2p"} if shutil.which("mpirun") else {"rma-host"}
    assert wanted <= {r["impl"] for r in timed}, data["rows"]
    for r in timed:
        assert r["neighbours"] == 2 and r["total_bytes"] == 2 * r["chain"] * r["bytes"] and r["time_us"] > 0, r


@pytest.mark.slow
@pytest.mark.gpu
def test_bench_rma_long_chains_under_mps_gpu(tmp_path):
    """`bench rma` hung under MPS (2 ranks, one GPU) at chains of 16 x 512 KiB: a rank's device wait
    timed out on its origin's writes in the first cycles of that queue while the origin went on. The
    code before the fix hangs in this run (gpu-check's rma-repro stage runs both trees); now ranks
    under MPS each get their share of the SMs and every start grid fits it."""
    out = tmp_path / "rma.json"
    cmd = [sys.executable, "-m", "circuslink", "bench", "rma", "-n", "2", "--backend", "cuda", "--sizes",
           "256K,512K,1M", "--chains", "16", "--layouts", "contiguous", "--iters", "300", "--warmup", "20",
           "--no-baselines", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env=dict(os.environ, CIRCUSLINK_TIMEOUT="15"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "rma-host"]
    assert sorted(r["bytes"] for r in rows) == [256 << 10, 512 << 10, 1 << 20]
