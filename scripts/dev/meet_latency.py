"""Dev experiment (circuslink run -n N): what one device-side meeting (rma.meet) costs its last arrival.

The pull scheme's timeline (16384^2 complex128, 4 ranks, H100, 2026-12-07) showed the meeting after the first
stage ending 1.0-1.3 ms after the last rank's transforms, and the one after the second 0.7 ms after. Here each
rank first spins on its GPU for rank * --stagger-us (one block: the others are already waiting when the last
arrives), then meets; the events around the meeting give each rank's time in it, so the last rank's time is the
meeting's own cost. --busy adds a memory-bound copy of --busy-mib MiB on every rank before its spin (the GPU
busy as in the FFT). Medians and minima over --iters, per rank.

    circuslink run -n 4 -- python scripts/dev/meet_latency.py [--iters 50] [--stagger-us 200] [--busy]
"""

from __future__ import annotations

import argparse
import json
import statistics

import cupy as cp

import circuslink as cl
from circuslink import rma

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=50)
ap.add_argument("--stagger-us", type=float, default=200.0)
ap.add_argument("--busy", action="store_true")
ap.add_argument("--busy-mib", type=int, default=512)
ap.add_argument("--json", default="")
args = ap.parse_args()

spin = cp.RawKernel(r"""
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long t = t0;
  while (t - t0 < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}
""", "spin")

with cl.init() as world:
    stream = cp.cuda.Stream(non_blocking=True)
    a = cp.ones(args.busy_mib << 17, dtype=cp.float64)
    b = cp.empty_like(a)
    rows = []
    for label, busy in (("idle", False), ("busy", True)) if args.busy else (("idle", False),):
        times = []
        for i in range(args.iters + 3):
            world.barrier()
            with stream:
                rma.meet(world)  # start together
                if busy:
                    b[...] = a
                spin((1,), (32,), (cp.uint64(int(world.rank * args.stagger_us * 1e3)),))
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(stream)
                rma.meet(world)
                e1.record(stream)
            stream.synchronize()
            if i >= 3:
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        rows.append({"mode": label, "rank": world.rank, "median_us": statistics.median(times), "min_us": min(times)})
    got = world.allgather_object(rows)
    if world.rank == 0:
        flat = [r for part in got for r in part]
        for r in sorted(flat, key=lambda r: (r["mode"], r["rank"])):
            print(f"{r['mode']:5s} rank {r['rank']}: in the meeting median {r['median_us']:8.1f} us, "
                  f"min {r['min_us']:8.1f} us", flush=True)
        if args.json:
            json.dump({"stagger_us": args.stagger_us, "iters": args.iters, "rows": flat}, open(args.json, "w"))
