"""Channel all-reduce against NCCL's, in the same run: ``circuslink bench allreduce``.

For each size (bytes per rank, float32 sum): the result is first checked exactly (small
random integers, whose float sums are exact), then timed. cuda: ``iters`` all-reduces back to
back inside one kernel launch (the device API, as a user's kernel would call it), time per
operation = (last block's end - first block's start) / iters, slowest rank; NCCL: its API
called directly, back to back on a stream, event-timed (bench.baselines.nccl_allreduce).
cpu: the host API, timed per call. Bus bandwidth = bytes / time x 2 (n - 1) / n, as nccl-tests.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from .. import launcher
from ..errors import ChannelError, ConfigError
from . import _driver as drv

BENCHMARK = "allreduce"
_CPU_MAX_BYTES = 1 << 20  # the cpu reference reduces in Python: keep default runs short
_MAX_RANKS = 8
_TRACE_SIZE = 32 << 10


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
        return launcher.relaunch_self(args.nranks, args.backend, mps_mode=args.mps)
    import circuslink as cl

    world = cl.init(args.backend)
    try:
        return _run(world, args)
    finally:
        world.close()


def _sizes(args: argparse.Namespace, backend: str) -> list[int]:
    sizes = drv.parse_sizes(args.sizes)
    if args.quick:
        sizes = [s for s in sizes if s <= (1 << 20)][:: max(1, len(sizes) // 6)] or sizes[:1]
    if backend == "cpu" and args.sizes == "8:256M":
        sizes = [s for s in sizes if s <= _CPU_MAX_BYTES]
    return sizes


def _contribution(seed: int, rank: int, count: int) -> np.ndarray:
    # Integers below 2**16: a float32 sum of up to 8 of them is exact, so the check is exact.
    return np.random.default_rng(seed + rank).integers(0, 1 << 16, count).astype(np.float32)


def _run(world: Any, args: argparse.Namespace) -> int:
    from .. import collectives, probe

    backend = world.backend.name
    sizes = _sizes(args, backend)
    iters = 3 if args.quick else args.iters
    warmup = 1 if args.quick else args.warmup
    n = world.size
    results = drv.Results(BENCHMARK, world)
    drv.progress("probe: the floor")
    results.floor = probe.measure(world, quick=bool(args.quick or backend == "cpu")) if n > 1 else None
    comm = collectives.Comm(world, rings=args.rings)
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
            per_op_s = _time(world, comm, xp.asarray(mine), iters, warmup)
            per_op_s = max(world.allgather_object(per_op_s))
            algbw = count * 4 / per_op_s / 1e9
            results.add(impl="channel", op="allreduce", dtype="float32", bytes=count * 4, count=count, nranks=n,
                        latency_us=per_op_s * 1e6, time_us=per_op_s * 1e6, algbw_GBps=algbw,
                        busbw_GBps=algbw * 2 * (n - 1) / n if n > 1 else None, throughput_GBps=algbw,
                        iters=iters, verified=True)
        if args.trace:
            _trace(world, comm, args)
        if backend == "cuda" and n > 1 and not args.no_baselines:
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
        drv.print_table(results.rows, ["impl", "bytes", "time_us", "algbw_GBps", "busbw_GBps"],
                        f"all-reduce, float32 sum, {n} ranks ({backend}, {results.device})")
        _targets(results)
        path = results.write_json(args.json)
        print(f"results: {path}")
        if args.plot:
            base, ext = os.path.splitext(args.plot)
            drv.plot(results.rows, "bytes", "time_us", "impl", args.plot, f"all-reduce time, {n} ranks",
                     "bytes per rank", "us per operation")
            drv.plot(results.rows, "bytes", "busbw_GBps", "impl", f"{base}-busbw{ext or '.png'}",
                     f"all-reduce bus bandwidth, {n} ranks", "bytes per rank", "GB/s")
            print(f"plots: {args.plot}, {base}-busbw{ext or '.png'}")
    return 0


def _time(world: Any, comm: Any, data: Any, iters: int, warmup: int) -> float:
    """Seconds per operation on this rank."""
    if world.backend.name == "cuda":
        if warmup:
            comm._cuda.allreduce_loop(data, warmup)
        world.barrier()
        return comm._cuda.allreduce_loop(data, iters) / 1e9
    for _ in range(warmup):
        comm.allreduce(data, "sum")
    world.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.allreduce(data, "sum")
    return (time.perf_counter() - t0) / iters


def _trace(world: Any, comm: Any, args: argparse.Namespace) -> None:
    """Trace a few 32 KiB all-reduces: one USER span ("allreduce") per operation and rank."""
    from ..trace import USER, Tracer

    tracer = Tracer(world, names={USER: "allreduce"})
    data = world.xp.asarray(np.ones(_TRACE_SIZE // 4, dtype=np.float32))
    world.barrier()
    if world.backend.name == "cuda":
        comm._cuda.allreduce_loop(data, 5, trace=tracer.device_handle())
    else:
        for i in range(5):
            with tracer.span(USER, i):
                comm.allreduce(data, "sum")
    trace = tracer.collect()
    tracer.close()
    if world.rank == 0:
        base, _ = os.path.splitext(args.trace)
        print(f"trace: {trace.export_chrome(args.trace)}, waveform: {trace.plot_waveform(base + '.png')}")


def _targets(results: drv.Results) -> None:
    """Ratios against NCCL where both ran at the same size (issue 4's targets)."""
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
