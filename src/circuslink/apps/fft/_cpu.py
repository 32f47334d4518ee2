"""The FFT's cpu back-end module (the reference): numpy's FFTs over the last axes of a box, host memory limits, and a
runner that does every step in order on the host."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

# Beside the window a rank holds numpy's output of one transform and its scratch: about two regions.
EXTRA_REGIONS = 2


def make_fft(world: Any, kind: str, src: np.ndarray, dst: np.ndarray, count: int, inverse: bool, cache: dict
             ) -> Callable[[], None] | None:
    """A callable that transforms ``src`` over its last ``count`` axes into ``dst`` (None when empty).

    ``kind``: "c2c" (``dst`` is ``src``: in place), "r2c" (real -> the first half of the last axis) or
    "c2r". Inverse transforms are unnormalised (exp(+2 pi i ...), no 1/N), like cuFFT's; the plan scales.
    """
    if src.size == 0 or dst.size == 0:
        return None
    axes = tuple(range(src.ndim - count, src.ndim))
    if kind == "c2c":
        fn = np.fft.ifftn if inverse else np.fft.fftn
        norm = "forward" if inverse else "backward"  # "forward" leaves the inverse unscaled
        return lambda: np.copyto(dst, fn(src, axes=axes, norm=norm))
    if kind == "r2c":
        return lambda: np.copyto(dst, np.fft.rfftn(src, axes=axes))
    s = dst.shape[-count:]
    return lambda: np.copyto(dst, np.fft.irfftn(src, s=s, axes=axes, norm="forward"))


def pull_scratch_bytes(shape: tuple[int, ...], count: int, itemsize: int) -> int:
    """Memory a pulled stage's transform allocates beside its array: none here (numpy's transform is counted in
    ``EXTRA_REGIONS``)."""
    return 0


def make_pull_fft(world: Any, window: Any, dst: np.ndarray, count: int, ranks: np.ndarray, offsets: np.ndarray,
                  inverse: bool, cache: dict) -> Callable[[], None] | None:
    """The pull scheme's transform: ``dst`` gathered from the ranks' windows, ``dst.reshape(-1, n)[j, b] = window
    of ranks[b] [offsets[b] + j]`` (n: the points of its last ``count`` axes; elements of ``dst``'s type), then
    transformed in place over those axes. The cuda module does both in one pass: the pull's own kernels or a
    cuFFT plan with a load callback."""
    if dst.size == 0:
        return None
    flat = dst.reshape(-1, offsets.size)
    runs = np.arange(flat.shape[0])[:, None]
    sources = [(np.flatnonzero(ranks == r), int(r)) for r in np.unique(ranks)]
    transform = make_fft(world, "c2c", dst, dst, count, inverse, cache)

    def run() -> None:
        for points, r in sources:
            flat[:, points] = window.peer(r).view(dst.dtype)[offsets[points][None, :] + runs]
        transform()

    run.kernel = "gather, numpy"
    return run


def scale(world: Any, a: np.ndarray, factor: float) -> None:
    a *= a.dtype.type(factor)


def strided(flat: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A view of ``flat[offset:]`` with ``shape`` and ``strides`` (in elements)."""
    e = flat.itemsize
    return as_strided(flat[offset:], shape, tuple(s * e for s in strides), writeable=True)


class Runner:
    """Runs a plan's steps in order on the host; times the phases with the host clock."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.times: dict[str, float] = {}
        self.timeline: list[tuple[str, float, float]] = []
        self.total = 0.0

    def begin(self, profile: bool) -> None:
        self.times = {"fft": 0.0, "transpose": 0.0, "comm": 0.0, "put": 0.0}
        self.timeline = []  # (phase, start, end) from the execute's start
        self._t0 = time.perf_counter()
        self._comm_from: float | None = None

    def _phase(self, phase: str, op: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        op()
        t1 = time.perf_counter()
        self.times[phase] += t1 - t0
        self.timeline.append((phase, t0 - self._t0, t1 - self._t0))

    def fft(self, op: Callable[[], None]) -> None:
        self._phase("fft", op)

    def pack(self, op: Callable[[], None]) -> None:
        self._phase("transpose", op)

    def local(self, op: Callable[[], None]) -> None:
        """A local transpose the caller launches itself (the baselines' packing)."""
        self._phase("transpose", op)

    def put(self, queue: Any) -> None:
        t0 = time.perf_counter()
        self._phase("comm", queue.start)
        self.times["put"] += time.perf_counter() - t0

    def fence(self, queue: Any) -> None:
        """A cycle of ``queue`` that later puts wait for (a barrier), not the transforms."""
        self._phase("comm", lambda: (queue.start(), queue.wait()))

    def wait(self, queues: list) -> None:
        for q in queues:
            self._phase("comm", q.wait)

    def meet(self) -> None:
        """Every rank meets (the pull scheme: between a stage and the transforms that read it)."""
        from ... import rma

        self._phase("comm", lambda: rma.meet(self.world))

    def scale(self, a: np.ndarray, factor: float) -> None:
        self._phase("fft", lambda: scale(self.world, a, factor))

    def end(self, deadline: Any, queues: list) -> None:
        self.total = time.perf_counter() - self._t0
        self.times["total"] = self.total


def free_bytes(world: Any) -> tuple[int, str]:
    """(bytes this machine can still give, what that is): MemAvailable, and /dev/shm where windows live."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    what = "host memory (MemAvailable)"
    try:
        shm = shutil.disk_usage("/dev/shm").free
        if shm < avail:
            avail, what = shm, "shared memory (/dev/shm)"
    except OSError:
        pass
    return int(avail), what


def tile_model(world: Any, dtype: str) -> Any:
    """The cpu module has no tile model (its transposes are single numpy copies)."""
    return None


def same_memory(world: Any) -> bool:
    return True


def reshape_sync_seconds(world: Any) -> float | None:
    """No tile model here, so no hand-off cost to add to it."""
    return None


def shared_put_bandwidth(world: Any, dtype: str) -> float | None:
    """No tile model here, so nothing for the ranks' shared bandwidth to bound."""
    return None


def time_op(world: Any, op: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    op()
    return time.perf_counter() - t0


def fftn_reference(x: np.ndarray, inverse: bool) -> np.ndarray:
    """The one-rank ceiling: numpy's transform of the whole array."""
    return np.fft.ifftn(x) if inverse else np.fft.fftn(x)


def to_host(a: Any) -> np.ndarray:
    return np.asarray(a)


def random_array(world: Any, shape: tuple[int, ...], dtype: str, seed: Any) -> np.ndarray:
    g = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    real = np.float32 if dt in (np.float32, np.complex64) else np.float64
    if dt.kind == "f":
        return g.standard_normal(shape, dtype=real)
    return (g.standard_normal(shape, dtype=real) + 1j * g.standard_normal(shape, dtype=real)).astype(dt)


def sync(world: Any, what: str) -> None:
    """Nothing to wait for: host copies are done when they return."""


def release_memory(world: Any) -> None:
    """Nothing pooled on the cpu."""
