"""Transposing puts (UZURA) inside RMA queues: the back-end independent half.

``declare_transpose_write`` declares a rows x cols block of 4-, 8- or 16-byte elements, read
row-major from my ``src_window`` at ``src_offset`` with leading dimension ``src_ld`` (elements),
written transposed (cols x rows) into ``dst_rank``'s ``dst_window`` at ``dst_offset`` with leading
dimension ``dst_ld``::

    dst[c * dst_ld + r] = src[r * src_ld + c]      for r < rows, c < cols

The handle is a :class:`~circuslink.rma.MsgHandle` whose block-stride fields describe its
destination footprint (``cols`` blocks of ``rows * elem`` bytes, ``dst_ld * elem`` apart), so the
queue's checks (overlap at push, clashes between origins at commit) and the targets' staging
treat it like any other write. The window modules move it: ``_cpu`` (numpy, the reference), ``_cuda``
(tiles turned in shared memory inside the start launch), ``_mpi`` (MPI derived datatypes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import RmaError
from .._core import MsgHandle, Window, _first_overlap

# Element types a transposing put moves, by name, and their sizes in bytes.
DTYPES = {"float32": 4, "float64": 8, "complex64": 8, "complex128": 16}
TILE_BUFFER_BYTES = 18432  # kTransposeTileBytes in include/circuslink/detail/transpose_types.cuh
_WHAT = "declare_transpose_write"


@dataclass(frozen=True, eq=False)
class TransposeHandle(MsgHandle):
    """A declared transposing put (see :func:`declare_transpose_write`).

    The inherited block-stride fields describe the destination: ``count`` = cols rows of
    ``block_bytes`` = rows * elem bytes, ``dst_stride`` = dst_ld * elem bytes apart.
    """

    rows: int = 0
    cols: int = 0
    src_ld: int = 0
    dst_ld: int = 0
    dtype: str = ""
    tile: tuple[int, int] | None = None  # (m, n) forced by the caller; None: the module's choice

    @property
    def elem_bytes(self) -> int:
        return DTYPES[self.dtype]

    @property
    def src_extent(self) -> int:
        return ((self.rows - 1) * self.src_ld + self.cols) * self.elem_bytes

    def src_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (exclusive) of every source row."""
        starts = self.src_offset + np.arange(self.rows, dtype=np.int64) * self.src_ld * self.elem_bytes
        return starts, starts + self.cols * self.elem_bytes

    def describe(self) -> str:
        return (f"handle #{self.id} (transpose {self.rows} x {self.cols} {self.dtype}, src_ld {self.src_ld}, "
                f"dst_ld {self.dst_ld}, to rank {self.dst_rank} at offset {self.dst_offset})")


def dtype_name(dtype: Any) -> str | None:
    """The name in :data:`DTYPES` of ``dtype`` (numpy dtype, type or name), or None if unsupported."""
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):
        return None
    return name if name in DTYPES else None


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise RmaError(f"{_WHAT}: {name} must be an integer, got {value!r}")
    if value < minimum:
        raise RmaError(f"{_WHAT}: {name}={value} must be >= {minimum}")
    return int(value)


def check_tile(tile: Any, elem_bytes: int, what: str = _WHAT) -> tuple[int, int]:
    """``tile`` as (m, n): powers of two whose padded buffer m * (n + 1) * elem fits the shared tile buffer."""
    try:
        m, n = (int(x) for x in tile)
        ok = all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in tile)
    except (TypeError, ValueError):
        ok, m, n = False, 0, 0
    if not ok or m < 1 or n < 1 or m & (m - 1) or n & (n - 1):
        raise RmaError(f"{what}: tile={tile!r} must be two powers of two (rows, cols), e.g. (32, 64)")
    if m * (n + 1) * elem_bytes > TILE_BUFFER_BYTES:
        raise RmaError(f"{what}: tile={tile!r} of {elem_bytes}-byte elements needs {m * (n + 1) * elem_bytes} B of "
                       f"shared memory with padding; the tile buffer holds {TILE_BUFFER_BYTES} B")
    return m, n


def declare_transpose_write(
    dst_window: Window,
    dst_offset: int,
    dst_ld: int,
    src_window: Window,
    src_offset: int,
    src_ld: int,
    rows: int,
    cols: int,
    dtype: Any,
    dst_rank: int,
    tile: tuple[int, int] | None = None,
) -> TransposeHandle:
    """Declare a transposing put: my rows x cols block -> ``dst_rank``'s window, transposed.

    Element (r, c) of the block, at ``src_offset + (r * src_ld + c) * elem`` bytes of my
    ``src_window``, lands at ``dst_offset + (c * dst_ld + r) * elem`` bytes of ``dst_rank``'s
    ``dst_window``. ``dtype`` is float32, float64, complex64 or complex128 (4, 8, 16 bytes; the
    bytes are moved, never computed on); leading dimensions are in elements, offsets in bytes
    (multiples of the element size). ``tile`` forces the tile shape (m source rows x n source
    columns, powers of two) instead of the tile model's choice; only the benchmarks need it.
    """
    for w, role in ((dst_window, "dst_window"), (src_window, "src_window")):
        if not isinstance(w, Window):
            raise RmaError(f"{_WHAT}: {role} must be a Window from rma.window_alloc, got {type(w).__name__}")
        w._check()
    if src_window.world is not dst_window.world or src_window.memory != dst_window.memory:
        raise RmaError(
            f"{_WHAT}: src_window {src_window.index} ({src_window.label}) and dst_window "
            f"{dst_window.index} ({dst_window.label}) must belong to the same world and memory"
        )
    name = dtype_name(dtype)
    if name is None:
        raise RmaError(f"{_WHAT}: dtype {dtype!r} is not supported: use float32, float64, complex64 or complex128")
    elem = DTYPES[name]
    dst_offset = _int("dst_offset", dst_offset, 0)
    src_offset = _int("src_offset", src_offset, 0)
    rows = _int("rows", rows, 1)
    cols = _int("cols", cols, 1)
    src_ld = _int("src_ld", src_ld, 1)
    dst_ld = _int("dst_ld", dst_ld, 1)
    if src_ld < cols:
        raise RmaError(f"{_WHAT}: src_ld={src_ld} is smaller than cols={cols} (source rows would overlap)")
    if dst_ld < rows:
        raise RmaError(f"{_WHAT}: dst_ld={dst_ld} is smaller than rows={rows} (destination rows would overlap)")
    for label, off in (("src_offset", src_offset), ("dst_offset", dst_offset)):
        if off % elem:
            raise RmaError(f"{_WHAT}: {label}={off} is not a multiple of the {elem}-byte {name} element")
    size = dst_window.world.size
    if isinstance(dst_rank, bool) or not isinstance(dst_rank, int | np.integer) or not 0 <= dst_rank < size:
        raise RmaError(f"{_WHAT}: dst_rank={dst_rank!r} is out of range for a world of {size} ranks")
    if tile is not None:
        tile = check_tile(tile, elem)
    h = TransposeHandle(dst_window, dst_offset, src_window, src_offset, cols, rows * elem, src_ld * elem,
                        dst_ld * elem, int(dst_rank), rows=rows, cols=cols, src_ld=src_ld, dst_ld=dst_ld,
                        dtype=name, tile=tile)
    if dst_offset + h.dst_extent > dst_window.nbytes:
        raise RmaError(f"{_WHAT}: {h.describe()} ends at byte {dst_offset + h.dst_extent}, past the end of "
                       f"dst_window {dst_window.index} ({dst_window.nbytes} B)")
    if src_offset + h.src_extent > src_window.nbytes:
        raise RmaError(f"{_WHAT}: {h.describe()} reads up to byte {src_offset + h.src_extent} (src_offset "
                       f"{src_offset}), past the end of src_window {src_window.index} ({src_window.nbytes} B)")
    me = dst_window.world.rank
    if h.dst_rank == me and src_window is dst_window:
        lo, hi = max(src_offset, dst_offset), min(src_offset + h.src_extent, dst_offset + h.dst_extent)
        if lo < hi and _first_overlap([(*h.src_blocks(), "src"), (*h.dst_blocks(), "dst")]):
            raise RmaError(f"{_WHAT}: {h.describe()} reads and writes the same bytes of rank {me}'s window "
                           f"{dst_window.index}: an in-place transpose is not supported (use another region)")
    return h


def is_transpose(handle: MsgHandle) -> bool:
    return isinstance(handle, TransposeHandle)


def plan_local_transpose(world: Any, dst: Any, src: Any, tile: tuple[int, int] | None = None) -> Callable[[], None]:
    """A callable that runs ``dst[...] = src.T`` on this rank, built once, run many times.

    ``src`` and ``dst`` are 2-D arrays of ``world.xp`` (numpy / cupy), row-major with unit
    stride along a row (leading dimensions may exceed the width: views into larger arrays are
    fine), of one element type of :data:`DTYPES`, ``dst.shape == src.shape[::-1]``. On the GPU it
    is the transposing put's own tile kernel with a local destination, launched on the world's
    stream after the caller's (``backend.after_caller``) and returns without waiting (synchronise
    ``world.backend.stream``, or queue the next work on it, before reading ``dst``); it is the
    local-transpose baseline of the benchmarks and of the FFT. ``tile`` forces the tile shape.
    """
    what = "plan_local_transpose"
    if getattr(src, "ndim", None) != 2 or getattr(dst, "ndim", None) != 2:
        raise RmaError(f"{what}: src and dst must be 2-D arrays, got {getattr(src, 'ndim', '?')}-D and "
                       f"{getattr(dst, 'ndim', '?')}-D")
    if tuple(dst.shape) != tuple(src.shape[::-1]):
        raise RmaError(f"{what}: dst shape {tuple(dst.shape)} must be src shape {tuple(src.shape)} reversed")
    name = dtype_name(src.dtype)
    if name is None or dst.dtype != src.dtype:
        raise RmaError(f"{what}: src and dst must share one of float32, float64, complex64, complex128 "
                       f"(got {src.dtype} and {dst.dtype})")
    for label, a in (("src", src), ("dst", dst)):
        if a.strides[1] != a.itemsize or a.strides[0] % a.itemsize or a.strides[0] < a.shape[1] * a.itemsize:
            raise RmaError(f"{what}: {label} must be row-major with unit stride along a row (strides {a.strides})")
    if tile is not None:
        tile = check_tile(tile, DTYPES[name], what)
    return world.backend_module("circuslink.rma._transpose").plan_local_transpose(world, dst, src, tile)


def transpose_tiles(world: Any, dtype: Any) -> list[tuple[int, int]]:
    """The tile shapes (m source rows, n source columns) that the world's back-end module chooses among for a
    transposing put of ``dtype`` elements (what ``tile=`` may force; the benchmark times each)."""
    name = dtype_name(dtype)
    if name is None:
        raise RmaError(f"transpose_tiles: dtype {dtype!r} is not supported: use float32, float64, complex64 or "
                       "complex128")
    return list(world.backend_module("circuslink.rma._transpose").tile_candidates(DTYPES[name]))
