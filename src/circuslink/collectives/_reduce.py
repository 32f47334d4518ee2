"""The element-wise reductions of the collectives, exactly as the device code computes them.

Every algorithm reduces rank by rank with ``op(acc, x)`` where ``op`` is the device functor
(``circuslink::collectives::Sum`` / ``Max`` / ``Min``, detail/collectives_types.cuh): ``a + b``,
``a < b ? b : a`` and ``b < a ? b : a``. The max / min are written out (not ``np.maximum``) so that
the sign of zero comes out as the device's: ``Max(-0.0, 0.0)`` is ``-0.0``.

bfloat16 (no numpy dtype: carried as uint16 bit patterns) is reduced as the device reduces it:
widen both operands to float32 (exact), apply the op in float32, round back to bfloat16 to nearest,
ties to even, on the bit pattern (NaN stays a quiet NaN). One rounding per step on both back-ends,
so the cpu and cuda back-ends agree bitwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

OPS = ("sum", "max", "min")
BF16 = "bfloat16"


def _xp(a: Any) -> Any:
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def bf16_to_f32(bits: Any) -> Any:
    """bfloat16 bit patterns (uint16) widened to float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: Any) -> Any:
    """float32 rounded to bfloat16 bit patterns: nearest, ties to even; NaN becomes a quiet NaN."""
    xp = _xp(x)
    u = xp.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return xp.where(nan, (u >> 16) | np.uint32(0x40), rounded).astype(np.uint16)


def _apply(op: str, a: Any, b: Any) -> Any:
    xp = _xp(a)
    if op == "sum":
        return a + b
    if op == "max":
        return xp.where(a < b, b, a)
    if op == "min":
        return xp.where(b < a, b, a)
    raise ConfigError(f"op={op!r} is not one of {', '.join(OPS)}")


def combine(op: str, acc: Any, x: Any, bf16: bool = False) -> Any:
    """``op(acc, x)`` element-wise, as the device functor computes it (a new array of acc's dtype)."""
    if bf16:
        return f32_to_bf16(_apply(op, bf16_to_f32(acc), bf16_to_f32(x)))
    with np.errstate(over="ignore", invalid="ignore"):
        return _apply(op, acc, x).astype(acc.dtype, copy=False)


def fold(op: str, parts: list, bf16: bool = False) -> Any:
    """``op(...op(op(parts[0], parts[1]), parts[2])..., parts[-1])``: the order every algorithm documents."""
    acc = parts[0].copy()
    for x in parts[1:]:
        acc = combine(op, acc, x, bf16)
    return acc
