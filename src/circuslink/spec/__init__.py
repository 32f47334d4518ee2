"""Channel specs: CIRCUS-compatible ``app.xml`` files, their validation and ``circuslink gen``.

    from circuslink import spec
    s = spec.load("app.xml", nranks=2)     # validated; SpecError names file:line and field
    link = s.link("simple_out")            # by either end's name
    link.element.c_type, link.depth, link.src_rank, link.dst_rank

The format is documented in ``docs/spec.md``; the data model in :mod:`circuslink.spec.model`.
"""

from __future__ import annotations

from .model import MAX_CHANNEL_ID, MAX_DEPTH, MAX_ELEMENT_BYTES, ElementType, Link, Spec, element_type, struct_type
from .parser import load

__all__ = [
    "MAX_CHANNEL_ID",
    "MAX_DEPTH",
    "MAX_ELEMENT_BYTES",
    "ElementType",
    "Link",
    "Spec",
    "element_type",
    "load",
    "struct_type",
]
