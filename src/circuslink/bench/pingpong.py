"""Channel pingpong against the floor, NCCL, NVSHMEM and MPI (CIRCUS Fig. 12 and 13).

Rank 0 sends a message through a channel, rank 1 streams it back through another; CIRCUS's
definitions, timed on the device with %globaltimer inside the kernels (on cpu: the host clock):

    latency = (t1 - t0) / 2           t0 first word out, t1 first word of the reply back
    time    = latency + (t2 - t1)     t2 last word of the reply back
    throughput = bytes / time         best (minimum) of the timed repetitions

Both channel modes are measured: low-latency (``circuslink-ll``: flag in every 16-byte line,
one warp) and bandwidth (``circuslink-bw``: chunks + release flag, the warps of a grid streaming
disjoint packets; several chunk sizes and warp counts are tried, the best is reported).
``circuslink`` is the faster of the two at each size (the auto choice). A tiny-ring run (4
packets) checks the data and reports the slowdown flow control costs. Every run verifies the
returned bytes. The floor (``circuslink.probe``) and the baselines are measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ChannelError, ConfigError
from . import _driver as drv

_KERNEL_FILE = Path(__file__).parent / "kernels" / "pingpong_channels.cu"
_LL_MAX = 256 << 10  # LL is measured up to this size (one warp: beyond, bandwidth mode wins by far)
_LL_NSLOTS = 1024  # 120 KiB of payload in flight
# Bandwidth mode: CHUNK:WARPS pairs tried at every size (the sending warps; rank 0's receiving side
# takes as many again). Small chunks start the reply streaming sooner, more warps keep more bytes in
# flight; which wins depends on the size, so the benchmark tries them all and reports the best.
_BW_CONFIGS = "4K:64,4K:256,16K:256,16K:512"
_BW_THREADS = 256  # 8 warps a block
_BW_MAX_RING = 64 << 20
_TINY = {"ll": {"mode": "ll", "nslots": 4}, "bw": {"mode": "bw", "nslots": 4, "chunk": 4096}}
_TINY_SIZES = (64, 4096, 64 << 10, 1 << 20)
_CPU_MAX = 1 << 20
_ECHO_PIECE = 7680  # LL echo piece on rank 1: 64 packets, fits the kernel's shared buffer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="8:256M", default_iters=20, default_warmup=5)
    parser.add_argument("--mode", choices=("both", "ll", "bw"), default="both",
                        help="channel modes to measure (default both; 'circuslink' rows take the faster)")
    parser.add_argument("--bw-configs", default=_BW_CONFIGS, metavar="CHUNK:WARPS,...",
                        help=f"bandwidth-mode chunk sizes and sending warps to try (default {_BW_CONFIGS})")


def run(args: argparse.Namespace) -> int:
    from ..launcher import inside_job, relaunch_self

    drv.parse_sizes(args.sizes)  # bad options fail here, once, not on every rank
    bw_configs = _parse_bw_configs(args.bw_configs)
    if not inside_job():
        return relaunch_self(args.nranks, args.backend, prefer_mpirun=True, mps_mode=args.mps)
    import circuslink

    world = circuslink.init(args.backend)
    if world.size < 2:
        raise ConfigError("bench pingpong needs at least 2 ranks (ranks 0 and 1 play; others wait)")
    sizes = drv.parse_sizes("8,64,4K,64K" if args.quick and args.sizes == "8:256M" else args.sizes)
    iters, warmup = (min(args.iters, 5), min(args.warmup, 2)) if args.quick else (args.iters, args.warmup)
    if world.backend.name == "cpu":
        dropped = [s for s in sizes if s > _CPU_MAX]
        sizes = [s for s in sizes if s <= _CPU_MAX]
        if dropped:
            drv.progress(f"pingpong: the cpu back-end stops at {drv.format_bytes(_CPU_MAX)}; "
                         f"skipping {len(dropped)} larger size(s)")
        iters = min(iters, 20)
    modes = ("ll", "bw") if args.mode == "both" else (args.mode,)
    results = drv.Results("pingpong", world)
    results.meta.update(iters=iters, warmup=warmup, modes=list(modes))

    floor = None
    try:
        from .. import probe

        drv.progress("pingpong: measuring the floor (circuslink.probe)")
        floor = probe.measure(world, quick=args.quick)
    except ImportError as exc:
        results.meta["floor_missing"] = f"circuslink.probe unavailable: {exc}"
    results.floor = floor

    bench = _Pingpong(world, sizes, modes, bw_configs)
    try:
        for mode in modes:
            for nbytes in sizes:
                if mode == "ll" and nbytes > _LL_MAX:
                    continue
                drv.progress(f"pingpong {mode} {drv.format_bytes(nbytes)}")
                row = bench.measure(mode, nbytes, iters, warmup)
                if row:
                    results.add(**row)
        # the auto choice: the faster mode at each size
        for nbytes in sizes:
            best = [r for r in results.rows if r["bytes"] == nbytes and r["impl"].startswith("circuslink-")]
            if best:
                pick = min(best, key=lambda r: r["time_us"])
                results.add(**dict(pick, impl="circuslink", mode=pick["mode"]))
        tiny_sizes = [s for s in sizes if s in _TINY_SIZES] or sizes[::max(1, len(sizes) // 3)]
        for mode in modes:
            for nbytes in [s for s in tiny_sizes if mode == "bw" or s <= _LL_MAX]:
                drv.progress(f"pingpong {mode} with a 4-packet ring, {drv.format_bytes(nbytes)}")
                row = bench.measure(mode, nbytes, max(3, iters // 4), min(warmup, 2), tiny=True)
                normal = [r for r in results.rows if r["impl"] == f"circuslink-{mode}" and r["bytes"] == nbytes]
                if row:
                    if normal:
                        row["slowdown"] = row["time_us"] / normal[0]["time_us"]
                    results.add(**row)
        results.meta["resources"] = bench.resources()
    finally:
        bench.close()

    if not args.no_baselines:
        _baselines(world, results, sizes, iters, warmup)

    if world.rank == 0:
        _report(results, args)
    world.close()
    return 0


def _parse_bw_configs(text: str) -> list[tuple[int, int]]:
    out = []
    for token in text.split(","):
        chunk_text, sep, warps_text = token.partition(":")
        try:
            chunk = drv.parse_sizes(chunk_text)[0]
            warps = int(warps_text)
        except (ConfigError, ValueError, IndexError):
            raise ConfigError(f"--bw-configs {text!r}: bad entry {token!r} "
                              "(expected CHUNK:WARPS, e.g. 16K:256)") from None
        if not sep or chunk % 16 or warps < 1:
            raise ConfigError(f"--bw-configs {text!r}: entry {token!r} needs a chunk that is a multiple of 16 bytes "
                              "and a positive number of warps")
        out.append((chunk, warps))
    return out


class _Pingpong:
    """Channels for every mode (normal and tiny rings) and the kernels that drive them."""

    def __init__(self, world: Any, sizes: list[int], modes: tuple[str, ...], bw_configs: list[tuple[int, int]]) -> None:
        from ..channels import open as open_channels
        from ..spec import Link, element_type

        self.world = world
        self.cuda = world.backend.name == "cuda"
        byte = element_type("uchar")
        top = max(sizes)
        if self.cuda:
            pairs = {"ll": {"mode": "ll", "nslots": _LL_NSLOTS}}
            for chunk in sorted({c for c, _ in bw_configs}):
                most = max(w for c, w in bw_configs if c == chunk)
                nslots = 1 << max(6, (2 * most - 1).bit_length())  # two packets in flight per warp
                while nslots > 2 and nslots * chunk > _BW_MAX_RING:
                    nslots //= 2
                pairs[f"bw{chunk}"] = {"mode": "bw", "chunk": chunk, "nslots": nslots}
            self.bw_configs = bw_configs
        else:  # the cpu reference: rings that hold the largest message
            pairs = {"ll": {"mode": "ll"}, "bw4096": {"mode": "bw", "chunk": 4096}}
            self.bw_configs = [(4096, 1)]
        pairs.update(tll=_TINY["ll"], tbw=_TINY["bw"])
        links, options = [], {}
        for k, (name, opts) in enumerate(pairs.items()):
            depth = max(top, 4096) if not self.cuda else 1
            links.append(Link(f"ping_{name}", f"ping_{name}_in", 4 * k, 4 * k + 1, 0, 1, byte, depth))
            links.append(Link(f"pong_{name}", f"pong_{name}_in", 4 * k + 2, 4 * k + 3, 1, 0, byte, depth))
            options[f"ping_{name}"] = options[f"pong_{name}"] = opts
        self.pairs = pairs
        self.channels = open_channels(world, links, options=options)
        self._kernels = None
        if self.cuda:
            from ..device_code import compile

            module = compile(_KERNEL_FILE.read_text())
            self._kernels = {"ll": module.get_function("pingpong_ll"), "bw": module.get_function("pingpong_bw")}
            # Rank 0 runs 2G blocks (send + receive), rank 1 G: every block must fit the rank's SM
            # share at once (the forward-progress rule), and both must use the same G.
            most = world.backend.max_blocks(self._kernels["bw"], _BW_THREADS)
            self.max_bw_blocks = max(1, min(world.allgather_object(most // 2 if world.rank == 0 else most)))

    def _ends(self, pair: str):
        ch, me = self.channels, self.world.rank
        if me == 0:
            return ch[f"ping_{pair}"], ch[f"pong_{pair}_in"]
        return ch[f"pong_{pair}"], ch[f"ping_{pair}_in"]

    def measure(self, mode: str, nbytes: int, iters: int, warmup: int, tiny: bool = False) -> dict | None:
        """One row: the best configuration of ``mode`` at ``nbytes`` (rank 0; None elsewhere)."""
        if mode == "ll":
            runs = [("tll" if tiny else "ll", 0)]
        elif tiny:
            runs = [("tbw", 32)]
        else:
            runs = [(f"bw{chunk}", warps) for chunk, warps in self.bw_configs]
        rows = [self._measure_one(mode, pair, warps, nbytes, iters, warmup, tiny) for pair, warps in runs]
        if self.world.rank != 0:
            return None
        best = dict(min(rows, key=lambda r: r["time_us"]))
        if len(rows) > 1:
            best["configs"] = [{k: r[k] for k in ("chunk", "warps", "time_us", "latency_us")} for r in rows]
        return best

    def _measure_one(self, mode: str, pair: str, warps: int, nbytes: int, iters: int, warmup: int,
                     tiny: bool) -> dict | None:
        world = self.world
        world.barrier()
        if world.rank > 1:
            world.broadcast_object(None)
            return None
        tx, rx = self._ends(pair)
        total = iters + warmup
        if self.cuda:
            times, ok, extra = self._run_cuda(mode, tx, rx, nbytes, total, warps)
        else:
            times, ok, extra = self._run_cpu(tx, rx, nbytes, total)
        verdict = world.broadcast_object(ok if world.rank == 0 else None)
        if not verdict:
            raise ChannelError(f"pingpong {mode} {nbytes} B: the returned bytes differ from the bytes sent")
        if world.rank != 0:
            return None
        t = np.asarray(times, dtype=np.float64).reshape(total, 3)[warmup:]
        lat = (t[:, 1] - t[:, 0]) / 2.0
        tot = lat + (t[:, 2] - t[:, 1])
        geo = tx.geometry
        impl = f"circuslink-{mode}" + ("-depth4" if tiny else "")
        return dict(impl=impl, mode=mode, bytes=nbytes, latency_us=float(lat.min() / 1e3),
                    time_us=float(tot.min() / 1e3), throughput_GBps=float(nbytes / tot.min()),
                    median_time_us=float(statistics.median(tot) / 1e3), iters=iters, verified=True,
                    nslots=geo.nslots, slot_bytes=geo.slot_bytes, chunk=geo.payload, **extra)

    # -- cuda ------------------------------------------------------------------------------------
    def _run_cuda(self, mode: str, tx: Any, rx: Any, nbytes: int, total: int, warps: int):
        import cupy as cp

        world = self.world
        role = world.rank
        stream = world.backend.stream
        th, rh = tx.device_handle(), rx.device_handle()
        with stream:  # everything on the world's stream, in order
            status = cp.ones(1, dtype=cp.int32)
            src = cp.random.randint(0, 256, nbytes, dtype=cp.uint8) if role == 0 else cp.zeros(1, cp.uint8)
            dst = cp.zeros(nbytes, dtype=cp.uint8) if role == 0 else cp.zeros(1, cp.uint8)
            times = cp.zeros(3 * total, dtype=cp.uint64)
            if mode == "ll":
                piece = min(_ECHO_PIECE, max(tx.geometry.nslots // 2, 1) * tx.geometry.payload)
                threads = 64 if role == 0 else 32
                self._kernels["ll"]((1,), (threads,), (th, rh, src, dst, np.uint64(nbytes), np.uint64(piece),
                                    np.int32(role), np.int32(total), times, status))
                extra = {"warps": 1, "ctas": 1, "threads": 64, "echo_piece": piece}
            else:
                wpb = _BW_THREADS // 32
                npk = -(-nbytes // tx.geometry.payload)
                blocks = min(-(-min(warps, npk) // wpb), self.max_bw_blocks)  # no more warps than packets
                times.reshape(total, 3)[:, :2] = np.iinfo(np.uint64).max
                echo = cp.zeros(nbytes, dtype=cp.uint8) if role == 1 else cp.zeros(1, cp.uint8)
                grid = 2 * blocks if role == 0 else blocks
                for it in range(total):
                    self._kernels["bw"]((grid,), (_BW_THREADS,), (th, rh, src, dst, echo, np.uint64(nbytes),
                                        np.int32(role), np.uint32(blocks), times[3 * it:], status))
                extra = {"warps": blocks * wpb, "ctas": 2 * blocks, "ctas_echo": blocks, "threads": _BW_THREADS}
        stream.synchronize()
        tx.check()
        rx.check()
        if int(status.get()[0]) != 1:
            raise ChannelError(f"pingpong {mode} {nbytes} B: a channel call failed on rank {role}")
        if role != 0:
            return None, True, extra
        ok = bool(cp.array_equal(src, dst).get())
        return times.get().astype(np.float64), ok, extra

    # -- cpu (the reference) -----------------------------------------------------------------------
    def _run_cpu(self, tx: Any, rx: Any, nbytes: int, total: int):
        sender, receiver = tx._impl.impl, rx._impl.impl
        world = self.world
        if world.rank == 1:
            piece = max(1, min(nbytes, 2 * sender.geo.payload))
            for _ in range(total):
                for off in range(0, nbytes, piece):
                    k = min(piece, nbytes - off)
                    sender.write_bytes(receiver.read_bytes(k))
            return None, True, {"warps": 0, "ctas": 0, "threads": 1}
        msg = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8).tobytes()
        times = np.zeros((total, 3))
        ok = True
        for it in range(total):
            # a writer thread, so that a ring smaller than the message cannot deadlock the pingpong
            def send(it=it):
                times[it, 0] = time.perf_counter_ns()
                sender.write_bytes(msg)

            writer = threading.Thread(target=send)
            writer.start()
            receiver._header(receiver.seq)  # the first word of the reply is here
            times[it, 1] = time.perf_counter_ns()
            back = receiver.read_bytes(nbytes)
            times[it, 2] = time.perf_counter_ns()
            writer.join()
            ok = ok and back == msg
        return times.reshape(-1), ok, {"warps": 0, "ctas": 0, "threads": 2}

    def resources(self) -> dict:
        """What the channel machinery takes: CTAs, threads, registers, shared and symmetric memory."""
        out: dict[str, Any] = {"symmetric_bytes_total": self.channels.nbytes, "channels": {}}
        for name in self.pairs:
            end = self._ends(name)[0] if self.world.rank < 2 else None
            if end is None:
                continue
            geo = end.geometry
            out["channels"][name] = dict(mode=geo.mode_name, nslots=geo.nslots, slot_bytes=geo.slot_bytes,
                                         ring_bytes=geo.ring_bytes,
                                         symmetric_bytes=geo.ring_bytes + 256 + 4 * geo.nslots)
        if self._kernels:
            for mode, fn in self._kernels.items():
                out[f"kernel_{mode}"] = dict(registers_per_thread=int(fn.num_regs),
                                             static_shared_bytes=int(fn.shared_size_bytes),
                                             local_bytes=int(fn.local_size_bytes))
            out["kernel_ll"].update(ctas=1, threads_sender=64, threads_echo=32)
            out["kernel_bw"].update(threads_per_cta=_BW_THREADS,
                                    ctas="rank 0: 2 x ceil(warps / 8) (send + receive); rank 1: ceil(warps / 8)")
        return out

    def close(self) -> None:
        self.channels.close()


def _baselines(world: Any, results: drv.Results, sizes: list[int], iters: int, warmup: int) -> None:
    try:
        from . import baselines
    except ImportError as exc:
        results.meta["baselines_missing"] = str(exc)
        return
    for name in ("nccl_pingpong", "mpi_pingpong"):
        fn = getattr(baselines, name, None)
        if fn is None:
            continue
        drv.progress(f"pingpong: baseline {name}")
        rows = fn(world, sizes, iters, warmup)
        if world.rank == 0:
            results.extend(rows)
    fn = getattr(baselines, "nvshmem_pingpong", None)
    if fn is not None and world.backend.name == "cuda":
        if world.rank == 0:
            drv.progress("pingpong: baseline nvshmem_pingpong")
            try:  # its 2 PEs share a GPU under MPS where there is one GPU
                results.extend(fn(sizes, iters, warmup))
            except Exception as exc:  # a baseline that cannot run is reported, not fatal
                results.add(impl="nvshmem-put-signal", bytes=0, skipped=f"{type(exc).__name__}: {exc}")
        world.barrier(timeout=3600)  # the others wait while rank 0 runs the NVSHMEM program


def _report(results: drv.Results, args: argparse.Namespace) -> None:
    rows = [r for r in results.rows if "skipped" not in r or r.get("bytes")]
    drv.print_table(sorted(rows, key=lambda r: (str(r["impl"]), r["bytes"])),
                    ["impl", "bytes", "latency_us", "time_us", "throughput_GBps", "slowdown"],
                    f"pingpong ({results.device}, {results.backend}): best of {results.meta['iters']}")
    summary = _targets(results)
    results.meta["targets"] = summary
    for line in summary.get("lines", []):
        print(line)
    res = results.meta.get("resources", {})
    for key in ("kernel_ll", "kernel_bw"):
        if key in res:
            print(f"resources {key}: {res[key]}")
    print(f"resources: symmetric memory for all pingpong channels {res.get('symmetric_bytes_total', 0)} B per rank")
    path = results.write_json(args.json)
    print(f"wrote {path}")
    if args.plot:
        stem = Path(args.plot)
        lat = stem.with_name(stem.stem + "-latency.png")
        thr = stem.with_name(stem.stem + "-throughput.png")
        good = [r for r in results.rows if "skipped" not in r and not str(r["impl"]).endswith("depth4")]
        drv.plot(good, x="bytes", y="latency_us", group="impl", path=str(lat), title="pingpong one-way latency",
                 xlabel="message size (bytes)", ylabel="latency (us)")
        drv.plot(good, x="bytes", y="throughput_GBps", group="impl", path=str(thr), title="pingpong throughput",
                 xlabel="message size (bytes)", ylabel="throughput (GB/s)")
        print(f"wrote {lat} and {thr}")


def _targets(results: drv.Results) -> dict:
    """The issue's targets as ratios from this run."""
    out: dict[str, Any] = {"lines": []}
    ours = {r["bytes"]: r for r in results.rows if r["impl"] == "circuslink"}
    small = [ours[b]["latency_us"] for b in ours if b <= 64]
    floor = (results.floor or {}).get("summary") or {}
    if small and floor.get("lat_relaxed_us"):
        ratio = max(small) / floor["lat_relaxed_us"]
        out["latency_vs_floor"] = ratio
        out["lines"].append(f"target: 8-64 B latency {max(small):.3f} us = {ratio:.2f} x the relaxed floor "
                            f"{floor['lat_relaxed_us']:.3f} us (goal <= 1.15)")
    for impl, key, goal in (("nccl", "latency_vs_nccl", "<= 0.1"),
                            ("nvshmem-put-signal", "latency_vs_nvshmem", "<= 1")):
        theirs = [r["latency_us"] for r in results.rows if r["impl"] == impl and r["bytes"] <= 64
                  and r.get("latency_us")]
        if small and theirs:
            ratio = max(small) / min(theirs)
            out[key] = ratio
            out["lines"].append(f"target: 8-64 B latency = {ratio:.3f} x {impl} (goal {goal})")
    big = [ours[b]["throughput_GBps"] for b in ours if b >= 16 << 20]
    peak = max([floor.get("ce_GBps") or 0, floor.get("sm_store_GBps") or 0])
    if big and peak:
        ratio = min(big) / peak
        out["throughput_vs_floor"] = ratio
        out["lines"].append(f"target: >= 16 MiB throughput {min(big):.1f} GB/s = {ratio:.3f} x the best raw "
                            f"peer figure {peak:.1f} GB/s (goal >= 0.95)")
    tiny = [r for r in results.rows if str(r["impl"]).endswith("depth4") and "slowdown" in r]
    for r in tiny:
        out["lines"].append(f"tiny ring ({r['nslots']} packets, {r['mode']}): {drv.format_bytes(r['bytes'])} exact, "
                            f"slowdown {r['slowdown']:.2f}x")
    return out
