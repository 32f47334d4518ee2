"""Dev aid: fft_line_pull_probe.py's logs as bars, one group a case (a rank's pulled stage of a 4-way split): the
pull's own kernel, the four-step, cuFFT's load callback, cuFFT without a pull, the own kernel on rows in memory, and
a copy, in GB/s (one read and one write of the stage).

    python scripts/dev/plot_fft_probe.py OUT.png PROBE.log [PROBE.log ...]
"""
from __future__ import annotations

import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = ["own", "four-step", "callback", "cufft", "rows", "copy"]
_ROW = re.compile(r"^(\S+)\s+best [\d.]+ median ([\d.]+) ms\s+(\d+) GB/s", re.M)


def main(out: str, *logs: str) -> None:
    cases = []
    for path in logs:
        text = open(path).read()
        title = text.splitlines()[0].split(":")[0]
        cases.append((title, {m.group(1): int(m.group(3)) for m in _ROW.finditer(text)}))
    fig, ax = plt.subplots(figsize=(2.2 * len(cases) + 2, 4))
    width = 0.8 / len(KINDS)
    for k, kind in enumerate(KINDS):
        xs = [i + (k - len(KINDS) / 2 + 0.5) * width for i, (_, got) in enumerate(cases) if kind in got]
        ys = [got[kind] for _, got in cases if kind in got]
        ax.bar(xs, ys, width, label=kind)
    ax.set_xticks(range(len(cases)), [title for title, _ in cases], fontsize=8)
    ax.set_ylabel("GB/s (median; one read, one write)")
    ax.set_title("the pull's transform of one rank's stage, by kernel", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:])
