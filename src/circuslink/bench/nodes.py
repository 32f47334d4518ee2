"""Pingpong inside a node, across nodes over the engine, and the engine alone: ``circuslink bench nodes``.

The job is split into declared nodes on one machine (``--ranks-per-node K``; default two nodes), started
by mpirun since the engine between nodes is MPI. Between the gateways of node 0 and node 1 (their lowest
ranks, ``a`` and ``b``) it measures one-way time (loops of round trips; median over samples, the fastest
beside it) and throughput:

* ``mpi`` (``mpi-host-staged`` on cuda, as on the device image whose MPI is not CUDA-aware): the engine
  alone, MPI point-to-point between ``a`` and ``b`` (``bench/baselines/_mpi.py``);
* ``engine-link``: the engine link's pipe (``circuslink.links``): ``a``'s agent writes the message into its
  out ring, the proxies carry it over MPI into ``b``'s in ring, ``b``'s agent passes it back the same way.
  On cuda the agents are kernels (the pingpong kernels of ``bench pingpong`` on the rings' channel
  handles: one warp, or every warp of a co-resident grid), the rings pinned host memory; on cpu the agents
  are the ranks' host threads. ``added_us``: its one-way time minus MPI's, what the proxies add;
* ``intra-node``: a channel pingpong between ranks 0 and 1, inside node 0 (mapped memory: one hop);
* ``gateway-routed``: a routed channel (docs/routing.md) from a rank of node 0 to a rank of node 1 and one
  back, opened with ``channels.open(world, links, topology=<the job's nodes>)``: source -> its gateway (a
  mapped hop) -> the engine link -> the peer gateway, whose agent delivers into the destination's ring. The
  same pingpong as ``bench pingpong`` on the channels' ends (the host API on cpu; on cuda the pingpong
  kernels on the ends' device handles, the agents being the router kernels); the source and destination
  are the second rank of each node (the gateways themselves with one rank a node). ``added_us``: its
  one-way time minus (MPI + one intra-node hop) at the same size; the targets are ratios of that sum
  (latency <= 1.3 x) and of MPI's throughput (>= 0.9 x at 16 MiB and more).

The floor (``circuslink.probe``) of the same run covers the intra-node pair and, on one machine, the
gateways' pair as mapped memory would give it.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import numpy as np

from ..errors import ChannelError, ConfigError
from . import _driver as drv

CPU_MAX = 16 << 20  # the cpu reference's host agents stop here
TARGET_LATENCY_RATIO = 1.3  # routed latency <= 1.3 x (engine + one intra-node hop)
TARGET_THROUGHPUT_RATIO = 0.9  # ... and throughput >= 0.9 x the engine's at >= 16 MiB
BIG = 16 << 20
ROUTED_RING_MIN = 8192
ROUTED_RING_MAX = 16 << 20  # the routed rings hold a message up to here (the grid form needs it whole)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:64M", default_nranks=4, default_iters=10, default_warmup=2)
    parser.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                        help="declare nodes of K ranks on this machine (default: half the ranks: two nodes); the "
                             "gateways are the lowest rank of node 0 and of node 1")
    parser.add_argument("--nslots", type=int, default=None, metavar="S",
                        help="slots of each engine-link ring (default: enough for the largest message, at least 64)")
    parser.add_argument("--chunk", type=int, default=64 << 10, metavar="BYTES",
                        help="bulk packet size of the engine-link rings (default 65536)")


def run(args: argparse.Namespace) -> int:
    from ..launcher import inside_job, mpirun_available, relaunch_self

    drv.parse_sizes(args.sizes)
    k = args.ranks_per_node if args.ranks_per_node is not None else max(1, args.nranks // 2)
    if not inside_job():
        if not mpirun_available():
            raise ConfigError("bench nodes needs mpirun and mpi4py: the engine between nodes is MPI")
        if args.nranks // k < 2 or args.nranks % k:
            raise ConfigError(f"bench nodes needs at least 2 whole nodes: -n {args.nranks} with --ranks-per-node {k}")
        return relaunch_self(args.nranks, args.backend, prefer_mpirun=True, mps_mode=args.mps, ranks_per_node=k)
    import circuslink

    world = circuslink.init(args.backend)
    if world.mpi_comm is None:
        raise ConfigError("bench nodes needs a job started by mpirun (the engine between nodes is MPI)")
    if len(world.nodes) < 2:
        raise ConfigError(f"bench nodes needs at least 2 nodes; this job has {world.describe_nodes()} (declare them: "
                          "--ranks-per-node K, or CIRCUSLINK_RANKS_PER_NODE=K under mpirun)")
    sizes, samples, warmup = drv.sizes_and_counts(args, quick_sizes="8,4K,1M", quick_iters=3, quick_warmup=1)
    if not world.backend.runs_kernels:
        dropped = [s for s in sizes if s > CPU_MAX]
        sizes = [s for s in sizes if s <= CPU_MAX] or [min(sizes)]
        if dropped:
            drv.progress(f"nodes: the cpu reference stops at {drv.format_bytes(CPU_MAX)}; skipping {len(dropped)} "
                         "larger size(s)")
    a, b = world.nodes[0][0], world.nodes[1][0]
    results = drv.Results("nodes", world)
    results.meta.update(samples=samples, warmup=warmup, nodes=world.nodes, node_layout=world.describe_nodes(),
                        gateways=[a, b], intra_node_pair=[0, 1] if len(world.nodes[0]) > 1 else None,
                        definitions="one_way_us: median over samples of (loop time / 2 x round trips); "
                                    "min_one_way_us: the fastest sample; throughput_GBps: bytes / one_way_us; "
                                    "added_us: engine-link one-way minus mpi one-way at the same size")
    from .. import probe

    pairs = [(0, 1), (1, 0)] if len(world.nodes[0]) > 1 else []
    if world.nodes_declared:
        pairs.append((a, b))  # one machine: what mapped memory gives the gateways' pair
    drv.progress("nodes: measuring the floor (circuslink.probe)")
    results.floor = probe.measure(world, quick=args.quick, pairs=pairs or None)
    if not args.no_baselines:
        _engine_alone(world, results, sizes, samples, warmup, a, b)
    _engine_link(world, results, sizes, samples, warmup, a, b, args)
    if len(world.nodes[0]) > 1:
        _intra_node(world, results, sizes, samples, warmup)
    _gateway_routed(world, results, sizes, samples, warmup, args)
    if world.rank == 0:
        _added(results)
        report(results, args)
    world.close()
    return 0


# -- the engine alone ---------------------------------------------------------------------------------
def _engine_alone(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int, a: int,
                  b: int) -> None:
    from .baselines import mpi_pingpong

    for nbytes in sizes:
        drv.progress(f"nodes: MPI point-to-point {a} <-> {b}, {drv.format_bytes(nbytes)}")
        trips = _trips_for(nbytes, world.backend.runs_kernels)
        rows = [mpi_pingpong(world, [nbytes], trips, warmup if i == 0 else 1, pair=(a, b))[0] for i in range(samples)]
        if world.rank == 0:
            one_way = [r["latency_us"] for r in rows]
            med = statistics.median(one_way)
            results.add(impl=rows[0]["impl"], bytes=nbytes, one_way_us=med, min_one_way_us=min(one_way),
                        throughput_GBps=nbytes / (med * 1e3), samples=samples, round_trips=trips, ranks=[a, b],
                        verified=True)


def _trips_for(nbytes: int, gpu: bool) -> int:
    """Round trips per sample: many for small messages, a few for large ones (each sample lasts ~ms)."""
    return max(3, min(200 if gpu else 50, (64 << 20) // max(nbytes, 1) // (8 if gpu else 64)))


# -- the engine link's pipe ---------------------------------------------------------------------------
def _engine_link(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int, a: int, b: int,
                 args: argparse.Namespace) -> None:
    from .. import transport
    from ..channels import protocol as P

    chunk = args.chunk
    nslots = args.nslots or max(64, 1 << (-(-max(sizes) // chunk) - 1).bit_length())
    engine = transport.open_relays(world, [(a, b)], nslots=nslots, chunk=chunk, spin=True)
    results.meta["engine_link"] = {"nslots": nslots, "chunk": chunk, "ll_max": P.LL_MAX_DEFAULT,
                                   "ring_bytes": engine.geometry.ring_bytes, "batch": max(1, nslots // 4)}
    try:
        pipe = _Pipe(world, engine, a, b) if world.rank in (a, b) else None
        for nbytes in sizes:
            drv.progress(f"nodes: engine link {a} <-> {b}, {drv.format_bytes(nbytes)}")
            for form in _Pipe.forms(world, engine, nbytes):
                world.barrier()
                # a trial on the gateways sets the round trips per sample, agreed through the store
                trial = pipe.sample(form, nbytes, 4, warmup)[0] / 4 if pipe is not None else 0.0
                trips = world.broadcast_object(_Pipe.trips(trial, pipe.gpu) if world.rank == a else None, root=a)
                row, ok = pipe.measure(form, nbytes, trips, samples, warmup) if pipe is not None else (None, True)
                if not all(world.allgather_object(ok)):  # every rank raises together, none waits
                    raise ChannelError(f"engine link pingpong {form} {drv.format_bytes(nbytes)}: the bytes that "
                                       "came back differ from the bytes sent")
                row = world.broadcast_object(row, root=a)
                if world.rank == 0 and row is not None:
                    results.add(**dict(row, impl=f"engine-link-{form}"))
            if world.rank == 0:
                mine = [r for r in results.rows if r.get("bytes") == nbytes and
                        str(r.get("impl", "")).startswith("engine-link-")]
                if mine:
                    results.add(**dict(min(mine, key=lambda r: r["one_way_us"]), impl="engine-link"))
        world.barrier()
    finally:
        engine.close()


class _Pipe:
    """The engine-link pingpong on the two gateways: ``a`` writes, ``b`` passes the message straight back."""

    def __init__(self, world: Any, engine: Any, a: int, b: int) -> None:
        from ..channels import protocol as P

        self.world, self.engine = world, engine
        self.role = 0 if world.rank == a else 1
        self.peer = b if self.role == 0 else a
        self.link = engine[self.peer]
        self.gpu = world.backend.runs_kernels
        self.route = P.route_of(0, self.peer)
        self._module = None
        self.blocks_most = 1
        if self.gpu:
            from .. import compile as compile_device
            from .pingpong import GRID_THREADS, KERNELS

            self._module = compile_device(KERNELS.read_text())
            self.blocks_most = world.backend.max_blocks(self._module.get_function("pingpong_grid"), GRID_THREADS)

    @staticmethod
    def forms(world: Any, engine: Any, nbytes: int) -> list[str]:
        """``host`` on cpu; on cuda one warp (``warp`` when the message fits a ring, else ``warp2``: separate
        writing and reading warps) and, from 4 KiB while a ring holds the message, the grid."""
        if not world.backend.runs_kernels:
            return ["host"]
        ring = engine.geometry.ring_bytes
        out = ["warp" if nbytes <= ring else "warp2"]
        if 4 << 10 <= nbytes <= ring:
            out.append("grid")
        return out

    @staticmethod
    def trips(seconds_per_trip: float, gpu: bool) -> int:
        """Round trips per sample: about 2 ms of them."""
        return max(4, min(int(2e-3 / max(seconds_per_trip, 1e-9)), 2000 if gpu else 200))

    def measure(self, form: str, nbytes: int, trips: int, samples: int, warmup: int) -> tuple[dict | None, bool]:
        """(the row, on ``a``; whether every message came back byte for byte)."""
        times, ok = [], True
        for _ in range(samples):
            t, good = self.sample(form, nbytes, trips, warmup)
            times.append(t)
            ok = ok and good
        if self.role != 0:
            return None, ok
        one_way = [t / (2 * trips) for t in times]
        med = statistics.median(one_way)
        geo = self.engine.geometry
        return dict(form=form, bytes=nbytes, one_way_us=med * 1e6, min_one_way_us=min(one_way) * 1e6,
                    throughput_GBps=nbytes / med / 1e9, samples=samples, round_trips=trips, verified=ok,
                    nslots=geo.nslots, chunk=geo.chunk, ll_max=geo.ll_max), ok

    def sample(self, form: str, nbytes: int, trips: int, warmup: int) -> tuple[float, bool]:
        return self._sample_gpu(form, nbytes, trips, warmup) if self.gpu else self._sample_cpu(nbytes, trips)

    def _sample_cpu(self, nbytes: int, trips: int) -> tuple[float, bool]:
        tx, rx = self._ends()
        if self.role == 1:
            for _ in range(trips):
                tx.write_bytes(rx.read_bytes(nbytes))
            return 0.0, True
        msg = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8).tobytes()
        back = b""
        t0 = time.perf_counter()
        for _ in range(trips):
            writer = threading.Thread(target=tx.write_bytes, args=(msg,))  # rings smaller than the message
            writer.start()
            back = rx.read_bytes(nbytes)
            writer.join()
        return time.perf_counter() - t0, back == msg

    def _ends(self):
        if not hasattr(self, "_tx"):
            # the channel reference's ends on the relay's rings keep their place from call to call: made once
            from ..channels._cpu import CpuReceiver, CpuSender

            o, i, t = self.link.out_ring, self.link.in_ring, self.link.timeout
            self._tx = CpuSender("out", self.link.describe(), 0, o.geometry, o.ring, o.credit, o.slot_credits,
                                 o.send_error, t, self.route)
            self._rx = CpuReceiver("in", self.link.describe(), 0, i.geometry, i.ring, i.credit, i.slot_credits,
                                   i.recv_error, t, 0)
        return self._tx, self._rx

    def _sample_gpu(self, form: str, nbytes: int, trips: int, warmup: int) -> tuple[float, bool]:
        import cupy as cp

        from .pingpong import GRID_THREADS

        world, role = self.world, self.role
        stream = world.backend.stream
        with stream:
            status = cp.ones(1, dtype=cp.int32)
            times = cp.zeros(2, dtype=cp.uint64)
            src = cp.random.randint(0, 256, nbytes, dtype=cp.uint8) if role == 0 else cp.zeros(1, cp.uint8)
            dst = cp.zeros(nbytes, dtype=cp.uint8) if role == 0 else cp.zeros(1, cp.uint8)
        tx, rx = self.link.sender_handle(self.route), self.link.receiver_handle()
        args = (tx, rx, src, dst, np.uint64(nbytes), np.int32(role), np.int32(warmup), np.int32(trips))
        with stream:
            if form in ("warp", "warp2"):
                threads = 64 if form == "warp2" else 32
                self._module.get_function("pingpong_" + form)((1,), (threads,), args + (times, status))
            else:
                packets = -(-nbytes // self.engine.geometry.chunk)
                blocks = max(1, min(self.blocks_most, -(-packets // (GRID_THREADS // 32))))
                bar = cp.zeros(2, dtype=cp.uint32)
                self._module.get_function("pingpong_grid")((blocks,), (GRID_THREADS,), args + (
                    bar, np.uint64(int(self.engine.timeout * 1e9)), times, status))
        world.backend.wait_stream(stream, 2 * self.engine.timeout + 5,
                                  lambda: f"engine link pingpong {form} {drv.format_bytes(nbytes)} on rank "
                                          f"{world.rank}")
        self.link.device_error()
        if int(status.get()[0]) != 1:
            raise ChannelError(f"engine link pingpong {form} {drv.format_bytes(nbytes)}: a channel call failed on "
                               f"rank {world.rank}")
        if role != 0:
            return 0.0, True
        t0, t1 = (int(v) for v in times.get())
        return (t1 - t0) * 1e-9, bool(cp.array_equal(src, dst).get())


# -- inside a node ------------------------------------------------------------------------------------
def _intra_node(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int) -> None:
    from .pingpong import GRID_MIN, WARP_MAX, ChannelPair

    sizes = [s for s in sizes if s <= max(WARP_MAX, 1 << 20) or world.backend.runs_kernels]
    pair = ChannelPair(world, sizes)
    try:
        for nbytes in sizes:
            drv.progress(f"nodes: channel pingpong inside node 0 (ranks 0 <-> 1), {drv.format_bytes(nbytes)}")
            rows = []
            if nbytes <= WARP_MAX or not pair.gpu:
                rows.append(pair.measure("default", "warp" if pair.gpu else "host", nbytes, samples, warmup))
            if pair.gpu and nbytes >= GRID_MIN:
                for config, cfg in pair.configs.items():
                    if config.startswith("grid") and nbytes <= cfg["max"]:
                        rows.append(pair.measure(config, "grid", nbytes, samples, warmup))
            if world.rank == 0:
                rows = [r for r in rows if r]
                if rows:
                    results.add(**dict(min(rows, key=lambda r: r["one_way_us"]), impl="intra-node", ranks=[0, 1]))
    finally:
        pair.close()


# -- through the gateways ----------------------------------------------------------------------------
def routed_pair(world: Any) -> tuple[int, int]:
    """(source, destination) of the gateway-routed pingpong: the second rank of node 0 and of node 1 (so the
    route has its mapped hops), or the gateways where a node has one rank."""
    first, second = world.nodes[0], world.nodes[1]
    return first[min(1, len(first) - 1)], second[min(1, len(second) - 1)]


class _Routed:
    """``gping`` source -> destination and ``gpong`` back, routed through both gateways and the engine link;
    the pingpong of ``bench pingpong`` on their ends (one code path: ``cpu_round_trips`` on the host API,
    ``device_round_trips`` on cuda)."""

    def __init__(self, world: Any, sizes: list[int], args: argparse.Namespace) -> None:
        from .. import topology
        from ..channels import Link, element_type
        from ..channels import open as open_channels

        self.world = world
        self.gpu = world.backend.runs_kernels
        self.src, self.dst = routed_pair(world)
        self.ring = max(ROUTED_RING_MIN, min(max(sizes), ROUTED_RING_MAX))
        byte = element_type("uchar")
        links = [Link("gping", "gping_in", 0, 1, self.src, self.dst, byte, self.ring),
                 Link("gpong", "gpong_in", 2, 3, self.dst, self.src, byte, self.ring)]
        relay = {"spin": True}
        if args.nslots:
            relay["nslots"] = args.nslots
        self.channels = open_channels(world, links, topology=topology.nodes(world.nodes), relay=relay)
        self.route = self.channels.route("gping")
        self._module = None
        self.blocks_most = 1
        if self.gpu:
            from .. import compile as compile_device
            from .pingpong import GRID_THREADS, KERNELS

            self._module = compile_device(KERNELS.read_text())
            most = self.channels.max_blocks(self._module.get_function("pingpong_grid"), GRID_THREADS)
            self.blocks_most = max(1, min(world.allgather_object(most)))

    def close(self) -> None:
        self.channels.close()

    def forms(self, nbytes: int) -> list[str]:
        """``host`` on cpu; on cuda one warp (``warp2``, separate writing and reading warps, where the ring is
        smaller than the message or the message is large) and, from 4 KiB while the ring holds it, the grid."""
        from .pingpong import GRID_MIN, WARP_MAX

        if not self.gpu:
            return ["host"]
        out = ["warp" if nbytes <= min(self.ring, WARP_MAX) else "warp2"]
        if GRID_MIN <= nbytes <= self.ring:
            out.append("grid")
        return out

    def measure(self, form: str, nbytes: int, samples: int, warmup: int) -> dict | None:
        """Collective: one form at one size; the row on the source, broadcast to every rank."""
        world = self.world
        world.barrier()
        role = 0 if world.rank == self.src else 1 if world.rank == self.dst else None
        ch = self.channels
        ends = None if role is None else (ch["gping"], ch["gpong_in"]) if role == 0 else (ch["gpong"], ch["gping_in"])
        trial = self._sample(form, role, ends, nbytes, 4, warmup)[0] if role is not None else 0.0
        trips = world.broadcast_object(_Pipe.trips(trial / 4, self.gpu) if role == 0 else None, root=self.src)
        times, ok = [], True
        if role is not None:
            for _ in range(samples):
                t, good = self._sample(form, role, ends, nbytes, trips, warmup)
                times.append(t)
                ok = ok and good
        if not all(world.allgather_object(ok)):
            raise ChannelError(f"gateway-routed pingpong {form} {drv.format_bytes(nbytes)}: the bytes that came back "
                               "differ from the bytes sent")
        row = None
        if role == 0:
            one_way = [t / (2 * trips) for t in times]
            med = statistics.median(one_way)
            geo = ch["gping"].geometry
            row = dict(impl=f"gateway-routed-{form}", form=form, bytes=nbytes, one_way_us=med * 1e6,
                       min_one_way_us=min(one_way) * 1e6, throughput_GBps=nbytes / med / 1e9, samples=samples,
                       round_trips=trips, verified=True, ranks=[self.src, self.dst], route=self.route,
                       route_back=ch.route("gpong"), nslots=geo.nslots, chunk=geo.chunk, ll_max=geo.ll_max)
        return world.broadcast_object(row, root=self.src)

    def _sample(self, form: str, role: int, ends: tuple[Any, Any], nbytes: int, trips: int,
                warmup: int) -> tuple[float, bool]:
        from .pingpong import GRID_THREADS, cpu_round_trips, device_round_trips

        tx, rx = ends
        if not self.gpu:
            return cpu_round_trips(tx, rx, nbytes, trips, echo=role == 1)
        packets = -(-nbytes // tx.geometry.chunk)
        blocks = max(1, min(self.blocks_most, -(-packets // (GRID_THREADS // 32)))) if form == "grid" else 1
        return device_round_trips(self.world, self._module, form, tx, rx, nbytes, role, warmup, trips, blocks,
                                  f"gateway-routed pingpong {form} {drv.format_bytes(nbytes)}")


def _gateway_routed(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int,
                    args: argparse.Namespace) -> None:
    routed = _Routed(world, sizes, args)
    if world.rank == 0:
        results.meta["gateway_routed"] = {"ranks": [routed.src, routed.dst], "route": routed.route,
                                          "ring_bytes": routed.ring}
    try:
        for nbytes in sizes:
            drv.progress(f"nodes: gateway-routed channel {' -> '.join(map(str, routed.route))}, "
                         f"{drv.format_bytes(nbytes)}")
            rows = [routed.measure(form, nbytes, samples, warmup) for form in routed.forms(nbytes)]
            if world.rank == 0:
                for row in rows:
                    results.add(**row)
                results.add(**dict(min(rows, key=lambda r: r["one_way_us"]), impl="gateway-routed"))
    finally:
        routed.close()


# -- the report ---------------------------------------------------------------------------------------
def _added(results: drv.Results) -> None:
    """``added_us`` and ratios of every engine-link row against MPI at the same size, and of every
    gateway-routed row against (MPI + one intra-node hop)."""
    mpi = {r["bytes"]: r for r in results.rows if r.get("impl") in ("mpi", "mpi-host-staged") and "skipped" not in r}
    intra = {r["bytes"]: r for r in results.rows if r.get("impl") == "intra-node" and "one_way_us" in r}
    for r in results.rows:
        base = mpi.get(r.get("bytes"))
        if not base or "one_way_us" not in r:
            continue
        impl = str(r.get("impl", ""))
        if impl.startswith("engine-link"):
            r["added_us"] = r["one_way_us"] - base["one_way_us"]
            r["vs_engine_latency"] = r["one_way_us"] / base["one_way_us"]
            r["vs_engine_throughput"] = r["throughput_GBps"] / base["throughput_GBps"]
        elif impl.startswith("gateway-routed"):
            r["vs_engine_throughput"] = r["throughput_GBps"] / base["throughput_GBps"]
            hop = intra.get(r["bytes"])
            if hop:
                bound = base["one_way_us"] + hop["one_way_us"]
                r["added_us"] = r["one_way_us"] - bound
                r["vs_engine_plus_hop_latency"] = r["one_way_us"] / bound


def targets(results: drv.Results) -> dict:
    """What this run says against issue 13's targets, and the bound the routed channel must meet."""
    rows = {(r["impl"], r["bytes"]): r for r in results.rows if "skipped" not in r and "one_way_us" in r}
    mpi_impl = next((i for i, _ in rows if i in ("mpi", "mpi-host-staged")), None)
    out: dict[str, Any] = {"lines": []}
    sizes = sorted({n for _, n in rows})
    small = [n for n in sizes if n <= 1024 and ("engine-link", n) in rows and (mpi_impl, n) in rows]
    if small:
        n = small[0]
        e, m = rows[("engine-link", n)], rows[(mpi_impl, n)]
        out["engine_link_small_added_us"] = e["one_way_us"] - m["one_way_us"]
        out["lines"].append(f"engine link at {drv.format_bytes(n)}: one-way {e['one_way_us']:.2f} us = "
                            f"{e['one_way_us'] / m['one_way_us']:.2f} x {mpi_impl}'s {m['one_way_us']:.2f} us (the "
                            f"proxies add {e['one_way_us'] - m['one_way_us']:.2f} us)")
        intra = rows.get(("intra-node", n))
        routed = rows.get(("gateway-routed", n))
        if intra:
            base = m["one_way_us"] + intra["one_way_us"]
            out["routed_latency_bound_us"] = TARGET_LATENCY_RATIO * base
            if routed:
                ratio = routed["one_way_us"] / base
                out["routed_latency_ratio"] = ratio
                out["lines"].append(
                    f"gateway-routed at {drv.format_bytes(n)}: one-way {routed['one_way_us']:.2f} us = {ratio:.2f} x "
                    f"({mpi_impl} {m['one_way_us']:.2f} + intra-node hop {intra['one_way_us']:.2f} us); target <= "
                    f"{TARGET_LATENCY_RATIO} x: {'met' if ratio <= TARGET_LATENCY_RATIO else 'missed'} (adds "
                    f"{routed['one_way_us'] - base:.2f} us)")
    for n in [n for n in sizes if n >= BIG and ("gateway-routed", n) in rows and (mpi_impl, n) in rows]:
        g, m = rows[("gateway-routed", n)], rows[(mpi_impl, n)]
        ratio = g["throughput_GBps"] / m["throughput_GBps"]
        out.setdefault("routed_throughput_ratio", {})[n] = ratio
        out["lines"].append(f"gateway-routed at {drv.format_bytes(n)}: {g['throughput_GBps']:.2f} GB/s = {ratio:.2f} x "
                            f"{mpi_impl}'s {m['throughput_GBps']:.2f} GB/s; target >= {TARGET_THROUGHPUT_RATIO} x: "
                            f"{'met' if ratio >= TARGET_THROUGHPUT_RATIO else 'missed'}")
    big = [n for n in sizes if n >= BIG and ("engine-link", n) in rows and (mpi_impl, n) in rows]
    for n in big:
        e, m = rows[("engine-link", n)], rows[(mpi_impl, n)]
        ratio = e["throughput_GBps"] / m["throughput_GBps"]
        out.setdefault("engine_link_throughput_ratio", {})[n] = ratio
        out["lines"].append(f"engine link at {drv.format_bytes(n)}: {e['throughput_GBps']:.2f} GB/s = {ratio:.2f} x "
                            f"{mpi_impl}'s {m['throughput_GBps']:.2f} GB/s")
    if not big:
        out["lines"].append(f"throughput target (>= {TARGET_THROUGHPUT_RATIO} x the engine at >= 16 MiB): no size of "
                            "16 MiB or more in this run")
    return out


def report(results: drv.Results, args: argparse.Namespace) -> None:
    rows = sorted(results.rows, key=lambda r: (str(r["impl"]), r["bytes"]))
    drv.print_table(rows, ["impl", "bytes", "one_way_us", "min_one_way_us", "throughput_GBps", "added_us"],
                    f"nodes ({results.device}, {results.backend}; {results.meta['node_layout']}; gateways "
                    f"{results.meta['gateways'][0]} and {results.meta['gateways'][1]}): one-way, median of "
                    f"{results.meta['samples']} samples")
    summary = targets(results)
    results.meta["targets"] = summary
    for line in summary["lines"]:
        print(line)
    path = results.write_json(args.json)
    print(f"wrote {path}")
    if args.plot:
        from pathlib import Path

        stem = Path(args.plot)
        lat, thr = stem.with_name(stem.stem + "-latency.png"), stem.with_name(stem.stem + "-throughput.png")
        shown = [r for r in results.rows if "skipped" not in r and r["impl"] in
                 ("engine-link", "mpi", "mpi-host-staged", "intra-node", "gateway-routed")]
        drv.plot(shown, x="bytes", y="one_way_us", group="impl", path=str(lat), title="nodes: one-way time",
                 xlabel="message size (bytes)", ylabel="one-way time (us, median)")
        drv.plot(shown, x="bytes", y="throughput_GBps", group="impl", path=str(thr), title="nodes: throughput",
                 xlabel="message size (bytes)", ylabel="GB/s")
        print(f"wrote {lat} and {thr}")
