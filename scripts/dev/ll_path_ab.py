"""Dev experiment: the channel's small-message one-way time against hand-written forms of the same format
(kernels in ll_path_ab.cu), and a per-round-trip timeline of the library's pingpong.

    circuslink run -n 2 -- python scripts/dev/ll_path_ab.py [--json FILE] [--samples 11] [--iters 2000]

Rows: one-way us = loop time / (2 x round trips), median and minimum over samples, beside the same run's relaxed
store+poll floor; the SM each rank ran on. Timeline rows: medians over the round trips of one sample of where a
round trip's time goes (rank 0's write call, the legs between the ranks' stamps).
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
from circuslink import probe
from circuslink.channels import Link, element_type
from circuslink.channels import open as open_channels

parser = argparse.ArgumentParser()
parser.add_argument("--json", default=None)
parser.add_argument("--samples", type=int, default=11)
parser.add_argument("--iters", type=int, default=2000)
parser.add_argument("--only", default="", help="comma-separated row names to run (default: all)")
args = parser.parse_args()

w = cl.init()
if w.size != 2:
    raise SystemExit("ll_path_ab.py runs on 2 ranks")
cp = w.xp
extra_opts = os.environ.get("LL_AB_OPTIONS", "").split()
mod = cl.compile(Path(__file__).with_name("ll_path_ab.cu").read_text(), options=extra_opts)
SYM = 64 << 20
buf = w.alloc(SYM)
cp.cuda.runtime.memset(buf.ptr(w.rank), 0, SYM)
mine, peer = np.uint64(buf.ptrs[w.rank]), np.uint64(buf.ptrs[1 - w.rank])
times = cp.zeros(4, dtype=cp.uint64)
srcw = cp.arange(64, dtype=cp.uint32) + 7
dstw = cp.zeros(64, dtype=cp.uint32)
U64, U32, I32 = np.uint64, np.uint32, np.int32
rows: list[dict] = []
base = 1 << 20
only = set(filter(None, args.only.split(",")))


def report(name: str, samples: list[float], sms, **extra) -> None:
    if w.rank == 0:
        row = dict(variant=name, one_way_us=statistics.median(samples), min_one_way_us=min(samples), sms=sms, **extra)
        rows.append(row)
        print(f"{name:34s} one-way {row['one_way_us']:.3f} us (min {row['min_one_way_us']:.3f})  SMs {sms}", flush=True)


def handwritten(kernel: str, name: str, params: tuple, **extra) -> None:
    """One hand-written variant: `params` go between the buffers and the loop's (base, warm-up, iterations)."""
    global base
    if only and name not in only:
        return
    f = mod.get_function(kernel)
    samples, sms = [], None
    for _ in range(args.samples):
        base += args.iters + 200
        w.barrier()
        f((1,), (32,), (I32(w.rank), mine, peer, *params, U64(base), I32(100), I32(args.iters), times))
        cp.cuda.Device().synchronize()
        t = times.get()
        got = w.allgather_object(((int(t[1]) - int(t[0])) / (2 * args.iters) / 1e3, int(t[2])))
        samples.append(got[0][0])
        sms = [g[1] for g in got]
    report(name, samples, sms, **extra)


def hw(name: str, nslots: int, stride: int, lanes: int, extras: int) -> None:
    handwritten("hw", name, (U32(nslots), U32(stride), U32(lanes), U32(extras), srcw, dstw), nslots=nslots,
                stride=stride, lanes=lanes, extras=extras)


def hw2(name: str, nslots: int, stride: int, mode: int) -> None:
    handwritten("hw2", name, (U32(nslots), U32(stride), U32(mode)), nslots=nslots, stride=stride, mode=mode)


byte = element_type("uchar")
GEOS = {  # name: (ring bytes, options)
    "default": (1 << 20, {}),
    "chunk256": (8192, {"chunk": 256}),
    "n4": (1, {"nslots": 4}),
}
links, options, k = [], {}, 0
for g, (ring, opts) in GEOS.items():
    for d, (a, b) in (("ping", (0, 1)), ("pong", (1, 0))):
        links.append(Link(f"{d}_{g}", f"{d}_{g}_in", k, k + 1, a, b, byte, ring))
        options[f"{d}_{g}"] = opts
        k += 2
ch = open_channels(w, links, options=options)


def lib(name: str, geo: str, kernel: str, n: int, timeline: bool = False) -> None:
    if only and name not in only:
        return
    tx, rx = (ch[f"ping_{geo}"], ch[f"pong_{geo}_in"]) if w.rank == 0 else (ch[f"pong_{geo}"], ch[f"ping_{geo}_in"])
    f = mod.get_function(kernel)
    samples, sms, legs = [], None, []
    src = cp.random.randint(0, 256, n, dtype=cp.uint8)
    dst = cp.zeros(n, dtype=cp.uint8)
    per = 5 if kernel == "lib_twice" else 3
    tl = cp.zeros(per * args.iters, dtype=cp.uint64)
    for s in range(args.samples):
        status = cp.ones(1, dtype=cp.int32)
        w.barrier()
        f((1,), (32,), (tx.device_handle(), rx.device_handle(), src, dst, U64(n), I32(w.rank), I32(100),
                        I32(args.iters), times, tl, status))
        ch.wait_kernel(cp.cuda.get_current_stream(), name)
        if int(status.get()[0]) != 1:
            raise SystemExit(f"{name}: a call failed on rank {w.rank}")
        if w.rank == 0 and not bool((src == dst).all()):
            raise SystemExit(f"{name}: bytes differ")
        t = times.get()
        stamps = tl.get() if timeline else None
        got = w.allgather_object(((int(t[1]) - int(t[0])) / (2 * args.iters) / 1e3, int(t[2]),
                                  None if stamps is None else (stamps[: per * args.iters] if w.rank == 0
                                                               else stamps[: args.iters])))
        samples.append(got[0][0])
        sms = [g[1] for g in got]
        if timeline and s == args.samples // 2 and per == 5:
            r0 = np.asarray(got[0][2], dtype=np.int64).reshape(-1, 5)
            d = np.diff(r0, axis=1)
            legs = dict(first_write_ns=float(np.median(d[:, 0])), second_write_ns=float(np.median(d[:, 1])),
                        first_read_ns=float(np.median(d[:, 2])), second_read_ns=float(np.median(d[:, 3])),
                        round_trip_ns=float(np.median(r0[1:, 0] - r0[:-1, 0])))
        elif timeline and s == args.samples // 2:
            r0 = np.asarray(got[0][2], dtype=np.int64).reshape(-1, 3)
            r1 = np.asarray(got[1][2], dtype=np.int64)
            t0, t1, t2 = r0[:, 0], r0[:, 1], r0[:, 2]
            legs = dict(write_call_ns=float(np.median(t1 - t0)),
                        to_rank1_forward_done_ns=float(np.median(r1 - t0)),
                        rank1_forward_to_rank0_read_done_ns=float(np.median(t2 - r1)),
                        rank0_loop_gap_ns=float(np.median(t0[1:] - t2[:-1])),
                        round_trip_ns=float(np.median(t0[1:] - t0[:-1])))
    extra = dict(geometry=geo, bytes=n, kernel=kernel, nslots=tx.geometry.nslots, chunk=tx.geometry.chunk)
    if legs:
        extra["timeline"] = legs
    report(name, samples, sms, **extra)
    if legs and w.rank == 0:
        print("    timeline (medians, ns):", json.dumps(legs), flush=True)


floor = probe.measure(w, quick=True)
floor_us = None
if w.rank == 0:
    pair = floor["pairs"][0] if isinstance(floor, dict) and "pairs" in floor else None
    print("floor:", json.dumps(pair if pair else floor)[:600], flush=True)

hw("hw fixed slot, 2 lanes", 1, 0, 2, 0)
for nslots in (1, 2, 8):
    for stride in (16, 32, 64, 128, 256, 4096):
        if nslots == 1 and stride != 16:
            continue
        hw(f"hw {nslots} slots x {stride} B, 1 lane", nslots, stride, 1, 0)
MODES = {0: "volatile", 1: ".gpu relaxed", 2: "writer pre-stores next line", 4: "reader stores consumed line",
         8: "reader also loads next slot", 6: "pre-store + consumed store"}
for nslots in (1, 2):
    for mode, what in list(MODES.items())[:2]:
        hw2(f"hw2 {nslots} slots x 256 B, {what}", nslots, 256, mode)
hw("hw 16 slots x 65792 B, 2 lanes", 16, 65792, 2, 0)
hw("hw 32 slots x 512 B, 2 lanes", 32, 512, 2, 0)
hw("hw 16 slots x 65792 B, 2 lanes, extras", 16, 65792, 2, 7)
hw("hw fixed slot, 16 lanes", 1, 0, 16, 0)
for geo in GEOS:
    lib(f"lib {geo} 8 B", geo, "lib_plain", 8)
lib("lib default 120 B", "default", "lib_plain", 120)
lib("lib default 8 B timeline", "default", "lib_timeline", 8, timeline=True)
lib("lib chunk256 8 B timeline", "chunk256", "lib_timeline", 8, timeline=True)
lib("lib default 8 B, two a round trip", "default", "lib_twice", 8, timeline=True)
lib("lib default 64 B, two a round trip", "default", "lib_twice", 64, timeline=True)
hw("hw fixed slot, 2 lanes (again)", 1, 0, 2, 0)
lib("lib default 8 B (again)", "default", "lib_plain", 8)
ch.close()
if w.rank == 0 and args.json:
    Path(args.json).write_text(json.dumps(dict(
        benchmark="ll-path-ab", device=os.environ.get("CIRCUSLINK_DEVICE_NAME", "unknown"),
        date=datetime.date.today().isoformat(), commit=os.environ.get("CIRCUSLINK_COMMIT", "unknown"),
        compile_options=extra_opts, rows=rows, floor=floor), indent=1, default=str))
w.close()
