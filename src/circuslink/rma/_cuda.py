"""The cuda back-end's RMA windows: queues inside a node, over the mapped memory of the ipc transport (CUDA IPC
peer memory, NVLink).

commit() packs the chain once into device memory (an ``RmaQueue`` followed by its
descriptors and counter addresses, byte for byte as ``include/circuslink/detail/rma_types.cuh``
lays them out, from the ABI tables of ``_layout.py``), and captures one whole cycle (its start, then
its wait) as one CUDA graph. Then every host-driven cycle is one graph launch: start() launches it (after
the caller's stream) and wait() only waits for the world's stream, bounded, and raises what the device
recorded. Two ways to copy, read at commit from ``CIRCUSLINK_RMA_LAUNCH`` ("auto", the default,
picks by the chain's size: :func:`choose_launch`):

* "kernel": SM copies. The start kernel posts, waits for the targets' posts, copies the
  chain (block-stride writes straight from strided source to strided destination, no packing; a
  small chain as one aligned 8- or 16-byte word per thread) and raises the targets' arrival counters.
* "graph": copy-engine copies. A post kernel, one 2-D copy (cudaMemcpy2DAsync, peer) per handle, a
  signal kernel.

``start(stream=)`` enqueues the start alone on the caller's stream (capturable into the caller's own
graph) and ``wait(stream=)`` the one-block wait kernel. Counters release and acquire at .gpu scope
when every rank shares one GPU (ranks under MPS), else at .sys scope.

The copy method can thus be measured both ways without code changes. Every kernel takes the queue's device
handle (``circuslink::RmaHandle``, :data:`~._layout.HANDLE`) by value; kernels of users drive a
queue themselves through ``circuslink::rma_start`` / ``rma_wait`` and ``Queue.device_handle()``.
Device-side waits time out (the queue's time-out, or the one given to wait()) and record the
stalled rank in host-mapped memory; the host raises it. Host waits for the stream are bounded
(``backend.wait_stream``).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import transport
from .._wait import Deadline, timeout_error
from ..errors import RmaError, TimeoutError
from ._layout import (
    DESCRIPTOR,
    ERR_SESSION,
    GPU_SCOPE,
    HANDLE,
    LINE,
    LL_DEPTH,
    LL_LINE_BYTES,
    LOW_LATENCY,
    QUEUE,
    SIGNAL_ONLY,
    SMALL_CHAIN_BYTES,
    WORD,
    session_threads,
    work_units,
)
from ._transpose import _cuda as transposes
from ._transpose import is_transpose

LAUNCHES = ("auto", "kernel", "graph")
# "auto": copy-engine copies ("graph") for chains of at least this many bytes of plain writes whose blocks are
# all at least COPY_ENGINE_MIN_BLOCK bytes, SM copies ("kernel") otherwise. Why: SM copies run on the rank's
# share of the SMs (with 2 ranks under MPS, a quarter of the GPU): a 16 MiB chain took 28.7 us, 0.33 x the
# copy engine's figure of the same run, which no SM share limits; a small chain's SM start is one kernel
# node against the copy engine's four; and a 2-D copy-engine copy of narrow rows (512 B) pays per row,
# where SM copies deal small blocks to lanes like contiguous bytes (not yet measured side by side).
# CIRCUSLINK_RMA_COPY_ENGINE_FROM (bytes) moves the switch point (to be measured: bench rma with
# CIRCUSLINK_RMA_LAUNCH=kernel and =graph).
COPY_ENGINE_FROM = 256 << 10
COPY_ENGINE_MIN_BLOCK = 4096
_KERNELS = Path(__file__).with_name("rma_kernels.cu")
_THREADS = 256


def _cp():
    import cupy

    return cupy


@functools.cache
def _kernels(transpose_elem: int | None = None):
    """The compiled rma_kernels.cu, in parts: the plain queue kernels (None), or the start and cycle kernels of
    queues whose transposing puts move ``transpose_elem``-byte elements (0: mixed sizes). Each part once per
    process and only when a queue needs it: NVRTC takes about 1 s a part (sm_90a), where the whole file at
    once took about 5 s, and an FFT needs two parts (one precision), a plain RMA program one."""
    from ..device_code import compile as compile_device

    options = () if transpose_elem is None else (f"-DCIRCUSLINK_RMA_TRANSPOSE_ELEM={int(transpose_elem)}",)
    return compile_device(_KERNELS.read_text(), options=options)


def _alignment(*values: int) -> int:
    align = 16
    for v in values:
        while v % align:
            align //= 2
    return align


def launch_mode() -> str:
    """How start() launches a cycle: ``CIRCUSLINK_RMA_LAUNCH`` (default "auto")."""
    name = os.environ.get("CIRCUSLINK_RMA_LAUNCH", "auto").strip().lower() or "auto"
    if name not in LAUNCHES:
        raise RmaError(f"CIRCUSLINK_RMA_LAUNCH={name!r}: choose one of {', '.join(LAUNCHES)}")
    return name


def copy_engine_from() -> int:
    """The "auto" launch's switch point: ``CIRCUSLINK_RMA_COPY_ENGINE_FROM`` bytes (default COPY_ENGINE_FROM)."""
    text = os.environ.get("CIRCUSLINK_RMA_COPY_ENGINE_FROM", "").strip()
    if not text:
        return COPY_ENGINE_FROM
    if not text.isdigit():
        raise RmaError(f"CIRCUSLINK_RMA_COPY_ENGINE_FROM={text!r}: a number of bytes, e.g. 262144")
    return int(text)


def low_latency_wanted() -> bool:
    """Whether small chains may travel as low-latency lines: ``CIRCUSLINK_RMA_LOW_LATENCY`` (default 1; 0 keeps
    the fenced protocol: posts, stores into the window, release and arrival; for A/B runs)."""
    text = os.environ.get("CIRCUSLINK_RMA_LOW_LATENCY", "1").strip()
    if text not in ("0", "1"):
        raise RmaError(f"CIRCUSLINK_RMA_LOW_LATENCY={text!r}: 1 (small chains as low-latency lines) or 0")
    return text == "1"


def chain_lines(blocks: list[tuple[int, int, int, int, int, int]]) -> list[tuple[int, int]]:
    """A small chain's 8-byte words in order, (src, dst) per word, for blocks (src, dst, count, block_bytes,
    src_stride, dst_stride) whose addresses, sizes and strides are all multiples of 8 (a low-latency line carries
    8 bytes)."""
    return [(src + b * ss + k, dst + b * ds + k)
            for src, dst, count, block, ss, ds in blocks for b in range(count) for k in range(0, block, 8)]


def staging_layout(outgoing: list[dict[int, int]]) -> tuple[int, dict[tuple[int, int], int]]:
    """Where each origin's lines land in each target's staging. ``outgoing[o]``: {target: lines o sends it}, for
    every rank o. Returns (slot bytes: one epoch's lines of the busiest target, the same on every rank, rounded
    up to 128 bytes; {(origin, target): byte offset of the origin's region in the target's slot}). Regions follow
    one another in origin order."""
    offsets: dict[tuple[int, int], int] = {}
    used: dict[int, int] = {}
    for o, per_target in enumerate(outgoing):
        for t in sorted(per_target):
            offsets[(o, t)] = used.get(t, 0)
            used[t] = used.get(t, 0) + per_target[t] * LL_LINE_BYTES
    most = max(used.values(), default=0)
    return max(128, -(-most // 128) * 128), offsets


def choose_launch(mode: str, blocks: list[tuple[int, int]], transpose_bytes: int = 0) -> str:
    """The launch of a chain of plain writes (count, block_bytes) and ``transpose_bytes`` of transposing puts under
    ``mode`` (see COPY_ENGINE_FROM). Large transposing puts take the graph too, whose transposes are a kernel node
    of their own with a full wave of blocks (none waits on a peer), where inside the start launch they would be
    held to the blocks that may wait at once (a quarter of the GPU with 2 ranks); their plain writes then go by the
    copy engine too, which is only taken where those are large rows or few bytes (it pays per row)."""
    if mode != "auto":
        return mode
    total = sum(count * block for count, block in blocks)
    large_rows = all(block >= COPY_ENGINE_MIN_BLOCK for _, block in blocks)
    if blocks and large_rows and total >= copy_engine_from():
        return "graph"
    if transpose_bytes >= copy_engine_from() and (large_rows or total < copy_engine_from()):
        return "graph"
    return "kernel"


def open_window(world: Any, nbytes: int, deadline: Deadline) -> CudaWindow:
    """This module's half of ``rma.window_alloc`` (collective)."""
    return CudaWindow(world, nbytes, deadline)


class CudaWindow:
    runs_on_streams = True
    one_epoch_per_window = False

    def __init__(self, world: Any, nbytes: int, deadline: Deadline) -> None:
        from ..channels import fences_at_gpu_scope

        self.world = world
        # Every rank on one GPU (ranks under MPS): the queues' counters release / acquire at .gpu scope.
        self.gpu_scope = fences_at_gpu_scope(world.allgather_object(world.backend.device_identity, deadline))
        self.buf = transport.map_memory(world, None, nbytes, deadline)

    @property
    def local(self):
        return self.buf.local

    def peer(self, rank: int):
        return self.buf.peer(rank)

    def new_queue(self, deadline: Deadline) -> CudaQueue:
        return CudaQueue(self, deadline)

    def close(self, deadline: Deadline) -> None:
        self.buf.close(deadline)

    def release_local(self) -> None:
        self.buf.release_local()


class CudaQueue:
    def __init__(self, window: CudaWindow, deadline: Deadline) -> None:
        cp = _cp()
        self.cp = cp
        self.world = window.world
        self.window = window
        self.size = self.world.size
        self.stream = self.world.backend.stream
        self.signals = transport.map_memory(self.world, None, 2 * self.size * 8, deadline)
        self.error_ptr = 0
        try:
            with self.stream:  # the kernels that use it run on this stream: no race with the null stream
                self.state = cp.zeros(3, dtype=cp.uint64)  # RmaState: epoch, done_ctas, failed
            # Host-mapped error record: the host reads it after a wait without a device copy.
            self.error_ptr = cp.cuda.runtime.hostAlloc(24, cp.cuda.runtime.hostAllocMapped)
        except BaseException:
            self.signals.release_local()
            raise
        self.error = np.frombuffer((ctypes.c_uint64 * 3).from_address(self.error_ptr), dtype=np.uint64)
        self.error[:] = 0
        self.handle_mem = None
        self.handle: np.void | None = None
        self.graph = None          # one whole cycle (start, then wait), captured at commit: what start() launches
        self.graph_cycle = False   # the epoch in flight was started by that graph: its wait is already enqueued
        self.tchain = None
        self.queue: Any = None
        self.words = 0
        self.staging: Any = None  # low-latency queues: every rank's staging slots (mapped; kept until close)
        self.low_latency = False
        self.n_lines = 0
        self.n_targets = 0
        self.handles: list = []
        self.n_origins = 0
        self.grid = 1
        self.units = 0
        self.tiles: dict[int, tuple[int, int]] = {}
        self.launch = "kernel"

    def _stream_wait(self, stream: Any, deadline: Deadline, what: str) -> None:
        self.world.backend.wait_stream(stream, deadline, lambda: f"{self.queue._where() if self.queue else 'rma'}: "
                                                                 f"{what}")

    # commit --------------------------------------------------------------------------------
    def current_epoch(self, host_epoch: int, deadline: Deadline) -> int:
        # Device-driven cycles advance the device's counter without the host: it is the truth.
        self._stream_wait(self.stream, deadline, "the queue's last cycle did not finish before commit")
        return int(self.state[0].get(stream=self.stream))

    def commit(self, queue: Any, base: int, post_at: str, incoming: dict, deadline: Deadline) -> None:
        cp = self.cp
        self.queue = queue
        me, size = self.world.rank, self.size
        handles = sorted((h for h in queue.handles if not is_transpose(h)), key=lambda h: h.dst_rank)
        # Transposing puts: their own descriptors, run by the start launch after the copies (or, in the graph,
        # as a kernel node after the copy-engine copies).
        tputs = [h for h in queue.handles if is_transpose(h)]
        self.launch = choose_launch(launch_mode(), [(h.count, h.block_bytes) for h in handles],
                                    sum(h.rows * h.cols * h.elem_bytes for h in tputs))
        self.tchain = transposes.queue_chain(
            self.world, tputs,
            src_ptr=lambda h: h.src_window._impl.buf.ptr(me) + h.src_offset,
            dst_ptr=lambda h: self.window.buf.ptr(h.dst_rank) + h.dst_offset, deadline=deadline)
        self.tiles = {h.id: p.tile for h, p in zip(tputs, self.tchain.pieces, strict=True)}
        descs = DESCRIPTOR.array(len(handles))
        units = 0
        for i, h in enumerate(handles):
            src = h.src_window._impl.buf.ptr(me) + h.src_offset
            dst = self.window.buf.ptr(h.dst_rank) + h.dst_offset
            strides = (h.src_stride, h.dst_stride) if h.count > 1 else ()
            n_units, per_block, per_unit = work_units(h.count, h.block_bytes)
            descs[i] = (src, dst, h.count, h.block_bytes, h.src_stride, h.dst_stride, units, per_block,
                        _alignment(src, dst, h.block_bytes, *strides), per_unit, 0)
            units += n_units
        words, word_bytes = small_chain_words(self._blocks(handles))
        targets = list(queue.targets)
        origins = list(queue.origins)
        lines = LINE.array(0)
        slot_bytes = 0
        signal_only = queue.signal_only  # no chain: the start only releases my own stores and raises arrivals
        ll = None if signal_only else self._plan_low_latency(handles, words, bool(tputs), origins, deadline)
        if ll is not None:
            words, lines, slot_bytes = ll
            word_bytes = 8
        sig = self.signals
        arrays = [
            descs.tobytes(),
            np.array(targets, dtype=np.uint64).tobytes(),
            np.array([sig.ptr(t) + 8 * me for t in targets], dtype=np.uint64).tobytes(),
            np.array(origins, dtype=np.uint64).tobytes(),
            np.array([sig.ptr(o) + 8 * (size + me) for o in origins], dtype=np.uint64).tobytes(),
            words.tobytes(),
            lines.tobytes(),
        ]
        header = -(-QUEUE.size // 16) * 16
        offsets, at = [], header
        for a in arrays:
            offsets.append(at)
            at += (len(a) + 15) // 16 * 16
        mem = cp.cuda.alloc(max(at, 16))
        base_ptr = mem.ptr
        fields = {
            "descs": base_ptr + offsets[0], "n_descs": len(handles), "total_units": units,
            "signals": sig.ptr(me), "size": size,
            "targets": base_ptr + offsets[1], "arrival_at_target": base_ptr + offsets[2], "n_targets": len(targets),
            "origins": base_ptr + offsets[3], "post_at_origin": base_ptr + offsets[4], "n_origins": len(origins),
            "state": self.state.data.ptr, "error": self.error_ptr,
            # The queue's time-out (commit's), for every device wait of a start and of device-driven waits.
            "timeout_ns": max(1, int(deadline.limit * 1e9)),
            "post_at_wait": int(post_at == "wait" and not signal_only),  # a signal-only queue posts nothing
            "abort": self.world.backend.abort_ptr,
            "transposes": self.tchain.ptr,
            "flags": ((GPU_SCOPE if self.window.gpu_scope else 0) | (LOW_LATENCY if ll is not None else 0)
                      | (SIGNAL_ONLY if signal_only else 0)),
            "words": base_ptr + offsets[5] if len(words) else 0, "n_words": len(words), "word_bytes": word_bytes,
            "lines": base_ptr + offsets[6] if len(lines) else 0, "n_lines": len(lines), "ll_slot_bytes": slot_bytes,
            "ll_base": base,
        }
        blob = bytearray(at)
        blob[:QUEUE.size] = QUEUE.pack(**fields).tobytes()
        for off, a in zip(offsets, arrays, strict=True):
            blob[off: off + len(a)] = a
        host = np.frombuffer(bytes(blob), dtype=np.uint8)
        # On the world's stream (non-blocking: a copy on the legacy stream from pageable memory may return
        # before its DMA lands, unordered with the kernels that read the queue); waited for below.
        cp.cuda.runtime.memcpyAsync(base_ptr, host.ctypes.data, len(blob), cp.cuda.runtime.memcpyHostToDevice,
                                    self.stream.ptr)
        self.handle_mem = mem
        self.handle = HANDLE.pack(queue=base_ptr, q=QUEUE.pack(**fields))
        self.handles = handles
        self.n_origins = len(origins)
        self.n_targets = len(targets)
        self.units = units
        self.words = len(words)
        self.n_lines = len(lines)
        self.low_latency = ll is not None
        with self.stream:
            self.state[:] = cp.array([base, 0, 0], dtype=cp.uint64)
        self.error[:] = 0
        warps = _THREADS // 32
        kernels = _kernels()
        starts = _kernels(self.tchain.elem) if self.tchain.pieces else kernels
        self.k_start = starts.get_function(self.tchain.start_kernel_name("circuslink_rma_start"))
        # The start and the wait of a host-driven cycle in one launch (one graph node instead of two).
        self.k_cycle = starts.get_function(self.tchain.start_kernel_name("circuslink_rma_cycle"))
        # Every CTA of the start kernel waits for the targets' posts: never more CTAs than this rank's
        # SM share holds at once (of either kernel), or they could take the SMs a target needs to post.
        # A small chain is one CTA's words (no count of finished CTAs, no fence between them).
        backend = self.world.backend
        resident = min(backend.max_blocks(self.k_start, _THREADS), backend.max_blocks(self.k_cycle, _THREADS))
        self.grid = 1 if len(words) else max(1, min(-(-units // warps), resident))
        self.grid = min(self.tchain.grid(self.k_start, self.grid), self.tchain.grid(self.k_cycle, self.grid))
        self.k_wait = kernels.get_function("circuslink_rma_wait")
        self._stream_wait(self.stream, deadline, "setting up the queue's state on the device")
        del host  # the copy above has landed
        if post_at == "wait" and not signal_only:
            # The first epoch is open from the start: post it into every origin (landed before commit returns).
            one = np.array([base + 1], dtype=np.uint64)
            for o in origins:
                cp.cuda.runtime.memcpyAsync(sig.ptr(o) + 8 * (size + me), one.ctypes.data, 8,
                                            cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)
            self._stream_wait(self.stream, deadline, "posting the queue's first epoch")
        self.k_prologue = kernels.get_function("circuslink_rma_prologue")
        self.k_epilogue = kernels.get_function("circuslink_rma_epilogue")
        self.graph = self._capture_cycle(deadline)

    def _plan_low_latency(self, handles: list, words: np.ndarray, transposing: bool, origins: list[int],
                          deadline: Deadline) -> tuple[np.ndarray, np.ndarray, int] | None:
        """Collective: whether this queue's small chains travel as low-latency lines (kRmaLowLatency), and if so
        (my words, each with its line in the target's staging as dst; the lines I receive; the slot bytes).

        Every rank must agree: a target polls lines only if each of its origins sends them. A rank qualifies
        when its chain is small (words), has no transposing puts, is launched by kernels (not the copy engine)
        and every address is a multiple of 8; one rank that does not keeps the whole queue on the fenced
        protocol. ``CIRCUSLINK_RMA_LOW_LATENCY=0`` turns it off everywhere."""
        me = self.world.rank
        mine = None
        per_target: dict[int, list[tuple[int, int]]] = {}  # (src, dst) of each word, by target, in handle order
        if low_latency_wanted() and not transposing and self.launch == "kernel" and (len(words) or not handles):
            # small_chain_words found a width of 8 or 16 for all of them: every address and size is a multiple of 8
            for h in handles:
                per_target.setdefault(h.dst_rank, []).extend(chain_lines(self._blocks([h])))
            # what each target learns: where in its window each of my lines goes, in the order I store them
            mine = {t: [dst - self.window.buf.ptr(t) for _, dst in pairs] for t, pairs in per_target.items()}
        everyone = self.world.allgather_object(mine, deadline)
        if any(e is None for e in everyone):
            return None
        slot_bytes, region = staging_layout([{t: len(offs) for t, offs in e.items()} for e in everyone])
        need = LL_DEPTH * slot_bytes
        if self.staging is None or self.staging.nbytes < need:  # the same answer on every rank
            if self.staging is not None:
                self.staging.close(deadline)
                self.staging = None
            self.staging = transport.map_memory(self.world, None, need, deadline)
            self.cp.cuda.runtime.memsetAsync(self.staging.ptr(me), 0, need, self.stream.ptr)  # no epoch in any line
            self._stream_wait(self.stream, deadline, "zeroing the queue's staging")
            self.world.allgather_object(None, deadline)  # every staging zeroed before any origin stores into it
        out = WORD.array(sum(len(pairs) for pairs in per_target.values()))
        k = 0
        for t, pairs in per_target.items():
            base = self.staging.ptr(t) + region[(me, t)]
            for j, (src, _) in enumerate(pairs):
                out[k] = (src, base + j * LL_LINE_BYTES)
                k += 1
        lines = LINE.array(sum(len(everyone[o].get(me, [])) for o in origins))
        k = 0
        for o in origins:
            base = self.staging.ptr(me) + region[(o, me)]
            for j, off in enumerate(everyone[o][me]):
                lines[k] = (base + j * LL_LINE_BYTES, self.window.buf.ptr(me) + off, o, 0)
                k += 1
        return out, lines, slot_bytes

    def _capture_cycle(self, deadline: Deadline):
        """One whole host-driven cycle as one CUDA graph, captured once: start() is then one graph launch
        (one driver call, no per-kernel argument packing in Python) and wait() only waits for it. SM copies:
        one kernel node (circuslink_rma_cycle: the start, then its last CTA waits); copy engine: post kernel,
        copies, signal kernel, wait kernel.

        The wait node carries the queue's time-out (commit's); wait(timeout=) bounds the host's wait and,
        past it, ends the device wait through the abort word."""
        capture = self.cp.cuda.Stream(non_blocking=True)
        capture.begin_capture()
        try:
            if self.launch == "kernel":  # one node: the start, then its last CTA waits (the queue's time-out)
                with capture:
                    self.k_cycle((self.grid,), (_THREADS,), (self.handle,))
            else:
                self._enqueue_start(capture)
                self._enqueue_wait(capture, max(1, int(deadline.limit * 1e9)))
        finally:
            graph = capture.end_capture()
        graph.upload(self.stream)
        return graph

    def _enqueue_start(self, stream: Any) -> None:
        """The start of a cycle on ``stream`` (capturable): the SM copy kernel ("kernel"), or post kernel,
        copy-engine 2-D copies, transposing puts and signal kernel ("graph")."""
        if self.launch == "kernel":
            with stream:
                self.k_start((self.grid,), (_THREADS,), (self.handle,))
            return
        rt = self.cp.cuda.runtime
        with stream:
            self.k_prologue((1,), (64,), (self.handle,))
            for d in self._descs_host():
                rt.memcpy2DAsync(int(d["dst"]), int(d["dst_stride"]), int(d["src"]), int(d["src_stride"]),
                                 int(d["block_bytes"]), int(d["count"]), rt.memcpyDefault, stream.ptr)
            self.tchain.launch(stream)  # the transposing puts: one kernel node
            self.k_epilogue((1,), (64,), (self.handle,))

    def _enqueue_wait(self, stream: Any, timeout_ns: int) -> None:
        if self.n_origins:
            # a thread an origin's counter, or a thread a low-latency line (up to the block), in whole warps
            polls = max(self.n_origins, self.n_lines)
            threads = min(_THREADS, -(-polls // 32) * 32)
            with stream:
                self.k_wait((1,), (threads,), (self.handle, np.uint64(timeout_ns)))

    def _blocks(self, handles: list) -> list[tuple[int, int, int, int, int, int]]:
        """(src, dst, count, block_bytes, src_stride, dst_stride) of each plain write, as device addresses."""
        me = self.world.rank
        return [(h.src_window._impl.buf.ptr(me) + h.src_offset, self.window.buf.ptr(h.dst_rank) + h.dst_offset,
                 h.count, h.block_bytes, h.src_stride if h.count > 1 else h.block_bytes,
                 h.dst_stride if h.count > 1 else h.block_bytes) for h in handles]

    def _descs_host(self) -> list:
        keys = ("src", "dst", "count", "block_bytes", "src_stride", "dst_stride")
        return [dict(zip(keys, b, strict=True)) for b in self._blocks(self.handles)]

    def describe(self) -> dict:
        return {"launch": self.launch, "grid": self.grid, "threads": _THREADS, "work_units": self.units,
                "words": self.words, "protocol": "low-latency lines" if self.low_latency else "fenced",
                "scope": "gpu" if self.window.gpu_scope else "sys", "tiles": dict(self.tiles),
                "session_threads": self.session_threads()}

    def session_threads(self) -> int | None:
        """The fewest threads of a block whose ``circuslink::rma_session`` takes this queue (rma.cuh), None where
        no block's does (a queue that is not low-latency)."""
        if not self.low_latency:
            return None
        return session_threads(self.words, self.n_lines, self.n_targets, self.n_origins)

    # cycles --------------------------------------------------------------------------------
    def start(self, epoch: int, deadline: Deadline, stream: Any) -> None:
        if stream is None:
            # The caller has just written the sources on its own stream (CuPy's null stream by
            # default): the copy must not read them before they land.
            self.world.backend.after_caller()
            self.graph.launch(self.stream)  # the whole cycle, its wait included: wait() only waits
            self.graph_cycle = True
            return
        # A stream of the caller's (maybe capturing into a graph of its own): the start alone, enqueued.
        self.graph_cycle = False
        self._enqueue_start(stream)

    def cycle(self, epoch: int, deadline: Deadline, stream: Any) -> None:
        """A whole cycle enqueued on the caller's ``stream``: with SM copies the one kernel the host-driven graph
        holds (circuslink_rma_cycle), else the start's nodes and the wait kernel, with the queue's time-out."""
        self.graph_cycle = False
        if self.launch == "kernel":
            with stream:
                self.k_cycle((self.grid,), (_THREADS,), (self.handle,))
            return
        self._enqueue_start(stream)
        self._enqueue_wait(stream, max(1, int(deadline.limit * 1e9)))

    def wait(self, epoch: int, deadline: Deadline, stream: Any, block: bool) -> None:
        if self.graph_cycle:
            # start() launched the wait node already (with the queue's time-out) on the world's stream.
            self.graph_cycle = False
            if stream is not None and stream.ptr != self.stream.ptr:
                ev = self.cp.cuda.Event(disable_timing=True)
                ev.record(self.stream)
                stream.wait_event(ev)  # work the caller queues on `stream` runs once the epoch is complete
        else:
            stream = self.stream if stream is None else stream
            self._enqueue_wait(stream, max(1, int(deadline.remaining() * 1e9)))
            if not block:
                return
        if not block:
            return
        # The device wait gives up at its deadline on its own and records who stalled. The host's bound is
        # the call's deadline plus the queue's limit and slack; a shorter wait(timeout=) than the queue's ends
        # the device wait through the abort word at the call's deadline instead.
        backstop = Deadline(deadline.at + deadline.limit + 5.0, 2 * deadline.limit + 5.0)
        if self.queue is not None and deadline.limit < self.queue.timeout:
            backstop = deadline
        try:
            self._stream_wait(self.stream if stream is None else stream, backstop,
                              f"epoch {epoch}'s wait kernel did not finish")
        except TimeoutError:
            self._raise_recorded(deadline, "")  # the device's record names the origin that stalled
            raise
        self._raise_recorded(deadline, "")

    def _raise_recorded(self, deadline: Deadline, how: str) -> None:
        code, rank, epoch = (int(x) for x in self.error)
        if code == 0:
            return
        self.error[:] = 0
        with self.stream:
            self.state[2] = 0  # let the next failure be recorded
        queue = self.queue
        if code == 3:
            raise RmaError(f"{queue._where()}: a device-driven rma_start of epoch {epoch} refused the queue's "
                           "transposing puts: #include <circuslink/transpose.cuh> before <circuslink/rma.cuh> in "
                           "that kernel")
        if code == ERR_SESSION:
            need = self.session_threads()
            why = ("it is not a low-latency queue (its protocol is fenced: a session takes small chains of plain "
                   "writes sent as lines)" if need is None else
                   f"a block of {rank} threads does not hold its {self.words} words and {self.n_lines} lines a "
                   f"cycle to {self.n_targets} target(s) from {self.n_origins} origin(s): it takes {need} (with "
                   f"the default CIRCUSLINK_RMA_WORDS_AHEAD and CIRCUSLINK_RMA_LINES_IN_FLIGHT)")
            raise RmaError(f"{queue._where()}: a device-driven rma_session refused the queue: {why}; use "
                           "rma_start / rma_wait for it")
        if code == 1:
            what = f"{how}on the device waiting for the post of target"
            tail = f" (has it started epoch {epoch}?)"
        else:
            what = f"{how}on the device waiting for the writes of origin"
            tail = ""
        raise timeout_error(queue._stall(what, [rank], epoch) + tail, deadline)

    def device_handle(self) -> np.void:
        return self.handle

    def check_device(self, deadline: Deadline) -> None:
        self._stream_wait(self.stream, deadline, "device work on the world's stream did not finish")
        self._raise_recorded(deadline, "in a device-driven call ")

    def clear(self, deadline: Deadline | None) -> None:
        if self.queue is not None:
            self._stream_wait(self.stream, Deadline.after(deadline), "the queue's last cycle did not finish")
        self.handle_mem = None
        self.handle = None
        self.graph = None
        self.graph_cycle = False
        self.tchain = None
        self.tiles = {}

    def close(self, deadline: Deadline) -> None:
        self.clear(deadline)
        if self.staging is not None:
            self.staging.close(deadline)
            self.staging = None
        self.signals.close(deadline)
        self._free_error_record()

    def release_local(self) -> None:
        self.handle_mem = self.handle = self.graph = self.tchain = None
        if self.staging is not None:
            self.staging.release_local()
            self.staging = None
        self.signals.release_local()
        if self.stream.done:  # a kernel still running may write the error record: leave it then
            self._free_error_record()

    def _free_error_record(self) -> None:
        if self.error_ptr:
            self.error = None
            self.cp.cuda.runtime.freeHost(self.error_ptr)
            self.error_ptr = 0


def small_chain_words(blocks: list[tuple[int, int, int, int, int, int]]) -> tuple[np.ndarray, int]:
    """A small chain as words (``RmaWord`` rows, word bytes): every block of every plain write, (src, dst,
    count, block_bytes, src_stride, dst_stride), cut into aligned 8- or 16-byte words, when the chain holds
    at most SMALL_CHAIN_BYTES and every address, block and stride allows one width for all. Otherwise an
    empty table and 0: the warps walk the descriptors."""
    empty = WORD.array(0), 0
    if not blocks or sum(count * block for _, _, count, block, _, _ in blocks) > SMALL_CHAIN_BYTES:
        return empty
    width = min(_alignment(src, dst, block, *((ss, ds) if count > 1 else ()))
                for src, dst, count, block, ss, ds in blocks)
    if width < 8:
        return empty
    rows = [(src + b * ss + k, dst + b * ds + k)
            for src, dst, count, block, ss, ds in blocks for b in range(count) for k in range(0, block, width)]
    words = WORD.array(len(rows))
    for i, row in enumerate(rows):
        words[i] = row
    return words, width
