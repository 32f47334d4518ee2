"""The distributed Wilson operator: one rank's part of ``M = 1 - kappa D``, even-odd, over any halo exchange.

The back-end half (``_cpu.Dslash`` or ``_cuda.Dslash``, from ``world.backend_module``) computes one hop
``out = a x + b D_{p <- 1-p} in`` on checkerboard halves in its own field layout; this file strings hops
into the operators the solver needs:

* ``M`` on a whole local field: ``out_e = in_e - kappa D_eo in_o``, ``out_o = in_o - kappa D_oe in_e``;
* ``M_pc = 1 - kappa^2 D_eo D_oe`` on the even sites and its adjoint (the hops with ``dagger``);
* the normal operator ``M_pc^dagger M_pc`` of the CG.

Precisions: ``double`` and ``single`` are the back-end modules' kernels; ``half`` is QUDA's 16-bit fixed point with a
norm per site, emulated (``_half``): single-precision kernels whose every written value is rounded onto the
half grid. The solver calls the vector updates and reductions through the operator, so that rounding and the
time split (``_phases``) happen in one place.

Faces. A hop needs the projected faces of its input in the halo exchange's send array. A hop can write the
faces of its own output for the next hop (``emit``), and the CG's ``p = r + beta p`` writes those of ``p``;
only a field that comes from outside (a source, a file) is packed on its own (``pack``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._lifecycle import Resource
from ...errors import ConfigError
from ._half import quantize, quantize_faces, quantize_gauge
from ._halo import make_halo
from ._lattice import Lattice
from ._phases import NO_PHASES

#: Precision name -> the complex dtype the fields are kept in (half: complex64 holding half's values).
PRECISIONS = {"double": np.complex128, "single": np.complex64, "half": np.complex64}
#: Significant digits of each, for ordering (a sloppy precision may not exceed the precise one).
RANK = {"half": 0, "single": 1, "double": 2}
EVEN, ODD = 0, 1


def check_precision(name: str, option: str = "--prec") -> Any:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ConfigError(f"{option} {name!r}: choose double, single or half") from None


class WilsonOperator(Resource):
    """Collective to create and close: the operator of one precision on ``world``, with its halo exchange."""

    _kind = "qcd operator"

    def __init__(self, world: Any, lattice: Lattice, gauge: Any, kappa: float, precision: str = "double",
                 halo: str = "rma") -> None:
        self.world = world
        self.lat = lattice
        self.kappa = float(kappa)
        self.precision = precision
        self.dtype = np.dtype(check_precision(precision))
        self.half = precision == "half"
        self.xp = world.xp
        self.halo = make_halo(halo, world, lattice, self.dtype)
        self.halo_name = halo
        self._impl = world.backend_module("circuslink.apps.qcd")
        if self.half:
            gauge = quantize_gauge(gauge.get() if hasattr(gauge, "get") else gauge)
        self.d = self._impl.Dslash(world, lattice, gauge, self.dtype, self.halo)
        self.phases = NO_PHASES
        self._tmp = [self.d.new_field() for _ in range(3)]
        self._register(world)

    # -- the time split ---------------------------------------------------------------------------
    def new_phases(self) -> Any:
        """A fresh time split on this back-end's clock (host clock on cpu, CUDA events on cuda)."""
        return self._impl.Phases()

    def time_phases(self, phases: Any) -> None:
        """Mark this operator's hops into ``phases`` (``_phases.NO_PHASES`` stops)."""
        self.phases = self.d.phases = phases

    # -- half precision: every written value onto the half grid -------------------------------
    def _round(self, *fields: Any) -> None:
        if self.half:
            for f in fields:
                quantize(*self.d.site_reals(f))

    def _round_faces(self) -> None:
        if self.half and self.halo is not None:
            quantize_faces(self.halo.send)

    # -- fields -----------------------------------------------------------------------------
    def split(self, psi: Any) -> tuple[Any, Any]:
        """A local field (T, Z, Y, X, 4, 3) -> its checkerboard halves in the back-end module's layout and precision."""
        even, odd = self.lat.split(self.xp.asarray(psi))
        out = self.d.from_half(even), self.d.from_half(odd)
        self._round(*out)
        return out

    def join(self, even: Any, odd: Any) -> Any:
        """The local field (T, Z, Y, X, 4, 3) from halves in the back-end module's layout."""
        return self.lat.join(self.d.to_half(even), self.d.to_half(odd))

    def convert(self, field: Any, source: WilsonOperator) -> Any:
        """A field of ``source``'s precision and layout in mine."""
        if source is self:
            return field.copy()
        out = self.d.from_half(source.d.to_half(field).astype(self.dtype))
        self._round(out)
        return out

    def zeros(self) -> Any:
        return self.d.new_field()

    # -- reductions: local part, then one all-reduce over ranks -----------------------------
    def allreduce(self, local: Any, op: str = "sum") -> np.ndarray:
        """Sum (or ``op``) of every rank's ``local`` (float64) as a numpy array: one global reduction."""
        from ... import collectives

        total = collectives.allreduce(self.world, local, op=op)
        return np.asarray(total.get() if hasattr(total, "get") else total, dtype=np.float64)

    def norm2(self, field: Any) -> float:
        return float(self.allreduce(self.d.norm2(field))[0])

    def redot(self, a: Any, b: Any) -> float:
        """Re <a, b> over every rank."""
        self.phases.mark("reduction")
        return float(self.allreduce(self.d.redot(a, b))[0])

    def cdot(self, a: Any, b: Any) -> complex:
        """<a, b> over every rank (one global sum of its real and imaginary parts)."""
        self.phases.mark("reduction")
        xp = self.xp
        local = xp.vdot(a, b)
        total = self.allreduce(xp.stack([local.real, local.imag]).astype(xp.float64))
        return complex(total[0], total[1])

    # -- the CG's vector updates (rounded to half where the operator is half) -------------------
    def axpy_norm(self, x: Any, r: Any, p: Any, ap: Any, alpha: float) -> float:
        """``x += alpha p``, ``r -= alpha Ap``; returns the global ``|r|^2`` (of the stored r)."""
        self.phases.mark("vector")
        local = self.d.axpy_norm(x, r, p, ap, alpha)
        if self.half:
            self._round(x, r)
            local = self.d.norm2(r)
        self.phases.mark("reduction")
        return float(self.allreduce(local)[0])

    def xpay_pack(self, p: Any, r: Any, beta: float, parity: int, dagger: bool) -> None:
        """``p = r + beta p`` and its faces for the next hop."""
        self.phases.mark("vector")
        self.d.xpay_pack(p, r, beta, parity, dagger)
        if self.half:
            self._round(p)
            self.d.pack(p, parity, dagger)  # faces of the rounded p
            self._round_faces()

    def caxpy(self, a: complex, x: Any, y: Any) -> None:
        """``y += a x`` (complex a)."""
        self.phases.mark("vector")
        y += self.dtype.type(a) * x
        self._round(y)

    # -- operators --------------------------------------------------------------------------
    def pack(self, field: Any, parity: int, dagger: bool) -> None:
        if self.halo is None:
            return  # one rank in every direction: no faces
        self.phases.mark("halo")
        self.d.pack(field, parity, dagger)
        self._round_faces()

    def hop(self, out: Any, inp: Any, parity: int, dagger: bool, a: float = 0.0, x: Any = None, b: float = 1.0,
            emit: bool | None = None) -> None:
        """``out = a x + b D_{parity <- 1-parity} inp``; the faces of ``inp`` must be packed."""
        self.d.apply(out, inp, parity, dagger, a, x, b, emit)
        if self.half:
            self._round(out)
            if emit is not None:  # the faces of the rounded output, rounded in turn
                self.d.pack(out, parity, emit)
                self._round_faces()

    def apply(self, psi: Any, dagger: bool = False) -> Any:
        """``M psi`` (``M^dagger psi``) of a local field (T, Z, Y, X, 4, 3): the distributed full operator."""
        even, odd = self.split(psi)
        out_e, out_o = self.d.new_field(), self.d.new_field()
        self.apply_eo(out_e, out_o, even, odd, dagger)
        return self.join(out_e, out_o)

    def apply_eo(self, out_e: Any, out_o: Any, even: Any, odd: Any, dagger: bool = False) -> None:
        self.pack(odd, ODD, dagger)
        self.hop(out_e, odd, EVEN, dagger, a=1.0, x=even, b=-self.kappa)
        self.pack(even, EVEN, dagger)
        self.hop(out_o, even, ODD, dagger, a=1.0, x=odd, b=-self.kappa)

    def mpc(self, out: Any, inp: Any, dagger: bool, emit: bool | None = None) -> None:
        """``out = (1 - kappa^2 D_eo D_oe) inp`` on even sites (its adjoint with ``dagger``); the faces of
        ``inp`` must be packed for ``dagger``. With ``emit`` the faces of ``out`` are packed for the next hop."""
        tmp = self._tmp[0]
        self.hop(tmp, inp, ODD, dagger, emit=dagger)
        self.hop(out, tmp, EVEN, dagger, a=1.0, x=inp, b=-self.kappa * self.kappa, emit=emit)

    def normal(self, out: Any, inp: Any) -> None:
        """``out = M_pc^dagger M_pc inp`` (the faces of ``inp`` packed for a plain hop)."""
        y = self._tmp[1]
        self.mpc(y, inp, dagger=False, emit=True)
        self.mpc(out, y, dagger=True)

    # -- bookkeeping ------------------------------------------------------------------------
    @property
    def halo_wait_seconds(self) -> float:
        return self.halo.wait_seconds if self.halo is not None else 0.0

    def synchronize(self) -> None:
        self.d.synchronize()

    def _close(self, timeout: float | None) -> None:
        self.d.close()
        if self.halo is not None:
            self.halo.close(timeout)

    def _release_local(self) -> None:
        if self.halo is not None:
            self.halo.release_local()
