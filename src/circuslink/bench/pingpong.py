"""Channel pingpong against the floor, NCCL, NVSHMEM and MPI (CIRCUS, Fig. 12 and 13).

Rank 0 sends a message through a channel, rank 1 passes it straight back from its ring through
another (no staging copy), rank 0 reads it. Every sample is a loop of many round trips in one
launch, timed at its two ends (the device's timer ticks every 32 ns or more, so no single round trip
is timed alone); the one-way time is the loop's time over twice its round trips. Rows give the
median over the samples (``one_way_us``) and the minimum beside it (``min_one_way_us``).

What is measured, all on one channel format (docs/protocol.md):

* ``circuslink``: the channel as opened by default (writes up to ``ll_max`` bytes as low-latency
  packets, larger ones as bulk packets), one warp a side (``form=warp``) up to 64 KiB and every warp
  of a co-resident grid (``form=grid``) from 4 KiB; the row is the faster form at each size, the others
  stay in the file;
* ``circuslink-ll`` / ``circuslink-bulk``: every write as low-latency / as bulk packets (one warp),
  whose crossing is the switch point ``ll_max`` defaults to (``meta.switch_point_bytes``);
* ``circuslink-depth4``: a 4-slot ring, same loops: the cost of flow control (``slowdown``: median
  over median);
* the floor (``circuslink.probe``) and the baselines (NCCL, NVSHMEM, MPI), measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import _sysinfo
from ..errors import ChannelError, ConfigError
from . import _driver as drv

KERNELS = Path(__file__).parent / "kernels" / "pingpong_channels.cu"
WARP_MAX = 64 << 10  # one warp a side up to here: beyond, the grid wins by far
GRID_MIN = 256  # the grid form from here: one block of bulk packets beats several low-latency rounds at 1-4 KiB
GRID_CHUNKS = (4 << 10, 16 << 10, 64 << 10)  # bulk packet sizes tried by the grid form (best kept)
GRID_CHUNK_MAX_MESSAGE = {4 << 10: 16 << 20, 16 << 10: 1 << 30, 64 << 10: 1 << 30}
# The grid forms' rings stay in L2 whatever the message (H200: 50 MB of L2): rank 0 reads the reply while it
# writes, so a ring smaller than the message streams through instead of deadlocking. A ring of the message's
# size costs every payload byte four HBM bytes once it outgrows L2 (the 2026-11-25 collapse: 42 GB/s at 256 MiB).
GRID_RING_BYTES = 16 << 20
# The rendezvous form (channels opened with a window): messages of at least RDV_MIN are pulled straight from the
# writer's window; its ring carries the descriptors only.
RDV_RING_BYTES = 1 << 20
RDV_FROM = 128 << 10  # the smallest size the rendezvous form is measured at (below the library's default switch)
GRID_THREADS = 256
SAMPLE_TARGET_S = 200e-6  # each sample runs round trips for about this long
CPU_MAX = 1 << 20
TINY_SIZES = (64, 4096, 64 << 10, 1 << 20)
# The NVSHMEM baseline runs every form at every size: minutes, not CIRCUSLINK_TIMEOUT's default. Killing it
# mid-kernel under MPS takes every client of the GPU down with it, so its bound is generous.
NVSHMEM_TIMEOUT_S = 900.0
NVSHMEM_THREAD_MAX = 1 << 20  # a lone thread's put of 256 MiB took minutes of the run (H200, 2026-11-25)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:256M", default_iters=15, default_warmup=3)
    add_grid_blocks_argument(parser)


def add_grid_blocks_argument(parser: argparse.ArgumentParser) -> None:
    """``--grid-blocks``: the most blocks a grid-form kernel of the pingpong / stream benches launches."""
    parser.add_argument("--grid-blocks", dest="grid_blocks", type=drv.positive_int, default=None, metavar="N",
                        help="at most N blocks for the grid forms (default: half the rank's SM budget for the "
                             "pingpong, all of it for the stream; never more than stay co-resident); fewer blocks "
                             "leave SMs to the peer rank's kernel on a shared GPU")


def run(args: argparse.Namespace) -> int:
    from ..launcher import inside_job, relaunch_self

    drv.parse_sizes(args.sizes)  # bad options fail here, once, not on every rank
    if not inside_job():
        # the rings hold the largest message per configuration and direction, beside its source and result
        return relaunch_self(args.nranks, args.backend, prefer_mpirun=True, mps_mode=args.mps,
                             **drv.memory_per_rank(args, 10, CPU_MAX))
    import circuslink

    world = circuslink.init(args.backend)
    if world.size < 2:
        raise ConfigError("bench pingpong needs at least 2 ranks (ranks 0 and 1 play; others wait)")
    sizes, samples, warmup = drv.sizes_and_counts(args, quick_sizes="8,64,4K,64K,1M", quick_iters=5, quick_warmup=2)
    if not world.backend.runs_kernels:
        dropped = [s for s in sizes if s > CPU_MAX]
        sizes = [s for s in sizes if s <= CPU_MAX]
        if dropped:
            drv.progress(f"pingpong: the cpu reference stops at {drv.format_bytes(CPU_MAX)}; "
                         f"skipping {len(dropped)} larger size(s)")
    results = drv.Results("pingpong", world)
    results.meta.update(runs_kernels=world.backend.runs_kernels, cores=_sysinfo.cores())
    results.meta.update(samples=samples, warmup=warmup, sample_target_s=SAMPLE_TARGET_S,
                        definitions="one_way_us: median over samples of (loop time / 2 x round trips); "
                                    "min_one_way_us: the fastest sample; throughput_GBps: bytes / one_way_us")
    from .. import probe

    drv.progress("pingpong: measuring the floor (circuslink.probe)")
    results.floor = probe.measure(world, quick=args.quick, pairs=[(0, 1), (1, 0)])
    bench = ChannelPair(world, sizes, grid_blocks=args.grid_blocks)
    try:
        bench.measure_all(results, sizes, samples, warmup)
        results.meta["resources"] = bench.resources()
    finally:
        bench.close()
    if not args.no_baselines:
        _baselines(world, results, sizes, samples, warmup)
    if world.rank == 0:
        report(results, args)
    world.close()
    return 0


# -- the channels and their kernels ------------------------------------------------------------------
class ChannelPair:
    """Ping (0 -> 1) and pong (1 -> 0) channels for every configuration, and the kernels that drive them.
    Shared with `bench stream`; ranks above 1 take part in the collective calls only."""

    def __init__(self, world: Any, sizes: list[int], stream: bool = False, grid_blocks: int | None = None) -> None:
        from ..channels import Link, element_type
        from ..channels import open as open_channels

        self.world = world
        self.gpu = world.backend.runs_kernels
        top = max(sizes)
        warp_top = min(top, WARP_MAX)
        configs: dict[str, dict] = {}
        # The warp forms' rings hold their largest message (one warp writes the whole message before it reads
        # the reply); the grid forms' rings are L2-sized (GRID_RING_BYTES), since their writing and reading
        # warps run at once.
        configs["default"] = {"ring": max(warp_top, 8192), "options": {}}
        configs["ll"] = {"ring": max(warp_top, 8192), "options": {"ll_max": 1 << 30, "chunk": 256}}
        configs["bulk"] = {"ring": max(warp_top, 8192), "options": {"ll_max": 0}}
        configs["tiny"] = {"ring": 1, "options": {"nslots": 4}}
        if self.gpu:
            for chunk in GRID_CHUNKS:
                most = min(top, GRID_CHUNK_MAX_MESSAGE[chunk])
                if most >= GRID_MIN and (chunk == GRID_CHUNKS[0] or most > chunk):
                    configs[f"grid{chunk >> 10}k"] = {"ring": min(most, GRID_RING_BYTES),
                                                      "options": {"chunk": chunk, "ll_max": 0},
                                                      "chunk": chunk, "max": most}
        else:
            configs["default"]["ring"] = max(top, 8192)
        self.window = None
        if self.gpu and top >= RDV_FROM:
            # every rank's sources and the echo's buffer: rank 0 writes from its window, rank 1 reads into its own
            # and writes back from there (a writer's large messages are pulled from its window); a stream's
            # messages are rank 0's window
            self.window = world.alloc(top)
            configs["rdv"] = {"ring": RDV_RING_BYTES, "chunk": 64 << 10, "min": RDV_FROM,
                              "options": {"chunk": 64 << 10, "ll_max": 0, "window": self.window,
                                          "rendezvous_min": RDV_FROM}}
        self.configs = configs
        byte = element_type("uchar")
        links, options, k = [], {}, 0
        for name, cfg in configs.items():
            opts = dict(cfg["options"])
            if name != "tiny" and "chunk" in cfg:
                opts["nslots"] = 1 << max(2, (-(-cfg["ring"] // cfg["chunk"]) - 1).bit_length())
            for direction, (a, b) in (("ping", (0, 1)), ("pong", (1, 0))):
                links.append(Link(f"{direction}_{name}", f"{direction}_{name}_in", k, k + 1, a, b, byte, cfg["ring"]))
                options[f"{direction}_{name}"] = opts
                k += 2
        if stream:  # the acknowledgement of a streamed run: 4 bytes back
            links.append(Link("ack", "ack_in", k, k + 1, 1, 0, byte, 64))
        self.channels = open_channels(world, links, options=options)
        self._module = None
        self.blocks_most = 1
        if self.gpu:
            from .. import compile as compile_device

            self._module = compile_device(KERNELS.read_text())
            # One grid size for every grid kernel of the file (the pingpong's and the stream's), so it
            # must fit the hungrier of the two on every rank: all blocks resident, or a grid_sync waits
            # for a block that never starts.
            most = min(world.backend.max_blocks(self._module.get_function(name), GRID_THREADS)
                       for name in ("pingpong_grid", "stream_grid"))
            # By default the pingpong takes half of the SM budget and the stream all of it: with grid sessions
            # the stream's warps own their slots and gain from more of them (2 ranks on one H200, 2026-11-25: 64
            # blocks 1,127-1,140 GB/s at 64-256 MiB against 806-837 at 33), while the pingpong's three stages
            # share the GPU and lost at 256 MiB with 64 blocks (517-557 us against 317 at 33).
            budget = world.backend.sm_budget or 1
            cap = grid_blocks or max(1, budget if stream else budget // 2)
            self.blocks_most = max(1, min(min(world.allgather_object(most)), cap))
            # the rendezvous form's copies are its readers' alone (the writer waits), so it takes every block it may
            # have resident, up to one an SM of the budget (one H200, 2 ranks, a hand-written form of it: 66 blocks
            # of 256 threads 1,390 GB/s at 64-256 MiB against 1,010 at 33; the library's kernel fits 49)
            kernel = self._module.get_function("stream_rdv" if stream else "pingpong_rdv")
            most = world.backend.max_blocks(kernel, GRID_THREADS)
            self.blocks_rdv = max(1, min(min(world.allgather_object(most)), grid_blocks or budget))

    def ends(self, config: str) -> tuple[Any, Any]:
        ch, me = self.channels, self.world.rank
        if me == 0:
            return ch[f"ping_{config}"], ch[f"pong_{config}_in"]
        return ch[f"pong_{config}"], ch[f"ping_{config}_in"]

    def kernel(self, name: str):
        return self._module.get_function(name)

    def grid_blocks(self, config: str, nbytes: int) -> int:
        """Blocks for a grid form: enough that each writing warp (half the grid on rank 0) has a packet, never
        more than stay co-resident, and no more warps than the ring has slots for two packets each."""
        cfg = self.configs[config]
        chunk = cfg["chunk"]
        packets = -(-nbytes // chunk)
        warps_per_block = GRID_THREADS // 32
        want = -(-packets * 2 // warps_per_block)
        nslots = self.ends(config)[0].geometry.nslots
        by_ring = max(1, nslots // (2 * warps_per_block))
        return max(1, min(self.blocks_most, want, by_ring))

    def measure_all(self, results: drv.Results, sizes: list[int], samples: int, warmup: int) -> None:
        for nbytes in sizes:
            drv.progress(f"pingpong {drv.format_bytes(nbytes)}")
            rows = []
            if nbytes <= WARP_MAX or not self.gpu:
                rows.append(self.measure("default", "warp" if self.gpu else "host", nbytes, samples, warmup))
            if self.gpu and nbytes >= GRID_MIN:
                for config, cfg in self.configs.items():
                    if config.startswith("grid") and nbytes <= cfg["max"]:
                        rows.append(self.measure(config, "grid", nbytes, samples, warmup))
            if "rdv" in self.configs and nbytes >= self.configs["rdv"]["min"]:
                rows.append(self.measure("rdv", "rdv", nbytes, samples, warmup))
            if self.world.rank == 0:
                rows = [r for r in rows if r]
                for r in rows:
                    results.add(**dict(r, impl=f"circuslink-{r['form']}"))
                best = min(rows, key=lambda r: r["one_way_us"])
                results.add(**dict(best, impl="circuslink"))
        for nbytes in [s for s in sizes if s <= WARP_MAX]:
            drv.progress(f"pingpong low-latency vs bulk packets, {drv.format_bytes(nbytes)}")
            for config in ("ll", "bulk"):
                row = self.measure(config, "warp" if self.gpu else "host", nbytes, samples, warmup)
                if row:
                    results.add(**dict(row, impl=f"circuslink-{config}"))
        if self.world.rank == 0:
            results.meta["switch_point_bytes"] = switch_point(results.rows)
        form = "warp2" if self.gpu else "host"  # separate writing and reading warps: rings < message work
        for nbytes in [s for s in sizes if s in TINY_SIZES] or sizes[:1]:
            drv.progress(f"pingpong with a 4-slot ring, {drv.format_bytes(nbytes)}")
            tiny = self.measure("tiny", form, nbytes, samples, warmup)
            same = self.measure("default", form, nbytes, samples, warmup)  # the same form: only the depth differs
            if tiny:
                if same:
                    tiny["slowdown"] = tiny["one_way_us"] / same["one_way_us"]
                    results.add(**dict(same, impl="circuslink-depth-default"))
                results.add(**dict(tiny, impl="circuslink-depth4"))

    def measure(self, config: str, form: str, nbytes: int, samples: int, warmup: int) -> dict | None:
        """One configuration at one size: ``samples`` launches of round-trip loops (a row on rank 0)."""
        world = self.world
        world.barrier()
        if world.rank > 1:  # the collective calls of ranks 0 and 1 below: trips, verdict, done
            for _ in range(3):
                world.broadcast_object(None)
            return None
        tx, rx = self.ends(config)
        trips = self._round_trips(config, form, nbytes, warmup)
        times, ok, extra = [], True, {}
        for _ in range(samples):
            t, good, extra = self._sample(config, form, tx, rx, nbytes, trips, warmup)
            times.append(t)
            ok = ok and good
        verdict = world.broadcast_object(ok if world.rank == 0 else None)
        if not verdict:
            raise ChannelError(f"pingpong {config} {drv.format_bytes(nbytes)}: the bytes that came back differ "
                               "from the bytes sent")
        world.broadcast_object(None)
        if world.rank != 0:
            return None
        one_way = [t / (2 * trips) for t in times]
        med = statistics.median(one_way)
        geo = tx.geometry
        return dict(form=form, config=config, bytes=nbytes, one_way_us=med * 1e6, min_one_way_us=min(one_way) * 1e6,
                    throughput_GBps=nbytes / med / 1e9, samples=samples, round_trips=trips, verified=True,
                    ll_max=geo.ll_max, chunk=geo.chunk, nslots=geo.nslots, **extra)

    def _round_trips(self, config: str, form: str, nbytes: int, warmup: int) -> int:
        """Round trips per sample: enough for SAMPLE_TARGET_S, from one short trial (agreed by both ranks)."""
        tx, rx = self.ends(config)
        t, _, _ = self._sample(config, form, tx, rx, nbytes, 4, warmup)
        guess = int(SAMPLE_TARGET_S / max(t / 4, 1e-9))
        trips = max(8, min(guess, 2000 if self.gpu else 50))  # 16 messages a sample at least
        return int(self.world.broadcast_object(trips if self.world.rank == 0 else None))

    def _sample(self, config, form, tx, rx, nbytes, trips, warmup) -> tuple[float, bool, dict]:
        role = self.world.rank
        if not self.gpu:
            t, ok = cpu_round_trips(tx, rx, nbytes, trips, echo=role == 1)
            return t, ok, {"warps": 0, "blocks": 0}
        blocks = self.grid_blocks(config, nbytes) if form == "grid" else self.blocks_rdv if form == "rdv" else 1
        t, ok = device_round_trips(self.world, self._module, form, tx, rx, nbytes, role, warmup, trips, blocks,
                                   f"pingpong {config} {drv.format_bytes(nbytes)}", window=self.window)
        warps = blocks * GRID_THREADS // 32 if form in ("grid", "rdv") else (2 if form == "warp2" else 1)
        extra = {"warps": warps, "blocks": blocks}
        clock = self.world.registry("bench.sm_clock_mhz", dict).get(form)
        if clock and form == "warp":
            extra["sm_clock_mhz"] = clock  # what rank 0's SM ran at in the last sample
        return t, ok, extra

    def resources(self) -> dict:
        """What the channel machinery takes, per kernel of this benchmark (see also bench resources)."""
        out: dict[str, Any] = {"symmetric_bytes_per_rank": self.channels.nbytes, "channels": {}}
        for name in self.configs:
            if self.world.rank > 1:
                break
            geo = self.ends(name)[0].geometry
            out["channels"][name] = dict(nslots=geo.nslots, chunk=geo.chunk, ll_max=geo.ll_max,
                                         ring_bytes=geo.ring_bytes)
        if self._module is not None:
            for kname in ("pingpong_warp", "pingpong_grid"):
                fn = self.kernel(kname)
                out[kname] = dict(registers_per_thread=int(fn.num_regs), static_shared_bytes=int(fn.shared_size_bytes),
                                  local_bytes=int(fn.local_size_bytes))
            out["grid_blocks_most"] = self.blocks_most
        return out

    def close(self) -> None:
        self.channels.close()
        if self.window is not None:
            self.window.close()


def device_round_trips(world: Any, module: Any, form: str, tx: Any, rx: Any, nbytes: int, role: int, warmup: int,
                       trips: int, blocks: int = 1, label: str = "pingpong", window: Any = None) -> tuple[float, bool]:
    """One sample of the pingpong kernels (``pingpong_warp``, ``pingpong_warp2``, ``pingpong_grid`` or
    ``pingpong_rdv`` of ``kernels/pingpong_channels.cu``, by ``form``) between this rank and its partner: role 0
    writes ``nbytes`` and reads them back ``warmup + trips`` times, role 1 passes them straight back (``rdv``:
    reads them into its ``window``, the channels' symmetric buffer, and writes them back from there). Returns
    (seconds of the timed round trips on role 0, whether the bytes came back equal); also used by ``bench hops``."""
    import cupy as cp

    stream = world.backend.stream
    with stream:
        status = cp.ones(1, dtype=cp.int32)
        times = cp.zeros(3, dtype=cp.uint64)
        if form == "rdv":  # the sources live in the window: rank 0's message, rank 1's echo buffer
            src = window.local[:nbytes]
            src[...] = cp.random.randint(0, 256, nbytes, dtype=cp.uint8) if role == 0 else 0
        else:
            src = cp.random.randint(0, 256, nbytes, dtype=cp.uint8) if role == 0 else cp.zeros(1, cp.uint8)
        dst = cp.zeros(nbytes, dtype=cp.uint8) if role == 0 else cp.zeros(1, cp.uint8)
    # No barrier: the ranks' launches are skewed anyway, and the warm-up round trips absorb it.
    th, rh = tx.device_handle(), rx.device_handle()
    args = (th, rh, src, dst, np.uint64(nbytes), np.int32(role), np.int32(warmup), np.int32(trips))
    if form in ("warp", "warp2"):
        with stream:
            module.get_function("pingpong_" + form)((1,), (64 if form == "warp2" else 32,), args + (times, status))
    elif form == "rdv":
        with stream:
            bar = cp.zeros(2, dtype=cp.uint32)
        world.backend.launch_resident(module.get_function("pingpong_rdv"), blocks, GRID_THREADS, args + (
            bar, np.uint64(tx.channels.device_timeout_ns), times, status), stream=stream)
    else:
        with stream:
            done = cp.zeros(1, dtype=cp.uint32)
            module.get_function("pingpong_grid")((blocks,), (GRID_THREADS,), args + (
                done, np.uint64(tx.channels.device_timeout_ns), times, status))
    tx.channels.wait_kernel(stream, lambda: f"{label} on rank {world.rank}")
    rx.check()
    tx.check()  # a writer that stalled on credits says so (with what its slot's credit holds)
    if int(status.get()[0]) != 1:
        raise ChannelError(f"{label}: a channel call failed on rank {world.rank}")
    if role != 0:
        return 0.0, True
    t0, t1, cycles = (int(v) for v in times.get())
    if cycles and t1 > t0:
        world.registry("bench.sm_clock_mhz", dict)[form] = cycles / (t1 - t0) * 1e3
    return (t1 - t0) * 1e-9, bool(cp.array_equal(src, dst).get())


def cpu_round_trips(tx: Any, rx: Any, nbytes: int, trips: int, echo: bool) -> tuple[float, bool]:
    """The cpu reference of a sample through the host API: the echo passes back what it reads; the other side
    writes (from a thread: a ring smaller than the message must not deadlock) and reads back."""
    if echo:
        for _ in range(trips):
            tx.write(rx.read(nbytes))
        return 0.0, True
    from ..channels.protocol import split_write

    msg = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8)
    # A message the ring holds whole is written inline (a thread per round trip costs more than the trip).
    inline = len(split_write(nbytes, tx.geometry)[1]) <= tx.geometry.nslots
    t0 = time.perf_counter()
    back = None
    for _ in range(trips):
        if inline:
            tx.write(msg)
            back = rx.read(nbytes)
            continue
        writer = threading.Thread(target=tx.write, args=(msg,))
        writer.start()
        back = rx.read(nbytes)
        writer.join()
    return time.perf_counter() - t0, bool(np.array_equal(back, msg))


def switch_point(rows: list[dict]) -> int | None:
    """The smallest size from which bulk packets beat low-latency packets (medians), or None."""
    ll = {r["bytes"]: r["one_way_us"] for r in rows if r.get("impl") == "circuslink-ll"}
    bulk = {r["bytes"]: r["one_way_us"] for r in rows if r.get("impl") == "circuslink-bulk"}
    common = sorted(set(ll) & set(bulk))
    for i, n in enumerate(common):
        if all(bulk[m] <= ll[m] for m in common[i:]):
            return n
    return None


def _baselines(world: Any, results: drv.Results, sizes: list[int], iters: int, warmup: int) -> None:
    from . import baselines

    for name in ("nccl_pingpong", "mpi_pingpong"):
        fn = getattr(baselines, name, None)
        if fn is None:
            continue
        drv.progress(f"pingpong: baseline {name}")
        # MPI's figure is a median over samples as ours is (the cpu verdict divides one by the other)
        extra = {"samples": max(10, iters)} if name == "mpi_pingpong" else {}
        rows = fn(world, sizes, max(iters, 20), warmup, **extra)
        if world.rank == 0:
            results.extend(rows)
    fn = getattr(baselines, "nvshmem_pingpong", None)
    if fn is not None and world.backend.runs_kernels:
        if world.rank == 0:
            drv.progress("pingpong: baseline nvshmem_pingpong")
            try:  # its 2 PEs share a GPU under MPS where there is one GPU
                # every form (one thread, one warp, blocks) at every size, medians over `iters` launches
                # one thread stops at NVSHMEM_THREAD_MAX: beyond, a lone thread's put takes seconds a sample
                results.extend(fn(sizes, 200, warmup, modes=("thread", "warp", "block"), samples=max(iters, 10),
                                  bytes_per_sample=256 << 20, timeout=NVSHMEM_TIMEOUT_S,
                                  thread_max=NVSHMEM_THREAD_MAX))
            except Exception as exc:  # a baseline that cannot run is reported, not fatal
                results.add(impl="nvshmem-put-signal", bytes=0, skipped=f"{type(exc).__name__}: {exc}")
        world.barrier(timeout=3600)  # the others wait while rank 0 runs the NVSHMEM program


# -- the report ----------------------------------------------------------------------------------------
def floor_pair(results: drv.Results) -> dict:
    """The probe's figures for the pair 0 -> 1 of this run."""
    pairs = (results.floor or {}).get("pairs") or []
    return next((p for p in pairs if (p.get("a"), p.get("b")) == (0, 1)), pairs[0] if pairs else {})


def envelope_us(floor: dict, nbytes: int) -> float | None:
    """The floor's one-way time for ``nbytes``: latency + size / the best raw bandwidth of the run."""
    lat = floor.get("lat_relaxed_us")
    bw = max(floor.get("ce_GBps") or 0, floor.get("sm_store_GBps") or 0)
    if not lat or not bw:
        return None
    return lat + nbytes / (bw * 1e3)


NVSHMEM_FORMS = ("nvshmem-put-signal", "nvshmem-put-signal-warp", "nvshmem-put-signal-block")


def nvshmem_best(rows: list[dict]) -> dict[int, dict]:
    """NVSHMEM's fastest form (thread, warp or block put-with-signal) at each size, medians."""
    best: dict[int, dict] = {}
    for r in rows:
        if r.get("impl") in NVSHMEM_FORMS and "skipped" not in r and r.get("one_way_us"):
            if r["bytes"] not in best or r["one_way_us"] < best[r["bytes"]]["one_way_us"]:
                best[r["bytes"]] = r
    return best


def collapse(ours: dict[int, dict], peer: dict[int, dict]) -> tuple[float, int] | None:
    """The worst drop of our throughput when the size doubles, beyond the peer's drop at the same step:
    (ratio of ours to the peer's, the larger size); 1.0 means we lost no more than the peer."""
    worst = None
    for n in sorted(ours):
        m = n * 2
        if m not in ours or n not in peer or m not in peer:
            continue
        ours_step = ours[m]["throughput_GBps"] / ours[n]["throughput_GBps"]
        peer_step = min(1.0, peer[m]["throughput_GBps"] / peer[n]["throughput_GBps"])
        ratio = ours_step / peer_step
        if worst is None or ratio < worst[0]:
            worst = (ratio, m)
    return worst


CPU_GOAL_VS_MPI = 10.0  # the cpu reference's small-message one-way time, at most this many times MPI's


def targets(results: drv.Results) -> dict:
    """The verdicts of this run: on a back-end that runs kernels, ratios to this run's floor and to NVSHMEM
    measured beside us (the GPU targets); on the cpu reference, against MPI's shared-memory pingpong of the same
    run (:func:`cpu_targets`)."""
    if not results.meta.get("runs_kernels", True):
        return cpu_targets(results)
    floor = floor_pair(results)
    out: dict[str, Any] = {"lines": []}
    ours = {r["bytes"]: r for r in results.rows if r["impl"] == "circuslink"}
    small = [ours[n] for n in ours if 8 <= n <= 120]
    if small and floor.get("lat_relaxed_us"):
        worst = max(r["one_way_us"] for r in small)
        ratio = worst / floor["lat_relaxed_us"]
        out["small_vs_floor"] = ratio
        out["lines"].append(f"target: 8-120 B one-way {worst:.3f} us (median) = {ratio:.2f} x the relaxed floor "
                            f"{floor['lat_relaxed_us']:.3f} us (goal <= 1.3, moonshot 1.15): "
                            f"{'met' if ratio <= 1.3 else 'MISSED'}")
    peer = nvshmem_best(results.rows)
    vs = [(ours[n]["one_way_us"] / peer[n]["one_way_us"], n) for n in sorted(ours) if n in peer]
    for n in sorted(ours):
        if n in peer:
            ours[n]["vs_nvshmem"] = ours[n]["one_way_us"] / peer[n]["one_way_us"]
            ours[n]["nvshmem_form"] = peer[n]["impl"]
    if vs:
        ratio, at = max(vs)
        out["worst_vs_nvshmem"] = ratio
        behind = [drv.format_bytes(n) for r, n in vs if r > 1.0]
        out["lines"].append(f"target: one-way <= NVSHMEM's best form at every size: worst {ratio:.2f} x at "
                            f"{drv.format_bytes(at)} ({len(vs)} sizes compared; behind at "
                            f"{', '.join(behind) if behind else 'none'}): {'met' if ratio <= 1.0 else 'MISSED'}")
    drop = collapse(ours, peer)
    if drop is not None:
        out["worst_doubling_vs_nvshmem"] = drop[0]
        verdict = "met" if drop[0] >= 0.9 else "MISSED"
        out["lines"].append(f"target: no collapse (throughput never falls > 10% on doubling beyond NVSHMEM's fall): "
                            f"worst {drop[0]:.2f} at {drv.format_bytes(drop[1])}: {verdict}")
    worst_env, at = 0.0, None
    for n, r in sorted(ours.items()):
        env = envelope_us(floor, n)
        if env:
            ratio = r["one_way_us"] / env
            r["vs_envelope"] = ratio
            if ratio > worst_env:
                worst_env, at = ratio, n
    if at is not None:
        out["worst_vs_envelope"] = worst_env
        out["lines"].append(f"envelope: every size against (floor latency + size / best raw bandwidth): worst "
                            f"{worst_env:.2f} x at {drv.format_bytes(at)}")
    sp = results.meta.get("switch_point_bytes")
    out["lines"].append(f"switch point (bulk packets faster than low-latency ones from): "
                        f"{drv.format_bytes(sp) if sp else 'not reached in these sizes'}")
    for r in (r for r in results.rows if r["impl"] == "circuslink-depth4" and "slowdown" in r):
        out["lines"].append(f"4-slot ring at {drv.format_bytes(r['bytes'])}: {r['slowdown']:.2f} x the one-way "
                            "time of the default ring (medians, same loops), every byte checked")
    return out


def cpu_targets(results: drv.Results) -> dict:
    """The cpu reference's verdicts: its smallest message's one-way time against MPI's shared-memory pingpong
    measured in the same run (``mpi`` rows), with a goal (<= 10 x) only where every rank has a core of its own;
    never the GPU targets, whose floor is a GPU's."""
    out: dict[str, Any] = {"lines": []}
    ours = {r["bytes"]: r for r in results.rows if r["impl"] == "circuslink" and "one_way_us" in r}
    mpi = {r["bytes"]: r for r in results.rows if r["impl"] == "mpi" and "skipped" not in r
           and (r.get("one_way_us") or r.get("latency_us"))}
    ranks, cores = results.nranks, results.meta.get("cores")
    alone = cores is not None and ranks <= cores
    common = sorted(set(ours) & set(mpi))
    depth = [f"4-slot ring at {drv.format_bytes(r['bytes'])}: {r['slowdown']:.2f} x the one-way time of the default "
             "ring (medians, same loops), every byte checked"
             for r in results.rows if r["impl"] == "circuslink-depth4" and "slowdown" in r]
    if not common:
        why = ("MPI's pingpong did not run (--no-baselines, or the job was not started by mpirun: install Open MPI "
               "and mpi4py)" if not mpi else "no size was measured by both")
        out["lines"] += [f"cpu: no comparison with MPI's shared-memory pingpong: {why}", *depth]
        return out
    n = common[0]
    ours_us = ours[n]["one_way_us"]
    mpi_us = mpi[n].get("one_way_us") or mpi[n]["latency_us"]
    ratio = ours_us / mpi_us
    out["small_vs_mpi"] = ratio
    where = f"{ranks} ranks on {cores} cores" if cores else f"{ranks} ranks"
    if alone:
        verdict = "met" if ratio <= CPU_GOAL_VS_MPI else "missed"
        goal = f"goal <= {CPU_GOAL_VS_MPI:g} x with every rank on a core of its own ({where}): {verdict}"
    else:
        goal = f"no goal: {where}, so ranks take turns on the cores and every wait includes the scheduler's"
    out["lines"].append(f"cpu: {drv.format_bytes(n)} one-way {ours_us:.2f} us (median) = {ratio:.1f} x MPI's "
                        f"shared-memory pingpong {mpi_us:.2f} us in this run; {goal}")
    big = common[-1]
    if big != n:
        r = ours[big]["one_way_us"] / (mpi[big].get("one_way_us") or mpi[big]["latency_us"])
        out["lines"].append(f"cpu: {drv.format_bytes(big)} one-way = {r:.1f} x MPI's (medians, same run)")
    out["lines"] += depth
    return out


def report(results: drv.Results, args: argparse.Namespace) -> None:
    """Rank 0: the table and the verdicts (CPU ones on the cpu back-end), then exactly the files asked for."""

    def text() -> None:
        rows = [r for r in results.rows if "skipped" not in r or r.get("bytes")]
        for r in rows:  # the baselines' rows say latency_us
            r.setdefault("one_way_us", r.get("latency_us"))
            r.setdefault("min_one_way_us", r.get("min_latency_us"))
        drv.print_table(sorted(rows, key=lambda r: (str(r["impl"]), r["bytes"])),
                        ["impl", "bytes", "one_way_us", "min_one_way_us", "throughput_GBps", "slowdown"],
                        f"pingpong ({results.device}, {results.backend}): one-way, median of "
                        f"{results.meta['samples']} samples of many round trips", args)
        summary = targets(results)
        results.meta["targets"] = summary
        for line in summary["lines"]:
            print(line)

    drv.finish(results, args, text, lambda path: _plot(results, path))


def _plot(results: drv.Results, path: str) -> None:
    shown = [r for r in results.rows if "skipped" not in r and r["impl"] in
             ("circuslink", "circuslink-ll", "circuslink-bulk", "nccl", *NVSHMEM_FORMS, "mpi", "mpi-host-staged")]
    for r in shown:
        r.setdefault("one_way_us", r.get("latency_us"))
    extra_lat: dict = {}
    extra_bw: dict = {}
    if results.meta.get("runs_kernels", True):  # the floor envelope is a GPU figure: no line of it on a cpu plot
        floor = floor_pair(results)
        sizes = sorted({r["bytes"] for r in shown})
        env = [(n, envelope_us(floor, n)) for n in sizes if envelope_us(floor, n)]
        extra_lat = {"floor: latency + size / raw bandwidth": env}
        extra_bw = {"floor": [(n, n / (t * 1e3)) for n, t in env]}
    drv.figure(path, [
        drv.panel(shown, "bytes", "one_way_us", "impl", "pingpong one-way time", "message size (bytes)",
                  "one-way time (us, median)", extra=extra_lat),
        drv.panel(shown, "bytes", "throughput_GBps", "impl", "pingpong throughput", "message size (bytes)", "GB/s",
                  extra=extra_bw)])
