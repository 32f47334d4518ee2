"""Dev experiment: A/B variants of the channel pingpong's warp kernel (kernels in channel_variants.cu).

    circuslink run -n 2 -- python scripts/dev/channel_variants.py [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import cupy as cp
import numpy as np

import circuslink as cl
from circuslink.channels import Link, element_type
from circuslink.channels import open as open_channels

parser = argparse.ArgumentParser()
parser.add_argument("--json", default=None)
args = parser.parse_args()
w = cl.init()
mod = cl.compile(Path(__file__).with_name("channel_variants.cu").read_text())
byte = element_type("uchar")
links = [Link("ping", "ping_in", 1, 2, 0, 1, byte, 65536), Link("pong", "pong_in", 3, 4, 1, 0, byte, 65536)]
ch = open_channels(w, links)
tx, rx = (ch["ping"], ch["pong_in"]) if w.rank == 0 else (ch["pong"], ch["ping_in"])
rows = []
for name in ("v_bench", "v_src_shared", "v_both_shared", "v_read_write_echo", "v_bench"):
    for n in (8, 120, 1024):
        samples = []
        for _ in range(11):
            times = cp.zeros(4, dtype=cp.uint64)
            status = cp.ones(1, dtype=cp.int32)
            src = cp.random.randint(0, 256, n, dtype=cp.uint8)
            dst = cp.zeros(n, dtype=cp.uint8)
            iters = 2000
            mod.get_function(name)((1,), (32,), (tx.device_handle(), rx.device_handle(), src, dst, np.uint64(n),
                                                 np.int32(w.rank), np.int32(100), np.int32(iters), times, status))
            ch.wait_kernel(cp.cuda.get_current_stream(), name)
            assert int(status.get()[0]) == 1
            if w.rank == 0:
                assert bool((src == dst).all()), name
                t = times.get()
                samples.append((int(t[1]) - int(t[0])) / (2 * iters) / 1e3)
                mhz = int(t[2]) / max(1, int(t[1]) - int(t[0])) * 1e3
        if w.rank == 0:
            rows.append(dict(variant=name, bytes=n, one_way_us=statistics.median(samples), min_us=min(samples),
                             sm_mhz=mhz))
            print(f"{name:20s} {n:6d} B  one-way {rows[-1]['one_way_us']:.3f} us (min {rows[-1]['min_us']:.3f}) "
                  f"SM clock {mhz:.0f} MHz", flush=True)
ch.close()
if w.rank == 0 and args.json:
    Path(args.json).write_text(json.dumps(rows, indent=1))
w.close()
