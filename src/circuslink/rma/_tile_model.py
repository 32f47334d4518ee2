"""UZURA's corner-turn model, adapted to a GPU tile transpose: which tile shape a transposing put uses.

UZURA (a NIC that transposes during RDMA) turns a matrix in a buffer of m FIFOs of depth n
and predicts its bandwidth from the buffer's shape (the UZURA paper, section 4, Fig. 9):

* a bus moves bursts of w words of c bytes with X cycles of overhead each, so its
  efficiency is ``B_io = B_ideal * c*w / (c*w + X)``;
* the buffer holds ``S = m*n`` words; reading fills it in bursts of one length and writing
  drains it in bursts of the other, and both sides are equally efficient when
  ``m = (X_m / X_n) * n`` (the balance);
* a start-up cost k per buffer turn gives ``B_actual = M / (M / B_io + k)`` for M bytes a turn.

On a GPU the buffer is a tile in shared memory: a block reads an m x n tile of the source
(m rows, bursts of ``n*c`` bytes, coalesced), turns it, and writes n rows of the
destination (bursts of ``m*c`` bytes) into the peer. So for a tile of M = m*n*c bytes

    B_io(m, n)     = B_ideal * M / (M + m*X_r + n*X_w)      (m read bursts, n write bursts)
    B_actual(m, n) = M / (M / B_io + k)

which is UZURA's formula with w = n and X = 2*X_r at the balance m = (X_w / X_r) * n.
A whole put of a rows x cols block adds a fixed start cost t0 (launch, post, signal), and
partial tiles at the edges still pay whole bursts, so its time is

    t = t0 + (T + R*X_r + W*X_w) / B_ideal + tiles*k

with T the bytes, R = rows*ceil(cols/n) read bursts, W = cols*ceil(rows/m) write bursts.
That is linear in (1/B_ideal, X_r/B_ideal, X_w/B_ideal, k, t0), so :func:`fit` recovers the
constants from a few measured tile shapes by (non-negative) least squares on relative
error. ``B_ideal`` starts from the probe's floor (the contiguous copy the hardware allows);
the fit may lower it (``efficiency`` < 1: what even the best tile loses to the turn).

:func:`choose` ranks candidate tiles by predicted bandwidth. When the top candidates are
within ``unsure`` (10%) of each other the model cannot tell them apart: it measures those
(``measure`` callback) and keeps the fastest. Choices are cached per key for the process.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ConfigError

UNSURE = 0.10  # predicted top candidates closer than this are measured, not guessed


@dataclass(frozen=True)
class TileModel:
    """Fitted constants of the model (SI units: bytes, seconds)."""

    b_ideal: float      # bytes/s a contiguous copy reaches (the probe's floor)
    x_read: float       # bytes-equivalent of overhead per read burst (one tile row of the source)
    x_write: float      # ... per write burst (one tile row of the destination)
    k: float            # seconds per tile (index math, barriers), as seen by the whole put
    t0: float = 0.0     # seconds per put (launch, post, signal)
    efficiency: float = 1.0  # fitted share of b_ideal that even long bursts reach

    # -- UZURA's equations --------------------------------------------------------------------
    @staticmethod
    def burst_efficiency(burst_bytes: float, overhead_bytes: float) -> float:
        """c*w / (c*w + X): the share of the bus a burst of ``burst_bytes`` uses."""
        return burst_bytes / (burst_bytes + overhead_bytes)

    @property
    def b_eff(self) -> float:
        return self.b_ideal * self.efficiency

    def b_io(self, m: int, n: int, elem_bytes: int) -> float:
        """Bandwidth of the tile turn without start-up: B_ideal * M / (M + m*X_r + n*X_w)."""
        tile = m * n * elem_bytes
        return self.b_eff * tile / (tile + m * self.x_read + n * self.x_write)

    def b_actual(self, m: int, n: int, elem_bytes: int) -> float:
        """UZURA's B_actual = M / (M / B_io + k) for one tile of M bytes."""
        tile = m * n * elem_bytes
        return tile / (tile / self.b_io(m, n, elem_bytes) + self.k)

    def balanced_rows(self, n: int) -> float:
        """The balance m = (X_m / X_n) * n: tile rows for which both sides are equally efficient."""
        if self.x_read <= 0:
            return math.inf
        return self.x_write / self.x_read * n

    # -- a whole put ----------------------------------------------------------------------------
    def time(self, tile: tuple[int, int], elem_bytes: int, rows: int, cols: int) -> float:
        """Predicted seconds for one put of a rows x cols block with tile (m, n)."""
        return float(_features(tile, elem_bytes, rows, cols) @ self._coefficients())

    def bandwidth(self, tile: tuple[int, int], elem_bytes: int, rows: int, cols: int) -> float:
        """Predicted bytes/s for one put of a rows x cols block with tile (m, n)."""
        return rows * cols * elem_bytes / self.time(tile, elem_bytes, rows, cols)

    def _coefficients(self) -> np.ndarray:
        inv = 1.0 / self.b_eff
        return np.array([inv, self.x_read * inv, self.x_write * inv, self.k, self.t0])

    def describe(self) -> str:
        return (f"B_ideal {self.b_ideal / 1e9:.1f} GB/s x efficiency {self.efficiency:.3f}, X_read "
                f"{self.x_read:.1f} B, X_write {self.x_write:.1f} B, k {self.k * 1e9:.1f} ns/tile, "
                f"t0 {self.t0 * 1e6:.2f} us/put")

    def as_dict(self) -> dict:
        return {"b_ideal_GBps": self.b_ideal / 1e9, "efficiency": self.efficiency, "x_read_B": self.x_read,
                "x_write_B": self.x_write, "k_ns": self.k * 1e9, "t0_us": self.t0 * 1e6}


def _features(tile: tuple[int, int], elem_bytes: int, rows: int, cols: int) -> np.ndarray:
    """(T, read bursts, write bursts, tiles, 1): the put's time is their dot product with the constants."""
    m, n = tile
    total = rows * cols * elem_bytes
    across, down = -(-cols // n), -(-rows // m)
    return np.array([total, rows * across, cols * down, across * down, 1.0], dtype=np.float64)


@dataclass(frozen=True)
class Sample:
    """One measured put: tile (m, n), element size, block shape and the seconds it took."""

    tile: tuple[int, int]
    elem_bytes: int
    rows: int
    cols: int
    seconds: float


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best over every active set."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = sol
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best


def fit(samples: Sequence[Sample], b_ideal: float) -> TileModel:
    """Fit (efficiency, X_r, X_w, k, t0) to measured puts, given the probe's ``b_ideal`` (bytes/s).

    Minimises the relative error of the predicted times (each row divided by its measured
    time), with every constant non-negative and the efficiency at most 1.
    """
    if b_ideal <= 0 or not math.isfinite(b_ideal):
        raise ConfigError(f"tile model: b_ideal must be a positive bandwidth, got {b_ideal!r}")
    good = [s for s in samples if s.seconds > 0 and math.isfinite(s.seconds)]
    if len(good) < 2:
        raise ConfigError(f"tile model: fitting needs at least 2 measured puts, got {len(good)}")
    a = np.array([_features(s.tile, s.elem_bytes, s.rows, s.cols) for s in good])
    t = np.array([s.seconds for s in good])
    # Column scaling keeps the tiny and the huge unknowns comparable for lstsq.
    scale = np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)
    x = _nnls(a / scale / t[:, None], np.ones_like(t)) / scale
    inv_b = x[0]
    if inv_b < 1.0 / b_ideal:  # faster than the floor: noise; clamp to the floor and refit the rest
        rest = _nnls(a[:, 1:] / scale[1:] / t[:, None], 1.0 - a[:, 0] / b_ideal / t) / scale[1:]
        x = np.concatenate([[1.0 / b_ideal], rest])
        inv_b = x[0]
    efficiency = 1.0 / (inv_b * b_ideal)
    return TileModel(b_ideal=b_ideal, x_read=x[1] / inv_b, x_write=x[2] / inv_b, k=x[3], t0=x[4],
                     efficiency=efficiency)


def errors(model: TileModel, samples: Iterable[Sample]) -> list[float]:
    """Relative error of the predicted bandwidth against each measured one ((pred - meas) / meas)."""
    out = []
    for s in samples:
        measured = s.rows * s.cols * s.elem_bytes / s.seconds
        out.append(model.bandwidth(s.tile, s.elem_bytes, s.rows, s.cols) / measured - 1.0)
    return out


# -- candidates and the choice ------------------------------------------------------------------
def candidates(elem_bytes: int, max_tile_bytes: int, min_elems: int = 256, sides: Sequence[int] = (8, 16, 32, 64, 128)
               ) -> list[tuple[int, int]]:
    """Power-of-two tiles (m, n) whose padded buffer m*(n+1)*c fits ``max_tile_bytes`` and that give
    every one of ``min_elems`` threads at least one element."""
    out = []
    for m in sides:
        for n in sides:
            if m * n >= min_elems and m * (n + 1) * elem_bytes <= max_tile_bytes:
                out.append((m, n))
    return out


def rank_tiles(model: TileModel, tiles: Iterable[tuple[int, int]], elem_bytes: int, rows: int, cols: int
               ) -> list[tuple[tuple[int, int], float]]:
    """(tile, predicted bytes/s), fastest first."""
    scored = [(t, model.bandwidth(t, elem_bytes, rows, cols)) for t in tiles]
    return sorted(scored, key=lambda x: -x[1])


_cache: dict[tuple, tuple[int, int]] = {}


def choose(model: TileModel, tiles: Sequence[tuple[int, int]], elem_bytes: int, rows: int, cols: int,
           key: tuple | None = None, measure: Callable[[tuple[int, int]], float] | None = None,
           unsure: float = UNSURE) -> tuple[int, int]:
    """The tile the put uses: the model's best, or, where the top candidates are within ``unsure``
    of each other and ``measure`` (tile -> seconds) is given, the fastest of those measured.

    The answer is cached per ``key`` (e.g. (back-end, dtype, rows, cols)) for the process.
    """
    if not tiles:
        raise ConfigError(f"tile model: no candidate tile for {elem_bytes}-byte elements")
    if key is not None and key in _cache:
        return _cache[key]
    ranked = rank_tiles(model, tiles, elem_bytes, rows, cols)
    best_bw = ranked[0][1]
    close = [t for t, bw in ranked if bw >= (1.0 - unsure) * best_bw]
    if len(close) > 1 and measure is not None:
        timed = sorted((measure(t), i, t) for i, t in enumerate(close))
        pick = timed[0][2]
    else:
        pick = ranked[0][0]
    if key is not None:
        _cache[key] = pick
    return pick


def forget_choices() -> None:
    """Drop the cached choices (tests; a re-calibrated model)."""
    _cache.clear()


def with_floor(model: TileModel, b_ideal: float) -> TileModel:
    """The same fitted overheads under another floor (the probe of this run)."""
    return replace(model, b_ideal=b_ideal)


def calibration_tiles(tiles: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """A few tiles that vary both sides: the extremes of the aspect ratio, the largest and the smallest
    (what :func:`fit` needs to separate X_r, X_w and k)."""
    by_aspect = sorted(tiles, key=lambda t: (t[0] / t[1], t[0] * t[1]))
    by_area = sorted(tiles, key=lambda t: (t[0] * t[1], abs(math.log2(t[0] / t[1]))))
    picks = [by_aspect[0], by_aspect[-1], by_area[-1], by_area[0], by_aspect[len(by_aspect) // 2]]
    return list(dict.fromkeys(picks))
