"""Latency and throughput by hop count over a declared topology: ``circuslink bench hops`` (CIRCUS, Fig. 13).

The ranks form a topology (``line:N`` by default; ``--topology torus:4x4`` for CIRCUS's torus) and open, on
it, channels from rank 0 to every other rank d and back. A neighbour of rank 0 is one hop away and its
channels are direct; any other rank is reached through the forwarding agents of the ranks between (routed
channels, docs/routing.md). For each d:

* one-way latency: a pingpong of ``--latency-bytes`` over loops of many round trips in one launch (rank 0
  writes, rank d passes the packets straight back from its ring), the same kernels and sampling as
  ``bench pingpong``: ``one_way_us`` is the median over samples of loop time / (2 x round trips), the
  fastest sample beside it;
* one-way streaming throughput: rank 0 writes messages of each ``--sizes`` size back to back, rank d reads
  them (checking the bytes) and acknowledges, as ``bench stream`` does.

``hops`` is the route's length from rank 0 to d (the way back has the same length on lines and tori).
The summary fits one-way latency against hops by least squares: ``per_hop_us`` (the slope: what a hop
adds), compared with the relaxed store+poll floor of ``circuslink probe`` measured in the same run; and
the throughput at the most hops over that at 1 hop, per message size (1 MiB and 16 MiB by default). Targets
(reported, never asserted): added latency per hop <= 1.25 x the relaxed floor, throughput at the most hops (7
on line:8, 4 on torus:4x4) >= 0.9 x 1 hop at every size.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np

from .._argtypes import positive_int
from ..errors import ChannelError, ConfigError
from . import _driver as drv
from .pingpong import (
    GRID_THREADS,
    KERNELS,
    SAMPLE_TARGET_S,
    cpu_round_trips,
    device_round_trips,
    floor_pair,
)
from .stream import MAX_MESSAGES, MIN_BYTES_PER_SAMPLE, cpu_stream, device_stream

CPU_MAX = 256 << 10  # the cpu reference's largest streamed message (its agents are Python threads)
GPU_CHUNK = 64 << 10  # bulk packets of the streaming channels on a GPU
GPU_STREAM_SLOTS = 32  # their rings: 2 MiB, the end-to-end window a 7-hop route needs to stay busy
CPU_CHUNK = 4 << 10
CPU_STREAM_SLOTS = 8
LATENCY_RING = 8192


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="1M,16M", default_iters=10, default_warmup=2)
    for action in parser._actions:  # -n follows the topology unless given
        if action.dest == "nranks":
            action.default = None
            action.help = "ranks to start when not already inside a job (default: the topology's size, else 8)"
    parser.add_argument("--topology", default=None,
                        help="the network the ranks form: line:N (default, N = the rank count), ring:N, mesh:XxY, "
                        "torus:XxY or a topology file (docs/routing.md); rank 0 measures to every other rank. "
                        "-n defaults to its size")
    parser.add_argument("--vcs", type=int, default=None,
                        help="virtual channels (default: the topology's: 2 with datelines on rings and tori)")
    parser.add_argument("--latency-bytes", dest="latency_bytes", type=positive_int, default=8,
                        help="bytes of each pingpong message (default 8: the latency path)")
    parser.add_argument("--link-slots", dest="link_slots", type=positive_int, default=None,
                        help="packets each link ring holds (a power of two; default 8)")


def run(args: argparse.Namespace) -> int:
    from ..launcher import inside_job, relaunch_self

    drv.parse_sizes(args.sizes)
    topo = _topology(args.topology) if args.topology else None
    if not inside_job():
        n = args.nranks or (topo.size if topo is not None else 8)
        if topo is not None:
            topo.check_nranks(n)
        return relaunch_self(n, args.backend, mps_mode=args.mps, **drv.memory_per_rank(args, 8))
    import circuslink

    world = circuslink.init(args.backend)
    if world.size < 2:
        raise ConfigError("bench hops needs at least 2 ranks (rank 0 measures to every other rank)")
    topo = topo or _topology(f"line:{world.size}")
    topo.check_nranks(world.size)
    sizes, samples, warmup = drv.sizes_and_counts(args, quick_sizes="64K", quick_iters=3, quick_warmup=1)
    if not world.backend.runs_kernels:
        dropped = [s for s in sizes if s > CPU_MAX]
        sizes = [s for s in sizes if s <= CPU_MAX] or [min(CPU_MAX, min(sizes))]
        if dropped:
            drv.progress(f"hops: the cpu reference streams at most {drv.format_bytes(CPU_MAX)}; "
                         f"skipping {len(dropped)} larger size(s)")
    results = drv.Results("hops", world)
    from .. import probe

    drv.progress("hops: measuring the floor (circuslink.probe)")
    results.floor = probe.measure(world, quick=True, pairs=[(0, 1)])
    bench = HopChannels(world, topo, args.vcs, sizes, args.latency_bytes, args.link_slots)
    routing = bench.channels.router.routing if bench.channels.router else topo.routing(args.vcs)
    results.meta.update(topology=topo.name, vcs=routing.vcs, vc_scheme=routing.scheme, algorithm=routing.algorithm,
                        latency_bytes=args.latency_bytes, samples=samples, warmup=warmup,
                        sample_target_s=SAMPLE_TARGET_S, agent=_agent_text(bench.channels),
                        definitions="one_way_us: median over samples of (loop time / 2 x round trips); "
                                    "throughput_GBps: messages x bytes / (first write .. acknowledgement), median; "
                                    "per_hop_us: least-squares slope of one_way_us against hops")
    try:
        for dst in range(1, world.size):
            hops = int(routing.hops[0, dst])
            drv.progress(f"hops: rank 0 -> {dst} ({hops} hop{'s' if hops != 1 else ''})")
            row = bench.latency(dst, samples, warmup)
            if row:
                results.add(**row)
            for nbytes in sizes:
                row = bench.throughput(dst, nbytes, samples, warmup)
                if row:
                    results.add(**row)
        results.meta["resources"] = {"symmetric_bytes_per_rank": bench.channels.nbytes,
                                     "routed_channels": len(bench.channels.router.routed)
                                     if bench.channels.router else 0}
    finally:
        bench.close()
    if world.rank == 0:
        report(results, args)
    world.close()
    return 0


def _agent_text(channels: Any) -> str:
    router = getattr(channels, "_router", None)
    if router is None or not hasattr(router, "ncopy"):
        return "one thread per rank"
    return (f"a resident grid per rank: a routing block (a warp per input) and {router.ncopy} copy block(s) "
            f"({router.sms} SM(s) of the rank's share)")


def _topology(text: str) -> Any:
    from .. import topology

    return topology.parse(text)


class HopChannels:
    """Channels from rank 0 to every other rank and back, opened on the topology: per rank d, a pingpong pair
    (``ping{d}`` 0 -> d, ``pong{d}`` d -> 0), a streaming channel (``data{d}``) and its acknowledgement
    (``ack{d}``)."""

    def __init__(self, world: Any, topo: Any, vcs: int | None, sizes: list[int], latency_bytes: int,
                 link_slots: int | None) -> None:
        from .. import compile as compile_device
        from ..channels import Link, element_type
        from ..channels import open as open_channels

        self.world = world
        self.gpu = world.backend.runs_kernels
        self.latency_bytes = latency_bytes
        byte = element_type("uchar")
        chunk, slots = (GPU_CHUNK, GPU_STREAM_SLOTS) if self.gpu else (CPU_CHUNK, CPU_STREAM_SLOTS)
        links, options, k = [], {}, 0
        for d in range(1, world.size):
            ring = max(LATENCY_RING, latency_bytes)
            for name, a, b, depth, opts in (
                    (f"ping{d}", 0, d, ring, {}), (f"pong{d}", d, 0, ring, {}),
                    (f"data{d}", 0, d, chunk * slots, {"chunk": chunk, "nslots": slots, "ll_max": 0}),
                    (f"ack{d}", d, 0, 64, {})):
                links.append(Link(name, f"{name}_in", k, k + 1, a, b, byte, depth))
                options[name] = opts
                k += 2
        self.channels = open_channels(world, links, options=options, topology=topo, vcs=vcs, link_slots=link_slots)
        self.topology = topo
        self._module = compile_device(KERNELS.read_text()) if self.gpu else None
        self.stream_blocks = 1
        if self.gpu:
            most = self.channels.max_blocks(self._module.get_function("stream_grid"), GRID_THREADS)
            self.stream_blocks = max(1, min(world.allgather_object(most)))

    def close(self) -> None:
        self.channels.close()

    def _route(self, name: str) -> list[int]:
        link = self.channels.spec.link(name)
        return self.channels.route(name) or [link.src_rank, link.dst_rank]

    # -- latency ---------------------------------------------------------------------------------------
    def latency(self, d: int, samples: int, warmup: int) -> dict | None:
        """Pingpong between ranks 0 and d (collective: the other ranks take part in the agreements only)."""
        world, ch = self.world, self.channels
        world.barrier()
        role = 0 if world.rank == 0 else 1 if world.rank == d else None
        n = self.latency_bytes
        label = f"hops latency 0 -> {d}"
        if role == 0:
            tx, rx = ch[f"ping{d}"], ch[f"pong{d}_in"]
        elif role == 1:
            tx, rx = ch[f"pong{d}"], ch[f"ping{d}_in"]
        trial = self._round_trips(role, tx, rx, n, 4, warmup, label)[0] if role is not None else 0.0
        guess = int(SAMPLE_TARGET_S / max(trial / 4, 1e-9)) if world.rank == 0 else 0
        trips = int(world.broadcast_object(max(4, min(guess, 2000 if self.gpu else 50)) if world.rank == 0 else None))
        times, ok = [], True
        if role is not None:
            for _ in range(samples):
                t, good = self._round_trips(role, tx, rx, n, trips, warmup, label)
                times.append(t)
                ok = ok and good
        if not all(world.allgather_object(ok)):
            raise ChannelError(f"{label}: the bytes that came back differ from the bytes sent")
        if role != 0:
            return None
        one_way = [t / (2 * trips) for t in times]
        med = statistics.median(one_way)
        route = self._route(f"ping{d}")
        return dict(impl="latency", dst=d, hops=len(route) - 1, hops_back=len(self._route(f"pong{d}")) - 1,
                    route=route, direct=len(route) == 2, bytes=n, one_way_us=med * 1e6,
                    min_one_way_us=min(one_way) * 1e6, samples=samples, round_trips=trips, verified=True,
                    form="warp" if self.gpu else "host")

    def _round_trips(self, role: int, tx: Any, rx: Any, n: int, trips: int, warmup: int, label: str):
        if not self.gpu:
            return cpu_round_trips(tx, rx, n, trips, echo=role == 1)
        return device_round_trips(self.world, self._module, "warp", tx, rx, n, role, warmup, trips, 1, label)

    # -- throughput ------------------------------------------------------------------------------------
    def throughput(self, d: int, nbytes: int, samples: int, warmup: int) -> dict | None:
        """Rank 0 streams to rank d (collective: the other ranks take part in the verdict only)."""
        world = self.world
        world.barrier()
        role = 0 if world.rank == 0 else 1 if world.rank == d else None
        messages = max(4, min(MAX_MESSAGES, -(-MIN_BYTES_PER_SAMPLE // nbytes)))
        if not self.gpu:
            messages = max(2, min(16, (4 << 20) // nbytes))
        label = f"hops stream 0 -> {d} {drv.format_bytes(nbytes)}"
        chunk = GPU_CHUNK if self.gpu else CPU_CHUNK
        packets = -(-nbytes // chunk)
        blocks = max(1, min(self.stream_blocks, -(-packets // (GRID_THREADS // 32))))  # a warp per packet
        times, ok = [], True
        if role is not None:
            for i in range(warmup + samples):
                t, good = self._stream(role, d, nbytes, messages, i, blocks, label)
                ok = ok and good
                if i >= warmup:
                    times.append(t)
        if not all(world.allgather_object(ok)):
            raise ChannelError(f"{label}: rank {d} received wrong bytes")
        if role != 0:
            return None
        med = statistics.median(times)
        route = self._route(f"data{d}")
        return dict(impl="throughput", dst=d, hops=len(route) - 1, route=route, direct=len(route) == 2,
                    bytes=nbytes, messages=messages, throughput_GBps=messages * nbytes / med / 1e9,
                    max_throughput_GBps=messages * nbytes / min(times) / 1e9, one_way_us=med / messages * 1e6,
                    samples=samples, verified=True, form="grid" if self.gpu else "host",
                    blocks=blocks if self.gpu else 0)

    def _stream(self, role: int, d: int, nbytes: int, messages: int, seed: int, blocks: int, label: str):
        ch = self.channels
        if not self.gpu:
            if role == 0:
                return cpu_stream(ch[f"data{d}"], ch[f"ack{d}_in"], nbytes, messages, seed, sender=True)
            return cpu_stream(ch[f"data{d}_in"], ch[f"ack{d}"], nbytes, messages, seed, sender=False)
        if role == 0:  # the ends a role does not use are placeholders of the right kind
            send, recv, ack_s, ack_r = ch[f"data{d}"], ch[f"ack{d}_in"], ch[f"data{d}"], ch[f"ack{d}_in"]
        else:
            send, recv, ack_s, ack_r = ch[f"ack{d}"], ch[f"data{d}_in"], ch[f"ack{d}"], ch[f"data{d}_in"]
        return device_stream(self.world, self._module, "grid", send, recv, ack_s, ack_r, nbytes, role, messages,
                             seed, blocks, label)


# -- the summary -------------------------------------------------------------------------------------------
def fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) of y against x; None without two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def summary(results: drv.Results) -> dict:
    """per_hop_us and the throughput ratio, against this run's floor (the targets, as ratios)."""
    floor = floor_pair(results)
    relaxed = floor.get("lat_relaxed_us")
    lat = [r for r in results.rows if r["impl"] == "latency"]
    out: dict[str, Any] = {"lines": []}
    line = fit([(r["hops"], r["one_way_us"]) for r in lat])
    if line:
        out["per_hop_us"], out["intercept_us"] = line
        text = f"added latency per hop: {line[0]:.3f} us (least-squares slope over {len(lat)} destinations)"
        if relaxed:
            out["per_hop_vs_floor"] = line[0] / relaxed
            text += f" = {line[0] / relaxed:.2f} x the relaxed store+poll floor {relaxed:.3f} us (goal <= 1.25)"
        out["lines"].append(text)
    routed = fit([(r["hops"], r["one_way_us"]) for r in lat if not r["direct"]])
    if routed:
        out["per_hop_routed_us"] = routed[0]
        out["lines"].append(f"added latency per forwarding hop (routed destinations only): {routed[0]:.3f} us")
    thr = [r for r in results.rows if r["impl"] == "throughput"]
    ratios = {}
    for size in sorted({r["bytes"] for r in thr}):
        by_hops: dict[int, list[float]] = {}
        for r in thr:
            if r["bytes"] == size:
                by_hops.setdefault(r["hops"], []).append(r["throughput_GBps"])
        most = max(by_hops)
        if 1 in by_hops and most > 1:
            one, far = statistics.median(by_hops[1]), statistics.median(by_hops[most])
            ratios[drv.format_bytes(size)] = far / one
            out["throughput_hops"] = most
            out["lines"].append(f"throughput at {most} hops {far:.2f} GB/s = {far / one:.2f} x 1 hop ({one:.2f} GB/s), "
                                f"{drv.format_bytes(size)} messages (goal >= 0.9)")
    if ratios:
        out["throughput_ratios"] = ratios
        out["throughput_ratio"] = min(ratios.values())  # the worst size: the verdict
    return out


def report(results: drv.Results, args: argparse.Namespace) -> None:
    rows = sorted(results.rows, key=lambda r: (r["impl"], r["hops"], r["dst"], r["bytes"]))
    out: dict = {}

    def text() -> None:
        drv.print_table([r for r in rows if r["impl"] == "latency"],
                        ["dst", "hops", "bytes", "one_way_us", "min_one_way_us", "round_trips"],
                        f"hops on {results.meta['topology']} ({results.device}, {results.backend}): one-way latency, "
                        f"median of {results.meta['samples']} samples", args)
        drv.print_table([r for r in rows if r["impl"] == "throughput"],
                        ["dst", "hops", "bytes", "messages", "throughput_GBps", "max_throughput_GBps"],
                        "one-way streaming throughput by hops", args)
        out.update(summary(results))
        results.meta["targets"] = out
        for line in out["lines"]:
            print(line)

    def draw(path: str) -> None:
        floor = floor_pair(results).get("lat_relaxed_us")
        lat = [dict(r, impl=f"one-way latency ({results.meta['topology']})") for r in rows if r["impl"] == "latency"]
        hops = sorted({r["hops"] for r in lat})
        extra = {"floor: hops x relaxed store+poll": [(h, h * floor) for h in hops]} if floor else None
        slope = f": {out['per_hop_us']:.3f} us per hop" if "per_hop_us" in out else ""
        thr = [dict(r, impl=f"{drv.format_bytes(r['bytes'])} messages") for r in rows if r["impl"] == "throughput"]
        drv.figure(path, [
            drv.panel(lat, "hops", "one_way_us", "impl", f"latency against hops on {results.meta['topology']}{slope}",
                      "hops", "one-way latency (us, median)", logx=False, logy=False, extra=extra),
            drv.panel(thr, "hops", "throughput_GBps", "impl",
                      f"one-way throughput against hops on {results.meta['topology']}", "hops", "GB/s (median)",
                      logx=False, logy=False)])

    drv.finish(results, args, text, draw)
