"""The device-resident CG's time per iteration by lattice and grid, from `bench qcd --cg device` results files
side by side (one line each per grid), with the 8^4 one-rank target.

    python scripts/dev/plot_qcd_device.py OUT.png LABEL=FILE.json [LABEL=FILE.json ...]
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
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    for n, spec in enumerate(argv[1:]):
        label, path = spec.split("=", 1)
        rows = [r for r in json.load(open(path))["rows"] if r.get("cg") and r.get("time_per_iter_us")]
        for grid, colour in (("1x1x1x1", "C0"), ("2x1x1x1", "C1"), ("2x2x1x1", "C2")):
            pts = sorted((int(r["lattice"].split("x")[0]), r["time_per_iter_us"]) for r in rows if r["grid"] == grid)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[n % 4], color=colour, marker="o",
                        label=f"{label}, {grid}")
    ax.axhline(60, color="grey", lw=0.8)
    ax.text(8, 63, "8^4 one-rank target 60 us", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([8, 16, 32], ["8^4", "16^4", "32^4"])
    ax.set_xlabel("global lattice")
    ax.set_ylabel("us per CG iteration (median)")
    device = json.load(open(argv[1].split("=", 1)[1])).get("device", "one GPU")
    ax.set_title(f"device-resident CG, single precision, {device} under MPS")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[0], dpi=110)
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
