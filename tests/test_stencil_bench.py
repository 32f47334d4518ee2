"""``circuslink bench stencil`` on the cpu back-end: it times the example's host form (and the MPI host-staged
baseline under mpirun) at one rank of the whole domain and at N ranks, checks every small domain bit for bit
against numpy, writes the one results format with time per iteration, Gcell/s and strong-scaling efficiency,
and says why the rows it cannot run here are skipped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from circuslink.bench import stencil as bench
from circuslink.errors import ConfigError


def _run(tmp_path, *argv: str) -> dict:
    out = tmp_path / "stencil.json"
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "stencil", "--backend", "cpu", "--json",
                           str(out), "--iters", "3", "--samples", "2", "--warmup", "1", *argv],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_host_form_rows_at_one_and_three_ranks(tmp_path):
    data = _run(tmp_path, "--ranks", "3", "--domains", "20x17,9x31", "--impls", "host,channel-persistent,nvshmem")
    assert data["benchmark"] == "stencil" and data["backend"] == "cpu"
    timed = [r for r in data["rows"] if "skipped" not in r]
    assert {(r["nranks"], r["domain"], r["dtype"]) for r in timed} == {
        (n, d, t) for n in (1, 3) for d in ("20x17", "9x31") for t in ("float32", "float64")}
    for r in timed:
        assert r["impl"] == "host" and r["checked"] is True and r["time_per_iter_us"] > 0
        assert r["gcells_per_s"] > 0 and r["min_us"] <= r["time_per_iter_us"]
        assert r["efficiency"] == pytest.approx(1.0 / (r["nranks"] * r["vs_one_rank"]))  # cpu: a device a rank
    skipped = {(r["impl"], r["skipped"]) for r in data["rows"] if "skipped" in r}
    assert ("channel-persistent", "the cpu back-end runs no device kernels") in skipped
    assert ("nvshmem", "circuslink has no NVSHMEM halo kernels for the stencil: no NVSHMEM row") in skipped


@pytest.mark.mpi
def test_mpi_host_staged_rows_under_mpirun(tmp_path):
    data = _run(tmp_path, "--ranks", "2", "--domains", "12x10", "--per-rank", "--impls", "mpi-host-staged",
                "--dtypes", "float64")
    timed = sorted((r for r in data["rows"] if "skipped" not in r), key=lambda r: r["nranks"])
    got = [(r["nranks"], r["domain"], r["grid"]) for r in timed]
    assert got == [(1, "12x10", "mesh:1x1"), (2, "24x10", "mesh:2x1")]  # blocks stay 12x10
    assert all(r["checked"] for r in timed) and timed[1]["bytes"] == 2 * (12 + 10) * 8


def test_scaling_is_against_one_rank_of_the_same_family_and_domain():
    rows = [{"impl": "host", "dtype": "float32", "domain": "8x8", "nranks": 1, "devices": 1, "time_per_iter_us": 10.0},
            {"impl": "host", "dtype": "float32", "domain": "8x8", "nranks": 4, "devices": 1, "time_per_iter_us": 12.5},
            {"impl": "host", "dtype": "float32", "domain": "8x8", "nranks": 2, "devices": 2, "time_per_iter_us": 4.0},
            {"impl": "host", "dtype": "float64", "domain": "8x8", "nranks": 2, "devices": 1, "time_per_iter_us": 9.0},
            {"impl": "nvshmem", "bytes": 0, "nranks": 2, "skipped": "why"}]
    bench._add_scaling(rows)
    assert rows[1]["vs_one_rank"] == 1.25 and rows[1]["efficiency"] == 0.8  # four ranks sharing one GPU
    assert rows[2]["efficiency"] == 1.25 and "efficiency" not in rows[3]  # no float64 one-rank row


@pytest.mark.parametrize("option,text,why", [
    ("--domains", "64x", "bad domain '64x'"),
    ("--impls", "host,cuda-graph", "unknown cuda-graph"),
    ("--ranks", "2,x", "expected rank counts"),
])
def test_bad_options_are_one_line(tmp_path, option, text, why):
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "stencil", "--backend", "cpu", option, text],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1 and why in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_missing_example_is_named(tmp_path):
    with pytest.raises(ConfigError, match="bench stencil times the program of examples/stencil, which is not at"):
        bench.load_example(str(tmp_path))
