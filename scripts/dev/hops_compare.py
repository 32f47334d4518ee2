"""Dev: `bench hops` results side by side (two trees, or before/after a change), with what each hop step adds.

    python scripts/dev/hops_compare.py old=/path/old.json new=/path/new.json

One column a file: one-way latency by hops (median), the step from the hop count before it (1 -> 2 is the first
agent step: first == last; each later step is one more forwarding hop each way), the least-squares slope against
hops as `bench hops` fits it (summary()), against the same file's relaxed store+poll floor, and the throughput
at 1 hop and at the most hops per size.
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from circuslink.bench.hops import summary
from circuslink.bench.pingpong import floor_pair


def load(arg: str) -> tuple[str, dict]:
    label, _, path = arg.rpartition("=")
    with open(path) as f:
        return label or path, json.load(f)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    runs = [load(a) for a in argv]
    width = max(12, *(len(label) for label, _ in runs))
    print("hops".rjust(5) + "".join(label.rjust(width) + "step".rjust(8) for label, _ in runs))
    by_run = []
    for _, data in runs:
        lat = sorted((r for r in data["rows"] if r["impl"] == "latency"), key=lambda r: r["hops"])
        by_run.append({r["hops"]: r["one_way_us"] for r in lat})
    for h in sorted({h for table in by_run for h in table}):
        line = f"{h:5d}"
        for table in by_run:
            v, before = table.get(h), table.get(h - 1)
            step = f"{v - before:8.3f}" if v is not None and before is not None else " " * 8
            line += (f"{v:{width}.3f}" if v is not None else " " * width) + step
        print(line)
    for label, data in runs:
        res = SimpleNamespace(rows=data["rows"], floor=data.get("floor"))
        floor = floor_pair(res).get("lat_relaxed_us")
        print(f"\n{label}: commit {data.get('commit', '?')}, floor {floor} us, "
              f"agent: {data.get('meta', {}).get('agent', '?')}")
        for text in summary(res)["lines"]:
            print("  " + text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
