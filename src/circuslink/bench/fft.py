"""The distributed 2-D FFT against its baselines: ``circuslink bench fft``.

For each size N (an N x N complex array on R ranks) and element type, in one run:

* ``transpose-put``: circuslink's FFT, the global transposes done by transposing puts;
* ``local-transpose``: the scheme of FFTW-MPI and heFFTe on the same ranks: transpose locally
  into a send buffer (the same tile kernel), then contiguous block puts;
* ``fft2-1rank``: cuFFT's fft2 (cupy.fft) on rank 0 alone (numpy's fft2 on the cpu); under MPS
  that rank runs on its share of the SMs only (``meta.sm_budget``).

Each row has the median (and minimum) over --iters executions of the whole transform (the
slowest rank of each iteration), the medians of a profiled run broken into FFT, transpose and
communication (for transposing puts the transpose *is* the communication: ``comm_ms`` holds both,
``transpose_ms`` is empty), GFLOP/s counted as 5 N log2 N for N points, and ``less_time_pct``, the
time saved against the local-transpose scheme. Before timing, each scheme's output is checked on
two rows per rank against an independent reference (a direct DFT over the input's rows, in float64).
The probe's floor of the same run is in ``floor``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError

_DTYPES = ("complex64", "complex128")
_TOLERANCE = {"complex64": 1e-4, "complex128": 1e-10}


@dataclass
class Config:
    """What one benchmark run measures (``bench fft``)."""

    sizes: list[int]
    dtypes: list[str]
    iters: int = 20
    warmup: int = 3
    layout: str = "natural"
    inverse: bool = False
    json: str | None = None
    plot: str | None = None
    baselines: bool = True
    meta: dict = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _driver as drv

    drv.add_common_arguments(parser, default_sizes="8K,16K", default_iters=20, default_warmup=3)
    add_fft_arguments(parser)


def add_fft_arguments(parser: argparse.ArgumentParser, with_size: bool = True) -> None:
    """The options of ``bench fft`` beyond the driver's."""
    if with_size:
        parser.add_argument("--size", default=None,
                            help="points per side N (an N x N problem), or a list 8192,16384; overrides --sizes, "
                                 "which is read the same way here (8K = 8192)")
    parser.add_argument("--dtype", default="complex64", choices=(*_DTYPES, "both"),
                        help="element type (default complex64; both: complex64 then complex128)")
    parser.add_argument("--layout", default="natural", choices=("natural", "transposed"),
                        help="output in natural order (default) or left transposed (one global transpose less)")
    parser.add_argument("--inverse", action="store_true", help="time the inverse transform (ifft2)")


def parse_points(text: str) -> list[int]:
    """Sizes N from ``8192,16384`` or ``8K,16K`` (K = 1024), each one point per side."""
    from . import _driver as drv

    return drv.parse_sizes(text)


def config_from_args(args: argparse.Namespace) -> Config:
    from ..backends import uses_gpus

    text = args.size if getattr(args, "size", None) else args.sizes
    sizes = parse_points(text)
    default_sizes = not getattr(args, "size", None) and args.sizes == getattr(args, "_default_sizes", None)
    if not uses_gpus(args.backend or os.environ.get("CIRCUSLINK_BACKEND")) and default_sizes:
        sizes = [512, 1024]  # the GPU sizes would take minutes in numpy
    iters, warmup = args.iters, args.warmup
    if getattr(args, "quick", False):
        if not getattr(args, "size", None) and args.sizes == getattr(args, "_default_sizes", None):
            sizes = [256]
        iters, warmup = min(iters, 3), min(warmup, 1)
    dtypes = list(_DTYPES) if args.dtype == "both" else [args.dtype]
    return Config(sizes=sizes, dtypes=dtypes, iters=iters, warmup=warmup, layout=args.layout, inverse=args.inverse,
                  json=args.json, plot=args.plot, baselines=not getattr(args, "no_baselines", False))


def check_sizes(sizes: list[int], nranks: int, backend: str | None = None, dtypes: list[str] | None = None) -> None:
    """Refuse, before starting ranks, a size the ranks do not divide, or (cpu) one the host cannot hold."""
    from ..apps.fft import _cpu, bytes_per_rank, check_shape

    for n in sizes:
        check_shape((n, n), nranks, f"bench fft: --size {n}")
    from ..backends import uses_gpus

    if backend is not None and not uses_gpus(backend):
        dtype = "complex128" if "complex128" in (dtypes or []) else "complex64"
        n = max(sizes)
        need = nranks * bytes_per_rank(n, n, dtype, nranks, "local-transpose", _cpu.EXTRA_SLABS + 1, False)
        free, what = _cpu.free_bytes(None)
        if need > free:
            raise ConfigError(f"bench fft: a {n} x {n} {dtype} problem over {nranks} ranks needs about "
                              f"{need / (1 << 30):.1f} GiB of {what} (both schemes and the input kept for "
                              f"checking), but only {free / (1 << 30):.1f} GiB is free: use a smaller --size")


def run(args: argparse.Namespace) -> int:
    from .. import launcher

    cfg = config_from_args(args)
    if not launcher.inside_job():
        from ..backends import default_backend_name

        backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
        check_sizes(cfg.sizes, args.nranks, backend, cfg.dtypes)
        argv = ["bench", "fft", *sys.argv[sys.argv.index("fft") + 1:]] if "fft" in sys.argv else ["bench", "fft"]
        return launcher.relaunch_self(args.nranks, argv=argv, backend=args.backend)
    import circuslink

    world = circuslink.init(args.backend)
    try:
        return run_rank(world, cfg)
    finally:
        world.close()


# -- the run on every rank ----------------------------------------------------------------------
def run_rank(world: Any, cfg: Config) -> int:
    from .. import probe
    from ..apps import fft
    from . import _driver as drv

    check_sizes(cfg.sizes, world.size)
    module = world.backend_module("circuslink.apps.fft")
    results = drv.Results("fft", world)
    drv.progress("fft: measuring the floor (probe)")
    pairs = [(0, 1), (1, 0)] if world.size > 1 else []
    results.floor = probe.measure(world, quick=True, pairs=pairs)
    results.meta.update(iters=cfg.iters, warmup=cfg.warmup, layout=cfg.layout, inverse=cfg.inverse,
                        sm_budget=world.sm_budget, launched_by=world.launched_by, flops="5 N log2 N, N = n*n points",
                        **cfg.meta)
    seed = int(world.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 31))))
    for n in cfg.sizes:
        for dtype in cfg.dtypes:
            times = {}
            for scheme in fft.SCHEMES:
                drv.progress(f"fft: {scheme} {n} x {n} {dtype} on {world.size} ranks")
                row = _measure_scheme(world, module, fft, n, dtype, scheme, cfg, seed)
                if world.xp is not np:  # hand the next case (and the one-rank baseline) the memory back
                    world.xp.get_default_memory_pool().free_all_blocks()
                times[scheme] = row["time_ms"]
                results.add(**row)
            if times.get("local-transpose"):
                for r in results.rows:
                    if r.get("n") == n and r.get("dtype") == dtype and r["impl"] == "transpose-put":
                        r["less_time_pct"] = 100.0 * (1.0 - times["transpose-put"] / times["local-transpose"])
            if cfg.baselines:
                drv.progress(f"fft: fft2 on one rank, {n} x {n} {dtype}")
                results.add(**_one_rank(world, module, n, dtype, cfg, seed))
    if world.rank == 0:
        drv.print_table(results.rows, ["impl", "n", "dtype", "time_ms", "time_min_ms", "fft_ms", "transpose_ms",
                                       "comm_ms", "gflops", "less_time_pct", "max_rel_err"],
                        f"fft2 {'inverse' if cfg.inverse else 'forward'}, {cfg.layout} layout, {world.size} ranks "
                        f"({world.backend.name}): median of {cfg.iters}; comm_ms of transpose-put includes its "
                        "transpose (fused)")
        path = results.write_json(cfg.json)
        print(f"results: {path}")
        if cfg.plot:
            root, ext = os.path.splitext(cfg.plot)
            ext = ext or ".png"
            drv.plot([r for r in results.rows if r.get("gflops")], x="bytes", y="gflops", group="impl",
                     path=f"{root}{ext}", title=f"2-D FFT on {world.size} ranks", xlabel="array bytes",
                     ylabel="GFLOP/s (5 N log2 N)", logy=False)
            plot_breakdown(results.rows, f"{root}-breakdown{ext}", f"2-D FFT time on {world.size} ranks")
            print(f"plots: {root}{ext}, {root}-breakdown{ext}")
    world.barrier()
    return 0


def _measure_scheme(world: Any, module: Any, fft: Any, n: int, dtype: str, scheme: str, cfg: Config,
                    seed: int) -> dict:
    xp = world.xp
    with fft.Plan(world, (n, n), dtype, cfg.inverse, cfg.layout, scheme) as plan:
        x0 = module.random_slab(world, plan.input.shape, dtype, [seed, n, world.rank])
        plan.input[...] = x0
        out = plan.execute()
        err = _check(world, module, plan, x0, out)
        tolerance = _TOLERANCE[dtype]
        if not err <= tolerance:  # also catches NaN
            raise ConfigError(f"bench fft: {scheme} {n} x {n} {dtype} on rank {world.rank}: max relative error "
                              f"{err:.3g} above {tolerance:g} against the direct DFT")

        def restore() -> None:  # FFT after FFT would overflow: every iteration transforms the same input
            plan.input[...] = x0
            module.synchronize(world)
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()

        profile = {"fft": [], "transpose": [], "comm": []}
        for i in range(cfg.warmup + cfg.iters):
            restore()
            world.barrier()
            plan.execute(profile=True)
            if i >= cfg.warmup:
                for k in profile:
                    profile[k].append(plan.timings[k])
        seconds = []
        for i in range(cfg.warmup + cfg.iters):
            restore()
            world.barrier()
            t0 = time.perf_counter()
            plan.execute()
            if i >= cfg.warmup:
                seconds.append(time.perf_counter() - t0)
        every = world.allgather_object(seconds)
        slowest = [max(col) for col in zip(*every, strict=True)]
        phases = world.allgather_object({k: statistics.median(v) for k, v in profile.items()})
        phase = {k: max(p[k] for p in phases) for k in profile}
        median = statistics.median(slowest)
        flops = plan.flops
        fused = scheme == "transpose-put"
        return dict(impl=scheme, bytes=n * n * fft.DTYPES[dtype], n=n, dtype=dtype, ranks=world.size,
                    layout=cfg.layout, inverse=cfg.inverse, time_ms=median * 1e3, time_min_ms=min(slowest) * 1e3,
                    fft_ms=phase["fft"] * 1e3, transpose_ms=None if fused else phase["transpose"] * 1e3,
                    comm_ms=phase["comm"] * 1e3, gflops=flops / median / 1e9, max_rel_err=err,
                    samples=len(slowest))


def _check(world: Any, module: Any, plan: Any, x0: Any, out: Any) -> float:
    """Max relative error of two output rows per rank against a direct DFT over the input (float64).

    Natural layout: output row k is fft(sum_i w1^(k i) x[i, :]); each rank forms its rows' part of
    that sum, the parts are added, and the owner compares. Transposed layout: output row k is
    column k of fft2(x), fft over i of (x @ f_k)[i], with f_k[j] = w2^(j k).
    """
    xp = world.xp
    n1, n2, b1 = plan.n1, plan.n2, plan.b1
    sign = 1.0 if plan.inverse else -1.0
    out_b = out.shape[0]
    ks = sorted({r * out_b + j for r in range(world.size) for j in (0, out_b - 1)})
    x = x0.astype(xp.complex128)
    if plan.layout == "natural":
        i = np.arange(world.rank * b1, (world.rank + 1) * b1, dtype=np.int64)
        phase = (np.outer(ks, i) % n1) * (2 * np.pi / n1) * sign
        part = module.to_host(xp.asarray(np.exp(1j * phase)) @ x)  # (len(ks), n2)
        total = sum(world.allgather_object(part))
        ref = np.fft.ifft(total, axis=1, norm="forward") if plan.inverse else np.fft.fft(total, axis=1)
    else:
        j = np.arange(n2, dtype=np.int64)
        phase = (np.outer(j, ks) % n2) * (2 * np.pi / n2) * sign
        part = module.to_host(x @ xp.asarray(np.exp(1j * phase)))  # (b1, len(ks)): my rows of x @ F2[:, ks]
        u = np.concatenate(world.allgather_object(part), axis=0)  # (n1, len(ks))
        ref = (np.fft.ifft(u, axis=0, norm="forward") if plan.inverse else np.fft.fft(u, axis=0)).T
    if plan.inverse:
        ref = ref / (n1 * n2)
    mine = [idx for idx, k in enumerate(ks) if k // out_b == world.rank]
    got = module.to_host(out[[ks[idx] - world.rank * out_b for idx in mine]]).astype(np.complex128)
    want = ref[mine]
    scale = max(float(np.abs(want).max()), 1e-300)
    err = float(np.abs(got - want).max() / scale)
    return max(world.allgather_object(err))


def _one_rank(world: Any, module: Any, n: int, dtype: str, cfg: Config, seed: int) -> dict:
    """cuFFT's (numpy's) fft2 of the whole array on rank 0 while the others wait."""
    from ..apps import fft

    es = fft.DTYPES[dtype]
    need = 4 * n * n * es  # input, output, work area, margin
    free, what = module.free_bytes(world)
    row: dict = dict(impl="fft2-1rank", bytes=n * n * es, n=n, dtype=dtype, ranks=1, layout="natural",
                     inverse=cfg.inverse)
    fits = world.broadcast_object(need <= free)
    if not fits:
        world.barrier()
        return dict(row, skipped=f"needs about {need / (1 << 30):.1f} GiB on {what}; "
                                 f"{free / (1 << 30):.1f} GiB free")
    if world.rank == 0:
        x = module.random_slab(world, (n, n), dtype, [seed, n, 1 << 20])
        seconds = []
        for i in range(cfg.warmup + cfg.iters):
            t0 = time.perf_counter()
            y = module.fft2_reference(x, cfg.inverse)
            if world.xp is not np:
                world.xp.cuda.get_current_stream().synchronize()
            if i >= cfg.warmup:
                seconds.append(time.perf_counter() - t0)
            del y
        del x
        median = statistics.median(seconds)
        row.update(time_ms=median * 1e3, time_min_ms=min(seconds) * 1e3, fft_ms=median * 1e3,
                   gflops=5.0 * n * n * math.log2(n * n) / median / 1e9, samples=len(seconds))
    world.barrier()
    return world.broadcast_object(row)


def plot_breakdown(rows: list[dict], path: str, title: str) -> str:
    """Stacked bars of FFT / transpose / communication time, one bar per scheme and size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..errors import BackendError

        raise BackendError("plotting needs matplotlib: pip install matplotlib") from None
    bars = [r for r in rows if "skipped" not in r and r.get("time_ms")]
    if not bars:
        raise ConfigError(f"plot {title!r}: no measured rows")
    labels = [f"{r['impl']}\n{r['n']}² {r['dtype']}" for r in bars]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(bars)), 4.5), dpi=120)
    try:
        bottom = np.zeros(len(bars))
        for key, name in (("fft_ms", "FFT"), ("transpose_ms", "local transpose"),
                          ("comm_ms", "communication (transposing put: transpose included)")):
            vals = np.array([float(r.get(key) or 0.0) for r in bars])
            ax.bar(range(len(bars)), vals, bottom=bottom, label=name)
            bottom += vals
        ax.plot(range(len(bars)), [r["time_ms"] for r in bars], "k_", markersize=20, label="median total")
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, format="png")
    except OSError as exc:
        raise ConfigError(f"cannot write plot to {path!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path
