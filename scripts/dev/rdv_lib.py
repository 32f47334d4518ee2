"""Dev experiment: the library's rendezvous pingpong (bench/kernels/pingpong_channels.cu: pingpong_rdv) under
knobs, beside the hand-written one's figure, to find where its time goes.

    circuslink run -n 2 -- python scripts/dev/rdv_lib.py [--sizes 256K,16M] [--blocks 8,33,66] [--json FILE]

Rows: size, blocks, launch (cooperative or plain): one-way us (median, min over samples of round-trip loops).
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
from circuslink import channels
from circuslink.bench import pingpong as pp
from circuslink.bench._driver import parse_sizes
from circuslink.device_code import DEFINES_VAR, defines_from_env
from circuslink.spec import Link, element_type

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="256K,16M")
parser.add_argument("--blocks", default="8,33,66")
parser.add_argument("--launch", default="resident,plain")
parser.add_argument("--samples", type=int, default=7)
parser.add_argument("--backoff", default="256", help="CIRCUSLINK_RDV_BACKOFF_NS values to compile the kernel with")
parser.add_argument("--defines", default="", help="more #defines for every variant, e.g. CIRCUSLINK_RDV_TEAM=8")
parser.add_argument("--json", default=None)
args = parser.parse_args()


w = cl.init()
cp = w.xp
extra = defines_from_env({DEFINES_VAR: args.defines})
fns = {b: cl.compile(pp.KERNELS.read_text(), options=[f"-DCIRCUSLINK_RDV_BACKOFF_NS={b}"] + extra)
       .get_function("pingpong_rdv") for b in args.backoff.split(",")}
fn = next(iter(fns.values()))
sizes = parse_sizes(args.sizes)
win = w.alloc(max(sizes))
byte = element_type("uchar")
opts = {"chunk": 64 << 10, "ll_max": 0, "window": win, "nslots": 16, "rendezvous_min": min(sizes)}
ch = channels.open(w, [Link("ping", "ping_in", 1, 2, 0, 1, byte, 1 << 20), Link("pong", "pong_in", 3, 4, 1, 0, byte,
                                                                               1 << 20)],
                   options={"ping": opts, "pong": opts})
tx, rx = (ch["ping"], ch["pong_in"]) if w.rank == 0 else (ch["pong"], ch["ping_in"])
most = w.backend.max_blocks(fn, 256)
if w.rank == 0:
    print(f"pingpong_rdv: {fn.num_regs} registers, {fn.local_size_bytes} B local, max_blocks {most}", flush=True)
rows = []
for launch, backoff in [(la, b) for la in args.launch.split(",") for b in fns]:
    fn = fns[backoff]
    for blocks in [min(int(b), most) for b in args.blocks.split(",")]:
        for n in sizes:
            src = win.local[:n]
            src[...] = cp.asarray(np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)) if w.rank == 0 else 0
            dst = cp.zeros(n, dtype=cp.uint8)
            iters = 20
            times_l = []
            for _ in range(args.samples):
                status = cp.ones(1, dtype=cp.int32)
                times = cp.zeros(3, dtype=cp.uint64)
                bar = cp.zeros(2, dtype=cp.uint32)
                cp.cuda.Device().synchronize()
                w.barrier()
                a = (tx.device_handle(), rx.device_handle(), src, dst, np.uint64(n), np.int32(w.rank), np.int32(3),
                     np.int32(iters), bar, np.uint64(ch.device_timeout_ns), times, status)
                if launch == "resident":
                    w.backend.launch_resident(fn, blocks, 256, a)
                else:
                    fn((blocks,), (256,), a)
                ch.wait_kernel(cp.cuda.get_current_stream(), lambda: "pingpong_rdv")
                tx.check()
                rx.check()
                t = times.get()
                times_l.append((int(t[1]) - int(t[0])) / (2 * iters) / 1e3)
                assert int(status.get()[0]) == 1
            ok = w.rank != 0 or bool((dst == src).all())
            if w.rank == 0:
                row = dict(bytes=n, blocks=blocks, launch=launch, backoff_ns=int(backoff), defines=args.defines,
                           one_way_us=statistics.median(times_l), min_one_way_us=min(times_l), verified=ok)
                rows.append(row)
                print(f"{launch:9s} backoff {backoff:>5s} ns {blocks:3d} blocks {n:>10d} B: "
                      f"{row['one_way_us']:9.2f} us (min {row['min_one_way_us']:9.2f}) {'ok' if ok else 'WRONG'}",
                      flush=True)
if w.rank == 0 and args.json:
    Path(args.json).write_text(json.dumps(dict(benchmark="rdv-lib-dev", device=os.environ.get("CIRCUSLINK_DEVICE_NAME"),
                                               date=datetime.date.today().isoformat(),
                                               commit=os.environ.get("CIRCUSLINK_COMMIT"), rows=rows), indent=1))
ch.close()
win.close()
w.close()
