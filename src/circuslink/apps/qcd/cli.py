"""circuslink qcd: the Wilson-Dirac CG inverter (``invert``, as QUDA's invert_test) and the operator (``apply``).

``circuslink qcd invert --dim 8 8 8 8 --grid 2 2 1 1 --prec single --halo rma`` solves M x = b on a random
Haar gauge field and a random source (or ``--gauge U.npy --source b.npy --output x.npy``) and prints the
iterations, the iterated and true relative residuals, the time, GFLOP/s (QUDA's flop counts), the time per
iteration and the share of it spent waiting on halos. ``circuslink qcd apply --gauge U.npy --input psi.npy
--kappa K [--dagger] --grid ... --output out.npy`` applies the distributed M (or M^dagger) once.

Started outside a job, the command checks its input, then starts the grid's ranks itself (under mpirun
when the halo exchange needs MPI) and reports their outcome in one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from typing import Any

import numpy as np

from ..._argtypes import positive_float as positive_float
from ..._argtypes import positive_int
from ...errors import ConfigError
from ._halo import HALO_EXCHANGES, NEEDS_GPU, NEEDS_MPIRUN
from ._lattice import check_local, fmt, local_from_global
from ._operator import PRECISIONS
from ._solver import FLOPS_PER_SITE_CG, ConvergenceError

_STATUS_ENV = "CIRCUSLINK_QCD_STATUS"  # where rank 0 leaves its verdict for the command that started the job


# -- options ------------------------------------------------------------------------------------------
def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be finite")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grid", nargs=4, type=positive_int, metavar=("PX", "PY", "PZ", "PT"), default=[1, 1, 1, 1],
                   help="ranks in x, y, z and t (default 1 1 1 1); the job has PX*PY*PZ*PT ranks")
    p.add_argument("--prec", choices=tuple(PRECISIONS), default="double",
                   help="precision of the operator (invert: of the CG passes; x and the residual stay double)")
    p.add_argument("--halo", choices=HALO_EXCHANGES, default="rma",
                   help="halo exchange: rma (circuslink RMA queue, host-driven), rma-device (the dslash kernel "
                        "drives the queue; cuda), transport (Connections to the neighbours, chosen by capability), "
                        "mpi-p2p (MPI persistent send/recv; mpirun), mpi-rma "
                        "(MPI-3 RMA; mpirun), nvshmem (cuda), nccl (cuda, one GPU per rank). Default rma")
    p.add_argument("--kappa", type=_float, default=None, help="hopping parameter kappa of M = 1 - kappa D")
    p.add_argument("-n", "--nranks", type=positive_int, default=None,
                   help="ranks to start (default: the grid's; must equal PX*PY*PZ*PT)")
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                   help="back-end (default: cuda when a GPU is present, else cpu)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="qcd_command", metavar="ACTION")
    inv = sub.add_parser("invert", help="solve M x = b with CG on the even-odd normal equations (QUDA invert_test)",
                         description="Solve M x = b (Wilson-Dirac, QUDA conventions) with CG on the even-odd "
                                     "preconditioned normal equations over a grid of ranks.")
    inv.add_argument("--dim", nargs=4, type=positive_int, metavar=("X", "Y", "Z", "T"), default=None,
                     help="local lattice of each rank (default 8 8 8 8, or the files' lattice over the grid); "
                          "every extent even")
    _common(inv)
    inv.add_argument("--tol", type=positive_float, default=1e-7,
                     help="stop when the true relative residual |b - M x| / |b| is below this (default 1e-7)")
    inv.add_argument("--niter", type=positive_int, default=1000, help="most CG iterations (default 1000)")
    inv.add_argument("--verify", action="store_true",
                     help="recompute |b - M x| / |b| on rank 0 with the one-rank reference operator (numpy)")
    inv.add_argument("--gauge", metavar="U.npy", default=None,
                     help="gauge field U[mu, t, z, y, x, a, b] (complex; default: Haar-random from --seed)")
    inv.add_argument("--source", metavar="b.npy", default=None,
                     help="source b[t, z, y, x, spin, colour] (complex; default: Gaussian from --seed)")
    inv.add_argument("--output", metavar="x.npy", default=None, help="write the solution x (complex128)")
    inv.add_argument("--seed", type=int, default=1, help="seed of the random gauge field and source (default 1)")
    inv.add_argument("--json", metavar="FILE", default=None, help="write the results row to FILE (JSON)")
    app = sub.add_parser("apply", help="apply the distributed M (or M^dagger) once to a field from a file",
                         description="Apply the distributed Wilson-Dirac operator M (or M^dagger) once.")
    app.add_argument("--gauge", metavar="U.npy", required=True, help="gauge field U[mu, t, z, y, x, a, b]")
    app.add_argument("--input", metavar="psi.npy", required=True, help="spinor psi[t, z, y, x, spin, colour]")
    app.add_argument("--output", metavar="out.npy", required=True,
                     help="where to write M psi (complex128 in double precision, complex64 in single)")
    app.add_argument("--dagger", action="store_true", help="apply M^dagger = gamma_5 M gamma_5 instead")
    _common(app)


# -- checks before anything starts ---------------------------------------------------------------------
def _plan(args: argparse.Namespace) -> dict:
    """Everything the ranks need, checked: global and local lattice, grid, files. Raises ConfigError."""
    from ._io import peek

    grid = tuple(args.grid)
    nranks = int(np.prod(grid))
    if args.nranks is not None and args.nranks != nranks:
        raise ConfigError(f"-n {args.nranks} does not match the grid {fmt(grid)} ({nranks} ranks)")
    if args.kappa is None:
        if args.qcd_command == "apply":
            raise ConfigError("qcd apply needs --kappa K")
        args.kappa = 0.12
    files = []
    if args.qcd_command == "apply":
        files = [("--gauge", args.gauge, "gauge"), ("--input", args.input, "spinor")]
    else:
        files = [(o, f, k) for o, f, k in (("--gauge", args.gauge, "gauge"), ("--source", args.source, "spinor"))
                 if f is not None]
    global_dims = None
    dim = getattr(args, "dim", None)
    if dim is not None:
        local = check_local(dim, "--dim")
        global_dims = tuple(l * p for l, p in zip(local, grid, strict=True))
    for option, path, kind in files:
        found = peek(path, option, kind, global_dims)
        global_dims = global_dims or found
    if global_dims is None:
        global_dims = tuple(8 * p for p in grid)
    local = local_from_global(global_dims, grid)
    backend = (args.backend or os.environ.get("CIRCUSLINK_BACKEND") or "").lower() or None
    if args.halo in NEEDS_GPU and nranks > 1:
        from ...backends import uses_gpus

        if not uses_gpus(backend):
            raise ConfigError(f"--halo {args.halo} needs the cuda back-end (GPU memory); this job would run on cpu")
    return {"grid": grid, "nranks": nranks, "global": tuple(global_dims), "local": tuple(local)}


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line that reproduces ``args`` (what each rank runs)."""
    out = ["qcd", args.qcd_command, "--grid", *map(str, args.grid), "--prec", args.prec, "--halo", args.halo,
           "--kappa", repr(args.kappa)]
    if args.backend:
        out += ["--backend", args.backend]
    if args.qcd_command == "apply":
        out += ["--gauge", args.gauge, "--input", args.input, "--output", args.output]
        if args.dagger:
            out.append("--dagger")
        return out
    if args.dim is not None:
        out += ["--dim", *map(str, args.dim)]
    out += ["--tol", repr(args.tol), "--niter", str(args.niter), "--seed", str(args.seed)]
    for option in ("gauge", "source", "output", "json"):
        value = getattr(args, option)
        if value is not None:
            out += [f"--{option}", value]
    if args.verify:
        out.append("--verify")
    return out


def run(args: argparse.Namespace) -> int:
    from ... import launcher

    if not getattr(args, "qcd_command", None):
        print("usage: circuslink qcd {invert,apply} ... (circuslink qcd invert --help)", file=sys.stderr)
        return 2
    plan = _plan(args)
    if launcher.inside_job():
        return _run_rank(args, plan)
    if args.halo in NEEDS_MPIRUN and plan["nranks"] > 1 and not launcher.mpirun_available():
        raise ConfigError(f"--halo {args.halo} needs mpirun and mpi4py, which were not found")
    for option in ("gauge", "source", "input", "output", "json"):  # ranks run elsewhere in the tree: absolute paths
        value = getattr(args, option, None)
        if value is not None:
            setattr(args, option, os.path.abspath(value))
    fd, status_path = tempfile.mkstemp(prefix="circuslink-qcd-", suffix=".json")
    os.close(fd)
    os.environ[_STATUS_ENV] = status_path
    try:
        code = launcher.relaunch_self(plan["nranks"], args.backend, argv=_argv(args),
                                      prefer_mpirun=args.halo in NEEDS_MPIRUN and plan["nranks"] > 1)
        try:
            with open(status_path) as f:
                status = json.load(f) if os.path.getsize(status_path) else {}
        except (OSError, json.JSONDecodeError):
            status = {}
    finally:
        os.environ.pop(_STATUS_ENV, None)
        try:
            os.unlink(status_path)
        except OSError:
            pass
    if code == 0 and status.get("error"):
        raise ConvergenceError(status["error"])
    return code


# -- inside the job --------------------------------------------------------------------------------------
def _run_rank(args: argparse.Namespace, plan: dict) -> int:
    import circuslink

    world = circuslink.init(args.backend)
    if world.size != plan["nranks"]:
        raise ConfigError(f"the grid {fmt(plan['grid'])} needs {plan['nranks']} ranks, this job has {world.size}")
    if args.qcd_command == "apply":
        _apply(world, args, plan)
        verdict = None
    else:
        verdict = _invert(world, args, plan)
    world.close()
    if verdict is None:
        return 0
    status_path = os.environ.get(_STATUS_ENV)
    if status_path:  # the command that started the job says it, in one line
        if world.rank == 0:
            with open(status_path, "w") as f:
                json.dump({"error": verdict}, f)
        return 0
    if world.rank == 0:
        raise ConvergenceError(verdict)
    return 1


def _fields(world: Any, args: argparse.Namespace, plan: dict, lattice: Any) -> tuple[np.ndarray, Any, Any, Any]:
    """(local gauge, local source, global gauge on rank 0, global source on rank 0)."""
    from . import _io
    from ._reference import gauge_shape, random_gauge, random_spinor, spinor_shape

    gdims, local = plan["global"], plan["local"]
    U = b = None
    if world.rank == 0:
        gauge_file = args.gauge
        source_file = args.input if args.qcd_command == "apply" else args.source
        U = _io.load(gauge_file) if gauge_file else random_gauge(gdims, args.seed)
        b = _io.load(source_file) if source_file else random_spinor(gdims, args.seed + 1)
    U_local = _io.scatter(world, lattice, U, gauge_shape(local), lead=1)
    b_local = _io.scatter(world, lattice, b, spinor_shape(local))
    return U_local, b_local, U, b


def _apply(world: Any, args: argparse.Namespace, plan: dict) -> None:
    from . import _io
    from ._lattice import Lattice
    from ._operator import WilsonOperator
    from ._reference import spinor_shape

    lattice = Lattice(plan["local"], plan["grid"], world.rank)
    U_local, psi_local, _, _ = _fields(world, args, plan, lattice)
    op = WilsonOperator(world, lattice, U_local, args.kappa, args.prec, args.halo)
    out = op.apply(psi_local, dagger=args.dagger)
    full = _io.gather(world, lattice, out, spinor_shape(plan["global"]))
    if world.rank == 0:
        _io.save(args.output, full.astype(op.dtype))
        print(f"qcd apply: {'M^dagger' if args.dagger else 'M'} psi on {lattice.describe()}, kappa {args.kappa:g}, "
              f"{args.prec}, halo {args.halo}: wrote {args.output}")
    op.close()


def _invert(world: Any, args: argparse.Namespace, plan: dict) -> str | None:
    from ... import results
    from . import _io
    from ._lattice import Lattice
    from ._operator import WilsonOperator
    from ._reference import spinor_shape, wilson
    from ._solver import solve

    lattice = Lattice(plan["local"], plan["grid"], world.rank)
    U_local, b_local, U, b = _fields(world, args, plan, lattice)
    precise = WilsonOperator(world, lattice, U_local, args.kappa, "double", args.halo)
    sloppy = WilsonOperator(world, lattice, U_local, args.kappa, "single", args.halo) if args.prec == "single" \
        else None
    # Warm up (device code compiles at first use; halos connect): not part of the timed solve.
    for op in (precise, sloppy):
        if op is not None:
            op.apply(np.zeros(spinor_shape(plan["local"]), dtype=complex))
    res = solve(precise, world.xp.asarray(b_local), args.tol, args.niter, sloppy=sloppy,
                progress=results.progress if world.rank == 0 else None)
    x = _io.gather(world, lattice, res.x, spinor_shape(plan["global"]))
    volume = int(np.prod(plan["global"]))
    per_iter = res.seconds / res.iterations if res.iterations else 0.0
    share = res.halo_wait_seconds / res.seconds if res.seconds > 0 else 0.0
    verdict = None
    if world.rank == 0:
        print(f"qcd invert: {lattice.describe()}, {world.size} rank(s), kappa {args.kappa:g}, precision {args.prec}, "
              f"halo {args.halo if lattice.face_total else 'none (one rank in every direction)'}, "
              f"back-end {world.backend.name}")
        word = "Convergence at" if res.converged else "No convergence after"
        print(f"CG: {word} {res.iterations} iterations, L2 relative residual: iterated = {res.iterated_residual:.6e}, "
              f"true = {res.true_residual:.6e} (requested = {args.tol:g})")
        print(f"Done: {res.iterations} iter / {res.seconds:.6g} secs = {res.gflops(volume):.4g} Gflops, "
              f"{per_iter * 1e3:.4g} ms per iteration, {100 * share:.1f}% of the time waiting on halos")
        if args.verify:
            check = float(np.linalg.norm(b - wilson(U, x, args.kappa)) / np.linalg.norm(b)) if np.any(b) else 0.0
            print(f"verify: |b - M x| / |b| = {check:.6e} with the one-rank reference operator "
                  f"({'ok' if check <= args.tol * 1.01 else 'ABOVE --tol'})")
            if res.converged and check > args.tol * 1.01:
                verdict = (f"qcd invert --verify: the reference operator gives |b - M x| / |b| = {check:.3e}, "
                           f"above --tol {args.tol:g}")
        if res.converged and args.output:
            _io.save(args.output, x.astype(np.complex128))
            print(f"wrote {args.output}")
        if args.json:
            results_file = results.Results("qcd-invert", world)
            face_bytes = 6 * np.dtype(PRECISIONS[args.prec]).itemsize * lattice.face_total  # 12 reals a site
            results_file.add(impl=args.halo if lattice.face_total else "none", bytes=int(face_bytes),
                        grid=fmt(plan["grid"]), local=fmt(plan["local"]), lattice=fmt(plan["global"]),
                        prec=args.prec, kappa=args.kappa, tol=args.tol, iterations=res.iterations,
                        iterated_residual=res.iterated_residual, true_residual=res.true_residual,
                        converged=res.converged, seconds=res.seconds, time_per_iter_us=per_iter * 1e6,
                        gflops=res.gflops(volume), halo_wait_share=share, passes=res.passes,
                        flops_per_site_per_iteration=FLOPS_PER_SITE_CG)
            print(f"results: {results_file.write_json(args.json)}")
        if not res.converged:
            verdict = (f"qcd invert: no convergence within --niter {args.niter}: true relative residual "
                       f"{res.true_residual:.3e} > --tol {args.tol:g} after {res.iterations} iterations")
    for op in (precise, sloppy):
        if op is not None:
            op.close()
    return verdict
