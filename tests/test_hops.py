"""``circuslink bench hops``: latency and throughput by hop count over a topology (routed channels).

CPU: a line of 4 through the cpu agents (fast). GPU (the device machine, ranks under MPS): line:8 and
torus:4x4, the runs of scripts/gpu-check.sh's hops stage. No timing assertions: the figures are checked for
shape, the routes against the routing tables, the byte checks for having run, and the summary against an
independent least-squares fit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import on_backend

from circuslink import topology as T
from circuslink.bench import _driver as drv
from circuslink.bench.hops import fit, summary

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), CIRCUSLINK_TIMEOUT=os.environ.get("CIRCUSLINK_TIMEOUT", "60"))
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "hops", *args], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize("backend,topo,sizes", [
    on_backend("cpu", "line:4", "16K"),
    on_backend("cuda", "line:8", "64K,1M", marks=pytest.mark.slow),
    on_backend("cuda", "torus:4x4", "1M", marks=pytest.mark.slow),
])
def test_bench_hops(tmp_path, backend, topo, sizes):
    out, plot = tmp_path / "hops.json", tmp_path / "hops.png"
    proc = _run(["--backend", backend, "--topology", topo, "--sizes", sizes, "--iters", "3", "--warmup", "1",
                 "--json", str(out), "--plot", str(plot)], tmp_path, timeout=170)
    doc = json.loads(out.read_text())
    t = T.parse(topo)
    routing = t.routing()
    assert doc["benchmark"] == "hops" and doc["backend"] == backend and doc["nranks"] == t.size
    assert doc["meta"]["topology"] == topo and doc["meta"]["vcs"] == routing.vcs
    assert [(p["a"], p["b"]) for p in doc["floor"]["pairs"]] == [(0, 1)]
    lat = sorted((r for r in doc["rows"] if r["impl"] == "latency"), key=lambda r: r["dst"])
    thr = [r for r in doc["rows"] if r["impl"] == "throughput"]
    assert [r["dst"] for r in lat] == list(range(1, t.size))
    assert len(thr) == (t.size - 1) * len(sizes.split(","))
    for r in lat + thr:
        d = r["dst"]
        assert r["hops"] == routing.hops[0, d] and r["verified"] is True
        assert r["route"] == [0] + [h.dst for h in routing.route(0, d)]
        assert r["direct"] == (d in t.neighbours(0))
    for r in lat:
        assert 0 < r["min_one_way_us"] <= r["one_way_us"] and r["samples"] == 3 and r["round_trips"] >= 4
    for r in thr:
        assert 0 < r["throughput_GBps"] <= r["max_throughput_GBps"]
    targets = doc["meta"]["targets"]
    slope, intercept = _least_squares([(r["hops"], r["one_way_us"]) for r in lat])
    assert targets["per_hop_us"] == pytest.approx(slope) and targets["intercept_us"] == pytest.approx(intercept)
    assert targets["per_hop_vs_floor"] == pytest.approx(slope / doc["floor"]["pairs"][0]["lat_relaxed_us"])
    assert "throughput_ratio" in targets and any("per hop" in line for line in targets["lines"])
    assert plot.stat().st_size > 0 and not list(tmp_path.glob("hops-*"))  # one file, both panels
    assert "added latency per hop" in proc.stdout


def _least_squares(points):
    """An independent fit: slope = cov(x, y) / var(x)."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return slope, y.mean() - slope * x.mean()


def test_fit_and_summary(rng):
    hops = rng.integers(1, 8, 40)
    lat = 0.9 + 0.6 * hops + rng.normal(0, 0.01, 40)
    slope, intercept = fit(list(zip(hops.tolist(), lat.tolist(), strict=True)))
    want = _least_squares(list(zip(hops.tolist(), lat.tolist(), strict=True)))
    assert (slope, intercept) == pytest.approx(want)
    assert fit([(3, 1.0), (3, 2.0)]) is None

    class W:  # enough of a World for Results
        rank, size, device = 0, 2, None
        backend = type("B", (), {"name": "cpu", "device_label": lambda self, n: "cpu-test"})()

    res = drv.Results("hops", W())
    res.floor = {"pairs": [{"a": 0, "b": 1, "lat_relaxed_us": 0.5}]}
    for h, v in zip(hops.tolist(), lat.tolist(), strict=True):
        res.add(impl="latency", bytes=8, hops=h, one_way_us=v, direct=h == 1)
    for h, g in ((1, 100.0), (1, 110.0), (7, 90.0), (7, 96.0)):
        res.add(impl="throughput", bytes=1 << 20, hops=h, throughput_GBps=g)
    out = summary(res)
    assert out["per_hop_us"] == pytest.approx(want[0]) and out["per_hop_vs_floor"] == pytest.approx(want[0] / 0.5)
    assert out["throughput_ratio"] == pytest.approx(93.0 / 105.0) and out["throughput_hops"] == 7


def test_bench_hops_bad_input(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for args, text in ((["--topology", "torus:4y4"], "malformed topology 'torus:4y4'"),
                       (["--topology", "line:4", "-n", "3"], "topology line:4 has 4 ranks, but the job has 3")):
        proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "hops", "--backend", "cpu", *args],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60)
        assert proc.returncode != 0 and f"circuslink: error: {text}" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
