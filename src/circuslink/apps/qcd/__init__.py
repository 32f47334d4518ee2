"""Lattice QCD on circuslink: the Wilson-Dirac operator, its even-odd CG solver and halo exchanges over RMA queues.

The one-rank reference (numpy or CuPy arrays, QUDA's conventions, docs/qcd.md)::

    from circuslink.apps import qcd
    U = qcd.random_gauge((4, 4, 4, 8), seed=1)          # U[mu, t, z, y, x, a, b], Haar SU(3)
    psi = qcd.random_spinor((4, 4, 4, 8), seed=2)        # psi[t, z, y, x, spin, colour]
    chi = qcd.wilson(U, psi, kappa=0.12)                 # M psi = psi - kappa D psi
"""

from __future__ import annotations

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

__all__ = [
    "DIRECTIONS",
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
]
