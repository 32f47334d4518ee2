"""The ABI tables of RMA queues (include/circuslink/detail/rma_types.cuh), in one place: the committed
queue in device memory and its by-value device handle.

commit() packs these into device memory byte for byte; tests/test_abi.py checks them against the
header with nvcc.
"""

from __future__ import annotations

from .. import _abi as abi

HEADER = "circuslink/detail/rma_types.cuh"
CHUNK_BYTES = 4096  # kRmaChunkBytes: one warp copies one work unit of at most this many bytes


def work_units(count: int, block_bytes: int) -> tuple[int, int, int]:
    """(units, units_per_block, blocks_per_unit) of a write of ``count`` blocks of ``block_bytes``, as the copy
    kernels cut it: a large block into pieces of at most CHUNK_BYTES, blocks of at most half of it several to
    a unit (kRmaChunkBytes, rma_copy_unit)."""
    if 0 < 2 * block_bytes <= CHUNK_BYTES and count > 1:
        per_unit = CHUNK_BYTES // block_bytes
        return -(-count // per_unit), 1, per_unit
    per_block = -(-block_bytes // CHUNK_BYTES)
    return count * per_block, per_block, 1

DESCRIPTOR = abi.Struct("circuslink::RmaDescriptor", HEADER, [
    ("src", abi.U64), ("dst", abi.U64), ("count", abi.U64), ("block_bytes", abi.U64), ("src_stride", abi.U64),
    ("dst_stride", abi.U64), ("unit_begin", abi.U64), ("units_per_block", abi.U32), ("align", abi.U32),
    ("blocks_per_unit", abi.U32), ("reserved", abi.U32)])
STATE = abi.Struct("circuslink::RmaState", HEADER, [("epoch", abi.U64), ("done_ctas", abi.U64),
                                                     ("failed", abi.U64)])
ERROR_RECORD = abi.Struct("circuslink::RmaErrorRecord", HEADER, [("code", abi.U64), ("rank", abi.U64),
                                                                  ("epoch", abi.U64)])
QUEUE = abi.Struct("circuslink::RmaQueue", HEADER, [
    ("descs", abi.PTR), ("n_descs", abi.U64), ("total_units", abi.U64), ("signals", abi.PTR), ("size", abi.U64),
    ("targets", abi.PTR), ("arrival_at_target", abi.PTR), ("n_targets", abi.U64), ("origins", abi.PTR),
    ("post_at_origin", abi.PTR), ("n_origins", abi.U64), ("state", abi.PTR), ("error", abi.PTR),
    ("timeout_ns", abi.U64), ("post_at_wait", abi.U64), ("abort", abi.PTR), ("transposes", abi.PTR),
    ("flags", abi.U64), ("words", abi.PTR), ("n_words", abi.U64), ("word_bytes", abi.U64), ("lines", abi.PTR),
    ("n_lines", abi.U64), ("ll_slot_bytes", abi.U64), ("ll_base", abi.U64)])
LINE = abi.Struct("circuslink::RmaLine", HEADER, [("staging", abi.U64), ("dst", abi.U64), ("origin", abi.U64),
                                                   ("reserved", abi.U64)])
WORD = abi.Struct("circuslink::RmaWord", HEADER, [("src", abi.U64), ("dst", abi.U64)])
GPU_SCOPE = 1  # kRmaGpuScope: the counters release / acquire at .gpu scope (every rank on one GPU)
LOW_LATENCY = 2  # kRmaLowLatency: the small chain travels as low-latency lines into the targets' staging
SIGNAL_ONLY = 4  # kRmaSignalOnly: no chain; the start releases the origin's own stores and raises the arrivals
LL_DEPTH = 4  # kRmaLLDepth: staging slots (epochs an origin may run ahead of a target's wait)
LL_LINE_BYTES = 16  # one 8-byte word and its epoch, twice
SMALL_CHAIN_BYTES = 4096  # kRmaSmallChainBytes: plain writes up to this many bytes are committed as words
ERR_SESSION = 4  # kRmaErrSession: rma_session refused the queue (the record's rank: the block's threads)
# What a thread of a session holds (rma.cuh, RmaSession): the defaults of CIRCUSLINK_RMA_WORDS_AHEAD and
# CIRCUSLINK_RMA_LINES_IN_FLIGHT (rma_impl.cuh), which a kernel may define lower before it includes rma.cuh.
SESSION_WORDS_AHEAD = 2
SESSION_LINES_IN_FLIGHT = 4


def session_threads(words: int, lines: int, targets: int, origins: int, words_ahead: int = SESSION_WORDS_AHEAD,
                    lines_in_flight: int = SESSION_LINES_IN_FLIGHT) -> int:
    """The fewest threads of a block whose rma_session takes a low-latency queue of ``words`` words and ``lines``
    lines a cycle, to ``targets`` targets from ``origins`` origins (a thread for each target and each origin)."""
    return max(1, -(-words // words_ahead), -(-lines // lines_in_flight), targets, origins)
# The device handle: what Queue.device_handle() returns and kernels take by value (rma_start / rma_wait).
# q: a copy of the queue, read by kernels from their parameters.
HANDLE = abi.Struct("circuslink::RmaHandle", HEADER, [("queue", abi.PTR), ("q", QUEUE)])
