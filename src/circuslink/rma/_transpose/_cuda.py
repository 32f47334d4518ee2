"""Transposing puts on the cuda back-end: descriptors in device memory, tiles from the tile model.

At commit the queue's transposing puts become one :data:`TRANSPOSE_CHAIN` (a header and an array
of :data:`TRANSPOSE_DESCRIPTOR`, uploaded once) that the start launch reads through
``RmaQueue::transposes``: after the plain copies every block takes tiles b, b + grid, ... of the
chain, reads each tile coalesced from local memory, turns it in shared memory and writes it
coalesced into the peer (``include/circuslink/detail/transpose_impl.cuh``). The start kernel is
specialised on the element size when all puts share one (half the registers of the mixed one).

Tile shapes: a handle's forced ``tile``, else :func:`choose_tile`: the tile model
(``rma/_tile_model.py``) calibrated once per process and element size on local transposes
(B_ideal from a local device copy, the overheads fitted from a few tile shapes; the fit is kept
on the World), and where its
top candidates are within 10% of each other, those candidates timed on a local transpose of the
put's shape (capped at 64 MiB); the choice is cached per (dtype, rows, cols). The calibration
writes only this rank's own scratch memory: a put's true destination is a peer's window, which
commit may not scribble on. Within one GPU (ranks under MPS) local and peer memory are the same
HBM; across NVLink the model's absolute bandwidths are the local ones (the benchmark refits
against the probe's link figures).

The shared-memory pitch of a tile is chosen by simulating the 32 banks for both phases of the
kernel's thread mapping (:func:`bank_conflicts`), smallest conflict-free pitch first.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._abi import PTR, U32, U64, Struct
from ..._config import default_timeout
from ..._wait import Deadline, wait_until
from ...errors import RmaError
from .. import _tile_model as tm
from . import DTYPES, TILE_BUFFER_BYTES, TransposeHandle

THREADS = 256  # threads per block of every transposing kernel (the start launch's too)
_KERNELS = Path(__file__).resolve().parents[1] / "transpose_kernels.cu"
_HEADER = "circuslink/detail/transpose_types.cuh"

TRANSPOSE_DESCRIPTOR = Struct("circuslink::RmaTransposeDescriptor", _HEADER, [
    ("src", U64), ("dst", U64), ("rows", U64), ("cols", U64), ("src_ld", U64), ("dst_ld", U64),
    ("tile_begin", U64), ("tiles_across", U32), ("elem_bytes", U32), ("tile_rows_log2", U32),
    ("tile_cols_log2", U32), ("pitch", U32), ("reserved", U32)])
TRANSPOSE_CHAIN = Struct("circuslink::RmaTransposeChain", _HEADER, [
    ("descs", PTR), ("n_descs", U64), ("total_tiles", U64)])

_module = None


def _cp():
    import cupy

    return cupy


def kernels():
    """The compiled transpose_kernels.cu (once per process)."""
    global _module
    if _module is None:
        from ...device_code import compile as compile_device

        _module = compile_device(_KERNELS.read_text())
    return _module


# -- shared-memory pitch ------------------------------------------------------------------------
def bank_conflicts(m: int, n: int, elem: int, pitch: int, threads: int = THREADS) -> int:
    """Worst bank-conflict degree (1: none) of the kernel's two phases for tile (m, n) at ``pitch``.

    Read phase: thread t stores element (r = t / n, c = t % n); write phase: it loads element
    (r = t % m, c = t / m). A warp's access of ``elem``-byte words is served in phases of 128
    bytes; within one, lanes touching different 4-byte words of one bank serialise.
    """
    tid = np.arange(min(threads, m * n))
    lanes_per_phase = max(1, 128 // elem)
    words_per_elem = max(1, elem // 4)
    worst = 1
    for r, c in ((tid // n, tid % n), (tid % m, tid // m)):
        index = r * pitch + c
        for start in range(0, len(tid), lanes_per_phase):
            sel = index[start: start + lanes_per_phase]
            words = (sel[:, None] * words_per_elem + np.arange(words_per_elem)[None, :]).ravel()
            words = np.unique(words)
            worst = max(worst, int(np.bincount(words % 32, minlength=32).max()))
    return worst


@functools.cache
def pick_pitch(m: int, n: int, elem: int) -> int:
    """The smallest row pitch >= n (elements) with the fewest bank conflicts that fits the tile buffer."""
    best = None
    for pitch in range(n, n + 33):
        if m * pitch * elem > TILE_BUFFER_BYTES:
            break
        score = bank_conflicts(m, n, elem, pitch)
        if best is None or score < best[0]:
            best = (score, pitch)
        if score == 1:
            break
    if best is None:
        raise RmaError(f"transpose: tile {m} x {n} of {elem}-byte elements does not fit the "
                       f"{TILE_BUFFER_BYTES}-byte tile buffer")
    return best[1]


@functools.cache
def tile_candidates(elem: int) -> tuple[tuple[int, int], ...]:
    """Tiles the model chooses among: powers of two 8..128 a side, both bursts >= one 32-byte sector,
    every thread of a block at least one element, the padded tile in the buffer."""
    out = []
    for m, n in tm.candidates(elem, TILE_BUFFER_BYTES, min_elems=THREADS):
        if m * elem >= 32 and n * elem >= 32 and m * pick_pitch(m, n, elem) * elem <= TILE_BUFFER_BYTES:
            out.append((m, n))
    return tuple(out)


# -- chains in device memory --------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """One transpose for the device: addresses, shape (elements) and tile."""

    src: int
    dst: int
    rows: int
    cols: int
    src_ld: int
    dst_ld: int
    elem: int
    tile: tuple[int, int]


class DeviceChain:
    """A :data:`TRANSPOSE_CHAIN` and its descriptors in device memory (``ptr`` 0 when empty)."""

    def __init__(self, world: Any, pieces: Sequence[Piece]) -> None:
        cp = _cp()
        self.world = world
        self.pieces = list(pieces)
        self.ptr = 0
        self.total_tiles = 0
        self.mem = None
        sizes = {p.elem for p in self.pieces}
        self.elem = sizes.pop() if len(sizes) == 1 else 0  # 0: mixed sizes (or none)
        if not self.pieces:
            return
        descs = TRANSPOSE_DESCRIPTOR.array(len(self.pieces))
        tiles = 0
        for i, p in enumerate(self.pieces):
            m, n = p.tile
            across, down = -(-p.cols // n), -(-p.rows // m)
            descs[i] = (p.src, p.dst, p.rows, p.cols, p.src_ld, p.dst_ld, tiles, across, p.elem,
                        int(math.log2(m)), int(math.log2(n)), pick_pitch(m, n, p.elem), 0)
            tiles += across * down
        self.total_tiles = tiles
        head = -(-TRANSPOSE_CHAIN.size // 16) * 16
        blob = bytearray(head + descs.nbytes)
        mem = cp.cuda.alloc(len(blob))
        chain = TRANSPOSE_CHAIN.pack(descs=mem.ptr + head, n_descs=len(self.pieces), total_tiles=tiles)
        blob[:TRANSPOSE_CHAIN.size] = chain.tobytes()
        blob[head:] = descs.tobytes()
        host = np.frombuffer(bytes(blob), dtype=np.uint8)
        # On a stream of its own and waited for with a bound: a plain cudaMemcpy runs on the legacy stream,
        # which waits for every blocking stream's kernels (a resident agent's included) without a limit.
        upload = cp.cuda.Stream(non_blocking=True)
        cp.cuda.runtime.memcpyAsync(mem.ptr, host.ctypes.data, len(blob), cp.cuda.runtime.memcpyHostToDevice,
                                    upload.ptr)
        self.world.backend.wait_stream(upload, Deadline.after(default_timeout()),
                                       lambda: f"rank {self.world.rank}: the upload of a transposing chain's "
                                               f"{len(self.pieces)} descriptors")
        self.mem = mem
        self.ptr = mem.ptr
        # Compiled and sized now, not at the first launch, which may be inside a graph capture.
        self._kernel = kernels().get_function(f"circuslink_transpose_chain{self.elem}")
        # Its own launch waits on nothing (the queue's prologue node waited for the targets' posts): a full
        # wave of the rank's SMs, not the resident share a start launch is held to (held to it, a 256 MiB
        # complex64 put of 2 ranks took 720 us; as its own node, 488: BENCHMARKS.md, 2026-11-29).
        self._grid = max(1, min(self.total_tiles, self.world.backend.wave_blocks(self._kernel, THREADS)))

    def start_kernel_name(self, plain: str) -> str:
        """The RMA start kernel for a queue with this chain: ``plain`` when empty, else its specialisation."""
        return plain if not self.pieces else f"{plain}_transpose{self.elem}"

    def grid(self, kernel: Any, at_least: int = 1) -> int:
        """Blocks for a launch that turns this chain: a tile each, at most what may be resident
        under the rank's SM budget (the start launch's blocks wait on peers), at least ``at_least``."""
        if not self.pieces:
            return at_least
        resident = self.world.backend.max_blocks(kernel, THREADS, 0)  # a cupy RawKernel
        return max(at_least, min(self.total_tiles, resident))

    def launch(self, stream: Any = None) -> None:
        """Turn the chain on ``stream`` (the current stream when None), a kernel of its own: the graph launch's
        node between the queue's prologue and epilogue, and local transposes."""
        if not self.pieces:
            return
        if stream is None:
            self._kernel((self._grid,), (THREADS,), (np.uint64(self.ptr),))
        else:
            self._kernel((self._grid,), (THREADS,), (np.uint64(self.ptr),), stream=stream)


def queue_chain(world: Any, handles: Sequence[TransposeHandle], src_ptr: Callable[[TransposeHandle], int],
                dst_ptr: Callable[[TransposeHandle], int], deadline: Deadline | None = None) -> DeviceChain:
    """The chain of a queue's transposing puts (addresses from the window's module, tiles from the model; the
    calibration's waits bounded by ``deadline``, the commit's)."""
    pieces = []
    for h in handles:
        tile = h.tile or choose_tile(world, h.dtype, h.rows, h.cols, deadline)
        pieces.append(Piece(src_ptr(h), dst_ptr(h), h.rows, h.cols, h.src_ld, h.dst_ld, h.elem_bytes, tile))
    return DeviceChain(world, pieces)


# -- local transposes, timing, calibration ------------------------------------------------------
def plan_local_transpose(world: Any, dst: Any, src: Any, tile: tuple[int, int] | None) -> Callable[[], None]:
    elem = src.itemsize
    rows, cols = src.shape
    tile = tile or choose_tile(world, src.dtype.name, rows, cols)
    chain = DeviceChain(world, [Piece(src.data.ptr, dst.data.ptr, rows, cols, src.strides[0] // elem,
                                      dst.strides[0] // elem, elem, tile)])
    backend = world.backend

    def run() -> None:
        backend.after_caller()  # the caller's writes to src land first
        chain.launch(backend.stream)

    run.chain = chain  # keeps the descriptors alive with the callable
    return run


def time_local(world: Any, elem: int, rows: int, cols: int, tile: tuple[int, int], reps: int = 3,
               loops: int = 3, deadline: Deadline | None = None) -> float:
    """Seconds one local transpose of a rows x cols block takes with ``tile`` (best of ``reps``
    event-timed loops of ``loops``, after a warm-up), in scratch memory of this rank; each wait for
    the GPU bounded by ``deadline``."""
    cp = _cp()
    nbytes = rows * cols * elem
    src = cp.cuda.alloc(nbytes)
    dst = cp.cuda.alloc(nbytes)
    chain = DeviceChain(world, [Piece(src.ptr, dst.ptr, rows, cols, cols, rows, elem, tile)])
    stream = world.backend.stream
    start, end = cp.cuda.Event(), cp.cuda.Event()
    chain.launch(stream)
    best = math.inf
    for _ in range(reps):
        start.record(stream)
        for _ in range(loops):
            chain.launch(stream)
        end.record(stream)
        wait_until(lambda: end.done, deadline, f"rank {world.rank}: a local transpose timing the tile {tile}")
        best = min(best, cp.cuda.get_elapsed_time(start, end) * 1e-3 / loops)
    return best


def _local_copy_bandwidth(world: Any, nbytes: int = 64 << 20, deadline: Deadline | None = None) -> float:
    """Bytes/s of a device-to-device copy on this rank (what a put of contiguous bytes can reach)."""
    cp = _cp()
    src, dst = cp.cuda.alloc(nbytes), cp.cuda.alloc(nbytes)
    stream = world.backend.stream
    rt = cp.cuda.runtime
    start, end = cp.cuda.Event(), cp.cuda.Event()
    best = math.inf
    for i in range(4):
        start.record(stream)
        rt.memcpyAsync(dst.ptr, src.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr)
        end.record(stream)
        wait_until(lambda: end.done, deadline, f"rank {world.rank}: a local device copy (tile model calibration)")
        if i:
            best = min(best, cp.cuda.get_elapsed_time(start, end) * 1e-3)
    return nbytes / best


def square_shape(nbytes: int, elem: int) -> tuple[int, int]:
    """rows x cols of about ``nbytes`` (cols a power of two, rows = cols or 2 * cols)."""
    side = 1 << max(0, int(math.log2(max(1, nbytes // elem))) // 2)
    rows = max(1, nbytes // elem // side)
    return rows, side


_MODELS = "circuslink.rma.tile_models"  # World.registry key: {elem: TileModel}, fitted once per world


def calibrated_model(world: Any, elem: int, deadline: Deadline | None = None) -> tm.TileModel:
    """The tile model for ``elem``-byte elements on this rank's GPU, fitted once per world."""
    models = world.registry(_MODELS, dict)
    if elem in models:
        return models[elem]
    deadline = Deadline.after(deadline)
    tiles = tile_candidates(elem)
    b_ideal = _local_copy_bandwidth(world, deadline=deadline)
    samples = []
    picks = tm.calibration_tiles(tiles)
    for nbytes, chosen in ((32 << 20, picks), (8 << 20, picks[:2])):
        rows, cols = square_shape(nbytes, elem)
        for tile in chosen:
            samples.append(tm.Sample(tile, elem, rows, cols,
                                     time_local(world, elem, rows, cols, tile, deadline=deadline)))
    model = tm.fit(samples, b_ideal)
    models[elem] = model
    return model


_MEASURE_CAP = 64 << 20  # autotuning times at most this many bytes per candidate


def choose_tile(world: Any, dtype: str, rows: int, cols: int, deadline: Deadline | None = None) -> tuple[int, int]:
    """The tile a put of a rows x cols ``dtype`` block uses (see the module docstring)."""
    elem = DTYPES[dtype]
    deadline = Deadline.after(deadline)
    model = calibrated_model(world, elem, deadline)
    nbytes = rows * cols * elem
    scale = math.sqrt(_MEASURE_CAP / nbytes) if nbytes > _MEASURE_CAP else 1.0
    r, c = max(1, int(rows * scale)), max(1, int(cols * scale))
    return tm.choose(model, tile_candidates(elem), elem, rows, cols, key=("cuda", dtype, rows, cols),
                     measure=lambda tile: time_local(world, elem, r, c, tile, deadline=deadline))
