"""The Wilson operator and solver on the cuda back-end (the device machine: one GPU, ranks under MPS).

The GPU operator against the numpy reference on random Haar fields, single and double, on 1, 2 and 4 ranks
and for every halo exchange that the machine has: rma (host-driven), rma-device (the dslash kernel drives
the queue), mpi-p2p and mpi-rma (under mpirun, host-staged), nvshmem (skipped with its reason when it
cannot be had), nccl (two GPUs). Each job also solves with single-precision CG passes and checks the
solution's residual under the reference operator.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from test_qcd_solver import DECOMPOSED, DIMS, KAPPA

pytestmark = pytest.mark.gpu

ONE_RANK = """
import os
import numpy as np
import cupy as cp
import circuslink as cl
from circuslink.apps import qcd

seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
world = cl.init("cuda")
for dims in [(4, 4, 4, 4), (8, 4, 6, 8)]:
    U = qcd.random_gauge(dims, seed)
    psi = qcd.random_spinor(dims, seed + 1)
    lat = qcd.Lattice(dims, (1, 1, 1, 1), 0)
    # the one-rank reference itself runs on CuPy arrays too
    ref_gpu = qcd.wilson(cp.asarray(U), cp.asarray(psi), 0.13).get()
    assert np.abs(ref_gpu - qcd.wilson(U, psi, 0.13)).max() < 1e-13
    for prec, tol in (("double", 1e-13), ("single", 2e-5)):
        op = qcd.WilsonOperator(world, lat, U, 0.13, prec)
        for dagger in (False, True):
            got = op.apply(psi, dagger).get()
            err = np.abs(got - qcd.wilson(U, psi, 0.13, dagger)).max()
            assert err < tol, (dims, prec, dagger, err)
        op.close()
    op = qcd.WilsonOperator(world, lat, U, 0.13)
    single = qcd.WilsonOperator(world, lat, U, 0.13, "single")
    res = qcd.solve(op, psi, tol=1e-10, niter=1000, sloppy=single)
    x = res.x.get()
    true = np.linalg.norm(psi - qcd.wilson(U, x, 0.13)) / np.linalg.norm(psi)
    assert res.converged and true < 1e-10, (res, true)
print("ok one rank")
world.close()
"""


def test_one_rank_gpu_operator_and_solver(spmd):
    job = spmd(1, ONE_RANK, backend="cuda", timeout=300).check()
    assert "ok one rank" in job.output


@pytest.mark.parametrize("grid, halo", [
    ((2, 1, 1, 1), "rma"),
    ((1, 1, 1, 2), "rma-device"),
    ((2, 2, 1, 1), "rma"),
    ((2, 2, 1, 1), "rma-device"),
    ((1, 1, 1, 4), "rma"),
    ((1, 2, 1, 2), "rma-device"),
])
def test_decomposed_gpu_operator_matches_reference(spmd, grid, halo):
    n = int(np.prod(grid))
    job = spmd(n, DECOMPOSED.format(grid=grid, dims=DIMS, kappa=KAPPA, halo=halo), backend="cuda", timeout=300)
    job.check()
    assert f"ok grid {grid}" in job.output


@pytest.mark.mpi
@pytest.mark.parametrize("halo", ["mpi-p2p", "mpi-rma"])
def test_mpi_halo_exchanges_on_gpu(spmd, halo):
    job = spmd(4, DECOMPOSED.format(grid=(2, 2, 1, 1), dims=DIMS, kappa=KAPPA, halo=halo), backend="cuda",
               launcher="mpirun", timeout=300).check()
    assert "ok grid (2, 2, 1, 1)" in job.output


@pytest.mark.timeout(600)  # the first call builds the NVSHMEM shared library with nvcc
def test_nvshmem_halo_exchange(spmd):
    code = DECOMPOSED.format(grid=(2, 2, 1, 1), dims=DIMS, kappa=KAPPA, halo="nvshmem")
    job = spmd(4, code, backend="cuda", timeout=600)
    if job.returncode != 0 and "--halo nvshmem is unavailable" in job.output:
        line = next(ln for ln in job.output.splitlines() if "--halo nvshmem is unavailable" in ln)
        pytest.skip(line.strip())
    job.check()
    assert "ok grid (2, 2, 1, 1)" in job.output


@pytest.mark.two_gpus
def test_nccl_halo_exchange(spmd):
    job = spmd(2, DECOMPOSED.format(grid=(2, 1, 1, 1), dims=DIMS, kappa=KAPPA, halo="nccl"), backend="cuda",
               timeout=300).check()
    assert "ok grid (2, 1, 1, 1)" in job.output


def test_nccl_refuses_ranks_sharing_a_gpu(spmd):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() > 1:
        pytest.skip("two GPUs: the ranks do not share one")
    code = """
import circuslink as cl
from circuslink.apps import qcd
world = cl.init("cuda")
lat = qcd.Lattice((4, 4, 4, 4), (2, 1, 1, 1), world.rank)
try:
    qcd.WilsonOperator(world, lat, qcd.unit_gauge((4, 4, 4, 4)), 0.1, halo="nccl")
except cl.ConfigError as exc:
    print("refused:", exc)
world.close()
"""
    job = spmd(2, code, backend="cuda").check()
    assert "NCCL refuses two ranks on one GPU" in job.output


@pytest.mark.parametrize("prec", ["double", "single"])
def test_cli_invert_and_apply_on_gpu(tmp_path, seed, prec):
    from circuslink.apps import qcd

    U = qcd.random_gauge((8, 8, 4, 4), seed)
    psi = qcd.random_spinor((8, 8, 4, 4), seed + 1)
    np.save(tmp_path / "U.npy", U)
    np.save(tmp_path / "psi.npy", psi)
    env = dict(os.environ, CIRCUSLINK_BACKEND="cuda")
    run = lambda *a: subprocess.run([sys.executable, "-m", "circuslink", "qcd", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=tmp_path, env=env, timeout=300)
    proc = run("apply", "--gauge", "U.npy", "--input", "psi.npy", "--kappa", "0.12", "--grid", "2", "2", "1", "1",
               "--prec", prec, "--output", "out.npy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tol = 1e-13 if prec == "double" else 2e-5
    assert np.abs(np.load(tmp_path / "out.npy") - qcd.wilson(U, psi, 0.12)).max() < tol
    proc = run("invert", "--gauge", "U.npy", "--source", "psi.npy", "--kappa", "0.12", "--grid", "2", "2", "1", "1",
               "--prec", prec, "--tol", "1e-9", "--verify", "--output", "x.npy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "back-end cuda" in proc.stdout and "(ok)" in proc.stdout
    x = np.load(tmp_path / "x.npy")
    assert np.linalg.norm(psi - qcd.wilson(U, x, 0.12)) / np.linalg.norm(psi) <= 1e-9


@pytest.mark.timeout(600)
def test_same_solution_on_every_grid_gpu(spmd, tmp_path):
    """The target's decompositions, 8 ranks sharing the GPU for 4x2x1x1 (local 2x2x4x4)."""
    dims = (8, 4, 4, 4)
    solutions = {}
    for grid in [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 1, 1), (4, 2, 1, 1)]:
        code = DECOMPOSED.format(grid=grid, dims=dims, kappa=KAPPA, halo="rma")
        spmd(int(np.prod(grid)), code, backend="cuda", timeout=600).check()
        solutions[grid] = np.load(tmp_path / "x.npy")
    first = solutions[(1, 1, 1, 1)]
    for grid, x in solutions.items():
        assert np.linalg.norm(x - first) / np.linalg.norm(first) < 1e-8, grid
