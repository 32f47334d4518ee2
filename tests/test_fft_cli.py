"""``circuslink fft2`` and ``circuslink fft3`` on .npy files against numpy.fft, and their one-line refusals.

Shapes are random (from the test's seed; uneven over the ranks, some with fewer indices than ranks), the
input in C or Fortran order and either byte order; every transform kind (fftn, ifftn, rfftn, irfftn), both
layouts and both decompositions of 3-D arrays. Y must equal numpy's result within 1e-5 (single
precision) or 1e-12 (double) in the max norm relative to its max.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest


def _cli(*args: str, cwd=None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "circuslink", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)


def _reference(x: np.ndarray, kind: str, last: int | None, scale: str | None) -> np.ndarray:
    wide = x.astype(np.float64 if kind == "r2c" else np.complex128)
    default = "backward"
    norm = {None: default, "none": "backward", "full": "forward", "symmetric": "ortho"}[scale]
    if kind in ("inverse", "c2r"):  # numpy's inverse norms count the other way round
        norm = {None: "backward", "none": "forward", "full": "backward", "symmetric": "ortho"}[scale]
    axes = tuple(range(x.ndim))
    if kind == "forward":
        return np.fft.fftn(wide, axes=axes, norm=norm)
    if kind == "inverse":
        return np.fft.ifftn(wide, axes=axes, norm=norm)
    if kind == "r2c":
        return np.fft.rfftn(wide, axes=axes, norm=norm)
    s = x.shape[:-1] + (last if last is not None else 2 * (x.shape[-1] - 1),)
    return np.fft.irfftn(wide, s=s, axes=axes, norm=norm)


def _input(rng, shape, kind, dtype) -> np.ndarray:
    x = rng.standard_normal(shape)
    if kind not in ("r2c",) and dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    x = x.astype(dtype)
    if rng.random() < 0.3:  # another byte order and Fortran order read the same
        x = np.asfortranarray(x.astype(x.dtype.newbyteorder(">")))
    return x


def _run_case(tmp_path, rng, ndim, nranks, kind, layout, extra, backend="cpu"):
    shape = tuple(int(n) for n in rng.integers(1, 12 if ndim == 3 else 30, ndim))
    if kind == "c2r":
        shape = shape[:-1] + (max(2, shape[-1]),)
    dtype = str(rng.choice(["float32", "float64"] if kind == "r2c" else ["complex64", "complex128"]))
    x = _input(rng, shape, kind, dtype)
    np.save(tmp_path / "x.npy", x)
    flags = {"forward": [], "inverse": ["--inverse"], "r2c": ["--r2c"], "c2r": ["--c2r"]}[kind]
    last = None
    if kind == "c2r" and rng.random() < 0.5:
        last = 2 * shape[-1] - 1
        flags += ["--last-size", str(last)]
    scale = None if rng.random() < 0.6 else str(rng.choice(["none", "full", "symmetric"]))
    if scale:
        flags += ["--scale", scale]
    proc = _cli(f"fft{ndim}", "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"),
                "-n", str(nranks), "--backend", backend, "--layout", layout, *flags, *extra)
    what = (shape, dtype, kind, layout, flags, extra, nranks)
    assert proc.returncode == 0, f"{what}\n{proc.stdout}{proc.stderr}"
    assert "wrote" in proc.stdout, proc.stdout
    y = np.load(tmp_path / "y.npy")
    want = _reference(x, kind, last, scale)
    if layout == "transposed":
        order = (1, 0) if ndim == 2 else (2, 1, 0) if "pencil" in proc.stdout else (1, 2, 0)
        want = want.transpose(order)
    single = dtype in ("complex64", "float32")
    out_dtype = {"c2r": "float32" if single else "float64"}.get(kind, "complex64" if single else "complex128")
    assert y.dtype == np.dtype(out_dtype) and y.shape == want.shape, (what, y.dtype, y.shape, want.shape)
    err = float(np.abs(y - want).max() / max(np.abs(want).max(), 1e-300))
    assert err < (1e-5 if single else 1e-12), (what, err)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_cli_matches_numpy(tmp_path, rng, ndim, nranks):
    for kind in ("forward", "inverse", "r2c", "c2r"):
        layout = "transposed" if kind in ("forward", "inverse") and rng.random() < 0.5 else "natural"
        extra = []
        if ndim == 3 and rng.random() < 0.5:
            extra = ["--decomposition", "pencil"]
        if rng.random() < 0.3:
            extra += ["--scheme", "local-transpose"]
        _run_case(tmp_path, rng, ndim, nranks, kind, layout, extra)


@pytest.mark.timeout(240)
@pytest.mark.gpu
@pytest.mark.parametrize("ndim", [2, 3])
def test_cli_forward_matches_numpy_on_gpu(tmp_path, rng, ndim):
    """The default GPU stage's quick check: one forward fft2 and one forward fft3 at 2 ranks."""
    _run_case(tmp_path, rng, ndim, 2, "forward", "natural", [], backend="cuda")


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.gpu
@pytest.mark.parametrize("ndim", [2, 3])
def test_cli_matches_numpy_on_gpu(tmp_path, rng, ndim):
    for kind in ("inverse", "r2c", "c2r"):
        _run_case(tmp_path, rng, ndim, 2, kind, "natural", [], backend="cuda")


def test_real_and_integer_input_is_promoted_like_numpy(tmp_path, rng):
    for dtype, out in (("float32", "complex64"), ("float16", "complex64"), ("int32", "complex128"),
                       ("bool", "complex128")):
        x = (rng.standard_normal((5, 6)) * 10).astype(dtype)
        np.save(tmp_path / "x.npy", x)
        proc = _cli("fft2", "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "-n", "2",
                    "--backend", "cpu")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        y = np.load(tmp_path / "y.npy")
        want = np.fft.fft2(x)
        assert y.dtype == np.dtype(out) and want.dtype == np.dtype(out), (dtype, y.dtype, want.dtype)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()


def _bad_inputs(d):
    np.save(d / "long.npy", np.ones((4, 4), dtype=np.clongdouble))
    np.save(d / "longreal.npy", np.ones((4, 4), dtype=np.longdouble))
    np.save(d / "text.npy", np.array([["a", "b"], ["c", "d"]]))
    np.save(d / "cube.npy", np.ones((2, 2, 2), dtype=np.complex64))
    np.save(d / "line.npy", np.ones(8, dtype=np.complex64))
    np.save(d / "plane.npy", np.ones((4, 4), dtype=np.complex64))
    np.save(d / "empty.npy", np.ones((0, 4), dtype=np.complex64))
    np.save(d / "real.npy", np.ones((4, 4)))
    np.savez(d / "arch.npz", a=np.ones((4, 4), dtype=np.complex64))
    (d / "garbage.npy").write_text("not numpy\n")


BAD = [
    ("fft2", ["--input", "{d}/missing.npy"], r"fft2: input file '.*missing.npy' does not exist"),
    ("fft2", ["--input", "{d}/long.npy"], r"has dtype complex\d+, which the FFT does not support: pass complex64"),
    ("fft2", ["--input", "{d}/longreal.npy"], r"has dtype float\d+, which the FFT does not support: pass float32"),
    ("fft2", ["--input", "{d}/text.npy"], r"has dtype <U1, not a number|has dtype str"),
    ("fft2", ["--input", "{d}/cube.npy"], r"fft2: .*cube.npy is 3-D \(shape \(2, 2, 2\)\): fft2 takes a 2-D array "
                                          r"\(circuslink fft3 takes 3-D ones\)"),
    ("fft3", ["--input", "{d}/plane.npy"], r"fft3: .*plane.npy is 2-D .*: fft3 takes a 3-D array \(circuslink fft2"),
    ("fft2", ["--input", "{d}/line.npy"], r"line.npy is 1-D \(shape \(8,\)\)"),
    ("fft2", ["--input", "{d}/empty.npy"], r"has shape \(0, 4\): every axis must have at least one point"),
    ("fft2", ["--input", "{d}/arch.npz"], r"is an .npz archive: pass one array in a .npy file"),
    ("fft2", ["--input", "{d}/garbage.npy"], r"is not a .npy file"),
    ("fft2", ["--input", "{d}/plane.npy", "--r2c"], r"--r2c transforms a real array"),
    ("fft2", ["--input", "{d}/real.npy", "--c2r"], r"--c2r transforms a complex array"),
    ("fft2", ["--input", "{d}/plane.npy", "--c2r", "--last-size", "9"],
     r"a complex-to-real output with last axis 9 needs 5 input points along it, X has 4"),
    ("fft2", ["--input", "{d}/plane.npy", "--last-size", "6"], r"--last-size goes with --c2r only"),
    ("fft2", ["--input", "{d}/plane.npy", "--c2r", "--layout", "transposed"], r"--c2r writes the natural layout only"),
    ("fft3", ["--input", "{d}/cube.npy", "-n", "4", "--grid", "3x1"], r"--grid 3x1 has 3 places for 4 ranks"),
    ("fft3", ["--input", "{d}/cube.npy", "-n", "4", "--grid", "2x2", "--decomposition", "slab"],
     r"--grid goes with the pencil decomposition"),
]


@pytest.mark.parametrize("command, argv, message", BAD, ids=[m[:32] for _, _, m in BAD])
def test_cli_bad_input_is_one_line(tmp_path, command, argv, message):
    _bad_inputs(tmp_path)
    args = [a.format(d=tmp_path) for a in argv]
    if "--output" not in args:
        args += ["--output", str(tmp_path / "y.npy")]
    proc = _cli(command, *args, "--backend", "cpu", timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"circuslink: error: {command}"), proc.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("argv", [["--input", "x.npy"], ["--output", "y.npy"]])
def test_cli_needs_both_files(argv):
    proc = _cli("fft3", *argv, "--backend", "cpu", timeout=60)
    assert proc.returncode == 1 and "give --input X.npy and --output Y.npy" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["fft2", "fft3"])
@pytest.mark.parametrize("where, message", [("nodir/y.npy", r"folder '.*nodir' does not exist \(it is not created\)"),
                                            (".", r"is a folder, not a file")])
def test_cli_output_is_checked_when_the_command_line_is_read(tmp_path, command, where, message):
    """The one output rule: --output's folder must exist (never created) and the path must not be a folder."""
    np.save(tmp_path / "x.npy", np.ones((4, 4, 4), dtype=np.complex64))
    target = str(tmp_path / where)
    proc = _cli(command, "--input", str(tmp_path / "x.npy"), "--output", target, "--backend", "cpu", timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "--output" in errors[0] and re.search(message, errors[0]), proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]


def test_cli_usage_errors_exit_2():
    proc = _cli("fft3", "--input", "x.npy", "--output", "y.npy", "--grid", "2by2", timeout=60)
    assert proc.returncode == 2 and "is not a grid P0xP1" in proc.stderr, proc.stderr
    proc = _cli("fft2", "--input", "x.npy", "--output", "y.npy", "--r2c", "--c2r", timeout=60)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr, proc.stderr
