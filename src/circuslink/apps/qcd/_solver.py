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
from . import _cgstate as cg
from ._operator import EVEN, ODD, RANK, WilsonOperator
from ._phases import NO_PHASES

#: QUDA's flop counts: one hop on one site, and one CG iteration on the even-odd normal equations per
#: site of the full lattice (4 half-lattice hops = 2 x 1,320, plus the vector updates and reductions).
FLOPS_PER_SITE_DSLASH = 1320
FLOPS_PER_SITE_CG = 2832
#: QUDA's default reliable-update threshold.
DEFAULT_DELTA = 0.1
#: The stages of a solve on the host clock (``SolveResult.stage_seconds``).
STAGES = ("setup", "iterations", "updates", "finish")


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
    loop: str = "host"           # "host", "device" (scalars on the device, looked at every k: a launch per step)
    #                              or "device resident" (k iterations in one resident kernel)
    # The solve's clock cut at its host waits (the slowest rank's): "setup" (the source, the right-hand side,
    # the first residual), "iterations" (the iterations' launches and waits; the resident kernel's own
    # reliable updates included), "updates" (reliable updates and residual checks the host makes), "finish"
    # (the odd half and the last true residual). They add up to ``seconds``.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    device_updates: bool = False  # the resident kernel made the reliable updates itself

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


class _HostIterations:
    """The CG iterations driven from the host: the scalars come back after every reduction, and the reliable
    update happens at the iteration that calls for it (QUDA's CG)."""

    def __init__(self, S: WilsonOperator, x_s: Any, r_s: Any, p: Any, ap: Any, delta: float) -> None:
        self.S, self.x_s, self.r_s, self.p, self.ap = S, x_s, r_s, p, ap
        self.delta2 = delta * delta
        self.rr = self.rr_prev = self.stop = self.max_rr = 0.0  # rr: the iterated |r|^2
        self.resident = None

    def restart(self, rr: float, stop: float, book: np.ndarray) -> None:
        self.rr = self.max_rr = rr
        self.stop = stop

    def run(self, budget: int, book: np.ndarray) -> tuple[int, str | None]:
        """Up to ``budget`` iterations; returns (iterations done, why they stopped: "update", "stalled" or None).
        ``book``: the reliable updates' (``_cgstate.BOOK``), which only a CG that makes them itself changes."""
        S, x_s, r_s, p, ap = self.S, self.x_s, self.r_s, self.p, self.ap
        for done in range(budget):
            S.normal(ap, p)
            pap = S.redot(p, ap)
            if not pap > 0.0:
                return done, "stalled"  # p is numerically zero in the sloppy precision
            rr_new = S.axpy_norm(x_s, r_s, p, ap, self.rr / pap)
            self.max_rr = max(self.max_rr, rr_new)
            self.rr_prev, self.rr = self.rr, rr_new
            if rr_new <= self.stop or rr_new < self.delta2 * self.max_rr:
                return done + 1, "update"
            S.xpay_pack(p, r_s, rr_new / self.rr_prev, EVEN, False)           # p = r + beta p, and its faces
        return budget, None

    def new_residual(self, r_new: Any, true_rr: float, stalled: bool) -> None:
        """The reliable update replaced r_s by ``r_new`` (|r|^2 = ``true_rr``): the next search direction."""
        S, p = self.S, self.p
        S.phases.mark("vector")
        self.r_s[...] = r_new
        if stalled:
            p[...] = self.r_s
            S.pack(p, EVEN, False)
        else:
            # QUDA: restore p's orthogonality to the new residual, then beta with the previous iterated |r|^2.
            S.caxpy(-S.cdot(self.r_s, p) / true_rr, self.r_s, p)
            S.xpay_pack(p, self.r_s, true_rr / self.rr_prev, EVEN, False)


@dataclass
class PreciseSide:
    """What a resident CG needs to make the reliable updates itself: the precise operator's back-end half and
    normal operator, and the solve's precise fields (the solution so far, the right-hand side, the residual
    and A y)."""

    d: Any
    normal: Any
    y: Any
    rhs: Any
    r: Any
    ay: Any


class _BatchedIterations:
    """The device-resident CG: alpha, beta and |r|^2 stay with the back-end module (device memory on cuda, summed over
    ranks on the device; a numpy array and the host collectives on cpu), and the host looks at them every
    ``check_every`` iterations (``_cgstate``). On cuda, where the halos need no host between hops (one rank, or
    ``rma-device``), the ``check_every`` iterations are one resident kernel that checks the scalars itself after
    every iteration and ends as soon as they freeze; elsewhere each step is a launch. A reliable update that
    falls due freezes the CG until the host looks; the search direction then takes the new residual in place
    of the iterated one (``p += r_new - r_s``), as if the last ``p = r + beta p`` had used it. Given the precise
    side (``precise``), a resident kernel for the two precisions makes those updates itself and ends only where
    the host must decide (``_cgstate.update_step``): "updated".

    Collective to create (the sums' slots), before the solve's clock starts: the fields are the solve's, filled
    later."""

    def __init__(self, S: WilsonOperator, x_s: Any, r_s: Any, p: Any, ap: Any, delta: float, check_every: int,
                 timed: bool = False, precise: PreciseSide | None = None) -> None:
        if S.half:
            from ...errors import ConfigError

            raise ConfigError("the device-resident CG runs double or single sloppy precision; half is emulated "
                              "with array operations between the kernels (use the host-driven CG for half)")
        self.S, self.x_s, self.r_s, self.p, self.ap = S, x_s, r_s, p, ap
        self.delta2 = delta * delta
        self.check_every = check_every
        self.d = S.d
        self.state = self.d.cg_state()  # collective on cuda (the slots of the sums over ranks)
        self.resident = self.d.cg_resident(S.normal, x_s, r_s, p, ap, self.state, self.delta2, EVEN, timed,
                                           update=precise)
        self.device_updates = bool(getattr(self.resident, "updates", False))
        self._iterations = 0
        self.rr = 0.0  # the iterated |r|^2 at the last look

    def device_split(self) -> dict[str, float]:
        """The resident kernel's own time split (block 0's clock), where it was asked for; else empty."""
        return self.resident.split() if self.resident is not None else {}

    def _iteration(self) -> None:
        S, d, s = self.S, self.d, self.state
        S.normal(self.ap, self.p)
        S.phases.mark("reduction")
        d.dot_into(self.p, self.ap, s)
        d.cg_scalars(s, 0, self.delta2)
        S.phases.mark("vector")
        d.axpy_norm_state(self.x_s, self.r_s, self.p, self.ap, s)
        S.phases.mark("reduction")
        d.cg_scalars(s, 1, self.delta2)
        S.phases.mark("vector")
        d.xpay_pack_state(self.p, self.r_s, s, EVEN, False)

    def restart(self, rr: float, stop: float, book: np.ndarray) -> None:
        values = np.zeros(cg.SLOTS)
        values[cg.RR] = values[cg.MAX_RR] = rr
        values[cg.STOP] = stop
        values[cg.ITERATIONS] = self._iterations
        values[list(cg.BOOK)] = book[list(cg.BOOK)]
        self.d.write_state(self.state, values)
        self.rr = rr

    def run(self, budget: int, book: np.ndarray) -> tuple[int, str | None]:
        batch = min(budget, self.check_every)
        if self.resident is not None:
            self.S.phases.mark(None)  # the kernel's time is split by its own clock, not by the stream's events
            self.resident.run(batch)
        else:
            for _ in range(batch):
                self._iteration()
        s = self.d.read_state(self.state)  # the one wait of a batch
        done = int(s[cg.ITERATIONS]) - self._iterations
        updates = int(s[cg.UPDATES]) - int(book[cg.UPDATES])
        if self.resident is not None:
            self.resident.count(done, updates)
        book[list(cg.BOOK)] = s[list(cg.BOOK)]  # the kernel's own reliable updates
        self._iterations = int(s[cg.ITERATIONS])
        self.rr = float(s[cg.RR])
        flags = int(s[cg.FLAGS])
        if flags & cg.UPDATED:
            return done, "updated"
        if flags & cg.STALLED:
            return done, "stalled"
        return done, "update" if flags & (cg.CONVERGED | cg.DUE) else None

    def new_residual(self, r_new: Any, true_rr: float, stalled: bool) -> None:
        S, p = self.S, self.p
        S.phases.mark("vector")
        if stalled:
            p[...] = r_new
        else:
            p += r_new - self.r_s
        self.r_s[...] = r_new
        S.pack(p, EVEN, False)


def solve(precise: WilsonOperator, b: Any, tol: float, niter: int, sloppy: WilsonOperator | None = None,
          delta: float = DEFAULT_DELTA, progress: Any = None, phases: Any = None,
          check_every: int | None = None, device_updates: bool = True) -> SolveResult:
    """Collective: solve ``M x = b`` for a local source ``b`` (T, Z, Y, X, 4, 3) to ``|b - M x| / |b| <= tol``.

    ``precise`` keeps the solution and computes the true residuals; ``sloppy`` (default: the same) runs the
    iterations. ``check_every`` (an int) runs the device-resident CG, which looks at its scalars every that
    many iterations (as one resident kernel where the halos need no host, which also makes the reliable
    updates itself where it has a kernel for the two precisions, unless ``device_updates`` is False); None
    the host-driven one. ``phases`` (``precise.new_phases()``) receives the time split (the resident kernel's
    from its own clock). Does not raise on non-convergence: the result says ``converged=False``.

    The clock covers the solve, not its preparation: the fields and the iterations' machinery are made
    before it starts (the first solve of a process also compiles the array library's kernels as it meets
    them: ``warm_up`` runs a short solve that meets them all)."""
    P = precise
    S = sloppy or precise
    check_sloppy(P.precision, S.precision)
    if check_every is not None and check_every < 1:
        from ...errors import ConfigError

        raise ConfigError(f"--check-every {check_every} must be at least 1")
    if S is P:
        delta = 0.0                  # one precision: a reliable update only where the iterated residual converged
    # The fields and the (collective) machinery before the clock starts.
    x_s, r_s, p, ap = S.zeros(), S.zeros(), S.zeros(), S.zeros()
    bp, rhs, y, r, ay = P.zeros(), P.zeros(), P.zeros(), P.zeros(), P.zeros()
    work = (P.zeros(), P.zeros(), P.zeros())
    if check_every is None:
        it: Any = _HostIterations(S, x_s, r_s, p, ap, delta)
    else:
        side = PreciseSide(P.d, P.normal, y, rhs, r, ay) if device_updates and S is not P else None
        it = _BatchedIterations(S, x_s, r_s, p, ap, delta, check_every, timed=phases is not None, precise=side)
    waits0 = P.halo_wait_seconds + (S.halo_wait_seconds if S is not P else 0.0)
    P.world.barrier()
    P.synchronize()
    clock = _Stages()
    k = P.kappa
    b_e, b_o = P.split(b)
    bnorm2 = float(P.allreduce(P.d.norm2(b_e) + P.d.norm2(b_o))[0])
    # The normal equations' right-hand side, in the precise precision.
    P.pack(b_o, ODD, False)
    P.hop(bp, b_o, EVEN, False, a=1.0, x=b_e, b=k, emit=True)      # b'_e, its faces for M_pc^dagger
    P.mpc(rhs, bp, dagger=True)
    rhs2 = P.norm2(rhs)
    r[...] = rhs
    r_s[...] = S.convert(r, P)
    p[...] = r_s
    S.pack(p, EVEN, False)
    timing = phases is not None
    if timing:
        for op in {id(P): P, id(S): S}.values():
            op.time_phases(phases)
    stop = tol * tol * rhs2          # the normal equations' target, tightened if the full system needs it
    book = np.zeros(cg.SLOTS)        # the reliable updates' count and QUDA's maxResIncrease counts
    book[cg.TRUE_RR] = rhs2
    it.restart(rhs2, stop, book)
    iterations = 0
    history: list[float] = []
    true = 1.0 if bnorm2 > 0 else 0.0
    converged = bnorm2 == 0.0
    restarted = False
    clock.lap("setup")
    while not converged and iterations < niter:
        done, why = it.run(niter - iterations, book)
        iterations += done
        clock.lap("iterations")
        if why is None:
            continue  # the budget or a batch ended without news
        stalled = why == "stalled"
        if stalled and restarted and done == 0:
            break
        if why == "updated":         # the resident kernel made the reliable update: y, r and |r|^2 are current
            true_rr = float(book[cg.TRUE_RR])
        else:
            # Reliable update: y += x_s in the precise precision, r = rhs - A y, r_s restarted from it.
            P.phases.mark("vector")
            y += P.convert(x_s, S)
            x_s[...] = 0
            P.pack(y, EVEN, False)
            P.normal(ay, y)
            P.phases.mark("vector")
            r[...] = rhs - ay
            true_rr = P.norm2(r)
            cg.count_update(book, true_rr)
        if true_rr <= stop:
            true = _true_residual(P, y, b_e, b_o, bnorm2, work)
            history.append(true)
            if progress is not None:
                progress(f"qcd: {iterations} iterations, {int(book[cg.UPDATES])} reliable updates: true residual "
                         f"{true:.3e}")
            if true <= tol:
                converged = True
                it.restart(true_rr, stop, book)
                clock.lap("updates")
                break
            # |r| bounds |b - M x| only up to the condition number: ask the normal equations for more.
            stop = true_rr * max(1e-4, (tol / true) ** 2 / 4)
        if cg.stuck(book):
            clock.lap("updates")
            break  # the sloppy precision makes no more progress
        restarted = stalled
        it.new_residual(S.convert(r, P), true_rr, stalled)
        it.restart(true_rr, stop, book)
        clock.lap("updates")
    # The solution: x_e = y (+ what the sloppy increment holds if the loop ended on --niter), x_o from it.
    P.phases.mark("vector")
    y += P.convert(x_s, S)
    x_o = work[0]
    if not converged:
        true = _true_residual(P, y, b_e, b_o, bnorm2, work)
        history.append(true)
        converged = true <= tol
    P.synchronize()
    clock.lap("finish")
    split = phases.totals() if timing else {}
    for name, sec in (it.device_split() if timing and it.resident is not None else {}).items():
        split[name] = split.get(name, 0.0) + sec
    if timing:
        for op in {id(P): P, id(S): S}.values():
            op.time_phases(NO_PHASES)
    waits = P.halo_wait_seconds + (S.halo_wait_seconds if S is not P else 0.0) - waits0
    # Every rank reports the slowest rank's times, so the figures do not depend on who prints them; the split
    # and the stages are that rank's own (per-part maxima over ranks would add up to more than anyone's solve).
    seconds = sum(clock.seconds.values())
    slowest = P.allreduce(P.xp.asarray(np.array([seconds, waits])), op="max")
    names = sorted(split)
    mine = [seconds] + [clock.seconds[n] for n in STAGES] + [split[n] for n in names]
    theirs = max(P.world.allgather_object(mine))
    stages = dict(zip(STAGES, (float(v) for v in theirs[1:1 + len(STAGES)]), strict=True))
    split = {n: float(v) for n, v in zip(names, theirs[1 + len(STAGES):], strict=True)}
    seconds, waits = float(slowest[0]), float(slowest[1])
    iterated = math.sqrt(it.rr / rhs2) if rhs2 > 0 else 0.0
    return SolveResult(x=P.join(y, x_o), converged=converged, iterations=iterations, iterated_residual=iterated,
                       true_residual=true, seconds=seconds, halo_wait_seconds=waits,
                       reliable_updates=int(book[cg.UPDATES]), tol=tol, niter=niter, history=history,
                       phase_seconds=split, stage_seconds=stages,
                       loop="host" if check_every is None else ("device resident" if it.resident else "device"),
                       device_updates=bool(getattr(it, "device_updates", False)))


class _Stages:
    """The solve's clock, cut into ``STAGES``: ``lap(stage)`` gives the time since the last lap to ``stage``."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._since = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] += now - self._since
        self._since = now


def warm_up(precise: WilsonOperator, b: Any, sloppy: WilsonOperator | None = None,
            check_every: int | None = None, device_updates: bool = True) -> float:
    """Collective: a short solve of ``b`` that meets every kernel a real one meets (the array library compiles
    its own on first use, the collectives open, the resident kernel loads), so that none of that lands in a
    timed solve's clock. A loose tolerance and a reliable update at every step (delta 0.9) walk the update,
    the full system's residual and the tightened target in a few iterations. Returns its seconds."""
    t0 = time.perf_counter()
    solve(precise, b, tol=0.5, niter=6, sloppy=sloppy, delta=0.9, check_every=check_every,
          device_updates=device_updates)
    precise.synchronize()
    return time.perf_counter() - t0
