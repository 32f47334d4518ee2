"""Dev: draw the sixth session's latency-path figure from its results files (no GPU needed).

    python scripts/dev/plot_latency_path.py [--tag nvidia-h200-x1-mps-2026-11-28]

Left: the channel pingpong's 8-byte one-way time against the probe's floor and hand-written forms of the same
format (ll-path-ab-before / -after). Right: the one-shot all-reduce's 8-byte call at 2, 4 and 8 ranks, the fourth
session's bench runs against this session's (allreduce-N-quick), with the targets (3 x / 6 x the run's floor).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

R = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
parser = argparse.ArgumentParser()
parser.add_argument("--tag", default="nvidia-h200-x1-mps-2026-11-28")
parser.add_argument("--earlier", default="nvidia-h200-x1-mps-2026-11-26", help="the all-reduce runs to compare with")
args = parser.parse_args()


def load(name: str) -> dict:
    return json.loads((R / name).read_text())


def variant(d: dict, name: str) -> float:
    return next(r for r in d["rows"] if r["variant"] == name)["one_way_us"]


def oneshot_8(d: dict) -> float:
    return next(r for r in d["rows"] if r["impl"] == "oneshot" and r["bytes"] == 8)["time_us"]


after, before = load(f"ll-path-ab-after-{args.tag}.json"), load(f"ll-path-ab-before-{args.tag}.json")
floor = after["floor"]["summary"]["lat_relaxed_us"]
bars = [("floor\n(probe)", floor, "#888"), ("by hand\nfixed slot", variant(after, "hw fixed slot, 2 lanes"), "#4c72b0"),
        ("by hand, 2 slots\n16 B apart", variant(after, "hw 2 slots x 16 B, 1 lane"), "#4c72b0"),
        ("by hand, 16 slots\n64 KiB apart", variant(after, "hw 16 slots x 65792 B, 2 lanes"), "#4c72b0"),
        ("library\nbefore", variant(before, "lib default 8 B"), "#c44e52"),
        ("library\nnow", variant(after, "lib default 8 B"), "#55a868")]
fig, ax = plt.subplots(1, 2, figsize=(13, 4.8))
for i, (_, v, c) in enumerate(bars):
    ax[0].bar(i, v, color=c)
    ax[0].text(i, v + 0.01, f"{v:.3f}", ha="center", fontsize=9)
ax[0].axhline(1.3 * floor, ls="--", color="k", lw=1)
ax[0].text(-0.4, 1.3 * floor + 0.01, "1.3 x floor", fontsize=8)
ax[0].set_xticks(range(len(bars)))
ax[0].set_xticklabels([b[0] for b in bars], fontsize=8)
ax[0].set_ylabel("one-way time, 8 B (us)")
ax[0].set_title("Channel pingpong, 2 ranks under MPS on one H200\n(scripts/dev/ll_path_ab.py, medians of 11 x 2,000 "
                "round trips)", fontsize=10)
ranks, w = (2, 4, 8), 0.38
for i, n in enumerate(ranks):
    old = oneshot_8(load(f"allreduce-{n}-{args.earlier}.json"))
    d = load(f"allreduce-{n}-quick-{args.tag}.json")
    new, fl = oneshot_8(d), d["floor"]["summary"]["lat_relaxed_us"]
    ax[1].bar(i - w / 2, old, w, color="#c44e52", label="before (fourth session's bench)" if i == 0 else None)
    ax[1].bar(i + w / 2, new, w, color="#55a868", label="now (bench allreduce --quick)" if i == 0 else None)
    ax[1].text(i - w / 2, old + 0.03, f"{old:.2f}", ha="center", fontsize=9)
    ax[1].text(i + w / 2, new + 0.03, f"{new:.2f}", ha="center", fontsize=9)
    target = (3 if n == 2 else 6) * fl
    ax[1].plot([i - 0.45, i + 0.45], [target, target], "k--", lw=1)
ax[1].set_xticks(range(len(ranks)))
ax[1].set_xticklabels([f"{n} ranks" for n in ranks])
ax[1].set_ylabel("us a call, 8-byte sum")
ax[1].set_title("One-shot all-reduce, 8 B (dashed: target, 3 x / 6 x the run's floor)", fontsize=10)
ax[1].legend(fontsize=8, loc="upper left")
fig.tight_layout()
out = R / f"latency-path-{args.tag}.png"
fig.savefig(out, dpi=110)
print("wrote", out)
