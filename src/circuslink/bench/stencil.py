"""The 2-D Jacobi stencil of examples/stencil, timed: ``circuslink bench stencil``.

What runs is the example's program itself (a user's fused kernel, written from docs/user-kernels.md), loaded
from ``examples/stencil`` of the source tree (``--example DIR``: another copy). One row per implementation,
element type, domain and rank count:

* ``channel-launch``, ``channel-persistent``: the example's device kernels, halos through channels from inside
  the kernel; two launches an iteration, or one launch for every iteration (back-ends that run kernels). The
  persistent rows' ``kernel``: "onchip" (one block holding a rank's block of cells in shared memory) where it
  fits one block's shared memory, else "grid"; ``--persistent-kernel grid`` or ``onchip`` asks for one (both the
  channel and the NVSHMEM stencil);
* ``host``: the example's host form, numpy (cupy on a GPU) steps and the host channel API: what the cpu
  back-end runs;
* ``mpi-host-staged``: the same compute (the example's kernels on a GPU, numpy on the cpu), the halos copied
  to the host and exchanged with MPI point-to-point (a job under mpirun);
* ``nvshmem``: rows ``nvshmem-launch`` and ``nvshmem-persistent``, the same stencil, layout and kernel structure
  with its halos through NVSHMEM put-with-signal (``baselines/nvshmem_stencil.cu``), run by rank 0 of the same
  job under mpirun with as many PEs as the job has ranks, so they share the GPU as the ranks do (MPS, the same
  share of SMs); checked bit for bit against the whole domain on one GPU up to ``--check-cells`` cells. Every
  channel row gets ``vs_nvshmem``: its time over the NVSHMEM row of the same form, type, domain and ranks.

Each row: ``time_per_iter_us`` (median over ``--samples`` loops of ``--iters`` steps, the slowest rank's, with
``min_us`` beside it; the persistent forms, channels and NVSHMEM alike, on the device's own clock inside the kernel
from iteration ``timed_from`` on: by then every rank has provably started, since a rank's iteration k waits for its
neighbours' halos of iteration k, so iteration ``nranks`` follows every rank's start; their ``event_us`` is the same
loop timed by events around the launch after a host barrier, which adds the ranks' launch skew, spread over the
loop; the other forms by events, or the host's clock), ``gcells_per_s`` (cells of the global domain updated a
second), and against one rank of the whole domain on the same device in the same run (a job of its own, the same
implementation family): ``vs_one_rank`` (time over that rank's time) and ``efficiency``, the strong-scaling
efficiency ``t_1 * devices_1 / (t_N * devices_N)`` (devices: GPUs the job uses, or ranks on the cpu; on one shared
GPU the ideal is 1, and the target "at most 1.2 x the one-rank time" is an efficiency of at least 0.83). Domains up
to ``--check-cells`` cells are also checked bit for bit against numpy. The floor (the probe in the largest job) is
in ``floor``; the persistent form's time at the smallest domain is printed against 6 x its relaxed store+poll
latency (exchanges in four directions at once plus the grid barrier).

Targets (one GPU, ranks under MPS): persistent at every size; 64x64 a rank at most 6 x the relaxed store+poll
floor; 8192x8192 on 2 and 4 ranks at most 1.2 x the one-rank time; channels no slower than NVSHMEM.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

IMPLS = ("channel-launch", "channel-persistent", "host", "mpi-host-staged", "nvshmem")
_KERNEL_IMPLS = {"channel-launch": "launch", "channel-persistent": "persistent"}
_DEFAULT_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "stencil"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _driver as drv

    drv.add_common_arguments(parser, default_sizes="8", default_nranks=2, default_iters=50, default_warmup=5)
    parser.add_argument("--domains", default="64x64,1024x1024,8192x8192",
                        help="global domains NXxNY, comma-separated (default 64x64,1024x1024,8192x8192); with "
                             "--per-rank, each rank's block instead")
    parser.add_argument("--per-rank", dest="per_rank", action="store_true",
                        help="--domains are a rank's blocks: the global domain grows with the rank count")
    parser.add_argument("--ranks", default=None,
                        help="rank counts to run, comma-separated (default: --nranks); one rank of the whole domain "
                             "always runs too")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"implementations (default {','.join(IMPLS)})")
    parser.add_argument("--dtypes", default="float32,float64", help="float32, float64 or both (default both)")
    parser.add_argument("--samples", type=int, default=10, help="timed loops of --iters steps (default 10)")
    parser.add_argument("--check-cells", dest="check_cells", type=int, default=1 << 20,
                        help="domains up to this many cells are checked bit for bit against numpy (default 1M)")
    parser.add_argument("--persistent-kernel", dest="persistent_kernel", choices=("auto", "grid", "onchip"),
                        default="auto", help="the persistent forms' kernel, channels and NVSHMEM alike: auto "
                                             "(default: on chip where a rank's block fits one block's shared "
                                             "memory, else on a grid), grid or onchip")
    parser.add_argument("--example", default=None, help="the examples/stencil folder to time (default: the source "
                                                         "tree's)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a job's JSON output


def _domains(text: str) -> list[tuple[int, int]]:
    out = []
    for tok in text.split(","):
        parts = tok.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"--domains {text!r}: bad domain {tok.strip()!r} (expected NXxNY, e.g. 1024x1024)")
        out.append((int(parts[0]), int(parts[1])))
    return out


def _list(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise ConfigError(f"{option} {text!r}: unknown {', '.join(bad) or 'empty list'} (choose from "
                          f"{', '.join(allowed)})")
    return items


def _rank_counts(text: str | None, default: int) -> list[int]:
    if text is None:
        return [default]
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--ranks {text!r}: expected rank counts such as 2,4") from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"--ranks {text!r}: rank counts must be positive")
    return counts


def load_example(path: str | None) -> Any:
    """The example's module (examples/stencil/stencil.py), imported from its folder."""
    root = Path(path) if path else _DEFAULT_EXAMPLE
    source = root / "stencil.py"
    if not source.is_file():
        raise ConfigError(f"bench stencil times the program of examples/stencil, which is not at {root} (a source "
                          "checkout has it; --example DIR names another copy)")
    spec = importlib.util.spec_from_file_location("circuslink_stencil_example", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args: argparse.Namespace) -> int:
    if args.worker:
        return _worker(args)
    impls = _list(args.impls, IMPLS, "--impls")
    dtypes = _list(args.dtypes, ("float32", "float64"), "--dtypes")
    domains = _domains(args.domains)
    counts = _rank_counts(args.ranks, args.nranks)
    if args.samples < 1:
        raise ConfigError(f"--samples {args.samples} must be at least 1")
    example = load_example(args.example)  # a missing example fails here, once, not in every job
    _check_memory(args, example, dtypes, domains, counts)
    return _driver(args, impls, dtypes, domains, counts)


# Bytes a rank holds per cell of its block, measured (host form, 4096x4096, peak resident): the step's source and
# result and the update's temporaries, about four blocks of the element type; the seed cells (float64) beside
# them while the block is made.
_BLOCKS_PER_RANK = 4
_SEED_BYTES_PER_CELL = 8


def _check_memory(args: argparse.Namespace, example: Any, dtypes: list[str], domains: list, counts: list[int]) -> None:
    """The largest job's memory need, checked before any job starts (as qcd invert and fft2 do): host memory on
    a back-end without kernels, else the GPU's for the blocks and the host's for their seed cells; domains small
    enough to check against numpy also hold the whole domain on every rank."""
    from .. import _sysinfo, mps
    from ..backends import default_backend_name, runs_kernels

    backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
    gpu = runs_kernels(backend)
    name = max(dtypes, key=lambda t: np.dtype(example.DTYPES[t]).itemsize)
    item = np.dtype(example.DTYPES[name]).itemsize
    for n in sorted({1, *counts}):
        for domain in domains:
            shape, grid, dims = _layout(n, example, domain, args.per_rank)
            local = (-(-shape[0] // dims[0]) + 2) * (-(-shape[1] // dims[1]) + 2)  # the largest block, ghosts too
            whole = shape[0] * shape[1] if shape[0] * shape[1] <= args.check_cells else 0
            what = f"bench stencil: the {name} domain {shape[0]}x{shape[1]} on {n} rank(s) ({grid})"
            advice = "use smaller --domains" + (" (with --per-rank, each rank's block)" if args.per_rank else "")
            host = n * (local * _SEED_BYTES_PER_CELL + 2 * whole * item)
            if gpu:
                gpus = max(1, mps.gpu_count())
                mps.require_gpu_memory({g: len(range(g, n, gpus)) * local * _BLOCKS_PER_RANK * item
                                        for g in range(min(gpus, n))}, what, advice)
            else:
                host += n * local * _BLOCKS_PER_RANK * item
            _sysinfo.require_memory(host, what, advice, shared=False)


# -- the outer process: one job per rank count (and one of one rank), rows merged -------------------------------
def _driver(args: argparse.Namespace, impls: list[str], dtypes: list[str], domains: list, counts: list[int]) -> int:
    import circuslink

    from .. import launcher
    from . import _driver as drv

    world = circuslink.init(args.backend)
    backend, runs_kernels = world.backend.name, world.backend.runs_kernels
    results = drv.Results("stencil", world)
    world.close()
    iters, warmup, samples = args.iters, args.warmup, args.samples
    if args.quick:
        iters, warmup, samples = min(iters, 10), min(warmup, 2), min(samples, 3)
    results.meta.update(domains=["x".join(map(str, d)) for d in domains], per_rank=args.per_rank, dtypes=dtypes,
                        impls=impls, ranks=counts, iters=iters, warmup=warmup, samples=samples)
    rows: list[dict] = []
    floor = None
    for n in sorted({1, *counts}):  # one rank of the whole domain is every row's baseline
        if not runs_kernels:
            rows += [{"impl": i, "bytes": 0, "nranks": n, "skipped": f"the {backend} back-end runs no device kernels"}
                     for i in impls if i in _KERNEL_IMPLS]
        if not runs_kernels and "nvshmem" in impls:
            rows.append({"impl": "nvshmem", "bytes": 0, "nranks": n,
                         "skipped": f"the {backend} back-end runs no device kernels"})
        mine = [i for i in impls if i in ("host", *((*_KERNEL_IMPLS, "nvshmem") if runs_kernels else ()))]
        if mine:
            drv.progress(f"stencil: {n} rank(s): {', '.join(mine)}")
            got, got_floor = _job(args, backend, n, mine, dtypes, domains, iters, warmup, samples, False, launcher)
            rows += got
            floor = got_floor or floor
        if "mpi-host-staged" in impls:
            drv.progress(f"stencil: {n} rank(s): mpi-host-staged")
            rows += _job(args, backend, n, ["mpi-host-staged"], dtypes, domains, iters, warmup, samples, True,
                         launcher)[0]
    _add_scaling(rows)
    _add_vs_nvshmem(rows)
    results.floor = floor or {}
    results.extend(rows)

    def report() -> None:
        drv.print_table(results.rows, ["impl", "dtype", "domain", "grid", "nranks", "kernel", "time_per_iter_us",
                                       "min_us", "gcells_per_s", "vs_one_rank", "efficiency", "vs_nvshmem",
                                       "checked", "skipped"], "stencil: 2-D 5-point Jacobi, time per iteration", args)
        _summary(results.rows, results.floor, runs_kernels)

    def plot(path: str) -> None:
        plotted = [dict(r, series=f"{r['impl']} {r['dtype']} {r['domain']}") for r in results.rows
                   if r.get("time_per_iter_us")]
        drv.plot(plotted, x="nranks", y="time_per_iter_us", group="series", path=path, logx=False,
                 title="2-D Jacobi stencil: time per iteration", xlabel="ranks", ylabel="us per iteration")

    drv.finish(results, args, report, plot)
    return 0


def _job(args: argparse.Namespace, backend: str, n: int, impls: list[str], dtypes: list[str], domains: list,
         iters: int, warmup: int, samples: int, mpi: bool, launcher: Any) -> tuple[list[dict], dict | None]:
    """Run one job of ``n`` ranks (under mpirun when ``mpi``); its rows, or one skipped row per impl saying why."""
    fd, out = tempfile.mkstemp(prefix="circuslink-bench-stencil-", suffix=".json")
    os.close(fd)
    worker = [sys.executable, "-m", "circuslink", "bench", "stencil", "--worker", out, "--impls", ",".join(impls),
              "--dtypes", ",".join(dtypes), "--domains", ",".join("x".join(map(str, d)) for d in domains),
              "--iters", str(iters), "--warmup", str(warmup), "--samples", str(samples),
              "--check-cells", str(args.check_cells), "--persistent-kernel", args.persistent_kernel] + \
             (["--per-rank"] if args.per_rank else []) + \
             (["--example", args.example] if args.example else [])
    env = dict(os.environ, CIRCUSLINK_BACKEND=backend)
    if mpi:
        if not launcher.mpirun_available():
            return [{"impl": i, "bytes": 0, "nranks": n, "skipped": "needs mpirun and mpi4py"} for i in impls], None
        cmd = launcher.mpirun_command(n, worker, env)
    else:
        cmd = [sys.executable, "-m", "circuslink", "run", "-n", str(n), "--backend", backend, "--", *worker]
    proc = None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        data = json.load(open(out)) if proc.returncode == 0 and os.path.getsize(out) else None
    except subprocess.TimeoutExpired:
        return [{"impl": i, "bytes": 0, "nranks": n, "skipped": "did not finish within 900 s"} for i in impls], None
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass
    if not data:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        lines = [ln.split("] ", 1)[1] if ln.startswith("[") and "] " in ln else ln for ln in lines]
        errors = [ln for ln in lines if "error" in ln.lower()]
        why = (errors or lines or [f"exit code {proc.returncode}"])[0][-300:]
        sys.stderr.write(proc.stderr[-2000:])
        return [{"impl": i, "bytes": 0, "nranks": n, "skipped": why} for i in impls], None
    return data["rows"], data.get("floor")


def _add_scaling(rows: list[dict]) -> None:
    """``vs_one_rank`` and ``efficiency`` of every timed row against the one-rank row of its family, type and
    global domain (the channel forms and the host form compare with their own one-rank runs)."""
    one = {(r["impl"], r["dtype"], r["domain"]): r for r in rows if r.get("nranks") == 1 and r.get("time_per_iter_us")}
    for r in rows:
        if not r.get("time_per_iter_us"):
            continue
        base = one.get((r["impl"], r["dtype"], r["domain"]))
        if base is None:
            continue
        r["vs_one_rank"] = r["time_per_iter_us"] / base["time_per_iter_us"]
        r["efficiency"] = (base["time_per_iter_us"] * base["devices"]) / (r["time_per_iter_us"] * r["devices"])


def _add_vs_nvshmem(rows: list[dict]) -> None:
    """``vs_nvshmem`` of every timed channel row: its time over the NVSHMEM row of the same form, type, domain and
    rank count (both measured in the same job)."""
    peer = {(r["impl"], r.get("dtype"), r.get("domain"), r.get("nranks")): r for r in rows
            if r.get("impl", "").startswith("nvshmem-") and r.get("time_per_iter_us")}
    for r in rows:
        form = _KERNEL_IMPLS.get(r.get("impl"))
        base = peer.get((f"nvshmem-{form}", r.get("dtype"), r.get("domain"), r.get("nranks"))) if form else None
        if base is not None and r.get("time_per_iter_us"):
            r["vs_nvshmem"] = r["time_per_iter_us"] / base["time_per_iter_us"]


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _summary(rows: list[dict], floor: dict, runs_kernels: bool = True) -> None:
    """The targets' ratios and verdicts, where the rows exist. The targets are the device forms'; a back-end that
    runs no kernels skips those rows, and gets no verdict on them."""
    if not runs_kernels:
        return
    lat = (floor.get("summary") or {}).get("lat_relaxed_us")
    for r in rows:
        if r.get("impl") == "channel-persistent" and r.get("time_per_iter_us") and r.get("nranks", 1) > 1:
            if lat and r.get("local") == "64x64":
                ratio = r["time_per_iter_us"] / lat
                print(f"persistent ({r.get('kernel', '?')} kernel), 64x64 a rank, {r['nranks']} ranks, {r['dtype']}: "
                      f"{r['time_per_iter_us']:.2f} us = "
                      f"{ratio:.1f} x the relaxed store+poll floor ({lat:.3f} us; target <= 6): {_verdict(ratio <= 6)}")
            if r.get("domain") == "8192x8192" and r.get("vs_one_rank"):
                print(f"persistent, 8192x8192, {r['nranks']} ranks, {r['dtype']}: {r['vs_one_rank']:.2f} x the "
                      f"one-rank time (target <= 1.2): {_verdict(r['vs_one_rank'] <= 1.2)}")
    persistent = [r for r in rows if r.get("impl") == "channel-persistent" and r.get("nranks", 1) > 1]
    if persistent:
        ran = [r for r in persistent if r.get("time_per_iter_us")]
        print(f"persistent form ran at {len(ran)} of {len(persistent)} sizes x rank counts x types (target: every "
              f"one): {_verdict(len(ran) == len(persistent))}")
    compared = [r for r in rows if r.get("vs_nvshmem")]
    for r in compared:
        print(f"{r['impl']}, {r['domain']}, {r['nranks']} ranks, {r['dtype']}: {r['vs_nvshmem']:.2f} x the NVSHMEM "
              f"stencil's time (target <= 1.0): {_verdict(r['vs_nvshmem'] <= 1.0)}")
    if compared:
        worst = max(compared, key=lambda r: r["vs_nvshmem"])
        print(f"channels vs NVSHMEM, worst: {worst['vs_nvshmem']:.2f} x ({worst['impl']}, {worst['domain']}, "
              f"{worst['nranks']} ranks, {worst['dtype']}; target <= 1.0 at every size): "
              f"{_verdict(worst['vs_nvshmem'] <= 1.0)}")


# -- one job ----------------------------------------------------------------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    import circuslink

    from .. import probe

    world = circuslink.init(args.backend)
    example = load_example(args.example)
    impls = _list(args.impls, IMPLS, "--impls")
    floor = None
    if world.size > 1 and impls != ["mpi-host-staged"]:
        floor = probe.measure(world, quick=True, pairs=[(0, 1), (1, 0)])
    module = example.compile_kernels() if world.backend.runs_kernels else None
    seed = world.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 31)))
    devices = len({d for d in world.allgather_object(world.device)}) if world.device is not None else world.size
    rows = []
    dtypes = _list(args.dtypes, ("float32", "float64"), "--dtypes")
    for local_or_global in _domains(args.domains):
        for name in dtypes:
            for impl in impls:
                if impl != "nvshmem":
                    rows.append(_measure(world, example, module, impl, name, local_or_global, args, seed, devices))
    if "nvshmem" in impls and world.backend.runs_kernels:
        rows += _nvshmem_rows(world, example, args, dtypes, devices)
    if world.rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"rows": rows, "floor": floor}, f)
    world.close()
    return 0


def _layout(nranks: int, example: Any, domain: tuple[int, int], per_rank: bool) -> tuple[tuple[int, int], str,
                                                                                        list[int]]:
    """The global domain, its process grid ``mesh:PXxPY`` and ``[PX, PY]`` for ``domain`` (a rank's block when
    ``per_rank``)."""
    shape = domain
    grid = example.process_grid(nranks, shape)
    dims = [int(v) for v in grid.split(":")[1].split("x")]
    if per_rank:
        shape = (domain[0] * dims[0], domain[1] * dims[1])
    return shape, f"mesh:{dims[0]}x{dims[1]}", dims


def _nvshmem_rows(world: Any, example: Any, args: argparse.Namespace, dtypes: list[str], devices: int) -> list[dict]:
    """The NVSHMEM stencil at every domain, run by rank 0 with as many PEs as the job has ranks while the others
    wait; its rows, or one skipped row saying why it could not run."""
    from . import baselines

    rows: list[dict] = []
    world.barrier()
    if world.rank == 0:
        layouts = [_layout(world.size, example, d, args.per_rank) for d in _domains(args.domains)]
        try:
            rows = baselines.nvshmem_stencil(world.size, [(shape, tuple(dims)) for shape, _, dims in layouts],
                                             dtypes=dtypes, iters=args.iters, warmup=args.warmup,
                                             samples=args.samples, check_cells=args.check_cells,
                                             persistent_kernel=args.persistent_kernel, timeout=600)
        except Exception as exc:  # a baseline that cannot run is reported, not fatal
            rows = [{"impl": "nvshmem", "bytes": 0, "nranks": world.size, "skipped": f"{type(exc).__name__}: {exc}"}]
        for r in rows:
            r.setdefault("devices", devices)
    world.barrier(timeout=3600)  # the others wait while rank 0 runs the NVSHMEM program
    return rows


def _measure(world: Any, example: Any, module: Any, impl: str, name: str, domain: tuple[int, int],
             args: argparse.Namespace, seed: int, devices: int) -> dict:
    """Time one implementation on one domain; check it against numpy where the domain is small enough."""
    from ..channels._halo import split_extent
    from . import _driver as drv

    shape, grid, dims = _layout(world.size, example, domain, args.per_rank)
    local = (split_extent(shape[0], dims[0], 0)[1], split_extent(shape[1], dims[1], 0)[1])  # the largest block
    halo_bytes = 2 * (local[0] + local[1]) * np.dtype(example.DTYPES[name]).itemsize if world.size > 1 else 0
    row = {"impl": impl, "bytes": halo_bytes, "dtype": name, "domain": f"{shape[0]}x{shape[1]}", "grid": grid,
           "nranks": world.size,
           "local": f"{local[0]}x{local[1]}", "devices": devices, "iters": args.iters, "samples": args.samples}
    u0 = example.initial(shape, example.DTYPES[name], seed) if shape[0] * shape[1] <= args.check_cells else None
    stepper = _Stepper(world, example, module, impl, grid, shape, name, u0, seed, args.persistent_kernel)
    try:
        if impl == "channel-persistent":
            # Each rank's kernel for its own block (uneven blocks may differ; the exchange is the same in both):
            # the row names rank 0's. A rank whose block cannot run the kernel asked for skips the row on all.
            try:
                mine = (stepper.run.persistent_kernel(stepper.form), None)
            except ConfigError as exc:
                mine = (None, str(exc))
            everyone = world.allgather_object(mine)
            refused = [why for _, why in everyone if why]
            if refused:
                row["skipped"] = refused[0]
                return row
            row["kernel"] = everyone[0][0]
        stepper.steps(args.warmup)
        times, events = [], []
        for _ in range(args.samples):
            world.barrier()
            loop = stepper.steps(args.iters)
            events.append(loop / args.iters)
            times.append(stepper.run.seconds_per_step() if impl == "channel-persistent" else loop / args.iters)
        slowest = drv.slowest_rank(world, times)
        t = float(np.median(slowest))
        row.update(time_per_iter_us=t * 1e6, min_us=min(slowest) * 1e6, gcells_per_s=shape[0] * shape[1] / t / 1e9)
        if impl == "channel-persistent":
            row.update(event_us=float(np.median(drv.slowest_rank(world, events))) * 1e6,
                       timed_from=stepper.timed_from(args.iters))
        if u0 is not None:
            got = stepper.gathered()
            steps = args.warmup + args.samples * args.iters
            if world.rank == 0:
                want = example.reference(u0, steps)[1:-1, 1:-1]
                if got.tobytes() != want.tobytes():
                    raise ConfigError(f"stencil {impl} {name} {row['domain']} on {grid}: the result differs from "
                                      f"numpy's after {steps} steps")
            row["checked"] = True
    finally:
        stepper.close()
    return row


class _Stepper:
    """One implementation's state on this rank: its block (with ghosts), its halo or MPI neighbours, its kernels."""

    def __init__(self, world: Any, example: Any, module: Any, impl: str, grid: str, shape: tuple[int, int],
                 dtype_name: str, u0: np.ndarray | None, seed: int, persistent_kernel: str = "auto") -> None:
        import circuslink as cl

        self.world, self.example, self.impl, self.shape = world, example, impl, shape
        # the example's form: "persistent" picks its kernel by the block's size; the others ask for one
        self.form = _KERNEL_IMPLS.get(impl)
        if self.form == "persistent" and persistent_kernel != "auto":
            self.form = f"persistent-{persistent_kernel}"
        self.halo = None
        if impl == "mpi-host-staged":
            self.halo = _Grid(world, grid)
        else:
            self.halo = cl.channels.open_halo(world, grid, example.C_TYPES[dtype_name], depth=2 * max(shape))
        if u0 is None:  # too large to hold whole on every rank: this rank's block, from its own seeded cells
            bx, by = self.halo.block(shape)
            rng = np.random.default_rng([seed, world.rank])
            block = rng.random((bx.stop - bx.start + 2, by.stop - by.start + 2)).astype(example.DTYPES[dtype_name])
        else:
            block = example.local_block(self.halo, u0)
        self.run = None
        if impl in _KERNEL_IMPLS or (impl == "mpi-host-staged" and module is not None):
            self.run = example.KernelRun(world, self.halo, block, module)
        self.u = block if self.run is None else None

    def steps(self, n: int) -> float:
        """``n`` steps; the seconds they took: on the GPU's clock (events around the launches) for the device
        forms, on the host's for the host-driven ones."""
        w = self.world
        if self.impl in _KERNEL_IMPLS:
            start, stop = w.xp.cuda.Event(), w.xp.cuda.Event()
            start.record(self.run.stream)
            # the persistent forms stamp the device's clock (none to stamp in a loop of no steps, a --warmup 0)
            timed = self.form != "launch" and n > 0
            self.run.steps(n, self.form, timed_from=self.timed_from(n) if timed else None)
            stop.record(self.run.stream)
            self.run.wait(f"the stencil's {self.impl} steps on rank {w.rank}")
            return w.xp.cuda.get_elapsed_time(start, stop) * 1e-3
        t0 = time.perf_counter()
        if self.impl == "host":
            self.u = self.example.run_host(self.halo, self.u, n)
            if w.backend.runs_kernels:
                w.backend.wait_stream(w.xp.cuda.get_current_stream(), None,
                                      f"the stencil's host steps on rank {w.rank}")
        else:
            for _ in range(n):
                self._mpi_step()
            if self.run is not None:
                w.backend.wait_stream(self.run.stream, None, f"the stencil's compute on rank {w.rank}")
        return time.perf_counter() - t0

    def timed_from(self, n: int) -> int:
        """The first iteration of ``n`` the persistent kernels' device clock counts: the job's rank count (at
        least the process grid's diameter plus one, after which every rank has started), within the loop."""
        return min(self.world.size, n - 1)

    def _mpi_step(self) -> None:
        """Halos to the host, MPI point-to-point with the neighbours, back; then one step of the same compute."""
        w, ex = self.world, self.example
        if self.run is not None:  # a GPU: the example's kernels step; only the halos go through the host
            u = self.run.bufs[self.run.current]
            w.backend.wait_stream(self.run.stream, None, f"the stencil's compute on rank {w.rank}")
            edges = {d: ex.edge(u, d).get() for d in self.halo.directions}
        else:
            u = self.u
            edges = {d: np.ascontiguousarray(ex.edge(u, d)) for d in self.halo.directions}
        halos = self.halo.exchange_mpi(edges)
        for d, cells in halos.items():
            u[ex.ghost_index(d)] = w.xp.asarray(cells) if self.run is not None else cells
        if self.run is not None:
            self.run.steps(1, "launch")  # its halo handle has no neighbours: block 0's warps only skip the exchange
        else:
            v = u.copy()
            v[1:-1, 1:-1] = ex.cell_update(u[:-2, 1:-1], u[2:, 1:-1], u[1:-1, :-2], u[1:-1, 2:])
            self.u = v

    def gathered(self) -> np.ndarray | None:
        u = self.run.result if self.run is not None else self.u
        return self.example.gather(self.world, self.halo, u, self.shape)

    def close(self) -> None:
        if self.halo is not None:
            self.halo.close()


class _Grid:
    """The MPI baseline's view of the process grid: the halo's geometry (blocks, neighbours) without channels."""

    def __init__(self, world: Any, grid: str) -> None:
        from .. import topology
        from ..channels._halo import Halo, neighbours

        if world.mpi_comm is None:
            raise ConfigError("the mpi-host-staged stencil needs a job started by mpirun")
        topo = topology.parse(grid)
        self.world, self.channels = world, None
        self._geometry = Halo(world, None, topo, tuple(topo.dims), False, "mpi")
        self._peers = neighbours(topo.dims, False, world.rank)
        self.directions = self._geometry.directions
        self.block = self._geometry.block

    def exchange_mpi(self, edges: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        from ..channels._halo import opposite

        comm, lock = self.world.mpi_comm, self.world.mpi_lock
        got = {d: np.empty_like(e) for d, e in edges.items()}
        with lock:
            reqs = [comm.Irecv(got[d], source=self._peers[d], tag=opposite(d)) for d in self.directions]
            reqs += [comm.Isend(np.ascontiguousarray(edges[d]), dest=self._peers[d], tag=d) for d in self.directions]
        from .._wait import wait_until

        def done() -> bool:
            with lock:
                return all(r.Test() for r in reqs)

        wait_until(done, None, f"the MPI halo exchange of rank {self.world.rank}")
        return got

    def device_handle(self) -> np.void:
        from ..channels._halo import HALO

        return HALO.pack(present=0, dims=2)  # the kernels' halo: no neighbours (MPI moves the halos)

    def close(self) -> None:
        return None
