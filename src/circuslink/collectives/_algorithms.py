"""Ring collectives over two FIFO ports per rank: ``right`` (send) and ``left`` (receive).

The algorithms only need in-order, exactly-once byte streams with bounded buffers, which
is what a channel is; they are written against the two-method port interface below so
the same code runs over circuslink channels (``_ring.py``) and over in-process queues in
the unit tests.

Deadlock freedom with bounded buffers: every exchange alternates "write at most one
piece to the right, then read at most one piece from the left", with pieces of at most
half a channel's buffer. Take the rank that has completed the fewest pieces, k: its next
write needs room for piece k+1, i.e. its right neighbour must have read piece k-1,
which it has (it has completed at least k pieces); its next read needs piece k+1 from
its left neighbour, whose write of it needs only what this rank has already read. So
the slowest rank can always move, and the ring never stalls.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import ConfigError
from ._reduce import combine


def _xp(a):
    """numpy for numpy arrays, cupy for cupy arrays (the cuda back-end's channels)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


class SendPort(Protocol):
    def write(self, data: np.ndarray) -> None: ...  # uint8, blocks while the buffer is full
    def flush(self) -> None: ...


class RecvPort(Protocol):
    def read(self, nbytes: int) -> np.ndarray: ...  # uint8, blocks until nbytes have arrived


OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_KINDS = "iuf"  # integer, unsigned and floating types


def check_op(op: str) -> np.ufunc:
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ConfigError(f"op={op!r} is not one of {', '.join(OPS)}") from None


def check_array(array: np.ndarray, what: str) -> None:
    dtype = getattr(array, "dtype", None)
    if dtype is None or not hasattr(array, "shape"):
        raise ConfigError(f"{what}: expected a numpy or cupy array, got {type(array).__name__}")
    if array.dtype.kind not in _KINDS:
        raise ConfigError(f"{what}: dtype {array.dtype} is not an integer or floating type")


def exchange(right: SendPort, left: RecvPort, send: np.ndarray, recv_nbytes: int, piece: int) -> np.ndarray:
    """Stream ``send`` (bytes) to the right while receiving ``recv_nbytes`` from the left,
    one piece of each at a time so neither side can fill the other's buffer and stall."""
    out = _xp(send).empty(recv_nbytes, dtype=np.uint8)
    sent = got = 0
    while sent < len(send) or got < recv_nbytes:
        if sent < len(send):
            n = min(piece, len(send) - sent)
            right.write(send[sent:sent + n])
            right.flush()  # a short tail must leave now: the peer is waiting for it
            sent += n
        if got < recv_nbytes:
            n = min(piece, recv_nbytes - got)
            out[got:got + n] = left.read(n)
            got += n
    return out


def segments(nelems: int, itemsize: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of ``parts`` segments, exactly as the device code cuts them
    (``detail::segment`` in collectives_impl.cuh): whole 16-byte units, the first
    (units % parts) one unit longer, the last also taking the elements past the last unit."""
    per_unit = 1 if itemsize >= 16 else 16 // itemsize
    units = nelems // per_unit
    base, extra = divmod(units, parts)
    out = []
    for i in range(parts):
        lo = (i * base + min(i, extra)) * per_unit
        hi = nelems if i == parts - 1 else lo + (base + (1 if i < extra else 0)) * per_unit
        out.append((lo, hi))
    return out


def ring_fold_starts(nelems: int, itemsize: int, nranks: int, slices: int) -> list[tuple[int, int, int]]:
    """(lo, hi, first rank) of every stretch of the ring all-reduce's fold order: the data is cut in
    ``slices`` slices (one per ring; the cuda back-end runs many rings at once, the cpu back-end one) as
    :func:`segments` cuts, and each slice in ``nranks`` segments; segment s of a slice is folded starting
    from rank s (``ring_allreduce``'s order). Floating-point sums of three or more ranks depend on it."""
    out = []
    for s_lo, s_hi in segments(nelems, itemsize, slices):
        for first, (lo, hi) in enumerate(segments(s_hi - s_lo, itemsize, nranks)):
            if hi > lo:
                out.append((s_lo + lo, s_lo + hi, first))
    return out


def ring_allreduce(
    rank: int, nranks: int, right: SendPort, left: RecvPort, data: np.ndarray, op: str, piece: int,
    bf16: bool = False,
) -> np.ndarray:
    """Reduce-scatter then all-gather around the ring; returns a new reduced array.

    Every rank ends with bitwise the same result: each segment is reduced once, in ring
    order, by the rank that ends up owning it, and then copied to the others. Segment s is
    folded starting from rank s's part: op(...op(op(x_s, x_s+1), x_s+2)..., x_s-1), ranks mod n,
    with the device functor's op (``_reduce.combine``; ``bf16``: uint16 bit patterns of bfloat16).
    """
    check_op(op)
    xp = _xp(data)
    acc = xp.array(data, copy=True).reshape(-1)
    if nranks == 1 or acc.size == 0:
        return acc.reshape(np.shape(data))
    seg = segments(acc.size, acc.dtype.itemsize, nranks)
    raw = acc.view(np.uint8)
    item = acc.dtype.itemsize
    for step in range(nranks - 1):
        s_lo, s_hi = seg[(rank - step) % nranks]
        r_lo, r_hi = seg[(rank - step - 1) % nranks]
        got = exchange(right, left, raw[s_lo * item:s_hi * item], (r_hi - r_lo) * item, piece)
        acc[r_lo:r_hi] = combine(op, acc[r_lo:r_hi], got.view(acc.dtype), bf16)
    for step in range(nranks - 1):
        s_lo, s_hi = seg[(rank + 1 - step) % nranks]
        r_lo, r_hi = seg[(rank - step) % nranks]
        got = exchange(right, left, raw[s_lo * item:s_hi * item], (r_hi - r_lo) * item, piece)
        raw[r_lo * item:r_hi * item] = got
    return acc.reshape(np.shape(data))


def ring_broadcast(
    rank: int, nranks: int, right: SendPort, left: RecvPort, data: np.ndarray, root: int, piece: int
) -> np.ndarray:
    """Pipeline ``root``'s bytes around the ring, piece by piece (a chain: no cycle to stall)."""
    out = _xp(data).array(data, copy=True).reshape(-1)
    raw = out.view(np.uint8)
    if nranks == 1:
        return out.reshape(np.shape(data))
    last = (root - 1) % nranks  # the rank that does not forward
    for lo in range(0, len(raw), piece):
        hi = min(lo + piece, len(raw))
        if rank != root:
            raw[lo:hi] = left.read(hi - lo)
        if rank != last:
            right.write(raw[lo:hi])
            right.flush()
    return out.reshape(np.shape(data))


_TOKEN = np.array([0xB7], dtype=np.uint8)


def ring_barrier(rank: int, nranks: int, right: SendPort, left: RecvPort) -> None:
    """Two trips of a one-byte token: after the first rank 0 knows everyone arrived,
    the second tells everyone."""
    if nranks == 1:
        return
    for trip in range(2):
        if rank == 0:
            right.write(_TOKEN)
            right.flush()
            if trip == 0:
                _expect_token(left.read(1), rank)
        else:
            _expect_token(left.read(1), rank)
            if not (trip == 1 and rank == nranks - 1):
                right.write(_TOKEN)
                right.flush()


def _expect_token(got: np.ndarray, rank: int) -> None:
    if got[0] != _TOKEN[0]:
        raise ConfigError(
            f"barrier on rank {rank}: got byte {int(got[0]):#x} instead of the token: the ranks did not "
            "call the same collectives in the same order"
        )


# A 16-byte header travels once around the ring before each call, so that ranks that
# disagree on what they are doing fail with a message instead of reducing garbage.
_HEADER = np.dtype([("kind", "u1"), ("op", "u1"), ("root", "u1"), ("item", "u1"), ("dtype", "S4"),
                    ("count", "<u8")])
_KIND_CODES = {"allreduce": 1, "broadcast": 2, "reduce_scatter": 3, "all_gather": 4}
_OP_CODES = {None: 0, "sum": 1, "max": 2, "min": 3}


def check_agreement(
    rank: int, nranks: int, right: SendPort, left: RecvPort, kind: str, array: np.ndarray,
    op: str | None = None, root: int = 0,
) -> None:
    """Compare my call with my left neighbour's (so, around the ring, with everyone's)."""
    if nranks == 1:
        return
    h = np.zeros((), dtype=_HEADER)
    h["kind"], h["op"], h["root"], h["item"] = _KIND_CODES[kind], _OP_CODES[op], root, array.dtype.itemsize
    h["dtype"] = array.dtype.str[-3:].encode()
    h["count"] = array.size
    mine = np.frombuffer(h.tobytes(), dtype=np.uint8)
    got = exchange(right, left, mine, _HEADER.itemsize, _HEADER.itemsize)
    if got.tobytes() != mine.tobytes():
        theirs = got.view(_HEADER)[0]
        left_rank = (rank - 1) % nranks
        kinds = {v: k for k, v in _KIND_CODES.items()}
        raise ConfigError(
            f"{kind} on rank {rank} does not match rank {left_rank}'s call: "
            f"rank {rank} has {kind}({array.size} x {array.dtype}, op={op}, root={root}), "
            f"rank {left_rank} has {kinds.get(int(theirs['kind']), '?')}({int(theirs['count'])} x "
            f"{_dtype_name(theirs['dtype'])}, op={_op_name(int(theirs['op']))}, "
            f"root={int(theirs['root'])})"
        )


def _dtype_name(code: bytes) -> str:
    try:
        return np.dtype(code.decode()).name
    except (TypeError, ValueError, UnicodeDecodeError):
        return repr(code)


def _op_name(code: int) -> str | None:
    return {v: k for k, v in _OP_CODES.items()}.get(code)
