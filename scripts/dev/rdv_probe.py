"""Dev experiment: where a rendezvous round trip's time goes. The library's pingpong_rdv (bench/kernels/
pingpong_channels.cu) compiled with CIRCUSLINK_RDV_PROBE recording, for one chosen message, the earliest and
latest %globaltimer at which the warps of each rank reached each phase (channel_impl.cuh lists them). Both ranks
share the GPU's timer, so one round trip's phases line up on one axis (ns from rank 0 posting the ping).

    circuslink run -n 2 -- python scripts/dev/rdv_probe.py [--sizes 256K,4M] [--blocks 49] [--defines X=1]
"""
from __future__ import annotations

import argparse
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

PRELUDE = r"""
__device__ unsigned long long cl_probe[2][8];
__device__ unsigned long long cl_probe_seq;
__device__ __forceinline__ void cl_rdv_probe(int ev, unsigned long long seq) {
  if (seq != cl_probe_seq) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  atomicMin(&cl_probe[0][ev], t);
  atomicMax(&cl_probe[1][ev], t);
}
#define CIRCUSLINK_RDV_PROBE(ev, seq) cl_rdv_probe(ev, seq)
"""
NAMES = ["send entered", "descriptor posted", "finish seen", "peek entered", "header seen", "copy started",
         "copy done", "(unused)"]

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="256K,1M,4M,16M")
parser.add_argument("--blocks", type=int, default=49)
parser.add_argument("--samples", type=int, default=5)
parser.add_argument("--defines", default="")
parser.add_argument("--json", default=None)
args = parser.parse_args()


w = cl.init()
cp = w.xp
mod = cl.compile(PRELUDE + pp.KERNELS.read_text(), options=defines_from_env({DEFINES_VAR: args.defines}))
fn = mod.get_function("pingpong_rdv")
probe = cp.ndarray((2, 8), dtype=cp.uint64, memptr=mod.get_global("cl_probe"))
probe_seq = cp.ndarray((1,), dtype=cp.uint64, memptr=mod.get_global("cl_probe_seq"))
probe_seq[...] = 1 << 62
sizes = parse_sizes(args.sizes)
win = w.alloc(max(sizes))
byte = element_type("uchar")
opts = {"chunk": 64 << 10, "ll_max": 0, "window": win, "nslots": 16, "rendezvous_min": min(sizes)}
ch = channels.open(w, [Link("ping", "ping_in", 1, 2, 0, 1, byte, 1 << 20), Link("pong", "pong_in", 3, 4, 1, 0, byte,
                                                                               1 << 20)],
                   options={"ping": opts, "pong": opts})
tx, rx = (ch["ping"], ch["pong_in"]) if w.rank == 0 else (ch["pong"], ch["ping_in"])
blocks = min(args.blocks, w.backend.max_blocks(fn, 256))
sent = 0
out = []
for n in sizes:
    src = win.local[:n]
    src[...] = cp.asarray(np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)) if w.rank == 0 else 0
    dst = cp.zeros(n, dtype=cp.uint8)
    warmup, iters = 3, 20
    times_l = []
    for sample in range(args.samples + 1):
        probing = sample == args.samples
        if probing:
            probe[0, :] = np.uint64(2**64 - 1)
            probe[1, :] = 0
            probe_seq[0] = sent + warmup + iters // 2
        status = cp.ones(1, dtype=cp.int32)
        times = cp.zeros(3, dtype=cp.uint64)
        bar = cp.zeros(2, dtype=cp.uint32)
        cp.cuda.Device().synchronize()
        w.barrier()
        a = (tx.device_handle(), rx.device_handle(), src, dst, np.uint64(n), np.int32(w.rank), np.int32(warmup),
             np.int32(iters), bar, np.uint64(ch.device_timeout_ns), times, status)
        w.backend.launch_resident(fn, blocks, 256, a)
        ch.wait_kernel(cp.cuda.get_current_stream(), lambda: "pingpong_rdv")
        sent += warmup + iters
        t = times.get()
        if not probing:
            times_l.append((int(t[1]) - int(t[0])) / (2 * iters) / 1e3)
        assert int(status.get()[0]) == 1
    mine = probe.get().astype(np.int64)
    both = w.allgather_object(mine.tolist())
    if w.rank == 0:
        r0, r1 = np.array(both[0], dtype=np.float64), np.array(both[1], dtype=np.float64)
        t0 = r0[0, 1]  # rank 0 posted the ping
        unset = float(2**63)
        print(f"== {n} B, {blocks} blocks: one-way {statistics.median(times_l):.2f} us (min {min(times_l):.2f})")
        rowsn = []
        # the ping: rank 0 sends, rank 1 receives; the pong: rank 1 sends, rank 0 receives
        for leg, snd, rcv in (("ping", r0, r1), ("pong", r1, r0)):
            for ev in range(8):
                arr = snd if ev < 3 else rcv
                lo, hi = arr[0, ev], arr[1, ev]
                if lo >= unset or hi == 0:
                    continue
                rowsn.append(dict(leg=leg, phase=NAMES[ev], first_ns=lo - t0, last_ns=hi - t0))
                print(f"  {leg} {NAMES[ev]:18s} first {lo - t0:9.0f} ns  last {hi - t0:9.0f} ns")
        out.append(dict(bytes=n, blocks=blocks, one_way_us=statistics.median(times_l), min_one_way_us=min(times_l),
                        phases=rowsn))
if w.rank == 0 and args.json:
    meta = dict(benchmark="rdv-probe-dev", device=os.environ.get("CIRCUSLINK_DEVICE_NAME"),
                commit=os.environ.get("CIRCUSLINK_COMMIT"), defines=args.defines)
    Path(args.json).write_text(json.dumps(dict(meta, rows=out), indent=1))
ch.close()
win.close()
w.close()
