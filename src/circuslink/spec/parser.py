"""Parse and validate a CIRCUS-style channel-definition file (``app.xml``).

The format is documented in ``docs/spec.md``. In short: each ``<channel>`` is one channel END
with ``name``, ``type``, ``id``, ``rank``, ``depth``, optional ``width`` and exactly one of
``write-to`` (a sender end: the peer receiver's ID) or ``read-from`` (a receiver end: the peer
sender's ID). Every field may be written as an attribute or as a child element, as CIRCUS did.

Parsing uses :mod:`xml.parsers.expat` directly (stdlib, always present) so that every element
keeps the line it started on; every problem becomes one line ``FILE:LINE: channel 'x': field 'f':
what is wrong``. All problems found are reported together (one per line) in a single
:class:`circuslink.SpecError`, so a user fixes a file in one pass; its ``problems`` attribute holds
the lines.
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from .. import topology as _topology
from ..errors import SpecError
from .model import (
    MAX_CHANNEL_ID,
    MAX_DEPTH,
    MAX_RING_BYTES,
    ElementType,
    Link,
    Spec,
    builtin_type_names,
    element_type,
    struct_type,
)

DEFAULT_DEPTH = 1024  # elements, when neither the field nor the peer gives one

_CHANNEL_FIELDS = ("name", "type", "id", "rank", "read-from", "write-to", "depth", "width")
_STRUCT_FIELDS = ("name", "bytes", "align")
_MEMBER_FIELDS = ("name", "type", "count")
_GROUP_FIELDS = ("rank",)
_ROOT_FIELDS = ("name", "version")
_TOPOLOGY_FIELDS = ("kind", "dims", "file", "vcs")
_INT_RE = re.compile(r"^[+-]?(0[xX][0-9a-fA-F]+|[0-9]+)$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names are emitted as C++ identifiers (handle aliases, constants), so C++ keywords cannot be used.
_CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq
""".split())


@dataclass
class _Node:
    tag: str
    attrs: dict[str, str]
    line: int
    children: list[_Node] = field(default_factory=list)
    text: str = ""


@dataclass
class _End:
    """One ``<channel>`` element after field checks (values may be None when they were bad)."""

    name: str | None
    line: int
    lines: dict[str, int]  # field -> line where it was written
    element: ElementType | None = None
    end_id: int | None = None
    rank: int | None = None
    depth: int | None = None
    write_to: int | None = None
    read_from: int | None = None

    @property
    def is_sender(self) -> bool:
        return self.write_to is not None

    @property
    def subject(self) -> str:
        """How a message names this end: ``channel 'x'``, or ``<channel>`` when it has no (valid) name."""
        return f"channel '{self.name}'" if self.name else "<channel>"

    @property
    def called(self) -> str:
        """This end inside another end's message: ``'x'``, or ``(no name)``."""
        return f"'{self.name}'" if self.name else "(no name)"


class _Problems:
    """Collects ``FILE:LINE: subject: field 'f': message`` lines, reported in line order."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.lines: list[tuple[int, str]] = []

    def add(self, line: int, subject: str, field_name: str | None, message: str) -> None:
        what = f"{subject}: field '{field_name}': " if field_name else f"{subject}: "
        self.lines.append((line, f"{self.where}:{line}: {what}{message}"))

    def raise_if_any(self) -> None:
        if self.lines:
            ordered = [text for _, text in sorted(self.lines, key=lambda item: item[0])]
            err = SpecError("\n".join(ordered))
            err.problems = ordered
            raise err


def load(source: str | os.PathLike, nranks: int | None = None, *, name: str | None = None) -> Spec:
    """Parse and validate a spec: ``source`` is a path or the XML text itself.

    When ``nranks`` is given every end's rank must lie in ``0..nranks-1``. ``name`` labels XML text
    in messages and becomes ``Spec.path`` (generated bindings pass the original file's name).
    Raises :class:`circuslink.SpecError` listing every problem as ``FILE:LINE: ... field 'f': ...``.
    """
    text, where, path = _read(source)
    if name is not None:
        where = path = name
    root = _parse_xml(text, where)
    problems = _Problems(where)
    if nranks is not None and nranks < 1:
        raise SpecError(f"nranks must be at least 1, got {nranks}")
    structs = _parse_structs(root, problems)
    base_dir = os.path.dirname(path) if path else None
    topology, vcs = _parse_topology(root, problems, nranks, base_dir or None)
    ends = _parse_ends(root, structs, problems, nranks)
    links = _pair(ends, problems)
    if topology is not None:
        links = _check_topology(topology, ends, links, problems)
    if not ends and not problems.lines:
        problems.add(root.line, f"<{root.tag}>", None, "declares no <channel> elements")
    problems.raise_if_any()
    lines = {e.name: e.line for e in ends if e.name}
    return Spec(links, path=path, structs=list(structs.values()), lines=lines, topology=topology, vcs=vcs)


# ---- reading and XML -----------------------------------------------------------------------------

def _read(source: str | os.PathLike) -> tuple[str, str, str | None]:
    if isinstance(source, str) and source.lstrip().startswith("<"):
        return source, "<string>", None
    path = os.fspath(source)
    try:
        return Path(path).read_text(encoding="utf-8"), path, path
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read spec file: {exc}") from None


def _parse_xml(text: str, where: str) -> _Node:
    parser = expat.ParserCreate()
    stack: list[_Node] = []
    roots: list[_Node] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        node = _Node(tag, attrs, parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(tag: str) -> None:
        stack.pop()

    def chars(data: str) -> None:
        if stack:
            stack[-1].text += data

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        reason = expat.ErrorString(exc.code)
        raise SpecError(f"{where}:{exc.lineno}:{exc.offset + 1}: malformed XML: {reason}") from None
    return roots[0]  # expat rejects documents without exactly one root element


# ---- fields -------------------------------------------------------------------------------------

def _fields(node: _Node, allowed: tuple[str, ...], subject: str, problems: _Problems,
            children_ok: tuple[str, ...] = ()) -> dict[str, tuple[str, int]]:
    """Field name -> (text, line), from attributes and from childless child elements."""
    out: dict[str, tuple[str, int]] = {}
    for key, value in node.attrs.items():
        if key.startswith(("xmlns", "xml:")):
            continue
        if key not in allowed:
            problems.add(node.line, subject, key, f"unknown field (known: {', '.join(allowed)})")
            continue
        out[key] = (value.strip(), node.line)
    for child in node.children:
        if child.tag in children_ok:
            continue
        if child.tag not in allowed:
            known = ", ".join(allowed + children_ok)
            problems.add(child.line, subject, child.tag, f"unknown element <{child.tag}> (known: {known})")
            continue
        if child.children or child.attrs:
            problems.add(child.line, subject, child.tag, f"<{child.tag}> must hold plain text only")
            continue
        if child.tag in out:
            problems.add(child.line, subject, child.tag,
                         f"given twice (also on line {out[child.tag][1]}); keep one")
            continue
        out[child.tag] = (child.text.strip(), child.line)
    if node.text.strip() and not node.children:
        problems.add(node.line, subject, None, f"unexpected text {node.text.strip()[:20]!r} inside <{node.tag}>")
    return out


def _name_of(node: _Node) -> str:
    """The element's name field, read ahead so that every problem of the element can name it."""
    named = node.attrs.get("name") or next((c.text for c in node.children if c.tag == "name"), "")
    return named.strip()


def _int_field(fields: dict[str, tuple[str, int]], key: str, subject: str, problems: _Problems,
               lo: int, hi: int | None, range_text: str) -> int | None:
    if key not in fields:
        return None
    text, line = fields[key]
    if not _INT_RE.match(text):
        problems.add(line, subject, key, f"{text!r} is not an integer")
        return None
    value = int(text, 16) if "x" in text.lower() else int(text, 10)
    if value < lo or (hi is not None and value > hi):
        problems.add(line, subject, key, f"{value} is outside {range_text}")
        return None
    return value


def _check_identifier(name: str, line: int, subject: str, problems: _Problems) -> bool:
    if not _IDENT_RE.match(name):
        problems.add(line, subject, "name", f"{name!r} is not a C identifier (letters, digits, _)")
        return False
    if name in _CPP_KEYWORDS or keyword.iskeyword(name):
        problems.add(line, subject, "name", f"{name!r} is a C++ or Python keyword")
        return False
    return True


# ---- structs ------------------------------------------------------------------------------------

def _parse_structs(root: _Node, problems: _Problems) -> dict[str, ElementType]:
    structs: dict[str, ElementType] = {}
    lines: dict[str, int] = {}
    builtins = set(builtin_type_names())
    for node in root.children:
        if node.tag != "struct":
            continue
        named = _name_of(node)
        subject = f"struct '{named}'" if named else "<struct>"
        fields = _fields(node, _STRUCT_FIELDS, subject, problems, children_ok=("field",))
        name = fields.get("name", ("", node.line))[0]
        if not name:
            problems.add(node.line, subject, "name", "missing (every struct needs a name)")
            continue
        if not _check_identifier(name, fields["name"][1], subject, problems):
            continue
        if name in builtins:
            problems.add(fields["name"][1], subject, "name", f"{name!r} is a built-in type name")
            continue
        if name in structs:
            problems.add(fields["name"][1], subject, "name",
                         f"struct {name!r} is already declared on line {lines[name]}")
            continue
        nbytes = _int_field(fields, "bytes", subject, problems, 1, 64, "1..64 bytes")
        align = _int_field(fields, "align", subject, problems, 1, 16, "1..16 bytes")
        if align is not None and align & (align - 1):
            problems.add(fields["align"][1], subject, "align", f"{align} is not a power of two")
            continue
        if ("bytes" in fields and nbytes is None) or ("align" in fields and align is None):
            continue
        members = []
        member_names: set[str] = set()
        bad = False
        for child in node.children:
            if child.tag != "field":
                continue
            mf = _fields(child, _MEMBER_FIELDS, f"{subject} member '{_name_of(child)}'", problems)
            mname = mf.get("name", ("", child.line))[0]
            if not mname:
                problems.add(child.line, subject, "field", "<field> needs a name")
                bad = True
                continue
            if not _check_identifier(mname, child.line, f"{subject} member '{mname}'", problems):
                bad = True
                continue
            if mname in member_names:
                problems.add(child.line, subject, "field", f"member {mname!r} is declared twice")
                bad = True
                continue
            member_names.add(mname)
            if "type" not in mf:
                problems.add(child.line, f"{subject} member '{mname}'", "type", "missing")
                bad = True
                continue
            try:
                mtype = element_type(mf["type"][0], structs)
            except SpecError as exc:
                problems.add(mf["type"][1], f"{subject} member '{mname}'", "type", str(exc))
                bad = True
                continue
            count = _int_field(mf, "count", f"{subject} member '{mname}'", problems, 1, 64, "1..64")
            if "count" in mf and count is None:
                bad = True
                continue
            members.append((mname, mtype, count or 1))
        if bad:
            continue
        if not members and nbytes is None:
            problems.add(node.line, subject, "bytes", "missing: give the struct's size in bytes or its <field>s")
            continue
        try:
            structs[name] = struct_type(name, members or None, nbytes=nbytes, align=align)
            lines[name] = node.line
        except SpecError as exc:
            problems.add(node.line, subject, "bytes" if nbytes is not None else "field", str(exc).split(": ", 1)[-1])
    return structs


# ---- channel ends -------------------------------------------------------------------------------

def _channel_nodes(root: _Node, problems: _Problems):
    """(channel node, rank inherited from an enclosing <endpoint rank=...>, its line) in document order."""
    for node in root.children:
        if node.tag == "channel":
            yield node, None
        elif node.tag == "endpoint":
            gf = _fields(node, _GROUP_FIELDS, "<endpoint>", problems, children_ok=("channel",))
            rank = _int_field(gf, "rank", "<endpoint>", problems, 0, None, "0.. (ranks count from 0)")
            if "rank" not in gf:
                problems.add(node.line, "<endpoint>", "rank", "missing (<endpoint rank=\"N\"> groups rank N's ends)")
            for child in node.children:
                if child.tag == "channel":
                    yield child, (rank, gf["rank"][1]) if rank is not None else ("bad", node.line)
        elif node.tag not in ("struct", "topology"):
            problems.add(node.line, f"<{root.tag}>", node.tag,
                         f"unknown element <{node.tag}> (expected channel, endpoint, struct or topology)")
    if root.attrs:
        _fields(_Node(root.tag, root.attrs, root.line), _ROOT_FIELDS, f"<{root.tag}>", problems)


def _parse_ends(root: _Node, structs: dict[str, ElementType], problems: _Problems,
                nranks: int | None) -> list[_End]:
    ends: list[_End] = []
    names: dict[str, _End] = {}
    ids: dict[int, _End] = {}
    for node, inherited in _channel_nodes(root, problems):
        # the name first, so that every problem of this end can name it
        named = _name_of(node)
        subject = f"channel '{named}'" if named else "<channel>"
        fields = _fields(node, _CHANNEL_FIELDS, subject, problems)
        name = fields.get("name", ("", node.line))[0]
        if not name:
            problems.add(node.line, subject, "name", "missing (every channel end needs a name)")
        elif not _check_identifier(name, fields["name"][1], subject, problems):
            name = ""
        end = _End(name or None, node.line, {k: v[1] for k, v in fields.items()})

        if "type" not in fields:
            problems.add(node.line, subject, "type", "missing (an OpenCL type such as uint or uint16, or a struct)")
        else:
            try:
                end.element = element_type(fields["type"][0], structs)
            except SpecError as exc:
                problems.add(fields["type"][1], subject, "type", str(exc))
        width = _int_field(fields, "width", subject, problems, 1, None, "1.. bits")
        if width is not None and end.element is not None and width != end.element.width_bits:
            problems.add(fields["width"][1], subject, "width",
                         f"{width} bits does not match type {end.element.name} ({end.element.width_bits} bits)")

        end.end_id = _int_field(fields, "id", subject, problems, 0, MAX_CHANNEL_ID, f"0..{MAX_CHANNEL_ID}")
        if "id" not in fields:
            problems.add(node.line, subject, "id", "missing (this end's channel ID, which the peer's "
                         "read-from / write-to names)")

        rank_range = f"0..{nranks - 1} ({nranks} ranks)" if nranks is not None else "0.. (ranks count from 0)"
        rank_hi = nranks - 1 if nranks is not None else None
        if "rank" in fields:
            if inherited is not None:
                problems.add(fields["rank"][1], subject, "rank",
                             f"given inside <endpoint> (line {inherited[1]}), which already sets the rank")
            end.rank = _int_field(fields, "rank", subject, problems, 0, rank_hi, rank_range)
        elif inherited is not None:
            rank, line = inherited
            if rank != "bad":
                if rank_hi is not None and rank > rank_hi:
                    problems.add(line, subject, "rank", f"{rank} (from <endpoint>) is outside {rank_range}")
                else:
                    end.rank = rank
                    end.lines["rank"] = line
        else:
            problems.add(node.line, subject, "rank", "missing (the rank this end lives on; or put the channel "
                         "inside <endpoint rank=\"N\">)")

        end.depth = _int_field(fields, "depth", subject, problems, 1, MAX_DEPTH, f"1..{MAX_DEPTH} (2**30) elements")
        end.write_to = _int_field(fields, "write-to", subject, problems, 0, MAX_CHANNEL_ID, f"0..{MAX_CHANNEL_ID}")
        end.read_from = _int_field(fields, "read-from", subject, problems, 0, MAX_CHANNEL_ID, f"0..{MAX_CHANNEL_ID}")
        if "write-to" in fields and "read-from" in fields:
            problems.add(fields["read-from"][1], subject, "read-from",
                         "an end has either write-to (sender) or read-from (receiver), not both")
            end.write_to = end.read_from = None
        elif "write-to" not in fields and "read-from" not in fields:
            problems.add(node.line, subject, "write-to",
                         "missing: a sender end needs write-to (the receiver's ID), a receiver end read-from")

        if end.name:
            if end.name in names:
                problems.add(end.lines["name"], subject, "name",
                             f"duplicate name: also used by the channel end on line {names[end.name].line}")
            else:
                names[end.name] = end
        if end.end_id is not None:
            if end.end_id in ids:
                other = ids[end.end_id]
                problems.add(end.lines["id"], subject, "id",
                             f"duplicate ID {end.end_id}: also used by {other.subject} on line {other.line}")
            else:
                ids[end.end_id] = end
        ends.append(end)
    return ends


def _pair(ends: list[_End], problems: _Problems) -> list[Link]:
    """Join each sender to its receiver; report dangling, one-sided and conflicting IDs."""
    by_id: dict[int, _End] = {}
    for e in ends:  # the first end with an ID wins, matching _parse_ends's duplicate report
        if e.end_id is not None and e.end_id not in by_id:
            by_id[e.end_id] = e
    # An end whose own ID was unreadable may be the one a peer names: do not call the peer dangling too.
    unreadable_id = any(e.end_id is None and "id" in e.lines for e in ends)
    targets: dict[int, list[_End]] = {}  # receiver ID -> senders writing to it, in file order
    for s in ends:
        if s.write_to is None:
            continue
        r = by_id.get(s.write_to)
        if r is None:
            if not unreadable_id:
                problems.add(s.lines["write-to"], s.subject, "write-to",
                             f"dangling: no channel end has ID {s.write_to}")
        elif r.is_sender:
            problems.add(s.lines["write-to"], s.subject, "write-to",
                         f"ID {s.write_to} is sender end {r.called} (line {r.line}); write-to must name a "
                         f"receiver end (one with read-from)")
        elif r.read_from is not None:  # else the receiver's own problem was reported already
            targets.setdefault(s.write_to, []).append(s)

    pairs: list[tuple[_End, _End]] = []
    for recv_id, senders in targets.items():
        r = by_id[recv_id]
        partner = next((s for s in senders if s.end_id is not None and s.end_id == r.read_from), None)
        for s in senders:
            if s is partner:
                continue
            first = partner or senders[0]
            if s is not first:
                problems.add(s.lines["write-to"], s.subject, "write-to",
                             f"receiver {r.called} (line {r.line}) already has sender {first.called} "
                             f"(line {first.line}); a receiver takes exactly one sender")
            elif s.end_id is not None:
                problems.add(s.lines["write-to"], s.subject, "write-to",
                             f"receiver {r.called} (line {r.line}) reads from ID {r.read_from}, not from this "
                             f"end's ID {s.end_id}")
        if partner is not None:
            pairs.append((partner, r))

    for r in ends:
        if r.read_from is None:
            continue
        s = by_id.get(r.read_from)
        subject = r.subject
        if s is None:
            if not unreadable_id:
                problems.add(r.lines["read-from"], subject, "read-from",
                             f"dangling: no channel end has ID {r.read_from}")
        elif not s.is_sender:
            if s.read_from is not None:  # an end with neither field was reported already
                problems.add(r.lines["read-from"], subject, "read-from",
                             f"ID {r.read_from} is receiver end {s.called} (line {s.line}); read-from must name "
                             f"a sender end (one with write-to)")
        elif r.end_id is not None and s.write_to != r.end_id and s.write_to in by_id:
            problems.add(r.lines["read-from"], subject, "read-from",
                         f"sender {s.called} (line {s.line}) writes to ID {s.write_to}, not to this end's "
                         f"ID {r.end_id}")

    links: list[Link] = []
    order = {id(e): i for i, e in enumerate(ends)}
    for s, r in sorted(pairs, key=lambda pair: order[id(pair[0])]):
        if s.element is not None and r.element is not None and not s.element.same_layout(r.element):
            problems.add(r.lines.get("type", r.line), r.subject, "type",
                         f"{r.element.name} ({r.element.width_bits} bits) does not match sender {s.called} "
                         f"(line {s.line}): {s.element.name} ({s.element.width_bits} bits)")
            continue
        if None in (s.element, r.element, s.rank, r.rank, s.name, r.name) or \
                (s.depth is None and "depth" in s.lines) or (r.depth is None and "depth" in r.lines):
            continue  # a problem on one of the ends was reported already; no link
        depths = [d for d in (s.depth, r.depth) if d is not None]
        depth = max(depths) if depths else DEFAULT_DEPTH
        if depth * s.element.nbytes > MAX_RING_BYTES:
            deepest = s if s.depth == depth else r
            problems.add(deepest.lines.get("depth", deepest.line), deepest.subject, "depth",
                         f"{depth} x {s.element.nbytes} bytes is more than {MAX_RING_BYTES >> 30} GiB of ring")
            continue
        links.append(Link(name=s.name, receiver_name=r.name, send_id=s.end_id, recv_id=r.end_id,
                          src_rank=s.rank, dst_rank=r.rank, element=s.element,
                          depth=depth))
    return links


# ---- topology -----------------------------------------------------------------------------------

def _parse_topology(root: _Node, problems: _Problems, nranks: int | None,
                    base_dir: str | None) -> tuple[_topology.Topology | None, int | None]:
    """The one ``<topology>`` element: ``<topology>torus:4x4</topology>`` (a kind:dims string or a file),
    ``<topology kind="torus" dims="4x4"/>`` or ``<topology file="net.json"/>``, each with optional ``vcs``."""
    nodes = [n for n in root.children if n.tag == "topology"]
    if not nodes:
        return None, None
    for extra in nodes[1:]:
        problems.add(extra.line, "<topology>", None, f"given twice (also on line {nodes[0].line}); keep one")
    node = nodes[0]
    subject = "<topology>"
    text = node.text.strip()
    if text and node.children:
        problems.add(node.line, subject, None, f"text {text[:20]!r} mixed with elements; use one form")
        return None, None
    fields = _fields(_Node(node.tag, node.attrs, node.line, node.children), _TOPOLOGY_FIELDS, subject, problems)
    vcs = _int_field(fields, "vcs", subject, problems, 1, _topology.MAX_VCS, f"1..{_topology.MAX_VCS}")
    given = [k for k in ("kind", "dims", "file") if k in fields]
    topo, field_name = None, None
    try:
        if text:
            if given:
                problems.add(node.line, subject, given[0],
                             f"the topology is given as text ({text[:30]!r}); drop '{given[0]}' or the text")
                return None, None
            topo = _topology.parse(text, base_dir)
        elif "file" in fields:
            field_name = "file"
            if "kind" in fields or "dims" in fields:
                problems.add(fields["file"][1], subject, "file", "give kind and dims, or file, not both")
                return None, None
            if not fields["file"][0]:
                problems.add(fields["file"][1], subject, "file", "empty file name")
                return None, None
            topo = _topology.load(_resolve_path(fields["file"][0], base_dir))
        elif "kind" in fields or "dims" in fields:
            for need in ("kind", "dims"):
                if need not in fields:
                    problems.add(node.line, subject, need,
                                 "missing (kind and dims go together, e.g. kind=\"torus\" dims=\"4x4\")")
                    return None, None
            kind = fields["kind"][0].lower()
            if kind not in _topology.KINDS:
                problems.add(fields["kind"][1], subject, "kind",
                             f"unknown kind {fields['kind'][0]!r} (known: {', '.join(_topology.KINDS)}; a custom "
                             "graph is file=\"net.json\")")
                return None, None
            field_name = "dims"
            topo = _topology.parse_spec_string(f"{kind}:{fields['dims'][0]}")
        else:
            problems.add(node.line, subject, None, "empty: give kind and dims (kind=\"torus\" dims=\"4x4\"), "
                         "file (file=\"net.json\") or the topology as text (<topology>torus:4x4</topology>)")
            return None, None
    except _topology.TopologyError as exc:
        line = fields[field_name][1] if field_name in fields else node.line
        problems.add(line, subject, field_name, str(exc))
        return None, None
    if vcs is not None:
        try:
            _topology.vc_range(topo)
            topo.routing(vcs)
        except _topology.TopologyError as exc:
            problems.add(fields["vcs"][1], subject, "vcs", str(exc))
            vcs = None
    if nranks is not None and nranks != topo.size:
        problems.add(node.line, subject, None, f"topology {topo.name} has {topo.size} ranks, but nranks is "
                     f"{nranks}")
    return topo, vcs


def _resolve_path(path: str, base_dir: str | None) -> str:
    return path if base_dir is None or os.path.isabs(path) else os.path.join(base_dir, path)


def _check_topology(topo: _topology.Topology, ends: list[_End], links: list[Link],
                    problems: _Problems) -> list[Link]:
    """Every end on a rank of the topology, every receiver reachable from its sender (channels are routed)."""
    by_name = {e.name: e for e in ends if e.name}
    outside = set()
    for e in ends:
        if e.rank is not None and e.rank >= topo.size:
            outside.add(e.name)
            problems.add(e.lines.get("rank", e.line), e.subject, "rank",
                         f"{e.rank} is outside the topology {topo.name} (ranks 0..{topo.size - 1})")
    kept = []
    for link in links:
        if link.name in outside or link.receiver_name in outside:
            continue
        if not topo.reachable(link.src_rank, link.dst_rank):
            s, r = by_name[link.name], by_name[link.receiver_name]
            problems.add(r.lines.get("rank", r.line), r.subject, "rank",
                         f"rank {topo.label(link.dst_rank)} is unreachable from sender {s.called} (rank "
                         f"{topo.label(link.src_rank)}, line {s.line}) on topology {topo.name}")
            continue
        kept.append(link)
    return kept
