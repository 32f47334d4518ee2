"""Dev experiment: a hand-written rendezvous pingpong (rdv_pingpong.cu), one copy a direction.

    circuslink run -n 2 -- python scripts/dev/rdv_pingpong.py [--sizes 32K,1M,16M,256M] [--blocks 16,33,66]
                                                                [--threads 256,1024] [--json FILE]

One row per size, block count and block size: one-way microseconds (median and minimum over samples, each
a loop of round trips timed on rank 0's GPU clock after a warm-up exchange), GB/s, and whether rank 0's
reply equals what it sent (seeded random bytes).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from pathlib import Path

import numpy as np

import circuslink as cl
from circuslink.bench._driver import parse_sizes
from circuslink.device_code import DEFINES_VAR, defines_from_env

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="32K,256K,1M,4M,16M,64M,256M")
parser.add_argument("--blocks", default="16,33,66")
parser.add_argument("--threads", default="256,1024")
parser.add_argument("--samples", type=int, default=11)
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--json", default=None)
parser.add_argument("--defines", default="", help="#defines for the kernel, e.g. RDV_POLL_WARPS=1,RDV_SLICE_WARP=1")
args = parser.parse_args()

w = cl.init()
cp = w.xp
mod = cl.compile(Path(__file__).with_name("rdv_pingpong.cu").read_text(),
                 options=defines_from_env({DEFINES_VAR: args.defines}))
fn = mod.get_function("rdv_pingpong")
sizes = parse_sizes(args.sizes)
top = max(sizes)
send = w.alloc(top)
words = w.alloc(4096)
recv = cp.zeros(top, dtype=cp.uint8)
times = cp.zeros(4, dtype=cp.uint64)
failed = cp.zeros(1, dtype=cp.int32)
seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
seed = w.broadcast_object(seed if w.rank == 0 else None)
rng = np.random.default_rng(seed + w.rank)
send.local[...] = cp.asarray(rng.integers(0, 256, top, dtype=np.uint8)) if w.rank == 0 else 0
peer = 1 - w.rank if w.rank < 2 else w.rank
rows = []
I32, U64 = np.int32, np.uint64
for threads in [int(t) for t in args.threads.split(",")]:
    most = w.backend.max_blocks(fn, threads)
    most = min(w.allgather_object(most))
    for blocks in sorted({min(int(b), most) for b in args.blocks.split(",")}):
        for n in sizes:
            warmup = 4
            iters = max(4, min(400, int(2e-3 / max(n / 400e9, 2e-6))))
            one_way = []
            for _ in range(args.samples):
                cp.cuda.runtime.memset(words.ptr(w.rank), 0, 4096)
                recv[:n] = 0
                cp.cuda.Device().synchronize()
                w.barrier()
                if w.rank < 2:
                    a = (I32(w.rank), U64(words.ptr(w.rank)), U64(words.ptr(peer)), U64(send.ptr(peer)),
                         U64(send.ptr(w.rank)), recv, U64(n), I32(warmup), I32(iters), times, failed)
                    w.backend.launch_resident(fn, blocks, threads, a)
                    cp.cuda.Device().synchronize()
                t = times.get()
                one_way.append((int(t[1]) - int(t[0])) / (2 * iters) / 1e3)
            ok = w.rank != 0 or bool((recv[:n] == send.local[:n]).all())
            bad = int(failed.get()[0])
            if w.rank == 0:
                med = statistics.median(one_way)
                row = dict(bytes=n, blocks=blocks, threads=threads, one_way_us=med, min_one_way_us=min(one_way),
                           throughput_GBps=n / med / 1e3, round_trips=iters, samples=args.samples, verified=ok,
                           timed_out=bool(bad))
                rows.append(row)
                print(f"{n:>10d} B  {blocks:3d} x {threads:4d}: {med:9.2f} us (min {min(one_way):9.2f})  "
                      f"{row['throughput_GBps']:7.1f} GB/s  {'ok' if ok and not bad else 'FAILED'}", flush=True)
            if not ok or bad:
                raise SystemExit(f"rank {w.rank}: the reply differs or a wait timed out (seed {seed})")
if w.rank == 0 and args.json:
    Path(args.json).write_text(json.dumps(dict(
        benchmark="rdv-pingpong-dev", device=os.environ.get("CIRCUSLINK_DEVICE_NAME", "unknown"),
        date=datetime.date.today().isoformat(), commit=os.environ.get("CIRCUSLINK_COMMIT", "unknown"),
        seed=seed, rows=rows), indent=1))
send.close()
words.close()
w.close()
