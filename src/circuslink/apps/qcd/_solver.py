"""CG on the even-odd preconditioned normal equations (QUDA's ``normop-pc``), with defect correction.

To solve ``M x = b``:

1. ``b'_e = b_e + kappa D_eo b_o`` and ``M_pc = 1 - kappa^2 D_eo D_oe`` on the even sites;
2. CG on ``M_pc^dagger M_pc x_e = M_pc^dagger b'_e``: per iteration 4 hops and 2 global reductions
   (``<p, A p>``, then ``|r|^2`` fused into the update of x and r), stopping when the iterated residual
   ``|r| / |M_pc^dagger b'_e|`` is below the pass's target;
3. ``x_o = b_o + kappa D_oe x_e``;
4. the true residual ``|b - M x| / |b|`` of the full system, in double precision.

If the true residual is still above ``tol`` (the normal equations' residual only bounds it up to the
condition number, and single precision stalls near 1e-6), another pass solves ``M e = b - M x`` and adds
``e`` to ``x`` (defect correction, QUDA's reliable update in spirit): the inner passes may run in single
precision while ``x``, ``r`` and the residual stay in double. Iterations count over all passes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import Error
from ._operator import EVEN, ODD, WilsonOperator

#: QUDA's flop counts: one hop on one site, and one CG iteration on the even-odd normal equations per
#: site of the full lattice (4 half-lattice hops = 2 x 1,320, plus the vector updates and reductions).
FLOPS_PER_SITE_DSLASH = 1320
FLOPS_PER_SITE_CG = 2832
# The smallest relative residual an inner pass is asked for: single precision stalls around 1e-6.
_INNER_FLOOR = {"single": 1e-5, "double": 1e-14}


class ConvergenceError(Error):
    """The solver did not reach the requested residual within its iteration limit."""


@dataclass
class SolveResult:
    """What a solve reports (the figures QUDA's invert_test prints)."""

    x: Any                       # the local solution (T, Z, Y, X, 4, 3), complex128, array module of the world
    converged: bool
    iterations: int
    iterated_residual: float     # the last pass's |r| / |rhs| on the normal equations, relative to |b|
    true_residual: float         # |b - M x| / |b|, double precision
    seconds: float
    halo_wait_seconds: float
    passes: int
    tol: float
    niter: int
    history: list[float] = field(default_factory=list)  # true residual after each pass

    def gflops(self, global_volume: int) -> float:
        return self.iterations * FLOPS_PER_SITE_CG * global_volume / self.seconds / 1e9 if self.seconds > 0 else 0.0


def cg_normal(op: WilsonOperator, r_e: Any, r_o: Any, tol: float, maxiter: int) -> tuple[Any, Any, int, float]:
    """Solve ``M e = r`` through CG on ``M_pc^dagger M_pc``; returns (e_e, e_o, iterations, iterated residual)."""
    k = op.kappa
    d = op.d
    bp = op.zeros()
    op.pack(r_o, ODD, False)
    op.hop(bp, r_o, EVEN, False, a=1.0, x=r_e, b=k, emit=True)      # b'_e, its faces for M_pc^dagger
    rhs = op.zeros()
    op.mpc(rhs, bp, dagger=True)
    x, r, ap = op.zeros(), rhs.copy(), op.zeros()
    p = rhs.copy()
    op.pack(p, EVEN, False)
    rr = op.norm2(r)
    rhs2 = rr
    it = 0
    stop = tol * tol * rhs2
    while rr > stop and it < maxiter:
        op.normal(ap, p)
        pap = float(op.allreduce(d.redot(p, ap))[0])                  # reduction 1
        if not pap > 0.0:
            break  # p is numerically zero: nothing more to gain in this precision
        alpha = rr / pap
        rr_new = float(op.allreduce(d.axpy_norm(x, r, p, ap, alpha))[0])  # reduction 2
        it += 1
        beta = rr_new / rr
        rr = rr_new
        if rr <= stop:
            break
        d.xpay_pack(p, r, beta, EVEN, False)                          # p = r + beta p, and its faces
    e_o = op.zeros()
    op.pack(x, EVEN, False)
    op.hop(e_o, x, ODD, False, a=1.0, x=r_o, b=k)
    return x, e_o, it, math.sqrt(rr / rhs2) if rhs2 > 0 else 0.0


def solve(precise: WilsonOperator, b: Any, tol: float, niter: int, sloppy: WilsonOperator | None = None,
          progress: Any = None) -> SolveResult:
    """Collective: solve ``M x = b`` for a local source ``b`` (T, Z, Y, X, 4, 3) to ``|b - M x| / |b| <= tol``.

    ``precise`` is the double-precision operator (residuals, the solution); ``sloppy`` (default: the same)
    runs the CG passes. Does not raise on non-convergence: the result says ``converged=False``."""
    sloppy = sloppy or precise
    P, S = precise, sloppy
    waits0 = P.halo_wait_seconds + (S.halo_wait_seconds if S is not P else 0.0)
    P.world.barrier()
    P.synchronize()
    t0 = time.perf_counter()
    b_e, b_o = P.split(b)
    bnorm2 = float(P.allreduce(P.d.norm2(b_e) + P.d.norm2(b_o))[0])
    x_e, x_o = P.zeros(), P.zeros()
    r_e, r_o = b_e.copy(), b_o.copy()
    rnorm2 = bnorm2
    iterations = passes = 0
    iterated = 1.0 if bnorm2 > 0 else 0.0
    history: list[float] = []
    m_e, m_o = P.zeros(), P.zeros()
    while rnorm2 > tol * tol * bnorm2 and iterations < niter:
        scale = math.sqrt(rnorm2 / bnorm2)
        target = max(_INNER_FLOOR[S.precision], tol / scale)
        e_e, e_o, its, inner = cg_normal(S, S.convert(r_e, P), S.convert(r_o, P), target, niter - iterations)
        iterations += its
        passes += 1
        iterated = inner * scale
        x_e += P.convert(e_e, S)
        x_o += P.convert(e_o, S)
        P.apply_eo(m_e, m_o, x_e, x_o)
        r_e, r_o = b_e - m_e, b_o - m_o
        previous, rnorm2 = rnorm2, float(P.allreduce(P.d.norm2(r_e) + P.d.norm2(r_o))[0])
        history.append(math.sqrt(rnorm2 / bnorm2))
        if progress is not None:
            progress(f"qcd: pass {passes}: {its} iterations, true residual {history[-1]:.3e}")
        if its == 0 or rnorm2 >= previous:
            break  # no progress in this precision
    P.synchronize()
    seconds = time.perf_counter() - t0
    waits = P.halo_wait_seconds + (S.halo_wait_seconds if S is not P else 0.0) - waits0
    true = math.sqrt(rnorm2 / bnorm2) if bnorm2 > 0 else 0.0
    # Every rank reports the slowest rank's time, so the figures do not depend on who prints them.
    seconds, waits = (float(v) for v in P.allreduce(P.xp.asarray(np.array([seconds, waits])), op="max"))
    return SolveResult(x=P.join(x_e, x_o), converged=true <= tol, iterations=iterations, iterated_residual=iterated,
                       true_residual=true, seconds=seconds, halo_wait_seconds=waits, passes=passes, tol=tol,
                       niter=niter, history=history)
