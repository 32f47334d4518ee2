"""Dev experiment: where the one-shot all-reduce's 8-byte time goes (kernels in oneshot_variants.cu).

    circuslink run -n 2 -- python scripts/dev/oneshot_variants.py [--json FILE]

One row a variant: microseconds a call (median and minimum over samples of `iters` calls; the slowest
rank's clock), side by side with the same run's relaxed store+poll floor from `circuslink probe`.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

import circuslink as cl
from circuslink import collectives, probe

parser = argparse.ArgumentParser()
parser.add_argument("--json", default=None)
parser.add_argument("--samples", type=int, default=11)
parser.add_argument("--iters", type=int, default=2000)
args = parser.parse_args()

w = cl.init()
cp = w.xp
mod = cl.compile(Path(__file__).with_name("oneshot_variants.cu").read_text())
buf = w.alloc(16 << 20)
cp.cuda.runtime.memset(buf.ptr(w.rank), 0, 16 << 20)
peers = cp.asarray(np.array(buf.ptrs, dtype=np.uint64))
counters = cp.zeros(128, dtype=cp.uint32)
error = cp.zeros(4, dtype=cp.uint32)
data = cp.zeros(2, dtype=cp.float32)
times = cp.zeros(4, dtype=cp.uint64)
I32, U32 = np.int32, np.uint32
base = 1 << 20
rows = []


def timed(kernel: str, threads: int) -> None:
    global base
    f = mod.get_function(kernel.split(":")[0])
    warmup = 100
    samples = []
    sms = []
    for _ in range(args.samples):
        w.barrier()
        if kernel.startswith("lib"):
            margs = (team, I32(kernel.endswith("no_abort")), data, I32(warmup), I32(args.iters), times)
            if ":resident" in kernel:
                w.backend.launch_resident(f, 1, threads, margs)
            else:
                f((1,), (threads,), margs)
        elif kernel in ("real", "old"):
            f((1,), (threads,), (I32(w.rank), I32(w.size), peers, counters, error, data, I32(warmup), I32(args.iters),
                                 times))
        else:
            counters[0] = base
            f((1,), (threads,), (I32(w.rank), I32(w.size), peers, counters, data, U32(base), I32(warmup),
                                 I32(args.iters), times))
        base += warmup + args.iters + 16
        cp.cuda.Device().synchronize()
        t = times.get()
        got = w.allgather_object(((int(t[1]) - int(t[0])) / args.iters / 1e3, int(t[2])))
        per = max(g[0] for g in got)
        samples.append(per)
        sms.append((tuple(g[1] for g in got), round(per, 3)))
    if int(error.get()[0]):
        raise SystemExit(f"{kernel}: the team reported error {error.get().tolist()}")
    if w.rank == 0:
        row = dict(variant=kernel, threads=threads, ranks=w.size, us=statistics.median(samples), min_us=min(samples),
                   sm_ids_us=sms)
        rows.append(row)
        print(f"{kernel:14s} {threads:4d} threads {w.size} ranks: {row['us']:.3f} us (min {row['min_us']:.3f})",
              flush=True)
        print("   (SM of each rank's block, us):", " ".join(f"{ids}:{us}" for ids, us in sms), flush=True)


floor = probe.measure(w, quick=True)
comm = collectives.Comm(w)
team = comm.device_team()
for kernel, threads in (("real", 512), ("old", 512), ("lib", 512), ("lanes_deadline", 512), ("lanes_all", 512),
                        ("real", 512), ("old", 512), ("lanes_deadline", 512)):
    timed(kernel, threads)
if w.rank == 0:
    print("floor:", floor)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=floor.get("device") if isinstance(floor, dict) else None,
                                                date=__import__("datetime").date.today().isoformat(),
                                                commit=__import__("os").environ.get("CIRCUSLINK_COMMIT", "unknown"),
                                                rows=rows, floor=str(floor)), indent=1))
comm.close()
w.close()
