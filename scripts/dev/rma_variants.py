"""Dev experiment: one start-to-wait cycle of an 8 x 8 B RMA chain in each protocol (kernels in rma_variants.cu).

    circuslink run -n 2 -- python scripts/dev/rma_variants.py [--json FILE]

Two ranks in a ring (each the other's target and origin). One row a variant: microseconds a cycle (median
and minimum over samples of `iters` cycles; the slowest rank's clock), beside the same run's relaxed
store+poll floor from `circuslink probe`, and the SM each rank's block ran on.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

import circuslink as cl
from circuslink import probe

parser = argparse.ArgumentParser()
parser.add_argument("--json", default=None)
parser.add_argument("--samples", type=int, default=11)
parser.add_argument("--iters", type=int, default=2000)
args = parser.parse_args()

w = cl.init()
if w.size != 2:
    raise SystemExit("rma_variants.py runs on 2 ranks")
cp = w.xp
mod = cl.compile(Path(__file__).with_name("rma_variants.cu").read_text())
buf = w.alloc(1 << 20)
cp.cuda.runtime.memset(buf.ptr(w.rank), 0, 1 << 20)
mine, peer = np.uint64(buf.ptrs[w.rank]), np.uint64(buf.ptrs[1 - w.rank])
src = cp.arange(8, dtype=cp.uint64) + 1000 * (w.rank + 1)
times = cp.zeros(4, dtype=cp.uint64)
base = 1
rows = []


def timed(kernel: str) -> None:
    global base
    f = mod.get_function(kernel)
    warmup = 100
    samples, sms = [], []
    for _ in range(args.samples):
        w.barrier()
        f((1,), (32,), (mine, peer, src, np.uint64(base), np.int32(warmup), np.int32(args.iters), times))
        base += warmup + args.iters + 16
        cp.cuda.Device().synchronize()
        t = times.get()
        got = w.allgather_object(((int(t[1]) - int(t[0])) / args.iters / 1e3, int(t[2])))
        per = max(g[0] for g in got)
        samples.append(per)
        sms.append((tuple(g[1] for g in got), round(per, 3)))
    # the last cycle's words arrived whole (the fenced forms: the peer's words + the last epoch)
    if kernel.startswith("fenced"):
        mem = cp.cuda.UnownedMemory(buf.ptrs[w.rank] + 4096, 64, None)
        dst = cp.ndarray(8, cp.uint64, cp.cuda.MemoryPointer(mem, 0))
        want = np.arange(8, dtype=np.uint64) + 1000 * (2 - w.rank) + np.uint64(base - 17)
        if not np.array_equal(dst.get(), want):
            raise SystemExit(f"{kernel}: rank {w.rank} destination {dst.get().tolist()} != {want.tolist()}")
    if w.rank == 0:
        row = dict(variant=kernel, ranks=w.size, us=statistics.median(samples), min_us=min(samples), sm_ids_us=sms)
        rows.append(row)
        print(f"{kernel:10s}: {row['us']:.3f} us a cycle (min {row['min_us']:.3f})", flush=True)
        print("   (SM of each rank's block, us):", " ".join(f"{ids}:{us}" for ids, us in sms), flush=True)


floor = probe.measure(w, quick=True)
for kernel in ("bare", "fenced", "fenced_wp", "ll_post", "ll_credit", "fenced", "bare"):
    timed(kernel)
if w.rank == 0:
    print("floor:", floor)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=floor.get("device") if isinstance(floor, dict) else None,
                                                date=__import__("datetime").date.today().isoformat(),
                                                commit=__import__("os").environ.get("CIRCUSLINK_COMMIT", "unknown"),
                                                rows=rows, floor=str(floor)), indent=1))
w.close()
