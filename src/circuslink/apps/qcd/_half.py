"""Half precision as QUDA stores it, emulated: 16-bit fixed point with a norm per site, float32 arithmetic.

QUDA's half-precision spinor keeps, for each site, a float ``norm`` (the largest magnitude of the site's 24
reals) and the reals as 16-bit integers ``q = round(v / norm * 32767)``; a kernel reads ``v = q * norm /
32767`` and computes in float32. The scale is per site, so a residual that shrinks by ten orders of magnitude
keeps its 4-5 significant digits (a plain float16 would underflow). Gauge links are fixed point with one scale
for the field (SU(3) entries are at most 1 in magnitude).

Here the fields stay complex64 arrays and every value a kernel writes is rounded onto that grid in place
(``quantize``): the numbers are QUDA's half, the memory traffic and halo bytes are still float32's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_SHORT = 32767.0


def _xp(a: Any):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def quantize(reals: Any, site_axes: tuple[int, ...]) -> None:
    """Round ``reals`` (a float32 view) in place to 16-bit fixed point scaled by the largest magnitude over
    ``site_axes`` (one site's reals)."""
    xp = _xp(reals)
    norm = xp.abs(reals).max(axis=site_axes, keepdims=True)
    scale = xp.where(norm > 0, MAX_SHORT / xp.where(norm > 0, norm, 1), 0).astype(reals.dtype)
    reals[...] = xp.rint(reals * scale) / xp.where(scale > 0, scale, 1)


def quantize_faces(send: Any) -> None:
    """The faces of a send array ``(6, S)`` complex64: 12 reals per face site, one norm each."""
    if send is None or send.size == 0:
        return
    quantize(send.view(np.float32).reshape(send.shape[0], -1, 2), (0, 2))


def quantize_gauge(U: np.ndarray) -> np.ndarray:
    """Links on a 16-bit fixed-point grid with one scale (the largest magnitude of the field), complex64."""
    U = np.asarray(U, dtype=np.complex64)
    reals = U.view(np.float32).copy()
    scale = float(np.abs(reals).max()) or 1.0
    reals = np.rint(reals / scale * MAX_SHORT) * np.float32(scale / MAX_SHORT)
    return reals.astype(np.float32).view(np.complex64)
