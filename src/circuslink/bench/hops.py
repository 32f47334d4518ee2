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

``--load`` (``--load-only``: nothing else) adds the many-to-many load: every rank sends to uniformly random
other ranks at once over an all-to-all of channels on the same topology (see :class:`LoadChannels`), every byte
checked at the receivers; the row ``impl: load`` has the aggregate throughput against the sum of the used
links' capacity and the worst link's utilisation (docs/routing.md, "The many-to-many load").
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
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
# The many-to-many load: packets per run (all samples, warm-up included) and the size of each message (one
# bulk packet each up to the chunk); the GPU default is the routing target's 10^6 packets.
LOAD_PACKETS = {True: 1_000_000, False: 2_000}  # by backend.runs_kernels
LOAD_PACKETS_QUICK = {True: 50_000, False: 400}
LOAD_BYTES = {True: 4 << 10, False: 1 << 10}
LOAD_SLOTS = {True: 8, False: 4}  # slots of each load channel's ring (more where a message takes more packets)
LOAD_KERNELS = Path(__file__).parent / "kernels" / "hops_load.cu"
LOAD_THREADS = 32  # a warp per block; each warp serves one or more channel ends


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
    parser.add_argument("--load", action="store_true",
                        help="also run the many-to-many load: every rank sends to random other ranks at once, "
                        "every byte checked; aggregate throughput against the links' capacity")
    parser.add_argument("--load-only", dest="load_only", action="store_true",
                        help="run only the many-to-many load (no latency or throughput by hops)")
    parser.add_argument("--load-packets", dest="load_packets", type=positive_int, default=None,
                        help="packets the load moves in all, over its warm-up and --iters samples (default "
                        f"{LOAD_PACKETS[True]:,} on a GPU, {LOAD_PACKETS[False]:,} on the cpu reference)")
    parser.add_argument("--load-bytes", dest="load_bytes", type=_one_size, default=None,
                        help=f"bytes of each load message (default {drv.format_bytes(LOAD_BYTES[True])} on a GPU, "
                        f"{drv.format_bytes(LOAD_BYTES[False])} on the cpu); up to 64K a message is one packet")
    parser.add_argument("--load-seed", dest="load_seed", type=int, default=None,
                        help="seed of the load's destinations and payloads (default: fresh, printed and recorded)")


def _one_size(text: str) -> int:
    try:
        sizes = drv.parse_sizes(text, "--load-bytes")
    except ConfigError as exc:  # argparse turns only ArgumentTypeError into its one line
        raise argparse.ArgumentTypeError(str(exc)) from None
    if len(sizes) != 1 or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"expected one size of at least 1 byte (e.g. 4K), got {text!r}")
    return sizes[0]


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
        if dropped and not args.load_only:
            drv.progress(f"hops: the cpu reference streams at most {drv.format_bytes(CPU_MAX)}; "
                         f"skipping {len(dropped)} larger size(s)")
    results = drv.Results("hops", world)
    from .. import probe

    drv.progress("hops: measuring the floor (circuslink.probe)")
    results.floor = probe.measure(world, quick=True, pairs=[(0, 1)])
    results.meta.update(topology=topo.name, samples=samples, warmup=warmup, sample_target_s=SAMPLE_TARGET_S)
    if not args.load_only:
        _by_hops(world, topo, args, sizes, samples, warmup, results)
    if args.load or args.load_only:
        _load(world, topo, args, samples, warmup, results)
    if world.rank == 0:
        report(results, args)
    world.close()
    return 0


def _by_hops(world: Any, topo: Any, args: argparse.Namespace, sizes: list[int], samples: int, warmup: int,
             results: drv.Results) -> None:
    """Latency and throughput from rank 0 to every other rank (collective)."""
    bench = HopChannels(world, topo, args.vcs, sizes, args.latency_bytes, args.link_slots)
    routing = bench.channels.router.routing if bench.channels.router else topo.routing(args.vcs)
    results.meta.update(vcs=routing.vcs, vc_scheme=routing.scheme, algorithm=routing.algorithm,
                        latency_bytes=args.latency_bytes, agent=_agent_text(bench.channels),
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


def _agent_text(channels: Any) -> str:
    router = getattr(channels, "_router", None)
    if router is None or not hasattr(router, "ncopy"):
        return "one thread per rank"
    return (f"a resident grid per rank: a routing block (a warp per input, a keeper warp) and {router.ncopy} copy "
            f"block(s) ({router.sms} SM(s) of the rank's share)")


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


# -- the many-to-many load ------------------------------------------------------------------------------------
def load_destinations(seed: int, sample: int, nranks: int, messages: int) -> np.ndarray:
    """dest[src, i]: the rank that message i of rank src goes to, uniform over the other ranks (seeded: every
    rank draws the same pattern)."""
    g = np.random.default_rng([seed, sample])
    draw = g.integers(0, nranks - 1, (nranks, messages))
    return draw + (draw >= np.arange(nranks)[:, None])  # skip the sender itself


def load_counts(dest: np.ndarray) -> np.ndarray:
    """counts[src, dst]: messages on the channel src -> dst."""
    n = dest.shape[0]
    return np.stack([np.bincount(row, minlength=n) for row in dest]).astype(np.int64)


def load_payload_seed(seed: int, sample: int) -> int:
    return int(np.random.default_rng([seed, sample, 1]).integers(0, 1 << 32))


def load_payload(seed: int, src: int, dst: int, m: int, nbytes: int) -> np.ndarray:
    """Message m of the channel src -> dst: word k is a hash of (seed, src << 16 | dst, m, k), little-endian, cut
    to ``nbytes`` (the same as ``load_word`` in kernels/hops_load.cu)."""
    k = np.arange(-(-nbytes // 4), dtype=np.uint32)
    base = (seed ^ ((src << 16 | dst) * 0x9E3779B1) ^ (m * 0x85EBCA77)) & 0xFFFFFFFF
    with np.errstate(over="ignore"):
        x = np.uint32(base) ^ (k * np.uint32(0xC2B2AE3D))
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x2C1B3C6D)
        x ^= x >> np.uint32(12)
        x *= np.uint32(0x297A2D39)
        x ^= x >> np.uint32(15)
    return x.astype("<u4").view(np.uint8)[:nbytes]


def link_bytes(routing: Any, counts: np.ndarray, nbytes: int) -> np.ndarray:
    """Payload bytes each directed link carries (by link id) when channel src -> dst carries counts[src, dst]
    messages of ``nbytes`` along the routing tables' route (a neighbour's channel: its one link)."""
    out = np.zeros(len(routing.topology.links), dtype=np.int64)
    for src, dst in zip(*np.nonzero(counts), strict=True):
        for hop in routing.route(int(src), int(dst)):
            out[hop.link.id] += int(counts[src, dst]) * nbytes
    return out


class LoadChannels:
    """An all-to-all of byte channels ``m{a}_{b}`` on the topology (direct to neighbours, routed beyond), each
    of ``LOAD_SLOTS`` bulk packets (or a message's packets, if more) of a chunk that holds one message (up to
    64 KiB): the many-to-many load."""

    def __init__(self, world: Any, topo: Any, vcs: int | None, nbytes: int, link_slots: int | None) -> None:
        from .. import compile as compile_device
        from ..channels import open as open_channels
        from ..channels import protocol as P

        self.world, self.topology, self.nbytes = world, topo, nbytes
        self.gpu = world.backend.runs_kernels
        self.links = load_links(world.size, nbytes, self.gpu)
        self.geo = P.geometry(self.links[0].depth, 1, **load_options(nbytes, self.gpu))
        self.packets_per_message = len(P.split_write(nbytes, self.geo)[1])
        options = {link.name: load_options(nbytes, self.gpu) for link in self.links}
        self.channels = open_channels(world, self.links, options=options, topology=topo, vcs=vcs,
                                      link_slots=link_slots)
        router = self.channels.router
        self.routing = router.routing if router else topo.routing(vcs)
        r = world.rank
        self.sends = [link for link in self.links if link.src_rank == r]
        self.recvs = [link for link in self.links if link.dst_rank == r]
        self.form = "host"
        if self.gpu:
            self._prepare_kernel(compile_device(LOAD_KERNELS.read_text()))
            self.form = ("warp per channel end" if self.blocks >= self.ends else
                         f"{self.blocks} warps over {self.ends} channel ends (try calls)")

    def _prepare_kernel(self, module: Any) -> None:
        import cupy as cp

        from ..channels import protocol as P

        self.kernel = module.get_function("load_many_to_many")
        self.ends = len(self.sends) + len(self.recvs)
        # a warp per end where that many fit beside the forwarding agent, else fewer warps taking turns over the
        # ends with try calls (16 ranks sharing a GPU leave a few warps a rank for its 30 ends)
        self.most_blocks = min(self.world.allgather_object(self.channels.max_blocks(self.kernel, LOAD_THREADS)))
        self.blocks = max(1, min(self.ends, self.most_blocks))

        def handles(names: list[str]) -> Any:
            arr = np.zeros(max(1, len(names)), P.HANDLE_DTYPE)
            for i, name in enumerate(names):
                arr[i] = self.channels[name].device_handle()
            return cp.asarray(arr.view(np.uint8))

        self.stream = self.world.backend.stream
        self.scratch_words = -(-self.nbytes // 64) * 16  # a multiple of 64 bytes per block
        with self.stream:
            self.send_handles = handles([link.name for link in self.sends])
            self.recv_handles = handles([link.receiver_name for link in self.recvs])
            self.send_peers = cp.asarray(np.array([link.dst_rank for link in self.sends] or [0], np.uint32))
            self.recv_peers = cp.asarray(np.array([link.src_rank for link in self.recvs] or [0], np.uint32))
            self.scratch = cp.zeros(max(1, self.ends) * self.scratch_words, cp.uint32)
            self.since = cp.zeros(max(1, self.ends), cp.uint64)  # the kernel sets it

    def close(self) -> None:
        self.channels.close()

    def sample(self, dest: np.ndarray, counts: np.ndarray, payload_seed: int, label: str) -> tuple[float, int]:
        """One launch of the load (collective): (seconds from this rank's handshake to its last end done, wrong
        bytes this rank received)."""
        if self.gpu:
            return self._sample_gpu(counts, payload_seed, label)
        return self._sample_cpu(dest, counts, payload_seed)

    def _sample_gpu(self, counts: np.ndarray, payload_seed: int, label: str) -> tuple[float, int]:
        import cupy as cp

        r = self.world.rank
        with self.stream:
            send_counts = cp.asarray(np.array([counts[r, link.dst_rank] for link in self.sends] or [0], np.uint32))
            recv_counts = cp.asarray(np.array([counts[link.src_rank, r] for link in self.recvs] or [0], np.uint32))
            sync = cp.zeros(3, cp.uint32)
            if not self.recvs:
                sync[1] = 1  # nobody sends to this rank: its gate is open
            times = cp.zeros(2, cp.uint64)
            bad = cp.zeros(1, cp.uint64)
            status = cp.ones(1, cp.int32)
            progress = cp.zeros(max(1, self.ends), cp.uint32)
            self.world.backend.launch_resident(self.kernel, self.blocks, LOAD_THREADS, (
                self.send_handles, self.send_peers, send_counts, np.uint32(len(self.sends)), self.recv_handles,
                self.recv_peers, recv_counts, np.uint32(len(self.recvs)), np.uint32(r), np.uint32(self.nbytes),
                np.uint32(payload_seed), self.scratch, np.uint32(self.scratch_words), sync,
                np.uint64(self.channels.device_timeout_ns), times, bad, status, progress, self.since),
                stream=self.stream, limit=self.most_blocks)
        self.channels.wait_kernel(self.stream, lambda: f"{label} on rank {r}")
        if int(status.get()[0]) != 1:
            raise ChannelError(f"{label}: a channel call failed on rank {r}")
        t0, t1 = (int(v) for v in times.get())
        return (t1 - t0) * 1e-9, int(bad.get()[0])

    def _sample_cpu(self, dest: np.ndarray, counts: np.ndarray, payload_seed: int) -> tuple[float, int]:
        """The reference through the host API: a reader thread per incoming channel (readers never wait on
        anything but their data), the writer walks this rank's destination sequence in order."""
        r, ch, n = self.world.rank, self.channels, self.nbytes
        wrong, errors = [0] * len(self.recvs), []

        def reader(j: int, link: Any) -> None:
            try:
                for m in range(int(counts[link.src_rank, r])):
                    got = np.asarray(ch[link.receiver_name].read(n)).view(np.uint8)
                    wrong[j] += int(np.count_nonzero(got != load_payload(payload_seed, link.src_rank, r, m, n)))
            except Exception as exc:  # noqa: BLE001 - re-raised below, on the calling thread
                errors.append(exc)

        self.world.barrier()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=reader, args=(j, link), daemon=True) for j, link in enumerate(self.recvs)]
        for th in threads:
            th.start()
        sent = np.zeros(self.world.size, dtype=np.int64)
        try:
            for d in dest[r]:
                d = int(d)
                ch[f"m{r}_{d}"].write(load_payload(payload_seed, r, d, int(sent[d]), n))
                sent[d] += 1
        finally:
            for th in threads:
                th.join()
        if errors:
            raise errors[0]
        return time.perf_counter() - t0, sum(wrong)


def load_links(nranks: int, nbytes: int, gpu: bool) -> list:
    """The load's channels: m{a}_{b} for every ordered pair of distinct ranks."""
    from ..channels import Link, element_type

    byte = element_type("uchar")
    opts = load_options(nbytes, gpu)
    depth = opts["chunk"] * opts["nslots"]
    pairs = [(a, b) for a in range(nranks) for b in range(nranks) if a != b]
    return [Link(f"m{a}_{b}", f"m{a}_{b}_in", 2 * k, 2 * k + 1, a, b, byte, depth) for k, (a, b) in enumerate(pairs)]


def load_options(nbytes: int, gpu: bool) -> dict:
    """Bulk packets only (``ll_max`` 0: one packet per message up to the chunk), a chunk of the message rounded up
    to a power of two (256 B .. 64 KiB), ``LOAD_SLOTS`` slots or, for a message of more packets, as many as it
    takes (the GPU kernel's try calls move a message whole: it must fit the ring)."""
    chunk = min(GPU_CHUNK, max(256, 1 << max(0, nbytes - 1).bit_length()))
    packets = -(-nbytes // chunk)
    return {"chunk": chunk, "nslots": max(LOAD_SLOTS[gpu], 1 << max(0, packets - 1).bit_length()), "ll_max": 0}


def _load(world: Any, topo: Any, args: argparse.Namespace, samples: int, warmup: int, results: drv.Results) -> None:
    """The many-to-many load (collective): warm-up and samples, each its own seeded destination pattern, every
    byte checked; one row ``impl: load`` on rank 0."""
    gpu = world.backend.runs_kernels
    quick = getattr(args, "quick", False)
    total = args.load_packets or (LOAD_PACKETS_QUICK if quick else LOAD_PACKETS)[gpu]
    nbytes = args.load_bytes or LOAD_BYTES[gpu]
    seed = args.load_seed if args.load_seed is not None else int(np.random.SeedSequence().entropy % (1 << 31))
    seed = int(world.broadcast_object(seed if world.rank == 0 else None))
    load = LoadChannels(world, topo, args.vcs, nbytes, args.link_slots)
    ppm = load.packets_per_message
    runs = warmup + samples
    per_rank = max(1, -(-total // (runs * world.size * ppm)))  # messages per rank per sample
    drv.progress(f"hops: many-to-many load on {topo.name}: {runs} x {world.size} ranks x {per_rank} messages of "
                 f"{drv.format_bytes(nbytes)} ({ppm} packet(s) each) to random ranks, seed {seed}")
    floor = floor_pair(results)
    capacity = floor.get("sm_store_GBps")
    times, worst, packets, wrong, patterns = [], [], 0, 0, []
    label = f"hops load on {topo.name}"
    try:
        for i in range(runs):
            dest = load_destinations(seed, i, world.size, per_rank)
            counts = load_counts(dest)
            t, bad = load.sample(dest, counts, load_payload_seed(seed, i), f"{label} (sample {i})")
            span = max(world.allgather_object(t))
            wrong += sum(world.allgather_object(bad))
            packets += int(counts.sum()) * ppm
            if i < warmup:
                continue
            per_link = link_bytes(load.routing, counts, nbytes)
            times.append(span)
            worst.append((float(per_link.max()) / span / 1e9, int(per_link.argmax())))  # GB/s, link id
            patterns.append(counts.tolist())
        if wrong:
            raise ChannelError(f"{label}: the receivers found {wrong} wrong byte(s) (seed {seed})")
        resources = {"symmetric_bytes_per_rank": load.channels.nbytes,
                     "routed_channels": len(load.channels.router.routed) if load.channels.router else 0}
        scheme = (load.routing.vcs, load.routing.scheme)
    finally:
        load.close()
    if world.rank != 0:
        return
    counts_all = np.array(patterns)  # [sample, src, dst]
    per_link = link_bytes(load.routing, counts_all[0], nbytes)
    used = [link for link in topo.links if per_link[link.id] > 0]
    sample_bytes = [int(c.sum()) * nbytes for c in counts_all]
    agg = [b / t / 1e9 for b, t in zip(sample_bytes, times, strict=True)]
    traffic = [int(link_bytes(load.routing, c, nbytes).sum()) / t / 1e9 for c, t in zip(counts_all, times, strict=True)]
    k = times.index(sorted(times)[(len(times) - 1) // 2])  # a median sample: its links, by name
    per_link_k = link_bytes(load.routing, counts_all[k], nbytes) / times[k] / 1e9
    links_GBps = {topo.link_label(link): float(per_link_k[link.id]) for link in used}
    worst_GBps = statistics.median(w for w, _ in worst)
    ids = [link_id for _, link_id in worst]
    worst_link = max(set(ids), key=ids.count)  # the link most often the busiest
    row = dict(impl="load", topology=topo.name, vcs=scheme[0], vc_scheme=scheme[1], bytes=nbytes,
               packets=packets, packets_per_message=ppm, messages_per_rank=per_rank, samples=samples, warmup=warmup,
               seconds=statistics.median(times), min_seconds=min(times), aggregate_GBps=statistics.median(agg),
               max_aggregate_GBps=max(agg), link_traffic_GBps=statistics.median(traffic), links_used=len(used),
               link_capacity_GBps=capacity, worst_link=topo.link_label(topo.links[worst_link]),
               worst_link_GBps=worst_GBps, seed=seed, wrong_bytes=wrong, verified=True,
               mean_hops=float((counts_all[0] * load.routing.hops).sum() / counts_all[0].sum()),
               form=load.form, links_GBps=links_GBps, pattern=patterns,
               resources=resources)
    if capacity:
        total_capacity = capacity * len(used)
        row.update(capacity_GBps=total_capacity, aggregate_vs_capacity=row["aggregate_GBps"] / total_capacity,
                   link_traffic_vs_capacity=row["link_traffic_GBps"] / total_capacity,
                   worst_link_utilisation=worst_GBps / capacity)
    results.add(**row)


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
    for row in (r for r in results.rows if r["impl"] == "load"):
        out["load"] = {k: row.get(k) for k in ("packets", "bytes", "aggregate_GBps", "capacity_GBps",
                                               "aggregate_vs_capacity", "link_traffic_vs_capacity", "worst_link",
                                               "worst_link_utilisation")}
        out["lines"] += load_summary(row)
    return out


def load_summary(row: dict) -> list[str]:
    """The load's verdict lines: packets moved and checked, throughput against the links' capacity."""
    lines = [f"many-to-many load on {row['topology']}: {row['packets']:,} packets of {drv.format_bytes(row['bytes'])} "
             f"({row['vcs']} virtual channel(s), {row['vc_scheme']}), every byte checked, no deadlock; aggregate "
             f"{row['aggregate_GBps']:.3g} GB/s delivered, {row['link_traffic_GBps']:.3g} GB/s over "
             f"{row['links_used']} links"]
    if row.get("capacity_GBps"):
        lines.append(f"against the sum of the links' capacity {row['capacity_GBps']:.1f} GB/s ({row['links_used']} x "
                     f"{row['link_capacity_GBps']:.1f} GB/s, the probe's SM-store bandwidth): delivered "
                     f"{row['aggregate_vs_capacity']:.3g} x, link traffic {row['link_traffic_vs_capacity']:.3g} x; "
                     f"worst link {row['worst_link']} at {row['worst_link_utilisation']:.3g} of its capacity")
    return lines


def _link_panel(row: dict) -> dict:
    labels = list(row["links_GBps"])

    def draw(ax: Any) -> None:
        ax.bar(range(len(labels)), [row["links_GBps"][k] for k in labels])
        if row.get("link_capacity_GBps"):
            ax.axhline(row["link_capacity_GBps"], linestyle="--", color="grey", label="a link's capacity (probe)")
            ax.legend()
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("GB/s over the link (a median sample)")
        ax.set_title(title)

    title = f"many-to-many load on {row['topology']}: bytes per link / time"
    return {"title": title, "draw": draw}


def report(results: drv.Results, args: argparse.Namespace) -> None:
    rows = sorted(results.rows, key=lambda r: (r["impl"], r.get("hops", 0), r.get("dst", 0), r["bytes"]))
    out: dict = {}

    def text() -> None:
        if not args.load_only:
            drv.print_table([r for r in rows if r["impl"] == "latency"],
                            ["dst", "hops", "bytes", "one_way_us", "min_one_way_us", "round_trips"],
                            f"hops on {results.meta['topology']} ({results.device}, {results.backend}): one-way "
                            f"latency, median of {results.meta['samples']} samples", args)
            drv.print_table([r for r in rows if r["impl"] == "throughput"],
                            ["dst", "hops", "bytes", "messages", "throughput_GBps", "max_throughput_GBps"],
                            "one-way streaming throughput by hops", args)
        load = [r for r in rows if r["impl"] == "load"]
        drv.print_table(load, ["bytes", "packets", "mean_hops", "seconds", "aggregate_GBps", "link_traffic_GBps",
                               "links_used", "capacity_GBps", "worst_link_GBps", "worst_link_utilisation"],
                        f"many-to-many load on {results.meta['topology']}: every rank to random ranks at once, median "
                        f"of {results.meta['samples']} samples", args)
        for r in load:
            print(f"load pattern (seed {r['seed']}): messages src -> dst of the first sample "
                  "(rows: senders, columns: receivers)")
            for src, line in enumerate(r["pattern"][0]):
                print(f"  {src:>4}: " + " ".join(f"{c:>5}" for c in line))
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
        panels = []
        if lat:
            panels.append(drv.panel(lat, "hops", "one_way_us", "impl",
                                    f"latency against hops on {results.meta['topology']}{slope}", "hops",
                                    "one-way latency (us, median)", logx=False, logy=False, extra=extra))
        if thr:
            panels.append(drv.panel(thr, "hops", "throughput_GBps", "impl",
                                    f"one-way throughput against hops on {results.meta['topology']}", "hops",
                                    "GB/s (median)", logx=False, logy=False))
        panels += [_link_panel(r) for r in rows if r["impl"] == "load"]
        drv.figure(path, panels)

    drv.finish(results, args, text, draw)
