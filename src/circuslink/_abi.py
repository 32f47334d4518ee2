"""The host/device ABI: one table per device struct, from which the numpy dtypes come.

A kernel receives circuslink's handles by value (channel ends, the tracer) or reads them from
device memory (RMA queues, collective rings). Their layout is written down once, here, as a
:class:`Struct` naming the C++ type and its fields in order; the numpy dtype the host packs with
is computed from the table with the C rules (natural alignment, padding, size a multiple of the
alignment), and :func:`static_asserts` turns every registered table into ``static_assert`` lines
on ``sizeof`` / ``alignof`` / ``offsetof`` that nvcc compiles against the headers
(``tests/test_abi.py``). A header and its table can no longer drift apart silently.

    HANDLE = Struct("circuslink::trace::Handle", "circuslink/detail/trace_types.cuh", [
        ("records", PTR), ("cursor", PTR), ("capacity", U32), ("rank", U32)])
    h = HANDLE.pack(records=ptr, cursor=cur, capacity=n, rank=r)    # a numpy scalar, by value
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class Scalar:
    """A C scalar type: its spelling, numpy format, size and alignment."""

    cxx: str
    numpy: str

    @property
    def size(self) -> int:
        return np.dtype(self.numpy).itemsize

    @property
    def align(self) -> int:
        return self.size


U8 = Scalar("unsigned char", "u1")
U16 = Scalar("unsigned short", "<u2")
U32 = Scalar("unsigned int", "<u4")
I32 = Scalar("int", "<i4")
U64 = Scalar("unsigned long long", "<u8")
I64 = Scalar("long long", "<i8")
F32 = Scalar("float", "<f4")
F64 = Scalar("double", "<f8")
PTR = Scalar("void*", "<u8")  # a device address; the host packs it as an integer

_REGISTRY: list[Struct] = []


class Struct:
    """The layout of one C++ struct, in field order. Fields are (name, Scalar | Struct) or
    (name, Scalar | Struct, count) for a fixed-size array member."""

    def __init__(self, cxx: str, header: str, fields: list[tuple], align: int | None = None,
                 check_offsets: bool = True, register: bool = True) -> None:
        self.cxx = cxx
        self.header = header
        self.check_offsets = check_offsets  # offsetof needs a standard-layout type
        names, formats, offsets = [], [], []
        at, max_align = 0, 1
        for spec in fields:
            name, ftype = spec[0], spec[1]
            count = spec[2] if len(spec) > 2 else 1
            a = ftype.align
            at = -(-at // a) * a
            names.append(name)
            base = np.dtype(ftype.numpy) if isinstance(ftype, Scalar) else ftype.dtype
            formats.append(base if count == 1 else (base, (count,)))
            offsets.append(at)
            at += ftype.size * count
            max_align = max(max_align, a)
        if align is not None:
            if align < max_align or align & (align - 1):
                raise ConfigError(f"abi {cxx}: alignment {align} is below its fields' ({max_align}) "
                                  "or not a power of 2")
            max_align = align
        self.align = max_align
        self.size = -(-at // max_align) * max_align
        self.fields = [(n, f[1], f[2] if len(f) > 2 else 1) for n, f in zip(names, fields, strict=True)]
        self.offsets = dict(zip(names, offsets, strict=True))
        # "aligned": the dtype is a C struct (isalignedstruct), which is how CuPy passes a numpy scalar
        # of it to a kernel by value with this layout.
        self.dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": self.size,
                               "aligned": True})
        if register:  # circuslink's own tables; a program's private struct (register=False) is its own business
            _REGISTRY.append(self)

    @property
    def numpy(self) -> np.dtype:
        return self.dtype

    def pack(self, **values: Any) -> np.void:
        """A zeroed instance with ``values`` set: a numpy scalar a kernel takes by value."""
        unknown = set(values) - set(self.offsets)
        if unknown:
            raise ConfigError(f"abi {self.cxx}: no field(s) {', '.join(sorted(unknown))}")
        out = np.zeros((), dtype=self.dtype)
        for k, v in values.items():
            out[k] = v
        return out[()]

    def array(self, n: int) -> np.ndarray:
        """``n`` zeroed instances, contiguous, as device memory holds an array of them."""
        return np.zeros(n, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"Struct({self.cxx}, {self.size} B)"


def registered() -> list[Struct]:
    """Every table defined so far (import the subsystems first to register theirs)."""
    return list(_REGISTRY)


def static_asserts(structs: list[Struct] | None = None) -> str:
    """C++ source that includes each struct's header and checks its size, alignment and offsets."""
    structs = registered() if structs is None else structs
    headers = sorted({s.header for s in structs})
    lines = ["// generated by circuslink._abi.static_asserts(): the host's ABI tables against the headers",
             *(f"#include <{h}>" for h in headers),
             "#define CL_OFFSETOF(T, f) __builtin_offsetof(T, f)"]
    for s in structs:
        lines.append(f'static_assert(sizeof({s.cxx}) == {s.size}, "{s.cxx}: size differs from the host table");')
        lines.append(f'static_assert(alignof({s.cxx}) == {s.align}, "{s.cxx}: alignment differs from the host table");')
        if s.check_offsets:
            for name, off in s.offsets.items():
                lines.append(f'static_assert(CL_OFFSETOF({s.cxx}, {name}) == {off}, '
                             f'"{s.cxx}::{name}: offset differs from the host table");')
    return "\n".join(lines) + "\n"
