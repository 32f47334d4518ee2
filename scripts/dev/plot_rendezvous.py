"""Draw benchmarks/results/rendezvous-nvidia-h200-x1-mps-2026-11-29.png: the channel pingpong's one-way time
before the rendezvous (its best form then: the ring's grid form) and after (best form: the ring below 512 KiB,
the rendezvous above), against NVSHMEM's block put of the same runs, and the ratio to it.

    python scripts/dev/plot_rendezvous.py
    python scripts/dev/plot_rendezvous.py --before pingpong-rendezvous --now pingpong-rendezvous-done-word \
        --out rendezvous-done-word     # the fourteenth session's change against the thirteenth's record
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

R = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
D = "nvidia-h200-x1-mps-2026-11-29"


def rows(name: str, impl: str) -> dict[int, float]:
    data = json.loads((R / f"{name}-{D}.json").read_text())
    return {r["bytes"]: r["one_way_us"] for r in data["rows"] if r.get("impl") == impl and r.get("one_way_us")}


parser = argparse.ArgumentParser()
parser.add_argument("--before", default="pingpong-before-rendezvous")
parser.add_argument("--now", default="pingpong-rendezvous")
parser.add_argument("--out", default="rendezvous")
args = parser.parse_args()
before, after = rows(args.before, "circuslink"), rows(args.now, "circuslink")
nv_before = rows(args.before, "nvshmem-put-signal-block")
nv_after = rows(args.now, "nvshmem-put-signal-block")
rdv = rows(args.now, "circuslink-rdv")
rdv_before = rows(args.before, "circuslink-rdv")
first = args.before == "pingpong-before-rendezvous"
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
curves = [(before, "circuslink before (ring, grid form)" if first else "circuslink before (best form)", "o-"),
          (after, "circuslink now (best form)", "s-"), (rdv, "circuslink rendezvous form", "^--"),
          (nv_after, "NVSHMEM block put-with-signal", "d-")]
if not first:
    curves.insert(1, (rdv_before, "circuslink rendezvous form before", "v:"))
for series, label, style in curves:
    xs = sorted(x for x in series if x >= 32 << 10)
    a.plot(xs, [series[x] for x in xs], style, label=label)
a.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="one-way time (us, median)",
      title="channel pingpong, 2 ranks on one H200 under MPS")
a.legend(fontsize=8)
a.grid(True, which="both", alpha=0.3)
for series, nv, label, style in ((before, nv_before, "before", "o-"), (after, nv_after, "now", "s-")):
    xs = sorted(x for x in series if x in nv and x >= 32 << 10)
    b.plot(xs, [series[x] / nv[x] for x in xs], style, label=label)
b.axhline(1.0, color="k", lw=1, ls="--", label="NVSHMEM (target: at or below)")
b.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="circuslink / NVSHMEM (same run)",
      title="one-way time against NVSHMEM's best form")
b.legend(fontsize=8)
b.grid(True, which="both", alpha=0.3)
fig.tight_layout()
out = R / f"{args.out}-{D}.png"
fig.savefig(out, dpi=110)
print("wrote", out)
