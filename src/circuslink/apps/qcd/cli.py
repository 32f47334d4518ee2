"""circuslink qcd: the Wilson-Dirac CG inverter (``invert``, as QUDA's invert_test), the operator (``apply``) and
the plaquette of a configuration file (``plaquette``).

``circuslink qcd invert --dim 8 8 8 8 --gridsize 2 2 1 1 --prec double --prec-sloppy single --halo rma`` solves
M x = b (``--dim`` the lattice of each rank, ``--gridsize`` the grid of ranks, as QUDA's tests take them) on a
random Haar gauge field and a random source, or on ``--load-gauge FILE`` (ILDG / SciDAC LIME, NERSC or .npy,
checked and its plaquette printed) and ``--source b.npy``, and prints QUDA's figures: iterations, iterated and
true residual, GFLOPS, seconds, and where an iteration's time goes. ``circuslink qcd apply --load-gauge FILE
--input psi.npy [--dagger] --output out.npy`` applies the distributed M (or M^dagger) once; ``circuslink qcd
plaquette FILE`` reads and checks a configuration and prints its plaquette.

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

from ..._argtypes import non_negative_int, output_file, output_file_or_stdout, positive_float, positive_int
from ...errors import ConfigError
from ._halo import HALO_EXCHANGES, NEEDS_GPU, NEEDS_MPIRUN
from ._lattice import check_local, fmt, local_from_global
from ._operator import PRECISIONS
from ._phases import PHASES
from ._solver import DEFAULT_DELTA, FLOPS_PER_SITE_CG, ConvergenceError, check_sloppy

_STATUS_ENV = "CIRCUSLINK_QCD_STATUS"  # where rank 0 leaves its verdict for the command that started the job
KAPPA_DEFAULT = 0.12
# Memory per lattice site, measured with margin (qcd invert on cpu, 16^4 on one rank: 5.2 KB a site resident):
# every rank's local fields (the gauge field in both precisions, the source and the CG's vectors, halos) ...
_LOCAL_BYTES_PER_SITE = 4096
# ... and rank 0's whole-lattice fields (the generated gauge field and its temporaries, the source, the gathered
# solution, the reference operator of --verify).
_GLOBAL_BYTES_PER_SITE = 3840
_PHASE_WORDS = {"dslash": "dslash", "halo": "halo", "reduction": "reductions", "vector": "vector updates"}


class _OneLineParser(argparse.ArgumentParser):
    """A bad option value is one line (``circuslink: error: qcd invert: argument --seed: ...``), exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"circuslink: error: {self.prog.removeprefix('circuslink ')}: {message}\n")


class _GaugeOption(argparse.Action):
    """``--load-gauge`` and its alias ``--gauge``: the value, and which spelling was used (for messages)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.gauge_option = option_string


# -- options ------------------------------------------------------------------------------------------
def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be finite")
    return value


def _delta(text: str) -> float:
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie between 0 and 1")
    return value


def _common(p: argparse.ArgumentParser, precisions: tuple[str, ...], prec_help: str) -> None:
    p.add_argument("--gridsize", "--grid", dest="grid", nargs=4, type=positive_int, metavar=("PX", "PY", "PZ", "PT"),
                   default=[1, 1, 1, 1],
                   help="ranks in x, y, z and t (default 1 1 1 1; --grid is an alias); the job has PX*PY*PZ*PT ranks")
    p.add_argument("--dim", nargs=4, type=positive_int, metavar=("X", "Y", "Z", "T"), default=None,
                   help="the lattice of EACH rank, as QUDA's --dim (default 8 8 8 8, or the files' lattice over "
                        "the grid); every extent even; the global lattice is --dim times --gridsize")
    p.add_argument("--prec", choices=precisions, default="double", help=prec_help)
    p.add_argument("--halo", choices=HALO_EXCHANGES, default="rma",
                   help="halo exchange: rma (circuslink RMA queue, host-driven), rma-device (the dslash kernel "
                        "drives the queue; cuda), transport (Connections to the neighbours, chosen by capability), "
                        "mpi-p2p (MPI persistent send/recv; mpirun), mpi-rma "
                        "(MPI-3 RMA; mpirun), nvshmem (cuda), nccl (cuda, one GPU per rank). Default rma")
    mass = p.add_mutually_exclusive_group()
    mass.add_argument("--kappa", type=_float, default=KAPPA_DEFAULT,
                      help=f"hopping parameter kappa of M = 1 - kappa D (default {KAPPA_DEFAULT})")
    mass.add_argument("--mass", type=_float, default=None,
                      help="bare quark mass instead of --kappa: kappa = 1 / (2 mass + 8)")
    p.add_argument("--load-gauge", "--gauge", dest="load_gauge", action=_GaugeOption, metavar="FILE", default=None,
                   help="gauge configuration: ILDG / SciDAC LIME, NERSC (4D_SU3_GAUGE, 4D_SU3_GAUGE_3x3) or .npy "
                        "U[mu, t, z, y, x, a, b], the format read from the file; checksums and header checked, "
                        "plaquette printed (--gauge is an alias)")
    p.add_argument("--save-gauge", metavar="FILE", default=None, type=output_file,
                   help="write the gauge field used (loaded or random) as an ILDG file (64-bit, with the "
                        "scidac-checksum and ildg-format records)")
    p.add_argument("--seed", type=non_negative_int, default=1,
                   help="seed of the random gauge field and source, 0 or more (default 1)")
    p.add_argument("-n", "--nranks", type=positive_int, default=None,
                   help="ranks to start (default: the grid's; must equal PX*PY*PZ*PT)")
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                   help="back-end (default: cuda when a GPU is present, else cpu)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="qcd_command", metavar="ACTION", parser_class=_OneLineParser)
    inv = sub.add_parser("invert", help="solve M x = b with CG on the even-odd normal equations (QUDA invert_test)",
                         description="Solve M x = b (Wilson-Dirac, QUDA conventions) with mixed-precision CG on the "
                                     "even-odd preconditioned normal equations over a grid of ranks.")
    _common(inv, ("double", "single"), "precision of the solution and of the reliable updates (default double)")
    inv.add_argument("--prec-sloppy", choices=tuple(PRECISIONS), default=None,
                     help="precision of the CG iterations (default: --prec); half is QUDA's 16-bit fixed point "
                          "with a norm per site, emulated (float32 arithmetic)")
    inv.add_argument("--reliable-delta", type=_delta, default=DEFAULT_DELTA,
                     help=f"reliable update when the iterated residual has dropped by this factor (default "
                          f"{DEFAULT_DELTA}, QUDA's)")
    inv.add_argument("--cg", choices=("host", "device"), default="host",
                     help="host: the host reads alpha, beta and |r|^2 at every reduction (default); device: they "
                          "stay on the device (global sums on the device; on the cpu back-end the same algorithm with "
                          "the host collectives), the host looks every --check-every iterations, and those "
                          "iterations are one resident kernel where the halos need no host (one rank, rma-device)")
    inv.add_argument("--check-every", type=positive_int, default=10,
                     help="--cg device: iterations between the host's looks at the residual (default 10)")
    inv.add_argument("--tol", type=positive_float, default=1e-7,
                     help="stop when the true relative residual |b - M x| / |b| is below this (default 1e-7)")
    inv.add_argument("--niter", type=positive_int, default=1000, help="most CG iterations (default 1000)")
    inv.add_argument("--no-split", action="store_true",
                     help="do not mark the phases of each iteration (dslash, halo, reductions, vector updates: a "
                          "CUDA event each on cuda, a few microseconds of host time per mark)")
    inv.add_argument("--verify", action="store_true",
                     help="recompute |b - M x| / |b| on rank 0 with the one-rank reference operator (numpy)")
    inv.add_argument("--source", metavar="b.npy", default=None,
                     help="source b[t, z, y, x, spin, colour] (complex; default: Gaussian from --seed)")
    inv.add_argument("--output", metavar="x.npy", default=None, type=output_file,
                     help="write the solution x (complex128)")
    inv.add_argument("--json", metavar="FILE", nargs="?", const="-", default=None, type=output_file_or_stdout,
                     help="write the results row (JSON, the one results format) to FILE; '-' or no FILE: to standard "
                          "output")
    app = sub.add_parser("apply", help="apply the distributed M (or M^dagger) once to a field from a file",
                         description="Apply the distributed Wilson-Dirac operator M (or M^dagger) once.")
    _common(app, tuple(PRECISIONS), "precision of the operator: double, single or half (emulated; default double)")
    app.add_argument("--input", metavar="psi.npy", required=True, help="spinor psi[t, z, y, x, spin, colour]")
    app.add_argument("--output", metavar="out.npy", required=True, type=output_file,
                     help="where to write M psi (complex128 in double precision, complex64 in single and half)")
    app.add_argument("--dagger", action="store_true", help="apply M^dagger = gamma_5 M gamma_5 instead")
    plaq = sub.add_parser("plaquette", help="read and check a gauge configuration file; print its plaquette",
                          description="Read a gauge configuration (ILDG / SciDAC LIME, NERSC or .npy), check it "
                                      "(checksums, header) and print its average plaquette.")
    plaq.add_argument("file", metavar="FILE", help="the configuration")


# -- checks before anything starts ---------------------------------------------------------------------
def kappa_of(args: argparse.Namespace) -> float:
    """kappa = 1 / (2 mass + 8) from --mass, else --kappa (default KAPPA_DEFAULT)."""
    if args.mass is not None:
        denominator = 2 * args.mass + 8
        if not denominator > 0:
            raise ConfigError(f"--mass {args.mass:g}: kappa = 1 / (2 mass + 8) needs mass > -4")
        return 1.0 / denominator
    kappa = args.kappa
    if not kappa > 0:
        raise ConfigError(f"--kappa {kappa:g} must be positive")
    return kappa


def _gauge_option(args: argparse.Namespace) -> str:
    return getattr(args, "gauge_option", None) or "--load-gauge"


def _plan(args: argparse.Namespace) -> dict:
    """Everything the ranks need, checked: global and local lattice, grid, files. Raises ConfigError."""
    from . import _gaugefile
    from ._io import peek

    grid = tuple(args.grid)
    nranks = int(np.prod(grid))
    if args.nranks is not None and args.nranks != nranks:
        raise ConfigError(f"-n {args.nranks} does not match the grid {fmt(grid)} ({nranks} ranks)")
    kappa = kappa_of(args)
    sloppy = None
    if args.qcd_command == "invert":
        sloppy = args.prec_sloppy or args.prec
        check_sloppy(args.prec, sloppy)
        if args.cg == "device" and sloppy == "half":
            raise ConfigError("--cg device runs --prec-sloppy double or single (half is emulated between kernels: "
                              "use --cg host)")
    if args.qcd_command == "apply" and args.load_gauge is None:
        raise ConfigError("qcd apply needs --load-gauge FILE (the gauge field to apply)")
    global_dims = None
    if args.dim is not None:
        local = check_local(args.dim, "--dim")
        global_dims = tuple(l * p for l, p in zip(local, grid, strict=True))
    if args.load_gauge is not None:
        option = _gauge_option(args)
        if _gaugefile.detect(args.load_gauge, option) == "npy":
            found = peek(args.load_gauge, option, "gauge", global_dims)
        else:
            found = _gaugefile.peek(args.load_gauge, option)
            if global_dims is not None and found != global_dims:
                dim = " ".join(map(str, args.dim))
                raise ConfigError(f"{option} {args.load_gauge}: lattice {fmt(found)}, but --dim {dim} on grid "
                                  f"{fmt(grid)} makes {fmt(global_dims)}")
        global_dims = global_dims or found
    source = args.input if args.qcd_command == "apply" else args.source
    if source is not None:
        found = peek(source, "--input" if args.qcd_command == "apply" else "--source", "spinor", global_dims)
        global_dims = global_dims or found
    if global_dims is None:
        global_dims = tuple(8 * p for p in grid)
    local = local_from_global(global_dims, grid)
    backend = (args.backend or os.environ.get("CIRCUSLINK_BACKEND") or "").lower() or None
    from ...backends import default_backend_name, runs_kernels

    backend = backend or default_backend_name()
    if args.halo in NEEDS_GPU and nranks > 1 and not runs_kernels(backend):
        raise ConfigError(f"--halo {args.halo} needs the cuda back-end (GPU memory); this job would run on {backend}")
    return {"grid": grid, "nranks": nranks, "global": tuple(global_dims), "local": tuple(local), "backend": backend,
            "kappa": kappa, "sloppy": sloppy}


def check_memory(command: str, plan: dict,
                 advice: str = "use a smaller lattice per rank (--dim); the global lattice is --dim times "
                               "--gridsize, so more ranks need more memory, not less") -> None:
    """Refuse, before any rank starts, a lattice this machine cannot hold (one line: the need and what is there).
    Every rank holds its local fields (in GPU memory on cuda), rank 0 the whole lattice's on the host."""
    from ... import _sysinfo, mps
    from ...backends import runs_kernels

    local_sites, global_sites = int(np.prod(plan["local"])), int(np.prod(plan["global"]))
    what = f"{command} on a {fmt(plan['global'])} lattice over {plan['nranks']} rank(s)"
    host = global_sites * _GLOBAL_BYTES_PER_SITE
    if runs_kernels(plan["backend"]):
        gpus = max(1, mps.gpu_count())
        per_gpu = {g: len(range(g, plan["nranks"], gpus)) * local_sites * _LOCAL_BYTES_PER_SITE
                   for g in range(min(gpus, plan["nranks"]))}
        mps.require_gpu_memory(per_gpu, what, advice)
    else:
        host += plan["nranks"] * local_sites * _LOCAL_BYTES_PER_SITE
    _sysinfo.require_memory(host, what, advice, shared=False)


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line that reproduces ``args`` (what each rank runs)."""
    out = ["qcd", args.qcd_command, "--gridsize", *map(str, args.grid), "--prec", args.prec, "--halo", args.halo,
           "--seed", str(args.seed)]
    out += ["--mass", repr(args.mass)] if args.mass is not None else ["--kappa", repr(kappa_of(args))]
    if args.backend:
        out += ["--backend", args.backend]
    if args.dim is not None:
        out += ["--dim", *map(str, args.dim)]
    if args.load_gauge is not None:
        out += [_gauge_option(args), args.load_gauge]
    if args.save_gauge is not None:
        out += ["--save-gauge", args.save_gauge]
    if args.qcd_command == "apply":
        out += ["--input", args.input, "--output", args.output]
        if args.dagger:
            out.append("--dagger")
        return out
    out += ["--tol", repr(args.tol), "--niter", str(args.niter), "--reliable-delta", repr(args.reliable_delta),
            "--cg", args.cg, "--check-every", str(args.check_every)]
    if args.prec_sloppy is not None:
        out += ["--prec-sloppy", args.prec_sloppy]
    for option in ("source", "output", "json"):
        value = getattr(args, option)
        if value is not None:
            out += [f"--{option}", value]
    if args.verify:
        out.append("--verify")
    if args.no_split:
        out.append("--no-split")
    return out


def _plaquette(args: argparse.Namespace) -> int:
    from . import _gaugefile

    cfg = _gaugefile.read(args.file, "")
    print(f"{args.file}: {cfg.describe()}")
    return 0


def run(args: argparse.Namespace) -> int:
    from ... import launcher

    if not getattr(args, "qcd_command", None):
        print("usage: circuslink qcd {invert,apply,plaquette} ... (circuslink qcd invert --help)", file=sys.stderr)
        return 2
    if args.qcd_command == "plaquette":
        return _plaquette(args)
    plan = _plan(args)
    if launcher.inside_job():
        return _run_rank(args, plan)
    if args.halo in NEEDS_MPIRUN and plan["nranks"] > 1 and not launcher.mpirun_available():
        raise ConfigError(f"--halo {args.halo} needs mpirun and mpi4py, which were not found")
    check_memory(f"qcd {args.qcd_command}", plan)
    for option in ("load_gauge", "save_gauge", "source", "input", "output", "json"):  # ranks run elsewhere
        value = getattr(args, option, None)
        if value not in (None, "-"):
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
        raise (ConfigError if status.get("kind") == "config" else ConvergenceError)(status["error"])
    return code


# -- inside the job --------------------------------------------------------------------------------------
class _Refused(Exception):
    """A check failed on rank 0 inside the job; every rank has the same message (it was broadcast)."""


def _run_rank(args: argparse.Namespace, plan: dict) -> int:
    import circuslink

    world = circuslink.init(args.backend)
    if world.size != plan["nranks"]:
        raise ConfigError(f"the grid {fmt(plan['grid'])} needs {plan['nranks']} ranks, this job has {world.size}")
    kind = "convergence"
    try:
        verdict = _apply(world, args, plan) if args.qcd_command == "apply" else _invert(world, args, plan)
    except _Refused as exc:
        verdict, kind = str(exc), "config"
    world.close()
    if verdict is None:
        return 0
    status_path = os.environ.get(_STATUS_ENV)
    if status_path:  # the command that started the job says it, in one line
        if world.rank == 0:
            with open(status_path, "w") as f:
                json.dump({"error": verdict, "kind": kind}, f)
        return 0
    if world.rank == 0:
        raise (ConfigError if kind == "config" else ConvergenceError)(verdict)
    return 1


def _fields(world: Any, args: argparse.Namespace, plan: dict, lattice: Any) -> tuple[np.ndarray, Any, Any, Any]:
    """(local gauge, local source, global gauge on rank 0, global source on rank 0). Rank 0 reads and checks
    the files and says what it loaded; a file that fails its checks ends the job on every rank (_Refused)."""
    from . import _gaugefile, _io
    from ._reference import gauge_shape, random_gauge, random_spinor, spinor_shape

    gdims, local = plan["global"], plan["local"]
    U = b = None
    error = None
    if world.rank == 0:
        try:
            if args.load_gauge:
                cfg = _gaugefile.read(args.load_gauge, _gauge_option(args))
                U = cfg.U
                print(f"gauge: {args.load_gauge}: {cfg.describe()}")
            else:
                U = random_gauge(gdims, args.seed)
                print(f"gauge: Haar-random {fmt(gdims)} from --seed {args.seed}: plaquette "
                      f"{_gaugefile.plaquette(U):.12f}")
            if args.save_gauge:
                _gaugefile.write_ildg(args.save_gauge, U)
                print(f"gauge: wrote {args.save_gauge} (ILDG, 64-bit)")
            source_file = args.input if args.qcd_command == "apply" else args.source
            b = _io.load(source_file) if source_file else random_spinor(gdims, args.seed + 1)
        except ConfigError as exc:
            error = str(exc)
    error = world.broadcast_object(error)
    if error:
        raise _Refused(error)
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
    op = WilsonOperator(world, lattice, U_local, plan["kappa"], args.prec, args.halo)
    out = op.apply(psi_local, dagger=args.dagger)
    full = _io.gather(world, lattice, out, spinor_shape(plan["global"]))
    if world.rank == 0:
        _io.save(args.output, full.astype(op.dtype))
        print(f"qcd apply: {'M^dagger' if args.dagger else 'M'} psi on {lattice.describe()}, kappa "
              f"{plan['kappa']:g}, {args.prec}, halo {args.halo}: wrote {args.output}")
    op.close()
    return None


def _invert(world: Any, args: argparse.Namespace, plan: dict) -> str | None:
    from ... import results
    from . import _io
    from ._lattice import Lattice
    from ._operator import WilsonOperator
    from ._reference import spinor_shape, wilson
    from ._solver import solve, warm_up

    kappa, sloppy_prec = plan["kappa"], plan["sloppy"]
    lattice = Lattice(plan["local"], plan["grid"], world.rank)
    U_local, b_local, U, b = _fields(world, args, plan, lattice)
    precise = WilsonOperator(world, lattice, U_local, kappa, args.prec, args.halo)
    sloppy = WilsonOperator(world, lattice, U_local, kappa, sloppy_prec, args.halo) if sloppy_prec != args.prec \
        else None
    # Warm up: a short solve meets every kernel the timed one meets (the array library compiles its own at first
    # use, the collectives open, halos connect, the resident kernel loads), none of which is the solve's time.
    check_every = args.check_every if args.cg == "device" else None
    source = world.xp.asarray(b_local)
    warm = warm_up(precise, source, sloppy=sloppy, check_every=check_every)
    res = solve(precise, source, args.tol, args.niter, sloppy=sloppy, delta=args.reliable_delta,
                progress=results.progress if world.rank == 0 else None,
                phases=None if args.no_split else precise.new_phases(), check_every=check_every)
    x = _io.gather(world, lattice, res.x, spinor_shape(plan["global"]))
    volume = int(np.prod(plan["global"]))
    per_iter = res.seconds / res.iterations if res.iterations else 0.0
    share = res.halo_wait_seconds / res.seconds if res.seconds > 0 else 0.0
    split = {name: res.phase_seconds[name] for name in PHASES if name in res.phase_seconds}
    verdict = None
    if world.rank == 0:
        mass = f", mass {args.mass:g}" if args.mass is not None else ""
        print(f"qcd invert: {lattice.describe()}, {world.size} rank(s), kappa {kappa:.10g}{mass}, precision "
              f"{args.prec}, sloppy {sloppy_prec}, CG loop {res.loop}, halo "
              f"{args.halo if lattice.face_total else 'none (one rank in every direction)'}, "
              f"back-end {world.backend.name}")
        word = "Convergence at" if res.converged else "No convergence after"
        print(f"CG: {word} {res.iterations} iterations, L2 relative residual: iterated = {res.iterated_residual:.6e}, "
              f"true = {res.true_residual:.6e} (requested = {args.tol:g}), {res.reliable_updates} reliable updates")
        print(f"Done: {res.iterations} iterations, iterated residual {res.iterated_residual:.6e}, true residual "
              f"{res.true_residual:.6e}, {res.gflops(volume):.4g} GFLOPS, {res.seconds:.6g} seconds")
        total = sum(split.values())
        parts = ", ".join(f"{_PHASE_WORDS[n]} {100 * v / total:.0f}%" for n, v in split.items()) if total else ""
        if parts:
            parts = f" ({parts})"
        print(f"per iteration: {per_iter * 1e3:.4g} ms{parts}; host waits on halos {100 * share:.1f}% of the time")
        stages = res.stage_seconds
        inside = ", made inside the resident kernel" if res.device_updates else ""
        each = stages["iterations"] / res.iterations * 1e6 if res.iterations else 0.0
        print(f"solve time: setup {stages['setup'] * 1e3:.4g} ms, iterations {stages['iterations'] * 1e3:.4g} ms "
              f"({each:.1f} us each, {res.reliable_updates} reliable updates{inside}), updates and checks by the "
              f"host {stages['updates'] * 1e3:.4g} ms, finish {stages['finish'] * 1e3:.4g} ms; warm-up before it "
              f"(first use: compilation, opening) {warm:.3g} s")
        if args.verify:
            check = float(np.linalg.norm(b - wilson(U, x, kappa)) / np.linalg.norm(b)) if np.any(b) else 0.0
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
            face_bytes = 6 * np.dtype(PRECISIONS[sloppy_prec]).itemsize * lattice.face_total  # 12 reals a site
            per_phase = {f"{n}_us": v / res.iterations * 1e6 if res.iterations else 0.0 for n, v in split.items()}
            if not split:  # not marked (--no-split)
                per_phase = dict.fromkeys((f"{n}_us" for n in PHASES), None)
            results_file.add(impl=args.halo if lattice.face_total else "none", bytes=int(face_bytes),
                             grid=fmt(plan["grid"]), local=fmt(plan["local"]), lattice=fmt(plan["global"]),
                             prec=args.prec, prec_sloppy=sloppy_prec, kappa=kappa, tol=args.tol,
                             iterations=res.iterations, iterated_residual=res.iterated_residual,
                             true_residual=res.true_residual, converged=res.converged, seconds=res.seconds,
                             time_per_iter_us=per_iter * 1e6, gflops=res.gflops(volume), halo_wait_share=share,
                             reliable_updates=res.reliable_updates, reliable_delta=args.reliable_delta,
                             cg=res.loop, check_every=args.check_every if args.cg == "device" else None,
                             device_updates=res.device_updates, warmup_s=warm,
                             **{f"{n}_s": v for n, v in res.stage_seconds.items()},
                             iteration_us=res.stage_seconds["iterations"] / res.iterations * 1e6
                             if res.iterations else None,
                             flops_per_site_per_iteration=FLOPS_PER_SITE_CG, **per_phase)
            path = results_file.write_json(args.json)
            if path != "-":
                print(f"results: {path}")
        if not res.converged:
            verdict = (f"qcd invert: no convergence within --niter {args.niter}: true relative residual "
                       f"{res.true_residual:.3e} > --tol {args.tol:g} after {res.iterations} iterations")
    for op in (precise, sloppy):
        if op is not None:
            op.close()
    return verdict
