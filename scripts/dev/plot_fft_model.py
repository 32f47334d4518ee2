"""Dev aid: the tile model's prediction of a plan's puts against the puts measured alone (bench fft's
``put_alone_ms``), per case: the model fitted on each rank alone (``predicted_comm_alone_ms``) and with the bound of
the ranks' shared copy bandwidth (``predicted_comm_ms``), for several runs side by side.

    python scripts/dev/plot_fft_model.py OUT.png LABEL=RESULTS.json ...
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    bars = []  # (label, measured, alone model, shared model)
    device = "one GPU"
    for spec in argv[1:]:
        label, path = spec.split("=", 1)
        res = json.load(open(path))
        device = res.get("device", device)
        for r in res["rows"]:
            if r.get("impl") == "transpose-put" and r.get("put_alone_ms"):
                bars.append((f"{r['case']} {r['dtype'][7:]}, {r['ranks']} ranks\n{label}", r["put_alone_ms"],
                             r.get("predicted_comm_alone_ms", r.get("predicted_comm_ms")), r.get("predicted_comm_ms")))
    fig, ax = plt.subplots(figsize=(2.2 * len(bars) + 2, 4.5))
    w = 0.27
    for i, (_, meas, alone, shared) in enumerate(bars):
        ax.bar(i - w, meas, w, color="C0", label="puts measured alone" if i == 0 else None)
        ax.bar(i, alone, w, color="C1", label="model, each rank alone" if i == 0 else None)
        ax.bar(i + w, shared, w, color="C2", label="model with the shared bound" if i == 0 else None)
        ax.text(i + w, shared, f"{100 * (shared / meas - 1):+.0f}%", ha="center", va="bottom", fontsize=8)
        ax.text(i, alone, f"{100 * (alone / meas - 1):+.0f}%", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("ms, one forward reshape set (slowest rank)")
    ax.set_title(f"FFT tile model against the puts alone, {device} under MPS (target within 15%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[0], dpi=110)
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
