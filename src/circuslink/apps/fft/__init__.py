"""Distributed 2-D and 3-D FFTs whose global transposes are transposing puts (UZURA's use case).

A plan in heFFTe's shape: every rank gives the box of the array it holds on input and the box it wants
on output, the plan is made once (collective) and executed many times, forward and backward, with a
scale option. Complex-to-complex (complex64 / complex128) and real-to-complex / complex-to-real
(float32 / float64, the last axis halved as numpy's rfftn does)::

    from circuslink.apps import fft

    inboxes, outboxes = fft.boxes((n0, n1, n2), world.size)          # slabs of axis 0 in and out
    plan = fft.Plan(world, inboxes[world.rank], outboxes[world.rank], "complex64")
    y = plan.forward(x_mine)                                          # my box of numpy.fft.fftn(x)
    x_back = plan.backward(y, scale="full")                           # numpy.fft.ifftn
    plan.close()

    y = fft.fftn(world, my_slab)          # one shot: slabs of axis 0 in and out (uneven allowed)
    y = fft.fft2(world, my_rows)          # the same for 2-D arrays (the command line: circuslink fft2 / fft3)

Decompositions: slab (2-D and 3-D: two stages, one reshape between them, each one transposing put per
pair of ranks) and pencil (3-D, a P0 x P1 process grid: three stages, two reshapes, each within a row or a
column of the grid). Output boxes in the last stage's layout (``layout="transposed"`` of :func:`boxes`)
save the reshape back to the input's distribution, as cuFFTMp's shuffled output does. docs/fft.md has
the details.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError
from ._boxes import Box, spans, split
from ._plan import COMPLEX, DECOMPOSITIONS, DTYPES, SCALES, SCHEMES, Plan, check_dtype

LAYOUTS = ("natural", "transposed")


def boxes(shape: Sequence[int], nranks: int, decomposition: str = "auto", grid: Sequence[int] | None = None,
          layout: str = "natural", real: bool = False) -> tuple[list[Box], list[Box]]:
    """(input boxes, output boxes) of every rank for an array of ``shape`` over ``nranks`` ranks.

    Input: slabs of axis 0 (slab), or pencils along the last axis over a P0 x P1 ``grid`` (pencil; the most
    square grid by default); C order, uneven sizes spread as evenly as they go. Output: the same cut of the
    frequency array (``layout="natural"``) or the last stage's boxes (``"transposed"``: one reshape less;
    slab: axis 1 cut, stored with axis 0 fastest; pencil: axes 1 and 2 cut, axis 0 fastest). ``real``: the
    shapes of a real-to-complex transform (the output's last axis is ``shape[-1] // 2 + 1``). "auto" is slab
    unless a 3-D array has fewer indices along axis 0 or 1 than there are ranks.
    """
    from . import _boxes as bx

    shape = bx._ints("shape", shape, "fft: boxes")
    if len(shape) not in (2, 3) or any(n < 1 for n in shape):
        raise ConfigError(f"fft: shape {shape}: the distributed FFT takes a 2-D or 3-D array of positive sizes")
    if isinstance(nranks, bool) or not isinstance(nranks, int | np.integer) or nranks < 1:
        raise ConfigError(f"fft: nranks={nranks!r} must be a positive integer")
    if layout not in LAYOUTS:
        raise ConfigError(f"fft: layout={layout!r} must be one of {', '.join(LAYOUTS)}")
    if decomposition not in DECOMPOSITIONS:
        raise ConfigError(f"fft: decomposition={decomposition!r} must be one of {', '.join(DECOMPOSITIONS)}")
    cshape = shape[:-1] + (shape[-1] // 2 + 1,) if real else shape
    if decomposition == "auto":
        decomposition = "pencil" if len(shape) == 3 and nranks > 1 and nranks > min(shape[0], cshape[1]) else "slab"
    if decomposition == "pencil":
        if len(shape) != 3:
            raise ConfigError(f"fft: a pencil decomposition needs a 3-D array; shape {shape} is 2-D (use slab)")
        g = tuple(grid) if grid is not None else bx.grid_2d(nranks)
        if len(g) != 2 or g[0] * g[1] != nranks:
            raise ConfigError(f"fft: grid={grid!r} must be two positive integers P0, P1 with P0 * P1 = {nranks}")
        cut = (g[0], g[1], 1)
    else:
        g = None
        cut = (nranks,) + (1,) * (len(shape) - 1)
    ins = split(shape, cut)
    if layout == "natural":
        return ins, split(cshape, cut)
    natural = split(cshape, cut)
    last = bx.stages(cshape, nranks, decomposition, g, ins, natural, shape[-1] if real else None)[-1]
    return ins, list(last.boxes)


def _slab_plan(world: Any, local: Any, what: str, real: bool, layout: str, scheme: str) -> tuple[Plan, Any]:
    """A plan over slabs of axis 0 (every rank's ``local`` in rank order; row counts may differ)."""
    ndim = getattr(local, "ndim", None)
    if ndim not in (2, 3) or (what == "fft2" and ndim != 2):
        want = "a 2-D block of rows" if what == "fft2" else "a 2-D or 3-D slab (a block of axis-0 indices)"
        raise ConfigError(f"{what}: the local slab is {ndim}-D (shape {getattr(local, 'shape', '?')}): {what} "
                          f"takes {want}")
    dtype = check_dtype(local.dtype, f"{what}: the local slab")
    if real != dtype.startswith("float"):
        raise ConfigError(f"{what}: the local slab has dtype {dtype}: pass a "
                          f"{'real (float32 or float64)' if real else 'complex (complex64 or complex128)'} array")
    if layout not in LAYOUTS:
        raise ConfigError(f"{what}: layout={layout!r} must be one of {', '.join(LAYOUTS)}")
    shapes = world.allgather_object(tuple(int(d) for d in local.shape))
    if len({s[1:] for s in shapes}) != 1:
        detail = ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
        raise ConfigError(f"{what}: every rank's slab must agree on every axis but the first ({detail})")
    n0 = sum(s[0] for s in shapes)
    shape = (n0, *shapes[0][1:])
    start = sum(s[0] for s in shapes[: world.rank])
    inbox = Box((start,) + (0,) * (ndim - 1), (start + shapes[world.rank][0], *shape[1:]))
    cshape = shape[:-1] + (shape[-1] // 2 + 1,) if real else shape
    if layout == "natural":
        starts = [sum(s[0] for s in shapes[:r]) for r in range(world.size)]
        outbox = Box((starts[world.rank],) + (0,) * (ndim - 1),
                     (starts[world.rank] + shapes[world.rank][0], *cshape[1:]))
    else:
        outbox = boxes(shape, world.size, "slab", layout="transposed", real=real)[1][world.rank]
    return Plan(world, inbox, outbox, dtype, decomposition="slab", scheme=scheme), dtype


def fftn(world: Any, local: Any, inverse: bool = False, layout: str = "natural", scheme: str = "transpose-put",
         real: bool = False) -> Any:
    """Collective: the FFT of the 2-D or 3-D array whose axis-0 slabs are every rank's ``local`` in rank order.

    ``local`` (numpy or cupy) may have a different number of axis-0 indices on each rank. Returns this
    rank's output as a new array of ``world.xp``: the same slab of numpy.fft.fftn (``ifftn`` with
    ``inverse``; ``real``: rfftn / irfftn of a real / Hermitian-half array), or with
    ``layout="transposed"`` the last stage's box (axis 1 cut, stored with axis 0 fastest). Makes a
    :class:`Plan` and frees it; loops should keep a Plan.
    """
    what = "fftn"
    if real and inverse:  # irfftn: the plan's frequency side is what the ranks hold
        raise ConfigError(f"{what}: use a Plan's backward() for a complex-to-real transform")
    plan, _ = _slab_plan(world, local, what, real, layout, scheme)
    with plan:
        if inverse:
            return _one_shot_inverse(world, plan, local, layout)
        return plan.forward(local).copy()


def _one_shot_inverse(world: Any, plan: Plan, local: Any, layout: str) -> Any:
    """The inverse on a plan whose frequency side has the same boxes as its spatial side (natural) or the
    spatial side's transposed stage (``fft(x.T) == fft(x).T``: the transposed layout's inverse reads the
    transposed array)."""
    if layout == "natural":
        plan.output[...] = world.xp.asarray(local)
        return plan.backward().copy()
    # transposed: ifftn(X) for X in the last stage's layout equals forward of conj... use the identity
    # ifftn(x) = conj(fftn(conj(x))) / N on the plan's forward direction, which reads natural slabs.
    xp = world.xp
    out = plan.forward(xp.conj(xp.asarray(local)), scale="full")
    return xp.conj(out)


def fft2(world: Any, local_slab: Any, inverse: bool = False, layout: str = "natural",
         scheme: str = "transpose-put") -> Any:
    """Collective: :func:`fftn` of a 2-D array split by rows (numpy's fft2 / ifft2)."""
    if getattr(local_slab, "ndim", None) != 2:
        raise ConfigError(f"fft2: the local slab is {getattr(local_slab, 'ndim', '?')}-D (shape "
                          f"{getattr(local_slab, 'shape', '?')}): fft2 takes a 2-D block of rows")
    return fftn(world, local_slab, inverse, layout, scheme)


def ifft2(world: Any, local_slab: Any, layout: str = "natural", scheme: str = "transpose-put") -> Any:
    """Collective: :func:`fft2` with ``inverse=True`` (numpy's ifft2: divided by n1 * n2)."""
    return fft2(world, local_slab, True, layout, scheme)


def ifftn(world: Any, local: Any, layout: str = "natural", scheme: str = "transpose-put") -> Any:
    """Collective: :func:`fftn` with ``inverse=True`` (numpy's ifftn)."""
    return fftn(world, local, True, layout, scheme)


__all__ = ["COMPLEX", "DECOMPOSITIONS", "DTYPES", "LAYOUTS", "SCALES", "SCHEMES", "Box", "Plan", "boxes",
           "check_dtype", "fft2", "fftn", "ifft2", "ifftn", "split", "spans"]
