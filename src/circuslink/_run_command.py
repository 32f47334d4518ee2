"""Start N ranks on this machine, one GPU each on the cuda back-end (by mpirun when declared nodes need a
transport between them that MPI starts)."""

from __future__ import annotations

import argparse

from .backends import BACKENDS
from .launcher import LAUNCHERS, launch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--nranks", type=int, required=True, metavar="N", help="number of ranks to start")
    p.add_argument("--backend", choices=BACKENDS, help="back-end for every rank (default: cuda if a GPU is there)")
    p.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                   help="ranks that share a GPU run under CUDA MPS: auto (default: reuse a running daemon or "
                        "start one for the job, else warn and time-slice), on (fail without MPS), off")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                   help="declare nodes of K consecutive ranks on this machine (node 0 = ranks 0..K-1, ...): memory "
                        "is mapped only inside a node, traffic between nodes takes a transport (--transport) through "
                        "gateway ranks; K must divide N (default: one node per host; sets "
                        "CIRCUSLINK_RANKS_PER_NODE, the variable to use under mpirun)")
    p.add_argument("--launcher", choices=LAUNCHERS, default=None,
                   help="who starts the ranks: auto (default, or CIRCUSLINK_LAUNCHER): mpirun when --ranks-per-node "
                        "declares several nodes and mpirun and mpi4py are installed (the mpi transport between nodes "
                        "needs a job started by mpirun), else circuslink itself; mpirun; circuslink")
    p.add_argument("--transport", default=None, metavar="NAME",
                   help="the transport between nodes (sets CIRCUSLINK_TRANSPORT for the ranks): default chosen by "
                        "capability, nvshmem when it is installed and the ranks run on GPUs, else mpi; "
                        "circuslink run prints the choice beside the nodes")
    p.add_argument("--tag-output", choices=("all", "others", "none"), default="all",
                   help="prefix output lines with [rank] (default: all)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the program each rank runs")


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return launch(args.nranks, command, backend=args.backend, tag_output=args.tag_output, mps_mode=args.mps,
                  ranks_per_node=args.ranks_per_node, via=args.launcher, transport=args.transport)
