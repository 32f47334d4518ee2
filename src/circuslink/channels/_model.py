"""The channels' data model: element types, links (channels) and a set of them (a spec).

Plain data only. The channels (``circuslink.channels``) open what it describes; the XML front end
(``circuslink.spec``: parser and code generator) builds it from ``app.xml`` files, with its format,
validation and error messages. So spec depends on channels, never the other way round.

Element types follow CIRCUS's ``app.xml``, whose ``type`` field is an OpenCL type:

* OpenCL scalars ``char uchar short ushort int uint long ulong half float double`` (OpenCL's
  ``long`` is 64 bits; ``char`` is signed);
* OpenCL vectors of those, ``<scalar><n>`` with n in 2, 3, 4, 8, 16 (``uint16`` is 16 x uint =
  512 bits, CIRCUS's benchmark type). As in OpenCL a 3-vector occupies the room of a 4-vector
  (``sizeof(uint3) == 16``), so ``width`` for ``uint3`` is 128;
* C fixed-width names ``int8_t .. uint64_t`` and the C spellings ``unsigned int`` etc.;
* user structs declared in the spec (see :func:`struct_type`).

Every element is 1 to 64 bytes (:data:`MAX_ELEMENT_BYTES`): the device API moves elements of up to
one 64-byte packet line, the largest CIRCUS type (``uint16``) is 64 bytes, and a bigger record can
travel as several elements. Vector types map to ``circuslink::vec<T, N>`` (defined by
``circuslink/channel.cuh``; ``sizeof`` must equal :attr:`ElementType.nbytes`, which the generated
header checks with ``static_assert``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy

from ..errors import SpecError

if TYPE_CHECKING:
    from ..topology import Topology

MAX_ELEMENT_BYTES = 64
MAX_DEPTH = 1 << 30  # elements
MAX_RING_BYTES = 1 << 30  # depth x element size: a 1 GiB ring holds any message a benchmark sends in one go
MAX_CHANNEL_ID = (1 << 16) - 1  # IDs travel in a packet header; 16 bits is CIRCUS's budget and ours
VECTOR_LENGTHS = (2, 3, 4, 8, 16)


@dataclass(frozen=True)
class ElementType:
    """The type of the elements a channel carries.

    ``name`` is the spelling in the spec, ``c_type`` the CUDA C++ type generated code uses,
    ``numpy_dtype`` the host-side dtype (its ``itemsize`` equals ``nbytes``), ``align`` the
    element's alignment in bytes in device memory (a power of two).
    ``definition`` is the C++ definition for user structs ("" for built-in types) and ``members`` their
    ``(name, type, count)`` fields in order (empty for built-in types and opaque structs).
    """

    name: str
    c_type: str
    numpy_dtype: numpy.dtype
    nbytes: int
    align: int = 0  # 0: derive from nbytes (largest power of two dividing it, at most 16)
    definition: str = field(default="", compare=False)
    members: tuple = field(default=(), compare=False)  # user structs: ((name, ElementType, count), ...)

    def __post_init__(self) -> None:
        if not 1 <= self.nbytes <= MAX_ELEMENT_BYTES:
            raise SpecError(f"type {self.name}: element size {self.nbytes} bytes is outside 1..{MAX_ELEMENT_BYTES}")
        dtype = numpy.dtype(self.numpy_dtype)
        if dtype.itemsize != self.nbytes:
            raise SpecError(f"type {self.name}: numpy dtype {dtype} has {dtype.itemsize} bytes, not {self.nbytes}")
        object.__setattr__(self, "numpy_dtype", dtype)
        if self.align == 0:
            object.__setattr__(self, "align", min(self.nbytes & -self.nbytes, 16))
        if self.align & (self.align - 1) or self.nbytes % self.align:
            raise SpecError(f"type {self.name}: alignment {self.align} is not a power of two dividing {self.nbytes}")

    @property
    def width_bits(self) -> int:
        """CIRCUS's ``width`` field: the element's size in bits."""
        return 8 * self.nbytes

    def same_layout(self, other: ElementType) -> bool:
        """True when both ends may share a channel: same C++ type (``uint`` and ``uint32_t`` do) and size."""
        return self.c_type == other.c_type and self.nbytes == other.nbytes


@dataclass(frozen=True)
class Link:
    """One logical channel: a sender end on ``src_rank`` streaming to a receiver end on ``dst_rank``.

    ``name`` is the sender end's name (and the channel's name for host APIs), ``receiver_name`` the
    receiver end's. ``depth`` is the buffer depth in elements as declared (the larger of the two
    ends' depths); the channel decides its ring size from it.
    """

    name: str
    receiver_name: str
    send_id: int
    recv_id: int
    src_rank: int
    dst_rank: int
    element: ElementType
    depth: int

    def __post_init__(self) -> None:
        # Programmatic links get the same range checks as parsed ones.
        if not 1 <= self.depth <= MAX_DEPTH:
            raise SpecError(f"channel {self.name}: depth {self.depth} is outside 1..{MAX_DEPTH}")
        if self.depth * self.element.nbytes > MAX_RING_BYTES:
            raise SpecError(f"channel {self.name}: depth {self.depth} x {self.element.nbytes} bytes is more than "
                            f"{MAX_RING_BYTES >> 30} GiB of ring")
        for what, value in (("send_id", self.send_id), ("recv_id", self.recv_id)):
            if not 0 <= value <= MAX_CHANNEL_ID:
                raise SpecError(f"channel {self.name}: {what} {value} is outside 0..{MAX_CHANNEL_ID}")
        for what, value in (("src_rank", self.src_rank), ("dst_rank", self.dst_rank)):
            if value < 0:
                raise SpecError(f"channel {self.name}: {what} {value} is negative")

    def rank_of(self, end_name: str) -> int:
        """The rank the end called ``end_name`` lives on."""
        if end_name == self.name:
            return self.src_rank
        if end_name == self.receiver_name:
            return self.dst_rank
        raise SpecError(f"channel {self.name}: has no end called {end_name!r}")


class Spec:
    """A validated set of links, from a file (``path``) or built in code."""

    def __init__(self, links: list[Link], path: str | None = None, structs: list[ElementType] | None = None,
                 lines: dict[str, int] | None = None, topology: Topology | None = None,
                 vcs: int | None = None) -> None:
        self.path = path
        self.links = list(links)
        # The declared network (None: every rank maps every other rank's memory) and its virtual-channel
        # count (None: the topology's default). With a topology, channels may join any two connected ranks.
        self.topology = topology
        self.vcs = vcs
        # end name -> line of its <channel> in the file (empty for specs built in code), for messages
        self.lines: dict[str, int] = dict(lines or {})
        # User structs in declaration order (a struct may only use structs declared before it, so this
        # order is also a valid C++ definition order); structs used by links are always included.
        self.structs: list[ElementType] = list(structs or [])
        for link in self.links:
            if link.element.definition and link.element not in self.structs:
                self.structs.append(link.element)
        self._by_name: dict[str, Link] = {}
        where = path or "<links>"
        for link in self.links:
            for end in (link.name, link.receiver_name):
                if end in self._by_name:
                    raise SpecError(f"{where}: channel end name {end!r} is used twice")
                self._by_name[end] = link
        # IDs identify ends the way MPI tags do, so they must be unique across the whole spec.
        ids: dict[int, str] = {}
        for link in self.links:
            for end_id, end in ((link.send_id, link.name), (link.recv_id, link.receiver_name)):
                if end_id in ids:
                    raise SpecError(f"{where}: channel ID {end_id} is used by both {ids[end_id]!r} and {end!r}")
                ids[end_id] = end
        if topology is not None:
            self._check_topology(where)

    def _check_topology(self, where: str) -> None:
        from ..topology import TopologyError

        topo = self.topology
        try:
            topo.routing(self.vcs)  # the virtual-channel count must be one the topology can use
        except TopologyError as exc:
            raise SpecError(f"{where}: {exc}") from None
        for link in self.links:
            for end, rank in ((link.name, link.src_rank), (link.receiver_name, link.dst_rank)):
                if rank >= topo.size:
                    raise SpecError(f"{self.where(end)}: channel end {end!r}: field 'rank': {rank} is outside the "
                                    f"topology {topo.name} (ranks 0..{topo.size - 1})")
            if not topo.reachable(link.src_rank, link.dst_rank):
                raise SpecError(f"{self.where(link.receiver_name)}: channel end {link.receiver_name!r}: field "
                                f"'rank': rank {link.dst_rank} is unreachable from rank {link.src_rank} on "
                                f"topology {topo.name}")

    def where(self, end_name: str) -> str:
        """``FILE:LINE`` of an end's declaration (``FILE`` alone when unknown), for error messages."""
        line = self.lines.get(end_name)
        return f"{self.path or '<links>'}:{line}" if line else (self.path or "<links>")

    def link(self, name: str) -> Link:
        """The link one of whose ends is called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise SpecError(f"{self.path or '<links>'}: no channel end called {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        """Every end's name, sender before receiver, in declaration order."""
        return [n for link in self.links for n in (link.name, link.receiver_name)]

    def ranks(self) -> list[int]:
        """The ranks that hold at least one end, sorted."""
        return sorted({r for link in self.links for r in (link.src_rank, link.dst_rank)})

    def ends_on(self, rank: int) -> list[tuple[str, str, Link]]:
        """``(end_name, "send" | "recv", link)`` for every end living on ``rank``, in declaration order."""
        out = []
        for link in self.links:
            if link.src_rank == rank:
                out.append((link.name, "send", link))
            if link.dst_rank == rank:
                out.append((link.receiver_name, "recv", link))
        return out

    def check_nranks(self, nranks: int) -> None:
        """Raise :class:`SpecError` if an end lives on a rank outside ``0..nranks-1``, or the spec's topology
        has another number of ranks than ``nranks``."""
        if self.topology is not None and self.topology.size != nranks:
            raise SpecError(f"{self.path or '<links>'}: topology {self.topology.name} has {self.topology.size} "
                            f"ranks, but the job has {nranks}")
        for link in self.links:
            for end, rank in ((link.name, link.src_rank), (link.receiver_name, link.dst_rank)):
                if rank >= nranks:
                    raise SpecError(f"{self.path or '<links>'}: channel end {end!r}: field 'rank': "
                                    f"rank {rank} is outside 0..{nranks - 1} ({nranks} ranks)")

    def __iter__(self):
        return iter(self.links)

    def __len__(self) -> int:
        return len(self.links)

    def __repr__(self) -> str:
        return f"Spec(path={self.path!r}, links={[link.name for link in self.links]})"


# ---- built-in element types -------------------------------------------------------------------

# OpenCL scalar -> (C++ type, numpy dtype). half is CUDA's __half (needs cuda_fp16.h, which the
# generated header includes only when a half type is used).
_SCALARS: dict[str, tuple[str, str]] = {
    "char": ("signed char", "<i1"),
    "uchar": ("unsigned char", "<u1"),
    "short": ("short", "<i2"),
    "ushort": ("unsigned short", "<u2"),
    "int": ("int", "<i4"),
    "uint": ("unsigned int", "<u4"),
    "long": ("long long", "<i8"),
    "ulong": ("unsigned long long", "<u8"),
    "half": ("__half", "<f2"),
    "float": ("float", "<f4"),
    "double": ("double", "<f8"),
}

# Other spellings of the scalars (C fixed-width and multi-word C names). No vectors of these.
_ALIASES: dict[str, str] = {
    "int8_t": "char", "uint8_t": "uchar", "int16_t": "short", "uint16_t": "ushort",
    "int32_t": "int", "uint32_t": "uint", "int64_t": "long", "uint64_t": "ulong",
    "signed char": "char", "unsigned char": "uchar", "unsigned short": "ushort",
    "unsigned int": "uint", "unsigned": "uint", "unsigned long": "ulong",
    "long long": "long", "unsigned long long": "ulong",
}


def _scalar(name: str, base: str) -> ElementType:
    c_type, dt = _SCALARS[base]
    return ElementType(name=name, c_type=c_type, numpy_dtype=numpy.dtype(dt), nbytes=numpy.dtype(dt).itemsize)


def _vector(name: str, base: str, n: int) -> ElementType:
    c_type, dt = _SCALARS[base]
    base_dtype = numpy.dtype(dt)
    slots = 4 if n == 3 else n  # OpenCL: a 3-vector is laid out as a 4-vector
    nbytes = base_dtype.itemsize * slots
    if nbytes > MAX_ELEMENT_BYTES:
        raise SpecError(f"type {name} is {nbytes} bytes; elements may be at most {MAX_ELEMENT_BYTES} bytes "
                        f"(split it into several elements)")
    # A one-field structured dtype keeps one vector = one array item (a bare subarray dtype would
    # be expanded into an extra axis by numpy).
    dtype = numpy.dtype({"names": ["s"], "formats": [(base_dtype, (n,))], "offsets": [0], "itemsize": nbytes})
    # nbytes is a power of two (n is 2, 4, 8, 16 or padded 3); 16 bytes is the widest vector access
    return ElementType(name=name, c_type=f"circuslink::vec<{c_type}, {n}>", numpy_dtype=dtype, nbytes=nbytes,
                       align=min(nbytes, 16))


def builtin_type_names() -> list[str]:
    """Every built-in type name :func:`element_type` accepts (vectors included)."""
    names = list(_SCALARS) + list(_ALIASES)
    for base in _SCALARS:
        for n in VECTOR_LENGTHS:
            if numpy.dtype(_SCALARS[base][1]).itemsize * (4 if n == 3 else n) <= MAX_ELEMENT_BYTES:
                names.append(f"{base}{n}")
    return names


def element_type(name: str, structs: dict[str, ElementType] | None = None) -> ElementType:
    """Resolve a type name: a built-in (scalar, vector, C name) or one of ``structs`` (name -> type).

    Raises :class:`SpecError` naming the type when it is unknown or too large.
    """
    spelled = " ".join(name.split())  # "unsigned   int" == "unsigned int"
    if structs and spelled in structs:
        return structs[spelled]
    if spelled in _SCALARS:
        return _scalar(spelled, spelled)
    if spelled in _ALIASES:
        return _scalar(spelled, _ALIASES[spelled])
    for base in _SCALARS:
        suffix = spelled[len(base):]
        if spelled.startswith(base) and suffix.isdigit() and int(suffix) in VECTOR_LENGTHS and suffix[0] != "0":
            return _vector(spelled, base, int(suffix))
    hint = f"; declared structs: {', '.join(sorted(structs))}" if structs else ""
    raise SpecError(f"unknown type {name!r} (expected an OpenCL scalar or vector such as uint or uint16, "
                    f"a C fixed-width name such as uint32_t, or a declared struct{hint})")


def struct_type(name: str, fields: list[tuple] | None = None, nbytes: int | None = None,
                align: int | None = None) -> ElementType:
    """A user struct: either ``fields`` ``(name, type)`` or ``(name, type, count)`` (an array member)
    laid out by C rules, or opaque ``nbytes``.

    With fields, each field sits at the next multiple of its alignment and the size is rounded up
    to the largest alignment, exactly as a C++ compiler lays out the emitted struct; ``nbytes``,
    when also given, must agree. An opaque struct is ``nbytes`` raw bytes (``unsigned char
    bytes[n]`` on the device, a void dtype on the host). ``align`` overrides the alignment.
    """
    if fields:
        offset, max_align, names, formats, offsets = 0, 1, [], [], []
        members = [(f[0], f[1], f[2] if len(f) > 2 else 1) for f in fields]
        for fname, ftype, count in members:
            offset = -(-offset // ftype.align) * ftype.align
            names.append(fname)
            formats.append(ftype.numpy_dtype if count == 1 else (ftype.numpy_dtype, (count,)))
            offsets.append(offset)
            offset += ftype.nbytes * count
            max_align = max(max_align, ftype.align)
        if align is not None:
            max_align = max(max_align, align)
        size = -(-offset // max_align) * max_align
        if nbytes is not None and nbytes != size:
            raise SpecError(f"struct {name}: bytes={nbytes} but its fields take {size} bytes (C layout, "
                            f"alignment {max_align})")
        if not 1 <= size <= MAX_ELEMENT_BYTES:
            raise SpecError(f"struct {name}: {size} bytes is outside 1..{MAX_ELEMENT_BYTES}")
        dtype = numpy.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})
        body = "".join(f"    {ftype.c_type} {fname}{f'[{count}]' if count > 1 else ''};\n"
                       for fname, ftype, count in members)
        definition = f"struct alignas({max_align}) {name} {{\n{body}}};\n"
        return ElementType(name=name, c_type=name, numpy_dtype=dtype, nbytes=size, align=max_align,
                           definition=definition, members=tuple(members))
    if nbytes is None:
        raise SpecError(f"struct {name}: give its fields or its size in bytes")
    if not 1 <= nbytes <= MAX_ELEMENT_BYTES:
        raise SpecError(f"struct {name}: {nbytes} bytes is outside 1..{MAX_ELEMENT_BYTES}")
    if align is None:
        align = min(nbytes & -nbytes, 16)
    definition = f"struct alignas({align}) {name} {{\n    unsigned char bytes[{nbytes}];\n}};\n"
    return ElementType(name=name, c_type=name, numpy_dtype=numpy.dtype(f"V{nbytes}"), nbytes=nbytes, align=align,
                       definition=definition)
