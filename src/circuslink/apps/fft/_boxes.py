"""Boxes, decompositions and the puts of a reshape: the FFT's geometry, with no world and no back-end.

A :class:`Box` is the part of the global index space a rank holds (half-open ranges per axis) and the
order its memory stores the axes in (slowest first), as heFFTe's ``box3d`` has. A *layout* is every
rank's box. An FFT runs in *stages*: in each, every rank holds whole lines along the axes it transforms,
stored innermost, so the transform is a contiguous batched cuFFT (numpy on the cpu). Between stages
a *reshape* moves every rank's part of the next layout to its owner; :func:`copy_pieces` turns one such
part (the intersection of my box and the owner's) into the fewest puts: axes that nest in both storage
orders merge, and what is left is one transposing put (the axis contiguous at the source is not the one
contiguous at the destination: UZURA's case) or one block-stride write (the same axis is contiguous at
both ends), repeated over any axes that do not merge.

Slab (2-D and 3-D): stage A splits axis 0 and transforms the others; stage B splits axis 1 and
transforms axis 0, stored innermost (order (1, 2, 0)): the reshape between them is one transposing put per
pair of ranks. Pencil (3-D, a P0 x P1 grid): stage A splits axes 0 and 1 (order (0, 1, 2), transforms
axis 2), B splits axes 0 and 2 (order (0, 2, 1), transforms axis 1), C splits axes 1 and 2 (order
(2, 1, 0), transforms axis 0); each reshape moves data within a row or a column of the grid.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError

MAX_PUTS = 1 << 16  # a reshape that needs more separate puts per rank than this is refused (boxes too ragged)


def _ints(name: str, values: Any, where: str) -> tuple[int, ...]:
    try:
        out = tuple(values)
    except TypeError:
        raise ConfigError(f"{where}: {name} must be a sequence of integers, got {values!r}") from None
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise ConfigError(f"{where}: {name} {tuple(out)!r} must hold integers")
    return tuple(int(v) for v in out)


@dataclass(frozen=True)
class Box:
    """Indices ``low[a] <= i < high[a]`` on every axis a, stored in memory with ``order`` (the axes from the
    slowest to the fastest; default C order 0, 1, ..., d-1).

    heFFTe's box3d with exclusive upper bounds. A box may be empty (a rank with nothing to hold).
    """

    low: tuple[int, ...]
    high: tuple[int, ...]
    order: tuple[int, ...] = ()

    def __init__(self, low: Sequence[int], high: Sequence[int], order: Sequence[int] | None = None) -> None:
        where = "fft: Box"
        lo, hi = _ints("low", low, where), _ints("high", high, where)
        if len(lo) != len(hi):
            raise ConfigError(f"{where}: low {lo} and high {hi} have different lengths")
        if not lo:
            raise ConfigError(f"{where}: low and high are empty: a box needs at least one axis")
        od = tuple(range(len(lo))) if order is None or len(tuple(order)) == 0 else _ints("order", order, where)
        if sorted(od) != list(range(len(lo))):
            raise ConfigError(f"{where}: order {od} is not a permutation of the axes 0..{len(lo) - 1}")
        for a, (x, y) in enumerate(zip(lo, hi, strict=True)):
            if x < 0 or y < x:
                raise ConfigError(f"{where}: axis {a} runs from {x} to {y}: need 0 <= low <= high")
        object.__setattr__(self, "low", lo)
        object.__setattr__(self, "high", hi)
        object.__setattr__(self, "order", od)

    @property
    def ndim(self) -> int:
        return len(self.low)

    @property
    def shape(self) -> tuple[int, ...]:
        """Extent along every logical axis."""
        return tuple(h - lo for lo, h in zip(self.low, self.high, strict=True))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def empty(self) -> bool:
        return self.size == 0

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape of the box's memory (the axes in ``order``): what ``Plan.input`` / ``output`` have."""
        return tuple(self.shape[a] for a in self.order)

    def strides(self) -> tuple[int, ...]:
        """Elements between neighbours along every logical axis, in the box's compact storage."""
        out = [0] * self.ndim
        step = 1
        for a in reversed(self.order):
            out[a] = step
            step *= self.shape[a]
        return tuple(out)

    def with_range(self, axis: int, lo: int, hi: int) -> Box:
        low, high = list(self.low), list(self.high)
        low[axis], high[axis] = lo, hi
        return Box(low, high, self.order)

    def with_order(self, order: Sequence[int]) -> Box:
        return Box(self.low, self.high, order)

    def intersect(self, other: Box) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(low, high) of the indices both boxes hold, or None."""
        low = tuple(max(a, b) for a, b in zip(self.low, other.low, strict=True))
        high = tuple(min(a, b) for a, b in zip(self.high, other.high, strict=True))
        if any(h <= lo for lo, h in zip(low, high, strict=True)):
            return None
        return low, high

    def same(self, other: Box) -> bool:
        return self.low == other.low and self.high == other.high and self.order == other.order

    def __str__(self) -> str:
        ranges = ", ".join(f"{lo}:{h}" for lo, h in zip(self.low, self.high, strict=True))
        return f"[{ranges}] order {self.order}"


def spans(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` indices cut into ``parts`` contiguous ranges as even as can be (the first ones shorter by one
    at most); ranges are empty when there are more parts than indices."""
    return [(p * n // parts, (p + 1) * n // parts) for p in range(parts)]


def split(shape: Sequence[int], grid: Sequence[int], order: Sequence[int] | None = None) -> list[Box]:
    """The boxes of a process grid over ``shape``: rank r is grid position r in row-major order (the last
    grid axis fastest); each axis is cut as evenly as :func:`spans` cuts it (uneven sizes allowed)."""
    shape = _ints("shape", shape, "fft: split")
    grid = _ints("grid", grid, "fft: split")
    if len(grid) != len(shape):
        raise ConfigError(f"fft: split: grid {grid} and shape {shape} have different lengths")
    if any(g < 1 for g in grid):
        raise ConfigError(f"fft: split: grid {grid} must hold positive integers")
    cuts = [spans(n, g) for n, g in zip(shape, grid, strict=True)]
    boxes = []
    for pos in itertools.product(*(range(g) for g in grid)):
        ranges = [cuts[a][p] for a, p in enumerate(pos)]
        boxes.append(Box([r[0] for r in ranges], [r[1] for r in ranges], order))
    return boxes


def check_layout(boxes: Sequence[Box], shape: Sequence[int], what: str) -> None:
    """Refuse, in one line naming the rank, boxes that do not tile ``shape`` exactly once."""
    shape = tuple(shape)
    for r, b in enumerate(boxes):
        if b.ndim != len(shape):
            raise ConfigError(f"{what}: rank {r}'s box {b} has {b.ndim} axes, the array has {len(shape)}")
        for a, (h, n) in enumerate(zip(b.high, shape, strict=True)):
            if h > n:
                raise ConfigError(f"{what}: rank {r}'s box {b} reaches index {h - 1} on axis {a}, past the "
                                  f"array's {n} points")
    total = sum(b.size for b in boxes)
    live = [(r, b) for r, b in enumerate(boxes) if not b.empty]
    for (r1, b1), (r2, b2) in itertools.combinations(live, 2):
        if b1.intersect(b2) is not None:
            raise ConfigError(f"{what}: rank {r1}'s box {b1} and rank {r2}'s box {b2} overlap")
    if total != math.prod(shape):
        raise ConfigError(f"{what}: the boxes hold {total} of the array's {math.prod(shape)} points "
                          f"(shape {shape}): every point must belong to exactly one rank")


# -- stages --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """One stage: every rank's box (complex shape), and the transform over the last ``count`` storage axes."""

    boxes: tuple[Box, ...]
    count: int

    def box(self, rank: int) -> Box:
        return self.boxes[rank]


def _cut(axis_lens: Sequence[int], fixed: dict[int, tuple[int, int]], order: Sequence[int]) -> Box:
    low = [0] * len(axis_lens)
    high = list(axis_lens)
    for a, (lo, hi) in fixed.items():
        low[a], high[a] = lo, hi
    return Box(low, high, order)


def _slab_ranges(boxes: Sequence[Box], axis: int, shape: Sequence[int], order: tuple[int, ...]) -> list | None:
    """Each rank's range of ``axis`` when ``boxes`` are slabs along it (whole on every other axis, stored in
    ``order``), else None."""
    out = []
    for b in boxes:
        if b.order != order and not b.empty:
            return None
        for a in range(len(shape)):
            if a != axis and not b.empty and (b.low[a], b.high[a]) != (0, shape[a]):
                return None
        out.append((b.low[axis], b.high[axis]) if not b.empty else (0, 0))
    return out


def _pencil_grid(boxes: Sequence[Box], shape: Sequence[int]) -> tuple[list, list, list[tuple[int, int]]] | None:
    """(axis-0 ranges, axis-1 ranges, each rank's (p, q)) when ``boxes`` are pencils along axis 2 in C order
    forming a P0 x P1 grid, else None."""
    if any(b.empty or b.order != (0, 1, 2) or (b.low[2], b.high[2]) != (0, shape[2]) for b in boxes):
        return None
    r0 = sorted({(b.low[0], b.high[0]) for b in boxes})
    r1 = sorted({(b.low[1], b.high[1]) for b in boxes})
    if len(r0) * len(r1) != len(boxes):
        return None
    pos = [(r0.index((b.low[0], b.high[0])), r1.index((b.low[1], b.high[1]))) for b in boxes]
    if len(set(pos)) != len(boxes):
        return None
    return r0, r1, pos


def grid_2d(nranks: int) -> tuple[int, int]:
    """The most square P0 x P1 = nranks (P0 >= P1)."""
    p1 = max(d for d in range(1, int(math.isqrt(nranks)) + 1) if nranks % d == 0)
    return nranks // p1, p1


def stages(cshape: Sequence[int], nranks: int, decomposition: str, grid: tuple[int, int] | None,
           inboxes: Sequence[Box], outboxes: Sequence[Box], real_last: int | None) -> list[Stage]:
    """The stages of a forward transform over ``nranks`` ranks.

    ``cshape`` is the frequency-domain shape; ``real_last`` the spatial length of the last axis of a
    real-to-complex transform (None for complex-to-complex). The first stage adopts the user's input
    boxes where they already are that stage's kind of box (no reshape before it), the last stage the
    output boxes likewise.
    """
    d = len(cshape)
    shape_in = tuple(cshape[:-1]) + ((real_last,) if real_last is not None else (cshape[-1],))
    if nranks == 1:
        return [Stage((Box([0] * d, cshape),), d)]
    c_order = tuple(range(d))
    if decomposition == "slab":
        b_order = (1, *range(2, d), 0)
        a_ranges = _slab_ranges(inboxes, 0, shape_in, c_order) or spans(cshape[0], nranks)
        b_ranges = _slab_ranges(outboxes, 1, cshape, b_order) or spans(cshape[1], nranks)
        a = tuple(_cut(cshape, {0: a_ranges[r]}, c_order) for r in range(nranks))
        b = tuple(_cut(cshape, {1: b_ranges[r]}, b_order) for r in range(nranks))
        return [Stage(a, d - 1), Stage(b, 1)]
    # pencil, 3-D
    found = _pencil_grid(inboxes, shape_in)
    if found is not None:
        r0, r1, pos = found
    else:
        p0, p1 = grid or grid_2d(nranks)
        r0, r1 = spans(cshape[0], p0), spans(cshape[1], p1)
        pos = [(r // p1, r % p1) for r in range(nranks)]
    p0, p1 = len(r0), len(r1)
    s2, s1 = spans(cshape[2], p1), spans(cshape[1], p0)
    a = tuple(_cut(cshape, {0: r0[p], 1: r1[q]}, (0, 1, 2)) for p, q in pos)
    b = tuple(_cut(cshape, {0: r0[p], 2: s2[q]}, (0, 2, 1)) for p, q in pos)
    c = tuple(_cut(cshape, {1: s1[p], 2: s2[q]}, (2, 1, 0)) for p, q in pos)
    return [Stage(a, 1), Stage(b, 1), Stage(c, 1)]


def real_boxes(boxes: Sequence[Box], real_last: int) -> tuple[Box, ...]:
    """A first stage's boxes over the spatial (real) shape: the whole last axis, of length ``real_last``."""
    return tuple(b if b.empty else b.with_range(b.ndim - 1, 0, real_last) for b in boxes)


def chunk_boxes(box: Box, parts: int) -> list[Box]:
    """``box`` cut into ``parts`` along its slowest storage axis (the pipeline's chunks; some may be empty)."""
    axis = box.order[0]
    lo = box.low[axis]
    return [box.with_range(axis, lo + a, lo + b) for a, b in spans(box.shape[axis], parts)]


# -- the puts of one reshape ------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """One put of a reshape, offsets and lengths in elements.

    ``transpose``: rows x cols elements, ``dst[c * dst_ld + r] = src[r * src_ld + c]``.
    Otherwise a block-stride write: ``count`` blocks of ``block`` elements, ``src_ld`` / ``dst_ld`` apart.
    """

    transpose: bool
    src: int
    dst: int
    rows: int
    cols: int
    src_ld: int
    dst_ld: int

    @property
    def elements(self) -> int:
        return self.rows * self.cols


def copy_pieces(low: Sequence[int], high: Sequence[int], src: Box, dst: Box) -> list[Piece]:
    """The puts that copy the indices ``low .. high`` from ``src``'s storage to ``dst``'s.

    Axes are taken in the source's storage order; neighbours that nest in both storages merge into one.
    Then the axis contiguous at the source (stride 1) becomes the columns and the one contiguous at the
    destination the rows of one transposing put; when one axis is contiguous at both ends the put is a
    block-stride write instead. Any axis left over repeats the put (one piece per index).
    """
    ss, ds = src.strides(), dst.strides()
    ext = [h - lo for lo, h in zip(low, high, strict=True)]
    base_s = sum((lo - b) * s for lo, b, s in zip(low, src.low, ss, strict=True))
    base_d = sum((lo - b) * s for lo, b, s in zip(low, dst.low, ds, strict=True))
    axes = sorted(((e, s, t) for e, s, t in zip(ext, ss, ds, strict=True) if e > 1), key=lambda x: -x[1])
    merged: list[tuple[int, int, int]] = []
    for e, s, t in axes:
        if merged and merged[-1][1] == e * s and merged[-1][2] == e * t:
            outer = merged.pop()
            merged.append((outer[0] * e, s, t))
        else:
            merged.append((e, s, t))
    col = next((i for i, (_, s, _) in enumerate(merged) if s == 1), None)
    row = next((i for i, (_, _, t) in enumerate(merged) if t == 1), None)
    if col is not None and col == row:  # contiguous at both ends: a block-stride write
        e_c = merged[col][0]
        rest = [i for i in range(len(merged)) if i != col]
        k = max(rest, key=lambda i: merged[i][0]) if rest else None
        loops = [merged[i] for i in rest if i != k]
        if k is None:
            shape = (1, e_c, e_c, e_c)
        else:
            shape = (merged[k][0], e_c, merged[k][1], merged[k][2])
        transpose = False
    else:
        rows = merged[row][0] if row is not None else 1
        cols = merged[col][0] if col is not None else 1
        src_ld = merged[row][1] if row is not None else cols
        dst_ld = merged[col][2] if col is not None else rows
        loops = [m for i, m in enumerate(merged) if i not in (row, col)]
        shape = (rows, cols, src_ld, dst_ld)
        transpose = True
    count = math.prod(e for e, _, _ in loops)
    if count > MAX_PUTS:
        raise ConfigError(f"fft: moving {tuple(low)}..{tuple(high)} from box {src} to box {dst} takes {count} "
                          f"separate puts (more than {MAX_PUTS}): give boxes whose fastest storage axes are whole")
    pieces = []
    for idx in itertools.product(*(range(e) for e, _, _ in loops)):
        off_s = base_s + sum(i * s for i, (_, s, _) in zip(idx, loops, strict=True))
        off_d = base_d + sum(i * t for i, (_, _, t) in zip(idx, loops, strict=True))
        pieces.append(Piece(transpose, off_s, off_d, *shape))
    return pieces


def apply_pieces(pieces: Sequence[Piece], src: np.ndarray, dst: np.ndarray) -> None:
    """Run ``pieces`` with numpy on flat arrays (the tests' reference for what the puts do)."""
    from numpy.lib.stride_tricks import as_strided

    e = src.itemsize
    for p in pieces:
        if p.transpose:
            s = as_strided(src[p.src:], (p.rows, p.cols), (p.src_ld * e, e))
            t = as_strided(dst[p.dst:], (p.cols, p.rows), (p.dst_ld * e, e), writeable=True)
            t[...] = s.T
        else:
            s = as_strided(src[p.src:], (p.rows, p.cols), (p.src_ld * e, e))
            t = as_strided(dst[p.dst:], (p.rows, p.cols), (p.dst_ld * e, e), writeable=True)
            t[...] = s
