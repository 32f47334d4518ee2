"""Record and handle layouts shared with ``include/circuslink/detail/trace_types.cuh``.

The device writes :data:`RECORD` records; kernels receive a :data:`HANDLE` value (a numpy
scalar CuPy passes by value). Both are :class:`circuslink._abi.Struct` tables, which
tests/test_abi.py checks against the C++ structs with nvcc.
"""

from __future__ import annotations

import numpy as np

from .. import _abi as abi

# Event ids: the same numbers as the enum in trace_types.cuh.
KERNEL = 1
SEND = 2
RECV = 3
CREDITS = 4
COMPUTE = 5
USER = 256
MAX_EVENT = 0x3FFF

PHASE_INSTANT = 0
PHASE_BEGIN = 1
PHASE_END = 2
PHASE_SHIFT = 14

BUILTIN_NAMES = {KERNEL: "kernel", SEND: "send", RECV: "recv", CREDITS: "credits", COMPUTE: "compute"}
# Events whose argument is a channel id: each channel gets its own track (thread) per rank.
CHANNEL_EVENTS = frozenset({SEND, RECV, CREDITS})

# As the device stores it: {u64 time, u16 event|phase, u16 block, u32 arg}, 16 bytes, one vector store.
RECORD = abi.Struct("circuslink::trace::Record", "circuslink/detail/trace_types.cuh", [
    ("time_ns", abi.U64), ("event", abi.U16), ("block", abi.U16), ("arg", abi.U32)], align=16)
RECORD_DTYPE = RECORD.dtype

# The device handle: {Record*, u64* cursor, u32 capacity, u32 rank}, passed by value.
HANDLE = abi.Struct("circuslink::trace::Handle", "circuslink/detail/trace_types.cuh", [
    ("records", abi.PTR), ("cursor", abi.PTR), ("capacity", abi.U32), ("rank", abi.U32)])
HANDLE_DTYPE = HANDLE.dtype

# A merged event of the whole job, on one time base (rank 0's clock, 0 = earliest event).
EVENT_DTYPE = np.dtype(
    [("rank", "<i4"), ("time_ns", "<i8"), ("event", "<u2"), ("phase", "u1"), ("block", "<u2"), ("arg", "<u4")]
)
