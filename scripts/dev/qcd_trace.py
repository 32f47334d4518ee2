"""Dev aid: the resident CG's per-hop trace (dslash.cu's CIRCUSLINK_QCD_DEV_TRACE, written by _cuda.py where
CIRCUSLINK_QCD_DEV_TRACE_DIR names a folder) as a table: for each rank and lattice, the median over the traced hops
of each event's time since the hop began (us), each traced iteration's sums and vector steps after its last hop,
and how far the ranks' hop beginnings lie apart (the GPU clock is one for every process on a GPU).

    python scripts/dev/qcd_trace.py FOLDER
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys
from collections import defaultdict

EVENTS = ("started", "arrived", "last_interior", "interior", "end")
# After an iteration's last hop, in its record: block 0's dot part, the sum's barrier, its axpy part, the second
# sum's barrier, p's update's barrier.
AFTER = ("dot", "sum0", "axpy", "sum1", "vector")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    runs = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(argv[1], "trace-*.json"))):
        d = json.load(open(path))
        runs[os.path.basename(path).rsplit("-rank", 1)[0]].append(d)
    for name, ranks in runs.items():
        print(f"== {name}: median us after the hop began (hops traced: {len(ranks[0]['hops'])})")
        print("rank " + " ".join(f"{e:>13}" for e in EVENTS) + "   hop (begin to next begin)")
        for d in sorted(ranks, key=lambda r: r["rank"]):
            hops = d["hops"]
            cells = []
            for e in EVENTS:
                v = [h[e] - h["begin"] for h in hops if h.get(e) is not None]
                cells.append(f"{statistics.median(v):13.1f}" if v else f"{'-':>13}")
            span = [b["begin"] - a["begin"] for a, b in zip(hops[:-1], hops[1:], strict=True)]
            print(f"{d['rank']:>4} " + " ".join(cells) + (f"   {statistics.median(span):.1f}" if span else ""))
        # Every traced iteration's sums and vector steps, us after its last hop ended: the first iteration of a
        # launch against the others.
        if any(h.get("dot") is not None for d in ranks for h in d["hops"]):
            print("rank iter " + " ".join(f"{e:>9}" for e in AFTER) + "   (us after the iteration's last hop ended)")
            for d in sorted(ranks, key=lambda r: r["rank"]):
                last = [h for h in d["hops"] if h.get("dot") is not None and h.get("end") is not None]
                for i, h in enumerate(last):
                    cells = [f"{h[e] - h['end']:9.1f}" if h.get(e) is not None else f"{'-':>9}" for e in AFTER]
                    print(f"{d['rank']:>4} {i:>4} " + " ".join(cells))
        if len(ranks) > 1:  # the same hop's beginning on every rank, on the one clock
            n = min(len(r["hops"]) for r in ranks)
            skew = [max(r["t0_ns"] * 1e-3 + r["hops"][i]["begin"] for r in ranks)
                    - min(r["t0_ns"] * 1e-3 + r["hops"][i]["begin"] for r in ranks) for i in range(n)]
            print(f"ranks' hop beginnings apart: median {statistics.median(skew):.1f} us, most {max(skew):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
