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
        if world.rank == 0:    # the report, then exactly the files asked for
            drv.finish(results, args, report=lambda: drv.print_table(results.rows, ["impl", "bytes", "latency_us"],
                                                                     "pingpong", args),
                       plot=lambda path: drv.plot(results.rows, "bytes", "latency_us", "impl", path, ...))

Outputs follow one rule: ``--json FILE`` and ``--plot FILE`` write exactly FILE (``--json -``, or
``--json`` alone: the results on standard output, the report on standard error), their folder is
checked when the command line is read and never created, and nothing is written unless asked for.
``--bytes`` prints byte counts as plain integers and ``--csv`` prints tables as CSV, for scripts
written against OSU's and nccl-tests' output.

Nothing here is collective: every function may be called on one rank only.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._argtypes import non_negative_int as non_negative_int
from .._argtypes import output_file, output_file_or_stdout, positive_int
from ..errors import BackendError, ConfigError
from ..results import Results, device_label, git_commit, progress, today  # noqa: F401  (the one results format)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)
_MAX_SIZES = 4096  # a range longer than this is a typo, not a benchmark
_RESULT_KEYS = ("benchmark", "device", "commit", "date", "backend", "nranks", "floor", "meta", "rows")


# -- sizes --------------------------------------------------------------------------------------
def _parse_one(token: str, whole: str, option: str) -> int:
    m = _SIZE_RE.match(token)
    if not m:
        raise ConfigError(
            f"{option} {whole!r}: bad size {token.strip()!r} (expected a number with an optional "
            "K/M/G suffix, e.g. 8, 64K, 4MiB)"
        )
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value <= 0:
        raise ConfigError(f"{option} {whole!r}: size {token.strip()!r} must be positive")
    return value


def parse_sizes(text: str | Sequence[int], option: str = "--sizes") -> list[int]:
    """Message sizes in bytes from ``"8,64,1K,4MiB"`` or ``"8:256M"`` (powers of two, inclusive).

    Suffixes K, M, G are binary (KiB, MiB, GiB); ``B``/``iB`` may follow. Tokens may mix
    lists and ranges (``"8:64,1M"``). The order is kept and duplicates are dropped. A
    list of ints is checked and returned as it is, so ``parse_sizes(args.sizes)`` works
    whether the caller already parsed it or not. Errors name the bad token and ``option``, the option read.
    """
    if not isinstance(text, str):
        sizes = list(text)
        for s in sizes:
            if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
                raise ConfigError(f"{option}: {s!r} is not a positive number of bytes")
        return list(dict.fromkeys(sizes))
    if not text.strip():
        raise ConfigError(f"{option} is empty: give e.g. 8,64,1K or 8:256M")
    out: list[int] = []
    for token in text.split(","):
        if not token.strip():
            raise ConfigError(f"{option} {text!r}: empty entry between commas")
        if ":" in token:
            parts = token.split(":")
            if len(parts) != 2:
                raise ConfigError(
                    f"{option} {text!r}: bad range {token.strip()!r} (expected LOW:HIGH, e.g. 8:256M)"
                )
            low, high = _parse_one(parts[0], text, option), _parse_one(parts[1], text, option)
            if low > high:
                raise ConfigError(
                    f"{option} {text!r}: range {token.strip()!r} goes down ({low} > {high} bytes)"
                )
            if high.bit_length() - low.bit_length() > _MAX_SIZES:
                raise ConfigError(f"{option} {text!r}: range {token.strip()!r} is too long")
            size = low
            while size <= high:
                out.append(size)
                size *= 2
        else:
            out.append(_parse_one(token, text, option))
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
    add_output_arguments(parser, plot=True, trace=trace)
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


def add_output_arguments(parser: argparse.ArgumentParser, plot: bool = True, trace: bool = False,
                         table: bool = True) -> None:
    """``--json [FILE]``, ``--plot FILE``, ``--trace FILE``, ``--bytes`` and ``--csv``: the output options every
    benchmark (and ``probe``) reads the same way. Files are checked when the command line is read."""
    parser.add_argument("--json", metavar="FILE", nargs="?", const="-", default=None, type=output_file_or_stdout,
                        help="write the results (JSON, the one results format) to FILE; '-' or no FILE: to standard "
                             "output, the report going to standard error (default: no file)")
    if plot:
        parser.add_argument("--plot", metavar="FILE", default=None, type=output_file,
                            help="draw the plot into FILE (PNG, one figure, its panels side by side)")
    if trace:  # only benchmarks that record device events offer it: a flag that writes nothing misleads
        parser.add_argument("--trace", metavar="FILE", default=None, type=output_file,
                            help="write a Chrome/Perfetto trace to FILE, and its waveform beside it (FILE's name "
                                 "with .png)")
    if table:
        parser.add_argument("--bytes", dest="plain_bytes", action="store_true",
                            help="print byte counts as plain integers (8, 65536), not 8 B, 64 KiB")
        parser.add_argument("--csv", action="store_true",
                            help="print tables as CSV: a '# title' line, a header line, one line a row (skipped "
                                 "baselines with a 'skipped' field), then an empty line")


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


def memory_per_rank(args: argparse.Namespace, buffers: float, cpu_max: int | None = None,
                    sizes: Sequence[int] | None = None) -> dict[str, int]:
    """What one rank of this benchmark needs, for the launcher's check before any rank starts
    (``relaunch_self(..., **memory_per_rank(args, 8))``): ``buffers`` times the largest message (``sizes``,
    default ``--sizes``), in GPU memory on a back-end that runs kernels, else in host memory (where the
    benchmark trims its sizes to ``cpu_max``, that many). A benchmark too large for the machine is refused in
    one line, with the need and what there is, instead of dying of the out-of-memory killer halfway. Sizes that
    are all beyond ``cpu_max`` on such a back-end are refused alike: the benchmark would have none left to run."""
    from ..backends import default_backend_name, runs_kernels

    sizes = parse_sizes(args.sizes) if sizes is None else sizes
    top = max(sizes)
    backend = getattr(args, "backend", None) or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
    if runs_kernels(backend):
        return {"rank_bytes": 0, "gpu_bytes": int(buffers * top)}
    if cpu_max is not None and min(sizes) > cpu_max:
        name = f"bench {args.benchmark} " if getattr(args, "benchmark", None) else ""
        raise ConfigError(f"{name}--sizes {args.sizes}: the {backend} back-end runs sizes up to "
                          f"{format_bytes(cpu_max)} here, and every size given is larger")
    return {"rank_bytes": int(buffers * min(top, cpu_max or top)), "gpu_bytes": 0}


# -- timing ------------------------------------------------------------------------------------
def handshake(world: Any) -> Any:
    """The device-side handshake a timed sample's clock starts after, as NVSHMEM's programs start theirs after
    ``nvshmemx_barrier_all_on_stream``: one cycle of the world's meeting queue (``rma.meet``: signals only,
    between every pair of ranks), enqueued on the caller's current stream without a host wait. A clock
    recorded on that stream after it (and work launched behind it) then starts once every rank's GPU is there,
    not when each rank's host left the host barrier. Collective (every rank measures the same cases in the same
    order). On the cpu, a host-driven cycle: the same meeting. Returns
    the queue (None on one rank): after the timed work, its ``check_device()`` raises what a device-side wait
    recorded, naming the rank that did not come. Where the ranks span nodes (no window maps every peer), or
    ``CIRCUSLINK_BENCH_HANDSHAKE=0`` asks for the old clock (A/B runs), None: the clock starts after the host
    barrier alone."""
    if world.size < 2 or not handshake_wanted():
        return None
    from .. import rma

    return rma.meet(world)


def handshake_wanted(env: dict[str, str] | None = None) -> bool:
    """``CIRCUSLINK_BENCH_HANDSHAKE``: 1 (default) starts timed samples after the device-side handshake, 0 after
    the host barrier alone; anything else is one line naming the variable."""
    raw = (os.environ if env is None else env).get("CIRCUSLINK_BENCH_HANDSHAKE", "1").strip() or "1"
    if raw not in ("0", "1"):
        raise ConfigError(f"CIRCUSLINK_BENCH_HANDSHAKE={raw!r}: 1 (a device-side handshake before each timed "
                          "sample) or 0 (the host barrier alone)")
    return raw == "1"


# -- output -------------------------------------------------------------------------------------
def slowest_rank(world: Any, samples: Sequence[float]) -> list[float]:
    """Collective: sample by sample, the slowest rank's value (every rank passes its own, as many as the others)."""
    return [max(col) for col in zip(*world.allgather_object(list(samples)), strict=True)]


def _format_cell(column: str, value: Any, plain_bytes: bool = False) -> str:
    if value is None:
        return "-"
    if column == "bytes" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(int(value)) if plain_bytes else format_bytes(value)
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


def fold_aliases(rows: Sequence[dict], columns: Sequence[str]) -> list[dict]:
    """``rows`` with every row that repeats another's measurement shown once: a headline row (``impl`` X, e.g. the
    faster form at a size) whose figures are those of a form row (``impl`` X-form at the same size) becomes one
    row ``X (X-form)``. Where only one form was measured (the cpu reference) the two are one measurement."""
    figures = [c for c in columns if c not in ("impl", "bytes")]

    def same(a: dict, b: dict) -> bool:
        return a.get("bytes") == b.get("bytes") and "skipped" not in a and "skipped" not in b \
            and any(a.get(c) is not None for c in figures) and all(a.get(c) == b.get(c) for c in figures)

    twin_of: dict[int, int] = {}  # headline row -> the form row it repeats
    for i, row in enumerate(rows):
        impl = str(row.get("impl"))
        twin = next((j for j, other in enumerate(rows) if j != i and j not in twin_of.values() and j not in twin_of
                     and str(other.get("impl")).startswith(impl + "-") and same(row, other)), None)
        if twin is not None and i not in twin_of.values():
            twin_of[i] = twin
    twins = set(twin_of.values())
    return [dict(row, impl=f"{row.get('impl')} ({rows[twin_of[i]]['impl']})") if i in twin_of else row
            for i, row in enumerate(rows) if i not in twins]


def format_table(rows: Sequence[dict], columns: Sequence[str], title: str, options: Any = None) -> str:
    """The text :func:`print_table` prints. ``options`` (the parsed command line): ``--bytes`` prints byte
    counts as plain integers, ``--csv`` prints CSV instead of an aligned table."""
    plain_bytes = bool(getattr(options, "plain_bytes", False))
    rows = fold_aliases(rows, columns)
    if getattr(options, "csv", False):  # "# title", the header line, a line a row, then an empty line
        buf = io.StringIO()
        buf.write(f"# {title}\n")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(list(columns) + (["skipped"] if any("skipped" in r for r in rows) else []))
        for row in rows:
            cells = ["" if row.get(c) is None else (int(row[c]) if c == "bytes" and _is_number(row[c]) else row[c])
                     for c in columns]
            if "skipped" in row:
                cells.append(row["skipped"])
            writer.writerow(cells)
        return buf.getvalue()
    header = list(columns)
    shown = [row for row in rows if "skipped" not in row]
    body = [[_format_cell(c, row.get(c), plain_bytes) for c in columns] for row in shown]
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


def print_table(rows: Sequence[dict], columns: list[str], title: str, options: Any = None, file: Any = None) -> None:
    """Print ``rows`` as an aligned table (``-`` for a missing figure; skipped baselines listed below), or as CSV;
    ``options``: the parsed command line (``--bytes``, ``--csv``)."""
    print(format_table(rows, columns, title, options), file=file or sys.stdout, flush=True)


def text_to_stderr(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """Within it, what the command prints goes to standard error when ``--json -`` gives standard output to the
    results (a command whose work runs in this process: its jobs' output, the report); otherwise nothing changes."""
    if getattr(args, "json", None) == "-":
        return contextlib.redirect_stdout(sys.stderr)
    return contextlib.nullcontext()


def finish(results: Results, args: argparse.Namespace, report: Callable[[], None] | None = None,
           plot: Callable[[str], Any] | None = None) -> None:
    """Rank 0's end of a benchmark: ``report()`` prints the tables and verdicts, ``plot(path)`` draws the figure
    into ``--plot FILE``, and the results go to ``--json FILE``; nothing is written that was not asked for.
    With ``--json -`` the results are the only thing on standard output (the report goes to standard error)."""
    to_stdout = getattr(args, "json", None) == "-"
    with text_to_stderr(args):
        if report is not None:
            report()
        target = getattr(args, "plot", None)
        if target and plot is not None:
            plot(target)
            print(f"wrote {target}")
        if getattr(args, "json", None) and not to_stdout:
            print(f"wrote {results.write_json(args.json)}")
    if to_stdout:
        results.write_json("-")


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
    return figure(path, [panel(rows, x, y, group, title, xlabel, ylabel, logx, logy, extra)])


def panel(rows: Sequence[dict], x: str, y: str, group: str, title: str, xlabel: str, ylabel: str, logx: bool = True,
          logy: bool = True, extra: dict[str, Sequence[tuple[float, float]]] | None = None) -> dict:
    """One panel of a :func:`figure` (the arguments of :func:`plot` but the path)."""
    return dict(rows=rows, x=x, y=y, group=group, title=title, xlabel=xlabel, ylabel=ylabel, logx=logx, logy=logy,
                extra=extra)


def figure(path: str | os.PathLike, panels: Sequence[dict]) -> str:
    """Draw ``panels`` (:func:`panel`, or ``{"title": ..., "draw": fn(ax)}`` for a panel that draws itself) side
    by side into one PNG, exactly ``path``; return the path. The folder must exist (it is never created)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendError("plotting needs matplotlib: pip install matplotlib") from None
    if not panels:
        raise ConfigError(f"plot {str(path)!r}: nothing to draw")
    drawn = [(p, None if "draw" in p else _series(p)) for p in panels]
    for p, series in drawn:
        if series is not None and not series:
            raise ConfigError(f"plot {p['title']!r}: no row has numeric {p['x']!r} and {p['y']!r} fields")
    fig, axes = plt.subplots(1, len(drawn), figsize=(7 * len(drawn), 4.5), dpi=120, squeeze=False)
    try:
        for ax, (p, series) in zip(axes[0], drawn, strict=True):
            if series is None:
                p["draw"](ax)  # a panel of its own kind (bars): it draws itself
            else:
                _draw(ax, p, series)
        fig.tight_layout()
        fig.savefig(Path(path), format="png")
    except OSError as exc:
        raise ConfigError(f"cannot write plot to {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return str(path)


def _series(p: dict) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    x, y, logx, logy = p["x"], p["y"], p["logx"], p["logy"]
    for row in p["rows"]:
        if "skipped" in row:
            continue
        xv, yv = row.get(x), row.get(y)
        if not _is_number(xv) or not _is_number(yv):
            continue
        if (logx and xv <= 0) or (logy and yv <= 0):
            continue  # a log axis cannot show it
        series.setdefault(str(row.get(p["group"], "?")), []).append((float(xv), float(yv)))
    return series


def _draw(ax: Any, p: dict, series: dict[str, list[tuple[float, float]]]) -> None:
    x, logx, logy = p["x"], p["logx"], p["logy"]
    for name, points in series.items():
        points.sort()
        ax.plot([q[0] for q in points], [q[1] for q in points], marker="o", markersize=3, label=name)
    for name, points in (p["extra"] or {}).items():
        pts = sorted((float(a), float(b)) for a, b in points if (not logx or a > 0) and (not logy or b > 0))
        ax.plot([q[0] for q in pts], [q[1] for q in pts], linestyle="--", color="black", linewidth=1, label=name)
    if logx:
        ax.set_xscale("log", base=2 if x == "bytes" else 10)
    if logy:
        ax.set_yscale("log")
    if x == "bytes":
        ticks = sorted({q[0] for pts in series.values() for q in pts})
        step = max(1, len(ticks) // 10)
        ax.set_xticks(ticks[::step])
        ax.set_xticklabels([format_bytes(t) for t in ticks[::step]], rotation=45, ha="right")
    ax.set_title(p["title"])
    ax.set_xlabel(p["xlabel"])
    ax.set_ylabel(p["ylabel"])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title=p["group"])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


