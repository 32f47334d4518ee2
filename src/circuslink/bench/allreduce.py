"""Channel all-reduce against NCCL's, in the same run: ``circuslink bench allreduce``.

For each size (bytes per rank, float32 sum): the result is first checked exactly (small
random integers, whose float sums are exact), then timed. On a back-end that runs kernels (cuda):
``iters`` all-reduces back to back inside one kernel launch (kernels/allreduce_loop.cu: the public
device API, as a user's kernel would call it), time per operation = (last block's end - first
block's start) / iters, slowest rank; NCCL: its API called directly, back to back on a stream,
event-timed (bench.baselines.nccl_allreduce). Otherwise (cpu): the host API, timed per call.
Bus bandwidth = bytes / time x 2 (n - 1) / n, as nccl-tests.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import launcher
from ..errors import ChannelError, ConfigError
from . import _driver as drv

BENCHMARK = "allreduce"
_HOST_MAX_BYTES = 1 << 20  # a host-driven all-reduce (cpu) reduces in Python: keep default runs short
_MAX_RANKS = 8
_TRACE_SIZE = 32 << 10
_LOOP_KERNEL = Path(__file__).with_name("kernels") / "allreduce_loop.cu"
_LOOP_TYPES = {"float32": "float", "int32": "int"}  # dtypes the timed loop is instantiated for
_LOOP_THREADS = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:256M", default_nranks=2, default_iters=20, default_warmup=5,
                              trace=True)
    parser.add_argument("--rings", type=int, default=None,
                        help="bandwidth rings (one block each) on cuda (default 32)")


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.nranks <= _MAX_RANKS:
        raise ConfigError(f"allreduce: -n {args.nranks} is outside 1..{_MAX_RANKS}")
    if args.rings is not None and not 1 <= args.rings <= 128:
        raise ConfigError(f"allreduce: --rings {args.rings} is outside 1..128")
    if not launcher.inside_job():
        cap = _HOST_MAX_BYTES if args.sizes == "8:256M" else None  # the default range is trimmed on the cpu
        return launcher.relaunch_self(args.nranks, args.backend, mps_mode=args.mps,
                                      **drv.memory_per_rank(args, 6, cap))
    import circuslink as cl

    world = cl.init(args.backend)
    try:
        return _run(world, args)
    finally:
        world.close()


def _sizes(args: argparse.Namespace, on_device: bool) -> list[int]:
    sizes = drv.parse_sizes(args.sizes)
    if args.quick:
        sizes = [s for s in sizes if s <= (1 << 20)][:: max(1, len(sizes) // 6)] or sizes[:1]
    if not on_device and args.sizes == "8:256M":
        sizes = [s for s in sizes if s <= _HOST_MAX_BYTES]
    return sizes


def _contribution(seed: int, rank: int, count: int) -> np.ndarray:
    # Integers below 2**16: a float32 sum of up to 8 of them is exact, so the check is exact.
    return np.random.default_rng(seed + rank).integers(0, 1 << 16, count).astype(np.float32)


def _run(world: Any, args: argparse.Namespace) -> int:
    from .. import collectives, probe

    backend = world.backend.name  # for labels only
    on_device = world.backend.runs_kernels
    sizes = _sizes(args, on_device)
    iters = 3 if args.quick else args.iters
    warmup = 1 if args.quick else args.warmup
    n = world.size
    results = drv.Results(BENCHMARK, world)
    drv.progress("probe: the floor")
    results.floor = probe.measure(world, quick=bool(args.quick or not on_device)) if n > 1 else None
    comm = collectives.Comm(world, rings=args.rings)
    loop = _DeviceLoop(world, comm) if on_device else None
    xp = world.xp
    rng = np.random.default_rng()
    try:
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            drv.progress(f"allreduce {drv.format_bytes(count * 4)} x {n} ranks")
            seed = world.broadcast_object(int(rng.integers(1 << 60)))
            mine = _contribution(seed, world.rank, count)
            want = sum(_contribution(seed, r, count).astype(np.float64) for r in range(n)).astype(np.float32)
            got = comm.allreduce(xp.asarray(mine), "sum")
            got = got.get() if hasattr(got, "get") else got
            ok = bool(np.array_equal(got, want))
            oks = world.allgather_object(ok)
            if not all(oks):
                bad = [r for r, o in enumerate(oks) if not o]
                raise ChannelError(f"allreduce of {count * 4} B: wrong result on rank(s) {bad}")
            per_op_s = _time(world, comm, loop, xp.asarray(mine), iters, warmup)
            per_op_s = max(world.allgather_object(per_op_s))
            algbw = count * 4 / per_op_s / 1e9
            results.add(impl="channel", op="allreduce", dtype="float32", bytes=count * 4, count=count, nranks=n,
                        latency_us=per_op_s * 1e6, time_us=per_op_s * 1e6, algbw_GBps=algbw,
                        busbw_GBps=algbw * 2 * (n - 1) / n if n > 1 else None, throughput_GBps=algbw,
                        iters=iters, verified=True)
        if args.trace:
            _trace(world, comm, loop, args)
        if on_device and n > 1 and not args.no_baselines:
            drv.progress("NCCL all-reduce")
            try:
                from .baselines import nccl_allreduce
            except ImportError as exc:
                results.add(impl="nccl", bytes=0, skipped=f"baselines not importable: {exc}")
            else:
                results.extend(nccl_allreduce(world, sizes, iters, warmup))
    finally:
        comm.close()
    if world.rank == 0:
        results.meta.update({"definitions": __doc__.strip().split("\n\n")[1].replace("\n", " "),
                             "rings": args.rings, "iters": iters, "warmup": warmup})

        def text() -> None:
            drv.print_table(results.rows, ["impl", "bytes", "time_us", "algbw_GBps", "busbw_GBps"],
                            f"all-reduce, float32 sum, {n} ranks ({backend}, {results.device})", args)
            _targets(results)

        drv.finish(results, args, text, lambda path: drv.figure(path, [
            drv.panel(results.rows, "bytes", "time_us", "impl", f"all-reduce time, {n} ranks", "bytes per rank",
                      "us per operation"),
            drv.panel(results.rows, "bytes", "busbw_GBps", "impl", f"all-reduce bus bandwidth, {n} ranks",
                      "bytes per rank", "GB/s")]))
    return 0


class _DeviceLoop:
    """kernels/allreduce_loop.cu over a Comm's device handle: ``iters`` all-reduces in one launch."""

    def __init__(self, world: Any, comm: Any) -> None:
        import circuslink as cl

        cp = world.xp
        self.world, self.comm, self.cp = world, comm, cp
        self.module = cl.compile(_LOOP_KERNEL.read_text(),
                                 name_expressions=[f"allreduce_loop<{t}>" for t in _LOOP_TYPES.values()])
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.t = cp.zeros(2, dtype=cp.uint64)
        self.failed = cp.zeros(1, dtype=cp.int32)

    def run(self, data: Any, iters: int, trace: Any = None) -> float:
        """Nanoseconds per operation on this rank (first block's start to last block's end)."""
        from ..trace import Tracer

        cp = self.cp
        name = np.dtype(data.dtype).name
        if name not in _LOOP_TYPES:
            raise ConfigError(f"allreduce: dtype {name} has no timed loop ({', '.join(_LOOP_TYPES)} do)")
        handle = self.comm.device_handle(data.nbytes)
        fn = self.module.get_function(f"allreduce_loop<{_LOOP_TYPES[name]}>")
        # The forward-progress rule: the blocks wait on peers, so all of them must be resident at once
        # within this rank's SM share; allreduce_grid covers every ring's slice with fewer blocks.
        grid = min(int(handle["count"]), self.world.backend.max_blocks(fn, _LOOP_THREADS))
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cp.cuda.get_current_stream())  # the caller's writes of `data` come first
        self.stream.wait_event(ready)
        with self.stream:
            self.t.set(np.array([np.iinfo(np.uint64).max, 0], dtype=np.uint64))
            self.failed.fill(0)
        fn((grid,), (_LOOP_THREADS,), (handle, data, np.uint64(data.size), np.uint32(iters), self.t,
                                       trace if trace is not None else Tracer.null_handle(), self.failed),
           stream=self.stream)
        self.comm.wait(self.stream, "allreduce loop")  # bounded; raises the error of a ring that stalled
        if int(self.failed.get()[0]):
            raise ChannelError(f"allreduce loop on rank {self.world.rank} failed in device code")
        t0, t1 = (int(v) for v in self.t.get())
        return (t1 - t0) / iters


def _time(world: Any, comm: Any, loop: _DeviceLoop | None, data: Any, iters: int, warmup: int) -> float:
    """Seconds per operation on this rank."""
    if loop is not None:
        if warmup:
            loop.run(data, warmup)
        world.barrier()
        return loop.run(data, iters) / 1e9
    for _ in range(warmup):
        comm.allreduce(data, "sum")
    world.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.allreduce(data, "sum")
    return (time.perf_counter() - t0) / iters


def _trace(world: Any, comm: Any, loop: _DeviceLoop | None, args: argparse.Namespace) -> None:
    """Trace a few 32 KiB all-reduces: one USER span ("allreduce") per operation and rank."""
    from ..trace import USER, Tracer

    data = world.xp.asarray(np.ones(_TRACE_SIZE // 4, dtype=np.float32))
    with Tracer(world, names={USER: "allreduce"}) as tracer:
        world.barrier()
        if loop is not None:
            loop.run(data, 5, trace=tracer.device_handle())
        else:
            for i in range(5):
                with tracer.span(USER, i):
                    comm.allreduce(data, "sum")
        trace = tracer.collect()
    if world.rank == 0:
        base, _ = os.path.splitext(args.trace)
        print(f"trace: {trace.export_chrome(args.trace)}, waveform: {trace.plot_waveform(base + '.png')}")


def _targets(results: drv.Results) -> None:
    """Ratios against NCCL where both ran at the same size (the targets: BENCHMARKS.md, "Channel all-reduce")."""
    by = {}
    for r in results.rows:
        if "skipped" not in r and r.get("time_us"):
            by.setdefault(r["bytes"], {})[r["impl"]] = r
    small, large = [], []
    for nbytes, impls in sorted(by.items()):
        if "channel" in impls and "nccl" in impls:
            if nbytes <= 64 << 10:
                small.append(impls["channel"]["time_us"] / impls["nccl"]["time_us"])
            if nbytes >= 64 << 20 and impls["nccl"].get("busbw_GBps"):
                large.append(impls["channel"]["busbw_GBps"] / impls["nccl"]["busbw_GBps"])
    if small:
        results.meta["latency_ratio_vs_nccl_le_64KiB"] = max(small)
        print(f"channel / NCCL time, <= 64 KiB: worst {max(small):.3f} (target <= 0.2)")
    if large:
        results.meta["busbw_ratio_vs_nccl_ge_64MiB"] = min(large)
        print(f"channel / NCCL bus bandwidth, >= 64 MiB: worst {min(large):.3f} (target >= 0.9)")
    if not small and not large:
        print("no NCCL rows to compare with (cpu back-end, --no-baselines, or NCCL unavailable)")
