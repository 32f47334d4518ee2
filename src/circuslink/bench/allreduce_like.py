"""CIRCUS's allreduce-like pipeline (CIRCUS, Fig. 15-18; docs/papers.md): ``circuslink bench allreduce-like``.

Rank A (0) streams its uint32 vector to rank B (1) through one channel; B adds its own
vector to the data as it arrives and streams the sum back through a second channel; A
checks the sum. One pipeline: B receives, adds and sends at the same time, which
``--trace FILE`` shows (Chrome trace + PNG waveform + B's receive/send overlap fraction).

Timing uses pingpong's definitions, from A's side, so the two compare directly:
``t0`` = A starts sending, ``t1`` = the first element of the sum is back (on cuda: the
first packet's header is valid, as pingpong measures it), ``t2`` = the last is back;
latency = (t1 - t0) / 2, time = (t1 - t0) / 2 + (t2 - t1), throughput = bytes / time;
best of ``--iters``. Every repetition's result is verified element by element.

cuda: one fused kernel per rank built on the channel device API (``circuslink/channel.cuh``),
timed with %globaltimer inside A's kernel. cpu: the channels' Python API (the reference).
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

BENCHMARK = "allreduce-like"
_CPU_MAX_BYTES = 4 << 20  # the cpu reference moves bytes in Python: keep default runs short
_CPU_DEPTH_ELEMS = 1 << 14  # 64 KiB rings of uint32
_TRACE_SIZE = 32 << 10  # the size whose trace is written
# The traced cuda run streams each block's slice as several chunks: with the table's config
# (48 pairs, 64 KiB chunks) 32 KiB is one 688-byte chunk per block, so every block of B is
# store-and-forward (read it all, add, send it all) and receiving and sending can only overlap by
# accident of the blocks' skew. 8 pairs x 8 chunks of 512 B: block g reads chunk k + 1 right
# after sending chunk k while A's writes of later chunks are already landing in its ring.
_TRACE_PAIRS = 8
_TRACE_CHUNK_BYTES = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:256M", default_nranks=2, default_iters=20, default_warmup=3,
                              trace=True)


def run(args: argparse.Namespace) -> int:
    if not launcher.inside_job():
        if args.nranks != 2:
            raise ConfigError(f"allreduce-like runs on exactly 2 ranks (A and B), got -n {args.nranks}")
        cap = _CPU_MAX_BYTES if args.sizes == "8:256M" else None  # the default range is trimmed on the cpu
        return launcher.relaunch_self(2, args.backend, mps_mode=args.mps, **drv.memory_per_rank(args, 8, cap))
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
        sizes = [s for s in sizes if s <= _CPU_MAX_BYTES]  # default range, trimmed for Python
    bad = [s for s in sizes if s % 4 or s < 8]
    if bad:
        raise ConfigError(f"--sizes: {drv.format_bytes(bad[0])} is not a multiple of 4 bytes >= 8 (uint32 vectors)")
    if args.trace and _TRACE_SIZE not in sizes:
        sizes.append(_TRACE_SIZE)
    return sizes


def _run(world: Any, args: argparse.Namespace) -> int:
    if world.size != 2:
        raise ConfigError(f"allreduce-like runs on exactly 2 ranks (A and B), this job has {world.size}")
    backend = world.backend.name  # for labels only
    on_device = world.backend.runs_kernels
    sizes = _sizes(args, on_device)
    iters = 3 if args.quick else args.iters
    warmup = 1 if args.quick else args.warmup
    results = drv.Results(BENCHMARK, world)
    from .. import probe

    drv.progress("probe: the floor")
    results.floor = probe.measure(world, quick=bool(args.quick or not on_device))
    Impl = CudaPipeline if on_device else CpuPipeline
    impl = Impl(world, max(sizes))
    try:
        for nbytes in sizes:
            drv.progress(f"allreduce-like {drv.format_bytes(nbytes)}")
            row = impl.measure(nbytes, iters, warmup)
            if world.rank == 0:
                results.add(impl="channel", bytes=nbytes, **row)
        if args.trace:
            _trace(world, impl, args, results)
    finally:
        impl.close()
    pp = _pingpong_same_run(world, sizes, iters, warmup)
    if world.rank == 0:
        results.meta.update(impl.describe())
        results.meta["definitions"] = "latency=(t1-t0)/2, time=(t1-t0)/2+(t2-t1), best of iters (pingpong's)"
        results.meta["pingpong"] = pp

        def text() -> None:
            drv.print_table(results.rows, ["impl", "bytes", "latency_us", "time_us", "throughput_GBps"],
                            f"allreduce-like ({backend}, {results.device})", args)
            _print_summary(results, pp)

        drv.finish(results, args, text, lambda path: drv.plot(results.rows, "bytes", "throughput_GBps", "impl", path,
                                                              "allreduce-like throughput", "message size", "GB/s"))
    return 0


def _trace(world: Any, impl: Any, args: argparse.Namespace, results: drv.Results) -> None:
    """Run 32 KiB with the tracer on, write the JSON and PNG, report B's overlap and the overhead."""
    from ..trace import Tracer

    tracer = Tracer(world, capacity=1 << 16)
    # cpu: one traced pass, so the waveform shows one pass of the pipeline (the untraced row of
    # the same size already warmed everything up). kernels (cuda): the two processes' kernels start at
    # different times, so as for the untraced rows a few repetitions run in one launch and the
    # best counts; the waveform then shows all of them.
    cuda = world.backend.runs_kernels
    iters, warmup = (3, 2) if cuda else (1, 0)
    config = {"pairs": _TRACE_PAIRS, "chunk_bytes": _TRACE_CHUNK_BYTES} if cuda else {}
    # The overhead compares like with like: the same config untraced, then traced.
    untraced_cfg = impl.measure(_TRACE_SIZE, iters, warmup, **config) if cuda else None
    traced = impl.measure(_TRACE_SIZE, iters, warmup, tracer=tracer, **config)
    trace = tracer.collect()
    tracer.close()
    if world.rank != 0:
        return
    base, _ = os.path.splitext(args.trace)
    json_path = trace.export_chrome(args.trace, about={"benchmark": "allreduce-like trace", "device": results.device,
                                                       "commit": results.commit, "date": results.date})
    png_path = trace.plot_waveform(base + ".png", title=f"allreduce-like {drv.format_bytes(_TRACE_SIZE)}: "
                                   "A sends, B receives + adds + sends, A receives")
    overlap = trace.overlap_fraction(1, "recv", "send")
    untraced = untraced_cfg or next((r for r in results.rows if r["bytes"] == _TRACE_SIZE), None)
    overhead = None
    if untraced and untraced.get("time_us"):
        overhead = traced["time_us"] / untraced["time_us"] - 1.0
    results.meta["trace"] = {
        "bytes": _TRACE_SIZE, "json": json_path, "png": png_path, "overlap_fraction_B": overlap,
        "time_us_traced": traced["time_us"], "time_us_untraced": untraced and untraced["time_us"],
        "tracer_overhead": overhead, "dropped": trace.meta.dropped,
        "clock_residual_ns": trace.meta.residual_ns(1), "timer_tick_ns": trace.meta.tick(1),
        "config": config or "the table's",
    }
    print(f"trace: {json_path}, waveform: {png_path}")
    print(f"overlap fraction of B's receiving and sending ({drv.format_bytes(_TRACE_SIZE)} run): {overlap:.3f} "
          f"= {overlap:.1%} of its communication time (clock alignment within "
          f"{trace.meta.residual_ns(1) / 1000:.2f} us, timer tick {trace.meta.tick(1)} ns)")
    if overhead is not None:
        print(f"tracer overhead at {drv.format_bytes(_TRACE_SIZE)}: {overhead:+.1%} of the untraced time")


def _pingpong_same_run(world: Any, sizes: list[int], iters: int, warmup: int) -> dict | None:
    """Collective: the channel it is built on, measured now, in this run, with the pingpong and stream
    benchmarks' own code: the pingpong's smallest one-way time (one warp, low-latency packets, at this
    run's smallest size) and the one-way streaming peak (at its largest size)."""
    from .pingpong import GRID_MIN, WARP_MAX, ChannelPair
    from .stream import _measure as stream_measure

    small, large = min(sizes), max(sizes)
    drv.progress(f"allreduce-like: channel pingpong at {drv.format_bytes(small)} and one-way streaming at "
                 f"{drv.format_bytes(large)} (same run)")
    pair = ChannelPair(world, [small, large], stream=True)
    try:
        form = "warp" if world.backend.runs_kernels else "host"
        ping = pair.measure("default", form, min(small, WARP_MAX), max(iters, 5), warmup)
        streams = []
        if large <= WARP_MAX or not world.backend.runs_kernels:
            streams.append(stream_measure(pair, "default", "warp", large, max(3, iters // 4), 1))
        if world.backend.runs_kernels and large >= GRID_MIN:
            for config, cfg in pair.configs.items():
                if config.startswith("grid") and large <= cfg["max"]:
                    streams.append(stream_measure(pair, config, "grid", large, max(3, iters // 4), 1))
    finally:
        pair.close()
    if world.rank != 0:
        return None
    streams = [r for r in streams if r]
    return {"measured": "in this run", "sizes": sorted({small, large}),
            "min_latency_us": ping["one_way_us"], "min_sample_latency_us": ping["min_one_way_us"],
            "peak_throughput_GBps": max(r["throughput_GBps"] for r in streams)}


def _print_summary(results: drv.Results, pp: dict | None) -> None:
    rows = [r for r in results.rows if "skipped" not in r]
    if not rows:
        return
    min_lat = min(r["latency_us"] for r in rows)
    peak = max(r["throughput_GBps"] for r in rows)
    results.meta["min_latency_us"] = min_lat
    results.meta["peak_throughput_GBps"] = peak
    line = f"allreduce-like: min latency {min_lat:.3f} us, peak throughput {peak:.2f} GB/s"
    if pp:
        line += (f"; in this run, channel pingpong one-way {pp['min_latency_us']:.3f} us (median), "
                 f"one-way streaming peak {pp['peak_throughput_GBps']:.2f} GB/s")
        if pp.get("peak_throughput_GBps"):
            ratio = peak / pp["peak_throughput_GBps"]
            results.meta["peak_vs_pingpong"] = ratio
            line += f" (peak ratio {ratio:.3f}; target >= 0.95)"
        if pp.get("min_latency_us"):
            lat_ratio = min_lat / pp["min_latency_us"]
            results.meta["latency_vs_pingpong"] = lat_ratio
            line += f"; min latency ratio {lat_ratio:.2f} (target <= 2.5)"
    print(line)


# -- the cpu reference ---------------------------------------------------------------------------
class CpuPipeline:
    """A and B over two uint32 channels, through the channels' Python API."""

    def __init__(self, world: Any, max_bytes: int) -> None:
        from ..channels import open as open_channels
        from ..spec.model import Link, element_type

        self.world = world
        uint = element_type("uint")
        self.max_piece = _CPU_DEPTH_ELEMS // 2  # half a ring: see collectives/_algorithms.py
        links = [
            Link(name="a_to_b", receiver_name="b_from_a", send_id=1, recv_id=2, src_rank=0, dst_rank=1,
                 element=uint, depth=_CPU_DEPTH_ELEMS),
            Link(name="b_to_a", receiver_name="a_from_b", send_id=3, recv_id=4, src_rank=1, dst_rank=0,
                 element=uint, depth=_CPU_DEPTH_ELEMS),
        ]
        self.channels = open_channels(world, links)
        self.rng = np.random.default_rng()

    def describe(self) -> dict:
        return {"impl": "cpu reference (channels' Python API)", "max_piece_elements": self.max_piece,
                "depth_elements": _CPU_DEPTH_ELEMS}

    def _piece(self, n: int) -> int:
        # A stream of at least ~16 pieces, so that B is receiving piece k+1 while piece k goes
        # back (the pipeline the trace shows); no piece over half a ring (flow control).
        return int(min(self.max_piece, max(256, n // 16)))

    def _vectors(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        # Fresh random data every size; both ranks know both vectors from one shared seed, so A
        # can check B's sum without another transfer.
        seed = self.world.broadcast_object(int(self.rng.integers(1 << 62)))
        g = np.random.default_rng(seed)
        return g.integers(0, 1 << 32, size=n, dtype=np.uint32), g.integers(0, 1 << 32, size=n, dtype=np.uint32)

    def measure(self, nbytes: int, iters: int, warmup: int, tracer: Any = None) -> dict:
        n = nbytes // 4
        a_vec, b_vec = self._vectors(n)
        best = None
        for it in range(warmup + iters):
            self.world.barrier()
            if self.world.rank == 0:
                t0, t1, t2, got = self._run_a(a_vec, tracer)
                want = a_vec + b_vec  # uint32 wraps, as on the device
                if not np.array_equal(got, want):
                    bad = int(np.flatnonzero(got != want)[0])
                    raise ChannelError(f"allreduce-like {nbytes} B: element {bad} is {int(got[bad])}, "
                                      f"expected {int(want[bad])} (iteration {it})")
                if it >= warmup:
                    lat = (t1 - t0) / 2
                    t = lat + (t2 - t1)
                    if best is None or t < best[1]:
                        best = (lat, t)
            else:
                self._run_b(b_vec, tracer)
        if self.world.rank != 0:
            return {}
        lat_ns, t_ns = best
        return {"latency_us": lat_ns / 1e3, "time_us": t_ns / 1e3, "throughput_GBps": nbytes / t_ns}

    def _run_a(self, a_vec: np.ndarray, tracer: Any) -> tuple[int, int, int, np.ndarray]:
        from ..trace import RECV, SEND

        tx, rx = self.channels["a_to_b"], self.channels["a_from_b"]
        n, piece = len(a_vec), self._piece(len(a_vec))
        out = np.empty(n, dtype=np.uint32)
        clock = time.perf_counter_ns
        t0 = clock()
        t1 = None
        sent = got = 0
        while got < n:
            if sent < n:
                k = min(piece, n - sent)
                tx.write(a_vec[sent:sent + k])
                tx.flush()
                if tracer:
                    tracer.instant(SEND, 1)
                sent += k
            # Keep one piece in flight: read the previous piece once the next has gone.
            if got < sent - (piece if sent < n else 0):
                k = min(piece, sent - got)
                if t1 is None:  # the first element alone: t1 is when it is back
                    out[0] = rx.read(1)[0]
                    t1 = clock()
                    got, k = 1, k - 1
                if k:
                    out[got:got + k] = rx.read(k)
                if tracer:
                    tracer.instant(RECV, 4)
                got += k
        t2 = clock()
        return t0, t1, t2, out

    def _run_b(self, b_vec: np.ndarray, tracer: Any) -> None:
        from ..trace import COMPUTE, RECV, SEND

        rx, tx = self.channels["b_from_a"], self.channels["b_to_a"]
        n, piece = len(b_vec), self._piece(len(b_vec))
        done = 0
        while done < n:
            k = min(piece, n - done)
            chunk = rx.read(k)
            if tracer:
                tracer.instant(RECV, 2)
                tracer.begin(COMPUTE)
            chunk = chunk + b_vec[done:done + k]  # the computation fused into the stream
            if tracer:
                tracer.end(COMPUTE)
            tx.write(chunk)
            tx.flush()
            if tracer:
                tracer.instant(SEND, 3)
            done += k

    def close(self) -> None:
        self.channels.close()


# -- cuda: one fused kernel per rank (bench/kernels/allreduce_like.cu) ------------------------------
KERNELS = Path(__file__).parent / "kernels" / "allreduce_like.cu"

_LL_MAX_BYTES = 1 << 10  # up to here one low-latency pair (LL reads poll 240 B per round: slow beyond)
_LL_DEPTH_BYTES = 16 << 10
_BW_PAIRS = 48  # G: channel pairs; A runs 2G blocks (writers + readers), B G blocks (read, add, write)
_BW_CHUNK_BYTES = 64 << 10  # one bandwidth-mode packet per write call
_BW_RING_BYTES = 1 << 20  # per channel: 16 chunks in flight
_THREADS = 512


class CudaPipeline:
    """A and B as one fused kernel each, over channel pairs opened once for every size."""

    def __init__(self, world: Any, max_bytes: int) -> None:
        import cupy as cp

        from .. import compile as compile_device
        from ..channels import open as open_channels
        from ..spec.model import Link, element_type

        self.cp = cp
        self.world = world
        self.stream = world.backend.stream
        uint = element_type("uint")
        links = []
        ids = iter(range(1, 4 * (_BW_PAIRS + 1) + 1))
        # "ll" pair: a 16 KiB ring (auto mode picks LL up to 64 KiB); "bw" pairs: 1 MiB rings (BW).
        for name, depth, count in (("ll", _LL_DEPTH_BYTES // 4, 1), ("bw", _BW_RING_BYTES // 4, _BW_PAIRS)):
            for g in range(count):
                links.append(Link(f"{name}_ab{g}", f"{name}_ab{g}.in", next(ids), next(ids), 0, 1, uint, depth))
                links.append(Link(f"{name}_ba{g}", f"{name}_ba{g}.in", next(ids), next(ids), 1, 0, uint, depth))
        self.channels = open_channels(world, links)
        me = world.rank
        self.handles = {}
        for name, count in (("ll", 1), ("bw", _BW_PAIRS)):
            if me == 0:
                out_names = [f"{name}_ab{g}" for g in range(count)]
                in_names = [f"{name}_ba{g}.in" for g in range(count)]
            else:
                out_names = [f"{name}_ba{g}" for g in range(count)]
                in_names = [f"{name}_ab{g}.in" for g in range(count)]
            self.handles[name] = (self._handle_array(out_names), self._handle_array(in_names), count)
        self.module = compile_device(KERNELS.read_text())
        self._max_pairs = self._budget_pairs()
        n = max_bytes // 4
        self.mine = cp.zeros(n, dtype=cp.uint32)  # a on A, b on B
        self.check = cp.zeros(n if me == 0 else 1, dtype=cp.uint32)  # B's vector, on A, to verify
        self.scratch = cp.zeros(n, dtype=cp.uint32)  # A: the sums; B: the stream being added to
        self.times = None
        self.mismatches = cp.zeros(1, dtype=cp.uint64)
        self.bar = cp.zeros(2, dtype=cp.uint32)
        self.failed = cp.zeros(1, dtype=cp.int32)
        self.timeout_ns = np.uint64(self.channels.device_timeout_ns)
        self.rng = np.random.default_rng()

    def _handle_array(self, names: list[str]):
        raw = b"".join(self.channels[nm].device_handle().tobytes() for nm in names)
        return self.cp.asarray(np.frombuffer(raw, dtype=np.uint8))

    def describe(self) -> dict:
        return {"impl": "fused kernels on the channel device API",
                "ll": {"pairs": 1, "max_bytes": _LL_MAX_BYTES, "threads": _THREADS},
                "bw": {"pairs": _BW_PAIRS, "chunk_bytes": _BW_CHUNK_BYTES, "ring_bytes": _BW_RING_BYTES,
                       "blocks_A": 2 * _BW_PAIRS, "blocks_B": _BW_PAIRS, "threads": _THREADS}}

    def measure(self, nbytes: int, iters: int, warmup: int, tracer: Any = None, pairs: int | None = None,
                chunk_bytes: int | None = None) -> dict:
        """One size, ``warmup + iters`` repetitions in one launch. ``pairs`` / ``chunk_bytes``
        override the bandwidth-mode config (the traced run uses several chunks per block)."""
        cp, w = self.cp, self.world
        from ..trace import Tracer

        n = nbytes // 4
        # Fresh random vectors per size from shared seeds: A rebuilds b to check the sums without
        # another transfer (numpy's generator: the same numbers on every rank by definition).
        seed = w.broadcast_object(int(self.rng.integers(1 << 62)))
        b_vec = np.random.default_rng(seed + 1).integers(0, 1 << 32, size=n, dtype=np.uint32)
        if w.rank == 0:
            self.mine[:n].set(np.random.default_rng(seed).integers(0, 1 << 32, size=n, dtype=np.uint32))
            self.check[:n].set(b_vec)
        else:
            self.mine[:n].set(b_vec)
        self.scratch[:n] = 0
        reps = warmup + iters
        self.times = cp.zeros(3 * reps, dtype=cp.uint64)
        self.mismatches.fill(0)
        self.failed.fill(0)
        self.bar.fill(0)
        ll = nbytes <= _LL_MAX_BYTES
        out_h, in_h, count = self.handles["ll" if ll else "bw"]
        # The kernels use pairs 0..G-1 of the handle arrays, so any G up to the pairs opened works.
        if ll or pairs is None:
            pairs = count
        elif not 1 <= pairs <= count:
            raise ConfigError(f"allreduce-like: pairs={pairs} must be in 1..{count}")
        if ll or chunk_bytes is None:
            chunk = np.uint64(n if ll else _BW_CHUNK_BYTES // 4)
        elif chunk_bytes % 16 or not 16 <= chunk_bytes <= _BW_CHUNK_BYTES:
            raise ConfigError(f"allreduce-like: chunk_bytes={chunk_bytes} must be a multiple of 16 in "
                              f"16..{_BW_CHUNK_BYTES}")  # 16 B keeps every chunk vector-aligned
        else:
            chunk = np.uint64(chunk_bytes // 4)
        # A's 2G blocks meet in a grid barrier and B's G blocks wait on A: each side must fit in its
        # rank's SM share at once (the forward-progress rule), or the pipeline stalls (the MPS hang).
        pairs = min(pairs, self.max_pairs())
        trace = tracer.device_handle() if tracer is not None else Tracer.null_handle()
        w.backend.after_caller()  # the inputs were set on the caller's stream
        w.barrier()
        if w.rank == 0:
            fn = self.module.get_function("ar_like_a")
            fn((2 * pairs,), (_THREADS,), (out_h, in_h, np.uint32(pairs), self.mine, self.check, self.scratch,
               np.uint64(n), chunk, np.uint32(reps), self.times, self.mismatches, self.bar, self.timeout_ns,
               trace, self.failed), stream=self.stream)
        else:
            fn = self.module.get_function("ar_like_b")
            fn((pairs,), (_THREADS,), (in_h, out_h, np.uint32(pairs), self.mine, self.scratch, np.uint64(n), chunk,
               np.uint32(reps), trace, self.failed), stream=self.stream)
        # Bounded; a channel whose device wait timed out is named by the ChannelError this raises.
        self.channels.wait_kernel(self.stream, lambda: f"allreduce-like {nbytes} B on rank {w.rank}")
        failed = int(self.failed.get()[0])
        if failed:
            raise ChannelError(f"allreduce-like {nbytes} B: rank {w.rank}'s kernel failed (code {failed}: "
                              "2 = a write, 3 = a read gave up; see the channel error above)")
        w.barrier()
        if w.rank != 0:
            return {}
        bad = int(self.mismatches.get()[0])
        if bad:
            raise ChannelError(f"allreduce-like {nbytes} B: {bad} elements of the sum are wrong")
        t = self.times.get().astype(np.int64).reshape(reps, 3)[warmup:]
        lat = (t[:, 1] - t[:, 0]) / 2
        total = lat + (t[:, 2] - t[:, 1])
        k = int(np.argmin(total))
        return {"latency_us": float(lat.min()) / 1e3, "time_us": float(total[k]) / 1e3,
                "throughput_GBps": nbytes / float(total[k]), "pairs": pairs, "chunk_bytes": int(chunk) * 4,
                "verified": True}

    def max_pairs(self) -> int:
        """The most channel pairs whose blocks fit the SM budget of both ranks (A runs 2 per pair, B one)."""
        return self._max_pairs

    def _budget_pairs(self) -> int:
        """Collective: A's and B's answers agree, so both launch the same number of pairs."""
        backend = self.world.backend
        a = backend.max_blocks(self.module.get_function("ar_like_a"), _THREADS) // 2
        b = backend.max_blocks(self.module.get_function("ar_like_b"), _THREADS)
        return max(1, min(self.world.allgather_object(a if self.world.rank == 0 else b)))

    def close(self) -> None:
        self.channels.close()

