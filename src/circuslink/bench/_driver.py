"""The one benchmark driver: sizes, common options, one results format, tables and plots.

Every ``circuslink bench X`` module builds on this file, so all benchmarks read the same
options, write the same JSON (BENCHMARKS.md, "Results format") and draw the same plots::

    from circuslink.bench import _driver as drv

    def add_arguments(parser):
        drv.add_common_arguments(parser, default_sizes="8:256M")

    def run(args):
        world = circuslink.init(args.backend)
        results = drv.Results("pingpong", world)       # not collective: safe on rank 0 only
        results.floor = probe.measure(world, quick=args.quick)
        for nbytes in drv.parse_sizes(args.sizes):
            drv.progress(f"pingpong {drv.format_bytes(nbytes)}")
            results.add(impl="channel", bytes=nbytes, latency_us=..., throughput_GBps=...)
        if world.rank == 0:
            drv.print_table(results.rows, ["impl", "bytes", "latency_us"], "pingpong")
            results.write_json(args.json)

Nothing here is collective: every function may be called on one rank only.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._argtypes import non_negative_int as non_negative_int
from .._argtypes import positive_int
from ..errors import BackendError, ConfigError
from ..results import Results, device_label, git_commit, progress, today  # noqa: F401  (the one results format)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)
_MAX_SIZES = 4096  # a range longer than this is a typo, not a benchmark
_RESULT_KEYS = ("benchmark", "device", "commit", "date", "backend", "nranks", "floor", "meta", "rows")


# -- sizes --------------------------------------------------------------------------------------
def _parse_one(token: str, whole: str) -> int:
    m = _SIZE_RE.match(token)
    if not m:
        raise ConfigError(
            f"--sizes {whole!r}: bad size {token.strip()!r} (expected a number with an optional "
            "K/M/G suffix, e.g. 8, 64K, 4MiB)"
        )
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value <= 0:
        raise ConfigError(f"--sizes {whole!r}: size {token.strip()!r} must be positive")
    return value


def parse_sizes(text: str | Sequence[int]) -> list[int]:
    """Message sizes in bytes from ``"8,64,1K,4MiB"`` or ``"8:256M"`` (powers of two, inclusive).

    Suffixes K, M, G are binary (KiB, MiB, GiB); ``B``/``iB`` may follow. Tokens may mix
    lists and ranges (``"8:64,1M"``). The order is kept and duplicates are dropped. A
    list of ints is checked and returned as it is, so ``parse_sizes(args.sizes)`` works
    whether the caller already parsed it or not. Errors name the bad token.
    """
    if not isinstance(text, str):
        sizes = list(text)
        for s in sizes:
            if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
                raise ConfigError(f"sizes: {s!r} is not a positive number of bytes")
        return list(dict.fromkeys(sizes))
    if not text.strip():
        raise ConfigError("--sizes is empty: give e.g. 8,64,1K or 8:256M")
    out: list[int] = []
    for token in text.split(","):
        if not token.strip():
            raise ConfigError(f"--sizes {text!r}: empty entry between commas")
        if ":" in token:
            parts = token.split(":")
            if len(parts) != 2:
                raise ConfigError(
                    f"--sizes {text!r}: bad range {token.strip()!r} (expected LOW:HIGH, e.g. 8:256M)"
                )
            low, high = _parse_one(parts[0], text), _parse_one(parts[1], text)
            if low > high:
                raise ConfigError(
                    f"--sizes {text!r}: range {token.strip()!r} goes down ({low} > {high} bytes)"
                )
            if high.bit_length() - low.bit_length() > _MAX_SIZES:
                raise ConfigError(f"--sizes {text!r}: range {token.strip()!r} is too long")
            size = low
            while size <= high:
                out.append(size)
                size *= 2
        else:
            out.append(_parse_one(token, text))
    return list(dict.fromkeys(out))


def format_bytes(nbytes: float) -> str:
    """``8 B``, ``64 KiB``, ``256 MiB``, ``1.5 GiB``: sizes as people read them."""
    n = float(nbytes)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(n)} B"


# -- options ------------------------------------------------------------------------------------
def add_common_arguments(
    parser: argparse.ArgumentParser,
    default_sizes: str,
    default_nranks: int = 2,
    *,
    default_iters: int = 100,
    default_warmup: int = 10,
    trace: bool = False,
) -> None:
    """The options every benchmark shares (``args.sizes`` stays a string: call :func:`parse_sizes`)."""
    parse_sizes(default_sizes)  # a bad default is the benchmark author's bug: fail at once
    parser.add_argument("--sizes", default=default_sizes,
                        help="message sizes: a list (8,64,1K,4MiB) or powers of two LOW:HIGH "
                        f"(default {default_sizes})")
    parser.add_argument("--iters", type=positive_int, default=default_iters,
                        help=f"timed iterations per size (default {default_iters})")
    parser.add_argument("--warmup", type=non_negative_int, default=default_warmup,
                        help=f"untimed iterations before timing (default {default_warmup})")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="results file (default ./<benchmark>-<device>-<date>.json in the current directory)")
    parser.add_argument("--plot", metavar="FILE", default=None, help="write the plot(s) as PNG to FILE")
    if trace:  # only benchmarks that record device events offer it: a flag that writes nothing misleads
        parser.add_argument("--trace", metavar="FILE", default=None,
                            help="write a Chrome/Perfetto trace to FILE (and the waveform beside it)")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                        help="back-end (default: cuda when a GPU is present, else cpu)")
    parser.add_argument("-n", "--nranks", type=positive_int, default=default_nranks,
                        help=f"ranks to start when not already inside a job (default {default_nranks})")
    parser.add_argument("--quick", action="store_true",
                        help="few sizes and iterations (for tests and smoke runs)")
    parser.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                        help="ranks that share a GPU run under CUDA MPS: auto (default: reuse or start one, else "
                             "warn), on (fail without it), off")
    parser.add_argument("--no-baselines", dest="no_baselines", action="store_true",
                        help="skip NCCL / NVSHMEM / MPI; measure only circuslink and the floor")
    # Remembered so sizes_and_counts() can tell a --sizes given by the user from the default.
    parser.set_defaults(_default_sizes=default_sizes)


def sizes_and_counts(
    args: argparse.Namespace, quick_sizes: str = "8,4K,64K", quick_iters: int = 5, quick_warmup: int = 1
) -> tuple[list[int], int, int]:
    """(sizes, iters, warmup) from the common options, with ``--quick`` applied.

    ``--quick`` replaces the default sizes by ``quick_sizes`` (sizes the user gave stay) and caps
    iterations and warm-up at ``quick_iters`` / ``quick_warmup``.
    """
    sizes = parse_sizes(args.sizes)
    iters, warmup = args.iters, args.warmup
    if getattr(args, "quick", False):
        if args.sizes == getattr(args, "_default_sizes", None):
            sizes = parse_sizes(quick_sizes)
        iters, warmup = min(iters, quick_iters), min(warmup, quick_warmup)
    return sizes, iters, warmup


# -- output -------------------------------------------------------------------------------------
def _format_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column == "bytes" and isinstance(value, int | float) and not isinstance(value, bool):
        return format_bytes(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str], title: str) -> str:
    """The text :func:`print_table` prints."""
    header = list(columns)
    shown = [row for row in rows if "skipped" not in row]
    body = [[_format_cell(c, row.get(c)) for c in columns] for row in shown]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]
    # Numbers right-aligned, text left-aligned, as people scan them.
    numeric = [any(_is_number(row.get(c)) for row in shown) for c in columns]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i]) for i, cell in enumerate(cells)
        ).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    lines = [title, rule, line(header), rule]
    lines += [line(r) for r in body]
    lines.append(rule)
    skipped = {}
    for row in rows:
        if "skipped" in row:
            skipped.setdefault(str(row.get("impl", "?")), str(row["skipped"]))
    for impl, why in skipped.items():
        lines.append(f"skipped {impl}: {why}")
    return "\n".join(lines)


def print_table(rows: Sequence[dict], columns: list[str], title: str, file: Any = None) -> None:
    """Print ``rows`` as an aligned table (``-`` for a missing figure; skipped baselines listed below)."""
    print(format_table(rows, columns, title), file=file or sys.stdout, flush=True)


def plot(
    rows: Sequence[dict],
    x: str,
    y: str,
    group: str,
    path: str | os.PathLike,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
    extra: dict[str, Sequence[tuple[float, float]]] | None = None,
) -> str:
    """Draw ``y`` against ``x``, one line per value of ``group``, into the PNG ``path``; return the path.

    ``extra`` adds reference lines (name -> points), drawn dashed: a floor envelope, a target."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendError("plotting needs matplotlib: pip install matplotlib") from None
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if "skipped" in row:
            continue
        xv, yv = row.get(x), row.get(y)
        if not _is_number(xv) or not _is_number(yv):
            continue
        if (logx and xv <= 0) or (logy and yv <= 0):
            continue  # a log axis cannot show it
        series.setdefault(str(row.get(group, "?")), []).append((float(xv), float(yv)))
    if not series:
        raise ConfigError(f"plot {title!r}: no row has numeric {x!r} and {y!r} fields")
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        for name, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=name)
        for name, points in (extra or {}).items():
            pts = sorted((float(a), float(b)) for a, b in points if (not logx or a > 0) and (not logy or b > 0))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="--", color="black", linewidth=1, label=name)
        if logx:
            ax.set_xscale("log", base=2 if x == "bytes" else 10)
        if logy:
            ax.set_yscale("log")
        if x == "bytes":
            ticks = sorted({p[0] for pts in series.values() for p in pts})
            step = max(1, len(ticks) // 10)
            ax.set_xticks(ticks[::step])
            ax.set_xticklabels([format_bytes(t) for t in ticks[::step]], rotation=45, ha="right")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(title=group)
        fig.tight_layout()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(target, format="png")
    except OSError as exc:
        raise ConfigError(f"cannot write plot to {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return str(path)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


