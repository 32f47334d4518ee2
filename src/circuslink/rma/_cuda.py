"""The cuda engine: RMA queues inside a node, over CUDA IPC peer memory (NVLink).

commit() packs the chain once into device memory (an ``RmaQueue`` handle followed by its
descriptors and counter addresses, byte for byte as ``include/circuslink/detail/rma_types.cuh``
lays them out). Then every cycle is cheap:

* engine "kernel" (default): start() is one launch of a copy kernel that posts, waits
  for the targets' posts, copies the chain (strided blocks directly, no packing) and
  raises the targets' arrival counters; wait() is one launch of a one-block wait kernel
  and a stream synchronize.
* engine "graph": start() launches one CUDA graph built at commit: a post kernel, one
  copy-engine 2-D copy (cudaMemcpy2DAsync, peer) per handle, a signal kernel.

Choose with ``CIRCUSLINK_RMA_ENGINE=kernel|graph`` (read at commit) so the two can be
measured against each other without code changes. Kernels drive a queue themselves
through ``circuslink::rma_start`` / ``rma_wait`` and ``Queue.device_handle()``.
Device-side waits time out (the queue's time-out) and record the stalled rank in
host-mapped memory; the host raises it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._config import default_timeout
from ..errors import RmaError, TimeoutError
from ._layout import CHUNK_BYTES, DESCRIPTOR, QUEUE
from ._transpose import _cuda as transposes
from ._transpose import is_transpose

ENGINES = ("kernel", "graph")
_KERNELS = Path(__file__).with_name("rma_kernels.cu")
_THREADS = 256
_module = None


def _cp():
    import cupy

    return cupy


def _kernels():
    global _module
    if _module is None:
        from ..device_code import compile as compile_device

        _module = compile_device(_KERNELS.read_text())
    return _module


def _alignment(*values: int) -> int:
    align = 16
    for v in values:
        while v % align:
            align //= 2
    return align


def engine_name() -> str:
    name = os.environ.get("CIRCUSLINK_RMA_ENGINE", "kernel").strip().lower() or "kernel"
    if name not in ENGINES:
        raise RmaError(f"CIRCUSLINK_RMA_ENGINE={name!r}: choose one of {', '.join(ENGINES)}")
    return name


class CudaWindow:
    def __init__(self, world: Any, nbytes: int, timeout: float | None) -> None:
        self.world = world
        self.buf = world.alloc(nbytes, timeout)

    @property
    def local(self):
        return self.buf.local

    def new_queue(self, index: int, timeout: float | None) -> CudaQueue:
        return CudaQueue(self, timeout)

    def free(self, timeout: float | None) -> None:
        self.buf.close(timeout)


class CudaQueue:
    def __init__(self, window: CudaWindow, timeout: float | None) -> None:
        cp = _cp()
        self.cp = cp
        self.world = window.world
        self.window = window
        self.size = self.world.size
        self.stream = self.world.backend.stream
        self.signals = self.world.alloc(2 * self.size * 8, timeout)
        self.state = cp.zeros(3, dtype=cp.uint64)  # RmaState: epoch, done_ctas, failed
        # Host-mapped error record: the host reads it after a wait without a device copy.
        self.error_ptr = cp.cuda.runtime.hostAlloc(24, cp.cuda.runtime.hostAllocMapped)
        self.error = np.frombuffer((ctypes.c_uint64 * 3).from_address(self.error_ptr), dtype=np.uint64)
        self.error[:] = 0
        self.handle_mem = None
        self.graph = None
        self.queue: Any = None
        self.n_origins = 0
        self.grid = 1

    # commit --------------------------------------------------------------------------------
    def current_epoch(self, host_epoch: int) -> int:
        # Device-driven cycles advance the device's counter without the host: it is the truth.
        self.stream.synchronize()
        return int(self.state[0].get())

    def commit(self, queue: Any, base: int, post_at: str, incoming: dict, timeout: float | None) -> None:
        cp = self.cp
        self.queue = queue
        self.engine = engine_name()
        me, size = self.world.rank, self.size
        handles = sorted((h for h in queue.handles if not is_transpose(h)), key=lambda h: h.dst_rank)
        # Transposing puts: their own descriptors, run by the same start launch after the copies.
        self.tchain = transposes.queue_chain(
            self.world, [h for h in queue.handles if is_transpose(h)],
            src_ptr=lambda h: h.src_window._impl.buf.ptr(me) + h.src_offset,
            dst_ptr=lambda h: self.window.buf.ptr(h.dst_rank) + h.dst_offset)
        descs = DESCRIPTOR.array(len(handles))
        units = 0
        for i, h in enumerate(handles):
            src = h.src_window._impl.buf.ptr(me) + h.src_offset
            dst = self.window.buf.ptr(h.dst_rank) + h.dst_offset
            strides = (h.src_stride, h.dst_stride) if h.count > 1 else ()
            per_block = -(-h.block_bytes // CHUNK_BYTES)
            descs[i] = (src, dst, h.count, h.block_bytes, h.src_stride, h.dst_stride, units, per_block,
                        _alignment(src, dst, h.block_bytes, *strides))
            units += h.count * per_block
        targets = list(queue.targets)
        origins = list(queue.origins)
        sig = self.signals
        arrays = [
            descs.tobytes(),
            np.array(targets, dtype=np.uint64).tobytes(),
            np.array([sig.ptr(t) + 8 * me for t in targets], dtype=np.uint64).tobytes(),
            np.array(origins, dtype=np.uint64).tobytes(),
            np.array([sig.ptr(o) + 8 * (size + me) for o in origins], dtype=np.uint64).tobytes(),
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
            "timeout_ns": int(default_timeout() * 1e9), "post_at_wait": int(post_at == "wait"),
            "abort": self.world.backend.abort_ptr,
            "transposes": self.tchain.ptr,
        }
        blob = bytearray(at)
        blob[:QUEUE.size] = QUEUE.pack(**fields).tobytes()
        for off, a in zip(offsets, arrays, strict=True):
            blob[off: off + len(a)] = a
        host = np.frombuffer(bytes(blob), dtype=np.uint8)
        cp.cuda.runtime.memcpy(base_ptr, host.ctypes.data, len(blob), cp.cuda.runtime.memcpyHostToDevice)
        self.handle_mem = mem
        self.handles = handles
        self.n_origins = len(origins)
        self.state[:] = cp.array([base, 0, 0], dtype=cp.uint64)
        self.error[:] = 0
        warps = _THREADS // 32
        kernels = _kernels()
        self.k_start = kernels.get_function(self.tchain.start_kernel_name("circuslink_rma_start"))
        # Every CTA of the start kernel waits for the targets' posts: never more CTAs than this rank's
        # SM share holds at once, or they could take the SMs a target needs to post.
        self.grid = max(1, min(-(-units // warps), self.world.backend.max_blocks(self.k_start, _THREADS)))
        self.grid = self.tchain.grid(self.k_start, self.grid)
        self.k_wait = kernels.get_function("circuslink_rma_wait")
        self.k_cycles = kernels.get_function("circuslink_rma_device_cycles")
        cp.cuda.Device(self.world.device).synchronize()
        if post_at == "wait":
            # The first epoch is open from the start: post it into every origin.
            one = np.array([base + 1], dtype=np.uint64)
            for o in origins:
                cp.cuda.runtime.memcpy(sig.ptr(o) + 8 * (size + me), one.ctypes.data, 8,
                                       cp.cuda.runtime.memcpyHostToDevice)
        if self.engine == "graph":
            self.graph = self._build_graph(kernels)

    def _build_graph(self, kernels: Any):
        cp = self.cp
        rt = cp.cuda.runtime
        capture = cp.cuda.Stream(non_blocking=True)
        handle = np.uint64(self.handle_mem.ptr)
        capture.begin_capture()
        try:
            with capture:
                kernels.get_function("circuslink_rma_prologue")((1,), (64,), (handle,))
                for d in self.descs_host():
                    rt.memcpy2DAsync(int(d["dst"]), int(d["dst_stride"]), int(d["src"]), int(d["src_stride"]),
                                     int(d["block_bytes"]), int(d["count"]), rt.memcpyDefault, capture.ptr)
                self.tchain.launch()  # the transposing puts: one kernel node
                kernels.get_function("circuslink_rma_epilogue")((1,), (64,), (handle,))
        finally:
            graph = capture.end_capture()
        graph.upload(self.stream)
        return graph

    def descs_host(self) -> list:
        out = []
        me = self.world.rank
        for h in self.handles:
            out.append({"src": h.src_window._impl.buf.ptr(me) + h.src_offset,
                        "dst": self.window.buf.ptr(h.dst_rank) + h.dst_offset,
                        "count": h.count, "block_bytes": h.block_bytes,
                        "src_stride": h.src_stride if h.count > 1 else h.block_bytes,
                        "dst_stride": h.dst_stride if h.count > 1 else h.block_bytes})
        return out

    # cycles --------------------------------------------------------------------------------
    def enqueue_start(self) -> None:
        """Start on the stream without waiting for anything (the bench enqueues back to back)."""
        if self.graph is not None:
            self.graph.launch(self.stream)
        else:
            with self.stream:
                self.k_start((self.grid,), (_THREADS,), (np.uint64(self.handle_mem.ptr),))

    def enqueue_wait(self, limit: float) -> None:
        if self.n_origins:
            with self.stream:
                self.k_wait((1,), (max(32, min(_THREADS, self.n_origins)),),
                            (np.uint64(self.handle_mem.ptr), np.uint64(int(limit * 1e9))))

    def start(self, epoch: int) -> None:
        # The caller has just written the sources on its own stream (CuPy's null stream by
        # default): the copy must not read them before they land.
        self.world.backend.after_caller()
        self.enqueue_start()

    def wait(self, epoch: int, limit: float) -> None:
        self.enqueue_wait(limit)
        # The wait kernel gives up after `limit` on its own; the host's bound is the backstop.
        self.world.backend.wait_stream(self.stream, 2 * limit + 5,
                                       lambda: f"{self.queue._where()}: epoch {epoch}'s wait kernel did not finish")
        self._raise_recorded(limit, "")

    def _raise_recorded(self, limit: float, how: str) -> None:
        code, rank, epoch = (int(x) for x in self.error)
        if code == 0:
            return
        self.error[:] = 0
        self.state[2] = 0  # let the next failure be recorded
        where = self.queue._where()
        if code == 3:
            raise RmaError(f"{where}: a device-driven rma_start of epoch {epoch} refused the queue's transposing "
                           "puts: #include <circuslink/transpose.cuh> before <circuslink/rma.cuh> in that kernel")
        if code == 1:
            what = f"waiting for the post of target rank(s) {rank} (has it started epoch {epoch}?)"
        else:
            what = f"waiting for the writes of origin rank(s) {rank}"
        raise TimeoutError(f"{where}: {how}epoch {epoch} timed out after {limit:g} s on the device {what} "
                           "(CIRCUSLINK_TIMEOUT sets the limit)")

    def device_handle(self) -> int:
        return int(self.handle_mem.ptr)

    def check_device(self, queue: Any) -> None:
        self.stream.synchronize()
        self._raise_recorded(default_timeout(), "device-driven ")

    def device_cycles(self, iters: int) -> tuple[int, float]:
        """Run ``iters`` device-driven start+wait cycles in one kernel: (cycles done, ns each)."""
        cp = self.cp
        out = cp.zeros(2, dtype=cp.uint64)
        with self.stream:
            self.k_cycles((1,), (_THREADS,), (np.uint64(self.handle_mem.ptr), np.uint64(iters), out))
        self.stream.synchronize()
        done, ns = (int(x) for x in out.get())
        return done, ns / max(1, done)

    def clear(self) -> None:
        self.stream.synchronize()
        self.handle_mem = None
        self.graph = None
        self.tchain = None

    def free(self, timeout: float | None) -> None:
        self.clear()
        self.signals.close(timeout)
        if self.error_ptr:
            self.error = None
            self.cp.cuda.runtime.freeHost(self.error_ptr)
            self.error_ptr = 0
