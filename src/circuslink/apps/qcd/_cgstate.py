"""The scalars of the device-resident CG, and the one step that updates them (the reference of the kernel).

The batched CG (``_solver``, ``check_every``) keeps its scalars in a small float64 array that lives where the
fields live (device memory on cuda): nothing is read back inside an iteration. Each iteration is

    <p, Ap> (local) -> s[LOCAL];  step 0: global sum, alpha = rr / <p, Ap>
    x += alpha p, r -= alpha Ap, |r|^2 (local) -> s[LOCAL];  step 1: global sum, beta, rr, flags
    p = r + beta p (skipped once frozen)

and the host reads the array every ``check_every`` iterations (on cuda: when the resident kernel that runs
them ends). A converged or stalled CG, or one whose reliable update is due, freezes (alpha = 0, p kept:
``SKIP``), so the iterations queued after it change nothing (the resident kernel ends instead). A resident
kernel given the precise fields makes a due reliable update itself and then takes :func:`update_step`: it
goes on, or stays frozen with ``UPDATED`` where the host must decide. The slots (the reliable updates' book
among them) and flags are mirrored by ``include/circuslink/qcd/dslash_types.cuh`` (``CgSlot``, ``CgFlag``),
where ``cg_scalar_step`` and ``cg_update_step`` in dslash.cu apply the same steps on the device;
tests/test_qcd_kernels.py runs them on the host against :func:`scalar_step` and :func:`update_step`.
"""

from __future__ import annotations

from typing import Any

LOCAL, RR, ALPHA, BETA, STOP, MAX_RR, ITERATIONS, FLAGS = range(8)
# The reliable updates' book: how many, the last |rhs - A y|^2, and how often it grew (in a row, in all)
UPDATES, TRUE_RR, INCREASES, INCREASES_TOTAL = range(8, 12)
SLOTS = 16  # the scalars (room to grow without changing the kernels' view of them)
BOOK = (UPDATES, TRUE_RR, INCREASES, INCREASES_TOTAL)
#: A true residual that grew at more than this many reliable updates in a row, or in all, ends the solve
#: (QUDA's maxResIncrease and maxResIncreaseTotal; kCgMaxIncreases and kCgMaxIncreasesTotal in the header).
MAX_INCREASES, MAX_INCREASES_TOTAL = 1, 10
# FLAGS bits: iterated |r|^2 <= stop; dropped by delta^2 since the last update; <p, Ap> <= 0; and SKIP: this
# iteration began frozen (or stalled at its start), so its p = r + beta p is skipped. The iteration that
# converges (or calls for a reliable update) still updates p, so that p is the direction that follows the
# last r. Each of the three freezes the CG until the host looks: a due reliable update is made at once, as the
# host-driven CG makes it, so the batched CG does the same iterations.
CONVERGED, DUE, STALLED, SKIP = 1, 2, 4, 8
FROZEN = CONVERGED | DUE | STALLED
# UPDATED: the resident kernel made the reliable update itself (y, r and TRUE_RR are current, the increment is
# zero) and stayed frozen for the host: the full system's residual is due (|rhs - A y|^2 <= STOP), or the true
# residual grew too often. Otherwise it clears the flags and goes on from the new residual (update_step).
UPDATED = 16


def scalar_step(s: Any, step: int, delta2: float) -> None:
    """Update the scalars in ``s`` after ``s[LOCAL]`` became a global sum: step 0 after <p, Ap>, step 1 after
    |r|^2 (the kernel ``qcd_cg_scalars`` does the same on the device)."""
    flags = int(s[FLAGS])
    g = float(s[LOCAL])
    if step == 0:
        if flags & FROZEN:
            s[FLAGS] = flags | SKIP
            s[ALPHA] = 0.0
        elif not g > 0.0:
            s[FLAGS] = flags | STALLED | SKIP
            s[ALPHA] = 0.0
        else:
            s[ALPHA] = float(s[RR]) / g
        return
    if flags & FROZEN:
        return
    s[BETA] = g / float(s[RR])
    s[RR] = g
    s[ITERATIONS] = float(s[ITERATIONS]) + 1.0
    s[MAX_RR] = max(float(s[MAX_RR]), g)
    if g <= float(s[STOP]):
        flags |= CONVERGED
    if g < delta2 * float(s[MAX_RR]):
        flags |= DUE
    s[FLAGS] = flags


def count_update(s: Any, rr: float) -> None:
    """The book of a reliable update whose |rhs - A y|^2 is ``rr`` (``cg_count_update`` in dslash.cu)."""
    grew = rr > float(s[TRUE_RR])
    s[INCREASES] = float(s[INCREASES]) + 1.0 if grew else 0.0
    if grew:
        s[INCREASES_TOTAL] = float(s[INCREASES_TOTAL]) + 1.0
    s[TRUE_RR] = rr
    s[UPDATES] = float(s[UPDATES]) + 1.0


def stuck(s: Any) -> bool:
    """The true residual grew at too many reliable updates: the sloppy precision makes no more progress."""
    return float(s[INCREASES]) > MAX_INCREASES or float(s[INCREASES_TOTAL]) > MAX_INCREASES_TOTAL


def update_step(s: Any) -> None:
    """The resident kernel's step after its own reliable update, once ``s[LOCAL]`` holds the global
    |rhs - A y|^2 (``cg_update_step`` in dslash.cu): the book, then either the CG goes on from the new residual
    (|r|^2 and its largest since restart, the flags clear) or it stays frozen with UPDATED for the host."""
    rr = float(s[LOCAL])
    count_update(s, rr)
    if rr <= float(s[STOP]) or stuck(s):
        s[FLAGS] = int(s[FLAGS]) | UPDATED
        return
    s[RR] = s[MAX_RR] = rr
    s[FLAGS] = 0
