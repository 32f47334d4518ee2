"""All-reduce by algorithm against NVSHMEM's and NCCL's, in the same run: ``circuslink bench allreduce``.

For each size (bytes per rank, float32 sum) the result is first checked exactly (small random
integers, whose float sums are exact), then every algorithm is timed the nccl-tests way: a device-side
barrier before the clock (the team's ``cc::barrier``), ``--samples`` samples (at least 10) of ``iters``
back-to-back operations each, one launch per sample (kernels/allreduce_loop.cu, the public device API as
a user's kernel calls it); a sample's time per operation is the slowest rank's; the row has the median
over samples (time_us) and the fastest (min_time_us). algbw = bytes / time; busbw = algbw x 2 (n - 1) / n,
as nccl-tests. On the cpu back-end the host API, the same samples timed on the host after a barrier.

Rows: "oneshot", "twoshot" (ranks sharing memory; two-shot in place on the team's stage, the symmetric
form NVSHMEM's collectives use), "ring" (over channels), each with "picked" = whether the switch table
(collectives/_select.py) picks it at that size; "nvshmem-reduce-stream" / "nvshmem-reduce-device"
(nvshmemx_float_sum_reduce_on_stream, and nvshmemx_float_sum_reduce_block from a kernel, n PEs under MPS
with 100/n of the GPU each); "nccl" where the ranks have GPUs of their own. The report ends with the
floor of the run (the probe's relaxed store+poll latency and SM-store bandwidth) and the targets' verdicts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import launcher
from .._config import default_timeout
from ..errors import ChannelError, ConfigError
from . import _driver as drv

BENCHMARK = "allreduce"
_HOST_MAX_BYTES = 1 << 20  # a host-driven all-reduce (cpu) reduces in Python: keep default runs short
_MAX_RANKS = 8
_TRACE_SIZE = 32 << 10
_LOOP_KERNEL = Path(__file__).with_name("kernels") / "allreduce_loop.cu"
_LOOP_TYPES = {"float32": "float", "int32": "int"}  # dtypes the timed loops are instantiated for
_LOOP_THREADS = 512
_BYTES_PER_SAMPLE = 1 << 30  # large sizes run fewer operations a sample (at least one)
_NVSHMEM_TIMEOUT_S = 900
# NVSHMEM's reductions with several PEs on one GPU ran at 1-2 GB/s from 1 MiB (2 and 4 PEs, one H200): at
# 1 GiB a sample its 64 MiB row alone took over 30 s, and the 8-PE run ran past its step. A sample of
# 64 MiB (at least one operation; every row records its iters) keeps the baseline to seconds a size.
_NVSHMEM_BYTES_PER_SAMPLE = 64 << 20
_TWOSHOT_BLOCKS = 64  # as the host API's two-shot grids (collectives/_cuda.py, TEAM_MAX_BLOCKS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:256M", default_nranks=2, default_iters=100, default_warmup=5,
                              trace=True)
    parser.add_argument("--rings", type=int, default=None,
                        help="bandwidth rings (one block each) of the ring algorithm on cuda (default 64)")
    parser.add_argument("--samples", type=drv.positive_int, default=10,
                        help="samples per algorithm and size (at least 10; median and minimum reported)")
    parser.add_argument("--algorithms", default="oneshot,twoshot,ring",
                        help="comma-separated algorithms to time (default oneshot,twoshot,ring)")


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.nranks <= _MAX_RANKS:
        raise ConfigError(f"allreduce: -n {args.nranks} is outside 1..{_MAX_RANKS}")
    if args.rings is not None and not 1 <= args.rings <= 128:
        raise ConfigError(f"allreduce: --rings {args.rings} is outside 1..128")
    if args.samples < 10:
        raise ConfigError(f"allreduce: --samples {args.samples} is below 10 (medians need at least 10 samples)")
    _algorithms(args)
    if not launcher.inside_job():
        cap = _HOST_MAX_BYTES if args.sizes == "8:256M" else None  # the default range is trimmed on the cpu
        return launcher.relaunch_self(args.nranks, args.backend, mps_mode=args.mps,
                                      **drv.memory_per_rank(args, 8, cap))
    import circuslink as cl

    world = cl.init(args.backend)
    try:
        return _run(world, args)
    finally:
        world.close()


def _algorithms(args: argparse.Namespace) -> list[str]:
    from ..collectives import ALGORITHMS

    algos = [a.strip() for a in str(args.algorithms).split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGORITHMS]
    if bad or not algos:
        raise ConfigError(f"allreduce: --algorithms {args.algorithms!r}: each must be one of {', '.join(ALGORITHMS)}")
    return algos


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
    from ..collectives._layout import LL_MAX_BYTES
    from ..collectives._select import choose

    backend = world.backend.name  # for labels only
    on_device = world.backend.runs_kernels
    sizes = _sizes(args, on_device)
    iters = 20 if args.quick else args.iters
    warmup = 1 if args.quick else args.warmup
    n = world.size
    results = drv.Results(BENCHMARK, world)
    drv.progress("probe: the floor")
    results.floor = probe.measure(world, quick=bool(args.quick or not on_device)) if n > 1 else None
    # two-shot is timed in place on the stage (allreduce_stage): the stage holds the largest message
    stage = -(-max(sizes + [4]) // 4096) * 4096
    comm = collectives.Comm(world, rings=args.rings, stage_bytes=stage if on_device and stage > 32 << 20 else None)
    shares = comm.shares_memory
    algos = [a for a in _algorithms(args) if a == "ring" or shares]
    timer = _DeviceLoop(world, comm) if on_device else _HostLoop(world, comm)
    # A rank stuck in a kernel reports the wait that stalled after its own bounded wait (the channels'
    # and the team's time-out, then the host's backstop): the others wait longer than that at the host
    # handshakes, so that the stalled rank's message is the one the job ends with.
    limit = default_timeout()
    handshake_s = 2 * limit + 10 if limit else None
    xp = world.xp
    rng = np.random.default_rng()
    try:
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            drv.progress(f"allreduce {drv.format_bytes(count * 4)} x {n} ranks")
            seed = world.broadcast_object(int(rng.integers(1 << 60)), timeout=handshake_s)
            mine = _contribution(seed, world.rank, count)
            want = sum(_contribution(seed, r, count).astype(np.float64) for r in range(n)).astype(np.float32)
            picked = choose(count * 4, n, shares)
            for algo in algos:
                if algo == "oneshot" and count * 4 > LL_MAX_BYTES:
                    continue
                drv.progress(f"allreduce {drv.format_bytes(count * 4)} x {n} ranks: {algo}")
                got = comm.allreduce(xp.asarray(mine), "sum", algorithm=algo)
                got = got.get() if hasattr(got, "get") else got
                oks = world.allgather_object(bool(np.array_equal(got, want)), timeout=handshake_s)
                if not all(oks):
                    bad = [r for r, o in enumerate(oks) if not o]
                    raise ChannelError(f"allreduce ({algo}) of {count * 4} B: wrong result on rank(s) {bad}")
                k = max(1, min(iters, _BYTES_PER_SAMPLE // (count * 4)))
                data = xp.asarray(mine)
                timer.run(algo, data, min(warmup, k))
                per_op = []
                for _ in range(args.samples):
                    per_op.append(max(world.allgather_object(timer.run(algo, data, k), timeout=handshake_s)))
                med = statistics.median(per_op)
                algbw = count * 4 / med / 1e9
                results.add(impl=algo, op="allreduce", dtype="float32", bytes=count * 4, count=count, nranks=n,
                            time_us=med * 1e6, min_time_us=min(per_op) * 1e6, latency_us=med * 1e6,
                            algbw_GBps=algbw, busbw_GBps=algbw * 2 * (n - 1) / n if n > 1 else None,
                            throughput_GBps=algbw, iters=k, samples=args.samples, picked=algo == picked,
                            verified=True)
        if args.trace:
            _trace(world, comm, timer, args)
        if on_device and n > 1 and not args.no_baselines:
            _baselines(world, results, sizes, iters, warmup, args)
    finally:
        comm.close()
    if world.rank == 0:
        results.meta.update({"definitions": __doc__.strip().split("\n\n")[1].replace("\n", " "),
                             "rings": args.rings, "iters": iters, "warmup": warmup, "samples": args.samples,
                             "algorithms": algos})

        def text() -> None:
            drv.print_table(results.rows, ["impl", "bytes", "time_us", "min_time_us", "algbw_GBps", "busbw_GBps"],
                            f"all-reduce, float32 sum, {n} ranks ({backend}, {results.device})", args)
            _targets(results, n)

        drv.finish(results, args, text, lambda path: drv.figure(path, [
            drv.panel(results.rows, "bytes", "time_us", "impl", f"all-reduce time, {n} ranks", "bytes per rank",
                      "us per operation"),
            drv.panel(results.rows, "bytes", "busbw_GBps", "impl", f"all-reduce bus bandwidth, {n} ranks",
                      "bytes per rank", "GB/s")]))
    return 0


def _baselines(world: Any, results: drv.Results, sizes: list[int], iters: int, warmup: int,
               args: argparse.Namespace) -> None:
    """NCCL (collective; it skips itself where ranks share a GPU) and NVSHMEM (rank 0 runs its n PEs)."""
    from . import baselines

    drv.progress("NCCL all-reduce")
    results.extend(baselines.nccl_allreduce(world, sizes, iters, warmup))
    if world.rank == 0:
        drv.progress(f"NVSHMEM reductions, {world.size} PEs")
        try:
            results.extend(baselines.nvshmem_allreduce(sizes, world.size, iters, warmup, samples=args.samples,
                                                       bytes_per_sample=_NVSHMEM_BYTES_PER_SAMPLE,
                                                       timeout=_NVSHMEM_TIMEOUT_S))
        except Exception as exc:  # a baseline that cannot run is reported, not fatal
            results.add(impl="nvshmem-reduce-stream", bytes=0, skipped=f"{type(exc).__name__}: {exc}")
    world.barrier(timeout=_NVSHMEM_TIMEOUT_S + 60)  # the others wait while rank 0 runs the NVSHMEM program


class _HostLoop:
    """The host API timed on the host (back-ends without kernels): seconds per operation on this rank."""

    def __init__(self, world: Any, comm: Any) -> None:
        self.world, self.comm = world, comm

    def run(self, algo: str, data: Any, iters: int) -> float:
        self.world.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            self.comm.allreduce(data, "sum", algorithm=algo)
        return (time.perf_counter() - t0) / max(1, iters)


class _DeviceLoop:
    """kernels/allreduce_loop.cu: ``iters`` all-reduces in one launch after a device-side barrier; seconds per
    operation on this rank (block 0's time after the barrier to the last block's end)."""

    def __init__(self, world: Any, comm: Any) -> None:
        import circuslink as cl

        from ..collectives._layout import TEAM

        cp = world.xp
        self.world, self.comm, self.cp = world, comm, cp
        kernels = ("allreduce_loop", "team_oneshot_loop", "team_stage_loop")
        names = [f"{k}<{t}>" for t in _LOOP_TYPES.values() for k in kernels]
        self.module = cl.compile(_LOOP_KERNEL.read_text(), name_expressions=names)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.t = cp.zeros(2, dtype=cp.uint64)
        self.failed = cp.zeros(1, dtype=cp.int32)
        try:
            self.team = comm.device_team()
        except ConfigError:  # no shared memory: the ring loop runs without the barrier before its clock
            self.team = TEAM.pack(size=1)

    def run(self, algo: str, data: Any, iters: int, trace: Any = None) -> float:
        from ..trace import Tracer

        cp = self.cp
        name = np.dtype(data.dtype).name
        if name not in _LOOP_TYPES:
            raise ConfigError(f"allreduce: dtype {name} has no timed loop ({', '.join(_LOOP_TYPES)} do)")
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cp.cuda.get_current_stream())  # the caller's writes of `data` come first
        self.stream.wait_event(ready)
        with self.stream:
            self.t.fill(0)
            self.failed.fill(0)
        backend = self.world.backend
        if algo == "ring":
            handle = self.comm.device_handle(data.nbytes)
            fn = self.module.get_function(f"allreduce_loop<{_LOOP_TYPES[name]}>")
            # The forward-progress rule: every block resident at once within this rank's SM share
            grid = min(int(handle["count"]), backend.max_blocks(fn, _LOOP_THREADS))
            args = (handle, self.team, data, np.uint64(data.size), np.uint32(iters), self.t,
                    trace if trace is not None else Tracer.null_handle(), self.failed)
        else:
            kernel = "team_oneshot_loop" if algo == "oneshot" else "team_stage_loop"
            fn = self.module.get_function(f"{kernel}<{_LOOP_TYPES[name]}>")
            most = backend.max_blocks(fn, _LOOP_THREADS)
            want = -(-data.nbytes // 1024) if algo == "oneshot" else -(-data.nbytes // (_LOOP_THREADS * 64))
            grid = max(1, min(most, want, 64 if algo == "oneshot" else _TWOSHOT_BLOCKS))
            args = (self.team, data, np.uint64(data.size), np.uint32(iters), self.t, self.failed)
        backend.launch_resident(fn, grid, _LOOP_THREADS, args, stream=self.stream)
        self.comm.wait(self.stream, f"allreduce loop ({algo})")  # bounded; raises the error of what stalled
        if int(self.failed.get()[0]):
            raise ChannelError(f"allreduce loop ({algo}) on rank {self.world.rank} failed in device code")
        t0, t1 = (int(v) for v in self.t.get())
        return (t1 - t0) / 1e9 / max(1, iters)


def _trace(world: Any, comm: Any, timer: Any, args: argparse.Namespace) -> None:
    """Trace a few 32 KiB ring all-reduces: one USER span ("allreduce") per operation and rank."""
    from ..trace import USER, Tracer

    data = world.xp.asarray(np.ones(_TRACE_SIZE // 4, dtype=np.float32))
    with Tracer(world, names={USER: "allreduce"}) as tracer:
        world.barrier()
        if isinstance(timer, _DeviceLoop):
            timer.run("ring", data, 5, trace=tracer.device_handle())
        else:
            for i in range(5):
                with tracer.span(USER, i):
                    comm.allreduce(data, "sum")
        trace = tracer.collect()
    if world.rank == 0:
        base, _ = os.path.splitext(args.trace)
        print(f"trace: {trace.export_chrome(args.trace)}, waveform: {trace.plot_waveform(base + '.png')}")


def verdicts(rows: list[dict], floor: dict | None, nranks: int) -> list[tuple[str, bool | None, str]]:
    """The targets (docs/collectives.md, "Targets") against this run: (target, met or None if not measured, detail).
    circuslink's time at a size is the picked algorithm's (the switch table's choice)."""
    summary = (floor or {}).get("summary") or {}
    lat, store = summary.get("lat_relaxed_us"), summary.get("sm_store_GBps")
    ours = {r["bytes"]: r for r in rows if r.get("picked") and r.get("time_us")}
    theirs: dict[int, float] = {}
    for r in rows:
        if str(r.get("impl", "")).startswith("nvshmem-reduce") and r.get("time_us"):
            theirs[r["bytes"]] = min(theirs.get(r["bytes"], float("inf")), r["time_us"])
    out: list[tuple[str, bool | None, str]] = []
    small = ours.get(8)
    factor = 3 if nranks <= 2 else 6
    if small and lat:
        out.append((f"8 B <= {factor}x the relaxed floor", small["time_us"] <= factor * lat,
                    f"{small['time_us']:.2f} us vs {factor} x {lat:.2f} us"))
    else:
        out.append((f"8 B <= {factor}x the relaxed floor", None, "8 B or the floor not measured"))
    if nranks <= 2:
        big = [r for b, r in ours.items() if b >= 64 << 20]
        if big and store:
            worst = min(r["busbw_GBps"] for r in big)
            out.append(("busbw >= 0.4x SM-store at >= 64 MiB", worst >= 0.4 * store,
                        f"worst {worst:.0f} GB/s vs 0.4 x {store:.0f} GB/s"))
        else:
            out.append(("busbw >= 0.4x SM-store at >= 64 MiB", None, "no size >= 64 MiB, or no floor"))
    both = sorted(set(ours) & set(theirs))
    if both:
        slower = [b for b in both if ours[b]["time_us"] > theirs[b]]
        out.append(("every size <= NVSHMEM", not slower,
                    "all sizes" if not slower else "slower at " + ", ".join(drv.format_bytes(b) for b in slower)))
    else:
        out.append(("every size <= NVSHMEM", None, "no NVSHMEM rows (cpu back-end, --no-baselines, or it failed)"))
    return out


def _targets(results: drv.Results, nranks: int) -> None:
    summary = (results.floor or {}).get("summary") or {}
    if summary:
        print(f"floor of this run: relaxed store+poll {summary.get('lat_relaxed_us', float('nan')):.3f} us, "
              f"SM stores {summary.get('sm_store_GBps', float('nan')):.0f} GB/s")
    found = verdicts(results.rows, results.floor, nranks)
    results.meta["targets"] = [{"target": t, "met": met, "detail": d} for t, met, d in found]
    for t, met, d in found:
        print(f"target {t}: {'met' if met else 'MISSED' if met is False else 'not measured'} ({d})")
