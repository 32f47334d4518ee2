"""Even-odd preconditioning, the CG solver and the decomposition over ranks (cpu back-end).

The distributed operator is checked against the one-rank reference ``qcd.wilson`` (an independent
formulation: full 4x4 projectors, rolled arrays) on random Haar fields; the solver by the residual of its
solution under that reference; the decompositions 1x1x1x1, 2x1x1x1, 2x2x1x1 and 1x1x1x4 of one global
4x4x4x8 problem against each other.
"""

from __future__ import annotations

import numpy as np
import pytest

import circuslink as cl
from circuslink.apps import qcd
from circuslink.apps.qcd._lattice import local_from_global

KAPPA = 0.12
DIMS = (4, 4, 4, 8)


@pytest.fixture(scope="module")
def world():
    w = cl.init("cpu")
    yield w


def test_checkerboard_split_and_join_round_trip(rng):
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    psi = rng.standard_normal(qcd.spinor_shape(DIMS))
    even, odd = lat.split(psi)
    assert even.shape == (lat.half, 4, 3)
    np.testing.assert_array_equal(lat.join(even, odd), psi)
    for parity, half in ((0, even), (1, odd)):
        c = lat.site_coords(parity)
        assert np.all((c.sum(axis=0) % 2) == parity)
        np.testing.assert_array_equal(half, psi[c[3], c[2], c[1], c[0]])


def test_face_index_numbers_each_face_once():
    lat = qcd.Lattice((4, 2, 6, 4), (2, 2, 2, 2), 5)
    for parity in (0, 1):
        c = lat.site_coords(parity)
        for mu in range(4):
            for edge in (0, lat.local[mu] - 1):
                idx = lat.face_index(c[:, c[mu] == edge], mu)
                np.testing.assert_array_equal(np.sort(idx), np.arange(lat.face_sites[mu]))


def test_grid_neighbours_and_blocks():
    lat = qcd.Lattice((2, 2, 2, 2), (2, 3, 1, 2), 0)
    assert lat.nranks == 12 and lat.global_dims == (4, 6, 2, 4)
    assert lat.forward == (1, 2, 0, 6) and lat.backward == (1, 4, 0, 6)
    assert [lat.rank_of(lat.coords_of(r)) for r in range(12)] == list(range(12))
    seen = np.zeros((4, 2, 6, 4), dtype=int)  # t, z, y, x
    for r in range(12):
        seen[lat.block(r)] += 1
    assert np.all(seen == 1)
    assert lat.forward_sign == (1, 1, 1, 1.0) and lat.backward_sign == (1, 1, 1, -1.0)
    last = qcd.Lattice((2, 2, 2, 2), (2, 3, 1, 2), 11)
    assert last.forward_sign[3] == -1.0 and last.backward_sign[3] == 1.0


@pytest.mark.parametrize("grid, local, message", [
    ((4, 1, 1, 1), None, r"lattice 6x4x4x4 is not divisible by the grid 4x1x1x1 \(x: 6 % 4 = 2\)"),
    ((2, 1, 1, 1), None, r"odd extent x = 3"),
    ((1, 1, 1, 1), (4, 3, 4, 4), r"local lattice 4x3x4x4: odd extent y = 3"),
    ((0, 1, 1, 1), None, r"--grid 0x1x1x1 must be positive"),
])
def test_bad_decompositions_are_refused(grid, local, message):
    with pytest.raises(cl.ConfigError, match=message):
        if local is None:
            local_from_global((6, 4, 4, 4), grid)
        else:
            qcd.Lattice(local, grid, 0)


def test_schur_complement_is_the_even_block_of_m(world, seed):
    U = qcd.random_gauge(DIMS, seed)
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    op = qcd.WilsonOperator(world, lat, U, KAPPA)
    x_e, _ = op.split(qcd.random_spinor(DIMS, seed + 1))
    # x_o = kappa D_oe x_e makes the odd part of M x vanish and its even part M_pc x_e.
    x_o = op.zeros()
    op.pack(x_e, 0, False)
    op.hop(x_o, x_e, 1, False, b=KAPPA)
    full = qcd.wilson(U, op.join(x_e, x_o), KAPPA)
    m_e, m_o = lat.split(full)
    want = op.zeros()
    op.mpc(want, x_e, dagger=False)
    np.testing.assert_allclose(m_o, 0, atol=1e-13)
    np.testing.assert_allclose(m_e, want, atol=1e-13)
    # and M_pc^dagger is its adjoint
    y_e, _ = op.split(qcd.random_spinor(DIMS, seed + 2))
    my, mdx = op.zeros(), op.zeros()
    op.mpc(my, y_e, dagger=False)
    op.mpc(mdx, x_e, dagger=True)
    assert abs(np.vdot(x_e, my) - np.vdot(mdx, y_e)) < 1e-12 * abs(np.vdot(x_e, my))


@pytest.mark.parametrize("sloppy", ["double", "single", "half"])
def test_cg_solves_the_full_system_at_double_accuracy(world, seed, sloppy):
    U = qcd.random_gauge(DIMS, seed)
    b = qcd.random_spinor(DIMS, seed + 1)
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    precise = qcd.WilsonOperator(world, lat, U, KAPPA)
    S = qcd.WilsonOperator(world, lat, U, KAPPA, sloppy) if sloppy != "double" else None
    phases = precise.new_phases()
    res = qcd.solve(precise, b, tol=1e-10, niter=1000, sloppy=S, phases=phases)
    assert res.converged and res.true_residual <= 1e-10 and 0 < res.iterations < 1000
    reference = np.linalg.norm(b - qcd.wilson(U, res.x, KAPPA)) / np.linalg.norm(b)
    assert reference <= 1e-10 and abs(reference - res.true_residual) < 1e-12
    if sloppy != "double":
        # the sloppy precision alone stalls near 1e-7 (single) or 1e-4 (half): reliable updates carry it on
        assert res.reliable_updates >= 3
    assert set(res.phase_seconds) == {"dslash", "halo", "reduction", "vector"}
    assert res.phase_seconds["dslash"] > 0 and sum(res.phase_seconds.values()) <= res.seconds * 1.01


def test_half_precision_is_quda_fixed_point_with_a_norm_per_site(world, seed):
    """Half: every site's 24 reals are multiples of norm / 32767, norm the site's largest magnitude."""
    U = qcd.random_gauge(DIMS, seed)
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    op = qcd.WilsonOperator(world, lat, U, KAPPA, "half")
    psi = 10.0 ** np.random.default_rng(seed).uniform(-12, 3) * qcd.random_spinor(DIMS, seed + 1)
    even, odd = op.split(psi)
    out = op.zeros()
    op.pack(odd, 1, False)
    op.hop(out, odd, 0, False)
    for field in (even, out):
        reals = field.view(np.float32).reshape(lat.half, 24).astype(np.float64)
        norm = np.abs(reals).max(axis=1, keepdims=True)
        steps = reals / norm * 32767
        np.testing.assert_allclose(steps, np.rint(steps), atol=2e-3)
    only_odd = lat.join(np.zeros_like(lat.split(psi)[0]), lat.split(psi)[1])
    exact = lat.split(qcd.hopping(U, only_odd))[0]  # D_eo psi_o by the reference
    got = out.astype(np.complex128)
    assert np.abs(got - exact).max() <= 2e-4 * np.abs(exact).max()  # 4-5 digits, whatever the scale
    assert np.abs(got - exact).max() > 1e-9 * np.abs(exact).max()  # and not more: it is half, not single


def test_sloppy_more_precise_than_precise_is_refused(world):
    U = qcd.unit_gauge(DIMS)
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    single = qcd.WilsonOperator(world, lat, U, KAPPA, "single")
    double = qcd.WilsonOperator(world, lat, U, KAPPA)
    with pytest.raises(cl.ConfigError, match="--prec-sloppy double is more precise than --prec single"):
        qcd.solve(single, np.zeros(qcd.spinor_shape(DIMS), complex), 1e-5, 10, sloppy=double)


def test_cg_makes_two_global_reductions_per_iteration(world, seed):
    U = qcd.random_gauge(DIMS, seed)
    b = qcd.random_spinor(DIMS, seed + 1)
    op = qcd.WilsonOperator(world, qcd.Lattice(DIMS, (1, 1, 1, 1), 0), U, KAPPA)
    calls = []
    real = op.allreduce
    op.allreduce = lambda local, op="sum": calls.append(1) or real(local, op)
    res = qcd.solve(op, b, 1e-8, 500)
    assert res.converged and res.iterations > 5
    # |b|^2 and |rhs|^2 once; <p, Ap> and |r|^2 per iteration; |r|^2 per reliable update and |b - M x|^2 per
    # check of the full system; the slowest rank's times at the end.
    assert len(calls) == 2 + 2 * res.iterations + res.reliable_updates + len(res.history) + 1


def test_non_convergence_is_reported_not_hidden(world, seed):
    U = qcd.random_gauge(DIMS, seed)
    b = qcd.random_spinor(DIMS, seed + 1)
    op = qcd.WilsonOperator(world, qcd.Lattice(DIMS, (1, 1, 1, 1), 0), U, KAPPA)
    res = qcd.solve(op, b, tol=1e-12, niter=3)
    assert not res.converged and res.iterations == 3 and res.true_residual > 1e-12


def test_zero_source_gives_zero_solution(world):
    U = qcd.random_gauge(DIMS, 1)
    op = qcd.WilsonOperator(world, qcd.Lattice(DIMS, (1, 1, 1, 1), 0), U, KAPPA)
    res = qcd.solve(op, np.zeros(qcd.spinor_shape(DIMS), dtype=complex), tol=1e-9, niter=10)
    assert res.converged and res.iterations == 0 and not np.any(res.x)


def test_the_solve_clock_is_cut_into_stages_that_add_up(world, seed):
    """setup, iterations, host-made updates and finish cover the solve's seconds; the warm-up solve is apart."""
    U = qcd.random_gauge(DIMS, seed)
    b = qcd.random_spinor(DIMS, seed + 1)
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    precise = qcd.WilsonOperator(world, lat, U, KAPPA)
    single = qcd.WilsonOperator(world, lat, U, KAPPA, "single")
    assert qcd.warm_up(precise, b, sloppy=single, check_every=5) > 0
    for every in (None, 5):
        res = qcd.solve(precise, b, tol=1e-10, niter=1000, sloppy=single, check_every=every)
        assert res.converged and set(res.stage_seconds) == {"setup", "iterations", "updates", "finish"}
        assert all(v > 0 for v in res.stage_seconds.values()), res.stage_seconds
        assert abs(sum(res.stage_seconds.values()) - res.seconds) < 1e-9 * max(1.0, res.seconds)
        assert not res.device_updates  # the cpu back-end has no resident kernel: the host makes the updates


# A job's fields: rank 0 draws the global gauge field and source, every rank gets its block.
_FIELDS = """
U = qcd.random_gauge(DIMS, seed) if world.rank == 0 else None
b = qcd.random_spinor(DIMS, seed + 1) if world.rank == 0 else None
local = local_from_global(DIMS, GRID)
lat = qcd.Lattice(local, GRID, world.rank)
U_local = qcd.scatter(world, lat, U, qcd.gauge_shape(local), lead=1)
b_local = qcd.scatter(world, lat, b, qcd.spinor_shape(local))
"""


RESIDENT_REFERENCE = """
import os, sys
import numpy as np
import circuslink as cl
from circuslink.apps import qcd
from circuslink.apps.qcd._lattice import local_from_global
sys.path.insert(0, {tests!r})
import qcd_resident_reference

seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
GRID, DIMS, KAPPA = {grid!r}, {dims!r}, {kappa!r}
world = cl.init()
""" + _FIELDS + """
op = qcd.WilsonOperator(world, lat, U_local, KAPPA)
single = qcd.WilsonOperator(world, lat, U_local, KAPPA, "single")
host = qcd.solve(op, b_local, tol=1e-10, niter=1000, sloppy=single)
qcd_resident_reference.install()
runs = {{}}
for name, every, updates in (("kernel updates", 7, True), ("host updates", 7, False), ("one batch", 1000, True)):
    res = qcd.solve(op, b_local, tol=1e-10, niter=1000, sloppy=single, check_every=every, device_updates=updates)
    assert res.loop == "device resident" and res.device_updates == updates, (name, res.loop, res.device_updates)
    runs[name] = (res, qcd.gather(world, lat, res.x, qcd.spinor_shape(DIMS)))
x_host = qcd.gather(world, lat, host.x, qcd.spinor_shape(DIMS))
if world.rank == 0:
    for name, (res, x) in runs.items():
        true = np.linalg.norm(b - qcd.wilson(U, x, KAPPA)) / np.linalg.norm(b)
        assert res.converged and true <= 1e-10 and abs(true - res.true_residual) < 1e-12, (name, true, res)
        # the same algorithm as the host-driven CG: the same iterations and reliable updates, the same solution
        assert (res.iterations, res.reliable_updates) == (host.iterations, host.reliable_updates), \
            (name, res.iterations, res.reliable_updates, host.iterations, host.reliable_updates)
        assert res.reliable_updates >= 3, (name, res.reliable_updates)
        assert np.linalg.norm(x - x_host) <= 1e-12 * np.linalg.norm(x_host), name
    # made inside the "kernel", the updates cost the host nothing between checks of the full system
    assert runs["kernel updates"][0].stage_seconds["updates"] < runs["host updates"][0].stage_seconds["updates"]
    print(f"ok grid {{GRID}}: {{host.iterations}} iterations, {{host.reliable_updates}} reliable updates")
world.close()
"""


@pytest.mark.parametrize("grid", [(1, 1, 1, 1), (2, 1, 1, 1)])
def test_a_resident_cg_that_makes_its_own_reliable_updates(spmd, grid):
    """The resident kernel's loop with its own reliable updates (its numpy reference, on the cpu back-end) gives
    the host-driven CG's iterations, updates and solution: the solver takes over where the kernel hands back
    (the full system's residual, the tightened target) and goes on from there, one rank and two."""
    from pathlib import Path

    code = RESIDENT_REFERENCE.format(tests=str(Path(__file__).parent), grid=grid, dims=DIMS, kappa=KAPPA)
    job = spmd(int(np.prod(grid)), code, timeout=240).check()
    assert f"ok grid {grid}" in job.output


# -- decompositions over ranks (spmd jobs on the cpu back-end) -------------------------------------------
DECOMPOSED = """
import os
import numpy as np
import circuslink as cl
from circuslink.apps import qcd
from circuslink.apps.qcd._lattice import local_from_global

seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
GRID, DIMS, KAPPA, HALO = {grid!r}, {dims!r}, {kappa!r}, {halo!r}
world = cl.init()
""" + _FIELDS + """
# the resident kernel where the halos need no host
RESIDENT = world.device is not None and (HALO == "rma-device" or GRID == (1, 1, 1, 1))
op = qcd.WilsonOperator(world, lat, U_local, KAPPA, halo=HALO)
applied = [qcd.gather(world, lat, op.apply(b_local, dagger), qcd.spinor_shape(DIMS)) for dagger in (False, True)]
single = qcd.WilsonOperator(world, lat, U_local, KAPPA, "single", halo=HALO)
half = qcd.WilsonOperator(world, lat, U_local, KAPPA, "half", halo=HALO)
solutions = {{}}
# the host-driven CG in every sloppy precision, then the device-resident one (scalars never read back inside
# an iteration; the host looks every 7)
for name, sloppy, every in (("double", None, None), ("single", single, None), ("half", half, None),
                            ("double-device", None, 7), ("single-device", single, 7)):
    res = qcd.solve(op, b_local, tol=1e-10, niter=1000, sloppy=sloppy, phases=op.new_phases(), check_every=every)
    assert res.loop == ("host" if every is None else ("device resident" if RESIDENT else "device")), res.loop
    solutions[name] = (res, qcd.gather(world, lat, res.x, qcd.spinor_shape(DIMS)))
applied_single = qcd.gather(world, lat, single.apply(b_local), qcd.spinor_shape(DIMS))
applied_half = qcd.gather(world, lat, half.apply(b_local), qcd.spinor_shape(DIMS))
if world.rank == 0:
    for dagger, got in zip((False, True), applied):
        err = np.abs(got - qcd.wilson(U, b, KAPPA, dagger)).max()
        assert err < 1e-13, f"apply (dagger={{dagger}}) differs from the reference by {{err}}"
    err = np.abs(applied_single - qcd.wilson(U, b, KAPPA)).max()
    assert err < 2e-5, f"single-precision apply differs from the reference by {{err}}"
    err = np.abs(applied_half - qcd.wilson(U, b, KAPPA)).max()
    assert err < 2e-3, f"half-precision apply differs from the reference by {{err}}"
    for name, (res, x) in solutions.items():
        true = np.linalg.norm(b - qcd.wilson(U, x, KAPPA)) / np.linalg.norm(b)
        assert res.converged and true <= 1e-10 and abs(true - res.true_residual) < 1e-12, (name, res, true)
        if name in ("single", "half"):
            assert res.reliable_updates >= 2, (name, res.reliable_updates)
        np.save(f"x_{{name}}.npy", x)
        print(f"ok grid {{GRID}} sloppy {{name}}: {{res.iterations}} iterations, {{res.reliable_updates}} reliable "
              f"updates, true residual {{true:.2e}}, split {{res.phase_seconds}}")
    if op.halo is not None:
        assert op.halo.exchanges > 0 and op.halo.name == HALO and half.halo.exchanges > 0
        assert solutions["single"][0].phase_seconds["halo"] > 0
    host, device = solutions["double"][0], solutions["double-device"][0]
    # the same algorithm: on the host the same iterations exactly; on the GPU within rounding of the sums
    assert abs(host.iterations - device.iterations) <= (0 if world.device is None else 2), \
        (host.iterations, device.iterations)
    print(f"ok grid {{GRID}}")
world.close()
"""


GRIDS = [(1, 1, 1, 1), (2, 1, 1, 1), (1, 1, 2, 1), (2, 2, 1, 1), (1, 2, 1, 2), (1, 1, 1, 4)]


def test_decompositions_give_the_same_operator_and_solution(spmd, seed, tmp_path):
    """Every sloppy precision on 1, 2 and 4 ranks (grids that split x, z, x and y, y and t, t): the true
    residual under the one-rank reference below --tol, and the same solution as one rank in double."""
    solutions = {}
    for grid in GRIDS:
        n = int(np.prod(grid))
        job = spmd(n, DECOMPOSED.format(grid=grid, dims=DIMS, kappa=KAPPA, halo="rma"), timeout=240).check()
        assert f"ok grid {grid}" in job.output
        for name in ("double", "single", "half", "double-device", "single-device"):
            solutions[grid, name] = np.load(tmp_path / f"x_{name}.npy")
    first = solutions[(1, 1, 1, 1), "double"]
    for key, x in solutions.items():
        assert np.linalg.norm(x - first) / np.linalg.norm(first) < 1e-8, key


def test_the_transport_halo_exchange_inside_a_node(spmd):
    """Faces over Connections inside one node (ipc): the operator and the solve match the reference as with every
    other exchange."""
    job = spmd(4, DECOMPOSED.format(grid=(2, 2, 1, 1), dims=DIMS, kappa=KAPPA, halo="transport"), timeout=180).check()
    assert "ok grid (2, 2, 1, 1)" in job.output


@pytest.mark.mpi
def test_the_transport_halo_exchange_across_nodes(spmd):
    """The same across 2 declared nodes under mpirun: ipc inside a node, mpi between the nodes."""
    job = spmd(4, DECOMPOSED.format(grid=(2, 2, 1, 1), dims=DIMS, kappa=KAPPA, halo="transport"), launcher="mpirun",
               timeout=180, env={"CIRCUSLINK_RANKS_PER_NODE": "2"}).check()
    assert "ok grid (2, 2, 1, 1)" in job.output


@pytest.mark.mpi
@pytest.mark.parametrize("halo", ["mpi-p2p", "mpi-rma"])
def test_mpi_halo_exchanges(spmd, halo):
    job = spmd(4, DECOMPOSED.format(grid=(2, 2, 1, 1), dims=DIMS, kappa=KAPPA, halo=halo), launcher="mpirun",
               timeout=120, env={"OMPI_MCA_mpi_yield_when_idle": "1"}).check()
    assert "ok grid (2, 2, 1, 1)" in job.output


def test_mpi_halo_exchanges_refuse_a_job_not_started_by_mpirun(spmd):
    code = """
import circuslink as cl
from circuslink.apps import qcd
world = cl.init()
lat = qcd.Lattice((4, 4, 4, 4), (2, 1, 1, 1), world.rank)
try:
    qcd.WilsonOperator(world, lat, qcd.unit_gauge((4, 4, 4, 4)), 0.1, halo="mpi-p2p")
except cl.ConfigError as exc:
    print("refused:", exc)
world.close()
"""
    job = spmd(2, code).check()
    assert "refused: --halo mpi-p2p needs a job started by mpirun" in job.output


def test_the_split_is_the_slowest_ranks_own(spmd):
    """Rank 0 is slow in its vector updates, so rank 1 waits as long for halos or sums: the split reported is
    one rank's timeline (it fits in the solve's time), not the per-phase maxima (which would count the delay
    twice), and every rank reports the same."""
    code = """
import os
import time
import circuslink as cl
from circuslink.apps import qcd

seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
world = cl.init()
lat = qcd.Lattice((4, 4, 4, 4), (2, 1, 1, 1), world.rank)
U = qcd.scatter(world, lat, qcd.random_gauge(lat.global_dims, seed) if world.rank == 0 else None,
                qcd.gauge_shape(lat.local), lead=1)
b = qcd.scatter(world, lat, qcd.random_spinor(lat.global_dims, seed + 1) if world.rank == 0 else None,
                qcd.spinor_shape(lat.local))
op = qcd.WilsonOperator(world, lat, U, 0.12)
if world.rank == 0:
    xpay_pack = op.xpay_pack
    op.xpay_pack = lambda *a: (time.sleep(0.005), xpay_pack(*a))
res = qcd.solve(op, b, tol=1e-8, niter=1000, phases=op.new_phases())
split = res.phase_seconds
assert res.converged and res.iterations > 10, res
# the delay is rank 0's vector time or, waited for, rank 1's halo or reduction time: once, whichever reports
assert split["vector"] + split["halo"] + split["reduction"] >= 0.005 * res.iterations, split
assert sum(split.values()) <= res.seconds * 1.01, (split, res.seconds)
print("split", world.rank, sorted(split.items()), res.seconds)
world.close()
"""
    job = spmd(2, code, timeout=120).check()
    lines = sorted(ln.split("split ", 1)[1] for ln in job.output.splitlines() if "split " in ln)
    assert len(lines) == 2 and lines[0].split(" ", 1)[1] == lines[1].split(" ", 1)[1], lines
