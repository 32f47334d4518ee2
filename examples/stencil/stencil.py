"""A 2-D 5-point Jacobi stencil on a process grid, its halos through circuslink channels.

The algorithm lives in this file once, and runs two ways:

* ``run_host``: numpy (or cupy) steps driven from the host, halos through the host channel API
  (``halo.exchange``). This is what the cpu back-end runs: it runs host-API programs only, no device
  kernels (docs/user-kernels.md, "Without a GPU").
* ``run_kernels``: the device kernels of kernels.cu, halos through the same channels from inside the
  kernel (``circuslink::Halo<T>``), in a launch form (two launches an iteration) and a persistent form
  (one launch for every iteration): on a grid (``grid_sync`` between phases), or, when a rank's block fits one
  SM's shared memory, on chip (one block holding the block of cells in shared memory for the whole run).

Both take the per-cell update from :func:`cell_update`: numpy calls it on arrays; the kernels get it as
C++ (:func:`cell_update_cxx` traces it into the macro ``CELL_UPDATE`` that kernels.cu uses), so the two
cannot drift, and since both add and scale in the same order the results are the same bits, checked
against :func:`reference` (the whole domain on one process).

The domain: ``nx x ny`` cells (axis 0 is x) inside a fixed boundary frame one cell wide; a rank owns a
block of them (the process grid ``mesh:PXxPY`` splits each axis as evenly as it goes: uneven splits) and
keeps it in an array of ``(lx + 2) x (ly + 2)`` with its ghost cells around: the neighbours' edges (the
halos), or the fixed boundary at the domain's edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import circuslink as cl

HERE = Path(__file__).resolve().parent
DTYPES = {"float32": np.float32, "float64": np.float64}
C_TYPES = {"float32": "float", "float64": "double"}
THREADS = 256  # threads a block; the first 4 warps of block 0 exchange the halos (one direction each)
EXCHANGE_THREADS = 4 * 32  # those warps (kernels.cu's kExchangeThreads): they update no interior cell
PERSISTENT_THREADS = 512  # the persistent kernel's blocks (kernels.cu's kPersistentThreads bounds its registers)
ONCHIP_THREADS = 512  # the on-chip kernel's one block (kernels.cu's kOnchipThreads)
# The persistent form's grid: about this many interior cells a thread. Fewer blocks would mean fewer arrivals at
# the grid barrier, but a thread's cells are updated one after another, each waiting on its loads: measured on one
# H200 at 64x64 (one rank, float64, one run), 1, 2 and 4 cells a thread took 2.3, 2.7 and 3.3 us an iteration.
CELLS_PER_THREAD = 1


def cell_update(xm, xp, ym, yp):
    """The stencil: a cell's next value from its four neighbours (-x, +x, -y, +y). The one definition of the
    update: numpy runs it on arrays, and the device kernels run its C++ trace (:func:`cell_update_cxx`)."""
    return 0.25 * ((xm + xp) + (ym + yp))


class _Traced:
    """An expression being traced: arithmetic on it builds C++ text (constants become ``T(c)``, the kernel's type)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @staticmethod
    def _of(x: Any) -> str:
        return x.text if isinstance(x, _Traced) else f"T({float(x)!r})"

    def _op(self, op: str, other: Any, swap: bool = False) -> _Traced:
        a, b = (self._of(other), self.text) if swap else (self.text, self._of(other))
        return _Traced(f"({a} {op} {b})")

    def __add__(self, o):
        return self._op("+", o)

    def __radd__(self, o):
        return self._op("+", o, True)

    def __sub__(self, o):
        return self._op("-", o)

    def __rsub__(self, o):
        return self._op("-", o, True)

    def __mul__(self, o):
        return self._op("*", o)

    def __rmul__(self, o):
        return self._op("*", o, True)

    def __truediv__(self, o):
        return self._op("/", o)


def cell_update_cxx() -> str:
    """:func:`cell_update` as the C++ macro kernels.cu expects (the order of operations kept, parenthesised)."""
    args = ("xm", "xp", "ym", "yp")
    body = cell_update(*(_Traced(a) for a in args))
    return f"#define CELL_UPDATE({', '.join(args)}) {body.text}\n"


# -- the problem and its reference ----------------------------------------------------------------------
def initial(shape: tuple[int, int], dtype: Any, seed: int) -> np.ndarray:
    """The whole domain at step 0, with its boundary frame: ``(nx + 2) x (ny + 2)`` values in [0, 1)."""
    return np.random.default_rng(seed).random((shape[0] + 2, shape[1] + 2)).astype(dtype)


def reference(u0: np.ndarray, iters: int) -> np.ndarray:
    """``iters`` Jacobi steps of the whole domain on one process (the frame stays fixed)."""
    u, v = u0.copy(), u0.copy()
    for _ in range(iters):
        v[1:-1, 1:-1] = cell_update(u[:-2, 1:-1], u[2:, 1:-1], u[1:-1, :-2], u[1:-1, 2:])
        u, v = v, u
    return u


def process_grid(nranks: int, shape: tuple[int, int]) -> str:
    """``mesh:PXxPY`` with ``PX * PY = nranks``, the split whose blocks are closest to square."""
    best = min(((px, nranks // px) for px in range(1, nranks + 1) if nranks % px == 0),
               key=lambda p: abs(np.log((shape[0] / p[0]) / (shape[1] / p[1]))))
    return f"mesh:{best[0]}x{best[1]}"


# -- a rank's block -------------------------------------------------------------------------------------
def local_block(halo: Any, u0: np.ndarray) -> np.ndarray:
    """This rank's block of the domain with its ghost cells (a copy of ``u0``'s cells there)."""
    bx, by = halo.block((u0.shape[0] - 2, u0.shape[1] - 2))
    return u0[bx.start:bx.stop + 2, by.start:by.stop + 2].copy()


def edge(u: Any, d: int) -> Any:
    """The cells this rank sends toward direction d (+x 0, -x 1, +y 2, -y 3)."""
    return (u[-2, 1:-1], u[1, 1:-1], u[1:-1, -2], u[1:-1, 1])[d]


def ghost_index(d: int) -> tuple:
    """Where the halo from direction d goes."""
    return ((-1, slice(1, -1)), (0, slice(1, -1)), (slice(1, -1), -1), (slice(1, -1), 0))[d]


def run_host(halo: Any, u: Any, iters: int) -> Any:
    """``iters`` steps of this rank's block ``u`` (numpy, or cupy on a GPU), halos through the host API."""
    xp = halo.world.xp
    u = xp.asarray(u)
    v = u.copy()
    for _ in range(iters):
        got = halo.exchange({d: xp.ascontiguousarray(edge(u, d)) for d in halo.directions})
        for d, cells in got.items():
            u[ghost_index(d)] = cells
        v[1:-1, 1:-1] = cell_update(u[:-2, 1:-1], u[2:, 1:-1], u[1:-1, :-2], u[1:-1, 2:])
        u, v = v, u
    return u


def gather(world: Any, halo: Any, u: Any, shape: tuple[int, int]) -> np.ndarray | None:
    """The whole domain's interior on rank 0 (None elsewhere), from every rank's block."""
    box = halo.block(shape)
    inner = u[1:-1, 1:-1]
    inner = inner.get() if hasattr(inner, "get") else np.asarray(inner)
    parts = world.allgather_object(((box[0].start, box[0].stop, box[1].start, box[1].stop), inner))
    if world.rank != 0:
        return None
    out = np.empty(shape, dtype=inner.dtype)
    for (x0, x1, y0, y1), part in parts:
        out[x0:x1, y0:y1] = part
    return out


# -- the device kernels ------------------------------------------------------------------------------------
# "persistent" is the on-chip kernel where a rank's block fits one SM's shared memory, else the grid kernel;
# "persistent-grid" and "persistent-onchip" ask for one of them (A/B runs, and the tests of both).
FORMS = ("launch", "persistent", "persistent-grid", "persistent-onchip")


def onchip_bytes(block: tuple[int, int], itemsize: int) -> int:
    """Dynamic shared memory the on-chip kernel takes for a rank's ``block`` (lx, ly): both buffers, ghosts too."""
    return 2 * (block[0] + 2) * (block[1] + 2) * itemsize


def persistent_kernel(form: str, block: tuple[int, int], itemsize: int, static_bytes: int, limit: int) -> str:
    """Which kernel runs ``form`` ("persistent..."): "onchip" or "grid". The on-chip kernel needs its dynamic
    shared memory (:func:`onchip_bytes`) and its static (``static_bytes``) within ``limit``, the most one block may
    have (the device's opt-in limit); "persistent-onchip" on a block past it is refused in one line."""
    need = onchip_bytes(block, itemsize) + static_bytes
    fits = need <= limit
    if form == "persistent-grid" or (form == "persistent" and not fits):
        return "grid"
    if not fits:
        raise cl.ConfigError(f"stencil: --form persistent-onchip needs {need} B of shared memory for a block of "
                             f"{block[0]}x{block[1]} cells ({itemsize} B each, two buffers with ghosts), past one "
                             f"block's {limit} B: use --form persistent (the grid kernel where it does not fit)")
    return "onchip"


def compile_kernels(defines: str = "") -> Any:
    """kernels.cu with :func:`cell_update` traced into it, for float and double (``defines``: more lines in front,
    e.g. a dev build's ``#define STENCIL_PHASES``)."""
    names = [f"{k}<{t}>" for k in ("jacobi_exchange_interior", "jacobi_frame", "jacobi_persistent", "jacobi_onchip")
             for t in C_TYPES.values()]
    return cl.compile(defines + cell_update_cxx() + (HERE / "kernels.cu").read_text(), name_expressions=names)


class KernelRun:
    """The device form of one rank's block: two buffers with their ghosts, the halo's staging, the kernels."""

    def __init__(self, world: Any, halo: Any, u0: np.ndarray, module: Any, timeout: float | None = None) -> None:
        import cupy as cp

        self.world, self.halo = world, halo
        self.lx, self.ly = u0.shape[0] - 2, u0.shape[1] - 2
        c_type = C_TYPES[np.dtype(u0.dtype).name]
        self.k_interior = module.get_function(f"jacobi_exchange_interior<{c_type}>")
        self.k_frame = module.get_function(f"jacobi_frame<{c_type}>")
        self.k_persistent = module.get_function(f"jacobi_persistent<{c_type}>")
        self.k_onchip = module.get_function(f"jacobi_onchip<{c_type}>")
        self.itemsize = np.dtype(u0.dtype).itemsize
        self.onchip_bytes = onchip_bytes((self.lx, self.ly), self.itemsize)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self.shared_limit = int(props["sharedMemPerBlockOptin"])
        self.bufs = [cp.asarray(u0), cp.asarray(u0)]
        face = max(self.lx, self.ly)
        self.send = cp.zeros(4 * face, dtype=u0.dtype)
        self.recv = cp.zeros(4 * face, dtype=u0.dtype)
        self.failed = cp.zeros(1, dtype=cp.int32)
        self.clocks = cp.zeros(2 + 8 * 5, dtype=cp.uint64)  # [timed_from's start, end, a dev build's phase sums]
        self.timed = None  # (timed_from, iters) of the last persistent launch that stamped its clocks
        self.handle = halo.device_handle()
        self.stream = cp.cuda.get_current_stream()
        self.barrier = world.backend.grid_barrier(timeout=halo.channels.timeout if halo.channels else timeout)
        self.interior = max(0, self.lx - 2) * max(0, self.ly - 2)
        self.frame = self.lx * self.ly - self.interior
        sms = world.backend.sm_budget or 1
        self.launch_blocks = 1 + min(-(-self.interior // THREADS), 8 * sms)
        self.frame_blocks = max(1, min(-(-self.frame // THREADS), 8 * sms))
        need = -(-(self.interior + EXCHANGE_THREADS) // (CELLS_PER_THREAD * PERSISTENT_THREADS))
        self.persistent_blocks = max(1, min(need, world.backend.max_blocks(self.k_persistent, PERSISTENT_THREADS)))
        self.current = 0  # which buffer holds the latest step
        self.wait_s = timeout or 120.0  # the host's bound on a wait when there are no channels (one rank)

    def _args(self, u: Any, v: Any) -> tuple:
        return (self.handle, u, v, np.int32(self.lx), np.int32(self.ly), self.send, self.recv, self.failed)

    def persistent_kernel(self, form: str = "persistent") -> str:
        """"onchip" or "grid": the kernel that runs ``form`` on this rank's block (:func:`persistent_kernel`)."""
        return persistent_kernel(form, (self.lx, self.ly), self.itemsize, int(self.k_onchip.shared_size_bytes),
                                 self.shared_limit)

    def steps(self, iters: int, form: str, timed_from: int | None = None) -> None:
        """Launch ``iters`` steps in ``form`` on the current stream (:meth:`wait` waits for them, bounded).
        ``timed_from`` (persistent forms): the kernel stamps the device's clock as that iteration begins and after
        the last; :meth:`seconds_per_step` reads them once the steps are done."""
        # the kernels' clocks pointer: null (a 64-bit 0) when this launch is not timed
        clock_args = (self.clocks if timed_from is not None else np.uint64(0), np.int32(timed_from or 0))
        if timed_from is not None:
            if form not in FORMS[1:] or not 0 <= timed_from < iters:
                raise cl.ConfigError(f"stencil: timed_from={timed_from} needs a persistent form and 0 <= timed_from "
                                     f"< iters ({iters})")
            self.timed = (timed_from, iters)
        if form in FORMS[1:] and self.persistent_kernel(form) == "onchip":
            u, v = self.bufs[self.current], self.bufs[1 - self.current]
            # past 48 KB, dynamic shared memory must be asked for (cudaFuncAttributeMaxDynamicSharedMemorySize)
            self.k_onchip.max_dynamic_shared_size_bytes = self.onchip_bytes
            self.world.backend.launch_resident(self.k_onchip, 1, ONCHIP_THREADS,
                                               (*self._args(u, v), np.int32(iters), *clock_args),
                                               shared_bytes=self.onchip_bytes)
            self.current = (self.current + iters) % 2
        elif form == "launch":
            for _ in range(iters):
                u, v = self.bufs[self.current], self.bufs[1 - self.current]
                self.k_interior((self.launch_blocks,), (THREADS,), self._args(u, v))
                self.k_frame((self.frame_blocks,), (THREADS,), (u, v, np.int32(self.lx), np.int32(self.ly)))
                self.current = 1 - self.current
        elif form in FORMS[1:]:
            u, v = self.bufs[self.current], self.bufs[1 - self.current]
            self.world.backend.launch_resident(self.k_persistent, self.persistent_blocks, PERSISTENT_THREADS,
                                               (*self._args(u, v), self.barrier.device_handle(), np.int32(iters),
                                                np.int32(self.frame <= PERSISTENT_THREADS), *clock_args))
            self.current = (self.current + iters) % 2
        else:
            raise cl.ConfigError(f"stencil: form {form!r} is not one of {', '.join(FORMS)}")

    def wait(self, what: str) -> None:
        """Bounded wait for the launched steps, then raise the error a channel or the kernel recorded."""
        if self.halo.channels is not None:
            self.halo.channels.wait_kernel(self.stream, what)
        else:
            self.world.backend.wait_stream(self.stream, self.wait_s, what)
        if int(self.failed.get()[0]):
            raise cl.ChannelError(f"{what}: a halo exchange or grid barrier failed without a channel error record")

    def seconds_per_step(self) -> float:
        """Seconds an iteration took on the device's own clock, from iteration ``timed_from`` of the last timed
        :meth:`steps` to its end (call after :meth:`wait`)."""
        if self.timed is None:
            raise cl.ConfigError("stencil: seconds_per_step() needs a persistent steps(..., timed_from=k) first")
        timed_from, iters = self.timed
        start, end = (int(t) for t in self.clocks[:2].get())
        return (end - start) * 1e-9 / (iters - timed_from)

    @property
    def result(self) -> Any:
        return self.bufs[self.current]
