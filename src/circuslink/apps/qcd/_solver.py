"""CG on the even-odd preconditioned normal equations (QUDA's ``normop-pc``), mixed precision with reliable updates.

To solve ``M x = b``:

1. ``b'_e = b_e + kappa D_eo b_o`` and ``M_pc = 1 - kappa^2 D_eo D_oe`` on the even sites;
2. CG on ``A x_e = M_pc^dagger b'_e`` with ``A = M_pc^dagger M_pc``: per iteration 4 hops and 2 global
   reductions (``<p, A p>``, then ``|r|^2`` fused into the update of x and r);
3. ``x_o = b_o + kappa D_oe x_e``, and the true residual ``|b - M x| / |b|`` of the full system.

Mixed precision as QUDA's CG does it (``--prec`` the precise precision, ``--prec-sloppy`` the iterations'):
the iterations run on the sloppy operator (p, Ap, an increment x_s and the iterated r_s all sloppy); whenever
the iterated residual has dropped by ``delta`` (default 0.1) from the largest it has been since the last
update, a **reliable update** folds x_s into the precise solution y, recomputes ``r = rhs - A y`` with the
precise operator, restarts r_s from it and re-orthogonalises p against it. On convergence of the iterated
residual a last reliable update recomputes the true residual; only the true residual of the full system
decides convergence, so the solution keeps the precise precision's accuracy whatever the sloppy one is. If
the normal equations' target was not tight enough for ``|b - M x| / |b| <= tol`` (it bounds it only up to
the condition number), the target is tightened and the CG continues. A true residual that grows twice in a
row at reliable updates (the sloppy precision cannot make progress) ends the solve unconverged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import Error
from ._operator import EVEN, ODD, RANK, WilsonOperator
from ._phases import NO_PHASES

#: QUDA's flop counts: one hop on one site, and one CG iteration on the even-odd normal equations per
#: site of the full lattice (4 half-lattice hops = 2 x 1,320, plus the vector updates and reductions).
FLOPS_PER_SITE_DSLASH = 1320
FLOPS_PER_SITE_CG = 2832
#: QUDA's default reliable-update threshold.
DEFAULT_DELTA = 0.1
_MAX_RES_INCREASE = 1          # consecutive increases of the true residual tolerated (QUDA's maxResIncrease)
_MAX_RES_INCREASE_TOTAL = 10   # and in all (QUDA's maxResIncreaseTotal)


class ConvergenceError(Error):
    """The solver did not reach the requested residual within its iteration limit."""


@dataclass
class SolveResult:
    """What a solve reports (the figures QUDA's invert_test prints)."""

    x: Any                       # the local solution (T, Z, Y, X, 4, 3), complex128, array module of the world
    converged: bool
    iterations: int
    iterated_residual: float     # the last |r| / |rhs| of the normal equations (after the last reliable update)
    true_residual: float         # |b - M x| / |b| of the full system, in the precise precision
    seconds: float
    halo_wait_seconds: float
    reliable_updates: int
    tol: float
    niter: int
    history: list[float] = field(default_factory=list)  # true residual at each full-system check
    phase_seconds: dict[str, float] = field(default_factory=dict)  # dslash, halo, reduction, vector (slowest rank)

    def gflops(self, global_volume: int) -> float:
        return self.iterations * FLOPS_PER_SITE_CG * global_volume / self.seconds / 1e9 if self.seconds > 0 else 0.0


def check_sloppy(precise: str, sloppy: str) -> None:
    from ...errors import ConfigError

    if RANK[sloppy] > RANK[precise]:
        raise ConfigError(f"--prec-sloppy {sloppy} is more precise than --prec {precise} (the sloppy precision "
                          "must not exceed the precise one)")


def _true_residual(P: WilsonOperator, y: Any, b_e: Any, b_o: Any, bnorm2: float, work: tuple) -> float:
    """|b - M x| / |b| for x = (y, x_o = b_o + kappa D_oe y), in P's precision; x_o is left in ``work[0]``."""
    x_o, m_e, m_o = work
    x_o[...] = 0
    P.pack(y, EVEN, False)
    P.hop(x_o, y, ODD, False, a=1.0, x=b_o, b=P.kappa)
    P.apply_eo(m_e, m_o, y, x_o)
    P.phases.mark("vector")
    m_e -= b_e
    m_o -= b_o
    P.phases.mark("reduction")
    rr = float(P.allreduce(P.d.norm2(m_e) + P.d.norm2(m_o))[0])
    return math.sqrt(rr / bnorm2) if bnorm2 > 0 else 0.0


def solve(precise: WilsonOperator, b: Any, tol: float, niter: int, sloppy: WilsonOperator | None = None,
          delta: float = DEFAULT_DELTA, progress: Any = None, phases: Any = None) -> SolveResult:
    """Collective: solve ``M x = b`` for a local source ``b`` (T, Z, Y, X, 4, 3) to ``|b - M x| / |b| <= tol``.

    ``precise`` keeps the solution and computes the true residuals; ``sloppy`` (default: the same) runs the
    iterations. ``phases`` (``precise.new_phases()``) receives the time split. Does not raise on
    non-convergence: the result says ``converged=False``."""
    P = precise
    S = sloppy or precise
    check_sloppy(P.precision, S.precision)
    if phases is not None:
        for op in {id(P): P, id(S): S}.values():
            op.time_phases(phases)
    waits0 = P.halo_wait_seconds + (S.halo_wait_seconds if S is not P else 0.0)
    P.world.barrier()
    P.synchronize()
    t0 = time.perf_counter()
    k = P.kappa
    b_e, b_o = P.split(b)
    bnorm2 = float(P.allreduce(P.d.norm2(b_e) + P.d.norm2(b_o))[0])
    # The normal equations' right-hand side, in the precise precision.
    bp, rhs = P.zeros(), P.zeros()
    P.pack(b_o, ODD, False)
    P.hop(bp, b_o, EVEN, False, a=1.0, x=b_e, b=k, emit=True)      # b'_e, its faces for M_pc^dagger
    P.mpc(rhs, bp, dagger=True)
    rhs2 = P.norm2(rhs)
    work = (P.zeros(), P.zeros(), P.zeros())
    y, r, ay = P.zeros(), rhs.copy(), P.zeros()
    x_s, r_s, ap = S.zeros(), S.convert(r, P), S.zeros()
    p = r_s.copy()
    S.pack(p, EVEN, False)
    rr = rhs2
    stop = tol * tol * rhs2          # the normal equations' target, tightened if the full system needs it
    if S is P:
        delta = 0.0                  # one precision: a reliable update only where the iterated residual converged
    max_rr = last_true_rr = rr
    iterations = updates = increases = increases_total = 0
    history: list[float] = []
    true = 1.0 if bnorm2 > 0 else 0.0
    converged = bnorm2 == 0.0
    restarted = False
    while not converged and iterations < niter:
        S.normal(ap, p)
        pap = S.redot(p, ap)
        stalled = not pap > 0.0  # p is numerically zero in the sloppy precision: restart from the true r
        if stalled and restarted:
            break
        if not stalled:
            rr_new = S.axpy_norm(x_s, r_s, p, ap, rr / pap)
            iterations += 1
            max_rr = max(max_rr, rr_new)
            if rr_new > stop and rr_new >= delta * delta * max_rr:
                S.xpay_pack(p, r_s, rr_new / rr, EVEN, False)              # p = r + beta p, and its faces
                rr = rr_new
                continue
        # Reliable update: y += x_s in the precise precision, r = rhs - A y, r_s restarted from it.
        P.phases.mark("vector")
        y += P.convert(x_s, S)
        x_s[...] = 0
        P.pack(y, EVEN, False)
        P.normal(ay, y)
        P.phases.mark("vector")
        r[...] = rhs - ay
        true_rr = P.norm2(r)
        r_s = S.convert(r, P)
        updates += 1
        grew = true_rr > last_true_rr
        increases = increases + 1 if grew else 0
        increases_total += grew
        last_true_rr = max_rr = true_rr
        if true_rr <= stop:
            true = _true_residual(P, y, b_e, b_o, bnorm2, work)
            history.append(true)
            if progress is not None:
                progress(f"qcd: {iterations} iterations, {updates} reliable updates: true residual {true:.3e}")
            if true <= tol:
                converged = True
                rr = true_rr
                break
            # |r| bounds |b - M x| only up to the condition number: ask the normal equations for more.
            stop = true_rr * max(1e-4, (tol / true) ** 2 / 4)
        if increases > _MAX_RES_INCREASE or increases_total > _MAX_RES_INCREASE_TOTAL:
            rr = true_rr
            break  # the sloppy precision makes no more progress
        restarted = stalled
        if stalled:
            p = r_s.copy()
            S.pack(p, EVEN, False)
        else:
            # Restore p's orthogonality to the new residual, then beta with the iterated |r|^2.
            S.caxpy(-S.cdot(r_s, p) / true_rr, r_s, p)
            S.xpay_pack(p, r_s, true_rr / rr, EVEN, False)
        rr = true_rr
    # The solution: x_e = y (+ what the sloppy increment holds if the loop ended on --niter), x_o from it.
    P.phases.mark("vector")
    y += P.convert(x_s, S)
    x_o = work[0]
    if not converged:
        true = _true_residual(P, y, b_e, b_o, bnorm2, work)
        history.append(true)
        converged = true <= tol
    P.synchronize()
    seconds = time.perf_counter() - t0
    split = phases.totals() if phases is not None else {}
    if phases is not None:
        for op in {id(P): P, id(S): S}.values():
            op.time_phases(NO_PHASES)
    waits = P.halo_wait_seconds + (S.halo_wait_seconds if S is not P else 0.0) - waits0
    names = sorted(split)
    # Every rank reports the slowest rank's times, so the figures do not depend on who prints them.
    slowest = P.allreduce(P.xp.asarray(np.array([seconds, waits] + [split[n] for n in names])), op="max")
    seconds, waits = float(slowest[0]), float(slowest[1])
    split = {n: float(v) for n, v in zip(names, slowest[2:], strict=True)}
    iterated = math.sqrt(rr / rhs2) if rhs2 > 0 else 0.0
    return SolveResult(x=P.join(y, x_o), converged=converged, iterations=iterations, iterated_residual=iterated,
                       true_residual=true, seconds=seconds, halo_wait_seconds=waits, reliable_updates=updates,
                       tol=tol, niter=niter, history=history, phase_seconds=split)
