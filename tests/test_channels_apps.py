"""The channel examples (CIRCUS Fig. 6 and Fig. 2) and the pingpong benchmark, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BACKENDS, on_backend

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], backend: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    cmd = [sys.executable, "-m", "circuslink", *args]
    if args[0] == "run":
        cmd[4:4] = ["--backend", backend]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.mark.parametrize("backend", BACKENDS)
def test_fig6_sender_receiver(tmp_path, backend):
    proc = _run(["run", "-n", "2", "--", sys.executable, str(REPO / "examples/fig6_sender_receiver/main.py"),
                 "--elements", "30000"], backend, tmp_path)
    assert f"received 30000 elements from rank 0 through simple_out -> simple_in, in order, all correct " \
           f"({backend})" in proc.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_fig2_pipeline(tmp_path, backend):
    proc = _run(["run", "-n", "2", "--", sys.executable, str(REPO / "examples/fig2_pipeline/main.py"),
                 "--elements", "50000"], backend, tmp_path)
    assert f"50000 elements went through read, +1, write on rank 1 and came back exact ({backend})" in proc.stdout


@pytest.mark.parametrize("backend,nranks", [on_backend("cpu", 2), on_backend("cuda", 2, marks=pytest.mark.slow),
                                            on_backend("cuda", 4, marks=pytest.mark.slow)])
def test_pingpong_bench(tmp_path, backend, nranks):
    out = tmp_path / "pp.json"
    plot = tmp_path / "pp.png"
    sizes = "8,64,1K,16K" if backend == "cpu" else "8,64,4K,64K,1M,16M"
    proc = _run(["bench", "pingpong", "--backend", backend, "-n", str(nranks), "--sizes", sizes, "--iters", "3",
                 "--warmup", "1", "--json", str(out), "--plot", str(plot), "--no-baselines"], backend, tmp_path,
                timeout=400)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "pingpong" and doc["backend"] == backend and doc["nranks"] == nranks
    floor = doc["floor"]["pairs"]
    assert {(p["a"], p["b"]) for p in floor} == {(0, 1), (1, 0)} and all(p["lat_relaxed_us"] > 0 for p in floor)
    rows = doc["rows"]
    from circuslink.bench.pingpong import WARP_MAX

    wanted = sorted(int(s) if s.isdigit() else int(s[:-1]) << (10 if s[-1] == "K" else 20) for s in sizes.split(","))
    assert sorted(r["bytes"] for r in rows if r["impl"] == "circuslink") == wanted
    for impl in ("circuslink-ll", "circuslink-bulk"):  # the two packet kinds, for the switch point
        assert sorted(r["bytes"] for r in rows if r["impl"] == impl) == [s for s in wanted if s <= WARP_MAX], impl
    for r in rows:
        if r["impl"].startswith("circuslink"):
            assert r["verified"] is True and r["samples"] == 3 and r["round_trips"] >= 4
            # the median of the samples is never below the fastest sample
            assert 0 < r["min_one_way_us"] <= r["one_way_us"]
            assert r["throughput_GBps"] == pytest.approx(r["bytes"] / (r["one_way_us"] * 1e3))
    best = {r["bytes"]: r for r in rows if r["impl"] == "circuslink"}
    for n, r in best.items():  # the circuslink row is the fastest form measured at that size
        forms = [x["one_way_us"] for x in rows if x["bytes"] == n and x["impl"] in
                 ("circuslink-warp", "circuslink-grid", "circuslink-host")]
        assert r["one_way_us"] == min(forms)
    tiny = [r for r in rows if r["impl"] == "circuslink-depth4"]
    assert tiny and all(r["nslots"] == 4 and r["slowdown"] > 0 for r in tiny)
    assert "switch_point_bytes" in doc["meta"] and doc["meta"]["targets"]["lines"]
    # --plot FILE writes exactly FILE (both panels in it), and nothing beside it
    assert (tmp_path / "pp.png").stat().st_size > 0 and not list(tmp_path.glob("pp-*"))
    assert "one-way, median of 3 samples" in proc.stdout and "4-slot ring at" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_bench(tmp_path, backend):
    out = tmp_path / "st.json"
    sizes = "4K,64K" if backend == "cpu" else "4K,64K,1M,16M"
    _run(["bench", "stream", "--backend", backend, "--sizes", sizes, "--iters", "2", "--warmup", "1", "--json",
          str(out), "--plot", str(tmp_path / "st.png")], backend, tmp_path, timeout=400)
    doc = json.loads(out.read_text())
    best = [r for r in doc["rows"] if r["impl"] == "circuslink"]
    assert len(best) == len(sizes.split(",")) and all(r["verified"] and r["throughput_GBps"] > 0 for r in best)
    for r in best:
        assert r["one_way_us"] == pytest.approx(r["bytes"] / (r["throughput_GBps"] * 1e3))
    assert (tmp_path / "st.png").stat().st_size > 0
