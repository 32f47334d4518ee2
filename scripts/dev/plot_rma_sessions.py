"""Plot bench rma's 8-byte chains by form (plain device calls, sessions, graphs of two nodes a cycle and of one,
NVSHMEM's put-with-signal chain) at 2 and 4 ranks against 3 x the run's relaxed floor (the device-driven target).

    python scripts/dev/plot_rma_sessions.py OUT.png RMA2.json RMA4.json
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FORMS = [("rma-device", "rma_start / rma_wait"), ("rma-device-session", "rma_session"),
         ("rma-host-graphed", "graph, 2 nodes a cycle"), ("rma-host-graphed-cycle", "graph, 1 node a cycle"),
         ("nvshmem-put-signal-chain", "NVSHMEM put-signal chain")]


def main(out: str, *files: str) -> None:
    fig, axes = plt.subplots(1, len(files), figsize=(6 * len(files), 4.2), sharey=True)
    for ax, path in zip(axes if len(files) > 1 else [axes], files, strict=True):
        d = json.load(open(path))
        floor = d["floor"]["summary"]["lat_relaxed_us"]
        rows = {(r["impl"], r["chain"]): r for r in d["rows"] if r.get("bytes") == 8 and r.get("layout") ==
                "contiguous" and r.get("time_us")}
        width = 0.38
        for k, chain in enumerate((1, 8)):
            xs, ys = [], []
            for i, (impl, _) in enumerate(FORMS):
                if (impl, chain) in rows:
                    xs.append(i + (k - 0.5) * width)
                    ys.append(rows[(impl, chain)]["time_us"])
            ax.bar(xs, ys, width, label=f"{chain} x 8 B")
            for x, y in zip(xs, ys, strict=True):
                ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
        ax.axhline(3 * floor, color="k", ls="--", lw=1, label=f"3 x relaxed floor ({3 * floor:.2f} us)")
        ax.set_xticks(range(len(FORMS)), [name for _, name in FORMS], rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{d['nranks']} ranks, start to wait ({d['device']}, {d['commit'][:7]})", fontsize=9)
        ax.set_ylabel("us a cycle (median of the slowest rank)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:])
