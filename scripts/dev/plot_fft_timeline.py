"""Plot fft_timeline.py's JSON: for each chunk count, every rank's phases in the median iteration (transforms on
the compute stream, the exchange from first put to last wait on the comm stream). Usage: OUT.png IN.json"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out, src = sys.argv[1], sys.argv[2]
d = json.load(open(src))
cases = d["cases"]
fig, axes = plt.subplots(len(cases), 1, figsize=(10, 2.2 * len(cases) + 0.6), squeeze=False)
colors = {"fft": "tab:blue", "comm": "tab:orange"}
for ax, (k, c) in zip(axes[:, 0], cases.items(), strict=True):
    totals = c["totals_s"]
    med = sorted(range(len(totals)), key=lambda i: totals[i])[len(totals) // 2]
    # runs from before the GPU-clock stamp have no third element: every rank's zero its own execute's start
    zeros = [r["runs"][med][2] if len(r["runs"][med]) > 2 else 0 for r in c["ranks"]]
    first = min(zeros)
    for rank, r in enumerate(c["ranks"]):
        tl = r["runs"][med][1]
        shift = (zeros[rank] - first) * 1e-6 if first else 0.0  # ms after the earliest rank's start
        for phase, a, b in tl:
            if phase in colors:
                y = rank + (0.2 if phase == "comm" else -0.2)
                ax.barh(y, (b - a) * 1e3, left=a * 1e3 + shift, height=0.35, color=colors[phase])
    ax.set_yticks(range(len(c["ranks"])), [f"rank {i}" for i in range(len(c["ranks"]))])
    ax.invert_yaxis()
    ax.set_title(f"{k} chunk(s): median iteration {totals[med] * 1e3:.2f} ms (slowest rank)", fontsize=9)
    ax.set_xlabel("ms from the first rank's execute start (GPU clock)" if first else
                  "ms from each rank's execute start (after the device-side meeting)")
handles = [plt.Rectangle((0, 0), 1, 1, color=v) for v in colors.values()]
fig.legend(handles, ["cuFFT (compute stream)",
                     "exchange: first put to last wait (comm stream); the pull: its meetings"],
           loc="lower center", ncol=2, fontsize=8)
where = f"{d.get('device', '')}, {d.get('date', '')}"
fig.suptitle(f"{d['size']}^2 {d['dtype']}, {d['ranks']} ranks sharing one GPU ({where})", fontsize=10)
fig.tight_layout(rect=(0, 0.06, 1, 0.95))
fig.savefig(out, dpi=110)
