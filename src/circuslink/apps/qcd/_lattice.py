"""The decomposition: which part of the global lattice a rank holds, its neighbours, its checkerboard and its faces.

Ranks form a grid ``(Px, Py, Pz, Pt)``, x fastest: rank = ((pt * Pz + pz) * Py + py) * Px + px. Each holds a
local lattice ``(X, Y, Z, T)`` of every even extent (the checkerboard must not break across ranks: with even
local extents a site's parity is the same locally and globally).

Checkerboard order (one parity, ``Vh = X Y Z T / 2`` sites): site (x, y, z, t) of parity (x + y + z + t) % 2
has index ``lex // 2`` with ``lex = ((t Z + z) Y + y) X + x``.

Faces. For each partitioned direction mu (``P_mu > 1``) a rank exchanges two faces of ``V / (2 L_mu)`` half
spinors (one parity): slot (mu, 0) holds what the forward hop across my upper boundary needs (sent by my
forward neighbour from its sites at x_mu = 0), slot (mu, 1) what the backward hop across my lower boundary
needs (sent by my backward neighbour from its sites at x_mu = L_mu - 1). Within a face a site is numbered by
its other three coordinates, ``lex3 // 2`` (t, z, y, x order without mu), the same on both sides. Send and
ghost arrays are ``(6, S)`` complex: component (spin s < 2, colour c) = 3 s + c, then the ``S`` face sites of
every slot one after the other (docs/qcd.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from ...errors import ConfigError

AXES = "xyzt"


def _four_ints(values: Sequence[int], what: str) -> tuple[int, int, int, int]:
    try:
        out = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be 4 integers (x y z t), got {values!r}") from None
    if len(out) != 4:
        raise ConfigError(f"{what} must be 4 integers (x y z t), got {len(out)}: {list(values)!r}")
    if any(v <= 0 for v in out):
        raise ConfigError(f"{what} {'x'.join(map(str, out))} must be positive in every direction")
    return out  # type: ignore[return-value]


def fmt(dims: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in dims)


def check_local(local: Sequence[int], what: str = "local lattice") -> tuple[int, int, int, int]:
    """Refuse odd local extents (they break the even-odd checkerboard)."""
    local = _four_ints(local, what)
    odd = [f"{AXES[mu]} = {local[mu]}" for mu in range(4) if local[mu] % 2]
    if odd:
        raise ConfigError(f"{what} {fmt(local)}: odd extent {', '.join(odd)}; even-odd (checkerboard) "
                          "preconditioning needs every local extent even")
    return local


def local_from_global(global_dims: Sequence[int], grid: Sequence[int]) -> tuple[int, int, int, int]:
    """The local lattice of a global lattice split over ``grid``; refuses a grid that does not divide it."""
    global_dims = _four_ints(global_dims, "lattice")
    grid = _four_ints(grid, "--grid")
    bad = [f"{AXES[mu]}: {global_dims[mu]} % {grid[mu]} = {global_dims[mu] % grid[mu]}"
           for mu in range(4) if global_dims[mu] % grid[mu]]
    if bad:
        raise ConfigError(f"lattice {fmt(global_dims)} is not divisible by the grid {fmt(grid)} ({'; '.join(bad)})")
    return check_local(tuple(g // p for g, p in zip(global_dims, grid, strict=True)),
                       f"local lattice (lattice {fmt(global_dims)} over grid {fmt(grid)})")


class Lattice:
    """One rank's view of the decomposition (pure geometry: no memory, no communication)."""

    def __init__(self, local: Sequence[int], grid: Sequence[int], rank: int) -> None:
        self.grid = _four_ints(grid, "--grid")
        self.local = check_local(local)
        self.nranks = int(np.prod(self.grid))
        if not 0 <= rank < self.nranks:
            raise ConfigError(f"rank {rank} is outside the grid {fmt(self.grid)} ({self.nranks} ranks)")
        self.rank = rank
        self.coords = self.coords_of(rank)
        self.global_dims = tuple(l * p for l, p in zip(self.local, self.grid, strict=True))
        self.volume = int(np.prod(self.local))
        self.half = self.volume // 2
        self.partitioned = tuple(p > 1 for p in self.grid)
        self.forward = tuple(self._neighbour(mu, +1) for mu in range(4))
        self.backward = tuple(self._neighbour(mu, -1) for mu in range(4))
        self.face_sites = tuple(self.volume // (2 * self.local[mu]) for mu in range(4))
        # Antiperiodic in t: a hop that crosses the global t boundary (upward from the last t slice of
        # the last rank in t, downward from the first of the first) picks up a minus sign. With Pt = 1
        # the local wrap is that boundary.
        self.forward_sign = tuple(-1.0 if mu == 3 and self.coords[3] == self.grid[3] - 1 else 1.0 for mu in range(4))
        self.backward_sign = tuple(-1.0 if mu == 3 and self.coords[3] == 0 else 1.0 for mu in range(4))
        self.slots: list[tuple[int, int]] = [(mu, d) for mu in range(4) if self.partitioned[mu] for d in (0, 1)]
        self.slot_offset: dict[tuple[int, int], int] = {}
        at = 0
        for mu, d in self.slots:
            self.slot_offset[(mu, d)] = at
            at += self.face_sites[mu]
        self.face_total = at  # S

    # -- ranks --------------------------------------------------------------------------------
    def coords_of(self, rank: int) -> tuple[int, int, int, int]:
        px, py, pz, _ = self.grid
        return (rank % px, (rank // px) % py, (rank // (px * py)) % pz, rank // (px * py * pz))

    def rank_of(self, coords: Sequence[int]) -> int:
        px, py, pz, _ = self.grid
        c = [int(v) % p for v, p in zip(coords, self.grid, strict=True)]
        return ((c[3] * pz + c[2]) * py + c[1]) * px + c[0]

    def _neighbour(self, mu: int, step: int) -> int:
        c = list(self.coords)
        c[mu] += step
        return self.rank_of(c)

    def block(self, rank: int | None = None) -> tuple[slice, slice, slice, slice]:
        """The (t, z, y, x) slices of the global lattice that ``rank`` (default: mine) holds."""
        c = self.coords if rank is None else self.coords_of(rank)
        return tuple(slice(c[mu] * self.local[mu], (c[mu] + 1) * self.local[mu]) for mu in (3, 2, 1, 0))

    def describe(self) -> str:
        return f"lattice {fmt(self.global_dims)} (local {fmt(self.local)} on grid {fmt(self.grid)})"

    # -- checkerboard -------------------------------------------------------------------------
    def site_coords(self, parity: int) -> np.ndarray:
        """(4, Vh) int64: x, y, z, t of each checkerboard site of ``parity``."""
        return self._site_coords[parity]

    @cached_property
    def _site_coords(self) -> tuple[np.ndarray, np.ndarray]:
        X, Y, Z, _ = self.local
        pair = 2 * np.arange(self.half, dtype=np.int64)
        x0 = pair % X
        rest = pair // X
        y, z, t = rest % Y, (rest // Y) % Z, rest // (Y * Z)
        out = []
        for parity in (0, 1):
            x = x0 + ((parity + y + z + t) & 1)
            out.append(np.stack([x, y, z, t]))
        return out[0], out[1]

    def lex(self, c: np.ndarray) -> np.ndarray:
        X, Y, Z, _ = self.local
        return ((c[3] * Z + c[2]) * Y + c[1]) * X + c[0]

    def face_index(self, c: np.ndarray, mu: int) -> np.ndarray:
        """Index of sites ``c`` within a face of direction ``mu`` (their other three coordinates)."""
        others = [nu for nu in (3, 2, 1, 0) if nu != mu]
        idx = np.zeros_like(c[0])
        for nu in others:
            idx = idx * self.local[nu] + c[nu]
        return idx // 2

    def split(self, field: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(even, odd) checkerboard halves, shape (Vh, ...), of a local field of shape (T, Z, Y, X, ...)."""
        xp = _xp(field)
        flat = field.reshape((self.volume, *field.shape[4:]))
        return tuple(flat[xp.asarray(self.lex(self.site_coords(p)))] for p in (0, 1))  # type: ignore[return-value]

    def join(self, even, odd):
        """The local field (T, Z, Y, X, ...) from its checkerboard halves."""
        xp = _xp(even)
        X, Y, Z, T = self.local
        flat = xp.empty((self.volume, *even.shape[1:]), dtype=even.dtype)
        for p, half in ((0, even), (1, odd)):
            flat[xp.asarray(self.lex(self.site_coords(p)))] = half
        return flat.reshape((T, Z, Y, X, *even.shape[1:]))

    def on_boundary(self, parity: int) -> np.ndarray:
        """Checkerboard indices (int32, ascending) of the sites of ``parity`` that touch a partitioned boundary."""
        c = self.site_coords(parity)
        hit = np.zeros(self.half, dtype=bool)
        for mu in range(4):
            if self.partitioned[mu]:
                hit |= (c[mu] == 0) | (c[mu] == self.local[mu] - 1)
        return np.nonzero(hit)[0].astype(np.int32)


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np
