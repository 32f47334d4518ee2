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

# The shared-memory team (detail/collectives_types.cuh, ``Team``): every rank's team buffer, mapped
# into every rank, has the same layout (team_offsets below; the device computes it with the same
# constants). Barrier flags: one 32-bit word per source rank. Low-latency (LL) slots for the one-shot
# all-reduce: LL_CHUNKS chunks of LL_CHUNK_BYTES of data, each chunk two parities x size sources x
# LL_LINES lines of 16 bytes {data0, flag, data1, flag} (8 data bytes a line, the flag the chunk's
# call number). Then the stage the two-shot algorithms load from in place.
LL_CHUNK_BYTES = 1024
LL_CHUNKS = 64
LL_LINES = LL_CHUNK_BYTES // 8
LL_LINE_BYTES = 16
LL_MAX_BYTES = LL_CHUNK_BYTES * LL_CHUNKS  # the largest one-shot message
# This rank's private words (device memory, not shared): the grid barrier's two, the team barrier's
# call number, one call number per LL chunk.
COUNTER_GRID, COUNTER_BARRIER, COUNTER_CHUNK = 0, 2, 3
COUNTERS = COUNTER_CHUNK + LL_CHUNKS
# The error record (4 words): what timed out, the peer, the slot (LL chunk) and the call number.
ERROR_WORDS = 4
ERROR_BARRIER, ERROR_SLOT, ERROR_GRID, ERROR_STAGE = 1, 2, 3, 4  # kTeamError*: what failed
ERROR_KINDS = {ERROR_BARRIER: "barrier flag", ERROR_SLOT: "one-shot slot", ERROR_GRID: "grid barrier",
               ERROR_STAGE: "stage"}
ERROR_CLAIMED = 0xFFFFFFFF  # kTeamErrorClaimed: a failure whose record is still being written


def team_offsets(size: int, stage_bytes: int) -> dict[str, int]:
    """Byte offsets in a team buffer of ``size`` ranks: barrier flags, LL slots, stage; and the total."""
    bar = -(-4 * size // 256) * 256
    ll = bar
    stage = ll + LL_CHUNKS * 2 * size * LL_LINES * LL_LINE_BYTES
    return {"barrier": 0, "ll": ll, "stage": stage, "total": stage + stage_bytes}


def ll_line(chunk: int, parity: int, src: int, size: int) -> int:
    """Index (in 16-byte lines from the LL area's start) of line 0 of ``src``'s slot for ``chunk``."""
    return ((chunk * 2 + parity) * size + src) * LL_LINES


TEAM = abi.Struct("circuslink::collectives::Team", "circuslink/detail/collectives_types.cuh", [
    ("peers", abi.PTR), ("counters", abi.PTR), ("error", abi.PTR), ("abort", abi.PTR), ("timeout_ns", abi.U64),
    ("stage_bytes", abi.U64), ("oneshot_max", abi.U64), ("rank", abi.U32), ("size", abi.U32), ("flags", abi.U32),
    ("pad", abi.U32)])
GPU_SCOPE = 1  # kTeamGpuScope: every rank on one GPU, the team barrier releases and acquires at .gpu scope
