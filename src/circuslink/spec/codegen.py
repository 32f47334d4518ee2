"""Generate a CUDA header and a Python host binding from a channel spec (app.xml).

``circuslink gen app.xml -o DIR`` writes, as CIRCUS's generator wrote ``app_cl.h`` and
``app_host.cpp``:

* ``DIR/<stem>_channels.cuh``: includes ``circuslink/channel.cuh``; in ``namespace <stem>``, the
  user structs (with ``static_assert`` on size and alignment, so the device layout provably matches
  the host's numpy dtype), per channel end the element type, typed handle alias
  (``using simple_out_t = circuslink::Sender<float>;``), constexpr ID, peer ID, rank, peer rank,
  depth and width, and per rank a struct bundling the handles of that rank's ends, for kernels;
* ``DIR/<stem>_channels.py``: embeds the spec, validates it on import, names every end and ID as
  a constant and provides ``open(world)``, which opens all channels collectively through
  :func:`circuslink.channels.open`, and ``handles(channels, rank)`` in the bundle's member order.

Output is deterministic (no timestamps, no absolute paths), so generated files can be committed and
diffed. ``<stem>`` is the spec file's name without ``.xml``, turned into a C/Python identifier.
"""

from __future__ import annotations

import argparse
import keyword
import re
from pathlib import Path

from ..errors import SpecError
from .model import ElementType, Spec
from .parser import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="channel-definition file (app.xml)")
    parser.add_argument("-o", "--output", default=".", metavar="DIR", help="folder for the generated files (.)")
    parser.add_argument("--nranks", type=int, default=None, metavar="N",
                        help="check that every channel end's rank is below N")
    parser.add_argument("--name", default=None, metavar="STEM",
                        help="stem of the generated names (default: the spec file's name without .xml)")


def run(args: argparse.Namespace) -> int:
    paths = generate(args.spec, args.output, nranks=args.nranks, stem=args.name)
    for path in paths:
        print(path)
    return 0


def generate(spec_path: str, out_dir: str, nranks: int | None = None, stem: str | None = None) -> list[str]:
    """Validate ``spec_path`` and write ``<stem>_channels.cuh`` and ``<stem>_channels.py`` into ``out_dir``.

    Returns the written paths. Raises :class:`circuslink.SpecError` for an invalid spec or stem.
    """
    source = Path(spec_path)
    out = Path(out_dir)
    parent = out.absolute().parent
    if not out.is_dir() and not parent.is_dir():  # DIR itself is made; a tree of folders from a typo is not
        raise SpecError(f"-o {out_dir}: folder {str(parent)!r} does not exist (it is not created)")
    try:
        xml_text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{spec_path}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{spec_path}: cannot read spec file: {exc}") from None
    spec = load(spec_path, nranks=nranks)
    stem = _identifier(stem if stem is not None else source.name.removesuffix(".xml"))
    _check_generated_names(spec)
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot create output folder {out_dir}: {exc}") from None
    written = []
    for suffix, text in ((".cuh", cuda_header(spec, stem, source.name)),
                         (".py", python_binding(spec, stem, source.name, xml_text))):
        path = out / f"{stem}_channels{suffix}"
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot write {path}: {exc}") from None
        written.append(str(path))
    return written


_CPP_SUFFIXES = ("_element_t", "_t", "_id", "_peer_id", "_rank", "_peer_rank", "_depth", "_width")
_PY_SUFFIXES = ("", "_ID", "_RANK")
_PY_FIXED = ("SPEC", "SPEC_XML", "MIN_RANKS", "ENDS_ON_RANK", "SpecError", "load", "open", "handles")


def _check_generated_names(spec: Spec) -> None:
    """Refuse specs whose end names would generate the same identifier twice (``x_peer`` + ``_id`` vs
    ``x`` + ``_peer_id``), or clash with a struct or a fixed generated name: the compiler's error would
    not point at the spec."""
    fixed_cpp = {"num_links": "the header", "min_ranks": "the header"}
    fixed_cpp.update({f"rank{r}_channels": "the header" for r in spec.ranks()})
    fixed_cpp.update({st.c_type: f"struct '{st.name}'" for st in spec.structs})
    for table, suffixes, transform, fixed in (
            ("CUDA header", _CPP_SUFFIXES, str, fixed_cpp),
            ("Python binding", _PY_SUFFIXES, str.upper, {name: "the binding" for name in _PY_FIXED})):
        owner: dict[str, str] = dict(fixed)
        for end in spec.names():
            for suffix in suffixes:
                ident = transform(end) + suffix
                if ident in owner and owner[ident] != f"channel '{end}'":
                    raise SpecError(f"{spec.where(end)}: channel '{end}': field 'name': the {table} name {ident!r} "
                                    f"would clash with {owner[ident]}; rename the channel end")
                owner[ident] = f"channel '{end}'"


def _identifier(stem: str) -> str:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", stem)
    if not ident or ident[0].isdigit():
        ident = f"spec_{ident}"
    if keyword.iskeyword(ident) or ident in ("circuslink", "std"):
        ident = f"{ident}_spec"
    return ident


def _banner(comment: str, spec_name: str) -> str:
    return f"{comment} generated by circuslink gen from {spec_name}; do not edit\n"


# ---- CUDA header --------------------------------------------------------------------------------

def cuda_header(spec: Spec, stem: str, spec_name: str) -> str:
    """The text of ``<stem>_channels.cuh`` for ``spec``."""
    lines = [_banner("//", spec_name).rstrip(), "//",
             f"// Channel ends of {spec_name}. A kernel receives the handles of its rank's ends",
             f"// (e.g. {stem}::rank{spec.ranks()[0] if spec.links else 0}_channels) and moves elements with",
             "// write_warp / read_warp etc.; see circuslink/channel.cuh.",
             "#pragma once", "", "#include <circuslink/channel.cuh>"]
    if any("__half" in _types_text(t) for t in _used_types(spec)):
        # NVRTC finds cuda_fp16.h only when the CUDA include folder is on its path: fail with a clear
        # message rather than with "__half is undefined".
        lines += ["#if __has_include(<cuda_fp16.h>)",
                  "#include <cuda_fp16.h>  // __half, used by a half-precision channel",
                  "#else",
                  f'#error "{stem}_channels.cuh: a channel carries half: put the CUDA include folder '
                  '(with cuda_fp16.h) on the include path"',
                  "#endif"]
    lines += ["", f"namespace {stem} {{", ""]

    if spec.structs:
        lines.append("// ---- user structs (layout: C rules, the same as the host's numpy dtype) ----")
        for st in spec.structs:
            lines.append(st.definition.rstrip())
        lines.append("")
    lines.append("// ---- element sizes and alignments: the device layout must match the host's ----")
    for t in _used_types(spec):
        lines.append(f'static_assert(sizeof({t.c_type}) == {t.nbytes}, "sizeof({t.name}) must be {t.nbytes}");')
        lines.append(f'static_assert(alignof({t.c_type}) == {t.align}, "alignof({t.name}) must be {t.align}");')
    lines.append("")

    lines.append(f"constexpr int num_links = {len(spec.links)};")
    lines.append(f"constexpr int min_ranks = {max(spec.ranks()) + 1 if spec.links else 0};  "
                 "// the job needs at least this many ranks")
    lines.append("")
    for link in spec.links:
        t = link.element
        lines.append(f"// channel {link.name} (rank {link.src_rank}) -> {link.receiver_name} (rank {link.dst_rank}): "
                     f"{t.name}, {t.width_bits} bits, depth {link.depth}")
        for end, kind, my_id, peer_id, rank, peer_rank in (
                (link.name, "Sender", link.send_id, link.recv_id, link.src_rank, link.dst_rank),
                (link.receiver_name, "Receiver", link.recv_id, link.send_id, link.dst_rank, link.src_rank)):
            lines += [
                f"using {end}_element_t = {t.c_type};",
                f"using {end}_t = circuslink::{kind}<{t.c_type}>;",
                f"constexpr unsigned int {end}_id = {my_id};",
                f"constexpr unsigned int {end}_peer_id = {peer_id};",
                f"constexpr int {end}_rank = {rank};",
                f"constexpr int {end}_peer_rank = {peer_rank};",
                f"constexpr unsigned int {end}_depth = {link.depth};",
                f"constexpr unsigned int {end}_width = {t.width_bits};",
            ]
        lines.append("")
    for rank in spec.ranks():
        lines.append(f"// the handles of rank {rank}'s ends, in this order (the binding's handles(channels, {rank}))")
        lines.append(f"struct rank{rank}_channels {{")
        for end, kind, link in spec.ends_on(rank):
            lines.append(f"    circuslink::{'Sender' if kind == 'send' else 'Receiver'}<{link.element.c_type}> {end};")
        lines.append("};")
        lines.append("")
    lines.append(f"}}  // namespace {stem}")
    return "\n".join(lines) + "\n"


def _used_types(spec: Spec) -> list[ElementType]:
    """Distinct element types (by C++ type) of the links and structs, in first-use order."""
    seen: dict[str, ElementType] = {}

    def visit(t: ElementType) -> None:
        for _, member, _ in t.members:  # a member's layout decides its struct's, so check it too
            visit(member)
        seen.setdefault(t.c_type, t)

    for t in [*spec.structs, *(link.element for link in spec.links)]:
        visit(t)
    return list(seen.values())


def _types_text(t: ElementType) -> str:
    return t.c_type + t.definition


# ---- Python binding -----------------------------------------------------------------------------

def python_binding(spec: Spec, stem: str, spec_name: str, xml_text: str) -> str:
    """The text of ``<stem>_channels.py``: the embedded spec, constants and ``open(world)``."""
    # A raw triple-quoted string keeps the spec readable; repr() covers the texts it cannot hold.
    embedded = repr(xml_text) if "'''" in xml_text or xml_text.endswith("\\") else f"r'''{xml_text}'''"
    out = [f'"""{_banner("", spec_name).strip()}.', "",
           f"Channels of {spec_name}: ``channels = open(world)`` opens them all (collective: every rank calls it),",
           "``channels[NAME]`` is the end on this rank, ``handles(channels, world.rank)`` the device handles in",
           f"the order of ``{stem}::rank<N>_channels`` in {stem}_channels.cuh.",
           '"""', "",
           "# ruff: noqa: E501 - the embedded spec keeps its own line lengths", "",
           "from __future__ import annotations", "",
           "from circuslink.errors import SpecError",
           "from circuslink.spec import load", "",
           "# The spec as written; validated again on import so a hand-edited copy cannot drift silently.",
           f"SPEC_XML = {embedded}", "",
           f"SPEC = load(SPEC_XML, name={spec_name!r})", "",
           "# channel end names, IDs and ranks"]
    for link in spec.links:
        for end, end_id, rank in ((link.name, link.send_id, link.src_rank),
                                  (link.receiver_name, link.recv_id, link.dst_rank)):
            const = end.upper()
            out += [f"{const} = {end!r}", f"{const}_ID = {end_id}", f"{const}_RANK = {rank}"]
    out.append("")
    min_ranks = max(spec.ranks()) + 1 if spec.links else 0
    out.append(f"MIN_RANKS = {min_ranks}")
    ends = {rank: tuple(end for end, _, _ in spec.ends_on(rank)) for rank in spec.ranks()}
    out.append("ENDS_ON_RANK = {  # rank -> its ends, in the member order of <stem>::rank<N>_channels")
    out += [f"    {rank}: {names!r}," for rank, names in ends.items()]
    out.append("}")
    out += ["", "",
            "def open(world, timeout: float | None = None):  # noqa: A001 - the binding's one verb",
            f'    """Open every channel of {spec_name} (collective); returns circuslink.channels.open\'s Channels."""',
            "    if world.size < MIN_RANKS:",
            f'        raise SpecError(f"{spec_name} places channel ends on ranks up to {min_ranks - 1}, '
            f'but the job has {{world.size}} rank(s)")',
            "    from circuslink import channels  # imported late: the binding imports without the channels built",
            "",
            "    if timeout is None:",
            "        return channels.open(world, SPEC)",
            "    return channels.open(world, SPEC, timeout=timeout)",
            "", "",
            "def handles(channels, rank: int) -> list:",
            f'    """Device handles of ``rank``\'s ends, in the member order of {stem}::rank<rank>_channels."""',
            "    if rank not in ENDS_ON_RANK:",
            f'        raise SpecError(f"{spec_name} puts no channel end on rank {{rank}}")',
            "    return [channels[name].device_handle() for name in ENDS_ON_RANK[rank]]",
            ]
    return "\n".join(out) + "\n"
