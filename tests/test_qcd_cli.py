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
    done = next(ln for ln in out.splitlines() if ln.startswith("Done: "))
    for words in ("iterations", "iterated residual", "true residual", "GFLOPS", "seconds"):
        assert words in done, words
    assert "per iteration: " in out and "dslash" in out and "halo" in out and "reductions" in out
    assert "vector updates" in out
    assert "verify: |b - M x| / |b| = " in out and "(ok)" in out
    assert "gauge: " in out and "plaquette" in out
    row = json.loads((path / "row.json").read_text())["rows"][0]
    assert row["impl"] == "rma" and row["grid"] == "2x1x1x1" and row["converged"] is True
    assert row["true_residual"] <= 1e-10 and row["iterations"] > 0 and row["flops_per_site_per_iteration"] == 2832
    split = [row[f"{p}_us"] for p in ("dslash", "halo", "reduction", "vector")]
    assert all(v >= 0 for v in split) and split[0] > 0 and sum(split) <= row["time_per_iter_us"] * 1.01


@pytest.mark.parametrize("sloppy", ["single", "half"])
def test_invert_mixed_precision_reaches_double_accuracy(tmp_path, sloppy):
    """--dim is each rank's lattice: 4^4 on a 1x2x1x1 grid is a 4x8x4x4 lattice."""
    proc = cli("invert", "--dim", "4", "4", "4", "4", "--gridsize", "1", "2", "1", "1", "--prec-sloppy", sloppy,
               "--tol", "1e-11", "--seed", "3", "--verify", "--mass", "0.2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lattice 4x8x4x4 (local 4x4x4x4 on grid 1x2x1x1)" in proc.stdout
    assert f"precision double, sloppy {sloppy}" in proc.stdout and "(ok)" in proc.stdout
    assert f"kappa {1 / 8.4:.10g}, mass 0.2" in proc.stdout  # kappa = 1 / (2 mass + 8)


def test_apply_takes_the_documented_default_kappa(files):
    """docs/qcd.md gives --kappa a default (0.12): apply uses it as invert does."""
    path, U, psi = files
    proc = cli("apply", "--gauge", "U.npy", "--input", "psi.npy", "--output", "out.npy", cwd=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kappa 0.12" in proc.stdout
    np.testing.assert_allclose(np.load(path / "out.npy"), qcd.wilson(U, psi, 0.12), rtol=0, atol=1e-13)


def test_gauge_files_load_save_and_solve(files):
    """--save-gauge writes ILDG; --load-gauge reads it back (and NERSC), prints the plaquette, solves on it."""
    path, U, psi = files
    proc = cli("apply", "--load-gauge", "U.npy", "--input", "psi.npy", "--save-gauge", "U.ildg", "--output",
               "out.npy", "--gridsize", "1", "1", "1", "2", cwd=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gauge: U.npy" in proc.stdout.replace(str(path) + "/", "") and "wrote" in proc.stdout
    assert f"plaquette {qcd.plaquette(U):.12f}" in proc.stdout
    np.testing.assert_array_equal(qcd.read_gauge(str(path / "U.ildg")).U, U)
    proc = cli("invert", "--load-gauge", "U.ildg", "--source", "psi.npy", "--gridsize", "2", "1", "1", "1",
               "--kappa", str(KAPPA), "--tol", "1e-9", "--prec-sloppy", "single", "--output", "x.npy", cwd=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ILDG 4x4x4x8 64-bit (scidac-checksum): plaquette" in proc.stdout
    x = np.load(path / "x.npy")
    assert np.linalg.norm(psi - qcd.wilson(U, x, KAPPA)) / np.linalg.norm(psi) <= 1e-9


def test_corrupt_gauge_file_ends_the_job_in_one_line(files):
    """The checksum is checked by rank 0 inside the job: every rank stops and the command says it once."""
    path, U, _ = files
    qcd.write_ildg(str(path / "U.ildg"), U)
    raw = bytearray((path / "U.ildg").read_bytes())
    raw[len(raw) // 2] ^= 0x10  # inside the binary data: the structure is intact, the checksum is not
    (path / "bad.ildg").write_bytes(bytes(raw))
    proc = cli("invert", "--load-gauge", "bad.ildg", "--gridsize", "2", "1", "1", "1", cwd=path, timeout=60)
    line = one_error_line(proc)
    assert "bad.ildg: record 7 (scidac-checksum): SciDAC checksum mismatch" in line and proc.returncode == 1


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
    qcd.write_ildg(str(path / "U.ildg"), qcd.random_gauge((4, 4, 4, 4), 1))
    (path / "cut.ildg").write_bytes((path / "U.ildg").read_bytes()[:5000])


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
    (["apply", "--input", "psi8.npy", "--output", "o.npy"], r"qcd apply needs --load-gauge FILE"),
    (["invert", "--seed", "-5"], r"qcd invert: argument --seed: '-5' must be zero or more"),
    (["invert", "--kappa", "0.1", "--mass", "0.1"], r"argument --mass: not allowed with argument --kappa"),
    (["invert", "--mass", "-4.5"], r"--mass -4.5: kappa = 1 / \(2 mass \+ 8\) needs mass > -4"),
    (["invert", "--kappa", "-0.1"], r"--kappa -0.1 must be positive"),
    (["invert", "--prec", "single", "--prec-sloppy", "double"],
     r"--prec-sloppy double is more precise than --prec single"),
    (["invert", "--prec", "half"], r"argument --prec: invalid choice: 'half'"),
    (["invert", "--tol", "0"], r"argument --tol: '0' must be a positive number"),
    (["invert", "--reliable-delta", "1.5"], r"argument --reliable-delta: '1.5' must lie between 0 and 1"),
    (["invert", "--load-gauge", "text.npy"], r"--load-gauge text.npy: not a readable .npy array"),
    (["invert", "--load-gauge", "U.ildg", "--dim", "2", "2", "2", "2"],
     r"--load-gauge U.ildg: lattice 4x4x4x4, but --dim 2 2 2 2 on grid 1x1x1x1 makes 2x2x2x2"),
    (["invert", "--load-gauge", "cut.ildg"], r"--load-gauge cut.ildg: record 6 \(ildg-binary-data\): announces"),
    (["plaquette", "missing.lime"], r"missing.lime: no such file"),
    (["invert", "--dim", "256", "256", "256", "256"],  # refused up front with the need, as fft2 does
     r"qcd invert on a 256x256x256x256 lattice over 1 rank\(s\) needs about \d+\.\d GiB of memory, more than the "
     r"\d+\.\d GiB of host memory.*: use a smaller lattice per rank \(--dim\)"),
    # --dim is each rank's: more ranks hold a larger lattice, so the advice never says to spread over more of them
    (["invert", "--dim", "64", "64", "64", "64", "--grid", "1", "1", "2", "2"],
     r"qcd invert on a 64x64x128x128 lattice over 4 rank\(s\) needs about .*: use a smaller lattice per rank "
     r"\(--dim\); the global lattice is --dim times --gridsize, so more ranks need more memory, not less$"),
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


@pytest.mark.parametrize("seed", ["-5", "x"])
def test_a_bad_seed_is_a_usage_error_not_a_traceback(tmp_path, seed):
    proc = cli("invert", "--seed", seed, cwd=tmp_path)
    assert proc.returncode == 2 and "argument --seed" in proc.stderr and "Traceback" not in proc.stderr


def test_help_explains_the_options():
    proc = cli("invert", "--help")
    assert proc.returncode == 0
    for option in ("--dim", "--gridsize", "--grid", "--prec", "--prec-sloppy", "--tol", "--niter", "--halo",
                   "--verify", "--load-gauge", "--gauge", "--save-gauge", "--source", "--output", "--kappa", "--mass",
                   "--seed", "--nranks", "--backend", "--json", "--reliable-delta", "--cg", "--check-every",
                   "--no-split"):
        assert option in proc.stdout, option
    proc = cli("apply", "--help")
    assert proc.returncode == 0 and "--dagger" in proc.stdout and "--input" in proc.stdout
    assert "(default 0.12)" in " ".join(proc.stdout.split())  # wrapped by argparse
    proc = cli("plaquette", "--help")
    assert proc.returncode == 0 and "FILE" in proc.stdout


def test_bench_qcd_quick_on_cpu(tmp_path):
    env = dict(os.environ, CIRCUSLINK_BACKEND="cpu", CIRCUSLINK_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "qcd", "--quick", "--dim", "4", "4", "4", "4",
                           "--grids", "1x1x1x1,2x1x1x1", "--halos", "rma,nccl", "--cg", "host,device",
                           "--json", str(tmp_path / "q.json")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "q.json").read_text())
    assert data["benchmark"] == "qcd" and data["floor"]["local_copy_GBps"]
    rows = {(r["impl"], r["grid"]): r for r in data["rows"] if r.get("cg", "host") == "host"}
    device = {(r["impl"], r["grid"]): r for r in data["rows"] if r.get("cg") == "device"}
    assert device[("none", "1x1x1x1")]["time_per_iter_us"] > 0 and device[("rma", "2x1x1x1")]["check_every"] == 10
    assert rows[("dslash", "1x1x1x1")]["bandwidth_GBps"] > 0 and rows[("dslash", "1x1x1x1")]["copy_ratio"] > 0
    assert rows[("none", "1x1x1x1")]["time_per_iter_us"] > 0
    assert rows[("rma", "2x1x1x1")]["time_per_iter_us"] > 0 and 0 <= rows[("rma", "2x1x1x1")]["halo_wait_share"] < 1
    for key in (("none", "1x1x1x1"), ("rma", "2x1x1x1")):
        row = rows[key]
        split = [row[f"{p}_us"] for p in ("dslash", "halo", "reduction", "vector")]
        assert split[0] > 0 and split[2] > 0 and split[3] > 0 and row["split_clock"] == "host"
        # the phases cut the marked loops' timeline: they add up to it (up to the loop's own bookkeeping)
        assert 0.8 * row["timed_iter_us"] <= sum(split) <= 1.01 * row["timed_iter_us"], row
    assert rows[("rma", "2x1x1x1")]["halo_us"] > 0 and rows[("none", "1x1x1x1")]["halo_us"] == 0
    assert "needs the cuda back-end" in rows[("nccl", "2x1x1x1")]["skipped"]
