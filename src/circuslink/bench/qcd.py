"""Lattice QCD CG per iteration by halo exchange and grid, and the single-rank dslash bandwidth:
``circuslink bench qcd``.

Rows:

* ``dslash`` (one rank, no halos): one hop ``D_{eo}`` on the ``--bw-dim`` lattice, single and double
  precision; ``bandwidth_GBps`` by the traffic model of docs/qcd.md (per output site 8 neighbour spinors of
  24 reals, 8 links of 18 reals, 1 spinor written: 360 reals) and ``copy_ratio`` against the probe's local
  copy bandwidth of the same run (the floor).
* one row per halo exchange and grid (``--halos`` x ``--grids``, local lattice ``--dim``): the time of one CG
  iteration on the even-odd normal equations (4 hops, 2 global reductions, the vector updates), median and
  minimum over ``--samples`` loops (the slowest rank's time, each loop's clock started after a device-side
  handshake of every rank: ``_driver.handshake``), the share of it spent waiting on halos
  (host-side waits; device-driven exchanges show ~0), GFLOP/s by QUDA's count (2,832 flops per site per
  iteration), and the job's seconds outside the timed loops (``compile_s``, ``setup_s``, ``warmup_s``,
  ``measure_s``). Each configuration runs as its own job (under mpirun for the MPI exchanges), so an
  exchange that cannot run here becomes a skipped row with its reason.

A timed loop (a sample) is as many operations as last 2 ms, at least 10 and at most ``--iters``: a 32^4 hop
takes a quarter of a millisecond, so 100 of them a sample only made the run long. The gauge fields are a
Haar-random block of at most 8^4, tiled (``_bench_gauge``).
* in each such row, where the iteration's time goes: ``dslash_us``, ``halo_us``, ``reduction_us`` and
  ``vector_us`` per iteration (apps/qcd/_phases.py), from ``--samples`` more loops with the split switched
  on: CUDA events on the stream on the cuda back-end (the GPU's timeline, idle gaps included, so a stream
  waiting on a halo or a global sum shows as halo or reduction time), the host clock on cpu. Marking costs
  a little, so those loops' own time is ``timed_iter_us``, beside the unmarked ``time_per_iter_us``.

``--cg host,device`` adds the device-resident CG (``apps/qcd/_solver.py``: alpha, beta and |r|^2 never leave
the device, the host looks every ``--check-every`` iterations; where the halos need no host those iterations
are one resident kernel, whose split comes from block 0's globaltimer stamps), with ``cg`` in each row; the
summary gives its ratio to the host-driven loop.

``--lattices 16,32`` (global lattices, ``L`` for L^4 or ``XxYxZxT``) runs the same global lattice on every
grid (strong scaling: the local lattice is the global one divided by the grid) instead of ``--dim`` per rank.

Targets (one GPU, ranks under MPS; the TCA paper's QUDA CG on RMA halos against MPI-3 RMA): dslash bandwidth
>= 0.7 x the local copy; at 16^4 global on 2 ranks (``--lattices 16 --grids 2x1x1x1``), circuslink's RMA in its
fastest CG loop <= 0.45 x MPI-3 RMA in its own and no slower than NVSHMEM (the same ratios at 8^4 local on a 2x2
grid are printed too, without a verdict). The device-resident CG, single precision: on one rank 8^4 <= 60 us an
iteration and 32^4 <= 3.0 x one full 32^4 dslash (two hops of the bandwidth row, same run); the same global
lattice on 2x1x1x1 and 2x2x1x1 <= 1.25 x the one-rank time at 32^4 and <= 1.5 x at 16^4. The summary prints a
verdict line per target it has rows for.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from ..errors import ConfigError

_HALOS = "rma,rma-device,transport,mpi-p2p,mpi-rma,nvshmem,nccl"
_GRIDS = "1x1x1x1,2x1x1x1,2x2x1x1"
_FAILED_TAIL_CHARS = 16000  # of a failed configuration's stderr, echoed to the bench's own
_KAPPA = 0.2  # CG needs ~140 iterations to 1e-12 on a hot 8^4 field: loops of 100 stay far from round-off
_REALS_PER_SITE = 8 * 24 + 8 * 18 + 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _driver as drv

    drv.add_common_arguments(parser, default_sizes="8", default_nranks=4, default_iters=100, default_warmup=10)
    parser.add_argument("--halos", default=_HALOS, help=f"halo exchanges to compare (default {_HALOS})")
    parser.add_argument("--grids", default=_GRIDS,
                        help=f"rank grids PXxPYxPZxPT, comma-separated (default {_GRIDS}; 2x2x1x1 is the headline)")
    parser.add_argument("--dim", nargs=4, type=int, default=[8, 8, 8, 8], metavar=("X", "Y", "Z", "T"),
                        help="local lattice per rank (default 8 8 8 8)")
    parser.add_argument("--prec", default="single", help="single, double or both: single,double (default single)")
    parser.add_argument("--samples", type=int, default=10, help="timed loops of --iters iterations (default 10)")
    parser.add_argument("--lattices", default=None,
                        help="global lattices run on every grid (strong scaling), comma-separated: L (L^4) or "
                             "XxYxZxT, e.g. 16,32; replaces --dim (the local lattice per rank)")
    parser.add_argument("--bw-dim", nargs=4, type=int, default=None, metavar=("X", "Y", "Z", "T"),
                        help="lattice of the single-rank dslash bandwidth rows (default 32^4 on cuda, 8^4 on cpu)")
    parser.add_argument("--cg", default="host",
                        help="host, device or both: host,device (default host). device: the device-resident CG "
                             "(alpha, beta, |r|^2 on the device, the host looking every --check-every iterations; "
                             "those iterations are one resident kernel where the halos need no host)")
    parser.add_argument("--check-every", type=int, default=10,
                        help="iterations between the host's looks in the device-resident CG (default 10)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a configuration's job: its JSON file


def _grids(text: str) -> list[tuple[int, int, int, int]]:
    out = []
    for tok in text.split(","):
        parts = tok.strip().lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"--grids {text!r}: bad grid {tok.strip()!r} (expected PXxPYxPZxPT, e.g. 2x2x1x1)")
        out.append(tuple(int(p) for p in parts))
    return out


def _lattices(text: str | None) -> list[tuple[int, int, int, int]]:
    if not text:
        return []
    out = []
    for tok in text.split(","):
        parts = tok.strip().lower().split("x")
        if len(parts) == 1:
            parts = parts * 4
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"--lattices {text!r}: bad lattice {tok.strip()!r} (expected L or XxYxZxT, e.g. 32)")
        out.append(tuple(int(p) for p in parts))
    return out


def _local_dims(lattice: tuple, grid: tuple) -> tuple:
    """The local lattice of ``grid`` for a global one (refused in one line where the grid does not divide it)."""
    if any(n % g for n, g in zip(lattice, grid, strict=True)):
        raise ConfigError(f"--lattices: grid {'x'.join(map(str, grid))} does not divide the lattice "
                          f"{'x'.join(map(str, lattice))}")
    return tuple(n // g for n, g in zip(lattice, grid, strict=True))


def _list(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        what = ", ".join(bad) or "empty list"
        raise ConfigError(f"{option} {text!r}: unknown {what} (choose from {', '.join(allowed)})")
    return items


def run(args: argparse.Namespace) -> int:
    from ..apps.qcd._halo import HALO_EXCHANGES
    from ..apps.qcd._lattice import check_local
    from ..apps.qcd._operator import PRECISIONS

    if args.worker:
        return _worker(args)
    grids = _grids(args.grids)
    halos = _list(args.halos, HALO_EXCHANGES, "--halos")
    precs = _list(args.prec, tuple(PRECISIONS), "--prec")
    args.cg_modes = _list(args.cg, ("host", "device"), "--cg")
    check_local(args.dim, "--dim")
    args.lattice_list = _lattices(args.lattices)
    for lattice in args.lattice_list:
        for grid in grids:
            check_local(_local_dims(lattice, grid), "--lattices (local lattice)")
    if args.samples < 1:
        raise ConfigError(f"--samples {args.samples} must be at least 1")
    if args.check_every < 1:
        raise ConfigError(f"--check-every {args.check_every} must be at least 1")
    _check_memory(args, grids)
    from . import _driver as drv

    with drv.text_to_stderr(args):  # the configurations' jobs print too
        return _driver(args, grids, halos, precs)


def _check_memory(args: argparse.Namespace, grids: list) -> None:
    """The largest configuration's memory need, checked before anything runs (as qcd invert does)."""
    import os

    from ..apps.qcd.cli import check_memory
    from ..backends import default_backend_name

    backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
    grid = max(grids, key=lambda g: int(np.prod(g)))
    for local in [tuple(args.dim)] + [_local_dims(lat, grid) for lat in _lattices(args.lattices)]:
        check_memory("bench qcd", {"local": local, "global": tuple(d * p for d, p in zip(local, grid, strict=True)),
                                   "nranks": int(np.prod(grid)), "backend": backend},
                     "use a smaller local lattice (--dim, --lattices) or fewer ranks (--grids)")


# -- the outer process: floor, bandwidth rows, one job per configuration -------------------------------------
def _driver(args: argparse.Namespace, grids: list, halos: list[str], precs: list[str]) -> int:
    import circuslink

    from .. import launcher, probe
    from ..apps.qcd._halo import NEEDS_GPU
    from . import _driver as drv

    world = circuslink.init(args.backend)
    iters, warmup, samples = args.iters, args.warmup, args.samples
    if args.quick:
        iters, warmup, samples = min(iters, 20), min(warmup, 2), min(samples, 3)
    bw_dim = tuple(args.bw_dim) if args.bw_dim else ((32, 32, 32, 32) if world.device is not None else (8, 8, 8, 8))
    if args.quick and not args.bw_dim:
        bw_dim = (16, 16, 16, 16) if world.device is not None else (4, 4, 4, 4)
    results = drv.Results("qcd", world)
    drv.progress("qcd: measuring the floor (probe, local copy)")
    results.floor = probe.measure(world, quick=True)
    copy = float(np.median(results.floor["local_copy_GBps"])) if results.floor.get("local_copy_GBps") else None
    results.meta.update(dim=list(args.dim), grids=["x".join(map(str, g)) for g in grids], halos=halos, prec=precs,
                        iters=iters, warmup=warmup, samples=samples, kappa=_KAPPA, bw_dim=list(bw_dim),
                        reals_per_site_per_hop=_REALS_PER_SITE, flops_per_site_per_iteration=2832)
    fields = _bench_gauge(bw_dim, 1), _bench_spinor(bw_dim, 2)
    for prec in ("single", "double"):
        drv.progress(f"qcd: single-rank dslash bandwidth, {prec}, {'x'.join(map(str, bw_dim))}")
        results.add(**_dslash_bandwidth(world, bw_dim, fields, prec, iters, samples, copy))
    del fields
    backend = world.backend.name
    on_gpu = world.device is not None
    world.close()
    for lattice, cg, prec, grid in itertools.product(args.lattice_list or [None], args.cg_modes, precs, grids):
        nranks = int(np.prod(grid))
        dim = tuple(args.dim) if lattice is None else _local_dims(lattice, grid)
        for halo in (halos if nranks > 1 else ["none"]):
            gtext = "x".join(map(str, grid))
            why = (f"--halo {halo} needs the cuda back-end" if halo in NEEDS_GPU and not on_gpu
                   else "the device-resident CG runs double or single" if cg == "device" and prec == "half" else None)
            if why:
                results.add(impl=halo, bytes=0, grid=gtext, prec=prec, nranks=nranks, cg=cg, skipped=why)
                continue
            drv.progress(f"qcd: {halo} on grid {gtext}, {prec}, CG loop {cg}")
            results.extend(_configuration(args, backend, grid, dim, halo, prec, cg, iters, warmup, samples, launcher))

    def text() -> None:
        drv.print_table(results.rows, ["impl", "lattice", "grid", "prec", "cg", "time_per_iter_us", "time_us", "min_us",
                                       "dslash_us", "halo_us", "reduction_us", "vector_us", "gflops",
                                       "bandwidth_GBps", "copy_ratio", "compile_s", "setup_s", "warmup_s",
                                       "measure_s", "skipped"],
                        "qcd: CG iteration by halo exchange and grid; dslash bandwidth", args)
        _summary(results.rows)

    def draw(path: str) -> None:
        rows = [dict(r, series=f"{r['impl']} ({r['prec']}, CG loop {r.get('cg', 'host')})") for r in results.rows
                if r.get("time_per_iter_us") and r["impl"] != "dslash"]
        drv.plot(rows, x="nranks", y="time_per_iter_us", group="series", path=path, logx=False,
                 title=f"CG iteration, {'x'.join(map(str, args.dim))} local lattice per rank",
                 xlabel="ranks (grids " + ", ".join(results.meta["grids"]) + ")", ylabel="us per iteration")

    drv.finish(results, args, text, draw)
    return 0


def _summary(rows: list[dict]) -> None:
    """The targets' ratios, where the rows exist."""
    def find(impl: str, grid: str, prec: str, cg: str = "host") -> float | None:
        for r in rows:
            if (r.get("impl"), r.get("grid"), r.get("prec"), r.get("cg", "host").split()[0]) == (impl, grid, prec, cg) \
                    and r.get("time_per_iter_us"):
                return float(r["time_per_iter_us"])
        return None

    for prec, grid, impl in itertools.product(("single", "double"), ("1x1x1x1", "2x1x1x1", "2x2x1x1"),
                                              ("none", "rma", "rma-device")):
        host, device = find(impl, grid, prec), find(impl, grid, prec, "device")
        if host and device:
            print(f"{grid} {impl}, {prec}: device-resident CG / host-driven CG per iteration = {device / host:.3f}")
    for prec in ("single", "double"):
        ours, mpi, nvs = (find(i, "2x2x1x1", prec) for i in ("rma", "mpi-rma", "nvshmem"))
        if ours and mpi:
            print(f"2x2 grid, {prec}: rma / mpi-rma per iteration = {ours / mpi:.3f} (target <= 0.45)")
        if ours and nvs:
            print(f"2x2 grid, {prec}: rma / nvshmem per iteration = {ours / nvs:.3f} (target <= 1)")
    for r in rows:
        if r.get("impl") == "dslash" and r.get("copy_ratio"):
            print(f"dslash {r['prec']}: {r['bandwidth_GBps']:.1f} GB/s = {r['copy_ratio']:.2f} x the local copy "
                  "(target >= 0.7)")
    _halo_engine_verdicts(rows)
    _device_cg_verdicts(rows)


def _halo_engine_verdicts(rows: list[dict]) -> None:
    """The halo engines' targets at 16^4 global on 2 ranks (2x1x1x1), single precision, each engine in its fastest
    CG loop of the run (host-driven, device, device resident): circuslink's RMA (rma or rma-device) <= 0.45 x MPI-3
    RMA (TCA's 2.3 x) and <= 1 x NVSHMEM."""
    def best(impls: set[str]) -> float | None:
        times = [float(r["time_per_iter_us"]) for r in rows
                 if r.get("impl") in impls and (r.get("lattice"), r.get("grid"), r.get("prec")) ==
                 ("16x16x16x16", "2x1x1x1", "single") and r.get("time_per_iter_us")]
        return min(times) if times else None

    ours, mpi, nvs = best({"rma", "rma-device"}), best({"mpi-rma"}), best({"nvshmem"})
    if ours and mpi:
        _verdict("16^4 on 2x1x1x1: circuslink RMA / MPI-3 RMA per iteration", ours / mpi, 0.45)
    if ours and nvs:
        _verdict("16^4 on 2x1x1x1: circuslink RMA / NVSHMEM per iteration", ours / nvs, 1.0)


def _verdict(text: str, value: float, limit: float) -> None:
    print(f"{text} = {value:.3f} (target <= {limit:g}): {'met' if value <= limit else 'MISSED'}")


def _device_cg_verdicts(rows: list[dict]) -> None:
    """The device-resident CG's targets (single precision, medians of the slowest rank), where the rows exist."""
    def iteration(lattice: str, grid: str) -> float | None:
        for r in rows:
            if (r.get("lattice"), r.get("grid"), r.get("prec"), r.get("cg")) == \
                    (lattice, grid, "single", "device resident") and r.get("time_per_iter_us"):
                return float(r["time_per_iter_us"])
        return None

    one = iteration("8x8x8x8", "1x1x1x1")
    if one:
        _verdict("8^4 on 1 rank: device-resident CG us per iteration", one, 60.0)
    hop = next((float(r["time_us"]) for r in rows if r.get("impl") == "dslash" and r.get("prec") == "single"
                and r.get("lattice") == "32x32x32x32"), None)
    big = iteration("32x32x32x32", "1x1x1x1")
    if hop and big:
        _verdict("32^4 on 1 rank: CG iteration / one full dslash (2 hops)", big / (2 * hop), 3.0)
    for lattice, limit in (("32x32x32x32", 1.25), ("16x16x16x16", 1.5)):
        base = iteration(lattice, "1x1x1x1")
        for grid in ("2x1x1x1", "2x2x1x1"):
            t = iteration(lattice, grid)
            if base and t:
                _verdict(f"{lattice} on {grid} / on 1x1x1x1 per iteration", t / base, limit)


def _timer(world: Any):
    """(start, stop) -> seconds, on the GPU's clock where there is one."""
    if world.device is None:
        return time.perf_counter, lambda t0: time.perf_counter() - t0
    import cupy as cp

    def start():
        e = cp.cuda.Event()
        e.record()
        return e

    def stop(e0):
        e1 = cp.cuda.Event()
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) * 1e-3

    return start, stop


#: A timed sample runs at least this long (many operations: the clocks' resolution and a launch's jitter are
#: far below it) and at least _MIN_OPS operations; --iters caps the operations, so short ones run many.
_SAMPLE_S = 2e-3
_MIN_OPS = 10
#: The bench's gauge fields are a Haar-random block of at most this extent, tiled (bench_gauge).
_GAUGE_BLOCK = 8


def _ops_per_sample(seconds_one: float, most: int) -> int:
    """Operations per timed sample: enough for _SAMPLE_S, at least _MIN_OPS, at most ``most`` (--iters)."""
    want = int(np.ceil(_SAMPLE_S / seconds_one)) if seconds_one > 0 else most
    return max(1, min(most, max(_MIN_OPS, want)))


def _bench_gauge(dims: tuple, seed: int) -> np.ndarray:
    """A gauge field for timing: a Haar-random block of extent gcd(L, 8) per direction, tiled over ``dims``.
    The kernels' time does not depend on the links' values (no data-dependent control flow), and a 32^4
    Haar field takes numpy's QR of 4 million 3x3 matrices, seconds of host time per job."""
    from ..apps import qcd

    block = tuple(int(np.gcd(d, _GAUGE_BLOCK)) for d in dims)
    small = qcd.random_gauge(block, seed)
    reps = (1, *(d // b for d, b in zip(reversed(dims), reversed(block), strict=True)), 1, 1)  # mu, t, z, y, x
    return np.tile(small, reps)


def _bench_spinor(dims: tuple, seed: int) -> np.ndarray:
    from ..apps import qcd

    return qcd.random_spinor(dims, seed)


def _dslash_bandwidth(world: Any, dims: tuple, fields: tuple, prec: str, iters: int, samples: int,
                      copy: float | None) -> dict:
    from ..apps import qcd

    lat = qcd.Lattice(dims, (1, 1, 1, 1), 0)
    U, psi = fields
    op = qcd.WilsonOperator(world, lat, U, _KAPPA, prec)
    inp, _ = op.split(psi)
    out = op.zeros()
    start, stop = _timer(world)
    for _ in range(3):
        op.hop(out, inp, 0, False)
    t0 = start()
    for _ in range(3):
        op.hop(out, inp, 0, False)
    n = _ops_per_sample(stop(t0) / 3, iters)
    times = []
    for _ in range(samples):
        t0 = start()
        for _ in range(n):
            op.hop(out, inp, 0, False)
        times.append(stop(t0) / n)
    op.close()
    del inp, out
    if world.device is not None:
        import cupy as cp

        cp.get_default_memory_pool().free_all_blocks()
    t = float(np.median(times))
    real = 4 if prec == "single" else 8
    nbytes = lat.half * _REALS_PER_SITE * real
    bw = nbytes / t / 1e9
    return {"impl": "dslash", "bytes": nbytes, "grid": "1x1x1x1", "prec": prec, "lattice": "x".join(map(str, dims)),
            "time_us": t * 1e6, "min_us": min(times) * 1e6, "bandwidth_GBps": bw,
            "gflops": 1320 * lat.half / t / 1e9, "copy_ratio": bw / copy if copy else None,
            "local_copy_GBps": copy, "nranks": 1, "hops_per_sample": n, "samples": samples}


def _configuration(args: argparse.Namespace, backend: str, grid: tuple, dim: tuple, halo: str, prec: str, cg: str,
                   iters: int, warmup: int, samples: int, launcher: Any) -> list[dict]:
    from ..apps.qcd._halo import NEEDS_MPIRUN

    nranks = int(np.prod(grid))
    gtext = "x".join(map(str, grid))
    base = {"impl": halo, "bytes": 0, "grid": gtext, "prec": prec, "nranks": nranks, "cg": cg}
    fd, out = tempfile.mkstemp(prefix="circuslink-bench-qcd-", suffix=".json")
    os.close(fd)
    worker = [sys.executable, "-m", "circuslink", "bench", "qcd", "--worker", out, "--grids", gtext, "--halos",
              "rma" if halo == "none" else halo, "--prec", prec, "--dim", *map(str, dim), "--iters", str(iters),
              "--warmup", str(warmup), "--samples", str(samples), "--cg", cg, "--check-every", str(args.check_every)]
    env = dict(os.environ, CIRCUSLINK_BACKEND=backend, NCCL_NVLS_ENABLE="0", NVSHMEM_DISABLE_NVLS="1")
    if halo in NEEDS_MPIRUN:
        if not launcher.mpirun_available():
            return [dict(base, skipped="needs mpirun and mpi4py")]
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        if cores < 2 * nranks:
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        os.environ.update({k: env[k] for k in ("CIRCUSLINK_BACKEND", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS")})
        cmd = launcher.mpirun_command(nranks, worker)
    else:
        cmd = [sys.executable, "-m", "circuslink", "run", "-n", str(nranks), "--backend", backend, "--", *worker]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        rows = json.load(open(out)) if proc.returncode == 0 and os.path.getsize(out) else None
    except subprocess.TimeoutExpired:
        return [dict(base, skipped="did not finish within 900 s")]
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass
    if not rows:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        lines = [ln.split("] ", 1)[1] if ln.startswith("[") and "] " in ln else ln for ln in lines]  # rank tags
        errors = [ln for ln in lines if "error" in ln.lower() or "unavailable" in ln.lower()]
        why = (errors or lines or [f"exit code {proc.returncode}"])[0][-300:]
        # The tail shows every rank's last words (a stalled rank's stack dumps run to several KiB a rank).
        sys.stderr.write(proc.stderr[-_FAILED_TAIL_CHARS:])
        return [dict(base, skipped=why)]
    return rows


# -- a configuration's job ---------------------------------------------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    import circuslink

    from ..apps import qcd

    clock = time.perf_counter
    t0 = clock()
    world = circuslink.init(args.backend)
    grid = _grids(args.grids)[0]
    lat = qcd.Lattice(tuple(args.dim), grid, world.rank)
    spent = {"init_s": clock() - t0}
    row = measure_cg(world, lat, args.halos, args.prec, args.cg, args.iters, args.warmup, args.samples,
                     args.check_every, spent)
    if world.rank == 0:
        with open(args.worker, "w") as f:
            json.dump([row], f)
    world.barrier()
    if world.mpi_comm is not None:  # rank 0 hosts the store under mpirun: leave together (bench rma does the same)
        from .rma import _end_of_job

        _end_of_job(world)
    world.close()
    return 0


def measure_cg(world: Any, lat: Any, halo: str, prec: str, cg: str, iters: int, warmup: int, samples: int,
               check_every: int, spent: dict | None = None) -> dict:
    """Collective: the time of one CG iteration on ``lat`` (this rank's part of the grid) with halo exchange
    ``halo``, the host-driven loop or the device-resident one (``cg``): the results row of a configuration.

    Where the time goes outside the iterations is in the row too (seconds, rank 0's host clock): ``compile_s``
    (the dslash module, NVRTC or its cache), ``setup_s`` (fields, operator, the loops' machinery),
    ``warmup_s`` (the first --warmup iterations: the array library's first-use kernels, the resident kernel's
    loading) and ``measure_s`` (every timed loop); ``spent`` brings earlier ones (``init_s``)."""
    from ..apps import qcd
    from ..apps.qcd import _cgstate
    from ..apps.qcd._operator import EVEN, ODD
    from ..apps.qcd._phases import NO_PHASES
    from ..apps.qcd._solver import _BatchedIterations
    from . import _driver as drv

    clock = time.perf_counter
    spent = dict(spent or {})
    t0 = clock()
    compile_kernels = getattr(world.backend_module("circuslink.apps.qcd"), "kernels", None)
    if compile_kernels is not None:  # a back-end module that compiles device code: its time apart from the setup
        compile_kernels("f" if prec == "single" else "d")
    spent["compile_s"] = clock() - t0
    t0 = clock()
    local, gdims = lat.local, lat.global_dims
    U = _bench_gauge(gdims, 1) if world.rank == 0 else None
    b = _bench_spinor(gdims, 2) if world.rank == 0 else None
    U_local = qcd.scatter(world, lat, U, qcd.gauge_shape(local), lead=1)
    b_local = qcd.scatter(world, lat, b, qcd.spinor_shape(local))
    del U, b
    op = qcd.WilsonOperator(world, lat, U_local, _KAPPA, prec, halo)
    b_e, b_o = op.split(b_local)
    rhs = op.zeros()
    op.pack(b_o, ODD, False)
    op.hop(rhs, b_o, EVEN, False, a=1.0, x=b_e, b=_KAPPA, emit=True)
    x, r, p, ap = op.zeros(), op.zeros(), op.zeros(), op.zeros()
    start, stop = _timer(world)
    device = cg == "device"
    # The device-resident loop: unmarked (timed), and marked for the split (a resident kernel stamps its phases
    # on block 0's clock).
    batched = {marked: _BatchedIterations(op, x, r, p, ap, 0.0, check_every, timed=marked)
               for marked in (False, True)} if device else {}
    book = np.zeros(_cgstate.SLOTS)
    op.synchronize()
    spent["setup_s"] = clock() - t0

    def iterations(n: int, marked: bool = False) -> float:
        """n CG iterations from a fresh start; returns seconds (this rank)."""
        x[...] = 0
        r[...] = rhs
        p[...] = rhs
        op.pack(p, EVEN, False)
        op.phases.mark(None)  # the split covers the timed iterations only, not this preparation
        rr = op.norm2(r)
        if device:
            it = batched[marked]
            it.restart(rr, 0.0, book)
        op.synchronize()
        world.barrier()
        op.phases.mark(None)
        met = drv.handshake(world)  # the clock starts once every rank's GPU is here
        t0 = start()
        if device:
            done = 0
            while done < n:  # the host looks every --check-every iterations: one wait each
                more, _ = it.run(n - done, book)
                if more == 0:
                    break
                done += more
        else:
            for _ in range(n):
                op.normal(ap, p)
                alpha = rr / op.redot(p, ap)
                rr_new = op.axpy_norm(x, r, p, ap, alpha)
                op.xpay_pack(p, r, rr_new / rr, EVEN, False)
                rr = rr_new
        op.phases.mark(None)
        seconds = stop(t0)
        if met is not None:
            met.check_device()
        return seconds

    t0 = clock()
    iterations(max(1, warmup))
    if device:
        iterations(max(1, warmup), marked=True)  # the marked kernel's first launch too
    spent["warmup_s"] = clock() - t0
    t0 = clock()
    # Iterations per sample: enough for _SAMPLE_S, within --iters (the slowest rank's calibration decides).
    calibration = iterations(max(1, warmup)) / max(1, warmup)
    n = _ops_per_sample(float(op.allreduce(world.xp.asarray(np.array([calibration])), op="max")[0]), iters)
    times, waits = [], []
    for _ in range(samples):
        w0 = op.halo_wait_seconds
        t = iterations(n)
        times.append(t / n)
        waits.append((op.halo_wait_seconds - w0) / t if t > 0 else 0.0)
    # The split: the same loops with every phase marked (events on the GPU's stream, the host clock on cpu).
    phases = op.new_phases()
    op.time_phases(phases)
    timed = [iterations(n, marked=True) / n for _ in range(samples)]
    split = phases.totals()
    for name, sec in (batched[True].device_split() if device else {}).items():
        split[name] = split.get(name, 0.0) + sec
    op.time_phases(NO_PHASES)
    names = sorted(split)
    # The slowest rank's split (per-phase maxima over ranks would not add up to anyone's iteration).
    mine = [split[n_] / (samples * n) for n_ in names] + [float(np.mean(timed))]
    per_iter_split = max(world.allgather_object(mine), key=lambda v: v[-1])
    slowest = op.allreduce(world.xp.asarray(np.array(times, dtype=np.float64)), op="max")
    share = float(np.median(op.allreduce(world.xp.asarray(np.array(waits, dtype=np.float64)), op="max")))
    spent["measure_s"] = clock() - t0
    t = float(np.median(slowest))
    volume = int(np.prod(gdims))
    face_bytes = 6 * op.dtype.itemsize * lat.face_total
    row = {"impl": halo if lat.face_total else "none", "bytes": face_bytes, "grid": "x".join(map(str, lat.grid)),
           "prec": prec, "nranks": world.size, "local": "x".join(map(str, local)),
           "lattice": "x".join(map(str, gdims)), "time_per_iter_us": t * 1e6, "min_us": float(slowest.min()) * 1e6,
           "halo_wait_share": share, "gflops": 2832 * volume / t / 1e9, "iters": n, "samples": samples,
           "launched_by": world.launched_by,
           **{f"{n_}_us": v * 1e6 for n_, v in zip(names, per_iter_split[:-1], strict=True)},
           "timed_iter_us": float(per_iter_split[-1]) * 1e6,
           "split_clock": ("globaltimer" if device and batched[True].resident is not None
                           else "cuda events" if world.device is not None else "host"),
           "cg": ("device resident" if batched[True].resident is not None else "device") if device else "host",
           "check_every": check_every if device else None, **spent}
    op.close()
    return row
