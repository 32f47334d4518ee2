"""Persistent RMA queues against MPI-3 RMA, MPI persistent point-to-point and NCCL: ``circuslink bench rma``.

Every rank writes a chain of k writes of s bytes to each neighbour in a ring (a halo
exchange: with 2 ranks, the two write into each other; with more, each rank writes to its
left and its right neighbour and receives from both), for k in --chains and s in --sizes,
contiguous and block-stride ("strided": blocks of min(s, 512) B, source stride 2 blocks,
destination stride 3, no packing); a chain never holds more than --max-chain-bytes (16 MiB; pairs
k x s beyond it are left out), so the run stays short. One row per
impl x layout x chain x size. Timing as nccl-tests does it: a handshake cycle (on the device for the
device-driven and graphed forms) before the clock, then --samples samples of --iters/--samples cycles
each (fewer for chains of many MiB: a sample moves at most 256 MiB); each sample's time is the slowest
rank's, ``time_us`` is their median per cycle and ``time_min_us`` the fastest sample;
``throughput_GBps`` the bytes one rank writes per cycle (``total_bytes``) over the median time.
The run's floor (``circuslink probe``) is in the results, and the verdicts against the targets
(device-driven 8 x 8 B <= 3 x the relaxed floor, graphed <= 10 us, both <= 0.1 x MPI-3 RMA,
16 MiB chains >= 0.8 x the floor's copy-engine bandwidth, strided >= 0.8 x contiguous) are printed
and stored under ``meta["targets"]``, with the 16 MiB target's limit on this machine: the probe's copy-engine
figure is one copy with the GPU to itself, so the run also times the copy engine making the same writes with every
rank at once and no queue (``copy-engine-same-writes``, chains of 1 MiB and more).

impls: ``rma-host`` (start(); wait() from Python: one graph launch and a bounded wait on a back-end
that runs kernels), ``rma-host-graphed`` (back-ends that run kernels: ``q.start(stream=)`` and
``q.wait(stream=, block=False)`` enqueued for a sample's cycles inside one CUDA graph capture,
event-timed: what a host-driven cycle costs on the GPU without Python), ``rma-host-graphed-cycle`` (the same
with ``q.cycle(stream=)``: start and wait as one launch, one node a cycle), ``rma-device`` (start and
wait inside one kernel, ``kernels/rma_cycles.cu``, through the public ``<circuslink/rma.cuh>`` and
``q.device_handle()``), ``rma-device-session`` (the same one-block cycles through an ``rma_session``, whose
start and wait keep the queue's addresses in registers: low-latency queues every rank's block holds), ``mpi3-rma``
(the mpi
windows: MPI_Put in PSCW epochs, host-staged with a GPU), ``mpi-persistent-p2p``
(Send_init/Recv_init, Startall, Waitall, host-staged), ``nccl-grouped-sendrecv`` (contiguous
only), ``nvshmem-put-signal-chain`` / ``-grid`` (NVSHMEM put-with-signal chains in the same ring with
the same post / write / signal protocol, one thread or a grid, ``baselines.nvshmem_rma_chains``), and
the floor from ``circuslink probe``. Set CIRCUSLINK_RMA_LAUNCH=graph to copy with the copy engine,
=kernel for SM copies, at every size (default auto: the copy engine for large chains of large blocks,
``launch`` in each row; both are one graph launch a cycle). Device-driven chains of at least
DEVICE_GRID_FROM_BYTES a cycle run on a co-resident grid (``device_blocks`` in the row).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._wait import Deadline
from ..errors import ConfigError, RmaError

_CHAINS = "1,8"
_SIZES = "8,64,4K,64K,1M,16M"
_STRIDED_BLOCK = 512
_SAMPLES = 10
_MAX_CHAIN = "16M"
_SAMPLE_BYTES = 256 << 20  # a sample of a long chain moves at most this much: the run stays short
_KERNEL_FILE = Path(__file__).parent / "kernels" / "rma_cycles.cu"
# Device-driven chains of at least this many bytes a cycle run on every block of a co-resident grid
# (rma_start_grid): one block's copies reach a few tens of GB/s, a grid barrier costs a few microseconds.
DEVICE_GRID_FROM_BYTES = 256 << 10
_DEVICE_THREADS = 256  # the one-block device-driven rows' block
SAME_COPIES_FROM_BYTES = 1 << 20  # copy-engine-same-writes rows: chains of at least this many bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _driver as drv

    drv.add_common_arguments(parser, default_sizes=_SIZES, default_iters=200, default_warmup=20)
    parser.add_argument("--chains", default=_CHAINS, help=f"writes per chain (default {_CHAINS})")
    parser.add_argument("--max-chain-bytes", default=_MAX_CHAIN,
                        help=f"leave out chains x sizes that write more than this per neighbour (default {_MAX_CHAIN})")
    parser.add_argument("--samples", type=drv.positive_int, default=_SAMPLES,
                        help=f"samples per row, --iters cycles split among them (default {_SAMPLES}); the "
                             "median and the minimum are reported")
    parser.add_argument("--layouts", default="contiguous,strided", help="contiguous, strided or both")


def _parse_chains(text: str) -> list[int]:
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if not tok.isdigit() or int(tok) <= 0:
            raise ConfigError(f"--chains {text!r}: bad chain length {tok!r} (positive integers, e.g. 1,4,8,16)")
        out.append(int(tok))
    return out


def _max_chain(args: argparse.Namespace) -> int:
    from . import _driver as drv

    values = drv.parse_sizes(args.max_chain_bytes, "--max-chain-bytes")
    if len(values) != 1:
        raise ConfigError(f"--max-chain-bytes {args.max_chain_bytes!r}: one size, e.g. 16M")
    return values[0]


def _layout(layout: str, nbytes: int) -> tuple[int, int, int, int]:
    """(count, block, src_stride, dst_stride) of one write."""
    if layout == "contiguous" or nbytes <= _STRIDED_BLOCK:
        return 1, nbytes, nbytes, nbytes
    block = _STRIDED_BLOCK
    return nbytes // block, block, 2 * block, 3 * block


def run(args: argparse.Namespace) -> int:
    from .. import launcher
    from . import _driver as drv

    if not launcher.inside_job():
        _yield_when_idle(args.nranks)
        pairs = _pairs(_parse_chains(args.chains), drv.parse_sizes(args.sizes), _max_chain(args))
        # A window holds, per neighbour, a source region of 2 x and a slot of 3 x the longest chain, with both
        # neighbours: 10 x, in units of the largest size.
        longest = max(c * s for c, s in pairs) / max(drv.parse_sizes(args.sizes))
        return launcher.relaunch_self(args.nranks, args.backend, prefer_mpirun=True, mps_mode=args.mps,
                                      **drv.memory_per_rank(args, 10 * longest, 1 << 20))
    return _run_rank(args)


def _yield_when_idle(nranks: int) -> None:
    """With no spare core per rank, make Open MPI's blocking calls yield instead of busy-polling.

    A rank spinning in MPI_Waitall or MPI_Finalize on a shared 2-core machine starves the
    peer it waits for. mpirun hands OMPI_MCA_* variables to the ranks; a value the user set wins.
    """
    from .._sysinfo import cores

    if cores() < 2 * nranks:
        os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def _end_of_job(world: Any) -> None:
    """Hold every rank until all are done with the rendezvous store, then let them exit.

    Under mpirun rank 0 hosts the store on a thread of its own process. After the last
    store barrier rank 0 may return before a slower peer has read its reply or sent the
    barrier's clean-up ``delete``; rank 0 then finalizes Python (the store thread dies) and
    waits in MPI_Finalize for that peer, which waits forever on the store socket. An MPI
    barrier after the store barrier (a peer enters it only after its last store call)
    closes that window; it is polled so that it has the job's time-out too.
    """
    comm = world.mpi_comm
    if comm is None:
        return
    from ..rma._mpi import poll_request

    poll_request(comm.Ibarrier(), None,
                 lambda: f"bench rma: the end-of-job barrier on rank {world.rank}: rank(s) of {world.size} did not "
                         "arrive")


def _run_rank(args: argparse.Namespace) -> int:
    import circuslink

    from . import _driver as drv

    world = circuslink.init(args.backend)
    if world.size < 2:
        raise ConfigError(f"bench rma needs at least 2 ranks (a ring), this job has {world.size} (-n 2 or more)")
    sizes = drv.parse_sizes(args.sizes)
    chains = _parse_chains(args.chains)
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    for x in layouts:
        if x not in ("contiguous", "strided"):
            raise ConfigError(f"--layouts: unknown layout {x!r} (contiguous, strided)")
    iters, warmup = args.iters, args.warmup
    if args.quick:
        sizes = sizes[:: max(1, len(sizes) // 3)][:3] if len(sizes) > 3 else sizes
        chains = [c for c in chains if c in (1, 8)] or chains[:1]
        iters, warmup = min(iters, 20), min(warmup, 3)
    if not world.backend.runs_kernels:  # host copies: the large sizes would only make the job long
        sizes = [s for s in sizes if s <= (1 << 20)] or [8]

    results = drv.Results("rma", world)
    from .. import probe

    drv.progress("rma: measuring the floor (probe)")
    results.floor = probe.measure(world, quick=True, pairs=[(0, 1), (1, 0)])  # the ring's links are alike
    results.meta.update(chains=chains, layouts=layouts, iters=iters, warmup=warmup,
                        launch=os.environ.get("CIRCUSLINK_RMA_LAUNCH", "auto"),
                        mpi_yield_when_idle=os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
                        strided_block=_STRIDED_BLOCK, launched_by=world.launched_by,
                        samples=min(args.samples, iters), sample_bytes_max=_SAMPLE_BYTES)
    bench = _Bench(world, sizes, chains, iters, warmup, results, samples=min(args.samples, iters),
                   max_chain=_max_chain(args))
    bench.ours(layouts)
    bench.copy_engine()  # the machine's limit for the large chains (as the floor is, not a peer's baseline)
    if not args.no_baselines:
        bench.mpi3_rma(layouts)
        bench.mpi_p2p()
        bench.nccl()
        bench.nvshmem(layouts)
    if world.rank == 0:
        def draw(path: str) -> None:  # one panel per chain length
            panels = []
            for chain in chains:
                rows = [dict(r, series=f"{r['impl']} {r.get('layout', '')}") for r in results.rows
                        if r.get("chain") == chain and r.get("time_us")]
                if rows:
                    panels.append(drv.panel(rows, "bytes", "time_us", "series",
                                            f"RMA chain of {chain} writes, start-to-wait", "bytes per write",
                                            "us per cycle"))
            drv.figure(path, panels)

        results.meta["targets"] = targets(results.rows, results.floor)

        def report() -> None:
            drv.print_table(results.rows, ["impl", "layout", "chain", "bytes", "time_us", "time_min_us",
                                           "throughput_GBps", "skipped"],
                            "rma: start-to-wait per cycle (median over samples, slowest rank)", args)
            for line in results.meta["targets"]["lines"]:
                print(line)

        drv.finish(results, args, report, draw)
    world.barrier()
    _end_of_job(world)
    return 0


def _pairs(chains: list[int], sizes: list[int], most: int) -> list[tuple[int, int]]:
    """(chain, size) of every row: chains writing more than ``most`` bytes are left out (they would only make
    the window and the run larger; the same bytes are measured as fewer, larger writes). Refused if none is
    left."""
    pairs = [(c, s) for c in chains for s in sizes if c * s <= most]
    if not pairs:
        raise ConfigError(f"--max-chain-bytes {most}: every chain x size writes more; raise it or shorten --chains")
    return pairs


def _summary(per_rank: list[list[float]], ops: int) -> dict:
    """Median / minimum per cycle over samples, each sample the slowest rank's (seconds -> us)."""
    slowest = [max(t) / ops for t in zip(*per_rank, strict=True)]
    return {"seconds": float(np.median(slowest)), "time_min_us": min(slowest) * 1e6, "samples": len(slowest),
            "cycles_per_sample": ops}


class _Bench:
    def __init__(self, world: Any, sizes: list[int], chains: list[int], iters: int, warmup: int, results: Any,
                 samples: int = _SAMPLES, max_chain: int = 16 << 20):
        self.world = world
        self.sizes = sizes
        self.chains = chains
        self.pairs = _pairs(chains, sizes, max_chain)
        self.iters = iters
        self.warmup = warmup
        self.samples = max(1, min(samples, iters))
        self.results = results
        n, me = world.size, world.rank
        self.right, self.left = (me + 1) % n, (me - 1) % n
        # (target rank, slot in the target's window): slot 0 receives from the target's left
        # neighbour, slot 1 from its right; with 2 ranks the one peer is both and one write suffices.
        self.targets = [(self.right, 0)] + ([(self.left, 1)] if n > 2 else [])
        # (origin rank, its source region, my slot) for every write I receive, in the order of
        # `targets`: the left neighbour writes to its right (me) from its region 0 into my slot 0.
        self.incoming = [(self.left, 0, 0)] + ([(self.right, 1, 1)] if n > 2 else [])
        self.origins = sorted({self.left, self.right})
        biggest = max(c * s for c, s in self.pairs)
        self.region = 2 * biggest            # strided sources span two blocks per block
        self.src_bytes = len(self.targets) * self.region  # one source region per target
        self.slot_bytes = 3 * biggest
        self.nbytes = self.src_bytes + 2 * self.slot_bytes

    def _ops(self, chain: int, nbytes: int) -> int:
        """Cycles per sample: --iters split among the samples, fewer when a sample would move > 256 MiB."""
        per_cycle = chain * nbytes * len(self.targets)
        return max(1, min(self.iters // self.samples, _SAMPLE_BYTES // max(1, per_cycle)))

    def _row(self, impl: str, layout: str, chain: int, nbytes: int, seconds: float, **extra: Any) -> None:
        us = seconds * 1e6
        total = chain * nbytes * len(self.targets)
        self.results.add(impl=impl, layout=layout, chain=chain, bytes=nbytes, total_bytes=total, time_us=us,
                         latency_us=us, throughput_GBps=total / seconds / 1e9 if seconds > 0 else None,
                         neighbours=len(self.targets), **extra)

    def _sampled_row(self, impl: str, layout: str, chain: int, nbytes: int, mine: list[float], ops: int,
                     **extra: Any) -> None:
        """A row from my per-sample seconds (collective: the slowest rank's samples)."""
        stats = _summary(self.world.allgather_object(mine), ops)
        self._row(impl, layout, chain, nbytes, stats.pop("seconds"), **stats, **extra)

    def _offsets(self, j: int, slot: int, i: int, nbytes: int) -> tuple[int, int]:
        """(source offset in my window, destination offset in the target's) of write i of my chain to target j
        (which receives it in its slot ``slot``)."""
        return j * self.region + i * 2 * nbytes, self.src_bytes + slot * self.slot_bytes + i * 3 * nbytes

    def _declare(self, rma: Any, win: Any, layout: str, chain: int, nbytes: int):
        q = rma.Queue.alloc(win)
        count, block, ss, ds = _layout(layout, nbytes)
        for j, (target, slot) in enumerate(self.targets):
            for i in range(chain):
                src_off, dst_off = self._offsets(j, slot, i, nbytes)
                if count == 1:
                    q.push(rma.declare_write(win, dst_off, win, src_off, nbytes, target))
                else:
                    q.push(rma.declare_strided_write(win, dst_off, win, src_off, count, block, ss, ds, target))
        for origin in self.origins:
            q.add_origin(origin)
        return q

    def _verify(self, win: Any, layout: str, chain: int, nbytes: int, seed: int) -> None:
        """The last cycle's incoming bytes equal the origins' sources: first and last block of every write."""
        xp = self.world.xp
        count, block, ss, ds = _layout(layout, nbytes)
        got = win.local
        for origin, region, slot in self.incoming:
            origin_src = xp.asarray(np.random.default_rng([seed, origin]).integers(
                0, 256, self.src_bytes, dtype=np.uint8))[region * self.region:]
            for i in range(chain):
                src = origin_src[i * 2 * nbytes: i * 2 * nbytes + (count - 1) * ss + block]
                at = self.src_bytes + slot * self.slot_bytes + i * 3 * nbytes
                dst = got[at: at + (count - 1) * ds + block]
                for b in (0, count - 1):
                    if not bool((src[b * ss: b * ss + block] == dst[b * ds: b * ds + block]).all()):
                        raise RmaError(f"bench rma: rank {self.world.rank} received wrong bytes from rank {origin} "
                                       f"({layout}, chain {chain}, {nbytes} B, write {i}, block {b})")

    def _fill(self, win: Any, seed: int) -> None:
        data = np.random.default_rng([seed, self.world.rank]).integers(0, 256, self.src_bytes, dtype=np.uint8)
        win.local[: self.src_bytes] = self.world.xp.asarray(data)

    def _cycles(self, q: Any, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            q.start()
            q.wait()
        return time.perf_counter() - t0

    def _run_queue_rows(self, memory: str, impl: str, layouts: list[str], extra_impls: bool) -> None:
        from .. import rma
        from . import _driver as drv

        win = rma.window_alloc(self.world, self.nbytes, memory=memory)
        try:
            for layout in layouts:
                for chain, nbytes in self.pairs:
                    drv.progress(f"rma: {impl} {layout} chain {chain} x {drv.format_bytes(nbytes)}")
                    seed = int(self.world.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 31))))
                    self._fill(win, seed)
                    q = self._declare(rma, win, layout, chain, nbytes)
                    q.commit()
                    self._cycles(q, self.warmup)
                    self.world.barrier()
                    self._cycles(q, 1)  # the handshake: every rank is past it before the first sample's clock
                    ops = self._ops(chain, nbytes)
                    mine = [self._cycles(q, ops) for _ in range(self.samples)]
                    self._verify(win, layout, chain, nbytes, seed)
                    launch = {"launch": q.describe()["launch"]} if "launch" in q.describe() else {}
                    self._sampled_row(impl, layout, chain, nbytes, mine, ops, **launch)
                    if extra_impls and self.world.backend.runs_kernels:
                        self._device_rows(q, layout, chain, nbytes, ops, launch)
                    self.world.barrier()
                    q.free()
        finally:
            win.free()

    def _device_rows(self, q: Any, layout: str, chain: int, nbytes: int, ops: int, launch: dict) -> None:
        """rma-host-graphed and rma-device, through the queue's public hooks."""
        import cupy as cp

        stream = self.world.backend.stream

        def one_at_a_time(capture: Any) -> None:
            q.start(stream=capture)
            q.wait(stream=capture, block=False)  # each captured wait keeps the queue's time-out

        # A sample's cycles captured in one CUDA graph: start and wait enqueued one after the other (two nodes a
        # cycle with SM copies), and as one cycle each (one node).
        for impl, enqueue in (("rma-host-graphed", one_at_a_time),
                              ("rma-host-graphed-cycle", lambda capture: q.cycle(stream=capture))):
            capture = cp.cuda.Stream(non_blocking=True)
            capture.begin_capture()
            try:
                for _ in range(ops):
                    enqueue(capture)
            finally:
                graph = capture.end_capture()
            self.world.barrier()
            graph.launch(stream)  # the handshake: the first sample's clock starts once every rank has cycled
            events = [cp.cuda.Event() for _ in range(self.samples + 1)]
            events[0].record(stream)
            for k in range(self.samples):
                graph.launch(stream)
                events[k + 1].record(stream)
            q.check_device()  # waits for the world's stream (bounded), raises a recorded time-out
            mine = [cp.cuda.get_elapsed_time(events[k], events[k + 1]) * 1e-3 for k in range(self.samples)]
            self._sampled_row(impl, layout, chain, nbytes, mine, ops, **launch)
            self.world.barrier()
        grid = chain * nbytes * len(self.targets) >= DEVICE_GRID_FROM_BYTES
        self._device_cycles(q, min(self.warmup, ops), 1, grid)
        self.world.barrier()
        done, mine, blocks = self._device_cycles(q, ops, self.samples, grid)
        if done != ops * self.samples:
            raise RmaError(f"bench rma: device-driven cycles stopped after {done} of {ops * self.samples}")
        self._sampled_row("rma-device", layout, chain, nbytes, mine, ops, device_blocks=blocks)
        # The same cycles through an rma_session, where every rank's block of 256 holds its queue.
        need = q.describe().get("session_threads")
        if not grid and all(t is not None and t <= _DEVICE_THREADS for t in self.world.allgather_object(need)):
            self.world.barrier()
            self._device_cycles(q, min(self.warmup, ops), 1, False, session=True)
            self.world.barrier()
            done, mine, _ = self._device_cycles(q, ops, self.samples, False, session=True)
            if done != ops * self.samples:
                raise RmaError(f"bench rma: session cycles stopped after {done} of {ops * self.samples}")
            self._sampled_row("rma-device-session", layout, chain, nbytes, mine, ops, device_blocks=1)

    def _device_cycles(self, q: Any, ops: int, samples: int, grid: bool, session: bool = False
                       ) -> tuple[int, list[float], int]:
        """A handshake cycle, then ``samples`` x ``ops`` start+wait cycles inside one kernel: one block
        (rma_start / rma_wait; with ``session`` an rma_session's start / wait), or with ``grid`` every block of a
        co-resident grid of as many blocks as the rank's SM share holds (rma_start_grid / rma_wait_grid). (Cycles
        done after the handshake, seconds of each sample, blocks.)"""
        import cupy as cp

        if getattr(self, "_k_cycles", None) is None:
            from ..device_code import compile as compile_device

            module = compile_device(_KERNEL_FILE.read_text())
            self._k_cycles = module.get_function("bench_rma_device_cycles")
            self._k_cycles_grid = module.get_function("bench_rma_device_cycles_grid")
            self._k_cycles_session = module.get_function("bench_rma_device_session_cycles")
        out = cp.zeros(1 + samples, dtype=cp.uint64)
        backend = self.world.backend
        backend.after_caller()  # `out` was zeroed on the caller's stream
        if grid:
            blocks = backend.max_blocks(self._k_cycles_grid, 256)
            bar = backend.grid_barrier(timeout=q.timeout)
            backend.launch_resident(self._k_cycles_grid, blocks, 256, (q.device_handle(), bar.device_handle(),
                                    np.uint64(ops), np.uint64(samples), out), stream=backend.stream)
        else:
            blocks = 1
            kernel = self._k_cycles_session if session else self._k_cycles
            with backend.stream:
                kernel((1,), (_DEVICE_THREADS,), (q.device_handle(), np.uint64(ops), np.uint64(samples), out))
        q.check_device()
        got = [int(x) for x in out.get(stream=backend.stream)]
        return got[0], [ns * 1e-9 for ns in got[1:]], blocks

    def ours(self, layouts: list[str]) -> None:
        self._run_queue_rows("mapped", "rma-host", layouts, extra_impls=True)

    def copy_engine(self) -> None:
        """``copy-engine-same-writes``: every rank's contiguous chain as plain copy-engine copies into the same
        places of its targets (cudaMemcpyAsync into the mapped peers, one after another on one stream as the
        queue's copy-engine graph issues them; a sample's cycles in one CUDA graph), every rank at once after a
        device-side handshake, and no queue: what this GPU gives this traffic when every rank copies at the same
        time. The probe's copy-engine figure is one copy with the GPU to itself; on one GPU under MPS the ranks'
        copies share its memory, so this row is the limit the 16 MiB target meets there. Chains of at least
        SAME_COPIES_FROM_BYTES (below, the copies' launch costs, not the memory)."""
        from . import _driver as drv

        impl = "copy-engine-same-writes"
        pairs = [(c, s) for c, s in self.pairs if c * s >= SAME_COPIES_FROM_BYTES]
        if not pairs:
            return
        if not self.world.backend.runs_kernels:
            for chain, nbytes in pairs:
                self.results.add(impl=impl, layout="contiguous", chain=chain, bytes=nbytes,
                                 skipped="needs GPUs (the cuda back-end's copy engines)")
            return
        import cupy as cp

        from .. import rma

        rt = cp.cuda.runtime
        stream = self.world.backend.stream
        win = rma.window_alloc(self.world, self.nbytes, memory="mapped")
        try:
            local = int(win.local.data.ptr)
            for chain, nbytes in pairs:
                drv.progress(f"rma: {impl} chain {chain} x {drv.format_bytes(nbytes)}")
                seed = int(self.world.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 31))))
                self._fill(win, seed)
                cp.cuda.get_current_stream().synchronize()  # the sources are in place before any copy reads them
                # The handshake: one 8-byte cycle of a queue (on the device, as the graphed rows' is), writing
                # the first word of each first write: the bytes the copies write there too.
                hand = rma.Queue.alloc(win)
                copies = []
                for j, (target, slot) in enumerate(self.targets):
                    src_off, dst_off = self._offsets(j, slot, 0, nbytes)
                    hand.push(rma.declare_write(win, dst_off, win, src_off, 8, target))
                    peer = int(win.peer(target).data.ptr)
                    copies += [(peer + d, local + s) for s, d in (self._offsets(j, slot, i, nbytes)
                                                                   for i in range(chain))]
                for origin in self.origins:
                    hand.add_origin(origin)
                hand.commit()
                ops = self._ops(chain, nbytes)
                capture = cp.cuda.Stream(non_blocking=True)
                capture.begin_capture()
                try:
                    for _ in range(ops):
                        for dst, src in copies:
                            rt.memcpyAsync(dst, src, nbytes, rt.memcpyDefault, capture.ptr)
                finally:
                    graph = capture.end_capture()
                graph.upload(stream)
                graph.launch(stream)  # warm-up
                self.world.barrier()
                starts, ends = [cp.cuda.Event() for _ in range(self.samples)], [cp.cuda.Event() for _ in
                                                                                range(self.samples)]
                for k in range(self.samples):
                    hand.start(stream=stream)  # every rank's copies begin once every rank is here
                    hand.wait(stream=stream, block=False)
                    starts[k].record(stream)
                    graph.launch(stream)
                    ends[k].record(stream)
                hand.check_device()  # waits for the world's stream (bounded), raises a recorded time-out
                mine = [cp.cuda.get_elapsed_time(starts[k], ends[k]) * 1e-3 for k in range(self.samples)]
                self.world.barrier()  # every origin's copies into my window are done
                self._verify(win, "contiguous", chain, nbytes, seed)
                self._sampled_row(impl, "contiguous", chain, nbytes, mine, ops, launch="graph")
                hand.free()
        finally:
            win.free()

    def _skip(self, impl: str, reason: str, layouts: list[str]) -> None:
        for layout in layouts:
            for chain, nbytes in self.pairs:
                self.results.add(impl=impl, layout=layout, chain=chain, bytes=nbytes, skipped=reason)

    def mpi3_rma(self, layouts: list[str]) -> None:
        if self.world.mpi_comm is None:
            self._skip("mpi3-rma", "not started by mpirun (needs mpirun and mpi4py)", layouts)
            return
        self._run_queue_rows("mpi3", "mpi3-rma", layouts, extra_impls=False)

    def mpi_p2p(self) -> None:
        from . import _driver as drv

        comm = self.world.mpi_comm
        impl = "mpi-persistent-p2p"
        if comm is None:
            self._skip(impl, "not started by mpirun (needs mpirun and mpi4py)", ["contiguous"])
            return
        from ..rma._mpi import bounded

        MPI = self.world.mpi.MPI  # noqa: N806 - the module, from the world's bootstrap

        xp = self.world.xp
        on_gpu = self.world.device is not None  # the data lives on the GPU: stage it as a user of MPI would
        for chain, nbytes in self.pairs:
            drv.progress(f"rma: {impl} chain {chain} x {drv.format_bytes(nbytes)}")
            total = len(self.targets) * chain * nbytes
            send_host = np.random.default_rng().integers(0, 256, total, dtype=np.uint8)
            recv_host = np.zeros(total, dtype=np.uint8)
            send_dev = xp.asarray(send_host) if on_gpu else None
            recv_dev = xp.zeros(total, dtype=np.uint8) if on_gpu else None
            reqs = []
            # Send j goes to target j; the matching receive (tag = slot, write) comes from the
            # neighbour on the other side, which sends me its own part j.
            for j, ((target, slot), (origin, _, my_slot)) in enumerate(zip(self.targets, self.incoming,
                                                                           strict=True)):
                for i in range(chain):
                    part = slice((j * chain + i) * nbytes, (j * chain + i + 1) * nbytes)
                    reqs.append(comm.Recv_init(recv_host[part], origin, tag=my_slot * chain + i))
                    reqs.append(comm.Send_init(send_host[part], target, tag=slot * chain + i))

            def stalled(chain=chain, nbytes=nbytes) -> str:
                return (f"bench rma: {impl} (chain {chain} x {nbytes} B) on rank {self.world.rank}: MPI_Waitall "
                        f"waiting for neighbour rank(s) {', '.join(map(str, self.origins))}")

            def cycle(reqs=reqs, send_dev=send_dev, send_host=send_host, recv_dev=recv_dev,
                      recv_host=recv_host) -> None:
                if on_gpu:  # stage out, exchange, stage in: what a user of a non-CUDA-aware MPI does
                    send_dev.get(out=send_host)
                MPI.Prequest.Startall(reqs)
                MPI.Request.Waitall(reqs)
                if on_gpu:
                    recv_dev.set(recv_host)
                    xp.cuda.get_current_stream().synchronize()

            # Waitall itself (not a Test loop) is what a user of MPI measures; the watchdog bounds
            # each loop of cycles (arming it per cycle would add ~1 us to a ~3 us exchange).
            with bounded(Deadline.after(None), stalled):
                for _ in range(self.warmup):
                    cycle()
            self.world.barrier()
            ops = self._ops(chain, nbytes)
            mine = []
            with bounded(Deadline.after(None), stalled):
                cycle()  # the handshake
                for _ in range(self.samples):
                    t0 = time.perf_counter()
                    for _ in range(ops):
                        cycle()
                    mine.append(time.perf_counter() - t0)
            sent = self.world.allgather_object(send_host.tobytes())
            for j, (origin, region, _) in enumerate(self.incoming):
                want = sent[origin][region * chain * nbytes: (region + 1) * chain * nbytes]
                if recv_host[j * chain * nbytes: (j + 1) * chain * nbytes].tobytes() != want:
                    raise RmaError(f"bench rma: {impl} on rank {self.world.rank} received wrong bytes "
                                   f"from rank {origin}")
            for r in reqs:
                r.Free()
            self._sampled_row(impl, "contiguous", chain, nbytes, mine, ops)

    def nccl(self) -> None:
        from . import _driver as drv

        if self.world.device is None:
            self._skip("nccl-grouped-sendrecv", "needs GPUs (the cuda back-end)", ["contiguous"])
            return
        from .baselines import nccl_grouped_sendrecv

        for chain, nbytes in self.pairs:
            drv.progress(f"rma: nccl-grouped-sendrecv chain {chain} x {drv.format_bytes(nbytes)}")
            plan = [(target, nbytes) for target, _ in self.targets for _ in range(chain)]
            row = nccl_grouped_sendrecv(self.world, plan, self.iters, self.warmup)
            row = dict(row, layout="contiguous", chain=chain, bytes=nbytes,
                       total_bytes=len(self.targets) * chain * nbytes, neighbours=len(self.targets))
            self.results.add(**row)


    def nvshmem(self, layouts: list[str]) -> None:
        """NVSHMEM put-with-signal chains of the same pairs and layouts, in a ring of as many PEs as the job has
        ranks, run by rank 0 while the others wait; rows as ours (or one skipped row saying why not)."""
        from . import _driver as drv

        if not self.world.backend.runs_kernels:
            self._skip("nvshmem-put-signal-chain", "needs GPUs (the cuda back-end)", layouts)
            return
        from .baselines import nvshmem_rma_chains

        self.world.barrier()
        if self.world.rank == 0:
            drv.progress(f"rma: nvshmem put-with-signal chains on {self.world.size} PEs")
            try:
                rows = nvshmem_rma_chains(self.world.size, self.pairs, layouts=layouts, iters=self.iters,
                                          warmup=self.warmup, samples=self.samples, sample_bytes=_SAMPLE_BYTES,
                                          timeout=NVSHMEM_TIMEOUT_S)
            except Exception as exc:  # a baseline that cannot run is reported, not fatal
                rows = [{"impl": "nvshmem-put-signal-chain", "bytes": 0, "skipped": f"{type(exc).__name__}: {exc}"}]
            for row in rows:
                self.results.add(**row)
        self.world.barrier(timeout=3600)  # the others wait while rank 0 runs the NVSHMEM program


NVSHMEM_TIMEOUT_S = 300

# The targets of persistent RMA queues at chaining-DMA cost (docs/rma.md, "Benchmark").
DEVICE_VS_FLOOR = 3.0       # device-driven chain of 8 x 8 B, start to wait, at most this many relaxed floors
GRAPHED_MAX_US = 10.0       # host-driven (graphed) start to wait
VS_MPI3_MAX = 0.1           # both, against MPI-3 RMA's cycle of the same chain
LARGE_CHAIN_BYTES = 16 << 20
LARGE_VS_CE = 0.8           # 16 MiB chains, against the floor's copy-engine bandwidth
STRIDED_VS_CONTIGUOUS = 0.8  # strided against contiguous at the same bytes (throughput)


def targets(rows: list[dict], floor: dict | None) -> dict:
    """The verdicts of a run: ``lines`` (one printable line each, 'met' / 'MISSED' / 'not measured') and the
    ratios they rest on. Medians of the slowest rank; the floor is this run's (pair 0 -> 1)."""
    summary = (floor or {}).get("summary") or {}
    lat, ce = summary.get("lat_relaxed_us"), summary.get("ce_GBps")
    timed = {(r["impl"], r.get("layout"), r.get("chain"), r.get("bytes")): r for r in rows
             if r.get("time_us") and "skipped" not in r}
    out: dict[str, Any] = {"lines": []}

    def line(name: str, value: float | None, ok: bool | None, text: str) -> None:
        out[name] = value
        verdict = "not measured" if ok is None else ("met" if ok else "MISSED")
        out["lines"].append(f"target: {text}: {verdict}")

    # Device-driven: the faster of the two device forms (rma_start / rma_wait, or an rma_session), each a kernel
    # through the public <circuslink/rma.cuh>.
    forms = [timed[k] for k in (("rma-device", "contiguous", 8, 8), ("rma-device-session", "contiguous", 8, 8))
             if k in timed]
    device = min(forms, key=lambda r: r["time_us"], default=None)
    ratio = device["time_us"] / lat if device and lat else None
    line("device_8x8_vs_floor", ratio, None if ratio is None else ratio <= DEVICE_VS_FLOOR,
         f"device-driven 8 x 8 B start-to-wait <= {DEVICE_VS_FLOOR:g} x the relaxed floor"
         + (f" ({device['impl']} {device['time_us']:.3f} us = {ratio:.2f} x {lat:.3f} us)" if ratio is not None
            else ""))
    def best(impls: tuple[str, ...], chain: int) -> dict | None:
        """The faster form of a chain of 8-byte writes (each form one a user can write with the public API)."""
        return min((timed[k] for k in ((i, "contiguous", chain, 8) for i in impls) if k in timed),
                   key=lambda r: r["time_us"], default=None)

    graphs = ("rma-host-graphed", "rma-host-graphed-cycle")  # start and wait enqueued apart, or as one cycle
    graphed = [r for r in (best(graphs, c) for c in (1, 8)) if r is not None]
    slowest = max(graphed, key=lambda r: r["time_us"], default=None)
    worst = None if slowest is None else slowest["time_us"]
    line("graphed_8B_us", worst, None if worst is None else worst <= GRAPHED_MAX_US,
         f"host-driven (graphed) 1 and 8 x 8 B start-to-wait <= {GRAPHED_MAX_US:g} us"
         + (f" (worst {worst:.2f} us, {slowest['impl']})" if slowest is not None else ""))
    vs = []
    for impls in (("rma-device", "rma-device-session"), graphs):
        for chain in (1, 8):
            ours, mpi = best(impls, chain), timed.get(("mpi3-rma", "contiguous", chain, 8))
            if ours and mpi:
                vs.append(ours["time_us"] / mpi["time_us"])
    worst = max(vs, default=None)
    line("small_vs_mpi3", worst, None if worst is None else worst <= VS_MPI3_MAX,
         f"device-driven and graphed 8 B chains <= {VS_MPI3_MAX:g} x MPI-3 RMA"
         + (f" (worst {worst:.3f} x)" if worst is not None else ""))
    large = [r for k, r in timed.items() if k[0] == "rma-host-graphed" and k[1] == "contiguous"
             and k[2] * k[3] == LARGE_CHAIN_BYTES]
    worst = min((r["throughput_GBps"] / r["neighbours"] / ce for r in large), default=None) if ce else None
    line("large_vs_copy_engine", worst, None if worst is None else worst >= LARGE_VS_CE,
         f"16 MiB chains (graphed, per neighbour) >= {LARGE_VS_CE:g} x the copy-engine bandwidth"
         + (f" (worst {worst:.2f} x {ce:.0f} GB/s)" if worst is not None else ""))
    # The same target's limit on this machine: the copy engine making the same writes with every rank at once.
    same = {(k[2], k[3]): r for k, r in timed.items() if k[0] == "copy-engine-same-writes" and k[1] == "contiguous"}
    pairs = [(r, same[(r["chain"], r["bytes"])]) for r in large if (r["chain"], r["bytes"]) in same]
    ours_vs = min((c["time_us"] / r["time_us"] for r, c in pairs), default=None)
    limit = min((c["throughput_GBps"] / c["neighbours"] / ce for _, c in pairs), default=None) if ce else None
    out["large_vs_same_copies"], out["same_copies_vs_copy_engine"] = ours_vs, limit
    if ours_vs is not None:
        within = "" if limit is None else (
            f"; those copies reach {limit:.2f} x the lone copy-engine figure, so the target's {LARGE_VS_CE:g} x is "
            + ("within" if limit >= LARGE_VS_CE else "beyond") + " what this machine gives the traffic")
        out["lines"].append(f"limit: 16 MiB chains (graphed) reach {ours_vs:.2f} x the copy engine making the same "
                            f"writes, every rank at once, with no queue{within}")
    ratios = []
    for (impl, layout, chain, nbytes), r in timed.items():
        contiguous = timed.get((impl, "contiguous", chain, nbytes))
        if impl == "rma-host-graphed" and layout == "strided" and nbytes >= 64 << 10 and contiguous:
            ratios.append(contiguous["time_us"] / r["time_us"])
    worst = min(ratios, default=None)
    line("strided_vs_contiguous", worst, None if worst is None else worst >= STRIDED_VS_CONTIGUOUS,
         f"strided >= {STRIDED_VS_CONTIGUOUS:g} x contiguous at the same bytes (graphed, 64 KiB and up)"
         + (f" (worst {worst:.2f} x)" if worst is not None else ""))
    return out
