"""Dev aid: bench fft's results as time / the 1-rank cuFFT ceiling, circuslink's transposing put against the best
baseline of each case, for several runs side by side (e.g. MPS's cap against SMs of their own a rank).

    python scripts/dev/plot_fft_partition.py OUT.png LABEL=RESULTS.json[,MORE.json] ...
"""

from __future__ import annotations

import json
import sys


def rows(paths: list[str]) -> dict:
    """{(case, dtype, ranks): {"ours": ms, "baseline": ms, "ceiling": ms}} from bench fft JSON files."""
    out: dict = {}
    for path in paths:
        d = json.load(open(path))
        ceiling = {(r["case"], r["dtype"]): r["time_ms"] for r in d["rows"] if r["impl"] == "fftn-1rank"}
        for r in d["rows"]:
            key = (r["case"], r["dtype"], r["ranks"])
            if not r.get("time_ms") or (r["case"], r["dtype"]) not in ceiling:
                continue
            cell = out.setdefault(key, {"ceiling": ceiling[(r["case"], r["dtype"])]})
            if r["impl"] == "transpose-put":
                cell["ours"] = r["time_ms"]
            elif r["impl"].startswith("baseline"):
                cell["baseline"] = min(cell.get("baseline", float("inf")), r["time_ms"])
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(a.split("=", 1)[0], rows(a.split("=", 1)[1].split(","))) for a in argv[2:]]
    keys = sorted({k for _, r in runs for k in r if "ours" in r[k]},
                  key=lambda k: (k[2], "^3" in k[0], int(k[0].split("^")[0]), k[1]))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(keys)), 4.5))
    width = 0.8 / (2 * len(runs))
    for i, (label, r) in enumerate(runs):
        for j, what in enumerate(("ours", "baseline")):
            xs, ys = [], []
            for x, k in enumerate(keys):
                if k in r and what in r[k]:
                    xs.append(x + (2 * i + j - len(runs) + 0.5) * width)
                    ys.append(r[k][what] / r[k]["ceiling"])
            ax.bar(xs, ys, width, label=f"{label}: {'transposing put' if what == 'ours' else 'best baseline'}",
                   alpha=1.0 if what == "ours" else 0.45, color=f"C{i}")
    ax.margins(y=0.25)  # room for the legend
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.5, color="r", lw=0.8, ls="--", label="target at 16384^2 and 1024^3 (1.5 x)")
    ax.set_xticks(range(len(keys)), [f"{c}\n{d.replace('complex', 'c')}\n{n} ranks" for c, d, n in keys], fontsize=7)
    ax.set_ylabel("time / one rank's cuFFT of the whole array")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
