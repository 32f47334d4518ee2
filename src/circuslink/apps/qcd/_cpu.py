"""The cpu back-end module of the distributed Wilson operator: the even-odd hopping term in numpy.

It follows the GPU module step for step, so the cpu back-end checks the same algorithm: spin-projected half
spinors on the faces (``h = psi_upper + s A_mu psi_lower``, 12 reals; the lower half comes back as
``s A_mu^dagger h``), the backward faces multiplied by ``U^dagger`` before they travel, the interior computed
between the halo exchange's ``start()`` and ``wait()``, the ghost terms added after. Fields are checkerboard
halves ``(Vh, 4, 3)``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from . import _cgstate as cg
from ._lattice import Lattice
from ._phases import NO_PHASES, HostPhases
from ._reference import GAMMA_BLOCK

Phases = HostPhases  # the time split of this back-end module: the host clock


def project(psi: np.ndarray, mu: int, s: int) -> np.ndarray:
    """The half spinor of ``(1 + s gamma_mu) psi``: (N, 4, 3) -> (N, 2, 3)."""
    a = GAMMA_BLOCK[mu].astype(psi.dtype)
    return psi[:, :2] + s * np.matmul(a, psi[:, 2:])


def reconstruct(h: np.ndarray, mu: int, s: int) -> np.ndarray:
    """``(1 + s gamma_mu) psi`` from its half spinor: (N, 2, 3) -> (N, 4, 3)."""
    a_dag = GAMMA_BLOCK[mu].conj().T.astype(h.dtype)
    return np.concatenate([h, s * np.matmul(a_dag, h)], axis=1)


class Dslash:
    """``out = a x + b D_{p <- 1-p} in`` for checkerboard halves, with halos from a halo exchange (or none)."""

    def __init__(self, world: Any, lattice: Lattice, gauge: np.ndarray, dtype: Any, halo: Any) -> None:
        self.world = world
        self.lat = lattice
        self.dtype = np.dtype(dtype)
        self.halo = halo
        # U[parity][site, mu, a, b]
        links = np.moveaxis(np.asarray(gauge), 0, 4).astype(self.dtype)  # (T, Z, Y, X, mu, 3, 3)
        self.links = lattice.split(links)
        self.phases = NO_PHASES

    # -- fields -----------------------------------------------------------------------------
    def new_field(self) -> np.ndarray:
        return np.zeros((self.lat.half, 4, 3), dtype=self.dtype)

    def from_half(self, half: Any) -> np.ndarray:
        return np.ascontiguousarray(half, dtype=self.dtype)

    def to_half(self, field: np.ndarray) -> np.ndarray:
        return field

    def site_reals(self, field: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """A real view of ``field`` and the axes that hold one site's 24 reals."""
        return field.view(field.real.dtype), (1, 2)

    # -- geometry ---------------------------------------------------------------------------
    @cached_property
    def _tables(self) -> tuple[list, list]:
        """Per output parity, per mu: neighbour indices, local-wrap signs and the sites whose hop leaves the rank."""
        lat = self.lat
        out: tuple[list, list] = ([], [])
        for parity in (0, 1):
            c = lat.site_coords(parity)
            for mu in range(4):
                L = lat.local[mu]
                up, down = c.copy(), c.copy()
                up[mu] = (c[mu] + 1) % L
                down[mu] = (c[mu] - 1) % L
                top, bottom = c[mu] == L - 1, c[mu] == 0
                entry = {"up": lat.lex(up) // 2, "down": lat.lex(down) // 2}
                if lat.partitioned[mu]:
                    entry["up_sites"] = np.nonzero(~top)[0]
                    entry["down_sites"] = np.nonzero(~bottom)[0]
                    entry["up_sign"] = entry["down_sign"] = 1.0
                    entry["ghost_up"] = np.nonzero(top)[0]
                    entry["ghost_down"] = np.nonzero(bottom)[0]
                    entry["face_up"] = lat.slot_offset[(mu, 0)] + lat.face_index(c[:, top], mu)
                    entry["face_down"] = lat.slot_offset[(mu, 1)] + lat.face_index(c[:, bottom], mu)
                else:
                    every = np.arange(lat.half)
                    entry["up_sites"] = entry["down_sites"] = every
                    entry["up_sign"] = np.where(top, lat.forward_sign[mu], 1.0)[:, None, None]
                    entry["down_sign"] = np.where(bottom, lat.backward_sign[mu], 1.0)[:, None, None]
                out[parity].append(entry)
        return out

    @cached_property
    def _faces(self) -> tuple[list, list]:
        """Per field parity, per partitioned mu: the sites at x_mu = 0 / L-1 and their slots in the send array."""
        lat = self.lat
        out: tuple[list, list] = ([], [])
        for parity in (0, 1):
            c = lat.site_coords(parity)
            for mu in range(4):
                if not lat.partitioned[mu]:
                    out[parity].append(None)
                    continue
                low, high = c[mu] == 0, c[mu] == lat.local[mu] - 1
                out[parity].append({
                    "low": np.nonzero(low)[0], "low_slot": lat.slot_offset[(mu, 0)] + lat.face_index(c[:, low], mu),
                    "high": np.nonzero(high)[0],
                    "high_slot": lat.slot_offset[(mu, 1)] + lat.face_index(c[:, high], mu),
                })
        return out

    # -- the hopping term -------------------------------------------------------------------
    def _interior(self, out: np.ndarray, inp: np.ndarray, parity: int, dagger: bool, a: float, x: Any,
                  b: float) -> None:
        s_up = 1 if dagger else -1  # forward projector 1 + s_up gamma_mu
        here, there = self.links[parity], self.links[1 - parity]
        acc = np.zeros_like(out)
        for mu, t in enumerate(self._tables[parity]):
            sites = t["up_sites"]
            h = project(inp[t["up"][sites]], mu, s_up) * t["up_sign"]
            h = np.matmul(h, np.swapaxes(here[sites, mu], -1, -2))          # U_mu(x) h
            acc[sites] += reconstruct(h, mu, s_up)
            sites = t["down_sites"]
            down = t["down"][sites]
            h = project(inp[down], mu, -s_up) * t["down_sign"]
            h = np.matmul(h, there[down, mu].conj())                        # U_mu(x - mu)^dagger h
            acc[sites] += reconstruct(h, mu, -s_up)
        if x is None:
            out[...] = b * acc
        else:
            out[...] = a * x + b * acc

    def _exterior(self, out: np.ndarray, ghost: np.ndarray, parity: int, dagger: bool, b: float) -> None:
        lat = self.lat
        s_up = 1 if dagger else -1
        here = self.links[parity]
        for mu, t in enumerate(self._tables[parity]):
            if not lat.partitioned[mu]:
                continue
            sites = t["ghost_up"]
            h = ghost[:, t["face_up"]].T.reshape(-1, 2, 3) * lat.forward_sign[mu]
            h = np.matmul(h, np.swapaxes(here[sites, mu], -1, -2))
            out[sites] += b * reconstruct(h, mu, s_up)
            sites = t["ghost_down"]
            h = ghost[:, t["face_down"]].T.reshape(-1, 2, 3) * lat.backward_sign[mu]  # U^dagger applied by the sender
            out[sites] += b * reconstruct(h, mu, -s_up)

    def pack(self, field: np.ndarray, parity: int, dagger: bool) -> None:
        """Write the faces of ``field`` (of ``parity``) that the next hop (``dagger``) needs into the send array."""
        if self.halo is None:
            return
        send = self.halo.send
        s_up = 1 if dagger else -1
        links = self.links[parity]
        for mu, f in enumerate(self._faces[parity]):
            if f is None:
                continue
            # My sites at x_mu = 0 feed my backward neighbour's forward hop: (1 + s_up gamma) psi.
            send[:, f["low_slot"]] = project(field[f["low"]], mu, s_up).reshape(-1, 6).T
            # My sites at x_mu = L-1 feed my forward neighbour's backward hop: U^dagger (1 - s_up gamma) psi.
            h = np.matmul(project(field[f["high"]], mu, -s_up), links[f["high"], mu].conj())
            send[:, f["high_slot"]] = h.reshape(-1, 6).T

    def apply(self, out: np.ndarray, inp: np.ndarray, parity: int, dagger: bool, a: float = 0.0, x: Any = None,
              b: float = 1.0, emit: bool | None = None) -> None:
        """``out = a x + b D_{parity <- 1-parity} inp`` (the faces of ``inp`` must be in the send array); with
        ``emit`` (the next hop's dagger) the faces of ``out`` are written for the next hop."""
        halo, phases = self.halo, self.phases
        if halo is not None:
            phases.mark("halo")
            halo.start()
        phases.mark("dslash")
        self._interior(out, inp, parity, dagger, a, x, b)
        if halo is not None:
            phases.mark("halo")
            ghost = halo.wait()
            phases.mark("dslash")
            self._exterior(out, ghost, parity, dagger, b)
            if emit is not None:
                phases.mark("halo")
                self.pack(out, parity, emit)

    def xpay_pack(self, p: np.ndarray, r: np.ndarray, beta: float, parity: int, dagger: bool) -> None:
        """``p = r + beta p``, then its faces for the next hop."""
        p *= beta
        p += r
        self.pack(p, parity, dagger)

    # -- reductions (local parts; the caller sums over ranks) -------------------------------
    def norm2(self, a: np.ndarray) -> np.ndarray:
        return np.array([np.vdot(a, a).real], dtype=np.float64)

    def redot(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.array([np.vdot(a, b).real], dtype=np.float64)

    def axpy_norm(self, x: np.ndarray, r: np.ndarray, p: np.ndarray, ap: np.ndarray, alpha: float) -> np.ndarray:
        """``x += alpha p``, ``r -= alpha Ap``; returns the local ``|r|^2``."""
        x += alpha * p
        r -= alpha * ap
        return self.norm2(r)

    # -- the device-resident CG's steps (_cgstate): here the scalars are a numpy array, summed by the host
    # collectives: the same algorithm as on the GPU, checked on machines without one -------------------
    def cg_state(self) -> np.ndarray:
        return np.zeros(cg.SLOTS)

    def dot_into(self, a: np.ndarray, b: np.ndarray, s: np.ndarray) -> None:
        s[cg.LOCAL] = np.vdot(a, b).real

    def cg_scalars(self, s: np.ndarray, step: int, delta2: float) -> None:
        from ... import collectives

        s[cg.LOCAL] = float(collectives.allreduce(self.world, s[cg.LOCAL:cg.LOCAL + 1])[0])
        cg.scalar_step(s, step, delta2)

    def axpy_norm_state(self, x: np.ndarray, r: np.ndarray, p: np.ndarray, ap: np.ndarray, s: np.ndarray) -> None:
        s[cg.LOCAL] = self.axpy_norm(x, r, p, ap, float(s[cg.ALPHA]))[0]

    def xpay_pack_state(self, p: np.ndarray, r: np.ndarray, s: np.ndarray, parity: int, dagger: bool) -> None:
        if not int(s[cg.FLAGS]) & cg.SKIP:
            self.xpay_pack(p, r, float(s[cg.BETA]), parity, dagger)

    def read_state(self, s: np.ndarray) -> np.ndarray:
        return s.copy()

    def write_state(self, s: np.ndarray, values: np.ndarray) -> None:
        s[:] = values

    def cg_resident(self, normal: Any, x: Any, r: Any, p: Any, ap: Any, s: Any, delta2: float, parity: int,
                    timed: bool, update: Any = None) -> None:
        return None  # no kernels: the batched CG runs its steps one by one, with the host collectives

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass
