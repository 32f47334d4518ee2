"""The Wilson-Dirac operator on one rank, written plainly: the reference every other path is checked against.

Conventions (QUDA's, docs/qcd.md):

* ``M = 1 - kappa D`` with
  ``D psi(x) = sum_mu (1 - gamma_mu) U_mu(x) psi(x + mu) + (1 + gamma_mu) U_mu(x - mu)^dagger psi(x - mu)``;
  ``M^dagger = gamma_5 M gamma_5`` flips the projector signs.
* DeGrand-Rossi gammas: ``gamma_1 = ((0, i s1), (-i s1, 0))``, ``gamma_2 = ((0, -i s2), (i s2, 0))``,
  ``gamma_3 = ((0, i s3), (-i s3, 0))``, ``gamma_4 = ((0, 1), (1, 0))``, ``gamma_5 = gamma_4 gamma_1 gamma_2 gamma_3``
  (= diag(-1, -1, 1, 1)).
* Periodic in x, y, z; antiperiodic in t.
* ``psi[t, z, y, x, spin, colour]``, ``U[mu, t, z, y, x, a, b]`` with mu = 0:x, 1:y, 2:z, 3:t.

Every function takes numpy or CuPy arrays (the array module is the input's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError

_S1 = np.array([[0, 1], [1, 0]], dtype=complex)
_S2 = np.array([[0, -1j], [1j, 0]], dtype=complex)
_S3 = np.array([[1, 0], [0, -1]], dtype=complex)
_Z2 = np.zeros((2, 2), dtype=complex)
_I2 = np.eye(2, dtype=complex)


def _blocks(upper_right: np.ndarray, lower_left: np.ndarray) -> np.ndarray:
    return np.block([[_Z2, upper_right], [lower_left, _Z2]])


#: gamma_1 .. gamma_4 (index 0..3 = x, y, z, t) in the DeGrand-Rossi basis.
GAMMA = np.array([
    _blocks(1j * _S1, -1j * _S1),
    _blocks(-1j * _S2, 1j * _S2),
    _blocks(1j * _S3, -1j * _S3),
    _blocks(_I2, _I2),
])
GAMMA5 = GAMMA[3] @ GAMMA[0] @ GAMMA[1] @ GAMMA[2]
#: The upper-right 2x2 block A_mu of each gamma (gamma_mu = ((0, A), (A^dagger, 0))): what spin
#: projection and reconstruction use (docs/qcd.md, "half spinors").
GAMMA_BLOCK = GAMMA[:, :2, 2:].copy()

DIRECTIONS = "xyzt"


def array_module(a: Any):
    """numpy for numpy arrays, cupy for cupy arrays."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def spinor_shape(dims: tuple[int, int, int, int]) -> tuple[int, ...]:
    """(T, Z, Y, X, 4, 3) for ``dims`` = (X, Y, Z, T)."""
    x, y, z, t = dims
    return (t, z, y, x, 4, 3)


def gauge_shape(dims: tuple[int, int, int, int]) -> tuple[int, ...]:
    """(4, T, Z, Y, X, 3, 3) for ``dims`` = (X, Y, Z, T)."""
    x, y, z, t = dims
    return (4, t, z, y, x, 3, 3)


def dims_of_spinor(psi: Any) -> tuple[int, int, int, int]:
    """(X, Y, Z, T) of a spinor field."""
    t, z, y, x = psi.shape[:4]
    return (x, y, z, t)


def _check_fields(U: Any, psi: Any) -> None:
    if psi.ndim != 6 or psi.shape[4:] != (4, 3):
        raise ConfigError(f"wilson: psi must have shape (T, Z, Y, X, 4, 3), got {tuple(psi.shape)}")
    want = (4, *psi.shape[:4], 3, 3)
    if tuple(U.shape) != want:
        raise ConfigError(f"wilson: U must have shape {want} (mu, T, Z, Y, X, 3, 3) to match psi, "
                          f"got {tuple(U.shape)}")


def shift(field: Any, mu: int, step: int, antiperiodic_t: bool = True) -> Any:
    """``field(x + step * mu)`` for step = +1 or -1 (axes t, z, y, x first); a spinor crossing t's
    boundary changes sign when ``antiperiodic_t``."""
    xp = array_module(field)
    axis = 3 - mu
    out = xp.roll(field, -step, axis=axis)
    if mu == 3 and antiperiodic_t:
        edge = [slice(None)] * field.ndim
        edge[axis] = -1 if step > 0 else 0
        out[tuple(edge)] *= -1
    return out


def _colour(U: Any, psi: Any) -> Any:
    """``sum_b U[..., a, b] psi[..., s, b]``."""
    xp = array_module(psi)
    return xp.matmul(psi, xp.swapaxes(U, -1, -2))


def _colour_dagger(U: Any, psi: Any) -> Any:
    """``sum_b conj(U[..., b, a]) psi[..., s, b]``."""
    xp = array_module(psi)
    return xp.matmul(psi, U.conj())


def _spin(matrix: np.ndarray, psi: Any) -> Any:
    xp = array_module(psi)
    return xp.matmul(xp.asarray(matrix.astype(psi.dtype)), psi)


def hopping(U: Any, psi: Any, dagger: bool = False) -> Any:
    """``D psi`` (``D^dagger psi`` with ``dagger``): the sum over the 8 neighbours."""
    _check_fields(U, psi)
    xp = array_module(psi)
    sign = 1 if dagger else -1  # forward projector 1 + sign * gamma_mu
    eye = np.eye(4)
    out = xp.zeros_like(psi)
    for mu in range(4):
        forward = _colour(U[mu], shift(psi, mu, +1))
        backward = _colour_dagger(shift(U[mu], mu, -1, antiperiodic_t=False), shift(psi, mu, -1))
        out += _spin(eye + sign * GAMMA[mu], forward)
        out += _spin(eye - sign * GAMMA[mu], backward)
    return out


def wilson(U: Any, psi: Any, kappa: float, dagger: bool = False) -> Any:
    """``M psi = psi - kappa D psi`` (``M^dagger psi`` with ``dagger``), one rank, numpy or CuPy."""
    return psi - kappa * hopping(U, psi, dagger)


def gamma5(psi: Any) -> Any:
    """``gamma_5 psi``."""
    return _spin(GAMMA5, psi)


# -- random fields ----------------------------------------------------------------------------------
def random_su3(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` Haar-random SU(3) matrices (complex128, shape (n, 3, 3)).

    QR of a complex Gaussian matrix with the phases of R's diagonal moved into Q is Haar on U(3)
    (Mezzadri, "How to generate random matrices from the classical compact groups"); dividing by
    a cube root of the determinant multiplies by a centre element, which keeps it Haar, on SU(3)."""
    z = (rng.standard_normal((n, 3, 3)) + 1j * rng.standard_normal((n, 3, 3))) / np.sqrt(2.0)
    q, r = np.linalg.qr(z)
    d = np.diagonal(r, axis1=-2, axis2=-1)
    q = q * (d / np.abs(d))[:, None, :]
    det = np.linalg.det(q)
    return q / (det ** (1.0 / 3.0))[:, None, None]


def random_gauge(dims: tuple[int, int, int, int], seed: int, dtype: Any = np.complex128) -> np.ndarray:
    """A Haar-random ("hot") SU(3) gauge field ``U[mu, t, z, y, x, a, b]`` for ``dims`` = (X, Y, Z, T)."""
    shape = gauge_shape(dims)
    n = int(np.prod(shape[:5]))
    rng = np.random.default_rng([int(seed), 0x5AE])
    return random_su3(rng, n).reshape(shape).astype(dtype)


def random_spinor(dims: tuple[int, int, int, int], seed: int, dtype: Any = np.complex128) -> np.ndarray:
    """A complex Gaussian spinor field ``psi[t, z, y, x, spin, colour]``."""
    shape = spinor_shape(dims)
    rng = np.random.default_rng([int(seed), 0x591])
    return ((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2.0)).astype(dtype)


def unit_gauge(dims: tuple[int, int, int, int], dtype: Any = np.complex128) -> np.ndarray:
    """The free field: every link the identity."""
    shape = gauge_shape(dims)
    return np.broadcast_to(np.eye(3, dtype=dtype), shape).copy()
