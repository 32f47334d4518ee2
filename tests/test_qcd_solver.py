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


@pytest.mark.parametrize("precision", ["double", "single"])
def test_cg_solves_the_full_system(world, seed, precision):
    U = qcd.random_gauge(DIMS, seed)
    b = qcd.random_spinor(DIMS, seed + 1)
    lat = qcd.Lattice(DIMS, (1, 1, 1, 1), 0)
    precise = qcd.WilsonOperator(world, lat, U, KAPPA)
    sloppy = qcd.WilsonOperator(world, lat, U, KAPPA, precision) if precision == "single" else None
    res = qcd.solve(precise, b, tol=1e-9, niter=500, sloppy=sloppy)
    assert res.converged and res.true_residual <= 1e-9 and 0 < res.iterations < 500
    reference = np.linalg.norm(b - qcd.wilson(U, res.x, KAPPA)) / np.linalg.norm(b)
    assert reference <= 1e-9 and abs(reference - res.true_residual) < 1e-11
    if precision == "single":
        assert res.passes >= 2  # single precision alone cannot reach 1e-9: defect correction in double
    assert res.iterated_residual < 1e-8


def test_cg_makes_two_global_reductions_per_iteration(world, seed):
    U = qcd.random_gauge(DIMS, seed)
    b = qcd.random_spinor(DIMS, seed + 1)
    op = qcd.WilsonOperator(world, qcd.Lattice(DIMS, (1, 1, 1, 1), 0), U, KAPPA)
    from circuslink.apps.qcd._solver import cg_normal

    calls = []
    real = op.allreduce
    op.allreduce = lambda local, op="sum": calls.append(1) or real(local, op)
    b_e, b_o = op.split(b)
    _, _, iterations, _ = cg_normal(op, b_e, b_o, 1e-8, 500)
    assert iterations > 5
    assert len(calls) == 1 + 2 * iterations  # |rhs|^2 once, then <p, Ap> and |r|^2 per iteration


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
U = qcd.random_gauge(DIMS, seed) if world.rank == 0 else None
b = qcd.random_spinor(DIMS, seed + 1) if world.rank == 0 else None
local = local_from_global(DIMS, GRID)
lat = qcd.Lattice(local, GRID, world.rank)
U_local = qcd.scatter(world, lat, U, qcd.gauge_shape(local), lead=1)
b_local = qcd.scatter(world, lat, b, qcd.spinor_shape(local))
op = qcd.WilsonOperator(world, lat, U_local, KAPPA, halo=HALO)
applied = [qcd.gather(world, lat, op.apply(b_local, dagger), qcd.spinor_shape(DIMS)) for dagger in (False, True)]
single = qcd.WilsonOperator(world, lat, U_local, KAPPA, "single", halo=HALO)
res = qcd.solve(op, b_local, tol=1e-10, niter=500, sloppy=single)
x = qcd.gather(world, lat, res.x, qcd.spinor_shape(DIMS))
applied_single = qcd.gather(world, lat, single.apply(b_local), qcd.spinor_shape(DIMS))
if world.rank == 0:
    for dagger, got in zip((False, True), applied):
        err = np.abs(got - qcd.wilson(U, b, KAPPA, dagger)).max()
        assert err < 1e-13, f"apply (dagger={{dagger}}) differs from the reference by {{err}}"
    err = np.abs(applied_single - qcd.wilson(U, b, KAPPA)).max()
    assert err < 2e-5, f"single-precision apply differs from the reference by {{err}}"
    true = np.linalg.norm(b - qcd.wilson(U, x, KAPPA)) / np.linalg.norm(b)
    assert res.converged and true <= 1e-10, (res, true)
    if op.halo is not None:
        assert op.halo.exchanges > 0 and op.halo.name == HALO
    np.save("x.npy", x)
    print(f"ok grid {{GRID}}: {{res.iterations}} iterations, true residual {{true:.2e}}")
world.close()
"""


def test_decompositions_give_the_same_operator_and_solution(spmd, seed, tmp_path):
    solutions = {}
    for grid in [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 1, 1), (1, 1, 1, 4)]:
        n = int(np.prod(grid))
        job = spmd(n, DECOMPOSED.format(grid=grid, dims=DIMS, kappa=KAPPA, halo="rma"), timeout=120).check()
        assert f"ok grid {grid}" in job.output
        solutions[grid] = np.load(tmp_path / "x.npy")
    first = solutions[(1, 1, 1, 1)]
    for grid, x in solutions.items():
        assert np.linalg.norm(x - first) / np.linalg.norm(first) < 1e-8, grid


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
