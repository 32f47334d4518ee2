"""The ``circuslink`` command.

Each sub-command lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up and owns the one error style: a
:class:`circuslink.Error` becomes one line ``circuslink: error: ...`` on stderr and exit
code 1, never a traceback (set ``CIRCUSLINK_DEBUG=1`` to see the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import Error

# (name, module, help). Modules are imported only when their command runs.
COMMANDS = [
    ("info", "circuslink.info", "versions, back-ends, GPUs and their peer-access / NVLink matrix"),
    ("run", "circuslink._run_command", "start N ranks on this machine: circuslink run -n N -- CMD ..."),
    ("mps", "circuslink.mps", "run a command (e.g. mpirun ...) with CUDA MPS arranged for ranks sharing a GPU"),
    ("probe", "circuslink.probe", "measure the physical floor between every pair of ranks"),
    ("gen", "circuslink.spec.codegen", "generate a CUDA header and host binding from a channel spec (app.xml)"),
    ("route", "circuslink.topology.command", "routing over a topology: show the tables and paths, check for deadlock"),
    ("qcd", "circuslink.apps.qcd.cli", "lattice QCD: Wilson-Dirac CG inverter (invert) and operator (apply)"),
    ("fft2", "circuslink.apps.fft.cli", "distributed 2-D FFT of a .npy file with transposing puts"),
    ("fft3", "circuslink.apps.fft.cli3", "distributed 3-D FFT of a .npy file (slabs or pencils) with transposing puts"),
]
BENCHMARKS = [
    ("pingpong", "circuslink.bench.pingpong", "channel pingpong against the floor, NCCL, NVSHMEM and MPI"),
    ("stream", "circuslink.bench.stream", "one-way streaming through a channel against the floor"),
    ("resources", "circuslink.bench.resources", "registers, shared memory, threads and ring memory channels take"),
    ("allreduce-like", "circuslink.bench.allreduce_like", "CIRCUS's allreduce-like pipeline"),
    ("allreduce", "circuslink.bench.allreduce", "channel all-reduce against NCCL"),
    ("rma", "circuslink.bench.rma", "persistent RMA queues against MPI-3 RMA, MPI persistent p2p and NCCL"),
    ("qcd", "circuslink.bench.qcd", "lattice QCD CG per iteration by halo exchange and grid; dslash bandwidth"),
    ("transpose", "circuslink.bench.transpose", "transposing put against contiguous put and local transpose + put"),
    ("fft", "circuslink.bench.fft", "distributed 2-D and 3-D FFT: transposing puts against the slab all-to-all"),
    ("hops", "circuslink.bench.hops", "latency and throughput by hop count over a topology (routed channels)"),
    ("nodes", "circuslink.bench.nodes", "transports between nodes: their own one-way, relays, routed channels"),
    ("stencil", "circuslink.bench.stencil", "2-D Jacobi stencil (examples/stencil): channels in the kernel, host, MPI"),
]


def _add_commands(sub, table) -> None:
    for name, module_name, help_text in table:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # a feature not built into this install
        if not hasattr(module, "add_arguments"):
            continue
        p = sub.add_parser(name, help=help_text, description=describe(module.__doc__ or help_text))
        module.add_arguments(p)
        p.set_defaults(_run=module.run)


def describe(doc: str) -> str:
    """A command's description: the first paragraph of its module's docstring, its lines joined (the first
    line alone would stop mid-sentence where the paragraph wraps)."""
    paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="circuslink",
        description="circuslink: direct GPU-to-GPU channels, RMA queues and transposing puts",
    )
    parser.add_argument("--version", action="version", version=f"circuslink {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_commands(sub, COMMANDS)
    bench = sub.add_parser("bench", help="benchmarks (ours against the floor and the baselines)")
    bench_sub = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    _add_commands(bench_sub, BENCHMARKS)
    bench.set_defaults(_run=lambda args: _missing(bench))
    return parser


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except Error as exc:  # raised by an option's type while argparse reads it: a usage error, in one line
        return _one_line(exc, 2)
    from .launcher import set_invocation

    set_invocation(argv)
    if not getattr(args, "_run", None):
        return _missing(parser)
    from .launcher import inside_job

    if getattr(args, "json", None) == "-" and inside_job():
        # --json -: in a rank, the results (Results.write_json, to the process's own stdout) are the only thing
        # on standard output; every other line the rank prints goes to standard error.
        sys.stdout = sys.stderr
    try:
        return int(args._run(args) or 0)
    except Error as exc:
        return _one_line(exc, 1)
    except KeyboardInterrupt:
        print("circuslink: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


def _one_line(exc: Error, code: int) -> int:
    """The one error style: ``circuslink: error: ...`` on stderr and ``code`` (CIRCUSLINK_DEBUG=1: the traceback)."""
    if os.environ.get("CIRCUSLINK_DEBUG"):
        raise exc
    print(f"circuslink: error: {exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
