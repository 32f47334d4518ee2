"""Transports between nodes side by side: ``circuslink bench nodes``.

The job is split into declared nodes on one machine (``--ranks-per-node K``; default two nodes), started by
mpirun. Between the gateways of node 0 and node 1 (their lowest ranks, ``a`` and ``b``) it measures one-way
time (loops of round trips; median over samples, the fastest beside it) and throughput, in one run:

* the transports' own point-to-point, the baselines: ``mpi`` (``mpi-host-staged`` on cuda: MPI between ``a``
  and ``b``, bench/baselines/_mpi.py) and, where NVSHMEM runs, ``nvshmem-put-signal`` (one thread's
  put-with-signal: latency) and ``nvshmem-put-signal-block`` (block puts: bandwidth) from the NVSHMEM baseline
  program (2 PEs);
* ``intra-node``: a channel pingpong between ranks 0 and 1, inside node 0 (mapped memory: one hop), and the
  reference rows ``<baseline>+hop``: a baseline's one-way plus that hop at the same size (what a route through the
  gateways is held to);
* for every transport that joins nodes in this job (``--transports``; default every one that can run: nvshmem
  where it does, mpi): ``relay-T``, its relay's pipe (``circuslink.transport.open_relays``): ``a``'s agent writes
  the message into its out ring, T carries it into ``b``'s in ring, ``b``'s agent passes it back the same way (on
  cuda the agents are the pingpong kernels of ``bench pingpong`` on the rings' channel handles, on cpu host
  threads); and ``gateway-routed-T``: a routed channel from a rank of node 0 to a rank of node 1 and one back
  (docs/routing.md) on the job's nodes whose network links name T: source -> its gateway (a mapped hop) -> T ->
  the peer gateway, whose agent delivers. ``added_us``: a relay's one-way minus T's baseline; a routed channel's
  minus (T's baseline + one intra-node hop).

The targets, per transport (reported, never asserted): gateway-routed 8 B one-way <= 1.3 x (T's baseline one-way
+ one intra-node hop); >= 0.9 x T's baseline bandwidth at 16 MiB and more (nvshmem: its block put). Each
baseline's figures go to the transport registry's hook (``transport.record_figures``). The floor
(``circuslink.probe``) of the same run covers the intra-node pair and, on one machine, the gateways' pair as
mapped memory would give it.
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
TARGET_LATENCY_RATIO = 1.3  # routed latency <= 1.3 x (the transport's own one-way + one intra-node hop)
TARGET_THROUGHPUT_RATIO = 0.9  # ... and throughput >= 0.9 x the transport's own at >= 16 MiB
BIG = 16 << 20
ROUTED_RING_MIN = 8192
ROUTED_RING_MAX = 16 << 20  # the routed rings hold a message up to here (the grid form needs it whole)
INTRA = "intra-node"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:64M", default_nranks=4, default_iters=10, default_warmup=2)
    parser.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                        help="declare nodes of K ranks on this machine (default: half the ranks: two nodes); the "
                             "gateways are the lowest rank of node 0 and of node 1")
    parser.add_argument("--nslots", type=int, default=None, metavar="S",
                        help="slots of each relay ring (default: enough for the largest message, at least 64)")
    parser.add_argument("--chunk", type=int, default=64 << 10, metavar="BYTES",
                        help="bulk packet size of the relay rings (default 65536)")
    parser.add_argument("--transports", default=None, metavar="NAMES",
                        help="transports between nodes to measure, comma-separated (default: every one that can run "
                             "in this job)")


def run(args: argparse.Namespace) -> int:
    from ..launcher import inside_job, mpirun_available, relaunch_self

    drv.parse_sizes(args.sizes)
    k = args.ranks_per_node if args.ranks_per_node is not None else max(1, args.nranks // 2)
    if not inside_job():
        if not mpirun_available():
            raise ConfigError("bench nodes needs mpirun and mpi4py (its MPI baseline, and the mpi transport)")
        if args.nranks // k < 2 or args.nranks % k:
            raise ConfigError(f"bench nodes needs at least 2 whole nodes: -n {args.nranks} with --ranks-per-node {k}")
        return relaunch_self(args.nranks, args.backend, prefer_mpirun=True, mps_mode=args.mps, ranks_per_node=k,
                             **drv.memory_per_rank(args, 8, CPU_MAX))
    import circuslink

    world = circuslink.init(args.backend)
    if world.mpi is None:
        raise ConfigError("bench nodes needs a job started by mpirun (its MPI baseline, and the mpi transport)")
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
    chosen = _transports(world, args.transports)
    results = drv.Results("nodes", world)
    results.meta.update(samples=samples, warmup=warmup, nodes=world.nodes, node_layout=world.describe_nodes(),
                        gateways=[a, b], intra_node_pair=[0, 1] if len(world.nodes[0]) > 1 else None,
                        transports=chosen,
                        definitions="one_way_us: median over samples of (loop time / 2 x round trips); "
                                    "min_one_way_us: the fastest sample; throughput_GBps: bytes / one_way_us; "
                                    "added_us: relay-T one-way minus T's baseline, gateway-routed-T one-way minus "
                                    "(T's baseline + one intra-node hop), at the same size")
    from .. import probe

    pairs = [(0, 1), (1, 0)] if len(world.nodes[0]) > 1 else []
    if world.nodes_declared:
        pairs.append((a, b))  # one machine: what mapped memory gives the gateways' pair
    drv.progress("nodes: measuring the floor (circuslink.probe)")
    results.floor = probe.measure(world, quick=args.quick, pairs=pairs or None)
    if not args.no_baselines:
        _mpi_alone(world, results, sizes, samples, warmup, a, b)
        _nvshmem_alone(world, results, sizes, samples)
        _record_figures(world, results)
    if len(world.nodes[0]) > 1:
        _intra_node(world, results, sizes, samples, warmup)
    for name in chosen:
        _relay_pipe(world, results, sizes, samples, warmup, a, b, args, name)
        _gateway_routed(world, results, sizes, samples, warmup, args, name)
    if world.rank == 0:
        _references(results)
        _added(results)
        report(results, args)
    world.close()
    return 0


def _transports(world: Any, names: str | None) -> list[str]:
    """The transports between nodes to measure: ``--transports``, else every one that can run in this job."""
    from .. import transport

    context = transport.Context.of(world)
    if names is None:
        return [n for n in transport.names() if transport.why_not_between_nodes(context, n) is None]
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    for name in chosen:
        why = transport.why_not_between_nodes(context, name)
        if why:
            raise ConfigError(f"bench nodes --transports: {why}")
    return chosen


# -- the transports' own point-to-point ------------------------------------------------------------------
def _mpi_alone(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int, a: int,
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


def _nvshmem_alone(world: Any, results: drv.Results, sizes: list[int], samples: int) -> None:
    """NVSHMEM's put-with-signal between 2 PEs (the baseline program; rank 0 runs it while the others wait): one
    thread's put for latency, block puts for bandwidth. Where it cannot run, a skipped row says why."""
    if not world.backend.runs_kernels:
        return
    if world.rank == 0:
        from .baselines import nvshmem_pingpong

        drv.progress("nodes: NVSHMEM put-with-signal (the baseline program, 2 PEs)")
        try:
            for r in nvshmem_pingpong(sizes, max(20, 10 * samples), 2):
                results.add(impl=r["impl"], bytes=r["bytes"], one_way_us=r["latency_us"],
                            throughput_GBps=r["throughput_GBps"], round_trips=r.get("iters"),
                            verified=r.get("verified", True), blocks=r.get("blocks"))
        except Exception as exc:  # a baseline that cannot run is reported, not fatal
            results.add(impl="nvshmem-put-signal", bytes=0, skipped=f"{type(exc).__name__}: {exc}")
    world.barrier(timeout=3600)  # the others wait while rank 0 runs the NVSHMEM program


def _record_figures(world: Any, results: drv.Results) -> None:
    """Hand each transport's baseline figures (the smallest size's one-way, the largest size's bandwidth) to the
    registry's hook, on every rank alike (choices made from them must agree)."""
    from .. import transport

    figures = world.broadcast_object(_baseline_figures(results) if world.rank == 0 else None)
    for name, (latency, bandwidth) in figures.items():
        transport.record_figures(world, name, latency, bandwidth)
    if world.rank == 0:
        results.meta["measured_figures"] = figures


def _baseline_figures(results: drv.Results) -> dict[str, tuple[float, float]]:
    """Each transport's own figures, from the rows its ``baseline_rows`` name (the registry says which)."""
    from .. import transport

    out = {}
    for name in transport.names():
        impls, bandwidth = transport.baseline_rows(name)
        lat = [r for r in results.rows if r.get("impl") in impls and "one_way_us" in r]
        bw = [r for r in results.rows if r.get("impl") in bandwidth and "throughput_GBps" in r]
        if lat and bw:
            out[name] = (min(lat, key=lambda r: r["bytes"])["one_way_us"],
                         max(bw, key=lambda r: r["bytes"])["throughput_GBps"])
    return out


def _trips_for(nbytes: int, gpu: bool) -> int:
    """Round trips per sample: many for small messages, a few for large ones (each sample lasts ~ms)."""
    return max(3, min(200 if gpu else 50, (64 << 20) // max(nbytes, 1) // (8 if gpu else 64)))


# -- a transport's relay: the pipe between the gateways ------------------------------------------------
def _relay_pipe(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int, a: int, b: int,
                args: argparse.Namespace, name: str) -> None:
    from .. import transport
    from ..channels import protocol as P

    chunk = args.chunk
    nslots = args.nslots or max(64, 1 << (-(-max(sizes) // chunk) - 1).bit_length())
    relays = transport.open_relays(world, [(a, b)], nslots=nslots, chunk=chunk, spin=True, transport=name)
    results.meta.setdefault("relays", {})[name] = {"nslots": nslots, "chunk": chunk, "ll_max": P.LL_MAX_DEFAULT,
                                                   "ring_bytes": relays.geometry.ring_bytes,
                                                   "batch": max(1, nslots // 4)}
    try:
        pipe = _Pipe(world, relays, a, b) if world.rank in (a, b) else None
        for nbytes in sizes:
            drv.progress(f"nodes: relay {a} <-> {b} over {name}, {drv.format_bytes(nbytes)}")
            for form in _Pipe.forms(world, relays, nbytes):
                world.barrier()
                # a trial on the gateways sets the round trips per sample, agreed through the store
                trial = pipe.sample(form, nbytes, 4, warmup)[0] / 4 if pipe is not None else 0.0
                trips = world.broadcast_object(_Pipe.trips(trial, pipe.gpu) if world.rank == a else None, root=a)
                row, ok = pipe.measure(form, nbytes, trips, samples, warmup) if pipe is not None else (None, True)
                if not all(world.allgather_object(ok)):  # every rank raises together, none waits
                    raise ChannelError(f"relay pingpong over {name} {form} {drv.format_bytes(nbytes)}: the bytes "
                                       "that came back differ from the bytes sent")
                row = world.broadcast_object(row, root=a)
                if world.rank == 0 and row is not None:
                    results.add(**dict(row, impl=f"relay-{name}-{form}", transport=name))
            if world.rank == 0:
                mine = [r for r in results.rows if r.get("bytes") == nbytes and
                        str(r.get("impl", "")).startswith(f"relay-{name}-")]
                if mine:
                    results.add(**dict(min(mine, key=lambda r: r["one_way_us"]), impl=f"relay-{name}"))
        world.barrier()
    finally:
        relays.close()


class _Pipe:
    """The relay pingpong on the two gateways: ``a`` writes, ``b`` passes the message straight back."""

    def __init__(self, world: Any, relays: Any, a: int, b: int) -> None:
        from ..channels import protocol as P

        self.world, self.relays = world, relays
        self.role = 0 if world.rank == a else 1
        self.peer = b if self.role == 0 else a
        self.link = relays[self.peer]
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
    def forms(world: Any, relays: Any, nbytes: int) -> list[str]:
        """``host`` on cpu; on cuda one warp (``warp`` when the message fits a ring, else ``warp2``: separate
        writing and reading warps) and, from 4 KiB while a ring holds the message, the grid."""
        if not world.backend.runs_kernels:
            return ["host"]
        ring = relays.geometry.ring_bytes
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
        geo = self.relays.geometry
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
                packets = -(-nbytes // self.relays.geometry.chunk)
                blocks = max(1, min(self.blocks_most, -(-packets // (GRID_THREADS // 32))))
                bar = cp.zeros(2, dtype=cp.uint32)
                self._module.get_function("pingpong_grid")((blocks,), (GRID_THREADS,), args + (
                    bar, np.uint64(int(self.relays.timeout * 1e9)), times, status))
        world.backend.wait_stream(stream, 2 * self.relays.timeout + 5,
                                  lambda: f"relay pingpong {form} {drv.format_bytes(nbytes)} on rank {world.rank}")
        self.link.device_error()
        if int(status.get()[0]) != 1:
            raise ChannelError(f"relay pingpong {form} {drv.format_bytes(nbytes)}: a channel call failed on rank "
                               f"{world.rank}")
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
    """``gping`` source -> destination and ``gpong`` back, routed through both gateways and a relay of ``name``;
    the pingpong of ``bench pingpong`` on their ends (one code path: ``cpu_round_trips`` on the host API,
    ``device_round_trips`` on cuda)."""

    def __init__(self, world: Any, sizes: list[int], args: argparse.Namespace, name: str) -> None:
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
        # the job's nodes, their network links naming the transport measured
        self.channels = open_channels(world, links, topology=topology.nodes(world.nodes, transport=name), relay=relay)
        self.name = name
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
            raise ChannelError(f"gateway-routed pingpong over {self.name} {form} {drv.format_bytes(nbytes)}: the bytes "
                               "that came back differ from the bytes sent")
        row = None
        if role == 0:
            one_way = [t / (2 * trips) for t in times]
            med = statistics.median(one_way)
            geo = ch["gping"].geometry
            row = dict(impl=f"gateway-routed-{self.name}-{form}", transport=self.name, form=form, bytes=nbytes,
                       one_way_us=med * 1e6, min_one_way_us=min(one_way) * 1e6, throughput_GBps=nbytes / med / 1e9,
                       samples=samples, round_trips=trips, verified=True, ranks=[self.src, self.dst], route=self.route,
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
                                  f"gateway-routed pingpong over {self.name} {form} {drv.format_bytes(nbytes)}")


def _gateway_routed(world: Any, results: drv.Results, sizes: list[int], samples: int, warmup: int,
                    args: argparse.Namespace, name: str) -> None:
    routed = _Routed(world, sizes, args, name)
    if world.rank == 0:
        results.meta.setdefault("gateway_routed", {})[name] = {"ranks": [routed.src, routed.dst],
                                                               "route": routed.route, "ring_bytes": routed.ring}
    try:
        for nbytes in sizes:
            drv.progress(f"nodes: gateway-routed channel {' -> '.join(map(str, routed.route))} over {name}, "
                         f"{drv.format_bytes(nbytes)}")
            rows = [routed.measure(form, nbytes, samples, warmup) for form in routed.forms(nbytes)]
            if world.rank == 0:
                for row in rows:
                    results.add(**row)
                results.add(**dict(min(rows, key=lambda r: r["one_way_us"]), impl=f"gateway-routed-{name}"))
    finally:
        routed.close()


# -- the report ---------------------------------------------------------------------------------------
def _rows(results: drv.Results, impls: tuple[str, ...] | str) -> dict[int, dict]:
    """``{bytes: row}`` of the measured rows whose impl is one of ``impls``."""
    impls = (impls,) if isinstance(impls, str) else impls
    return {r["bytes"]: r for r in results.rows if r.get("impl") in impls and "one_way_us" in r}


def _references(results: drv.Results) -> None:
    """``<baseline>+hop``: each transport's own one-way plus one intra-node channel hop, at every size both have:
    the reference a route through the gateways is held to (its throughput: the slower of the two)."""
    from .. import transport

    intra = _rows(results, INTRA)
    for name in transport.names():
        base = _rows(results, transport.baseline_rows(name)[0])
        for nbytes in sorted(set(base) & set(intra)):
            b, h = base[nbytes], intra[nbytes]
            one_way = b["one_way_us"] + h["one_way_us"]
            results.add(impl=f"{b['impl']}+hop", transport=name, bytes=nbytes, one_way_us=one_way,
                        throughput_GBps=min(b["throughput_GBps"], h["throughput_GBps"]), reference=True)


def _added(results: drv.Results) -> None:
    """``added_us`` and the ratios of every relay row against its transport's baseline at the same size, and of
    every gateway-routed row against (baseline + one intra-node hop) and the baseline's bandwidth."""
    from .. import transport

    intra = _rows(results, INTRA)
    for name in transport.names():
        impls, wide = transport.baseline_rows(name)
        base, bandwidth = _rows(results, impls), _rows(results, wide)
        for r in results.rows:
            impl, nbytes = str(r.get("impl", "")), r.get("bytes")
            if "one_way_us" not in r or nbytes not in base:
                continue
            m = base[nbytes]
            if impl.startswith(f"relay-{name}"):
                r["added_us"] = r["one_way_us"] - m["one_way_us"]
                r["vs_transport_latency"] = r["one_way_us"] / m["one_way_us"]
            elif impl.startswith(f"gateway-routed-{name}"):
                if nbytes in bandwidth:
                    r["vs_transport_throughput"] = r["throughput_GBps"] / bandwidth[nbytes]["throughput_GBps"]
                if nbytes in intra:
                    bound = m["one_way_us"] + intra[nbytes]["one_way_us"]
                    r["added_us"] = r["one_way_us"] - bound
                    r["vs_transport_plus_hop_latency"] = r["one_way_us"] / bound


def targets(results: drv.Results) -> dict:
    """What this run says against the targets, per transport: the latency bound and verdict at the smallest size,
    the throughput verdicts at 16 MiB and more."""
    from .. import transport

    out: dict[str, Any] = {"lines": [], "transports": {}}
    intra = _rows(results, INTRA)
    for name in results.meta.get("transports", []):
        impls, wide = transport.baseline_rows(name)
        base, bandwidth = _rows(results, impls), _rows(results, wide)
        routed, relay = _rows(results, f"gateway-routed-{name}"), _rows(results, f"relay-{name}")
        verdicts: dict[str, Any] = {}
        out["transports"][name] = verdicts
        small = [n for n in sorted(routed) if n <= 1024 and n in base and n in intra]
        if small:
            n = small[0]
            m, h, g = base[n], intra[n], routed[n]
            bound = m["one_way_us"] + h["one_way_us"]
            ratio = g["one_way_us"] / bound
            verdicts.update(latency_bound_us=TARGET_LATENCY_RATIO * bound, latency_ratio=ratio,
                            latency_met=ratio <= TARGET_LATENCY_RATIO)
            verdict = "met" if ratio <= TARGET_LATENCY_RATIO else "missed"
            out["lines"].append(
                f"gateway-routed over {name} at {drv.format_bytes(n)}: one-way {g['one_way_us']:.2f} us = {ratio:.2f} "
                f"x ({m['impl']} {m['one_way_us']:.2f} + intra-node hop {h['one_way_us']:.2f} us); target <= "
                f"{TARGET_LATENCY_RATIO} x: {verdict} (adds {g['one_way_us'] - bound:.2f} us)")
            if n in relay:
                r = relay[n]
                out["lines"].append(f"relay over {name} at {drv.format_bytes(n)}: one-way {r['one_way_us']:.2f} us = "
                                    f"{r['one_way_us'] / m['one_way_us']:.2f} x {m['impl']}'s {m['one_way_us']:.2f} us")
        elif routed:
            out["lines"].append(f"gateway-routed over {name}: no latency verdict (no baseline or intra-node row at a "
                                "size of 1 KiB or less in this run)")
        big = [n for n in sorted(routed) if n >= BIG and n in bandwidth]
        for n in big:
            g, m = routed[n], bandwidth[n]
            ratio = g["throughput_GBps"] / m["throughput_GBps"]
            verdicts.setdefault("throughput_ratio", {})[n] = ratio
            verdicts.setdefault("throughput_met", {})[n] = ratio >= TARGET_THROUGHPUT_RATIO
            verdict = "met" if ratio >= TARGET_THROUGHPUT_RATIO else "missed"
            out["lines"].append(f"gateway-routed over {name} at {drv.format_bytes(n)}: {g['throughput_GBps']:.2f} "
                                f"GB/s = {ratio:.2f} x {m['impl']}'s {m['throughput_GBps']:.2f} GB/s; target >= "
                                f"{TARGET_THROUGHPUT_RATIO} x: {verdict}")
        if routed and not big:
            out["lines"].append(f"gateway-routed over {name}: no throughput verdict (no size of 16 MiB or more with "
                                "its baseline in this run)")
    return out


def report(results: drv.Results, args: argparse.Namespace) -> None:
    def text() -> None:
        rows = sorted(results.rows, key=lambda r: (str(r["impl"]), r["bytes"]))
        drv.print_table(rows, ["impl", "bytes", "one_way_us", "min_one_way_us", "throughput_GBps", "added_us"],
                        f"nodes ({results.device}, {results.backend}; {results.meta['node_layout']}; gateways "
                        f"{results.meta['gateways'][0]} and {results.meta['gateways'][1]}): one-way, median of "
                        f"{results.meta['samples']} samples", args)
        summary = targets(results)
        results.meta["targets"] = summary
        for line in summary["lines"]:
            print(line)

    def draw(path: str) -> None:
        from .. import transport

        names = results.meta.get("transports", [])
        keep = {INTRA} | {i for n in transport.names() for rows in transport.baseline_rows(n) for i in rows} | \
            {f"{kind}-{n}" for n in names for kind in ("relay", "gateway-routed")} | \
            {r["impl"] for r in results.rows if r.get("reference")}
        shown = [r for r in results.rows if "skipped" not in r and r["impl"] in keep]
        drv.figure(path, [
            drv.panel(shown, "bytes", "one_way_us", "impl", "nodes: one-way time", "message size (bytes)",
                      "one-way time (us, median)"),
            drv.panel(shown, "bytes", "throughput_GBps", "impl", "nodes: throughput", "message size (bytes)", "GB/s")])

    drv.finish(results, args, text, draw)
