"""Dev experiment: line formats, echo forms and large-transfer rings, side by side (kernels in line_variants.cu).

    circuslink run -n 2 -- python scripts/dev/line_variants.py [--json FILE] [--quick]

Pingpong rows: one-way us (median and minimum over samples of `iters` round trips each). Streaming rows: GB/s
from rank 0's start (after a device handshake) to rank 1's last packet. Prints a table; --json keeps the rows.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

import circuslink as cl

parser = argparse.ArgumentParser()
parser.add_argument("--json", default=None)
parser.add_argument("--quick", action="store_true")
parser.add_argument("--samples", type=int, default=11)
parser.add_argument("--stage", default="all", choices=("all", "lines", "credits", "mid", "stream"))
args = parser.parse_args()

w = cl.init()
cp = w.xp
src = (Path(__file__).with_name("line_variants.cu")).read_text()
mod = cl.compile(src)
peer = 1 - w.rank if w.rank < 2 else None
GiB = 1 << 30
SYM = (1 << 30) + (1 << 28)  # rings up to 1 GiB + flags
buf = w.alloc(SYM)
mine_p, peer_p = buf.ptr(w.rank), buf.ptr(1 - w.rank)
times = cp.zeros(4, dtype=cp.uint64)
err = cp.zeros(1, dtype=cp.uint32)
rows = []
base = 1 << 20
U64, U32, I32 = np.uint64, np.uint32, np.int32


def sync():
    cp.cuda.Device().synchronize()


def pingpong(kernel: str, param: int, nbytes: int, iters: int = 2000, warmup: int = 100, threads: int = 32):
    global base
    f = mod.get_function(kernel)
    samples = []
    for _ in range(args.samples):
        base += iters + warmup + 16
        times.fill(0)
        w.barrier()
        f((1,), (threads,), (I32(w.rank), U64(mine_p), U64(peer_p), U32(param), U64(base), I32(warmup), I32(iters),
                        times, err))
        sync()
        t = times.get()
        samples.append((int(t[1]) - int(t[0])) / (2 * iters) / 1e3)
    if w.rank == 0:
        row = dict(kind="pingpong", variant=kernel, threads=threads, param=param, bytes=nbytes, one_way_us=statistics.median(samples),
                   min_one_way_us=min(samples))
        rows.append(row)
        print(f"{kernel:16s} t={threads:<4d} p={param:<8d} {nbytes:>9d} B  one-way {row['one_way_us']:.3f} us "
              f"(min {row['min_one_way_us']:.3f})", flush=True)


def stream(kernel: str, msg: int, nmsg: int, chunk: int, ring_bytes: int, blocks: int):
    global base
    f = mod.get_function(kernel)
    nslots = max(1, ring_bytes // chunk)
    ring_off = 0
    flags_off = GiB
    credits_off = GiB + (1 << 26)
    go_off = GiB + (1 << 27)
    data = cp.cuda.alloc(msg)  # source on rank 0, destination on rank 1 (streaming: a local buffer)
    cp.cuda.runtime.memset(data.ptr, w.rank + 1, msg)
    samples = []
    for _ in range(args.samples if not args.quick else 3):
        base += (msg // chunk + 2) * nmsg + 16
        times.fill(0)
        w.barrier()
        if kernel.startswith("stream_ring"):
            ring = (peer_p if w.rank == 0 else mine_p) + ring_off
            flags = (peer_p if w.rank == 0 else mine_p) + flags_off
            credits = (mine_p if w.rank == 0 else peer_p) + credits_off
            f((blocks,), (256,), (I32(w.rank), U64(ring), U64(flags), U64(credits), U64(data.ptr), U64(data.ptr),
                                  U64(msg), U32(nmsg), U32(chunk), U32(nslots), U64(base), U64(mine_p + go_off),
                                  U64(peer_p + go_off), times))
        else:
            flags = (peer_p if w.rank == 0 else mine_p) + flags_off
            dst_peer = peer_p + ring_off
            f((blocks,), (256,), (I32(w.rank), U64(flags), U64(data.ptr), U64(dst_peer), U64(msg), U32(nmsg),
                                  U32(chunk), U64(base), U64(mine_p + go_off), U64(peer_p + go_off), times))
        sync()
        t = times.get()
        both = w.allgather_object((int(t[0]), int(t[1])))
        t0, t1 = both[0][0], both[1][1]
        samples.append(msg * nmsg / max(1, t1 - t0))  # bytes per ns = GB/s
    del data
    if w.rank == 0:
        row = dict(kind="stream", variant=kernel, bytes=msg, messages=nmsg, chunk=chunk, ring_bytes=ring_bytes,
                   blocks=blocks, GBps=statistics.median(samples), max_GBps=max(samples))
        rows.append(row)
        print(f"{kernel:12s} msg {msg >> 20:5d} MiB x{nmsg:<3d} chunk {chunk >> 10:4d} KiB ring {ring_bytes >> 20:5d} MiB "
              f"blocks {blocks:3d}: {row['GBps']:7.1f} GB/s (max {row['max_GBps']:.1f})", flush=True)


if w.rank < 2:
    stage = args.stage
    if stage in ("all", "lines"):
        for k in (1, 32):  # 8-byte units: k lanes, 4 payload bytes each (the control of round 1)
            pingpong("pp_ll8_one", k, 4 * k)
        for k in (64, 128, 288):  # several units a lane: 256 B, 512 B, 1152 B of payload
            pingpong("pp_ll8_one", k, 4 * k)
        for k in (4, 32, 64):  # the same format, 16 bytes (two units) a lane
            pingpong("pp_ll8v2", k, 4 * k)
        for L in (1, 2, 9, 16, 32):  # 128-byte lines, 16-byte accesses (control) and 8-byte accesses
            pingpong("pp_ll128", L, 120 * L)
            pingpong("pp_ll128u", L, 120 * L)
    if stage in ("all", "credits"):  # what a channel's credit stores cost the latency path
        for kernel in ("pp_cr0", "pp_cr1_own", "pp_cr1_peer", "pp_cr2_peer", "pp_cr0"):
            for k in (4, 32):
                pingpong(kernel, k, 4 * k)
    if stage in ("all", "mid"):
        for nb in (4096, 16384, 65536):
            for threads in (128, 256, 512):
                if nb // 8 > 16 * threads:
                    continue
                pingpong("pp_ll8blk", nb // 4, nb, iters=500, threads=threads)
            pingpong("pp_bulkblk", nb, nb, iters=500, threads=512)
        for nb in (1 << 20,):
            pingpong("pp_bulkblk", nb, nb, iters=200, threads=1024)
    if stage in ("all", "stream"):
        msg, nmsg = 64 << 20, 8
        for blocks in (32, 64, 128):
            stream("stream_put", msg, nmsg, 64 << 10, msg, blocks)
        for kernel in ("stream_ring8",):
            for chunk in (16 << 10, 32 << 10, 64 << 10):
                for blocks in (32, 64, 128):
                    for ring in (8 << 20, 16 << 20, 32 << 20):
                        if ring // chunk < 2 * blocks * 8:  # every warp owns two slots at least
                            continue
                        stream(kernel, msg, nmsg, chunk, ring, blocks)
        for blocks in (64, 128):
            stream("stream_ring8", 256 << 20, 2, 16 << 10, 16 << 20, blocks)
            stream("stream_put", 256 << 20, 2, 64 << 10, 256 << 20, blocks)
        stream("stream_ring8", 16 << 20, 32, 16 << 10, 16 << 20, 64)
        stream("stream_put", 16 << 20, 32, 64 << 10, 16 << 20, 64)

w.barrier()
if w.rank == 0 and args.json:
    Path(args.json).write_text(json.dumps({"device": str(cp.cuda.runtime.getDeviceProperties(0)["name"]),
                                           "rows": rows}, indent=1))
w.close()
