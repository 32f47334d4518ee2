"""Draws the seventh session's figure from its results files (benchmarks/results/*-2026-11-28*): the channel's
few-packet path against the sixth session's pingpong and NVSHMEM, what one grid barrier costs before and after,
and the persistent stencil at 64x64 a rank before and after, with NVSHMEM's and the 6 x floor target.

    python scripts/dev/plot_few_packets.py [--out benchmarks/results/few-packets-...png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RES = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
TAG = "nvidia-h200-x1-mps-2026-11-28"


def load(name: str) -> dict:
    return json.loads((RES / f"{name}-{TAG}.json").read_text())


def series(rows: list[dict], impl: str, key: str = "one_way_us") -> tuple[list, list]:
    pts = sorted((r["bytes"], r[key]) for r in rows if r["impl"] == impl and key in r)
    return [p[0] for p in pts], [p[1] for p in pts]


def nvshmem_best(rows: list[dict], sizes: list[int]) -> tuple[list, list]:
    out = []
    for b in sizes:
        t = [r["one_way_us"] for r in rows if r["impl"].startswith("nvshmem") and r["bytes"] == b]
        if t:
            out.append((b, min(t)))
    return [p[0] for p in out], [p[1] for p in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(RES / f"few-packets-{TAG}.png"))
    a = ap.parse_args()
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))

    after, before = load("pingpong-few-packets"), load("pingpong")
    sizes = sorted({r["bytes"] for r in after["rows"]})
    x, y = series(after["rows"], "circuslink-warp")
    ax[0].plot(x, y, "o-", label="channel, one warp a side (this session)")
    x, y = series(after["rows"], "circuslink")
    ax[0].plot(x, y, "s-", label="channel, best form (this session)")
    bx, by = series(before["rows"], "circuslink-warp")
    keep = [(b, t) for b, t in zip(bx, by, strict=True) if b <= max(sizes)]
    ax[0].plot([k[0] for k in keep], [k[1] for k in keep], "x--", color="grey",
               label="channel, one warp (sixth session)")
    x, y = nvshmem_best(after["rows"], sizes)
    ax[0].plot(x, y, "^-", color="tab:red", label="NVSHMEM put-signal, best form (same run)")
    floor = after["floor"]["summary"]["lat_relaxed_us"]
    ax[0].axhline(floor, color="k", lw=0.8, ls=":", label=f"store+poll floor {floor:.3f} us")
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("message bytes")
    ax[0].set_ylabel("one-way us (median)")
    ax[0].set_title("pingpong, 2 ranks under MPS, 8 B - 2 KiB")
    ax[0].legend(fontsize=7)

    for name, style, label in (("grid-barrier-ab-before", "x--", "grid_sync, counter + generation (before)"),
                               ("grid-barrier-ab-after", "o-", "grid_sync, one word, top bit flips (after)")):
        rows = [r for r in load(name)["rows"] if r["form"] == "lib"]
        ax[1].plot([r["blocks"] for r in rows], [r["us_per_barrier"] for r in rows], style, label=label)
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("blocks of 256 threads")
    ax[1].set_ylabel("us a barrier (median of 10 x 2000)")
    ax[1].set_title("one grid barrier, one process")
    ax[1].legend(fontsize=7)

    def per_rank(doc: dict, impl: str) -> tuple[list, list]:
        pts = sorted((r["nranks"], r["time_per_iter_us"]) for r in doc["rows"]
                     if r["impl"] == impl and r["local"] == "64x64")
        return [p[0] for p in pts], [p[1] for p in pts]

    old, new = load("stencil-64-a-rank-before"), load("stencil-per-rank-after")
    for doc, impl, style, label in ((old, "channel-persistent", "x--", "channels, before (same run as its NVSHMEM)"),
                                    (old, "nvshmem-persistent", "^--", "NVSHMEM, before's kernel structure"),
                                    (new, "channel-persistent", "o-", "channels, after"),
                                    (new, "nvshmem-persistent", "^-", "NVSHMEM, after (same grid and structure)")):
        x, y = per_rank(doc, impl)
        ax[2].plot(x, y, style, label=label)
    f = new["floor"]["summary"]["lat_relaxed_us"] if "summary" in new["floor"] else None
    if f:
        ax[2].axhline(6 * f, color="k", lw=0.8, ls=":", label=f"target 6 x floor = {6 * f:.2f} us")
    ax[2].set_xlabel("ranks (64x64 cells each, float64)")
    ax[2].set_ylabel("us an iteration (median)")
    ax[2].set_title("persistent stencil, one GPU under MPS")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
