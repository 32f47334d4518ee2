"""The distributed 2-D FFT (circuslink.apps.fft, circuslink fft2) against numpy.fft.

One job per rank count (1, 2, 3, 4) runs every case whose dimensions that count divides:
square and rectangular shapes, powers of two and not, forward and inverse, complex64 and
complex128, natural and transposed layouts, both schemes (transposing puts, local transpose +
puts). Errors are measured in the max norm relative to the output's max, against numpy's
fft2 / ifft2 in float64: 1e-4 for complex64, 1e-10 for complex128. Then the command line round
trip through .npy files, and every bad input's one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import BACKENDS

import circuslink as cl
from circuslink.apps import fft

CASES = """
import os
import numpy as np
import circuslink as cl
from circuslink.apps import fft

world = cl.init()
R, me = world.size, world.rank
xp = world.xp
SEED = int(os.environ["CIRCUSLINK_TEST_SEED"])
TOL = {{"complex64": 1e-4, "complex128": 1e-10}}
SHAPES = [s for s in {shapes} if s[0] % R == 0 and s[1] % R == 0]
checked = 0
for shape in SHAPES:
    g = np.random.default_rng([SEED, *shape])
    x = g.standard_normal(shape) + 1j * g.standard_normal(shape)
    for dtype in ("complex64", "complex128"):
        xd = x.astype(dtype)
        for inverse in (False, True):
            ref = np.fft.ifft2(xd.astype(np.complex128)) if inverse else np.fft.fft2(xd.astype(np.complex128))
            for layout in fft.LAYOUTS:
                want = ref if layout == "natural" else ref.T
                for scheme in {schemes}:
                    with fft.Plan(world, shape, dtype, inverse, layout, scheme) as plan:
                        for rep in range(2):  # a plan runs many times: the second run must agree too
                            plan.input[...] = xp.asarray(xd[plan.rows])
                            out = plan.execute(profile=rep == 1)
                            got = out.get() if hasattr(out, "get") else out
                            assert got.dtype == np.dtype(dtype), got.dtype
                            err = np.abs(got - want[plan.out_rows]).max() / np.abs(want).max()
                            assert err < TOL[dtype], (shape, dtype, inverse, layout, scheme, rep, err)
                        checked += 1
    # One-shot calls, and the round trip through the transposed layout (fft2(x.T) == fft2(x).T).
    mine = xp.asarray(x[me * (shape[0] // R): (me + 1) * (shape[0] // R)])
    y = fft.fft2(world, mine)
    back = fft.ifft2(world, y)
    assert float(abs(back - mine).max()) < 1e-10 * float(abs(mine).max())
    yt = fft.fft2(world, mine, layout="transposed")
    back = fft.ifft2(world, yt, layout="transposed")
    assert back.shape == mine.shape and float(abs(back - mine).max()) < 1e-10 * float(abs(mine).max())
print(f"rank {{me}} checked {{checked}} plans")
world.close()
"""
SHAPES = [(12, 12), (8, 20), (24, 18), (16, 64), (30, 12)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fft2_matches_numpy(spmd, n):
    code = CASES.format(shapes=SHAPES, schemes=list(fft.SCHEMES))
    job = spmd(n, code, timeout=240).check()
    assert job.output.count("checked") == n and " checked 0 plans" not in job.output, job.output


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 4])
def test_fft2_matches_numpy_on_gpu(spmd, n):
    shapes = SHAPES + [(256, 512), (1000, 1000), (2048, 2048)]
    job = spmd(n, CASES.format(shapes=shapes, schemes=list(fft.SCHEMES)), backend="cuda", timeout=300).check()
    assert job.output.count("checked") == n, job.output


# -- the command line ---------------------------------------------------------------------------
def _cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "circuslink", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [
    ("complex128", (12, 20), 2, ["--scheme", "local-transpose"], False, False),
    ("complex64", (18, 30), 3, ["--inverse", "--layout", "transposed"], True, True),
])
def test_cli_round_trip(tmp_path, rng, backend, case):
    dtype, shape, n, flags, inverse, transposed = case
    x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype == "complex64":  # a big-endian, Fortran-ordered file reads the same
        x = np.asfortranarray(x.astype(">c8"))
    np.save(tmp_path / "x.npy", x)
    proc = _cli("fft2", "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "-n", str(n),
                "--backend", backend, *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrote" in proc.stdout
    y = np.load(tmp_path / "y.npy")
    want = np.fft.ifft2(x.astype(np.complex128)) if inverse else np.fft.fft2(x.astype(np.complex128))
    if transposed:
        want = want.T
    assert y.dtype == np.dtype(dtype).newbyteorder("=") and y.shape == want.shape
    tol = 1e-4 if dtype == "complex64" else 1e-10
    assert np.abs(y - want).max() / np.abs(want).max() < tol


def _bad_inputs(tmp_path):
    np.save(tmp_path / "real.npy", np.ones((4, 4)))
    np.save(tmp_path / "ints.npy", np.ones((4, 4), dtype=np.int32))
    np.save(tmp_path / "long.npy", np.ones((4, 4), dtype=np.clongdouble))
    np.save(tmp_path / "cube.npy", np.ones((2, 2, 2), dtype=np.complex64))
    np.save(tmp_path / "line.npy", np.ones(8, dtype=np.complex64))
    np.save(tmp_path / "odd.npy", np.ones((6, 10), dtype=np.complex64))
    np.save(tmp_path / "empty.npy", np.ones((0, 4), dtype=np.complex64))
    np.savez(tmp_path / "arch.npz", a=np.ones((4, 4), dtype=np.complex64))
    (tmp_path / "text.npy").write_text("not numpy\n")
    np.save(tmp_path / "ok.npy", np.ones((4, 4), dtype=np.complex64))


BAD = [
    (["--input", "{d}/missing.npy", "--output", "{d}/y.npy"], r"input file '.*missing.npy' does not exist"),
    (["--input", "{d}/real.npy", "--output", "{d}/y.npy"],
     r"real.npy has dtype float64, not complex: pass a complex64 or complex128 array"),
    (["--input", "{d}/ints.npy", "--output", "{d}/y.npy"], r"has dtype int32, not complex"),
    (["--input", "{d}/long.npy", "--output", "{d}/y.npy"],
     r"has dtype complex\d+, which fft2 does not support: pass complex64 or complex128"),
    (["--input", "{d}/cube.npy", "--output", "{d}/y.npy"], r"cube.npy is 3-D \(shape \(2, 2, 2\)\): fft2 takes a 2-D"),
    (["--input", "{d}/line.npy", "--output", "{d}/y.npy"], r"line.npy is 1-D \(shape \(8,\)\)"),
    (["--input", "{d}/odd.npy", "--output", "{d}/y.npy", "-n", "3"],
     r"6 x 10 cannot be split over 3 ranks: 10 columns are not divisible by 3"),
    (["--input", "{d}/odd.npy", "--output", "{d}/y.npy", "-n", "4"], r"6 rows are not divisible by 4"),
    (["--input", "{d}/empty.npy", "--output", "{d}/y.npy"], r"shape \(0, 4\): both dimensions must be positive"),
    (["--input", "{d}/arch.npz", "--output", "{d}/y.npy"], r"is an .npz archive: pass one array in a .npy file"),
    (["--input", "{d}/text.npy", "--output", "{d}/y.npy"], r"is not a .npy file"),
    (["--input", "{d}/ok.npy", "--output", "{d}/nodir/y.npy"], r"directory '.*nodir' does not exist"),
    (["--input", "{d}/ok.npy"], r"give --input X.npy and --output Y.npy"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[m[:30] for _, m in BAD])
def test_cli_bad_input_is_one_line(tmp_path, argv, message):
    _bad_inputs(tmp_path)
    proc = _cli("fft2", *[a.format(d=tmp_path) for a in argv], "--backend", "cpu", timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("circuslink: error: fft2"), proc.stderr
    import re

    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "y.npy").exists()


BENCH_BAD = [
    (["--size", "1000", "-n", "3"], r"1000 x 1000 cannot be split over 3 ranks"),
    (["--size", "1048576"], r"needs about [\d.]+ GiB of .*, but only [\d.]+ GiB is free"),
]


@pytest.mark.parametrize("argv, message", BENCH_BAD, ids=[m[:30] for _, m in BENCH_BAD])
def test_bench_bad_size_is_one_line(argv, message):
    import re

    proc = _cli("bench", "fft", *argv, "--backend", "cpu", timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("circuslink: error: bench fft: "), proc.stderr
    assert re.search(message, lines[0]), lines[0]


# -- the Python API's refusals (in this process: a world of one rank) ----------------------------
@pytest.fixture(scope="module")
def world():
    return cl.init(backend="cpu")


def test_too_large_is_refused_before_allocating(world):
    before = len(world.resources())
    with pytest.raises(cl.ConfigError, match=r"fft2: a 1048576 x 1048576 complex128 problem over 1 ranks needs "
                                             r"about [\d.]+ GiB per rank, .* but only [\d.]+ GiB is free"):
        fft.Plan(world, (1 << 20, 1 << 20), "complex128")
    assert len(world.resources()) == before


@pytest.mark.parametrize("call, message", [
    (lambda w: fft.fft2(w, np.ones(8, dtype=np.complex64)), r"the local slab is 1-D"),
    (lambda w: fft.fft2(w, np.ones((4, 4))), r"the local slab has dtype float64, not complex"),
    (lambda w: fft.Plan(w, (4, 4), "float32"), r"dtype has dtype float32, not complex"),
    (lambda w: fft.Plan(w, (4, 4), "complex64", layout="diagonal"), r"layout='diagonal' must be one of natural"),
    (lambda w: fft.Plan(w, (4, 4), "complex64", scheme="alltoall"), r"scheme='alltoall' must be one of"),
    (lambda w: fft.Plan(w, (4, 4, 4), "complex64"), r"the array is 3-D"),
    (lambda w: fft.check_shape((8, 10), 4, "fft2: x"), r"8 x 10 cannot be split over 4 ranks: 10 columns"),
])
def test_api_bad_input(world, call, message):
    with pytest.raises(cl.ConfigError, match=message) as info:
        call(world)
    assert "\n" not in str(info.value)


def test_plan_runs_many_times_and_closes(world, rng):
    x = (rng.standard_normal((16, 8)) + 1j * rng.standard_normal((16, 8))).astype(np.complex128)
    plan = fft.Plan(world, x.shape, "complex128")
    for _ in range(3):
        plan.input[...] = x
        assert np.allclose(plan.execute(), np.fft.fft2(x), rtol=0, atol=1e-12 * np.abs(np.fft.fft2(x)).max())
    plan.execute(profile=True)
    assert set(plan.timings) == {"fft", "transpose", "comm", "total"} and plan.timings["transpose"] == 0.0
    assert plan.flops == pytest.approx(5 * 128 * 7)
    plan.close()
    with pytest.raises(cl.ConfigError, match="this fft2 plan is closed"):
        plan.execute()


# -- the benchmarks (smoke: quick, cpu) ------------------------------------------------------------
def test_bench_fft_quick(tmp_path):
    out = tmp_path / "fft.json"
    proc = _cli("bench", "fft", "--quick", "-n", "2", "--backend", "cpu", "--json", str(out), "--plot",
                str(tmp_path / "fft.png"), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    impls = {r["impl"] for r in res["rows"]}
    assert impls == {"transpose-put", "local-transpose", "fft2-1rank"}
    for r in res["rows"]:
        assert r["gflops"] > 0 and r["time_ms"] > 0
        if r["impl"] != "fft2-1rank":
            assert r["max_rel_err"] < 1e-4 and r["fft_ms"] > 0 and r["comm_ms"] > 0
    assert res["floor"]["pairs"] and (tmp_path / "fft.png").exists() and not list(tmp_path.glob("fft-*"))
    assert "GFLOP" not in proc.stderr and "transpose-put" in proc.stdout
