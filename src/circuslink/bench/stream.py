"""One-way streaming through a channel: ``circuslink bench stream``.

The pingpong's echo measures both directions at once; this measures one. Rank 0 writes ``K``
messages of n bytes back to back into one channel, rank 1 reads them (checking the last one byte for
byte) and answers with one 4-byte acknowledgement; the sample's time runs from rank 0's first write (once
rank 1's ready message arrived: both kernels are running) to the acknowledgement, on rank 0's clock.
Throughput = K n / time (K is chosen so that every sample moves at least 256 MiB or 1,000 messages, and never
fewer than 16 messages, which makes the acknowledgement's one-way time negligible). Forms:
one warp a side (up to 64 KiB), every warp of a co-resident grid through the ring, and from 128 KiB the same
grid writing from the channel's window (a rendezvous: the reader pulls each message straight from it); the
``circuslink`` row is the fastest. Median over samples, with the minimum time beside it; the floor from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from ..errors import ChannelError, ConfigError
from . import _driver as drv
from .pingpong import (
    CPU_MAX,
    GRID_MIN,
    GRID_THREADS,
    NVSHMEM_TIMEOUT_S,
    RDV_FROM,
    WARP_MAX,
    ChannelPair,
    add_grid_blocks_argument,
    envelope_us,
    floor_pair,
)

MIN_BYTES_PER_SAMPLE = 256 << 20
MIN_MESSAGES = 16  # every sample streams at least this many messages, whatever their size
MAX_MESSAGES = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drv.add_common_arguments(parser, default_sizes="4K:256M", default_iters=10, default_warmup=2)
    add_grid_blocks_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..launcher import inside_job, relaunch_self

    drv.parse_sizes(args.sizes)
    if not inside_job():
        return relaunch_self(args.nranks, args.backend, mps_mode=args.mps, **drv.memory_per_rank(args, 10, CPU_MAX))
    import circuslink

    world = circuslink.init(args.backend)
    if world.size < 2:
        raise ConfigError("bench stream needs at least 2 ranks (rank 0 writes, rank 1 reads; others wait)")
    sizes, samples, warmup = drv.sizes_and_counts(args, quick_sizes="4K,1M,16M", quick_iters=3, quick_warmup=1)
    if not world.backend.runs_kernels:
        sizes = [s for s in sizes if s <= CPU_MAX] or [min(sizes)]
    results = drv.Results("stream", world)
    results.meta.update(runs_kernels=world.backend.runs_kernels)
    results.meta.update(samples=samples, definitions="throughput_GBps: K x bytes / (first write .. acknowledgement), "
                        "median over samples; one_way_us: that time / K")
    from .. import probe

    drv.progress("stream: measuring the floor (circuslink.probe)")
    results.floor = probe.measure(world, quick=args.quick, pairs=[(0, 1), (1, 0)])
    pair = ChannelPair(world, sizes, stream=True, grid_blocks=args.grid_blocks)
    try:
        for nbytes in sizes:
            drv.progress(f"stream {drv.format_bytes(nbytes)}")
            rows = []
            if nbytes <= WARP_MAX or not world.backend.runs_kernels:
                rows.append(_measure(pair, "default", "warp", nbytes, samples, warmup))
            if world.backend.runs_kernels and nbytes >= GRID_MIN:
                for config, cfg in pair.configs.items():
                    if config.startswith("grid") and nbytes <= cfg["max"]:
                        rows.append(_measure(pair, config, "grid", nbytes, samples, warmup))
                if "rdv" in pair.configs and nbytes >= RDV_FROM:
                    rows.append(_measure(pair, "rdv", "rdv", nbytes, samples, warmup))
            if world.rank == 0:
                rows = [r for r in rows if r]
                for r in rows:
                    results.add(**dict(r, impl=f"circuslink-{r['form']}"))
                results.add(**dict(max(rows, key=lambda r: r["throughput_GBps"]), impl="circuslink"))
    finally:
        pair.close()
    if not args.no_baselines:
        _baselines(world, results, [s for s in sizes if s >= GRID_MIN], samples)
    if world.rank == 0:
        _report(results, args)
    world.close()
    return 0


def _baselines(world: Any, results: drv.Results, sizes: list[int], samples: int) -> None:
    """NVSHMEM's block puts streaming the same sizes (PE 0 puts MIN_MESSAGES messages a round, PE 1 answers),
    run by rank 0 while the others wait (its 2 PEs share the GPU under MPS where there is one)."""
    from . import baselines

    fn = getattr(baselines, "nvshmem_pingpong", None)
    if fn is None or not world.backend.runs_kernels or not sizes:
        return
    if world.rank == 0:
        drv.progress("stream: baseline NVSHMEM block-put streaming")
        try:
            results.extend(fn(sizes, 64, 2, modes=("stream",), samples=max(samples, 10), messages=MIN_MESSAGES,
                              bytes_per_sample=1 << 30, timeout=NVSHMEM_TIMEOUT_S))
        except Exception as exc:  # a baseline that cannot run is reported, not fatal
            results.add(impl="nvshmem-put-block-stream", bytes=0, skipped=f"{type(exc).__name__}: {exc}")
    world.barrier(timeout=3600)


def _measure(pair: ChannelPair, config: str, form: str, nbytes: int, samples: int, warmup: int) -> dict | None:
    world = pair.world
    world.barrier()
    if world.rank > 1:
        world.allgather_object(True)
        return None
    messages = max(MIN_MESSAGES, min(MAX_MESSAGES, -(-MIN_BYTES_PER_SAMPLE // nbytes)))
    times, ok = [], True
    for i in range(warmup + samples):
        t, good = _sample(pair, config, form, nbytes, messages, seed=i)
        ok = ok and good
        if i >= warmup:
            times.append(t)
    if not all(world.allgather_object(ok)):
        raise ChannelError(f"stream {config} {drv.format_bytes(nbytes)}: rank 1 received wrong bytes")
    if world.rank != 0:
        return None
    med = statistics.median(times)
    tx, _ = pair.ends(config)
    geo = tx.geometry
    return dict(form=form, config=config, bytes=nbytes, messages=messages,
                throughput_GBps=messages * nbytes / med / 1e9,
                max_throughput_GBps=messages * nbytes / min(times) / 1e9, one_way_us=med / messages * 1e6,
                samples=samples, verified=True, ll_max=geo.ll_max, chunk=geo.chunk, nslots=geo.nslots,
                blocks=_blocks(pair, config, form, nbytes))


def _blocks(pair: ChannelPair, config: str, form: str, nbytes: int) -> int:
    # the rendezvous form's copies are the reader's alone, so its grid is every block of stream_rdv that may
    # stay resident (at its default grid of 33 blocks, stream_grid's, a 256 MiB message took 291 us against
    # 201 in the pingpong's rendezvous at 49)
    return pair.grid_blocks(config, nbytes) if form == "grid" else pair.blocks_rdv if form == "rdv" else 1


def _sample(pair: ChannelPair, config: str, form: str, nbytes: int, messages: int, seed: int) -> tuple[float, bool]:
    world, role = pair.world, pair.world.rank
    tx, rx = pair.ends(config)
    label = f"stream {config} {drv.format_bytes(nbytes)}"
    if not world.backend.runs_kernels:
        if role == 0:
            return cpu_stream(tx, pair.channels["ack_in"], nbytes, messages, seed, sender=True)
        return cpu_stream(rx, pair.channels["ack"], nbytes, messages, seed, sender=False)
    # rank 0 sends on ping, rank 1 reads it; the acknowledgement comes back on its own small channel
    send = tx if role == 0 else pair.channels[f"pong_{config}"]
    recv = rx if role == 1 else pair.channels[f"pong_{config}_in"]
    ack_s = pair.channels["ack"] if role == 1 else pair.channels["ack_in"]  # unused on rank 0 (a placeholder)
    ack_r = pair.channels["ack_in"] if role == 0 else pair.channels["ack"]
    return device_stream(world, pair._module, form, send, recv, ack_s, ack_r, nbytes, role, messages, seed,
                         _blocks(pair, config, form, nbytes), label, window=pair.window)


def cpu_stream(end: Any, ack: Any, nbytes: int, messages: int, seed: int, sender: bool) -> tuple[float, bool]:
    """The cpu reference of one sample through the host API: the sender writes ``messages`` copies of a seeded
    pattern and waits for the 4-byte acknowledgement; the receiver reads them (checking the last) and
    acknowledges. Returns (seconds on the sender, bytes right on the receiver); also used by ``bench hops``."""
    pattern = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    if sender:
        t0 = time.perf_counter()
        for _ in range(messages):
            end.write(pattern)
        ack.read(4)
        return time.perf_counter() - t0, True
    got = None
    for _ in range(messages):
        got = end.read(nbytes)
    ack.write(np.zeros(4, np.uint8))
    return 0.0, bool(np.array_equal(got, pattern))


def device_stream(world: Any, module: Any, form: str, send: Any, recv: Any, ack_s: Any, ack_r: Any, nbytes: int,
                  role: int, messages: int, seed: int, blocks: int = 1, label: str = "stream",
                  window: Any = None) -> tuple[float, bool]:
    """One sample of ``stream_warp`` / ``stream_grid`` (``kernels/pingpong_channels.cu``): role 0 writes
    ``messages`` messages of a seeded pattern on ``send`` and waits for the acknowledgement on ``ack_r``; role 1
    reads them on ``recv`` and acknowledges on ``ack_s`` (the ends a role does not use are placeholders of the
    right kind). Form ``rdv``: ``stream_rdv`` (``stream_grid`` bounded to 3 blocks an SM) with the pattern in
    role 0's part of ``window`` (the channel's symmetric buffer), so that every message goes by rendezvous.
    Returns (seconds on role 0, bytes right on role 1); also used by ``bench hops``."""
    import cupy as cp

    stream = world.backend.stream
    with stream:
        pattern = cp.random.RandomState(seed).randint(0, 256, nbytes, dtype=cp.uint8)  # the same on both ranks
        if form == "rdv" and role == 0:
            window.local[:nbytes] = pattern
            pattern = window.local[:nbytes]
        dst = cp.zeros(nbytes if role == 1 else 1, dtype=cp.uint8)
        times = cp.zeros(2, dtype=cp.uint64)
        status = cp.ones(1, dtype=cp.int32)
        gate_and_done = cp.zeros(2, dtype=cp.uint32)
    args = (send.device_handle(), recv.device_handle(), ack_s.device_handle(), ack_r.device_handle(), pattern, dst,
            np.uint64(nbytes), np.int32(role), np.int32(messages))
    with stream:
        if form == "warp":
            module.get_function("stream_warp")((1,), (32,), args + (times, status))
        elif form == "grid":
            module.get_function("stream_grid")((blocks,), (GRID_THREADS,), args + (
                gate_and_done[0:1], gate_and_done[1:2], np.uint64(send.channels.device_timeout_ns), times, status))
    if form == "rdv":
        world.backend.launch_resident(module.get_function("stream_rdv"), blocks, GRID_THREADS, args + (
            gate_and_done[0:1], gate_and_done[1:2], np.uint64(send.channels.device_timeout_ns), times, status),
            stream=stream)
    send.channels.wait_kernel(stream, lambda: f"{label} on rank {role}")
    recv.check()
    send.check()  # a writer that stalled on credits says so (with what its slot's credit holds)
    if int(status.get()[0]) != 1:
        raise ChannelError(f"{label}: a channel call failed on rank {role}")
    if role == 1:
        return 0.0, bool(cp.array_equal(dst, pattern).get())
    t0, t1 = (int(v) for v in times.get())
    return (t1 - t0) * 1e-9, True


def _report(results: drv.Results, args: argparse.Namespace) -> None:
    floor = floor_pair(results)

    def text() -> None:
        drv.print_table(sorted(results.rows, key=lambda r: (r["impl"], r["bytes"])),
                        ["impl", "bytes", "messages", "throughput_GBps", "max_throughput_GBps", "one_way_us"],
                        f"one-way streaming ({results.device}, {results.backend}): median of "
                        f"{results.meta['samples']}", args)
        sm = floor.get("sm_store_GBps")
        big = [r for r in results.rows if r["impl"] == "circuslink" and r["bytes"] >= 16 << 20]
        nv = {r["bytes"]: r for r in results.rows if r["impl"] == "nvshmem-put-block-stream" and "skipped" not in r}
        lines = []
        gpu = results.meta.get("runs_kernels", True)  # GPU targets: never printed on the cpu
        if big and sm and gpu:
            worst = min(big, key=lambda r: r["throughput_GBps"])
            ratio = worst["throughput_GBps"] / sm
            results.meta["streaming_vs_sm_store"] = ratio
            verdict = "met" if ratio >= 0.5 else "MISSED"
            lines.append(f"target: >= 16 MiB one-way streaming {worst['throughput_GBps']:.1f} GB/s (at "
                         f"{drv.format_bytes(worst['bytes'])}) = {ratio:.2f} x the SM-store figure {sm:.1f} GB/s of "
                         f"this run (goal >= 0.5): {verdict}")
        vs_nv = [(r["throughput_GBps"] / nv[r["bytes"]]["throughput_GBps"], r["bytes"]) for r in big
                 if r["bytes"] in nv]
        if vs_nv and gpu:
            ratio, at = min(vs_nv)
            results.meta["streaming_vs_nvshmem"] = ratio
            verdict = "met" if ratio >= 1.0 else "MISSED"
            lines.append(f"target: >= 16 MiB one-way streaming >= NVSHMEM's block-put streaming of this run: worst "
                         f"{ratio:.2f} x at {drv.format_bytes(at)} (goal >= 1.0): {verdict}")
        peak = max((r["throughput_GBps"] for r in results.rows if r["impl"] == "circuslink"), default=None)
        if peak:
            results.meta["peak_throughput_GBps"] = peak
            lines.append(f"peak one-way streaming throughput: {peak:.1f} GB/s")
        results.meta["targets"] = {"lines": lines}
        for line in lines:
            print(line)

    def draw(path: str) -> None:
        draw_stream(results.rows, floor, results.meta.get("runs_kernels", True), path)

    drv.finish(results, args, text, draw)


def draw_stream(rows: list[dict], floor: dict, runs_kernels: bool, path: str) -> str:
    """The stream's figure: throughput against size, a line per form (the ring's grid form a line per ring
    configuration, since each has its own largest message), NVSHMEM's, and the floor's envelope on a GPU."""
    rows = [dict(r, series=f"{r['impl']} ({r['config']})" if r["impl"] == "circuslink-grid" else r["impl"])
            for r in rows if r["impl"].startswith(("circuslink", "nvshmem")) and "skipped" not in r]
    sizes = sorted({r["bytes"] for r in rows})
    env = {"floor": [(n, n / (envelope_us(floor, n) * 1e3)) for n in sizes if envelope_us(floor, n)]}
    return drv.plot(rows, x="bytes", y="throughput_GBps", group="series", path=path,
                    title="one-way streaming throughput", xlabel="message size (bytes)", ylabel="GB/s (median)",
                    extra=env if runs_kernels else None)
