"""Plot the on-chip persistent stencil's time an iteration through the 2026-11-29 steps (events -> device clock ->
sessions -> in-place rows), channels beside NVSHMEM, at 8x8 and 64x64 a rank on 2 and 4 ranks, against 6 x the
run's relaxed store+poll floor.

    python scripts/dev/plot_stencil_steps.py benchmarks/results OUT.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STEPS = [("events (ece3cd8)", "stencil-onchip-ab-events-onchip"), ("device clock", "stencil-clocks-plain-onchip"),
         ("+ sessions", "stencil-clocks-sessions-onchip"), ("+ rows in place", "stencil-clocks-inplace-onchip")]
CASES = [(2, "8x16"), (2, "64x128"), (4, "16x16"), (4, "128x128")]
LABEL = {"8x16": "8x8", "64x128": "64x64", "16x16": "8x8", "128x128": "64x64"}


def main() -> int:
    folder, out = Path(sys.argv[1]), sys.argv[2]
    fig, axes = plt.subplots(1, len(CASES), figsize=(16, 4.5), sharey=True)
    for ax, (n, domain) in zip(axes, CASES, strict=True):
        chan, nv, floors = [], [], []
        for _, stem in STEPS:
            data = json.loads(next(folder.glob(f"{stem}-*-2026-11-29.json")).read_text())
            rows = {(r["impl"], r["nranks"], r["domain"]): r for r in data["rows"] if r.get("time_per_iter_us")}
            chan.append(rows[("channel-persistent", n, domain)]["time_per_iter_us"])
            nv.append(rows[("nvshmem-persistent", n, domain)]["time_per_iter_us"])
            floors.append(data["floor"]["pairs"][0]["lat_relaxed_us"])
        x = range(len(STEPS))
        ax.bar([i - 0.2 for i in x], chan, 0.4, label="channels")
        ax.bar([i + 0.2 for i in x], nv, 0.4, label="NVSHMEM")
        ax.plot(list(x), [6 * f for f in floors], "k--", label="6 x relaxed store+poll floor (target)")
        ax.set_xticks(list(x), [s for s, _ in STEPS], rotation=20, fontsize=8)
        ax.set_title(f"{n} ranks, {LABEL[domain]} a rank, float64")
    axes[0].set_ylabel("us per iteration (median, slowest rank)")
    axes[0].legend(fontsize=8)
    fig.suptitle("On-chip persistent stencil on one H200 under MPS, 2026-11-29")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
