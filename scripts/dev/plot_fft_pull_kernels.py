"""Dev aid: the FFT's schemes per case against the best baseline and the 1-rank cuFFT, from bench fft results: the
transposing put, the pull of one run (its own kernels) and the pull of an earlier run (LABEL=RESULTS.json pairs: the
first is "now", the others are drawn as earlier pulls, e.g. the callback's), one panel per rank count.

    python scripts/dev/plot_fft_pull_kernels.py OUT.png NOW=RESULTS.json[,RESULTS.json] [EARLIER=RESULTS.json ...]
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(paths: str) -> list[dict]:
    out = []
    for p in paths.split(","):
        out += [r for r in json.load(open(p))["rows"] if "time_ms" in r]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    runs = [(spec.split("=", 1)[0], rows(spec.split("=", 1)[1])) for spec in argv[1:]]
    now = runs[0][1]
    ranks = sorted({r["ranks"] for r in now if r["impl"] != "fftn-1rank"})
    fig, axes = plt.subplots(1, len(ranks), figsize=(7 * len(ranks), 4.8), dpi=120, squeeze=False)
    for ax, n in zip(axes[0], ranks, strict=True):
        cases = sorted({(r["case"], r["dtype"]) for r in now if r["ranks"] == n}, key=lambda c: (c[0], c[1][-2:]))

        def best(rs, case, impl_prefix, n=n):
            ts = [r["time_ms"] for r in rs if (r["case"], r["dtype"]) == case and r["impl"].startswith(impl_prefix)
                  and (r["ranks"] == n or impl_prefix == "fftn-1rank")]
            return min(ts) if ts else float("nan")

        series = [("transposing put", "transpose-put", now, "tab:blue"),
                  (f"pull ({runs[0][0]})", "pull", now, "tab:green")]
        series += [(f"pull ({label})", "pull", rs, "tab:olive") for label, rs in runs[1:]]
        series += [("best baseline", "baseline", now, "tab:gray"), ("1-rank cuFFT", "fftn-1rank", now, "black")]
        width = 0.8 / len(series)
        for i, (label, prefix, rs, color) in enumerate(series):
            ys = [best(rs, c, prefix) for c in cases]
            ax.bar([k + i * width for k in range(len(cases))], ys, width, label=label, color=color)
        for k, c in enumerate(cases):  # the target: 25 % less than the best baseline
            target = 0.75 * best(now, c, "baseline")
            ax.plot([k - width / 2, k + (len(series) - 0.5) * width], [target, target], "r--",
                    label="target (0.75 x best baseline)" if k == 0 else None)
        ax.set_xticks([k + (len(series) - 1) * width / 2 for k in range(len(cases))])
        ax.set_xticklabels([f"{c}\n{d}" for c, d in cases])
        ax.set_ylabel("forward FFT, ms (median, slowest rank)")
        ax.set_title(f"{n} ranks on one GPU")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[0])
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
