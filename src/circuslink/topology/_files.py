"""Custom topologies: the JSON format, the text edge list, and the checks both share.

JSON (``.json``, or any file whose first character is ``{``)::

    {"nodes": ["a", "b", "c"],                  # names (strings or integers), ranks in order; or a count N
     "links": [["a", "b"], {"a": "b", "b": "c", "kind": "nvlink", "weight": 2}],
     "directed": false}                          # optional: links are bidirectional by default

A node may also be ``{"name": "a", "node": "host0"}`` (``"group"`` is the older name): the ranks of a
topology of nodes, with mapped links inside a node and ``kind=network`` links between nodes (their ends
are the gateways; see ``_nodes``).

Edge list (any other file)::

    # comment
    directed              # optional, before any link: links are one-way
    a b                   # a link (both ways unless directed)
    b c kind=network weight=4
    d                     # a node on its own line (declares it, e.g. to fix rank order)
    d node=host1          # ... and the node (host) it belongs to

Ranks follow first appearance, except that when every name is a plain non-negative integer the names are the
ranks (0..max). Every problem raises :class:`TopologyError` naming the file and the line (edge list) or the
JSON position (``links[3]``); malformed JSON names its line and column.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ._model import DEFAULT_LINK_KIND, MAX_LINKS, MAX_RANKS, NETWORK_KIND, Link, Topology, TopologyError

MAX_FILE_BYTES = 16 << 20
MAX_WEIGHT = 1e9  # path sums stay exact enough and finite
_JSON_KEYS = ("nodes", "links", "directed", "name", "description", "comment")
_NODE_KEYS = ("name", "node", "group")
_LINK_KEYS = ("a", "b", "kind", "weight", "transport")
_OPTION_KEYS = ("kind", "weight", "transport")
_NODE_OPTION_KEYS = ("node",)
_INT_NAME = re.compile(r"^(0|[1-9][0-9]*)$")


def load(path: str) -> Topology:
    """Read a topology file (JSON or edge list)."""
    try:
        if os.path.isdir(path):
            raise TopologyError(f"{path}: is a folder, not a topology file")
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded: a device file such as /dev/zero never ends
        if len(raw) > MAX_FILE_BYTES:
            raise TopologyError(f"{path}: too large for a topology file (at most {MAX_FILE_BYTES >> 20} MiB)")
    except FileNotFoundError:
        raise TopologyError(f"no such topology file {path!r} (nor a topology string such as torus:4x4)") from None
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read topology file: {exc.strerror or exc}") from None
    if b"\0" in raw:
        raise TopologyError(f"{path}: not a text file (it holds NUL bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise TopologyError(f"{path}:{line}: not UTF-8 text") from None
    if path.lower().endswith(".json") or text.lstrip().startswith(("{", "[")):
        return from_json(text, path)
    return from_edge_list(text, path)


# ---- JSON ---------------------------------------------------------------------------------------

def from_json(text: str, where: str = "<json>") -> Topology:
    """A topology from the JSON format (``where`` names the source in messages)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{where}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise TopologyError(f"{where}: not a topology: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise TopologyError(f"{where}: not valid JSON: {str(exc)[:100]}") from None
    if not isinstance(doc, dict):
        raise TopologyError(f"{where}: expected a JSON object {{\"nodes\": [...], \"links\": [...]}}, "
                            f"got a JSON {_json_type(doc)}")
    unknown = [k for k in doc if k not in _JSON_KEYS]
    if unknown:
        raise TopologyError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_JSON_KEYS)})")
    for key in ("nodes", "links"):
        if key not in doc:
            raise TopologyError(f"{where}: missing {key!r} (expected {{\"nodes\": [...], \"links\": [...]}})")
    directed = doc.get("directed", False)
    if not isinstance(directed, bool):
        raise TopologyError(f"{where}: 'directed' must be true or false, got {json.dumps(directed)[:40]}")
    name = doc.get("name", where)
    if not isinstance(name, str) or not name.strip():
        raise TopologyError(f"{where}: 'name' must be a non-empty string")

    nodes = doc["nodes"]
    groups: list[str | None] | None = None
    if isinstance(nodes, list):
        names: list[str] = []
        groups = []
        for i, entry in enumerate(nodes):
            group = None
            if isinstance(entry, dict):
                bad = [k for k in entry if k not in _NODE_KEYS]
                if bad:
                    raise TopologyError(f"{where}: nodes[{i}]: unknown key {bad[0]!r} (known: {', '.join(_NODE_KEYS)})")
                if "name" not in entry:
                    raise TopologyError(f"{where}: nodes[{i}]: missing 'name'")
                if "node" in entry and "group" in entry:
                    raise TopologyError(f"{where}: nodes[{i}]: give 'node' or 'group' (its older name), not both")
                key = "node" if "node" in entry else "group"
                group = entry.get(key)
                if group is not None and (not isinstance(group, str | int) or isinstance(group, bool)
                                          or not str(group).strip()):
                    raise TopologyError(f"{where}: nodes[{i}]: '{key}' must be a name, got "
                                        f"{json.dumps(group)[:40]}")
                group = None if group is None else str(group)
                entry = entry["name"]
            names.append(_node_name(entry, f"{where}: nodes[{i}]"))
            groups.append(group)
        if not any(g is not None for g in groups):
            groups = None
        node_arg: Any = names
    elif isinstance(nodes, int) and not isinstance(nodes, bool):
        node_arg = nodes
    else:
        raise TopologyError(f"{where}: 'nodes' must be a list of names or a count, got a JSON {_json_type(nodes)}")

    links = doc["links"]
    if not isinstance(links, list):
        raise TopologyError(f"{where}: 'links' must be a list, got a JSON {_json_type(links)}")
    edges = []
    for i, item in enumerate(links):
        at = f"{where}: links[{i}]"
        if isinstance(item, list):
            if len(item) != 2:
                raise TopologyError(f"{at}: a link is [a, b] or {{\"a\": .., \"b\": ..}}, got a list of {len(item)}")
            edges.append((item[0], item[1], DEFAULT_LINK_KIND, 1.0, at, None))
        elif isinstance(item, dict):
            bad = [k for k in item if k not in _LINK_KEYS]
            if bad:
                raise TopologyError(f"{at}: unknown key {bad[0]!r} (known: {', '.join(_LINK_KEYS)})")
            for end in ("a", "b"):
                if end not in item:
                    raise TopologyError(f"{at}: missing {end!r} (a link is {{\"a\": .., \"b\": ..}})")
            edges.append((item["a"], item["b"], item.get("kind", DEFAULT_LINK_KIND), item.get("weight", 1.0), at,
                          item.get("transport")))
        else:
            raise TopologyError(f"{at}: a link is [a, b] or {{\"a\": .., \"b\": ..}}, got a JSON {_json_type(item)}")
    return _build(node_arg, edges, directed=directed, name=name, groups=groups, where=where)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


# ---- edge list ----------------------------------------------------------------------------------

def from_edge_list(text: str, where: str = "<edges>") -> Topology:
    """A topology from the text edge list (``where`` names the source in messages)."""
    directed = False
    order: list[str] = []
    seen: set[str] = set()
    edges = []
    node_of: dict[str, tuple[str, str]] = {}  # name -> (its node, where it was said)
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        at = f"{where}:{lineno}"
        tokens = raw_line.split("#", 1)[0].split()
        if not tokens:
            continue
        if tokens == ["directed"]:
            if edges or order:
                raise TopologyError(f"{at}: 'directed' must come before any node or link")
            directed = True
            continue
        names = [t for t in tokens if "=" not in t]
        options: dict[str, str] = {}
        known = _NODE_OPTION_KEYS if len(names) == 1 else _OPTION_KEYS
        for t in tokens:
            if "=" in t:
                key, _, value = t.partition("=")
                if key not in known:
                    if len(names) == 2 and key in _NODE_OPTION_KEYS:
                        raise TopologyError(f"{at}: 'node=' goes on a line of its own: 'a node=host0'")
                    raise TopologyError(f"{at}: unknown option {key!r} (known: {', '.join(known)})")
                if key in options:
                    raise TopologyError(f"{at}: option {key!r} given twice")
                options[key] = value
        if len(names) not in (1, 2):
            raise TopologyError(f"{at}: expected 'a b [kind=K] [weight=W]' (a link) or 'a [node=N]' (a node), "
                                f"got {raw_line.strip()[:60]!r}")
        if "node" in options:
            value = options["node"]
            if not value:
                raise TopologyError(f"{at}: node= needs a name, e.g. 'a node=host0'")
            first = node_of.get(names[0])
            if first is not None and first[0] != value:
                raise TopologyError(f"{at}: node {names[0]!r} is in two nodes: {first[0]} ({first[1]}) and {value}")
            node_of[names[0]] = (value, at)
        for n in names:
            if n not in seen:
                seen.add(n)
                order.append(n)
        if len(names) == 2:
            weight: Any = 1.0
            if "weight" in options:
                try:
                    weight = float(options["weight"])
                except ValueError:
                    raise TopologyError(f"{at}: weight {options['weight']!r} is not a number") from None
            kind = options.get("kind", DEFAULT_LINK_KIND)
            edges.append((names[0], names[1], kind, weight, at, options.get("transport")))
    if not order:
        raise TopologyError(f"{where}: no nodes (expected lines 'a b', one link each)")
    if all(_INT_NAME.match(n) for n in order):
        top = max(int(n) for n in order)
        if top >= MAX_RANKS:
            raise TopologyError(f"{where}: rank {top} is too large: circuslink routes at most {MAX_RANKS} ranks")
        nodes: Any = top + 1  # the names are the ranks; unnamed ranks in between are isolated nodes
        rank_names = [str(r) for r in range(top + 1)]
    else:
        nodes = order
        rank_names = order
    groups = [node_of[n][0] if n in node_of else None for n in rank_names] if node_of else None
    return _build(nodes, edges, directed=directed, name=where, groups=groups, where=where)


# ---- shared checks ------------------------------------------------------------------------------

def _node_name(value: Any, at: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TopologyError(f"{at}: a node name is a string or an integer, got {json.dumps(value)[:40]}")
    name = str(value).strip()
    if not name:
        raise TopologyError(f"{at}: empty node name")
    return name


def build_graph(nodes: Iterable[Any] | int, links: Iterable[Any], *, directed: bool, name: str,
                groups: Sequence[str | None] | None, where: str) -> Topology:
    """:func:`circuslink.topology.graph`'s body: Python nodes and links through the checks files get."""
    edges = []
    for i, item in enumerate(links):
        at = f"{where}: links[{i}]"
        if isinstance(item, dict):
            bad = [k for k in item if k not in _LINK_KEYS]
            if bad or "a" not in item or "b" not in item:
                raise TopologyError(f"{at}: a link is (a, b) or a dict with keys a, b[, kind, weight, transport]")
            edges.append((item["a"], item["b"], item.get("kind", DEFAULT_LINK_KIND), item.get("weight", 1.0), at,
                          item.get("transport")))
        else:
            try:
                a, b = item
            except (TypeError, ValueError):
                raise TopologyError(f"{at}: a link is (a, b) or a dict with keys a, b[, kind, weight, transport]") \
                    from None
            edges.append((a, b, DEFAULT_LINK_KIND, 1.0, at, None))
    if not isinstance(nodes, int):
        nodes = [_node_name(n, f"{where}: nodes[{i}]") for i, n in enumerate(nodes)]
    return _build(nodes, edges, directed=directed, name=name, groups=groups, where=where)


def _build(nodes: list[str] | int, edges: list[tuple], *, directed: bool, name: str,
           groups: Sequence[str | None] | None, where: str) -> Topology:
    if isinstance(nodes, int):
        if not 1 <= nodes <= MAX_RANKS:
            raise TopologyError(f"{where}: a topology has 1..{MAX_RANKS} nodes, got {nodes}")
        names = [str(r) for r in range(nodes)]
    else:
        names = list(nodes)
        if not names:
            raise TopologyError(f"{where}: no nodes")
        if len(names) > MAX_RANKS:
            raise TopologyError(f"{where}: {len(names)} nodes; circuslink routes at most {MAX_RANKS} ranks")
    rank_of: dict[str, int] = {}
    for r, n in enumerate(names):
        if n in rank_of:
            raise TopologyError(f"{where}: node {n!r} is listed twice (ranks {rank_of[n]} and {r})")
        rank_of[n] = r
    if groups is not None and len(groups) != len(names):
        raise TopologyError(f"{where}: {len(groups)} groups for {len(names)} nodes")
    if groups is not None and all(g is None for g in groups):
        groups = None
    if groups is not None:
        groups = [None if g is None else str(g) for g in groups]
        missing = next((r for r, g in enumerate(groups) if g is None), None)
        if missing is not None:
            raise TopologyError(f"{where}: {names[missing]!r} (rank {missing}) has no node while others have one: "
                                "give every rank its node")

    pairs: dict[tuple[int, int], str] = {}
    directed_links: list[tuple[int, int, str, float, str | None]] = []
    for a, b, kind, weight, at, transport in edges:
        ra, rb = (_lookup(rank_of, _node_name(v, at), at, names) for v in (a, b))
        if ra == rb:
            raise TopologyError(f"{at}: self-loop: node {names[ra]!r} linked to itself")
        key = (ra, rb) if directed else (min(ra, rb), max(ra, rb))
        if key in pairs:
            arrow = "->" if directed else "-"
            raise TopologyError(f"{at}: duplicate link {names[ra]}{arrow}{names[rb]} (first at {pairs[key]})")
        pairs[key] = at
        # compared, not converted: a huge JSON integer must not overflow a float
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= MAX_WEIGHT:
            raise TopologyError(f"{at}: weight must be a positive number up to {MAX_WEIGHT:g}, got {weight!r}"[:200])
        if not isinstance(kind, str) or not kind.strip() or len(kind) > 64 or any(c.isspace() for c in kind):
            raise TopologyError(f"{at}: kind must be a short word such as nvlink or network, got {kind!r}")
        _check_kind(kind, ra, rb, names, groups, at)
        _check_transport(transport, kind, ra, rb, names, at)
        directed_links.append((ra, rb, kind, float(weight), transport))
        if not directed:
            directed_links.append((rb, ra, kind, float(weight), transport))
    if len(directed_links) > MAX_LINKS:
        raise TopologyError(f"{where}: {len(directed_links)} directed links; at most {MAX_LINKS}")
    # Ports: one per neighbour (a rank linked to or from this one), numbered by the neighbour's rank, so the
    # numbering does not depend on file order and a port names both directions of a bidirectional link.
    neighbours: list[set[int]] = [set() for _ in names]
    for src, dst, _, _, _ in directed_links:
        neighbours[src].add(dst)
        neighbours[dst].add(src)
    port_of = [{nb: p for p, nb in enumerate(sorted(nbs))} for nbs in neighbours]
    directed_links.sort(key=lambda k: (k[0], k[1]))
    links = [Link(i, src, dst, port_of[src][dst], kind=kind, weight=weight, transport=transport)
             for i, (src, dst, kind, weight, transport) in enumerate(directed_links)]
    topology = Topology("graph", names, links, name=name, directed=directed, groups=groups)
    if groups is None:
        return topology
    from ._nodes import from_file_nodes

    return from_file_nodes(topology, list(groups), where)


def _check_kind(kind: str, a: int, b: int, names: list[str], groups: Sequence[str | None] | None, at: str) -> None:
    """Network links join nodes, mapped links stay inside one: one line naming the link and its nodes."""
    network = kind == NETWORK_KIND
    if groups is None:
        if network:
            raise TopologyError(f"{at}: link {names[a]}-{names[b]} has kind=network, which joins nodes, but no rank "
                                "names its node (give every rank its node: 'a node=host0', {\"name\": .., "
                                "\"node\": ..})")
        return
    ga, gb = groups[a], groups[b]
    if network and ga == gb:
        raise TopologyError(f"{at}: link {names[a]}-{names[b]} has kind=network but both ranks are in node {ga}: "
                            "inside a node links are mapped memory (network links join nodes)")
    if not network and ga != gb:
        raise TopologyError(f"{at}: link {names[a]}-{names[b]} joins node {ga} and node {gb} but has kind={kind}: "
                            "a transport between nodes carries links between nodes (write kind=network)")


def _check_transport(transport: Any, kind: str, a: int, b: int, names: list[str], at: str) -> None:
    """A link may name the transport that carries it between nodes (``transport=mpi``): a registered one, on a
    network link only."""
    if transport is None:
        return
    from .. import transport as _transport

    if kind != NETWORK_KIND:
        raise TopologyError(f"{at}: link {names[a]}-{names[b]} names transport={transport} but has kind={kind}: a "
                            "transport is named on links between nodes (kind=network) only")
    if transport not in _transport.names():
        raise TopologyError(f"{at}: link {names[a]}-{names[b]}: unknown transport {transport!r} (choose one of "
                            f"{', '.join(_transport.names())})")


def _lookup(rank_of: dict[str, int], node: str, at: str, names: list[str]) -> int:
    try:
        return rank_of[node]
    except KeyError:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise TopologyError(f"{at}: link to unknown node {node!r} (nodes: {shown})") from None
