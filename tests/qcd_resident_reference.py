"""The resident CG kernel's loop (``cg_resident`` in apps/qcd/dslash.cu) on the cpu back-end, step for step: the
iterations, the freeze, and with the precise side the reliable updates the kernel makes itself
(``reliable_update``: y += x, x = 0, A y, r = rhs - A y, the global |r|^2, ``_cgstate.update_step``, then
p += r_new - r_s). ``install()`` makes the cpu back-end's ``cg_resident`` return it, so that the solver's
handling of a kernel that made the updates ("updated") runs on machines without a GPU, against the host-driven
CG on the same fields (tests/test_qcd_solver.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from circuslink import collectives
from circuslink.apps.qcd import _cgstate as cg
from circuslink.apps.qcd import _cpu

EVEN = 0


class ResidentReference:
    def __init__(self, d: Any, normal: Any, x: Any, r: Any, p: Any, ap: Any, s: Any, delta2: float, parity: int,
                 update: Any) -> None:
        self.d, self.normal, self.x, self.r, self.p, self.ap, self.s = d, normal, x, r, p, ap, s
        self.delta2, self.parity, self.update = delta2, parity, update
        self.updates = update is not None

    def _sum(self, local: float) -> float:
        return float(collectives.allreduce(self.d.world, np.array([local]))[0])

    def run(self, iterations: int) -> None:
        s, d = self.s, self.d
        done = 0
        while True:
            flags = int(s[cg.FLAGS])
            if flags & cg.FROZEN:
                if not self.updates or flags & (cg.STALLED | cg.UPDATED):
                    break
                self._reliable_update()
                if int(s[cg.FLAGS]) & cg.FROZEN:
                    break
            if done == iterations:
                break
            done += 1
            self.normal(self.ap, self.p)
            d.dot_into(self.p, self.ap, s)
            d.cg_scalars(s, 0, self.delta2)
            d.axpy_norm_state(self.x, self.r, self.p, self.ap, s)
            d.cg_scalars(s, 1, self.delta2)
            d.xpay_pack_state(self.p, self.r, s, self.parity, False)

    def _reliable_update(self) -> None:
        u, s = self.update, self.s
        u.y += self.x.astype(u.y.dtype)                      # fold_site
        self.x[...] = 0
        u.d.pack(u.y, self.parity, False)
        u.normal(u.ay, u.y)                                  # the precise hops
        u.r[...] = u.rhs - u.ay
        s[cg.LOCAL] = self._sum(float(np.vdot(u.r, u.r).real))
        cg.update_step(s)
        if int(s[cg.FLAGS]) & cg.FROZEN:
            return                                           # handed to the host
        fresh = u.r.astype(self.r.dtype)                     # new_residual_site
        self.p += fresh - self.r
        self.r[...] = fresh
        self.d.pack(self.p, self.parity, False)

    def count(self, iterations: int, updates: int = 0) -> None:
        pass

    def split(self) -> dict[str, float]:
        return {}


def install() -> None:
    """The cpu back-end's ``cg_resident`` returns the reference loop (with the precise side where given)."""
    def cg_resident(self, normal, x, r, p, ap, s, delta2, parity, timed, update=None):
        return ResidentReference(self, normal, x, r, p, ap, s, delta2, parity, update)

    _cpu.Dslash.cg_resident = cg_resident
