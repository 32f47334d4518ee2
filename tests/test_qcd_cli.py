"""``circuslink qcd invert`` and ``circuslink qcd apply`` as users run them (subprocesses, cpu back-end).

Round trips through files are checked against the one-rank numpy reference; every bad input must end in
exactly one line ``circuslink: error: ...`` (no traceback) and a non-zero exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from circuslink.apps import qcd

KAPPA = 0.115


def cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, CIRCUSLINK_BACKEND="cpu", CIRCUSLINK_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "circuslink", "qcd", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    # Progress lines ("[  0.1 s] ...") may come first; the error itself is one line.
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("circuslink: error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path, seed):
    dims = (4, 4, 4, 8)
    U = qcd.random_gauge(dims, seed)
    psi = qcd.random_spinor(dims, seed + 1)
    np.save(tmp_path / "U.npy", U)
    np.save(tmp_path / "psi.npy", psi)
    return tmp_path, U, psi


@pytest.mark.parametrize("dagger", [False, True])
def test_apply_matches_the_reference(files, dagger):
    path, U, psi = files
    args = ["apply", "--gauge", "U.npy", "--input", "psi.npy", "--kappa", str(KAPPA), "--grid", "2", "1", "1", "2",
            "--output", "out.npy"] + (["--dagger"] if dagger else [])
    proc = cli(*args, cwd=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = np.load(path / "out.npy")
    assert out.dtype == np.complex128
    np.testing.assert_allclose(out, qcd.wilson(U, psi, KAPPA, dagger), rtol=0, atol=1e-13)


def test_apply_then_invert_round_trip(files):
    """invert(apply(psi)) gives psi back, on different grids for the two commands."""
    path, U, psi = files
    proc = cli("apply", "--gauge", "U.npy", "--input", "psi.npy", "--kappa", str(KAPPA), "--grid", "1", "1", "1", "2",
               "--output", "b.npy", cwd=path)
    assert proc.returncode == 0, proc.stderr
    proc = cli("invert", "--gauge", "U.npy", "--source", "b.npy", "--kappa", str(KAPPA), "--grid", "2", "1", "1", "1",
               "--tol", "1e-10", "--output", "x.npy", "--verify", "--json", "row.json", cwd=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    x = np.load(path / "x.npy")
    b = np.load(path / "b.npy")
    assert np.linalg.norm(b - qcd.wilson(U, x, KAPPA)) / np.linalg.norm(b) <= 1e-10
    assert np.linalg.norm(x - psi) / np.linalg.norm(psi) < 1e-8
    out = proc.stdout
    assert "CG: Convergence at" in out and "iterated = " in out and "true = " in out and "(requested = 1e-10)" in out
    assert "Gflops" in out and "ms per iteration" in out and "of the time waiting on halos" in out
    assert "verify: |b - M x| / |b| = " in out and "(ok)" in out
    row = json.loads((path / "row.json").read_text())["rows"][0]
    assert row["impl"] == "rma" and row["grid"] == "2x1x1x1" and row["converged"] is True
    assert row["true_residual"] <= 1e-10 and row["iterations"] > 0 and row["flops_per_site_per_iteration"] == 2832


def test_invert_random_fields_single_precision(tmp_path):
    proc = cli("invert", "--dim", "4", "4", "4", "4", "--grid", "1", "2", "1", "1", "--prec", "single",
               "--tol", "1e-9", "--seed", "3", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lattice 4x8x4x4 (local 4x4x4x4 on grid 1x2x1x1)" in proc.stdout
    assert "precision single" in proc.stdout and "(ok)" in proc.stdout


def test_non_convergence_is_one_line_and_fails(tmp_path):
    proc = cli("invert", "--dim", "4", "4", "4", "4", "--niter", "2", "--tol", "1e-12", cwd=tmp_path)
    line = one_error_line(proc)
    assert "no convergence within --niter 2" in line and "> --tol 1e-12" in line
    assert "CG: No convergence after 2 iterations" in proc.stdout


def _bad_files(path):
    np.save(path / "U6.npy", qcd.random_gauge((6, 4, 4, 4), 1))
    np.save(path / "Ureal.npy", qcd.random_gauge((4, 4, 4, 4), 1).real)
    np.save(path / "Ushort.npy", qcd.random_gauge((4, 4, 4, 4), 1)[:3])
    np.save(path / "U4.npy", qcd.random_gauge((4, 4, 4, 4), 1))
    np.save(path / "psi8.npy", qcd.random_spinor((4, 4, 4, 8), 1))
    (path / "text.npy").write_text("not an array")


@pytest.mark.parametrize("args, message", [
    (["invert", "--gauge", "U6.npy", "--grid", "4", "1", "1", "1"],
     r"lattice 6x4x4x4 is not divisible by the grid 4x1x1x1 \(x: 6 % 4 = 2\)"),
    (["invert", "--dim", "3", "4", "4", "4"], r"--dim 3x4x4x4: odd extent x = 3; even-odd \(checkerboard\)"),
    (["invert", "--gauge", "U6.npy", "--grid", "2", "1", "1", "1"], r"odd extent x = 3"),
    (["invert", "--gauge", "Ushort.npy"],
     r"--gauge Ushort.npy: shape \(3, 4, 4, 4, 4, 3, 3\); expected complex128 or complex64 of shape "
     r"\(4, T, Z, Y, X, 3, 3\)"),
    (["invert", "--gauge", "Ureal.npy"], r"--gauge Ureal.npy: dtype float64 .*expected complex128 or complex64"),
    (["invert", "--gauge", "missing.npy"], r"--gauge missing.npy: no such file"),
    (["invert", "--gauge", "text.npy"], r"--gauge text.npy: not a readable .npy array"),
    (["invert", "--gauge", "U4.npy", "--source", "psi8.npy"],
     r"--source psi8.npy: shape \(8, 4, 4, 4, 4, 3\); expected .* \(T, Z, Y, X, 4, 3\) = \(4, 4, 4, 4, 4, 3\)"),
    (["invert", "--dim", "4", "4", "4", "4", "--gauge", "U6.npy"], r"--gauge U6.npy: shape \(4, 4, 4, 4, 6, 3, 3\)"),
    (["apply", "--gauge", "U4.npy", "--input", "psi8.npy", "--kappa", "0.1", "--output", "o.npy"],
     r"--input psi8.npy: shape"),
    (["apply", "--gauge", "U4.npy", "--input", "missing.npy", "--kappa", "0.1", "--output", "o.npy"],
     r"--input missing.npy: no such file"),
    (["invert", "--dim", "256", "256", "256", "256"],  # refused up front with the need, as fft2 does
     r"qcd invert on a 256x256x256x256 lattice over 1 rank\(s\) needs about \d+\.\d GiB of memory, more than the "
     r"\d+\.\d GiB of host memory"),
    (["invert", "--dim", "4", "4", "4", "4", "--grid", "2", "2", "1", "1", "-n", "2"],
     r"-n 2 does not match the grid 2x2x1x1 \(4 ranks\)"),
    (["invert", "--dim", "4", "4", "4", "4", "--grid", "2", "1", "1", "1", "--halo", "nccl", "--backend", "cpu"],
     r"--halo nccl needs the cuda back-end"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    import re

    _bad_files(tmp_path)
    line = one_error_line(cli(*args, cwd=tmp_path))
    assert re.search(message, line), line


def test_apply_takes_the_documented_default_kappa(tmp_path):
    """docs/qcd.md gives --kappa a default (0.12): apply uses it as invert does."""
    U = qcd.random_gauge((4, 4, 4, 4), 3)
    psi = qcd.random_spinor((4, 4, 4, 4), 4)
    np.save(tmp_path / "U.npy", U)
    np.save(tmp_path / "psi.npy", psi)
    proc = cli("apply", "--gauge", "U.npy", "--input", "psi.npy", "--output", "out.npy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "kappa 0.12" in proc.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), qcd.wilson(U, psi, 0.12), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", ["-5", "x"])
def test_a_bad_seed_is_a_usage_error_not_a_traceback(tmp_path, seed):
    proc = cli("invert", "--seed", seed, cwd=tmp_path)
    assert proc.returncode == 2 and "argument --seed" in proc.stderr and "Traceback" not in proc.stderr


def test_help_explains_the_options():
    proc = cli("invert", "--help")
    assert proc.returncode == 0
    for option in ("--dim", "--grid", "--prec", "--tol", "--niter", "--halo", "--verify", "--gauge", "--source",
                   "--output", "--kappa", "--seed", "--nranks", "--backend", "--json"):
        assert option in proc.stdout, option
    proc = cli("apply", "--help")
    assert proc.returncode == 0 and "--dagger" in proc.stdout and "--input" in proc.stdout


def test_bench_qcd_quick_on_cpu(tmp_path):
    env = dict(os.environ, CIRCUSLINK_BACKEND="cpu", CIRCUSLINK_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "qcd", "--quick", "--dim", "4", "4", "4", "4",
                           "--grids", "1x1x1x1,2x1x1x1", "--halos", "rma,nccl", "--json", str(tmp_path / "q.json")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "q.json").read_text())
    assert data["benchmark"] == "qcd" and data["floor"]["local_copy_GBps"]
    rows = {(r["impl"], r["grid"]): r for r in data["rows"]}
    assert rows[("dslash", "1x1x1x1")]["bandwidth_GBps"] > 0 and rows[("dslash", "1x1x1x1")]["copy_ratio"] > 0
    assert rows[("none", "1x1x1x1")]["time_per_iter_us"] > 0
    assert rows[("rma", "2x1x1x1")]["time_per_iter_us"] > 0 and 0 <= rows[("rma", "2x1x1x1")]["halo_wait_share"] < 1
    assert "needs the cuda back-end" in rows[("nccl", "2x1x1x1")]["skipped"]
