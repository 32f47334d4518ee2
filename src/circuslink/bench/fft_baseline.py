"""The strong baseline of ``bench fft``: the slab FFT as cuFFTMp and heFFTe do it, and the 1-rank ceiling.

The slab scheme (2-D and 3-D, complex-to-complex, forward), on the same boxes as circuslink's plan so the
output lands in the same layout:

1. cuFFT batched along the local axes (the apps.fft cuda module's cuFFT plans; numpy on the cpu);
2. a transpose into a send buffer, per destination rank a contiguous block (``transpose="tiled"``: the
   textbook 32 x 32 shared-memory transpose of bench/kernels/fft_baseline.cu; ``"cupy"``: CuPy's copy
   of a transposed view);
3. an all-to-all that lands every block where the next stage wants it:
   ``copy-engine``: cudaMemcpy2DAsync straight into the peers' buffers (world.alloc's peer mappings), then
   a device-side barrier (an 8-byte RMA queue: every rank's copies are complete when it has arrived; the
   same barrier on the comm stream at the start of a transform keeps the copies out of buffers a peer is
   still transforming from the last one);
   ``nccl``: grouped ncclSend / ncclRecv into a receive buffer, then 2-D copies into place (NCCL refuses
   two ranks on one GPU: skipped there); ``mpi``: host-staged (device -> host, MPI_Alltoallv,
   host -> device, 2-D copies), for worlds whose ranks cannot map each other's memory;
   ``nvshmem``: the whole scheme as its own program (bench/baselines/fft_slab_nvshmem.cu: cuFFT, the same
   transpose kernel, NVSHMEM block puts from a kernel), built with nvcc -rdc and run under mpirun;
4. cuFFT along the remaining axis.

Chunked like the plan: the reshape after a transform is cut along the slowest storage axis, and chunk
j's transform, transpose and sends are queued before chunk j + 1's, on two streams (transforms and
transposes on one, the all-to-all on the other), so they overlap.

The ceiling: one process's cuFFT of the whole array on the same GPU, with the whole GPU (a process of
its own, outside the job's SM shares), as ``python -m circuslink.bench.fft_baseline ceiling``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import mps
from .._wait import Deadline
from ..errors import BackendError, ConfigError

ALLTOALLS = ("copy-engine", "nccl", "mpi", "nvshmem")
TRANSPOSES = ("tiled", "cupy")
_KERNELS = Path(__file__).resolve().parent / "kernels" / "fft_baseline.cu"
_NVSHMEM_SOURCE = Path(__file__).resolve().parent / "baselines" / "fft_slab_nvshmem.cu"
_ALIGN = 256
_TILE_THREADS = (32, 8, 1)
_module = None


def _kernels():
    global _module
    if _module is None:
        from ..device_code import compile as compile_device

        _module = compile_device(_KERNELS.read_text())
    return _module


class _Chunk:
    """One chunk's all-to-all, driven by the FFT runner like an RMA queue (start on the comm stream)."""

    def __init__(self, start) -> None:
        self._start = start

    def start(self, stream: Any = None) -> None:
        self._start(stream)

    def wait(self, timeout: float | None = None, stream: Any = None, block: bool = True) -> None:
        """Nothing to wait for: the exchange's barrier (or the receive) completes it."""

    def check_device(self) -> None:
        """Chunks record no device errors."""


class SlabBaseline:
    """Collective: the slab FFT with an all-to-all, on ``shape`` (2-D or 3-D) over the world, made once.

    ``layout``: "transposed" (one all-to-all; the output in the plan's last-stage boxes) or "natural" (a
    second all-to-all back to slabs of axis 0). ``input`` / ``output`` as the plan's; :meth:`forward`
    transforms; ``timings`` / ``seconds`` as the plan's (device events on the GPU).
    """

    def __init__(self, world: Any, shape: tuple[int, ...], dtype: str, layout: str = "transposed",
                 alltoall: str = "copy-engine", chunks: int = 1, transpose: str = "tiled",
                 timeout: float | None = None) -> None:
        from .. import rma
        from ..apps import fft
        from ..apps.fft import _boxes as bx

        if alltoall not in ALLTOALLS[:3]:
            raise ConfigError(f"fft baseline: alltoall={alltoall!r} must be one of {', '.join(ALLTOALLS[:3])} "
                              "(nvshmem runs as its own program: nvshmem_slab)")
        if transpose not in TRANSPOSES:
            raise ConfigError(f"fft baseline: transpose={transpose!r} must be one of {', '.join(TRANSPOSES)}")
        self.world, self.xp = world, world.xp
        self.alltoall, self.transpose, self.layout = alltoall, transpose, layout
        self._timeout = timeout
        self._eng = world.backend_module("circuslink.apps.fft")
        self._gpu = world.xp is not np
        R, me = world.size, world.rank
        self.dtype = fft.check_dtype(dtype, "fft baseline: dtype")
        if self.dtype not in ("complex64", "complex128"):
            raise ConfigError("fft baseline: the slab baseline is complex-to-complex (complex64 or complex128)")
        self.shape = tuple(int(n) for n in shape)
        ins, outs = fft.boxes(self.shape, R, "slab", layout=layout)
        st = bx.stages(self.shape, R, "slab", None, ins, outs, None)
        boxes = [st[0].boxes, st[1].boxes] + ([tuple(outs)] if layout == "natural" else [])
        counts = [st[0].count, st[1].count]
        e = np.dtype(self.dtype).itemsize
        self._e = e
        region = max(b.size for bs in boxes for b in bs) * e
        self._region = max(_ALIGN, -(-region // _ALIGN) * _ALIGN)
        self.buf = world.alloc(2 * self._region, timeout)
        xp = self.xp
        self._flat = [self.buf.local[i * self._region: (i + 1) * self._region].view(xp.dtype(self.dtype))
                      for i in range(2)]
        self._views = [self._flat[i % 2][: b[me].size].reshape(b[me].storage_shape) for i, b in enumerate(boxes)]
        self._boxes = boxes
        self.send = xp.zeros(self._region // e, dtype=self.dtype)
        self.recv = xp.zeros(self._region // e, dtype=self.dtype) if alltoall in ("nccl", "mpi") else None
        self._host = None
        if alltoall == "mpi":
            self._mpi = world.mpi_comm
            if self._mpi is None:
                raise ConfigError("fft baseline: the MPI all-to-all needs a job started by mpirun")
        if alltoall == "nccl":
            from .baselines import _nccl

            why = _nccl._unavailable(world, "the NCCL all-to-all")
            if why:
                raise ConfigError(f"fft baseline: {why}")
            self._nccl, self._comm, _ = _nccl._communicator(world, timeout)
        self._barrier = None
        if alltoall == "copy-engine":  # every rank's copies into me are complete once its 8 bytes arrive
            self._bwin = rma.window_alloc(world, 8 * R, timeout=timeout)
            q = rma.Queue.alloc(self._bwin, timeout)
            for t in range(R):
                q.push(rma.declare_write(self._bwin, 8 * me, self._bwin, 8 * t, 8, t))
                q.add_origin(t)
            q.commit(timeout=timeout)
            self._barrier = q
        self._runner = self._eng.Runner(world)
        self._cache: dict = {}
        self._steps = []
        for k in range(len(boxes) - 1):
            self._steps.append(self._exchange(k, counts[k], chunks))
        if layout == "transposed":
            op = self._eng.make_fft(world, "c2c", self._views[1], self._views[1], counts[1], False, self._cache)
            self._steps.append(([op], [], []))
        self.timings: dict[str, float] = {}
        self.seconds = 0.0

    @property
    def input(self) -> Any:
        return self._views[0]

    @property
    def output(self) -> Any:
        return self._views[-1]

    # -- construction -------------------------------------------------------------------------------
    def _exchange(self, k: int, count: int, parts: int) -> tuple[list, list, list]:
        """Stage k's transforms, packs and all-to-all chunks into stage k + 1."""
        from ..apps.fft import _boxes as bx

        world, R, me = self.world, self.world.size, self.world.rank
        src, dst = self._boxes[k], self._boxes[k + 1]
        view = self._views[k]
        parts = max(1, min(parts, view.shape[0] if view.size else 1))
        parts = world.allgather_object(parts)
        parts = min(parts)  # every rank cuts the same number of chunks
        spans = bx.spans(view.shape[0], parts)
        ops = [self._eng.make_fft(world, "c2c", view[a:b], view[a:b], count, False, self._cache) for a, b in spans]
        chunks = [bx.chunk_boxes(src[s], parts) for s in range(R)]
        sent = 0
        received = 0
        packs, moves = [], []
        for j in range(parts):
            mine: list = []  # (target, send offset, piece)
            for t in range(R):
                inter = None if chunks[me][j].empty else chunks[me][j].intersect(dst[t])
                for p in (bx.copy_pieces(*inter, src[me], dst[t]) if inter else []):
                    mine.append((t, sent, p))
                    sent += p.elements
            incoming: list = []  # (origin, receive offset, piece in my storage)
            for s in range(R):
                inter = None if chunks[s][j].empty else chunks[s][j].intersect(dst[me])
                for p in (bx.copy_pieces(*inter, src[s], dst[me]) if inter else []):
                    incoming.append((s, received, p))
                    received += p.elements
            packs.append([self._pack(k, p, off) for _, off, p in mine])
            moves.append(_Chunk(self._mover(k + 1, mine, incoming)))
        return ops, packs, moves

    def _block(self, p: Any) -> tuple[int, int]:
        """(rows, columns) of a piece's block in the send buffer: the transposed block for a transpose."""
        return (p.cols, p.rows) if p.transpose else (p.rows, p.cols)

    def _pack(self, k: int, p: Any, off: int):
        """The local copy of piece ``p`` of stage k into the send buffer at ``off`` (transposed when it is one)."""
        eng, xp = self._eng, self.xp
        src = eng.strided(self._flat[k % 2], p.src, (p.rows, p.cols), (p.src_ld, 1))
        h, w = self._block(p)
        block = self.send[off: off + h * w].reshape(h, w)
        if not p.transpose:
            return lambda: xp.copyto(block, src)
        if not self._gpu or self.transpose == "cupy":
            return lambda: xp.copyto(block, src.T)
        kernel = _kernels().get_function(f"fft_transpose{self._e}")
        tiles = -(-p.rows // 32) * -(-p.cols // 32)
        grid = max(1, min(tiles, 8 * self.world.backend.sm_budget))
        args = (np.uint64(block.data.ptr), np.uint64(p.rows), np.uint64(src.data.ptr), np.uint64(p.src_ld),
                np.uint64(p.rows), np.uint64(p.cols))
        return lambda: kernel((grid,), _TILE_THREADS, args)

    def _mover(self, k: int, mine: list, incoming: list):
        """The all-to-all of one chunk into stage k's buffers (every rank's)."""
        e, region = self._e, self._region
        base = (k % 2) * region
        if self.alltoall == "copy-engine":
            if not self._gpu:
                def copy_host(stream: Any) -> None:
                    for t, off, p in mine:
                        h, w = self._block(p)
                        flat = self.buf.peer(t)[base: base + region].view(self.dtype)
                        self._eng.strided(flat, p.dst, (h, w), (p.dst_ld, 1))[...] = \
                            self.send[off: off + h * w].reshape(h, w)
                return copy_host
            rt = self.xp.cuda.runtime
            plan = [(self.buf.ptr(t) + base + p.dst * e, p.dst_ld * e, self.send.data.ptr + off * e,
                     self._block(p)[1] * e, self._block(p)[0]) for t, off, p in mine]

            def copy_engine(stream: Any) -> None:
                for dst, dpitch, src, width, height in plan:
                    rt.memcpy2DAsync(dst, dpitch, src, width, width, height, rt.memcpyDefault, stream.ptr)
            return copy_engine
        unpack = [(s, off, p) for s, off, p in incoming]

        def place(stream: Any) -> None:  # received blocks -> my stage-k buffer
            for _s, off, p in unpack:
                h, w = self._block(p)
                if self._gpu:
                    rt = self.xp.cuda.runtime
                    rt.memcpy2DAsync(self.buf.ptr(self.world.rank) + base + p.dst * e, p.dst_ld * e,
                                     self.recv.data.ptr + off * e, w * e, w * e, h, rt.memcpyDefault, stream.ptr)
                else:
                    into = self._eng.strided(self._flat[k % 2], p.dst, (h, w), (p.dst_ld, 1))
                    into[...] = self.recv[off: off + h * w].reshape(h, w)

        sends = self._by_rank(mine)
        recvs = self._by_rank(incoming)
        if self.alltoall == "nccl":
            nccl, comm = self._nccl, self._comm
            kind = nccl.NCCL_UINT8

            def nccl_move(stream: Any) -> None:
                nccl.groupStart()
                try:
                    for t, (off, n) in sends.items():
                        comm.send(self.send.data.ptr + off * e, n * e, kind, t, stream.ptr)
                    for s, (off, n) in recvs.items():
                        comm.recv(self.recv.data.ptr + off * e, n * e, kind, s, stream.ptr)
                finally:
                    nccl.groupEnd()
                place(stream)
            return nccl_move

        MPI = self.world.mpi.MPI  # noqa: N806 - the module, from the world's bootstrap
        R = self.world.size

        def mpi_move(stream: Any) -> None:
            if self._gpu:
                self.world.backend.wait_stream(stream, Deadline.after(self._timeout),
                                               lambda: f"rank {self.world.rank}: packing for the MPI all-to-all")
            lo = min((off for off, _ in sends.values()), default=0)
            hi = max((off + n for off, n in sends.values()), default=0)
            rlo = min((off for off, _ in recvs.values()), default=0)
            rhi = max((off + n for off, n in recvs.values()), default=0)
            out = self._eng.to_host(self.send[lo:hi]) if hi > lo else np.zeros(0, self.dtype)
            back = np.zeros(rhi - rlo, dtype=self.dtype)
            sc = [sends.get(t, (0, 0))[1] * e for t in range(R)]
            sd = [(sends[t][0] - lo) * e if t in sends else 0 for t in range(R)]
            rc = [recvs.get(s, (0, 0))[1] * e for s in range(R)]
            rd = [(recvs[s][0] - rlo) * e if s in recvs else 0 for s in range(R)]
            with self.world.mpi_lock:
                self._mpi.Alltoallv([out.view(np.uint8), sc, sd, MPI.BYTE], [back.view(np.uint8), rc, rd, MPI.BYTE])
            if rhi > rlo:
                if self._gpu:
                    with stream:
                        self.recv[rlo:rhi].set(back)
                else:
                    self.recv[rlo:rhi] = back
            place(stream)
        return mpi_move

    @staticmethod
    def _by_rank(entries: list) -> dict[int, tuple[int, int]]:
        """{rank: (first offset, elements)} of a chunk's blocks (each rank's are consecutive)."""
        out: dict[int, tuple[int, int]] = {}
        for r, off, p in entries:
            first, n = out.get(r, (off, 0))
            out[r] = (first, n + p.elements)
        return out

    # -- running ------------------------------------------------------------------------------------
    def forward(self, profile: bool = False) -> Any:
        run = self._runner
        run.begin(profile)
        used = []
        if self._barrier is not None:  # no copy into a peer before it is done with the last transform
            run.fence(self._barrier)
            used.append(self._barrier)
        for ops, packs, moves in self._steps:
            if not moves:
                for op in ops:
                    if op is not None:
                        run.fft(op)
                continue
            for j, move in enumerate(moves):
                if ops[j] is not None:
                    run.fft(ops[j])
                for pack in packs[j]:
                    run.local(pack)
                run.put(move)
            waits = list(moves)
            if self._barrier is not None:
                run.put(self._barrier)
                waits.append(self._barrier)
            run.wait(waits)
            used += waits
        run.end(Deadline.after(self._timeout), used)
        self.seconds = run.total
        if profile:
            self.timings = dict(run.times)
        return self.output

    def close(self) -> None:
        """Collective: free the buffers."""
        if self._barrier is not None:
            self._bwin.free(self._timeout)
            self._barrier = None
        self.buf.close(self._timeout)
        self.send = self.recv = None
        self._cache = {}

    def describe(self) -> dict:
        return {"alltoall": self.alltoall, "transpose": self.transpose, "layout": self.layout,
                "chunks": [len(m) for _, _, m in self._steps if m]}


# -- NVSHMEM: the same scheme as its own program ---------------------------------------------------------
def _cufft_dirs() -> tuple[Path, Path]:
    """(include, lib) folders with cufft.h and libcufft: CUDA_HOME / the toolkit, or the nvidia pip wheels."""
    from ..transport import _build

    candidates = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append((Path(home) / "include", Path(home) / "lib64"))
    for d in _build.nvidia_dirs():
        for sub in ("cu13", "cufft", "cu12"):
            candidates.append((d / sub / "include", d / sub / "lib"))
    for inc, lib in candidates:
        if (inc / "cufft.h").is_file() and any(lib.glob("libcufft.so*")):
            return inc, lib
    looked = ", ".join(str(i) for i, _ in candidates)
    raise BackendError(f"cuFFT's header and library were not found (looked in {looked}): install the CUDA "
                       "toolkit or pip install nvidia-cufft")


def nvshmem_build_command(output: Path) -> list[str]:
    """The nvcc command that builds the NVSHMEM slab FFT into ``output``."""
    from ..transport import _build

    nv = _build.find_nvshmem()
    mpi_compile, mpi_link = _build.mpi_flags()
    inc, lib = _cufft_dirs()
    libs = sorted(p.name for p in lib.glob("libcufft.so*"))
    cufft = "-lcufft" if "libcufft.so" in libs else f"-l:{libs[-1]}"
    return [_build.find_nvcc(), "-std=c++17", "-rdc=true", "-arch=sm_90a", "-O2", f"-I{nv / 'include'}",
            f"-I{inc}", *mpi_compile, str(_NVSHMEM_SOURCE), "-o", str(output), *_build.nvshmem_link_args(nv),
            "-L", str(lib), cufft, "-Xlinker", f"-rpath={lib}", *mpi_link]


def build_nvshmem(folder: Path | None = None) -> Path:
    """Build the NVSHMEM slab FFT (cached by its sources and the command, through the one toolchain of
    ``circuslink.transport._build``); return the binary's path."""
    from ..transport import _build
    from .baselines import _nvshmem

    return _build.build_cached("baselines", "fft_slab_nvshmem", _NVSHMEM_SOURCE, nvshmem_build_command, suffix="",
                               what="nvcc", folder=folder, includes=[_KERNELS, _nvshmem.COMMON], timeout=900)


def nvshmem_slab(nranks: int, cases: list[tuple[tuple[int, ...], str]], iters: int, warmup: int,
                 chunks: list[int], timeout: float | None = None) -> list[dict]:
    """Run the NVSHMEM slab FFT on ``nranks`` PEs for every (shape, dtype) case and chunk count; from ONE process.

    Rows: ``{"shape", "dtype", "time_ms", "time_min_ms", "fft_ms", "transpose_ms", "comm_ms", "samples",
    "verified", "max_rel_err", "nvshmem_version"}`` (the slowest PE of each iteration, device events), or
    raises BackendError / CompileError / TimeoutError saying why not.
    """
    from .baselines import _nvshmem

    nv = _nvshmem.find_nvshmem()
    binary = build_nvshmem()
    biggest = max(int(np.prod(s)) * np.dtype(d).itemsize for s, d in cases)
    env = _nvshmem._job_env(nv, biggest)
    env["NVSHMEM_SYMMETRIC_SIZE"] = str(-(-biggest // nranks) * 2 + (1 << 30))
    # Its all-to-all is an on-stream collective, which NVSHMEM runs under MPS only with each PE's share at most
    # 100 / the PEs on its GPU ("not supported with limited MPG"), whatever the share of the ranks that started it
    # (100 where they take SMs of their own).
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps.share_percent(-(-nranks // max(1, mps.gpu_count()))))
    spec = ";".join(f"{'x'.join(map(str, s))}:{d}" for s, d in cases)
    args = [f"cases={spec}", f"iters={iters}", f"warmup={warmup}", f"chunks={','.join(map(str, chunks))}",
            f"seed={_nvshmem.fresh_seed()}"]
    rows = _nvshmem._run("fft_slab_nvshmem", binary, _nvshmem.mpirun_command(binary, args, env, nranks), env, timeout,
                         nranks, lambda row: f"{row.get('shape')} {row.get('dtype')}")
    for r in rows:
        r.setdefault("nvshmem_version", None)
    return rows


# -- the ceiling: one process, the whole GPU -----------------------------------------------------------
def ceiling(cases: list[tuple[tuple[int, ...], str]], iters: int, warmup: int, gpu: bool) -> list[dict]:
    """cuFFT's (numpy's) transform of each whole array in this process, event-timed; {"time_ms", ...} rows."""
    rows = []
    if not gpu:
        import time

        for shape, dtype in cases:
            x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
            times = []
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                np.fft.fftn(x)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            rows.append(_ceiling_row(shape, dtype, times))
        return rows
    import cupy as cp
    from cupy.cuda import cufft

    for shape, dtype in cases:
        kind = 0x29 if dtype == "complex64" else 0x69
        x = cp.zeros(shape, dtype=dtype)
        x[...] = 1.0
        plan = cufft.PlanNd(list(shape), None, 1, 0, None, 1, 0, kind, 1, "C", -1, None)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for i in range(warmup + iters):
            a.record()
            plan.fft(x, x, -1)  # in place: the ceiling needs no second array
            b.record()
            b.synchronize()
            if i >= warmup:
                times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        rows.append(_ceiling_row(shape, dtype, times))
        del plan, x
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def _ceiling_row(shape: tuple[int, ...], dtype: str, times: list[float]) -> dict:
    return {"shape": list(shape), "dtype": dtype, "time_ms": statistics.median(times) * 1e3,
            "time_min_ms": min(times) * 1e3, "samples": len(times)}


# Rank identity of an enclosing job: the ceiling's own process must not look like a rank.
_JOB_ENV = ("CIRCUSLINK_RANK", "CIRCUSLINK_STORE", "CIRCUSLINK_SIZE", "OMPI_", "PMIX_", "PMI_")


def run_ceiling(cases: list[tuple[tuple[int, ...], str]], iters: int, warmup: int, gpu: bool,
                timeout: float | None = None) -> list[dict]:
    """:func:`ceiling` in a process of its own with the whole GPU (no MPS share); from ONE rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_JOB_ENV)}
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "100"
    spec = json.dumps({"cases": [[list(s), d] for s, d in cases], "iters": iters, "warmup": warmup, "gpu": gpu})
    deadline = Deadline.after(timeout)
    try:
        proc = subprocess.run([sys.executable, "-m", "circuslink.bench.fft_baseline", "ceiling", spec],
                              capture_output=True, text=True, env=env, timeout=deadline.remaining())
    except subprocess.TimeoutExpired:
        from ..errors import TimeoutError

        raise TimeoutError(f"the 1-rank ceiling did not finish within {deadline.limit:g} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise BackendError(f"the 1-rank ceiling failed (exit code {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "ceiling":
        print("usage: python -m circuslink.bench.fft_baseline ceiling JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    cases = [(tuple(s), d) for s, d in spec["cases"]]
    print(json.dumps(ceiling(cases, spec["iters"], spec["warmup"], spec["gpu"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
