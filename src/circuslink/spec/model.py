"""The channel-spec data model, which lives with the channels (:mod:`circuslink.channels._model`).

The spec front end (parser, code generator) builds these objects; re-exported here for its users.
"""

from __future__ import annotations

import os

from ..channels._model import (  # noqa: F401
    MAX_CHANNEL_ID,
    MAX_DEPTH,
    MAX_ELEMENT_BYTES,
    MAX_RING_BYTES,
    VECTOR_LENGTHS,
    ElementType,
    Link,
    Spec,
    builtin_type_names,
    element_type,
    struct_type,
)


def load(source: str | os.PathLike, nranks: int | None = None, *, name: str | None = None) -> Spec:
    """Parse and validate a spec (a path or XML text); see :func:`circuslink.spec.parser.load`."""
    from .parser import load as _load  # the parser imports this module; import late

    return _load(source, nranks=nranks, name=name)
