"""The collectives on the cuda back-end: collectives.cuh launched from the host, and the
``circuslink::collectives::Ring`` records users' kernels receive.

Two sets of rings per communicator: one low-latency ring (LL channels, one block) for
messages up to :data:`LL_MAX_BYTES`, and ``rings`` bandwidth-mode rings (1 MiB BW channels,
one block each, each reducing its own slice of the data) for larger ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._config import default_timeout
from ..errors import ChannelError, ConfigError
from ._ring import ChannelRing

# LL reads are done by one warp, two 120-byte packets per poll round: unbeatable for a few
# packets, slow beyond (~0.5 GB/s). So LL only up to 1 KiB (9 packets); above, every block of
# the grid moves its own slice in bandwidth mode (one 16-byte-vector packet per piece).
LL_MAX_BYTES = 1 << 10
LL_DEPTH_BYTES = 16 << 10  # auto mode makes these LL channels (payload <= 64 KiB)
BW_DEPTH_BYTES = 1 << 20  # and these BW channels (16 slots of 64 KiB)
DEFAULT_RINGS = 64  # blocks per all-reduce: each alternates writing and reading, so it takes
# about twice the ~16 CTAs that saturate NVLink with stores alone, plus margin (tune with --rings)
THREADS = 512

# C++ types of the dtypes the device collectives reduce (float16 only on the cpu back-end).
C_TYPES = {
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
    "int32": "int", "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long",
    "float32": "float", "float64": "double",
}
OP_TYPES = {"sum": "Sum", "max": "Max", "min": "Min"}


def ring_dtype() -> np.dtype:
    """The layout of ``circuslink::collectives::Ring`` (its ABI table, collectives/_layout.py)."""
    from ._layout import RING

    return RING.dtype


def kernel_source(types: tuple[str, ...] | None = None) -> str:
    """extern "C" entry points: one all-reduce kernel per (dtype, op), broadcast, barrier, and the
    timed loops the benchmark uses. ``types`` limits the dtypes (tests compile a few)."""
    lines = [
        "#include <circuslink/collectives.cuh>",
        "#include <circuslink/trace.cuh>",
        "namespace cc = circuslink::collectives;",
        "typedef unsigned long long u64;",
        "#define CL_FAIL() do { if (threadIdx.x == 0) atomicExch(status, 1); } while (0)",
    ]
    for name, ctype in C_TYPES.items():
        if types is not None and name not in types:
            continue
        for op, functor in OP_TYPES.items():
            lines.append(
                f'extern "C" __global__ void cl_allreduce_{name}_{op}(const cc::Ring* rings, unsigned int nrings, '
                f"{ctype}* data, u64 n, int* status) {{ "
                f"if (!cc::allreduce_grid(rings, nrings, data, n, cc::{functor}())) CL_FAIL(); }}"
            )
    for name in ("float32", "int32"):
        if types is not None and name not in types:
            continue
        ctype = C_TYPES[name]
        # `iters` all-reduces back to back in one launch; t[0] / t[1] = first start / last end (ns).
        lines.append(
            f'extern "C" __global__ void cl_allreduce_loop_{name}_sum(const cc::Ring* rings, unsigned int nrings, '
            f"{ctype}* data, u64 n, unsigned int iters, u64* t, circuslink::trace::Handle trace, int* status) {{\n"
            "  namespace tr = circuslink::trace;\n"
            "  if (blockIdx.x >= nrings) return;\n"
            "  u64 t0 = circuslink::detail::globaltimer_ns();\n"
            "  for (unsigned int i = 0; i < iters; ++i) {\n"
            "    tr::record_block(trace, tr::USER, tr::PHASE_BEGIN, i);\n"
            "    if (!cc::allreduce_grid(rings, nrings, data, n, cc::Sum())) { CL_FAIL(); return; }\n"
            "    tr::record_block(trace, tr::USER, tr::PHASE_END, i);\n"
            "  }\n"
            "  __syncthreads();\n"
            "  if (threadIdx.x == 0) { atomicMin(t, t0); atomicMax(t + 1, circuslink::detail::globaltimer_ns()); }\n"
            "}"
        )
    lines += [
        'extern "C" __global__ void cl_broadcast(const cc::Ring* rings, unsigned int nrings, unsigned char* data, '
        "u64 n, unsigned int root, int* status) { if (!cc::broadcast_grid(rings, nrings, data, n, root)) CL_FAIL(); }",
        'extern "C" __global__ void cl_barrier(const cc::Ring* rings, int* status) { '
        "if (!cc::barrier_block(rings[0])) CL_FAIL(); }",
    ]
    return "\n".join(lines) + "\n"


class DeviceRings:
    """One ChannelRing's rings as an array of Ring records in device memory, with scratch."""

    def __init__(self, world: Any, ring: ChannelRing) -> None:
        import cupy as cp

        self.count = ring.count
        self.piece = ring.piece
        self.scratch = cp.zeros(max(1, ring.count * ring.piece), dtype=cp.uint8)
        rec = np.zeros(ring.count, dtype=ring_dtype())
        for i in range(ring.count):
            if world.size > 1:
                rec["right"][i] = ring.rights[i].device_handle()
                rec["left"][i] = ring.lefts[i].device_handle()
            rec["scratch"][i] = self.scratch.data.ptr + i * ring.piece
            rec["piece"][i] = ring.piece
            rec["rank"][i] = world.rank
            rec["size"][i] = world.size
        self.array = cp.asarray(rec.view(np.uint8))

    @property
    def ptr(self) -> int:
        return self.array.data.ptr


class CudaCollectives:
    """The device collectives driven from the host (one kernel launch per call)."""

    def __init__(self, world: Any, rings: int = DEFAULT_RINGS, timeout: float | None = None) -> None:
        import cupy as cp

        from ..device_code import compile as compile_device

        self.cp = cp
        self.world = world
        self.stream = world.backend.stream
        n = world.size
        self.ll_ring = ChannelRing(world, LL_DEPTH_BYTES, timeout, count=1, tag=".ll", id_base=0x8000)
        self.bw_ring = ChannelRing(world, BW_DEPTH_BYTES, timeout, count=rings, tag=".bw",
                                   id_base=0x8000 + 2 * n)
        self.ll = DeviceRings(world, self.ll_ring)
        self.bw = DeviceRings(world, self.bw_ring)
        self._compile = compile_device
        self._modules: dict[str, Any] = {}
        self.status = cp.zeros(1, dtype=cp.int32)
        device = self.bw_ring.timeout
        # A backstop: the channels' device waits give up first (with timeout 0 they never do, and
        # the host's own limit applies).
        self._host_limit = 2 * device + 5 if device else default_timeout()

    def _module(self, dtype_name: str) -> Any:
        # One module per dtype, compiled on first use: all ten at once take NVRTC ~a minute, and
        # CuPy caches each on disk after that.
        if dtype_name not in self._modules:
            self._modules[dtype_name] = self._compile(kernel_source(types=(dtype_name,)))
        return self._modules[dtype_name]

    def rings_for(self, nbytes: int) -> DeviceRings:
        return self.ll if nbytes <= LL_MAX_BYTES else self.bw

    def _launch(self, name: str, grid: int, args: tuple, what: str, dtype_name: str = "uint8") -> None:
        with self.stream:  # the status reset must precede the kernel on the same stream
            self.status.fill(0)
        fn = self._module(dtype_name).get_function(name)
        # The forward-progress rule: never more resident blocks than this rank's SM share holds
        # (the *_grid forms cover every ring's slice with fewer blocks).
        grid = min(grid, self.world.backend.max_blocks(fn, THREADS))
        fn((grid,), (THREADS,), args + (self.status,), stream=self.stream)
        self.world.backend.wait_stream(self.stream, self._host_limit,
                                       lambda: f"{what} on rank {self.world.rank}: its kernel did not finish")
        if int(self.status.get()[0]):
            for ring in (self.ll_ring, self.bw_ring):
                if ring.channels is not None:
                    ring.channels.check()  # raises ChannelError naming the channel that stalled
            raise ChannelError(f"{what} on rank {self.world.rank} failed in device code")

    def allreduce(self, array: Any, op: str) -> Any:
        cp = self.cp
        name = np.dtype(array.dtype).name
        if name not in C_TYPES:
            raise ConfigError(f"allreduce: dtype {name} is not supported on the cuda back-end "
                              f"(supported: {', '.join(C_TYPES)})")
        self.world.backend.after_caller()
        with self.stream:  # the copy must land before the kernel that reads it
            out = cp.array(array, copy=True, order="C")
        if self.world.size == 1 or out.size == 0:
            self.stream.synchronize()
            return out
        rings = self.rings_for(out.nbytes)
        self._launch(f"cl_allreduce_{name}_{op}", rings.count,
                     (np.uint64(rings.ptr), np.uint32(rings.count), out, np.uint64(out.size)), "allreduce", name)
        return out

    def allreduce_loop(self, data: Any, iters: int, trace: Any = None) -> float:
        """``iters`` in-place sum all-reduces back to back in one launch; returns ns per operation.
        ``trace``: a tracer device handle (each block records a USER span per operation)."""
        from ..trace import Tracer

        cp = self.cp
        name = np.dtype(data.dtype).name
        if name not in ("float32", "int32"):
            raise ConfigError(f"allreduce_loop: dtype {name} has no timed loop (float32 and int32 do)")
        rings = self.rings_for(data.nbytes)
        self.world.backend.after_caller()
        with self.stream:
            t = cp.array([np.iinfo(np.uint64).max, 0], dtype=cp.uint64)
        handle = trace if trace is not None else Tracer.null_handle()
        self._launch(f"cl_allreduce_loop_{name}_sum", rings.count,
                     (np.uint64(rings.ptr), np.uint32(rings.count), data, np.uint64(data.size), np.uint32(iters), t,
                      handle), "allreduce loop", name)
        t0, t1 = (int(v) for v in t.get())
        return (t1 - t0) / iters

    def broadcast(self, array: Any, root: int) -> Any:
        cp = self.cp
        self.world.backend.after_caller()
        with self.stream:
            out = cp.array(array, copy=True, order="C")
        if self.world.size == 1 or out.size == 0:
            self.stream.synchronize()
            return out
        raw = out.reshape(-1).view(cp.uint8)
        rings = self.rings_for(raw.nbytes)
        self._launch("cl_broadcast", rings.count, (np.uint64(rings.ptr), np.uint32(rings.count), raw,
                                                    np.uint64(raw.size), np.uint32(root)), "broadcast")
        return out

    def barrier(self) -> None:
        if self.world.size > 1:
            self.world.backend.after_caller()  # a barrier also orders the caller's earlier work
            self._launch("cl_barrier", 1, (np.uint64(self.ll.ptr),), "barrier")

    def close(self) -> None:
        self.ll_ring.close()
        self.bw_ring.close()
