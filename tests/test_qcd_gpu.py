"""The Wilson operator and solver on the cuda back-end (the device machine: one GPU, ranks under MPS).

The GPU operator against the numpy reference on random Haar fields, single and double, on 1, 2 and 4 ranks
and for every halo exchange that the machine has: rma (host-driven), rma-device (the dslash kernel drives
the queue), mpi-p2p and mpi-rma (under mpirun, host-staged), nvshmem (skipped with its reason when it
cannot be had), nccl (two GPUs). Each job also solves with double, single and (emulated) half sloppy
precision and with the device-resident CG (one resident kernel per batch on one rank and with rma-device), and
checks every solution's residual under the reference operator; the device-resident CG is also compared with
the cpu back-end's solver on the same fields.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from test_qcd_solver import _FIELDS, DECOMPOSED, DIMS, KAPPA

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # solves: the tests-slow stage of scripts/gpu-check.sh

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
    job.check()  # NVSHMEM is part of the GPU machine's image: unavailable there is a failure, not a skip
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


@pytest.mark.parametrize("prec", ["double", "single", "half"])
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
    tol = {"double": 1e-13, "single": 2e-5, "half": 2e-3}[prec]
    cg = "host" if prec == "half" else "device"  # the device-resident CG runs double and single
    assert np.abs(np.load(tmp_path / "out.npy") - qcd.wilson(U, psi, 0.12)).max() < tol
    proc = run("invert", "--load-gauge", "U.npy", "--source", "psi.npy", "--kappa", "0.12", "--gridsize", "2", "2",
               "1", "1", "--prec-sloppy", prec, "--tol", "1e-9", "--verify", "--output", "x.npy", "--cg", cg,
               "--halo", "rma-device", "--json", "row.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loop = "device resident" if cg == "device" else "host"
    assert "back-end cuda" in proc.stdout and "(ok)" in proc.stdout and f"CG loop {loop}," in proc.stdout
    row = json.loads((tmp_path / "row.json").read_text())["rows"][0]
    assert row["cg"] == loop and row["true_residual"] <= 1e-9
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
        for name in ("double", "single", "half", "double-device", "single-device"):
            solutions[grid, name] = np.load(tmp_path / f"x_{name}.npy")
    first = solutions[(1, 1, 1, 1), "double"]
    for key, x in solutions.items():
        assert np.linalg.norm(x - first) / np.linalg.norm(first) < 1e-8, key


DEVICE_CG = """
import os
import numpy as np
import circuslink as cl
from circuslink.apps import qcd

seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
GRID, HALO, EVERY, SLOPPY, TAG = {grid!r}, {halo!r}, {every!r}, {sloppy!r}, {tag!r}
DIMS = (8, 8, 4, 4)
world = cl.init()
U = qcd.random_gauge(DIMS, seed) if world.rank == 0 else None
b = qcd.random_spinor(DIMS, seed + 1) if world.rank == 0 else None
local = tuple(d // g for d, g in zip(DIMS, GRID))
lat = qcd.Lattice(local, GRID, world.rank)
U_local = qcd.scatter(world, lat, U, qcd.gauge_shape(local), lead=1)
b_local = qcd.scatter(world, lat, b, qcd.spinor_shape(local))
op = qcd.WilsonOperator(world, lat, U_local, 0.2, halo=HALO)
sloppy = qcd.WilsonOperator(world, lat, U_local, 0.2, SLOPPY, halo=HALO) if SLOPPY != "double" else None
res = qcd.solve(op, world.xp.asarray(b_local), tol=1e-10, niter=2000, sloppy=sloppy, check_every=EVERY)
x = qcd.gather(world, lat, res.x, qcd.spinor_shape(DIMS))
if world.rank == 0:
    true = np.linalg.norm(b - qcd.wilson(U, x, 0.2)) / np.linalg.norm(b)
    assert res.converged and true <= 1e-10, (res.loop, res.iterations, true)
    np.save(f"x_{{TAG}}.npy", x)
    print(f"ok {{TAG}}: loop {{res.loop}}, {{res.iterations}} iterations, {{res.reliable_updates}} reliable updates, "
          f"made by the kernel {{res.device_updates}}, true residual {{true:.2e}}, "
          f"{{res.seconds / max(res.iterations, 1) * 1e6:.0f}} us per iteration, stages {{res.stage_seconds}}")
world.close()
"""


@pytest.mark.parametrize("grid, halo", [((1, 1, 1, 1), "rma"), ((2, 1, 1, 1), "rma-device"), ((2, 2, 1, 1), "rma"),
                                        ((2, 2, 1, 1), "rma-device")])
@pytest.mark.parametrize("sloppy", ["double", "single"])
def test_device_resident_cg_agrees_with_the_cpu_solver(spmd, tmp_path, grid, halo, sloppy):
    """The device-resident CG on the GPU (one resident kernel per batch on one rank and with rma-device; a launch
    per step with the host's rma exchange) against the host-driven CG of the cpu back-end on the same fields. On
    2x2x1x1 with rma-device every rank's queue has two targets, and the sums over ranks four parts."""
    n = int(np.prod(grid))
    spmd(n, DEVICE_CG.format(grid=grid, halo="rma", every=None, sloppy=sloppy, tag="cpu"), backend="cpu",
         timeout=300).check()
    job = spmd(n, DEVICE_CG.format(grid=grid, halo=halo, every=10, sloppy=sloppy, tag="gpu"), backend="cuda",
               timeout=300).check()
    loop = "device resident" if halo == "rma-device" or n == 1 else "device"
    assert f"ok gpu: loop {loop}," in job.output, job.output
    # single iterations, double updates: the resident kernel makes the reliable updates itself
    inside = loop == "device resident" and sloppy == "single"
    assert f"made by the kernel {inside}," in job.output, job.output
    cpu, gpu = np.load(tmp_path / "x_cpu.npy"), np.load(tmp_path / "x_gpu.npy")
    assert np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu) < 1e-8


_COPIED = {"CIRCUSLINK_QCD_DIRECT_FACES": "0"}  # the faces copied by the RMA queue, not written by the hops
_FACE_FORMS = {  # the resident CG's opt-in forms of a hop's faces and sums
    "copy": _COPIED,
    "two-pass": {"CIRCUSLINK_QCD_ONE_PASS": "0"},
    "team": {**_COPIED, "CIRCUSLINK_QCD_FACE_BLOCKS": "3", "CIRCUSLINK_DEVICE_DEFINES": "CIRCUSLINK_QCD_SUM_LANES=32"},
    "grid": {**_COPIED, "CIRCUSLINK_DEVICE_DEFINES": "CIRCUSLINK_QCD_FACE_GRID=1"},
}


@pytest.mark.parametrize("grid, sloppy, form", [
    ((2, 1, 1, 1), "double", "copy"), ((2, 2, 1, 1), "single", "copy"), ((2, 2, 1, 1), "double", "two-pass"),
    ((2, 1, 1, 1), "single", "two-pass"),
    ((2, 1, 1, 1), "double", "team"), ((2, 1, 1, 1), "single", "team"), ((2, 2, 1, 1), "double", "team"),
    ((2, 2, 1, 1), "single", "team"), ((2, 1, 1, 1), "single", "grid"), ((2, 2, 1, 1), "double", "grid"),
])
def test_device_resident_cg_with_a_face_team_and_lane_sums_agrees(spmd, tmp_path, grid, sloppy, form):
    """The resident CG's other forms against the host-driven CG of the cpu back-end on the same fields (the
    default, faces written straight into the neighbours' ghosts, is test_device_resident_cg_agrees_with_the_cpu_
    solver's). copy: the RMA queue copies each hop's faces from the send array (CIRCUSLINK_QCD_DIRECT_FACES=0).
    two-pass: direct faces, each hop the interior, a grid barrier and the exterior (CIRCUSLINK_QCD_ONE_PASS=0).
    team: ... with 3 blocks (rma_start_team; the others take the interior, block 0 waits with rma_wait_epoch)
    and the sums over ranks take a lane a rank (CIRCUSLINK_QCD_SUM_LANES=32). grid: every block copies its share of
    the faces before its interior (rma_start_grid, CIRCUSLINK_QCD_FACE_GRID=1)."""
    n = int(np.prod(grid))
    spmd(n, DEVICE_CG.format(grid=grid, halo="rma", every=None, sloppy=sloppy, tag="cpu"), backend="cpu",
         timeout=300).check()
    env = _FACE_FORMS[form]
    job = spmd(n, DEVICE_CG.format(grid=grid, halo="rma-device", every=10, sloppy=sloppy, tag="gpu"), backend="cuda",
               timeout=300, env=env).check()
    assert "ok gpu: loop device resident," in job.output, job.output
    cpu, gpu = np.load(tmp_path / "x_cpu.npy"), np.load(tmp_path / "x_gpu.npy")
    assert np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu) < 1e-8


# A first launch that waits on the GPU for its peers meets them on the host first: rank 1 comes 3 s late, and rank
# 0's first launch (asynchronous otherwise) returns only once it has; later launches return at once.
_LATE_PEER = """
import os, time
import numpy as np
import circuslink as cl
from circuslink.apps import qcd
from circuslink.apps.qcd import _cgstate as cg
from circuslink.apps.qcd._lattice import local_from_global
from circuslink.apps.qcd._solver import _BatchedIterations

seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
GRID, DIMS = (2, 1, 1, 1), (8, 8, 8, 8)
world = cl.init("cuda")
""" + _FIELDS + """
op = qcd.WilsonOperator(world, lat, U_local, 0.13, "single", halo="rma-device")
b_e, b_o = op.split(b_local)


def meets_once(launch, what):
    op.synchronize()
    world.barrier()
    LATE = 3.0
    if world.rank == 1:
        time.sleep(LATE)  # a peer still setting up
    t0 = time.perf_counter()
    launch()
    took = time.perf_counter() - t0
    op.synchronize()
    if world.rank == 0:
        assert took > 0.8 * LATE, f"rank 0's first {what} launched in {took:.3f} s: it did not meet rank 1"
    t0 = time.perf_counter()
    launch()
    took = time.perf_counter() - t0
    op.synchronize()
    assert took < 0.5, f"rank {world.rank}: a later {what} took {took:.3f} s to launch"
"""

FIRST_HOP_MEETS = _LATE_PEER + """
out = op.zeros()
op.pack(b_o, 1, False)
meets_once(lambda: op.hop(out, b_o, 0, False), "device-driven hop")
print(f"ok rank {world.rank}")
world.close()
"""

# The resident CG of 2 ranks, restarted from b (the source's even half), not yet launched.
_RESIDENT_CG = _LATE_PEER + """
x, r, p, ap = op.zeros(), op.zeros(), op.zeros(), op.zeros()
r[...] = b_e
p[...] = b_e
op.pack(p, 0, False)
it = _BatchedIterations(op, x, r, p, ap, 0.0, 10, timed=False)
assert it.resident is not None, "rma-device on 2 ranks: the resident CG"
book = np.zeros(cg.SLOTS)
it.restart(op.norm2(r), 0.0, book)
"""

FIRST_RESIDENT_MEETS = _RESIDENT_CG + """
meets_once(lambda: it.resident.run(5), "resident CG")
values = op.d.read_state(it.state)  # raises where the kernel timed out or failed
assert values[cg.ITERATIONS] > 0, values  # the kernel ran its iterations (10 unless the CG froze)
print(f"ok rank {world.rank}")
world.close()
"""

STALLED_PEER = _RESIDENT_CG + """
it.resident.run(5)  # the first launch meets the peer
op.d.read_state(it.state)
world.barrier()
if world.rank == 1:
    time.sleep(25)  # stops taking part: rank 0's next launch waits on the GPU for faces that never come
    os._exit(0)
t0 = time.perf_counter()
it.resident.run(5)
try:
    op.d.read_state(it.state)
except Exception as e:
    print(f"rank 0 raised after {time.perf_counter() - t0:.1f} s: {e}", flush=True)
    os._exit(0)
raise SystemExit("rank 0: the resident CG went on without its peer")
"""


def test_a_stalled_resident_cg_names_what_it_waited_for(spmd):
    """Rank 1 stops taking part after the first launch: rank 0's kernel waits on the GPU for its faces, gives up
    after CIRCUSLINK_TIMEOUT and records why; the host, waiting longer (Deadline.behind_device), raises that
    record, which names the halo and the rank, not only "its kernels did not finish"."""
    job = spmd(2, STALLED_PEER, backend="cuda", timeout=120, env={"CIRCUSLINK_TIMEOUT": "4"})
    line = next((ln for ln in job.output.splitlines() if "rank 0 raised after" in ln), None)
    assert line is not None, job.output
    assert "did not finish" not in line and "timed out" in line, line
    # the peer: "... waiting for the post of target rank(s) 1" (its queue) or "... waiting for rank 1's part" (a sum)
    assert re.search(r"rank(\(s\))? 1\b", line), line


def test_the_first_device_driven_hop_meets_the_peers_first(spmd):
    """A device-driven hop waits on the GPU for its peers' faces; its first launch meets the peers on the host
    first, so no rank's hop waits on the GPU while a peer still sets up (at 32^4 on 2x2x1x1 ranks under MPS such
    a peer's setup did not return, and the job stalled until the time-out)."""
    job = spmd(2, FIRST_HOP_MEETS, backend="cuda", timeout=120).check()
    assert "ok rank 0" in job.output and "ok rank 1" in job.output, job.output


def test_the_first_resident_cg_launch_meets_the_peers_first(spmd):
    """The device-resident CG waits on the GPU for its peers' faces and sums; its first launch meets the peers on
    the host first, as the first device-driven hop does (a late rank; fails where the launch returns at once)."""
    job = spmd(2, FIRST_RESIDENT_MEETS, backend="cuda", timeout=120).check()
    assert "ok rank 0" in job.output and "ok rank 1" in job.output, job.output
