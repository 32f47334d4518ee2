"""The channel examples (CIRCUS Fig. 6 and Fig. 2) and the pingpong benchmark, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], backend: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    cmd = [sys.executable, "-m", "circuslink", *args]
    if args[0] == "run":
        cmd[4:4] = ["--backend", backend]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fig6_sender_receiver(tmp_path, backend):
    proc = _run(["run", "-n", "2", "--", sys.executable, str(REPO / "examples/fig6_sender_receiver/main.py"),
                 "-n", "30000"], backend, tmp_path)
    assert f"received 30000 elements from rank 0 through simple_out -> simple_in, in order, all correct " \
           f"({backend})" in proc.stdout


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fig2_pipeline(tmp_path, backend):
    proc = _run(["run", "-n", "2", "--", sys.executable, str(REPO / "examples/fig2_pipeline/main.py"),
                 "-n", "50000"], backend, tmp_path)
    assert f"50000 elements went through read, +1, write on rank 1 and came back exact ({backend})" in proc.stdout


@pytest.mark.parametrize("backend,nranks", [("cpu", 2), pytest.param("cuda", 2, marks=pytest.mark.gpu),
                                            pytest.param("cuda", 4, marks=pytest.mark.gpu)])
def test_pingpong_bench(tmp_path, backend, nranks):
    out = tmp_path / "pp.json"
    plot = tmp_path / "pp.png"
    sizes = "8,64,1K,16K" if backend == "cpu" else "8,64,4K,64K,1M,16M"
    proc = _run(["bench", "pingpong", "--backend", backend, "-n", str(nranks), "--sizes", sizes, "--iters", "4",
                 "--warmup", "1", "--json", str(out), "--plot", str(plot), "--no-baselines"], backend, tmp_path,
                timeout=400)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "pingpong" and doc["backend"] == backend and doc["nranks"] == nranks
    assert doc["floor"] and doc["floor"]["summary"]
    rows = doc["rows"]
    from circuslink.bench.pingpong import _LL_MAX

    wanted = sorted(int(s) if s.isdigit() else int(s[:-1]) << (10 if s[-1] == "K" else 20) for s in sizes.split(","))
    for impl in ("circuslink", "circuslink-ll", "circuslink-bw"):
        got = sorted(r["bytes"] for r in rows if r["impl"] == impl)
        # LL is measured only up to _LL_MAX (one warp per side; bandwidth mode wins beyond it).
        assert got == [s for s in wanted if impl != "circuslink-ll" or s <= _LL_MAX], impl
    for r in rows:
        if r["impl"].startswith("circuslink"):
            assert r["verified"] is True
            assert 0 < r["latency_us"] <= r["time_us"]
            assert r["throughput_GBps"] > 0
    tiny = [r for r in rows if r["impl"].endswith("depth4")]
    assert tiny and all(r["nslots"] == 4 and r["slowdown"] > 0 for r in tiny)
    assert "resources" in doc["meta"] and doc["meta"]["resources"]["symmetric_bytes_total"] > 0
    assert (tmp_path / "pp-latency.png").stat().st_size > 0 and (tmp_path / "pp-throughput.png").stat().st_size > 0
    assert "pingpong (" in proc.stdout and "tiny ring (4 packets" in proc.stdout
