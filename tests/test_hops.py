"""``circuslink bench hops``: latency and throughput by hop count over a topology (routed channels), and the
many-to-many load (``--load``).

CPU: a line of 4 and a 2x2 mesh through the cpu agents (fast). GPU (the device machine, ranks under MPS): line:8
and torus:4x4, the runs of scripts/gpu-check.sh's hops stage. No timing assertions: the figures are checked for
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

from circuslink import ConfigError
from circuslink import topology as T
from circuslink.bench import _driver as drv
from circuslink.bench.hops import (
    fit,
    link_bytes,
    load_counts,
    load_destinations,
    load_links,
    load_options,
    load_payload,
    summary,
)
from circuslink.channels._plan import Plan

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), CIRCUSLINK_TIMEOUT=os.environ.get("CIRCUSLINK_TIMEOUT", "60"))
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "hops", *args], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize("backend,topo,sizes,load", [
    on_backend("cpu", "line:4", "16K", ["--load", "--load-packets", "64"]),
    on_backend("cuda", "line:8", "64K,1M", [], marks=pytest.mark.slow),
    on_backend("cuda", "torus:4x4", "1M", [], marks=pytest.mark.slow),
])
def test_bench_hops(tmp_path, backend, topo, sizes, load):
    out, plot = tmp_path / "hops.json", tmp_path / "hops.png"
    proc = _run(["--backend", backend, "--topology", topo, "--sizes", sizes, "--iters", "3", "--warmup", "1",
                 "--json", str(out), "--plot", str(plot), *load], tmp_path, timeout=170)
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
    assert plot.stat().st_size > 0 and not list(tmp_path.glob("hops-*"))  # one file, every panel
    assert "added latency per hop" in proc.stdout
    assert [r["verified"] for r in doc["rows"] if r["impl"] == "load"] == ([True] if load else [])


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


# -- the many-to-many load ------------------------------------------------------------------------------------
def _hash_word(seed: int, pair: int, m: int, k: int) -> int:
    """An independent (pure Python) load_word of kernels/hops_load.cu."""
    mask = 0xFFFFFFFF
    x = (seed ^ (pair * 0x9E3779B1) ^ (m * 0x85EBCA77) ^ (k * 0xC2B2AE3D)) & mask
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & mask
    x ^= x >> 12
    x = (x * 0x297A2D39) & mask
    return x ^ (x >> 15)


def test_load_payload_is_the_kernels_hash(rng):
    seed = int(rng.integers(0, 1 << 32))
    for src, dst, m, n in ((0, 5, 0, 1), (3, 1, 7, 6), (15, 14, int(rng.integers(0, 1 << 20)), 4099)):
        got = load_payload(seed, src, dst, m, n)
        words = [_hash_word(seed, src << 16 | dst, m, k) for k in range(-(-n // 4))]
        want = b"".join(w.to_bytes(4, "little") for w in words)[:n]
        assert got.dtype == np.uint8 and got.tobytes() == want
    a = load_payload(seed, 1, 2, 3, 256)
    for other in (load_payload(seed, 2, 1, 3, 256), load_payload(seed, 1, 2, 4, 256),
                  load_payload(seed + 1, 1, 2, 3, 256)):
        assert np.count_nonzero(a != other) > 200  # every pair, message and seed has its own bytes


def test_load_pattern(rng):
    seed, n, m = int(rng.integers(0, 1 << 31)), int(rng.integers(2, 17)), int(rng.integers(1, 4000))
    dest = load_destinations(seed, 3, n, m)
    assert dest.shape == (n, m) and (dest != np.arange(n)[:, None]).all() and dest.min() >= 0 and dest.max() < n
    assert (load_destinations(seed, 3, n, m) == dest).all()
    # another sample draws another pattern (on 8 ranks x 64 messages: with 2 ranks, or 3 ranks and one message,
    # every pattern could equal another: seed 82444319 drew n = 2)
    assert not (load_destinations(seed, 4, 8, 64) == load_destinations(seed, 3, 8, 64)).all()
    counts = load_counts(dest)
    assert counts.sum() == n * m and (np.diag(counts) == 0).all()
    for src in range(n):
        assert counts[src].tolist() == [int((dest[src] == d).sum()) for d in range(n)]
    if m >= 1000 and n > 2:  # uniform over the other ranks
        share = counts[np.triu_indices(n, 1)] / m
        assert np.abs(share - 1 / (n - 1)).max() < 0.25


@pytest.mark.parametrize("topo", ["torus:4x4", "mesh:2x2", "line:4", "ring:8"])
def test_link_bytes_follow_the_tables(rng, topo):
    t = T.parse(topo)
    routing = t.routing()
    counts = rng.integers(0, 50, (t.size, t.size))
    np.fill_diagonal(counts, 0)
    got = link_bytes(routing, counts, 300)
    want = np.zeros(len(t.links), np.int64)
    by_ends = {(k.src, k.dst): k.id for k in t.links}
    for src in range(t.size):
        for dst in range(t.size):
            at = src
            while at != dst:  # walk the next-hop table
                nxt = int(routing.next[at, dst])
                want[by_ends[(at, nxt)]] += counts[src, dst] * 300
                at = nxt
    assert (got == want).all()


def _load_plan(topo: str, vcs=None) -> Plan:
    t = T.parse(topo)
    links = load_links(t.size, 4096, gpu=True)
    return Plan(links, {link.name: load_options(4096, True) for link in links}, t, vcs)


def test_load_deadlock_check():
    """The load's channels with the default (dateline) VCs are acyclic on every torus and ring; without VCs a
    ring of 8 (4-hop routes) and a torus:8x2 are refused by channels.open's check, naming the cycle;
    torus:4x4 without VCs is accepted (no route holds two links of one ring between its first and last hop)."""
    for topo in ("torus:4x4", "ring:8", "torus:8x2", "mesh:4x4", "line:8"):
        assert _load_plan(topo).router.cycle() == []
    assert _load_plan("torus:4x4", vcs=1).router.cycle() == []
    for topo in ("ring:8", "torus:8x2"):
        with pytest.raises(ConfigError, match=rf"the routed channels on {topo} with 1 virtual channel\(s\) can "
                                              r"deadlock: .* cycle: .*\(back to "):
            _load_plan(topo, vcs=1)


def test_bench_hops_load_cpu(tmp_path):
    """--load-only on mesh:2x2 (4 ranks, the diagonal pairs routed through a neighbour): few packets, every byte
    checked; the row's link figures recomputed from the recorded pattern and the routing tables."""
    out, plot = tmp_path / "load.json", tmp_path / "load.png"
    proc = _run(["--backend", "cpu", "--topology", "mesh:2x2", "--load-only", "--load-packets", "240",
                 "--load-bytes", "1000", "--iters", "3", "--warmup", "1", "--json", str(out), "--plot", str(plot)],
                tmp_path, timeout=170)
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["impl"] for r in rows] == ["load"]
    r = rows[0]
    t = T.parse("mesh:2x2")
    routing = t.routing()
    assert r["verified"] is True and r["wrong_bytes"] == 0 and r["bytes"] == 1000 and r["packets_per_message"] == 1
    assert r["messages_per_rank"] == 15 and r["packets"] == 4 * 4 * 15 and len(r["pattern"]) == 3  # 240 packets
    pattern = np.array(r["pattern"])
    assert (pattern.sum(axis=2) == 15).all() and (pattern[:, range(4), range(4)] == 0).all()
    assert r["links_used"] == 8 and len(r["links_GBps"]) == 8  # every link of the mesh carries load
    cap = doc["floor"]["pairs"][0]["sm_store_GBps"]
    assert r["link_capacity_GBps"] == pytest.approx(cap) and r["capacity_GBps"] == pytest.approx(8 * cap)
    assert r["aggregate_vs_capacity"] == pytest.approx(r["aggregate_GBps"] / (8 * cap))
    assert r["worst_link_utilisation"] == pytest.approx(r["worst_link_GBps"] / cap)
    assert 0 < r["min_seconds"] <= r["seconds"] and 0 < r["aggregate_GBps"] <= r["max_aggregate_GBps"]
    per_link = link_bytes(routing, pattern[0], 1000)
    assert r["mean_hops"] == pytest.approx((pattern[0] * routing.hops).sum() / pattern[0].sum())
    assert r["mean_hops"] > 1  # the diagonal pairs take 2 hops
    assert max(r["links_GBps"].values()) <= r["link_traffic_GBps"] * 10 and per_link.sum() > 0
    assert doc["meta"]["targets"]["load"]["packets"] == 240
    assert "every byte checked, no deadlock" in proc.stdout and "load pattern (seed" in proc.stdout
    assert plot.stat().st_size > 0


def test_load_counts_wrong_bytes(spmd):
    """The receivers' check finds wrong bytes: rank 0 writes with another payload seed than the others check
    against, so every message from and to rank 0 is wrong and no other is."""
    job = spmd(4, """
        import os
        import circuslink as cl
        from circuslink import topology
        from circuslink.bench.hops import LoadChannels, load_counts, load_destinations, load_payload_seed
        w = cl.init()
        seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
        load = LoadChannels(w, topology.parse("mesh:2x2"), None, 300, None)
        dest = load_destinations(seed, 0, 4, 12)
        counts = load_counts(dest)
        _, wrong = load.sample(dest, counts, load_payload_seed(seed, 0), "right")
        assert wrong == 0, wrong
        _, wrong = load.sample(dest, counts, load_payload_seed(seed, 0) + (w.rank == 0), "wrong")
        involved = counts[0, w.rank] if w.rank else counts[1:, 0].sum()
        assert (wrong > 0) == (involved > 0) and wrong <= involved * 300, (wrong, involved)
        print("checked", w.rank, wrong, involved)
        load.close()
        w.close()
    """).check()
    assert job.stdout.count("checked") == 4, job.output


@pytest.mark.slow
@pytest.mark.gpu
def test_bench_hops_load_gpu(tmp_path):
    """--load-only on torus:4x4 (16 ranks under MPS): the kernel's byte check and the row (a bounded count)."""
    out = tmp_path / "load.json"
    _run(["--backend", "cuda", "--topology", "torus:4x4", "--load-only", "--load-packets", "60000",
          "--iters", "3", "--warmup", "1", "--json", str(out)], tmp_path, timeout=170)
    r = json.loads(out.read_text())["rows"][0]
    assert r["impl"] == "load" and r["verified"] is True and r["wrong_bytes"] == 0 and r["packets"] >= 60000
    assert r["links_used"] == 64 and r["vcs"] == 2 and r["worst_link_utilisation"] > 0
