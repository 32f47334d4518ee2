"""Transposing puts on the cpu back-end (the reference): numpy copies between strided views.

A put is ``dst_view[...] = src_view.T`` where both views are built once at commit over the
windows' shared memory (``as_strided``, nothing packed). Elements move as unsigned integers of
their size (16-byte ones as raw 16-byte records), so the bytes arrive exactly, NaN payloads
included. The whole block is one numpy copy unless the handle forces a tile shape; then it is
cut into tiles, one copy each (what the benchmark's tile rows measure on the cpu).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import _tile_model as tm
from . import TILE_BUFFER_BYTES, TransposeHandle

_WORDS = {4: np.dtype("<u4"), 8: np.dtype("<u8"), 16: np.dtype("V16")}


def matrix(arr: np.ndarray, offset: int, rows: int, cols: int, ld: int, elem: int) -> np.ndarray:
    """A writable rows x cols view (leading dimension ``ld`` elements) of the bytes ``arr[offset:]``."""
    extent = ((rows - 1) * ld + cols) * elem
    words = arr[offset: offset + extent].view(_WORDS[elem])
    return as_strided(words, shape=(rows, cols), strides=(ld * elem, elem), writeable=True)


def tile_pairs(dst: np.ndarray, src: np.ndarray, tile: tuple[int, int] | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(destination, source) view pairs whose copies make ``dst = src.T``: one pair, or one per tile."""
    if tile is None:
        return [(dst, src.T)]
    m, n = tile
    rows, cols = src.shape
    return [(dst[c: c + n, r: r + m], src[r: r + m, c: c + n].T)
            for r in range(0, rows, m) for c in range(0, cols, n)]


def copies(h: TransposeHandle, src_bytes: np.ndarray, dst_bytes: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The copies one start() makes for ``h``: ``src_bytes`` is my source window, ``dst_bytes`` the target's."""
    src = matrix(src_bytes, h.src_offset, h.rows, h.cols, h.src_ld, h.elem_bytes)
    dst = matrix(dst_bytes, h.dst_offset, h.cols, h.rows, h.dst_ld, h.elem_bytes)
    return tile_pairs(dst, src, h.tile)


def plan_local_transpose(world: Any, dst: np.ndarray, src: np.ndarray, tile: tuple[int, int] | None
                         ) -> Callable[[], None]:
    # Same dtype on both sides: numpy copies the bytes as they are.
    pairs = tile_pairs(dst, src, tile)

    def run() -> None:
        for a, b in pairs:
            np.copyto(a, b)

    return run


def tile_candidates(elem: int) -> tuple[tuple[int, int], ...]:
    """Tiles a forced ``tile`` cuts a put into on the cpu (one numpy copy each): larger than the GPU's,
    under the same buffer rule, so that the benchmark's tile rows measure something on the cpu too."""
    return tuple(tm.candidates(elem, TILE_BUFFER_BYTES, sides=(16, 32, 64, 128, 256)))
