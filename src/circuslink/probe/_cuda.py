"""The probe on the cuda back-end: two GPUs, SM kernels and copy engines over NVLink."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._config import default_timeout
from ..device_code import compile as compile_device
from . import _stall, buffer_bytes

_KERNELS = Path(__file__).with_name("probe_kernels.cu")
_THREADS = 512
_CTA_SWEEP = (16, 66, 132, 264, 528)


class Probe:
    def __init__(self, world: Any, quick: bool) -> None:
        import cupy as cp

        self.cp = cp
        self.world = world
        self.stream = world.backend.stream
        self.nbytes = buffer_bytes(True, quick)
        self.reps = 3 if quick else 5
        self.iters = 2000 if quick else 10000
        self.launches = 3 if quick else 5
        self.module = compile_device(_KERNELS.read_text())
        self.buf = world.alloc(self.nbytes + 4096)
        rng = cp.random.default_rng()
        self.buf.local[: self.nbytes] = rng.integers(0, 256, self.nbytes, dtype=cp.uint8)
        self.sink = cp.zeros(1, dtype=cp.int32)
        self._base = 0
        cp.cuda.Device().synchronize()

    def device_name(self) -> str:
        props = self.cp.cuda.runtime.getDeviceProperties(self.world.device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"{name} x{self.cp.cuda.runtime.getDeviceCount()}"

    def _time_ms(self, launch) -> float:
        """Best of self.reps, event-timed on this rank's stream, after one warm-up."""
        cp = self.cp
        launch()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        best = float("inf")
        for _ in range(self.reps):
            start.record(self.stream)
            launch()
            end.record(self.stream)
            end.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, end))
        return best

    def _gbps(self, ms: float) -> float:
        return self.nbytes / (ms * 1e-3) / 1e9

    def _store(self, dst_ptr: int, ctas: int):
        n_vec = np.uint64(self.nbytes // 16)
        fn = self.module.get_function("store_bw")
        return lambda: fn((ctas,), (_THREADS,), (np.uint64(dst_ptr), n_vec, np.int32(7)), stream=self.stream)

    def measure_pair(self, a: int, b: int) -> dict:
        cp, w = self.cp, self.world
        out: dict = {}
        w.barrier()
        if w.rank == a:
            src, dst = self.buf.ptr(a), self.buf.ptr(b)

            def ce():
                cp.cuda.runtime.memcpyAsync(dst, src, self.nbytes, cp.cuda.runtime.memcpyDefault, self.stream.ptr)

            out["ce_GBps"] = self._gbps(self._time_ms(ce))
            stores = {c: self._gbps(self._time_ms(self._store(dst, c))) for c in _CTA_SWEEP}
            out["sm_store_GBps"] = max(stores.values())
            out["sm_store_by_ctas"] = stores
            load_fn = self.module.get_function("load_bw")
            n_vec = np.uint64(self.nbytes // 16)
            loads = {
                c: self._gbps(self._time_ms(lambda c=c: load_fn(
                    (c,), (_THREADS,), (np.uint64(dst), n_vec, self.sink), stream=self.stream)))
                for c in _CTA_SWEEP
            }
            out["sm_load_GBps"] = max(loads.values())
        w.barrier()
        # Both directions at once: a and b store into each other concurrently.
        if w.rank in (a, b):
            other = b if w.rank == a else a
            bidir = self._gbps(self._time_ms(self._store(self.buf.ptr(other), 264)))
        w.barrier()
        lat_kernels = {"relaxed": "pingpong_relaxed", "acqrel": "pingpong_acqrel", "pull": "pingpong_pull"}
        for mode, kernel in lat_kernels.items():
            best = float("inf")
            for _ in range(self.launches):
                self._base += self.iters + 1024
                ns = self._pingpong(a, b, kernel) if w.rank in (a, b) else None
                w.barrier()
                if w.rank == a:
                    best = min(best, ns / (2 * self.iters) / 1e3)
            if w.rank == a:
                out[f"lat_{mode}_us"] = best
        bidirs = w.allgather_object(bidir if w.rank in (a, b) else None)
        if w.rank == a:
            out["sm_store_bidir_GBps"] = min(bidirs[a], bidirs[b])
        return w.broadcast_object(out, root=a)

    def _pingpong(self, a: int, b: int, kernel: str) -> float:
        cp, w = self.cp, self.world
        other = b if w.rank == a else a
        mine = self.buf.ptr(w.rank) + self.nbytes
        peers = self.buf.ptr(other) + self.nbytes
        out_ns = cp.zeros(1, dtype=cp.uint64)
        error = cp.zeros(1, dtype=cp.int32)
        timeout_ns = np.uint64(int(default_timeout() * 1e9))
        fn = self.module.get_function(kernel)
        fn((1,), (32,), (np.uint64(mine), np.uint64(peers), np.uint32(self._base), np.int32(100),
                         np.int32(self.iters), np.int32(w.rank == a), timeout_ns, out_ns, error), stream=self.stream)
        self.stream.synchronize()
        if int(error.get()[0]):
            raise _stall(f"flag pingpong ({kernel})", a, b, f"at iteration {int(error.get()[0])}")
        return float(out_ns.get()[0])

    def local_copy_GBps(self) -> float:
        cp = self.cp
        half = self.nbytes // 2
        src, dst = self.buf.ptr(), self.buf.ptr() + half

        def copy():
            cp.cuda.runtime.memcpyAsync(dst, src, half, cp.cuda.runtime.memcpyDeviceToDevice, self.stream.ptr)

        ms = self._time_ms(copy)
        return 2 * half / (ms * 1e-3) / 1e9

    def close(self) -> None:
        self.cp.cuda.Device().synchronize()
        self.buf.close()
