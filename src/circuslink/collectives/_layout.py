"""The ABI tables of ``circuslink::collectives::Ring`` and ``Rings`` (detail/collectives_types.cuh)."""

from __future__ import annotations

from .. import _abi as abi
from ..channels.protocol import HANDLE

# Sender<T> / Receiver<T> hold exactly one ChannelHandle, so they have its layout.
RING = abi.Struct("circuslink::collectives::Ring", "circuslink/detail/collectives_types.cuh", [
    ("right", HANDLE), ("left", HANDLE), ("scratch", abi.PTR), ("piece", abi.U64), ("rank", abi.U32),
    ("size", abi.U32)])

# The device handle: a pointer to ``count`` Ring records in device memory, passed by value.
RINGS = abi.Struct("circuslink::collectives::Rings", "circuslink/detail/collectives_types.cuh", [
    ("rings", abi.PTR), ("count", abi.U32), ("pad", abi.U32)])
