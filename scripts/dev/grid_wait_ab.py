"""Dev experiment: the ring's grid form had one-way medians of hundreds of microseconds where its minimum was a few
(the fourteenth session's pingpong record: grid4k 1 MiB 380 us median, 168 minimum; grid16k 4 MiB 556 / 396;
both at 33 blocks), the signature of the rendezvous' first cut, whose waiting warps read the host's abort word
too often. Variants of the kernels of bench/kernels/pingpong_channels.cu: the library's grid waits as they are
(CIRCUSLINK_GRID_WAIT=0), with the abort word read at every 16th check (1), with a back-off too (2); and the
pingpong kernel's own spin on its round counter with a back-off (PINGPONG_DONE_BACKOFF=128).

    circuslink run -n 2 -- python scripts/dev/grid_wait_ab.py [--json FILE]

(Ran at e78b6e7: grid-wait-ab-...json. Both switches are gone since: variant 1 is the grid forms' wait, the
pingpong's back-off changed nothing.)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from pathlib import Path

import circuslink as cl
from circuslink.bench import pingpong as pp
from circuslink.bench._driver import parse_sizes
from circuslink.device_code import DEFINES_VAR, defines_from_env

parser = argparse.ArgumentParser()
parser.add_argument("--variants", default=",CIRCUSLINK_GRID_WAIT=1,CIRCUSLINK_GRID_WAIT=2,PINGPONG_DONE_BACKOFF=128")
parser.add_argument("--cases", default="grid4k:1M,grid4k:2M,grid16k:2M,grid16k:4M,grid4k:32K")
parser.add_argument("--samples", type=int, default=9)
parser.add_argument("--trips", type=int, default=8)
parser.add_argument("--json", default=None)
args = parser.parse_args()


w = cl.init()
cases = [(c.split(":")[0], parse_sizes(c.split(":")[1], "--cases")[0]) for c in args.cases.split(",")]
pair = pp.ChannelPair(w, sorted({n for _, n in cases}) + [256 << 20])  # the record's rings (sized by its top)
rows = []
for variant in args.variants.split(","):
    mod = cl.compile(pp.KERNELS.read_text(), options=defines_from_env({DEFINES_VAR: variant.replace("+", ",")}))
    for config, n in cases:
        tx, rx = pair.ends(config)
        blocks = pair.grid_blocks(config, n)
        one_way, good = [], True
        for _ in range(args.samples):
            w.barrier()
            t, ok = pp.device_round_trips(w, mod, "grid", tx, rx, n, w.rank, 2, args.trips, blocks,
                                          f"{variant or 'base'} {config} {n}")
            good = good and ok
            one_way.append(t / (2 * args.trips) * 1e6)
        if w.rank == 0:
            row = dict(variant=variant or "base", config=config, bytes=n, blocks=blocks,
                       one_way_us=statistics.median(one_way), min_one_way_us=min(one_way), samples=one_way,
                       verified=good)
            rows.append(row)
            print(f"{variant or 'base':32s} {config:8s} {n:>9d} B {blocks:3d} blocks: {row['one_way_us']:9.2f} us "
                  f"(min {row['min_one_way_us']:8.2f}) {'ok' if good else 'WRONG'}", flush=True)
if w.rank == 0 and args.json:
    Path(args.json).write_text(json.dumps(dict(
        benchmark="grid-wait-ab-dev", device=os.environ.get("CIRCUSLINK_DEVICE_NAME"),
        date=datetime.date.today().isoformat(), commit=os.environ.get("CIRCUSLINK_COMMIT"), rows=rows), indent=1))
pair.close()
w.close()
