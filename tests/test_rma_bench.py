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
    # every layout x chain x size, each with a positive time and consistent bandwidth, a median over samples
    # with the fastest sample beside it
    assert {(r["layout"], r["chain"], r["bytes"]) for r in ours} == {
        (lay, c, s) for lay in ("contiguous", "strided") for c in (1, 8) for s in (8, 2048)}
    for r in ours:
        assert r["neighbours"] == 1 and r["total_bytes"] == r["chain"] * r["bytes"] and "skipped" not in r
        assert r["samples"] == 5 and 0 < r["time_min_us"] <= r["time_us"], r
    assert data["meta"]["targets"]["lines"], data["meta"]
    impls = {r["impl"] for r in data["rows"]}
    assert {"mpi3-rma", "mpi-persistent-p2p", "nccl-grouped-sendrecv"} <= impls
    # The cpu back-end runs no kernels: no graphed or device-driven rows, NCCL skipped saying why.
    assert not impls & {"rma-host-graphed", "rma-device"}
    nccl = [r for r in data["rows"] if r["impl"] == "nccl-grouped-sendrecv"]
    assert nccl and all(r["skipped"] == "needs GPUs (the cuda back-end)" for r in nccl)
    nvshmem = [r for r in data["rows"] if r["impl"] == "nvshmem-put-signal-chain"]
    assert nvshmem and all(r["skipped"] == "needs GPUs (the cuda back-end)" for r in nvshmem)


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
    # The machine's limit for these chains (16 x 256 KiB and up: at least 1 MiB), timed beside them and checked
    # byte for byte: the copy engine making the same writes with both ranks at once.
    same = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "copy-engine-same-writes"]
    assert sorted(r["bytes"] for r in same) == [256 << 10, 512 << 10, 1 << 20], same
    assert all(r["time_us"] > 0 and r["throughput_GBps"] > 0 and r["samples"] >= 1 for r in same), same


def test_bench_rma_defaults_stay_small():
    """`bench rma -n 2` at its old defaults ran 160 queue configurations per impl (20 sizes x 4 chains x 2
    layouts), up to 64 MiB a cycle x 220 cycles, host-staged for MPI: minutes, not a hang. Now a chain writes
    at most --max-chain-bytes (16 MiB) and a sample at most 256 MiB: the whole plan is bounded."""
    import argparse

    import circuslink as cl
    from circuslink.bench import _driver as drv
    from circuslink.bench.rma import _SAMPLE_BYTES, _Bench, _max_chain, _pairs, _parse_chains, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    sizes, chains = drv.parse_sizes(args.sizes), _parse_chains(args.chains)
    pairs = _pairs(chains, sizes, _max_chain(args))
    assert (8, 8) in pairs and (1, 16 << 20) in pairs and len(pairs) <= 12, pairs
    assert all(c * s <= 16 << 20 for c, s in pairs)
    with pytest.raises(cl.ConfigError, match="--max-chain-bytes 8: every chain x size writes more"):
        _pairs([2], [8], 8)
    bench = _Bench.__new__(_Bench)
    bench.iters, bench.samples, bench.targets = args.iters, min(args.samples, args.iters), [(1, 0)]
    assert bench.samples >= 10
    moved = sum((bench._ops(c, s) * bench.samples + args.warmup) * c * s for c, s in pairs)
    assert moved <= 2 * len(pairs) * _SAMPLE_BYTES * 11 // 10, moved  # per impl and layout, warm-up included
    assert all(bench._ops(c, s) * c * s <= max(_SAMPLE_BYTES, c * s) for c, s in pairs)


def test_bench_rma_targets_read_the_rows():
    """The verdicts: ratios to this run's floor, MPI-3 RMA and copy engine, from the medians of the rows."""
    from circuslink.bench.rma import targets

    def row(impl, layout, chain, nbytes, us, neighbours=1):
        total = chain * nbytes * neighbours
        return {"impl": impl, "layout": layout, "chain": chain, "bytes": nbytes, "time_us": us,
                "throughput_GBps": total / us / 1e3, "neighbours": neighbours}

    floor = {"summary": {"lat_relaxed_us": 0.28, "ce_GBps": 500.0}}
    rows = [row("rma-device", "contiguous", 8, 8, 0.80), row("rma-host-graphed", "contiguous", 1, 8, 6.0),
            row("rma-host-graphed", "contiguous", 8, 8, 12.0), row("mpi3-rma", "contiguous", 1, 8, 94.0),
            row("mpi3-rma", "contiguous", 8, 8, 415.0),
            row("rma-host-graphed", "contiguous", 1, 16 << 20, 16 * 1.048576 * 1e6 / 1e3 / 450),  # 450 GB/s
            row("rma-host-graphed", "contiguous", 1, 1 << 20, 10.0),
            row("rma-host-graphed", "strided", 1, 1 << 20, 20.0),
            {"impl": "nccl-grouped-sendrecv", "chain": 1, "bytes": 8, "skipped": "needs GPUs"}]
    out = targets(rows, floor)
    assert abs(out["device_8x8_vs_floor"] - 0.80 / 0.28) < 1e-9
    assert out["graphed_8B_us"] == 12.0 and abs(out["small_vs_mpi3"] - 6.0 / 94.0) < 1e-9
    assert abs(out["large_vs_copy_engine"] - 0.9) < 1e-6 and out["strided_vs_contiguous"] == 0.5
    verdicts = [line.rsplit(": ", 1)[1] for line in out["lines"]]
    assert verdicts == ["met", "MISSED", "met", "met", "MISSED"], out["lines"]
    assert out["large_vs_same_copies"] is None and out["same_copies_vs_copy_engine"] is None  # no such row
    # The copy engine making the same writes at once: 16 MiB in 40 us (419 GB/s = 0.84 x the lone figure).
    for same_us, ratio, where in ((40.0, 0.84, "within"), (50.0, 0.67, "beyond")):
        same = row("copy-engine-same-writes", "contiguous", 1, 16 << 20, same_us)
        out = targets(rows + [same], floor)
        ours = rows[5]["time_us"]
        assert abs(out["large_vs_same_copies"] - same_us / ours) < 1e-9, out
        assert abs(out["same_copies_vs_copy_engine"] - ratio) < 0.01, out
        limit = [line for line in out["lines"] if line.startswith("limit: ")]
        assert len(limit) == 1 and f"so the target's 0.8 x is {where} what" in limit[0], out["lines"]
        assert [line.rsplit(": ", 1)[1] for line in out["lines"] if line.startswith("target")] == verdicts
    # One node a cycle beside two: the faster graphed form at each chain, the worst of those against the bound.
    cycle = [row("rma-host-graphed-cycle", "contiguous", 1, 8, 4.0), row("rma-host-graphed-cycle", "contiguous", 8, 8,
                                                                           5.0)]
    out = targets(rows + cycle, floor)
    assert out["graphed_8B_us"] == 5.0 and "worst 5.00 us, rma-host-graphed-cycle" in out["lines"][1], out["lines"]
    assert abs(out["small_vs_mpi3"] - 4.0 / 94.0) < 1e-9, out  # graphed 1 x 8 B: 4.0 (was 6.0) against 94
    # The session's form beside the plain one: the faster is the device-driven figure, named in the line.
    session = row("rma-device-session", "contiguous", 8, 8, 0.70)
    out = targets(rows + [session], floor)
    assert abs(out["device_8x8_vs_floor"] - 0.70 / 0.28) < 1e-9 and "rma-device-session 0.700 us" in out["lines"][0]
    empty = targets([], None)
    assert all(line.endswith("not measured") for line in empty["lines"]) and len(empty["lines"]) == 5
