"""Global fields in and out: .npy files checked before any rank starts, scattered from and gathered to rank 0.

A global spinor is ``(T, Z, Y, X, 4, 3)`` and a gauge field ``(4, T, Z, Y, X, 3, 3)`` (complex128 or
complex64). Scatter and gather go through one symmetric buffer (``world.alloc``): rank 0 stores every rank's
block straight into that rank's buffer (its peer mapping), and reads them back the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ._lattice import Lattice, fmt

COMPLEX = (np.complex128, np.complex64)


def _describe_shape(kind: str, dims: tuple[int, int, int, int] | None) -> str:
    if kind == "gauge":
        generic = "(4, T, Z, Y, X, 3, 3)"
        concrete = None if dims is None else (4, dims[3], dims[2], dims[1], dims[0], 3, 3)
    else:
        generic = "(T, Z, Y, X, 4, 3)"
        concrete = None if dims is None else (dims[3], dims[2], dims[1], dims[0], 4, 3)
    return generic if concrete is None else f"{generic} = {concrete}"


def peek(path: str, option: str, kind: str, dims: tuple[int, int, int, int] | None = None) -> tuple[int, ...]:
    """Check a field file without reading it (shape and dtype from the .npy header); return its (X, Y, Z, T).

    ``kind`` is "gauge" or "spinor"; ``dims`` (X, Y, Z, T), when known, must match."""
    p = Path(path)
    expected = f"complex128 or complex64 of shape {_describe_shape(kind, dims)}"
    option = f"{option} " if option else ""
    if not p.is_file():
        raise ConfigError(f"{option}{path}: no such file (expected a .npy array, {expected})")
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{option}{path}: not a readable .npy array ({exc}); expected {expected}") from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"{option}{path}: holds several arrays (.npz); expected one .npy array, {expected}")
    if arr.dtype not in COMPLEX:
        raise ConfigError(f"{option}{path}: dtype {arr.dtype} of shape {arr.shape}; expected {expected}")
    shape = tuple(arr.shape)
    if kind == "gauge":
        good = len(shape) == 7 and shape[0] == 4 and shape[5:] == (3, 3)
        found = (shape[4], shape[3], shape[2], shape[1]) if good else None
    else:
        good = len(shape) == 6 and shape[4:] == (4, 3)
        found = (shape[3], shape[2], shape[1], shape[0]) if good else None
    if not good or (dims is not None and found != tuple(dims)):
        raise ConfigError(f"{option}{path}: shape {shape}; expected {expected}")
    if any(d <= 0 for d in found):
        raise ConfigError(f"{option}{path}: shape {shape} has an empty direction; expected {expected}")
    return found


def load(path: str) -> np.ndarray:
    return np.load(path, allow_pickle=False)


def save(path: str, array: np.ndarray) -> None:
    try:
        np.save(path, array)
    except OSError as exc:
        raise ConfigError(f"--output {path}: cannot write ({exc.strerror or exc})") from None


def _block(lattice: Lattice, rank: int, lead: int) -> tuple[slice, ...]:
    return (slice(None),) * lead + lattice.block(rank)


def scatter(world: Any, lattice: Lattice, field: np.ndarray | None, shape: tuple[int, ...], lead: int = 0,
            dtype: Any = np.complex128) -> np.ndarray:
    """Collective: rank 0's global ``field`` cut into blocks; returns my block (numpy, ``shape``, ``dtype``).

    ``lead`` leading axes (the gauge field's mu) are not decomposed."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = world.alloc(nbytes)
    try:
        if world.rank == 0:
            if field is None:
                raise ConfigError("scatter: rank 0 has no field to scatter")
            for r in range(world.size):
                block = np.ascontiguousarray(field[_block(lattice, r, lead)], dtype=dtype)
                if block.shape != tuple(shape):
                    raise ConfigError(f"scatter: rank {r}'s block has shape {block.shape}, expected {tuple(shape)}")
                buf.peer(r)[:nbytes] = world.xp.asarray(block.reshape(-1).view(np.uint8))
            world.backend.synchronize()
        world.barrier()
        mine = buf.local[:nbytes]
        mine = mine.get() if hasattr(mine, "get") else np.array(mine)
        return mine.view(dtype).reshape(shape)
    finally:
        buf.close()


def gather(world: Any, lattice: Lattice, local: Any, global_shape: tuple[int, ...], lead: int = 0) -> np.ndarray | None:
    """Collective: every rank's block of a field, assembled on rank 0 (None elsewhere)."""
    local = local.get() if hasattr(local, "get") else np.asarray(local)
    local = np.ascontiguousarray(local)
    nbytes = local.nbytes
    buf = world.alloc(nbytes)
    try:
        buf.local[:nbytes] = world.xp.asarray(local.reshape(-1).view(np.uint8))
        world.backend.synchronize()
        world.barrier()
        out = None
        if world.rank == 0:
            out = np.empty(global_shape, dtype=local.dtype)
            for r in range(world.size):
                raw = buf.peer(r)[:nbytes]
                raw = raw.get() if hasattr(raw, "get") else np.array(raw)
                out[_block(lattice, r, lead)] = raw.view(local.dtype).reshape(local.shape)
        world.barrier()
        return out
    finally:
        buf.close()


def describe(kind: str, dims: tuple[int, int, int, int]) -> str:
    return f"{kind} field {fmt(dims)}"
