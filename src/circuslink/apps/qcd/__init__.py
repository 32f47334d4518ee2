"""Lattice QCD on circuslink: the Wilson-Dirac operator, its even-odd CG solver and halo exchanges over RMA queues.

The one-rank reference (numpy or CuPy arrays, QUDA's conventions, docs/qcd.md)::

    from circuslink.apps import qcd
    U = qcd.random_gauge((4, 4, 4, 8), seed=1)          # U[mu, t, z, y, x, a, b], Haar SU(3)
    psi = qcd.random_spinor((4, 4, 4, 8), seed=2)        # psi[t, z, y, x, spin, colour]
    chi = qcd.wilson(U, psi, kappa=0.12)                 # M psi = psi - kappa D psi

Distributed (every rank of a job; ``grid`` ranks in x, y, z, t, each holding a local lattice)::

    world = circuslink.init()
    lat = qcd.Lattice(local=(8, 8, 8, 8), grid=(2, 2, 1, 1), rank=world.rank)
    U_local = qcd.scatter(world, lat, U if world.rank == 0 else None, qcd.gauge_shape(lat.local), lead=1)
    op = qcd.WilsonOperator(world, lat, U_local, kappa=0.12, precision="double", halo="rma")
    result = qcd.solve(op, b_local, tol=1e-7, niter=1000)   # CG on the even-odd normal equations
    x = qcd.gather(world, lat, result.x, qcd.spinor_shape(lat.global_dims))   # on rank 0

Configurations from other codes (ILDG / SciDAC LIME, NERSC; docs/qcd.md)::

    cfg = qcd.read_gauge("conf.1000.lime")              # format from the bytes; checksums checked
    print(cfg.plaquette)                                 # (1/3) Re tr, averaged over planes and sites
    qcd.write_ildg("copy.lime", cfg.U)

``circuslink qcd invert`` and ``circuslink qcd apply`` run these from the command line (docs/qcd.md).
"""

from __future__ import annotations

from ._gaugefile import GaugeFile, link_trace, plaquette, write_ildg
from ._gaugefile import peek as peek_gauge
from ._gaugefile import read as read_gauge
from ._halo import HALO_EXCHANGES
from ._io import gather, scatter
from ._lattice import Lattice
from ._operator import PRECISIONS, WilsonOperator
from ._reference import (
    DIRECTIONS,
    GAMMA,
    GAMMA5,
    gamma5,
    gauge_shape,
    hopping,
    random_gauge,
    random_spinor,
    random_su3,
    shift,
    spinor_shape,
    unit_gauge,
    wilson,
)
from ._solver import FLOPS_PER_SITE_CG, FLOPS_PER_SITE_DSLASH, ConvergenceError, SolveResult, solve, warm_up

__all__ = [
    "DIRECTIONS",
    "FLOPS_PER_SITE_CG",
    "FLOPS_PER_SITE_DSLASH",
    "HALO_EXCHANGES",
    "PRECISIONS",
    "ConvergenceError",
    "GaugeFile",
    "Lattice",
    "SolveResult",
    "WilsonOperator",
    "gather",
    "link_trace",
    "peek_gauge",
    "plaquette",
    "read_gauge",
    "scatter",
    "solve",
    "warm_up",
    "GAMMA",
    "GAMMA5",
    "gamma5",
    "gauge_shape",
    "hopping",
    "random_gauge",
    "random_spinor",
    "random_su3",
    "shift",
    "spinor_shape",
    "unit_gauge",
    "wilson",
    "write_ildg",
]
