"""Routing tables and the deadlock check of a topology: ``circuslink route show|check TOPOLOGY``.

``route show TOPOLOGY`` prints every rank's table (``--rank R``: one rank's), ``--from A --to B`` the path
between two ranks with its links and virtual channels. ``route check TOPOLOGY`` builds the channel
dependency graph of all routes and prints ``acyclic: ...`` or one cycle. ``TOPOLOGY`` is ``ring:N``,
``line:N``, ``mesh:XxY``, ``torus:XxY``, ``full:N``, ``nodes:NxK``, ``nodes:Nx(INNER)[,gw=G|spread]`` or a file
(JSON or edge list, docs/routing.md). On topologies of nodes the tables say each hop's link kind (``mapped``
or ``network``) and the headings each rank's node and the nodes it is a gateway to.

Exit codes: 0 fine (acyclic), 1 a cycle was found, 2 bad input (one line naming the problem),
3 an internal error (a bug: please report it with the input).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from .._argtypes import output_file_or_stdout
from ..errors import Error
from . import LINK_KIND_NAMES, LINK_NETWORK, parse
from . import check as check_routing

EXIT_OK, EXIT_CYCLE, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="route_command", metavar="SUBCOMMAND")
    show = sub.add_parser("show", help="print the routing tables, or the path between two ranks",
                          description="Print every rank's routing table (next rank, out port, virtual channel, "
                                      "hops to go) or, with --from and --to, the path between two ranks.")
    check = sub.add_parser("check", help="check the channel dependency graph of all routes for a cycle",
                           description="Build the channel dependency graph of every route ((link, virtual "
                                       "channel) pairs, an edge where a route holds one and requests the "
                                       "next) and print 'acyclic: ...' (exit 0) or one cycle (exit 1).")
    for p in (show, check):
        p.add_argument("topology", metavar="TOPOLOGY",
                       help="ring:N, line:N, mesh:XxY, torus:XxY, full:N, nodes:NxK, nodes:Nx(INNER)[,gw=G|spread], "
                            "or a topology file (JSON or edge list)")
        p.add_argument("--vcs", type=int, default=None, metavar="N",
                       help="virtual channels: 1 or 2 on rings and tori (default 2, dateline), 1 on lines and "
                            "meshes, 1..max hops on graphs (default 1; more: hop classes); on nodes the inner "
                            "topology's count times 1 or 2 classes")
        p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE", type=output_file_or_stdout,
                       help="write the result as JSON to FILE; '-' or no FILE: to standard output instead of text")
    show.add_argument("--from", dest="src", default=None, metavar="A", help="path from node A (a name or rank)")
    show.add_argument("--to", dest="dst", default=None, metavar="B", help="path to node B (a name or rank)")
    show.add_argument("--rank", default=None, metavar="R", help="print only rank R's table")
    parser.set_defaults(_route_parser=parser)


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "route_command", None):
        args._route_parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return _show(args) if args.route_command == "show" else _check(args)
    except Error as exc:
        if os.environ.get("CIRCUSLINK_DEBUG"):
            raise
        print(f"circuslink: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback
        if os.environ.get("CIRCUSLINK_DEBUG"):
            raise
        print(f"circuslink: error: internal error on {args.topology!r}: {type(exc).__name__}: {exc} "
              "(a bug; CIRCUSLINK_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _routing(args: argparse.Namespace):
    topology = parse(args.topology)
    topology.check_connected()
    return topology.routing(args.vcs)


def _emit(args: argparse.Namespace, text: str, data: Callable[[], dict]) -> None:
    if args.json is None:
        print(text)
        return
    blob = json.dumps(data(), indent=1)
    if args.json == "-":
        print(blob)
        return
    print(text)
    try:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(blob + "\n")
    except OSError as exc:
        raise _error(f"--json {args.json}: cannot write: {exc.strerror or exc}") from None


def _error(message: str) -> Error:
    from ._model import TopologyError

    return TopologyError(message)


def _check(args: argparse.Namespace) -> int:
    result = check_routing(_routing(args))
    _emit(args, result.text(), result.to_dict)
    return EXIT_OK if result.acyclic else EXIT_CYCLE


def _show(args: argparse.Namespace) -> int:
    if (args.src is None) != (args.dst is None):
        raise _error("route show: give both --from A and --to B (or neither, for the tables)")
    if args.src is not None and args.rank is not None:
        raise _error("route show: --rank prints one rank's table; it does not go with --from/--to")
    r = _routing(args)
    t = r.topology
    if args.src is not None:
        src, dst = t.rank_of(args.src), t.rank_of(args.dst)
        hops = r.route(src, dst)
        lines = [f"{t.name}: rank {t.label(src)} -> rank {t.label(dst)}: {len(hops)} hop{'s' * (len(hops) != 1)} "
                 f"({r.algorithm}; {r.vcs} virtual channel{'s' * (r.vcs > 1)}, {r.scheme})"]
        for i, h in enumerate(hops, 1):
            lines.append(f"  hop {i}: {t.label(h.src)} -> {t.label(h.dst)}  link {h.link.id} "
                         f"{t.link_label(h.link)}  port {t.port_label(h.src, h.port)}  vc {h.vc}  "
                         f"{_carrier(h.link)}" + (f"  node {t.node_of(h.src)}" if t.has_nodes else ""))
        data = {"topology": t.name, "vcs": r.vcs, "vc_scheme": r.scheme, "src": src, "dst": dst,
                "hops": [{"src": h.src, "dst": h.dst, "link": h.link.id, "port": h.port, "vc": h.vc,
                          "kind": h.link.kind, "carrier": _carrier(h.link), "label": t.link_label(h.link)}
                         for h in hops]}
        _emit(args, "\n".join(lines), lambda: data)
        return EXIT_OK
    ranks = [t.rank_of(args.rank)] if args.rank is not None else list(range(t.size))
    kinds = t.has_nodes or any(k.network for k in t.links)
    lines = [t.describe(), f"routing: {r.describe().split(': ', 1)[1]}; table[rank][dst] = next rank, out port, "
             "virtual channel, hops to go" + (", link kind (mapped memory or the network)" if kinds else "")]
    named = any(name != str(i) for i, name in enumerate(t.names))
    for rank in ranks:
        lines.append("")
        lines.append(_rank_heading(t, rank))
        rows = [("dst", "next", "port", "vc", "hops") + (("kind",) if kinds else ())]
        for dst in range(t.size):
            if dst == rank:
                continue
            row = (t.names[dst] if named else str(dst), t.names[int(r.next[rank, dst])] if named
                   else str(int(r.next[rank, dst])), t.port_label(rank, int(r.port[rank, dst])),
                   str(int(r.vc[rank, dst])), str(int(r.hops[rank, dst])))
            if kinds:
                row += (_carrier(t.links[int(r.link[rank, dst])]) if r.link[rank, dst] >= 0 else "-",)
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    def data() -> dict:
        out = r.to_dict()
        if args.rank is not None:
            out.update(rank=ranks[0], **{key: out[key][ranks[0]] for key in ("next", "port", "vc", "hops")})
        return out

    _emit(args, "\n".join(lines), data)
    return EXIT_OK


def _rank_heading(t, rank: int) -> str:
    where = ""
    if t.is_grid and len(t.dims) > 1:
        from ._model import _dim_name

        where = " (" + ", ".join(f"{_dim_name(k)}={c}" for k, c in enumerate(t.coords(rank))) + ")"
    elif t.names[rank] != str(rank):
        where = f" ({t.names[rank]})"
    if t.has_nodes:
        node = t.node_of(rank)
        name = t.node_names[node]
        where += f" [node {node}" + (f" ({name})" if name != f"node{node}" else "")
        to = [b for b in range(len(t.nodes)) if b != node and t.gateway(node, b)[0] == rank]
        if to:
            where += f", gateway to node{'s' * (len(to) > 1)} {', '.join(map(str, to))}"
        where += "]"
    nbs = []
    for p, port in enumerate(t.ports[rank]):
        if port.peer < 0:
            continue
        arrows = ("" if port.out_link >= 0 else " in only") if port.in_link >= 0 else " out only"
        network = ", network" if port.kind == LINK_NETWORK else ""
        nbs.append(f"{t.names[port.peer]} ({t.port_label(rank, p)}{network}{arrows})")
    return f"rank {rank}{where}: neighbours {', '.join(nbs) if nbs else 'none'}"


def _carrier(link) -> str:
    """``mapped`` or ``network``: how a hop's packets cross its link."""
    return LINK_KIND_NAMES[link.kind_code]
