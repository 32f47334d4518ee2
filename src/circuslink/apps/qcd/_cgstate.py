"""The scalars of the device-resident CG, and the one step that updates them (the reference of the kernel).

The batched CG (``_solver``, ``check_every``) keeps its scalars in a small float64 array that lives where the
fields live (device memory on cuda): nothing is read back inside an iteration. Each iteration is

    <p, Ap> (local) -> s[LOCAL];  step 0: global sum, alpha = rr / <p, Ap>
    x += alpha p, r -= alpha Ap, |r|^2 (local) -> s[LOCAL];  step 1: global sum, beta, rr, flags
    p = r + beta p (skipped once frozen)

and the host reads the array every ``check_every`` iterations (on cuda: when the resident kernel that runs
them ends). A converged or stalled CG, or one whose reliable update is due, freezes (alpha = 0, p kept:
``SKIP``), so the iterations queued after it change nothing (the resident kernel ends instead). The slots
and flags are mirrored by ``include/circuslink/qcd/dslash_types.cuh`` (``CgSlot``, ``CgFlag``), where
``cg_scalar_step`` in dslash.cu applies the same step on the device; tests/test_qcd_kernels.py runs that step
on the host against :func:`scalar_step`.
"""

from __future__ import annotations

from typing import Any

LOCAL, RR, ALPHA, BETA, STOP, MAX_RR, ITERATIONS, FLAGS = range(8)
SLOTS = 16  # the array's length (room to grow without changing its allocation)
# FLAGS bits: iterated |r|^2 <= stop; dropped by delta^2 since the last update; <p, Ap> <= 0; and SKIP: this
# iteration began frozen (or stalled at its start), so its p = r + beta p is skipped. The iteration that
# converges (or calls for a reliable update) still updates p, so that p is the direction that follows the
# last r. Each of the three freezes the CG until the host looks: a due reliable update is made at once, as the
# host-driven CG makes it, so the batched CG does the same iterations.
CONVERGED, DUE, STALLED, SKIP = 1, 2, 4, 8
FROZEN = CONVERGED | DUE | STALLED


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
