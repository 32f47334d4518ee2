"""Dev experiment: where a forward 2-D FFT's time goes on each rank (one GPU, ranks under MPS, green SMs; the cpu
back-end's host clock works too, for checking the script).

For each --chunks value (--scheme pull: one plan, its meetings as the comm phases): a plan of --size^2 --dtype,
warm-up, then --iters profiled forwards, each started after the device-side meeting (rma.meet); prints, for the
median iteration, every rank's phases (fft on the compute stream, put launches and the exchange from first put to
last wait on the comm stream) as start-end ms from the execute's start, and the exchanges alone
(Plan.time_exchanges). Writes --json with every iteration's timelines. On a GPU each iteration also stamps the GPU
clock (%globaltimer, one clock for every process on the GPU) on the caller's stream right after the meeting,
which the execute's start follows: each rank's zero on one clock ("zero_ns"), printed as how late each rank's
execute began after the earliest (the phases are otherwise each rank's own clock from its own start).
Run: circuslink run -n 4 -- python scripts/dev/fft_timeline.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import circuslink as cl
from circuslink import rma
from circuslink.apps import fft

ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, default=16384)
ap.add_argument("--dtype", default="complex128")
ap.add_argument("--chunks", default="1,2,4")
ap.add_argument("--scheme", default="transpose-put", help="the plan's scheme (pull: one case, no chunks)")
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--json", default=None)
args = ap.parse_args()

w = cl.init()
xp = w.xp
stamp = None
if xp is not np:
    stamp = xp.RawKernel(r"""
extern "C" __global__ void stamp(unsigned long long* t) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t[0])); }
""", "stamp")
    zero = xp.zeros(1, dtype=xp.uint64)
shape = (args.size, args.size)
ins, outs = fft.boxes(shape, w.size, "slab", layout="transposed")
device = xp.cuda.runtime.getDeviceProperties(0)["name"].decode() if xp is not np else "cpu"
out = {"benchmark": "fft-timeline", "device": device,
       "commit": os.environ.get("CIRCUSLINK_COMMIT", ""), "date": time.strftime("%Y-%m-%d"),
       "size": args.size, "dtype": args.dtype, "scheme": args.scheme, "ranks": w.size, "cases": {}}
for k in [1] if args.scheme == "pull" else [int(c) for c in args.chunks.split(",")]:
    with fft.Plan(w, ins[w.rank], outs[w.rank], args.dtype, decomposition="slab", chunks=k,
                  scheme=args.scheme) as plan:
        x = xp.asarray(np.random.default_rng(w.rank).standard_normal(plan.input.shape).astype(args.dtype))
        runs = []
        for i in range(2 + args.iters):
            plan.input[...] = x
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            w.barrier()
            met = rma.meet(w)
            if stamp is not None:
                stamp((1,), (1,), (zero,))  # the caller's stream: the execute's start waits for it
            plan.forward(profile=True)
            if met is not None:
                met.check_device()
            if i >= 2:
                runs.append((plan._runner.total, list(plan._runner.timeline),
                             int(zero.get()[0]) if stamp is not None else 0))
        alone = []
        for _ in range(2 + args.iters):
            w.barrier()
            met = rma.meet(w)
            alone.append(plan.time_exchanges())
        ranks = w.allgather_object({"runs": runs, "alone": alone[2:]})
    if w.rank == 0:
        totals = [max(r["runs"][i][0] for r in ranks) for i in range(args.iters)]
        med = sorted(range(args.iters), key=lambda i: totals[i])[args.iters // 2]
        alone = statistics.median(max(a) for a in zip(*[r["alone"] for r in ranks], strict=True))
        print(f"== chunks {k}: total median {statistics.median(totals)*1e3:.2f} ms (min {min(totals)*1e3:.2f}); "
              f"exchanges alone median {alone*1e3:.2f} ms; iteration {med}:")
        first = min(r["runs"][med][2] for r in ranks)
        for rank, r in enumerate(ranks):
            total, tl, zero_ns = r["runs"][med]
            phases = "  ".join(f"{p}:{a*1e3:.2f}-{b*1e3:.2f}" for p, a, b in tl)
            late = f" (began {(zero_ns - first) * 1e-6:.2f} ms after the first)" if first else ""
            print(f"  rank {rank} total {total*1e3:.2f}{late}  {phases}")
        out["cases"][k] = {"totals_s": totals, "ranks": ranks}
if w.rank == 0 and args.json:
    with open(args.json, "w") as f:
        json.dump(out, f)
    print(f"wrote {args.json}")
w.close()
