"""The distributed 2-D and 3-D FFT against the strongest slab scheme a user would write: ``circuslink bench fft``.

For every case (an N x N array for each ``--size``, an N x N x N one for each ``--size3``; complex64 and
complex128), in one run, on the same ranks and the same slabs of axis 0:

* ``transpose-put``: circuslink's plan (apps.fft), the global transpose done by transposing puts, the
  chunks picked by the tile model (``chunks``; the model's prediction of the puts in ``predicted_comm_ms``
  beside ``put_alone_ms``, the reshapes timed with no transform between them, its error in ``model_err_pct``;
  where the ranks share one GPU, at least every rank's bytes at ``shared_put_gbps``, and the model fitted
  on each rank alone in ``predicted_comm_alone_ms``; the ranks' hand-off, one device-side meeting, in
  ``predicted_sync_ms``, counted once per chunk's queue inside ``predicted_comm_ms``;
  ``put_ms`` is the puts' own launches inside the pipeline);
* ``pull`` (slabs, layout transposed): circuslink's plan with
  ``scheme="pull"``: no reshape pass, the second stage's transform reads every piece from the rank holding it
  (cuFFT's load callback on the GPU); its communication is inside ``fft_ms``, and
  ``comm_ms`` is its two device-side meetings;
* ``baseline-<all-to-all>``: the slab scheme as cuFFTMp and heFFTe implement it (bench/fft_baseline.py:
  cuFFT on the local axes, a tiled transpose into a send buffer, an all-to-all, chunked on two streams),
  once per all-to-all available here and per chunk count of ``--baseline-chunks`` (``alltoall``,
  ``transpose``, ``chunks`` name each): ``copy-engine`` (cudaMemcpy2DAsync into the peers' mapped
  buffers), ``nccl`` (ranks on their own GPUs only), ``mpi`` (host-staged; where the ranks cannot map each
  other's memory), ``nvshmem`` (its own program, puts from a kernel; where NVSHMEM and nvcc are installed);
* ``fftn-1rank``: cuFFT on the whole array in one process with the whole GPU (numpy's on the cpu): the
  ceiling, with no communication at all.

Every row is the median (``time_ms``) and minimum (``time_min_ms``) over ``--iters`` transforms, each the slowest
rank's device time (CUDA events; the host clock on the cpu) after a device-side handshake of every rank
(``_driver.handshake``), the input restored before each; ``fft_ms`` / ``transpose_ms`` / ``comm_ms`` split it from
device events (they may overlap: their sum can exceed the total). ``less_time_pct`` (on circuslink's rows): time
saved against the fastest baseline of the case (``vs``); ``vs_1rank``: the time over the ceiling's. The time verdicts
take, per case, circuslink's fastest scheme; the tile model's verdict the transpose-put rows. Before timing, each
scheme's output is checked on a few lines along axis 0 against a direct DFT of the input in float64
(``max_rel_err``, the norm-wise relative error). Every case's memory is checked before anything runs.
The probe's floor of the same run is in ``floor``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BackendError, ConfigError, Error

_DTYPES = ("complex64", "complex128")
SCHEMES = ("transpose-put", "pull")  # circuslink's rows (pull: complex slabs, layout transposed)
# Both by default: neither is faster everywhere (one H100, 2026-12-07: the pull at 512^3 complex128 on 2 and 4 ranks,
# the puts at complex64 and 8192^2 complex128; 16384^2 complex128 either way), and the verdicts take the faster of
# each case. A GPU whose cuFFT cannot link the pull's callback gets a skipped row, not a stop.
DEFAULT_SCHEMES = ("transpose-put", "pull")
_TOLERANCE = {"complex64": 1e-5, "complex128": 1e-12}
_LONG_WAIT_S = 1800.0  # other ranks wait this long while rank 0 builds and runs NVSHMEM or the ceiling
_MARGIN = 512 << 20


@dataclass
class Config:
    """What one benchmark run measures."""

    cases: list[tuple[tuple[int, ...], str]]
    iters: int = 10
    warmup: int = 2
    layout: str = "transposed"
    schemes: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEMES))
    chunks: int | None = None
    baseline_chunks: list[int] = field(default_factory=lambda: [1, 4])
    alltoalls: list[str] = field(default_factory=lambda: ["auto"])
    transpose: str = "tiled"
    quick: bool = False
    json: str | None = None
    plot: str | None = None
    baselines: bool = True
    csv: bool = False  # tables as CSV (--csv)
    plain_bytes: bool = False  # byte counts as plain integers (--bytes)
    note: str = ""  # what the run says before it starts (sizes chosen for the user), once the input is checked
    meta: dict = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _driver as drv

    drv.add_common_arguments(parser, default_sizes="8K,16K", default_iters=10, default_warmup=2)
    parser.epilog = (f"On a back-end without kernels (cpu) the default sizes are {_csv(CPU_DEFAULT_SIZES)} (2-D) and "
                     f"{_csv(CPU_DEFAULT_SIZES3)} (3-D), and --quick runs {_csv(CPU_QUICK_SIZES)} and "
                     f"{_csv(CPU_QUICK_SIZES3)}.")
    add_fft_arguments(parser)


def add_fft_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``bench fft`` beyond the driver's."""
    parser.add_argument("--size", default=None,
                        help="2-D cases: points per side N (an N x N array), e.g. 8192,16384; overrides --sizes, "
                             "which is read the same way here (8K = 8192)")
    parser.add_argument("--size3", default=None,
                        help="3-D cases: points per side N (an N x N x N array), e.g. 512,1024 (the default)")
    parser.add_argument("--dims", default="2,3", help="which cases: 2, 3 or 2,3 (default both)")
    parser.add_argument("--dtype", default="both", choices=(*_DTYPES, "both"),
                        help="element type (default both: complex64 then complex128)")
    parser.add_argument("--layout", default="transposed", choices=("natural", "transposed"),
                        help="output boxes: transposed (default: slabs of axis 1, axis 0 fastest, one global "
                             "transpose, as cuFFTMp's slab output) or natural (slabs of axis 0 again: two)")
    parser.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES),
                        help="circuslink's schemes, each a row: transpose-put (the reshape by transposing puts) and "
                             "pull (layout transposed: the second stage's transform reads the peers' slabs); "
                             f"default {','.join(DEFAULT_SCHEMES)}")
    parser.add_argument("--chunks", type=int, default=None,
                        help="circuslink's pipeline chunks (default: the tile model's choice)")
    parser.add_argument("--baseline-chunks", default="1,4",
                        help="chunk counts the baselines try (each is a row; default 1,4)")
    parser.add_argument("--alltoall", default="auto",
                        help="the baselines' all-to-alls: auto (every one available here) or a list of "
                             "copy-engine, nccl, mpi, nvshmem")
    parser.add_argument("--baseline-transpose", default="tiled", choices=("tiled", "cupy"),
                        help="the baselines' local transpose: the tiled shared-memory kernel (default) or CuPy's")


def _ints(text: str, what: str) -> list[int]:
    from . import _driver as drv

    try:
        return drv.parse_sizes(text, what)
    except Error as exc:
        raise ConfigError(f"bench fft: {exc}") from None


# The sizes of a back-end without kernels (the GPU's would take minutes in numpy): said in --help and when used.
CPU_DEFAULT_SIZES, CPU_DEFAULT_SIZES3 = (256, 512), (24, 48)
CPU_QUICK_SIZES, CPU_QUICK_SIZES3 = (64,), (16,)


def _csv(sizes: tuple[int, ...] | list[int]) -> str:
    return ",".join(map(str, sizes))


def config_from_args(args: argparse.Namespace) -> Config:
    from ..backends import default_backend_name, runs_kernels

    backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
    cpu = not runs_kernels(backend)
    quick = bool(getattr(args, "quick", False))
    dims = set()
    for d in str(args.dims).split(","):
        if d.strip() not in ("2", "3"):
            raise ConfigError(f"bench fft: --dims {args.dims!r}: give 2, 3 or 2,3")
        dims.add(int(d))
    given2 = args.size if args.size else (args.sizes if args.sizes != getattr(args, "_default_sizes", None) else None)
    sizes2 = _ints(given2, "--size") if given2 else list(CPU_QUICK_SIZES if cpu else [1024]) if quick else \
        list(CPU_DEFAULT_SIZES if cpu else [8192, 16384])
    sizes3 = _ints(args.size3, "--size3") if args.size3 else list(CPU_QUICK_SIZES3 if cpu else [64]) if quick \
        else list(CPU_DEFAULT_SIZES3 if cpu else [512, 1024])
    defaulted = [f"{_csv(sizes)} ({d}-D)" for d, sizes, given in ((2, sizes2, given2), (3, sizes3, args.size3))
                 if d in dims and not given]
    note = ""
    if cpu and not quick and defaulted:  # said, not silent
        note = (f"bench fft: the {backend} back-end runs {' and '.join(defaulted)} by default (8K,16K and 512,1024 "
                "would take minutes in numpy); --size N / --size3 N choose")
    dtypes = list(_DTYPES) if args.dtype == "both" else [args.dtype]
    cases = []
    for d, sizes in ((2, sizes2), (3, sizes3)):
        if d in dims:
            cases += [((n,) * d, dt) for n in sizes for dt in dtypes]
    iters, warmup = args.iters, args.warmup
    if quick:
        iters, warmup = min(iters, 5), min(warmup, 1)
    alltoalls = [a.strip() for a in str(args.alltoall).split(",") if a.strip()]
    from .fft_baseline import ALLTOALLS

    bad = [a for a in alltoalls if a not in (*ALLTOALLS, "auto")]
    if bad:
        raise ConfigError(f"bench fft: --alltoall {bad[0]!r}: choose auto or from {', '.join(ALLTOALLS)}")
    chunks = _ints(args.baseline_chunks, "--baseline-chunks")
    schemes = [x.strip() for x in str(getattr(args, "schemes", ",".join(DEFAULT_SCHEMES))).split(",") if x.strip()]
    bad = [x for x in schemes if x not in SCHEMES] or ([] if schemes else ["(none)"])
    if bad:
        raise ConfigError(f"bench fft: --schemes {bad[0]!r}: choose from {', '.join(SCHEMES)}")
    if args.chunks is not None and args.chunks < 1:
        raise ConfigError(f"bench fft: --chunks {args.chunks} must be positive")
    return Config(cases=cases, iters=iters, warmup=warmup, layout=args.layout, schemes=schemes, chunks=args.chunks,
                  baseline_chunks=[2] if quick and args.baseline_chunks == "1,4" else chunks, alltoalls=alltoalls,
                  transpose=args.baseline_transpose, quick=quick, json=args.json, plot=args.plot,
                  baselines=not getattr(args, "no_baselines", False), csv=getattr(args, "csv", False),
                  plain_bytes=getattr(args, "plain_bytes", False), note=note)


def _label(shape: tuple[int, ...]) -> str:
    return f"{shape[0]}^{len(shape)}" if len(set(shape)) == 1 else "x".join(map(str, shape))


# -- memory: every case checked before anything runs ------------------------------------------------------
def _case_needs(shape: tuple[int, ...], dtype: str, nranks: int) -> dict[str, float]:
    """Bytes per rank (ceiling: for its one process) each measurement of a case holds at once."""
    slab = math.ceil(math.prod(shape) / nranks) * np.dtype(dtype).itemsize
    whole = math.prod(shape) * np.dtype(dtype).itemsize
    return {"transpose-put": 4 * slab,                       # 2 regions, cuFFT work, the input's copy
            "baseline": 6 * slab,                            # 2 buffers, send, receive, cuFFT work, the copy
            "nvshmem": 6 * slab,                             # data, copy, send, receive, cuFFT work areas
            "ceiling": 2 * whole / nranks}                   # one process: the array and cuFFT's work (per rank)


def check_memory(world: Any, module: Any, cfg: Config) -> None:
    """Collective: refuse in one line a case that the ranks sharing a device (or the host) cannot hold."""
    free, what = module.free_bytes(world)
    me = world.backend.device_identity  # the GPU (host and PCI bus), None for the host's memory
    devices = world.allgather_object((me, free))
    on_mine = [r for r, (d, _) in enumerate(devices) if d == me]
    have = min(devices[r][1] for r in on_mine)
    problems = []
    for shape, dtype in cfg.cases:
        needs = _case_needs(shape, dtype, world.size)
        phase, per_rank = max(needs.items(), key=lambda kv: kv[1])
        need = len(on_mine) * (per_rank + _MARGIN)
        if need > have:
            problems.append(f"{_label(shape)} {dtype} needs about {need / (1 << 30):.1f} GiB on {what} ({phase}), "
                            f"only {have / (1 << 30):.1f} GiB is free")
    verdicts = world.allgather_object(problems[0] if problems else None)
    found = [v for v in verdicts if v]
    if found:
        raise ConfigError(f"bench fft: {found[0]}: drop that size or use complex64")


def check_cases(cfg: Config, nranks: int, backend: str) -> None:
    """Before starting ranks: the memory of every case, on the GPUs the ranks will share (where nvidia-smi can
    say; the ranks check again with what they see) or in the host's memory."""
    from ..backends import runs_kernels

    if runs_kernels(backend):
        from ..apps.fft._plan import require_gpu_memory

        for shape, dtype in cfg.cases:
            require_gpu_memory(nranks, max(_case_needs(shape, dtype, nranks).values()) + _MARGIN,
                               f"bench fft: {_label(shape)} {dtype} over {nranks} ranks",
                               "use a smaller --size / --size3, or complex64")
        return
    from ..apps.fft import _cpu

    free, what = _cpu.free_bytes(None)
    for shape, dtype in cfg.cases:
        need = nranks * (max(_case_needs(shape, dtype, nranks).values()) + _MARGIN)
        if need > free:
            raise ConfigError(f"bench fft: {_label(shape)} {dtype} over {nranks} ranks needs about "
                              f"{need / (1 << 30):.1f} GiB of {what}, but only {free / (1 << 30):.1f} GiB is free: "
                              "use a smaller --size / --size3")


def run(args: argparse.Namespace) -> int:
    from .. import launcher

    cfg = config_from_args(args)
    if not launcher.inside_job():
        from ..backends import default_backend_name

        backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
        check_cases(cfg, args.nranks, backend)
        if cfg.note:
            from ..results import progress

            progress(cfg.note)
        argv = ["bench", "fft", *sys.argv[sys.argv.index("fft") + 1:]] if "fft" in sys.argv else ["bench", "fft"]
        from ..apps.fft._plan import SM_PARTITION

        return launcher.relaunch_self(args.nranks, argv=argv, backend=args.backend, sm_partition=SM_PARTITION)
    import circuslink

    world = circuslink.init(args.backend)
    try:
        return run_rank(world, cfg)
    finally:
        world.close()


# -- the run on every rank -----------------------------------------------------------------------------
def run_rank(world: Any, cfg: Config) -> int:
    from .. import probe
    from . import _driver as drv

    module = world.backend_module("circuslink.apps.fft")
    check_memory(world, module, cfg)
    results = drv.Results("fft", world)
    drv.progress("fft: measuring the floor (probe)")
    pairs = [(0, 1), (1, 0)] if world.size > 1 else []
    results.floor = probe.measure(world, quick=True, pairs=pairs)
    results.meta.update(iters=cfg.iters, warmup=cfg.warmup, layout=cfg.layout, sm_budget=world.sm_budget,
                        launched_by=world.launched_by, flops="5 N log2 N, N points", cases=[
                            f"{_label(s)} {d}" for s, d in cfg.cases], baseline_transpose=cfg.transpose,
                        **cfg.meta)
    seed = int(world.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 31))))
    alltoalls = _alltoalls(world, cfg)
    results.meta["alltoalls"] = {a: why or "measured" for a, why in alltoalls.items()}
    for index, (shape, dtype) in enumerate(cfg.cases):
        x0 = module.random_array(world, _slab_shape(shape, world), dtype, [seed, index, world.rank])
        for scheme in cfg.schemes:
            drv.progress(f"fft: {scheme} {_label(shape)} {dtype} on {world.size} ranks")
            results.add(**_measure_ours(world, module, shape, dtype, cfg, x0, scheme))
            module.release_memory(world)
        if cfg.baselines:
            for alltoall, why in alltoalls.items():
                if alltoall == "nvshmem":
                    continue
                if why:
                    results.add(**_base_row(world, shape, dtype, cfg, f"baseline-{alltoall}", alltoall=alltoall,
                                            skipped=why))
                    continue
                for chunks in cfg.baseline_chunks:
                    drv.progress(f"fft: baseline ({alltoall}, {chunks} chunk(s)) {_label(shape)} {dtype}")
                    results.add(**_measure_baseline(world, module, shape, dtype, cfg, x0, alltoall, chunks))
                    module.release_memory(world)
        del x0
        module.release_memory(world)
    if cfg.baselines and "nvshmem" in alltoalls:
        results.extend(_nvshmem_rows(world, cfg, alltoalls["nvshmem"]))
    if cfg.baselines:
        results.extend(_ceiling_rows(world, module, cfg))
    _compare(results.rows)
    if world.rank == 0:
        shown = [dict(r, max_rel_err=f"{r['max_rel_err']:.1e}") if isinstance(r.get("max_rel_err"), float) else r
                 for r in results.rows]
        def report() -> None:
            drv.print_table(
                shown, ["impl", "case", "dtype", "chunks", "time_ms", "time_min_ms", "fft_ms", "transpose_ms",
                        "comm_ms", "put_ms", "put_alone_ms", "predicted_comm_ms", "gflops", "less_time_pct",
                        "vs_1rank", "max_rel_err"],
                f"FFT forward, {cfg.layout} output, {world.size} ranks ({world.backend.name}): median of "
                f"{cfg.iters}, the slowest rank; transpose-put's comm_ms includes its transpose (fused)", cfg)
            if world.xp is not np:  # the targets are a GPU's; a cpu run prints none
                _verdicts(results.rows)

        drv.finish(results, cfg, report, lambda path: drv.figure(path, _panels(results.rows, world.size)))
    world.barrier()
    return 0


def _slab_shape(shape: tuple[int, ...], world: Any) -> tuple[int, ...]:
    from ..apps.fft import spans

    lo, hi = spans(shape[0], world.size)[world.rank]
    return (hi - lo, *shape[1:])


def _alltoalls(world: Any, cfg: Config) -> dict[str, str | None]:
    """{all-to-all: None (measured) or why not}, agreed by every rank (collective)."""
    from ..backends import describe_shared_gpus, shared_gpus

    wanted = ["copy-engine", "nccl", "mpi", "nvshmem"] if "auto" in cfg.alltoalls else list(cfg.alltoalls)
    gpu = world.xp is not np
    sharing = shared_gpus(world) if gpu else {}
    out: dict[str, str | None] = {}
    for a in wanted:
        why = None
        if a == "nccl":
            if not gpu:
                why = "NCCL needs GPUs"
            elif sharing:
                why = f"NCCL refuses two ranks on one GPU ({describe_shared_gpus(sharing)})"
        elif a == "mpi":
            if world.mpi_comm is None:
                why = "the host-staged MPI all-to-all needs a job started by mpirun"
            elif "auto" in cfg.alltoalls:
                why = ("every rank maps every peer's memory here: the copy engine moves the blocks (MPI host-staged is "
                       "the all-to-all for ranks that cannot; --alltoall mpi measures it anyway)")
        elif a == "nvshmem":
            if not gpu:
                why = "NVSHMEM needs GPUs"
            elif cfg.layout != "transposed":
                why = "the NVSHMEM program implements the one-transpose (transposed) layout only"
            elif cfg.quick:
                why = "--quick skips the NVSHMEM program (building it takes a minute)"
            elif world.size == 1:
                why = "one rank: nothing to exchange"
        if world.size == 1:
            why = "one rank: nothing to exchange"
        out[a] = why
    agreed = world.allgather_object(out)
    return agreed[0]


def _measure(world: Any, obj: Any, x0: Any, cfg: Config) -> dict:
    """Median / minimum (the slowest rank of each iteration) and the phases' medians (the slowest rank's); each
    iteration's clock starts after a device-side handshake (``_driver.handshake``)."""
    from . import _driver as drv

    module = world.backend_module("circuslink.apps.fft")
    totals, phases = [], {"fft": [], "transpose": [], "comm": [], "put": []}
    for i in range(cfg.warmup + cfg.iters):
        obj.input[...] = x0  # every iteration transforms the same input (FFT after FFT would overflow)
        module.sync(world, "restoring the input")  # landed before the barrier: the clock starts after it
        world.barrier()
        met = drv.handshake(world)
        obj.forward(profile=True)
        if met is not None:
            met.check_device()
        if i >= cfg.warmup:
            totals.append(obj.seconds)
            for k in phases:
                phases[k].append(obj.timings[k])
    slowest = drv.slowest_rank(world, totals)
    mine = {k: statistics.median(v) for k, v in phases.items()}
    worst = {k: max(p[k] for p in world.allgather_object(mine)) for k in phases}
    return {"time_ms": statistics.median(slowest) * 1e3, "time_min_ms": min(slowest) * 1e3,
            "fft_ms": worst["fft"] * 1e3, "transpose_ms": worst["transpose"] * 1e3, "comm_ms": worst["comm"] * 1e3,
            "put_ms": worst["put"] * 1e3, "samples": len(slowest)}


def _exchanges_alone(world: Any, plan: Any, cfg: Config) -> float:
    """Median (the slowest rank of each iteration) seconds of the plan's reshapes alone (Plan.time_exchanges)."""
    from . import _driver as drv

    alone = []
    for i in range(cfg.warmup + cfg.iters):
        world.barrier()
        met = drv.handshake(world)
        seconds = plan.time_exchanges()
        if met is not None:
            met.check_device()
        if i >= cfg.warmup:
            alone.append(seconds)
    return statistics.median(drv.slowest_rank(world, alone))


def _base_row(world: Any, shape: tuple[int, ...], dtype: str, cfg: Config, impl: str, **extra: Any) -> dict:
    n = math.prod(shape)
    return dict(impl=impl, case=_label(shape), shape=list(shape), ndim=len(shape), n=shape[0], dtype=dtype,
                bytes=n * np.dtype(dtype).itemsize, ranks=world.size, layout=cfg.layout, **extra)


def _finish(row: dict, shape: tuple[int, ...]) -> dict:
    n = math.prod(shape)
    if row.get("time_ms"):
        row["gflops"] = 5.0 * n * math.log2(n) / (row["time_ms"] * 1e-3) / 1e9
    return row


def _measure_ours(world: Any, module: Any, shape: tuple[int, ...], dtype: str, cfg: Config, x0: Any,
                  scheme: str = "transpose-put") -> dict:
    from ..apps import fft

    ins, outs = fft.boxes(shape, world.size, "slab", layout=cfg.layout)
    options = {"scheme": "pull"} if scheme == "pull" else {"chunks": cfg.chunks}
    try:
        plan = fft.Plan(world, ins[world.rank], outs[world.rank], dtype, decomposition="slab", **options)
    except (ConfigError, BackendError) as exc:
        if scheme != "pull":
            raise
        # where the pull does not apply, or cuFFT cannot plan it: a row saying why
        return _base_row(world, shape, dtype, cfg, scheme, skipped=str(exc).splitlines()[0])
    with plan:
        plan.input[...] = x0
        out = plan.forward()
        err = check_lines(world, module, x0, plan.inbox, plan.outbox, out, shape, dtype, scheme)
        row = _base_row(world, shape, dtype, cfg, scheme, chunks=plan.chunks, max_rel_err=err,
                        **_measure(world, plan, x0, cfg))
        if scheme == "pull":  # no reshape, no puts: nothing for the tile model
            row["pull_kernels"] = plan.describe()["pull_kernels"].get("forward", [])
            return _finish(row, shape)
        row["put_alone_ms"] = _exchanges_alone(world, plan, cfg) * 1e3
        pred = plan.prediction
        if pred.get("comm_s"):
            row["predicted_comm_ms"] = pred["comm_s"] * 1e3
            # What the model predicts: the puts with nothing beside them. In the pipeline (put_ms) they share the
            # GPU with the other ranks' transforms, which no tile model sees.
            row["model_err_pct"] = 100.0 * (row["predicted_comm_ms"] / row["put_alone_ms"] - 1.0)
            if pred.get("shared_put_bps"):  # the model fitted on each rank alone, beside the shared bound
                row["predicted_comm_alone_ms"] = pred["comm_alone_s"] * 1e3
                row["shared_put_gbps"] = pred["shared_put_bps"] / 1e9
            if pred.get("sync_s"):  # the ranks' hand-off per chunk's queue, inside predicted_comm_ms
                row["predicted_sync_ms"] = pred["sync_s"] * 1e3
        if pred.get("chunk_candidates"):
            bounds = pred["chunk_candidates"].get(plan.chunks)
            if bounds:
                row["predicted_ms_range"] = [bounds["low_s"] * 1e3, bounds["high_s"] * 1e3]
            row["chunk_choice"] = "measured" if pred.get("chunk_measured_s") else "model"
            if pred.get("chunk_measured_s"):  # each candidate's median forward of the slowest rank (the evidence)
                row["chunk_measured_ms"] = {str(k): v * 1e3 for k, v in pred["chunk_measured_s"].items()}
        elif cfg.chunks is None:
            row["chunk_choice"] = "no model (cpu)" if world.xp is np else "one stage"
        else:
            row["chunk_choice"] = "--chunks"
    return _finish(row, shape)


def _measure_baseline(world: Any, module: Any, shape: tuple[int, ...], dtype: str, cfg: Config, x0: Any,
                      alltoall: str, chunks: int) -> dict:
    from .fft_baseline import SlabBaseline

    impl = f"baseline-{alltoall}"
    try:
        base = SlabBaseline(world, shape, dtype, cfg.layout, alltoall, chunks, cfg.transpose)
    except ConfigError as exc:
        return _base_row(world, shape, dtype, cfg, impl, alltoall=alltoall, skipped=str(exc))
    try:
        from ..apps.fft import boxes

        ins, outs = boxes(shape, world.size, "slab", layout=cfg.layout)
        base.input[...] = x0
        out = base.forward()
        err = check_lines(world, module, x0, ins[world.rank], outs[world.rank], out, shape, dtype, impl)
        row = _base_row(world, shape, dtype, cfg, impl, alltoall=alltoall, transpose=cfg.transpose,
                        chunks=base.describe()["chunks"][0], max_rel_err=err, **_measure(world, base, x0, cfg))
    finally:
        base.close()
    return _finish(row, shape)


def _nvshmem_rows(world: Any, cfg: Config, why: str | None) -> list[dict]:
    """Rank 0 builds and runs the NVSHMEM program for every case while the other ranks wait (memory freed)."""
    from . import _driver as drv

    rows: list = []
    if why:
        rows = [_base_row(world, s, d, cfg, "baseline-nvshmem", alltoall="nvshmem", skipped=why) for s, d in cfg.cases]
        return rows
    if world.rank == 0:
        from .fft_baseline import nvshmem_slab

        drv.progress(f"fft: baseline (nvshmem, its own program on {world.size} PEs) for every case")
        try:
            got = nvshmem_slab(world.size, list(cfg.cases), cfg.iters, cfg.warmup, cfg.baseline_chunks,
                               timeout=_LONG_WAIT_S)
            for r in got:
                shape, dtype = tuple(r.pop("shape")), r.pop("dtype")
                r.pop("impl", None)
                r.pop("bytes", None)
                rows.append(_finish(_base_row(world, shape, dtype, cfg, "baseline-nvshmem", alltoall="nvshmem",
                                              transpose="tiled", **r), shape))
        except Error as exc:
            reason = str(exc).splitlines()[0]
            rows = [_base_row(world, s, d, cfg, "baseline-nvshmem", alltoall="nvshmem", skipped=reason)
                    for s, d in cfg.cases]
    world.barrier(timeout=_LONG_WAIT_S)
    return world.broadcast_object(rows)


def _ceiling_rows(world: Any, module: Any, cfg: Config) -> list[dict]:
    """Rank 0: the whole array's transform in a process of its own (the whole GPU) while the others wait."""
    from . import _driver as drv

    rows: list = []
    if world.rank == 0:
        from .fft_baseline import run_ceiling

        drv.progress("fft: the 1-rank ceiling (one process, the whole GPU) for every case")
        try:
            got = run_ceiling(list(cfg.cases), cfg.iters, cfg.warmup, world.xp is not np, timeout=_LONG_WAIT_S)
            for r in got:
                shape = tuple(r.pop("shape"))
                row = _base_row(world, shape, r.pop("dtype"), cfg, "fftn-1rank", **r)
                row.update(ranks=1, layout="natural", fft_ms=row["time_ms"])
                rows.append(_finish(row, shape))
        except Error as exc:
            reason = str(exc).splitlines()[0]
            rows = [_base_row(world, s, d, cfg, "fftn-1rank", skipped=reason) for s, d in cfg.cases]
    world.barrier(timeout=_LONG_WAIT_S)
    return world.broadcast_object(rows)


def _compare(rows: list[dict]) -> None:
    """circuslink's rows: time saved against the fastest baseline of the case, and the ratio to the ceiling."""
    for r in rows:
        if r["impl"] not in SCHEMES or not r.get("time_ms"):
            continue
        same = [b for b in rows if b.get("case") == r["case"] and b.get("dtype") == r["dtype"] and b.get("time_ms")]
        bases = [b for b in same if b["impl"].startswith("baseline-")]
        if bases:
            best = min(bases, key=lambda b: b["time_ms"])
            r["less_time_pct"] = 100.0 * (1.0 - r["time_ms"] / best["time_ms"])
            r["vs"] = f"{best['impl']} ({best.get('chunks', 1)} chunk(s))"
        ceiling = [b for b in same if b["impl"] == "fftn-1rank"]
        if ceiling:
            r["vs_1rank"] = r["time_ms"] / ceiling[0]["time_ms"]


# The targets of the distributed FFT on one GPU: time saved against the strongest baseline of the run, the ratio to
# one rank's cuFFT at the largest sizes ((N per side, dimensions): 16384^2 and 1024^3), the tile model's error.
LESS_TIME_PCT, VS_1RANK, VS_1RANK_CASES, MODEL_ERR_PCT = 25.0, 1.5, ((16384, 2), (1024, 3)), 15.0


def _verdicts(rows: list[dict]) -> None:
    """One line a target, naming the worst case: per case circuslink's fastest scheme; the tile model's error over
    the transpose-put rows."""
    fastest: dict[tuple, dict] = {}
    for r in rows:
        if r["impl"] in SCHEMES and r.get("time_ms"):
            key = (r["case"], r["dtype"])
            if key not in fastest or r["time_ms"] < fastest[key]["time_ms"]:
                fastest[key] = r
    ours = list(fastest.values())
    puts = [r for r in rows if r["impl"] == "transpose-put" and r.get("time_ms")]

    def line(what: str, values: list[tuple[float, dict]], limit: float, at_least: bool) -> None:
        if not values:
            return
        if at_least:
            value, r = min(values, key=lambda v: v[0])
            met = all(v >= limit for v, _ in values)
        else:
            value, r = max(values, key=lambda v: abs(v[0]))
            met = all(abs(v) <= limit for v, _ in values)
        print(f"{what}: worst {value:.2f} at {r['case']} {r['dtype']} ({r['impl']}) "
              f"(target {'>=' if at_least else '<='} {limit:g} "
              f"at each of {len(values)}): {'met' if met else 'MISSED'}")

    line("less time than the strongest baseline, %", [(r["less_time_pct"], r) for r in ours if "less_time_pct" in r],
         LESS_TIME_PCT, True)
    largest = [r for r in ours if r.get("vs_1rank") and (r["n"], r["ndim"]) in VS_1RANK_CASES]
    line("time / one rank's cuFFT", [(r["vs_1rank"], r) for r in largest], VS_1RANK, False)
    line("tile model error against the puts alone, %",
         [(r["model_err_pct"], r) for r in puts if r.get("model_err_pct") is not None], MODEL_ERR_PCT, False)


def check_lines(world: Any, module: Any, x0: Any, inbox: Any, outbox: Any, out: Any, shape: tuple[int, ...],
                dtype: str, what: str, lines: int = 3) -> float:
    """Norm-wise relative error of a few output lines along axis 0 against a direct DFT of the input (float64).

    Output line (k1[, k2]) along axis 0 is the DFT over axis 0 of v[i0] = sum over the other axes of
    x[i0, ...] w1^(k1 i1) [w2^(k2 i2)]: every rank forms v over its slab (in complex128, a few planes at a
    time), the parts are gathered in order, numpy transforms them, and the owners of the line compare.
    Raises (on every rank) above the tolerance: a wrong result is never timed.
    """
    xp = world.xp
    g = np.random.default_rng(1234 + len(shape))
    picks = [tuple(int(g.integers(0, n)) for n in shape[1:]) for _ in range(lines)]
    parts = []
    for k in picks:
        phases = [np.exp(-2j * np.pi * ((np.arange(n) * kk) % n) / n) for n, kk in zip(shape[1:], k, strict=True)]
        v = []
        step = max(1, (64 << 20) // max(1, math.prod(shape[1:]) * 16))
        for a in range(0, x0.shape[0], step):
            blk = x0[a: a + step].astype(xp.complex128)
            for ph in reversed(phases):
                blk = blk @ xp.asarray(ph)
            v.append(module.to_host(blk))
        parts.append(np.concatenate(v) if v else np.zeros(0, np.complex128))
    everyone = world.allgather_object((inbox.low[0], parts))
    everyone.sort(key=lambda e: e[0])
    sq_diff, sq_ref = 0.0, 0.0
    view = out.transpose(tuple(int(a) for a in np.argsort(outbox.order)))  # logical axes
    for li, k in enumerate(picks):
        ref = np.fft.fft(np.concatenate([p[li] for _, p in everyone]))
        sq_ref += float(np.sum(np.abs(ref) ** 2))
        if all(lo <= kk < hi for kk, lo, hi in zip(k, outbox.low[1:], outbox.high[1:], strict=True)) and \
                not outbox.empty:
            idx = (slice(None),) + tuple(kk - lo for kk, lo in zip(k, outbox.low[1:], strict=True))
            got = module.to_host(view[idx]).astype(np.complex128)
            sq_diff += float(np.sum(np.abs(got - ref[outbox.low[0]: outbox.high[0]]) ** 2))
    totals = world.allgather_object((sq_diff, sq_ref))
    ref_total = totals[0][1]  # every rank formed the same reference lines
    err = math.sqrt(sum(t[0] for t in totals) / max(ref_total, 1e-300))
    if not err <= _TOLERANCE[dtype]:  # also catches NaN
        raise ConfigError(f"bench fft: {what} {_label(shape)} {dtype}: relative error {err:.3g} above "
                          f"{_TOLERANCE[dtype]:g} against the direct DFT")
    return err


def _panels(rows: list[dict], nranks: int) -> list[dict]:
    """The figure's panels: time against array size per scheme, one panel per dimension and precision (the
    ceiling drawn beside), then the time of every measured row split by phase."""
    from . import _driver as drv

    panels = []
    for d in (2, 3):
        mine = [dict(r, series=f"{r['impl']}" + (f" ({r.get('chunks')} ch)" if r["impl"].startswith("baseline")
                                                  else "")) for r in rows if r.get("ndim") == d and r.get("time_ms")]
        for dtype in _DTYPES:
            sel = [r for r in mine if r["dtype"] == dtype]
            if sel:
                panels.append(drv.panel(sel, "bytes", "time_ms", "series",
                                        f"{d}-D FFT {dtype}, {nranks} ranks (fftn-1rank: the ceiling)", "array bytes",
                                        "time (ms, median)"))
    bars = [r for r in rows if r.get("time_ms") and r["impl"] != "fftn-1rank"]
    title = f"FFT time by phase, {nranks} ranks"
    panels.append({"title": title, "draw": lambda ax: draw_breakdown(ax, bars, title)})
    return panels


def draw_breakdown(ax: Any, rows: list[dict], title: str) -> None:
    """Stacked bars of FFT / transpose / communication time on ``ax``, one bar per scheme and case."""
    bars = [r for r in rows if "skipped" not in r and r.get("time_ms")]
    if not bars:
        raise ConfigError(f"plot {title!r}: no measured rows")
    labels = [f"{r['impl']}\n{r['case']} {r['dtype']}" for r in bars]
    bottom = np.zeros(len(bars))
    for key, name in (("fft_ms", "FFT"), ("transpose_ms", "local transpose"),
                      ("comm_ms", "communication (transposing put: transpose included)")):
        vals = np.array([float(r.get(key) or 0.0) for r in bars])
        ax.bar(range(len(bars)), vals, bottom=bottom, label=name)
        bottom += vals
    ax.plot(range(len(bars)), [r["time_ms"] for r in bars], "k_", markersize=20, label="median total")
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(labels, fontsize=6, rotation=90)
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=7)
