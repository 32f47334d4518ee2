"""NCCL baselines, called directly through CuPy's binding (never through torch.distributed).

As nccl-tests does: operations are enqueued back to back on one stream and timed with CUDA
events around ``iters`` of them, after ``warmup`` untimed ones. Data is verified once per
size with fresh random bytes before timing. One communicator per world is created on first
use (``ncclCommInitRank`` with a unique id from rank 0), kept on the World (``world.registry``)
for later calls, and destroyed by ``world.close()`` (a :class:`~circuslink._lifecycle.Resource`).
``timeout`` bounds each size's measurement: every wait under it shares one deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..._lifecycle import Resource
from ..._wait import Deadline, wait_until
from ...errors import BackendError, ConfigError, Error, TimeoutError
from ._common import (
    check_counts,
    check_sizes,
    disable_multicast,
    fresh_seed,
    gbps,
    on_gpu,
    random_bytes,
    skipped_rows,
)

# dtype name -> (CuPy NCCL constant name, item size, exclusive bound of the random integers).
# Values are small integers so that any sum over up to 8 ranks is exact in the type, and the
# result can be checked byte for byte.
_DTYPES = {
    "float32": ("NCCL_FLOAT32", 4, 1 << 16),
    "float64": ("NCCL_FLOAT64", 8, 1 << 16),
    "float16": ("NCCL_FLOAT16", 2, 1 << 8),
    "int32": ("NCCL_INT32", 4, 1 << 20),
    "int64": ("NCCL_INT64", 8, 1 << 20),
    "uint32": ("NCCL_UINT32", 4, 1 << 20),
    "uint64": ("NCCL_UINT64", 8, 1 << 20),
    "int8": ("NCCL_INT8", 1, 1 << 4),
    "uint8": ("NCCL_UINT8", 1, 1 << 5),
}

_REGISTRY_KEY = "circuslink.bench.baselines.nccl"  # the world's registry slot of its NCCL communicator


def _load_nccl():
    """CuPy's NCCL module, with NVLink multicast off before NCCL reads its environment."""
    disable_multicast()
    try:
        import cupy  # noqa: F401
        from cupy.cuda import nccl
    except ImportError as exc:
        raise BackendError(f"NCCL baseline needs CuPy with NCCL: {exc}") from None
    if not getattr(nccl, "available", False):
        raise BackendError("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    return nccl


def _unavailable(world: Any, impl: str) -> str | None:
    """Why NCCL cannot run in this world (agreed by every rank), or None. Collective."""
    if not on_gpu(world):
        return f"{impl} needs a back-end with a GPU (this run uses {world.backend.name})"
    try:
        _load_nccl()
        mine = None
    except BackendError as exc:
        mine = f"rank {world.rank}: {exc}"
    reasons = [r for r in world.allgather_object(mine) if r]
    if reasons:
        return reasons[0]
    from ...backends import describe_shared_gpus, shared_gpus

    sharing = shared_gpus(world)
    if sharing:  # ncclCommInitRank refuses two ranks on one device ("Duplicate GPU detected")
        return f"{impl} needs one GPU per rank ({describe_shared_gpus(sharing)})"
    return None


class NcclComm(Resource):
    """NCCL's communicator over every rank of a world, and the stream its operations run on.
    ``close()`` destroys it (every rank does, in ``world.close()``); after an error or a time-out
    it is aborted instead (it may be wedged)."""

    _kind = "NCCL communicator"

    def __init__(self, world: Any, nccl: Any, timeout: Deadline | float | None) -> None:
        import cupy

        self.world = world
        uid = nccl.get_unique_id() if world.rank == 0 else None
        uid = world.broadcast_object(uid, timeout=timeout)
        world.barrier(timeout)  # NCCL's init blocks without a time-out: start it only once every rank is here
        try:
            with cupy.cuda.Device(world.device):
                self.comm = nccl.NcclCommunicator(world.size, uid, world.rank)
                self.stream = cupy.cuda.Stream(non_blocking=True)
        except Exception as exc:
            raise BackendError(f"NCCL communicator init failed on rank {world.rank}: {exc}") from None
        self._register(world)

    def _close(self, timeout: float | None) -> None:
        self.comm.destroy()

    def _release_local(self) -> None:
        try:
            self.comm.abort()
        except Exception:
            pass  # already torn down: nothing left to release


def _communicator(world: Any, timeout: Deadline | float | None):
    """(nccl module, communicator over all ranks, stream) for ``world``, created once. Collective."""
    nccl = _load_nccl()
    slot = world.registry(_REGISTRY_KEY, dict)
    held = slot.get("comm")
    if held is None or held.closed:
        held = slot["comm"] = NcclComm(world, nccl, timeout)
    return nccl, held.comm, held.stream


def _drop_communicator(world: Any) -> None:
    """Abort and forget the world's communicator (after a time-out it may be wedged)."""
    held = world.registry(_REGISTRY_KEY, dict).pop("comm", None)
    if held is not None:
        held.release_local()


def _wait_event(world: Any, event, deadline: Deadline, describe) -> None:
    try:
        wait_until(lambda: event.done, deadline, describe)
    except TimeoutError:
        _drop_communicator(world)
        raise


def _timed(world: Any, stream, enqueue, iters: int, warmup: int, deadline: Deadline, describe) -> float:
    """Seconds for ``iters`` calls of ``enqueue()`` back to back on ``stream``, event-timed on this rank."""
    import cupy

    if warmup:
        for _ in range(warmup):
            enqueue()
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(stream)
        _wait_event(world, ev, deadline, describe)
    world.barrier(deadline)  # start together, as nccl-tests does
    # One more untimed operation before the start event: it cannot finish before every peer has
    # enqueued its side, so the host-side skew of leaving the barrier stays out of the timing.
    enqueue()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        enqueue()
    end.record(stream)
    _wait_event(world, end, deadline, describe)
    return cupy.cuda.get_elapsed_time(start, end) / 1e3


def _verify_all(world: Any, ok: bool, what: str, detail: str, timeout: Deadline | float | None) -> None:
    """Raise on every rank when any rank's check failed, naming the ranks (collective)."""
    reports = world.allgather_object((ok, detail), timeout)
    bad = [f"rank {r}: {d}" if d else f"rank {r}" for r, (fine, d) in enumerate(reports) if not fine]
    if bad:
        raise Error(f"{what}: data check failed ({'; '.join(bad)})")


# -- send/recv pingpong -------------------------------------------------------------------------
def nccl_pingpong(world: Any, sizes: Iterable[int], iters: int, warmup: int,
                  timeout: float | None = None) -> list[dict]:
    """NCCL send/recv pingpong between ranks 0 and 1 (collective over the world; others wait).

    Rank 0 sends, rank 1 receives and sends the same bytes back; ``iters`` round trips are
    enqueued back to back on one stream between two CUDA events on rank 0. One-way
    latency = total / (2 * iters). Rows (the same list on every rank):
    ``{"impl": "nccl", "bytes", "latency_us", "time_us", "throughput_GBps", "iters"}``, or
    ``{"impl": "nccl", "bytes", "skipped": reason}`` when NCCL cannot run.
    """
    sizes = check_sizes(sizes, "nccl_pingpong")
    check_counts(iters, warmup, "nccl_pingpong")
    reason = _unavailable(world, "nccl")
    if reason is None and world.size < 2:
        reason = "pingpong needs at least 2 ranks"
    if reason:
        return skipped_rows("nccl", sizes, reason)
    import cupy
    import numpy as np

    nccl, comm, stream = _communicator(world, timeout)
    rank = world.rank
    peer = 1 - rank if rank < 2 else None
    with cupy.cuda.Device(world.device):
        sendbuf = cupy.empty(max(sizes), dtype=cupy.uint8) if rank == 0 else None
        recvbuf = cupy.empty(max(sizes), dtype=cupy.uint8) if rank < 2 else None
    rows: list[dict] = []
    try:
        for nbytes in sizes:
            deadline = Deadline.after(timeout)  # bounds every wait of this size's measurement
            seed = world.broadcast_object(fresh_seed() if rank == 0 else None, timeout=deadline)
            expected = random_bytes(seed, nbytes) if rank < 2 else None
            if rank == 0:
                sendbuf[:nbytes].set(expected)
            if rank < 2:
                recvbuf[:nbytes].set(expected ^ 0xFF)  # poisoned: every byte differs from what must land

            def round_trip(nbytes=nbytes) -> None:
                if rank == 0:
                    comm.send(sendbuf.data.ptr, nbytes, nccl.NCCL_UINT8, 1, stream.ptr)
                    comm.recv(recvbuf.data.ptr, nbytes, nccl.NCCL_UINT8, 1, stream.ptr)
                elif rank == 1:
                    comm.recv(recvbuf.data.ptr, nbytes, nccl.NCCL_UINT8, 0, stream.ptr)
                    comm.send(recvbuf.data.ptr, nbytes, nccl.NCCL_UINT8, 0, stream.ptr)

            def describe(nbytes=nbytes) -> str:
                return f"NCCL pingpong of {nbytes} B on rank {rank} (waiting on rank {peer})"

            cupy.cuda.Device(world.device).synchronize()  # the poisoned buffers are in place
            world.barrier(deadline)
            # Verify once: after one round trip rank 1 holds rank 0's bytes and rank 0 its own back.
            round_trip()
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(stream)
            _wait_event(world, ev, deadline, describe)
            ok, detail = True, ""
            if rank < 2:
                got = recvbuf[:nbytes].get()
                ok = bool(np.array_equal(got, expected))
                if not ok:
                    first = int(np.flatnonzero(got != expected)[0])
                    detail = f"got wrong bytes from rank {peer} at offset {first} of {nbytes}"
            _verify_all(world, ok, "nccl_pingpong", detail, deadline)
            seconds = _timed(world, stream, round_trip, iters, warmup, deadline, describe)
            one_way = seconds / (2 * iters)
            if rank == 0:
                rows.append({"impl": "nccl", "bytes": nbytes, "latency_us": one_way * 1e6,
                             "time_us": one_way * 1e6, "throughput_GBps": gbps(nbytes, one_way),
                             "iters": iters})
    except nccl.NcclError as exc:
        raise BackendError(f"NCCL pingpong failed on rank {rank}: {exc}") from None
    return world.broadcast_object(rows if rank == 0 else None, timeout=timeout)


# -- all-reduce ---------------------------------------------------------------------------------
def nccl_allreduce(world: Any, sizes: Iterable[int], iters: int, warmup: int, dtype: str = "float32",
                   timeout: float | None = None) -> list[dict]:
    """NCCL all-reduce (sum) over every rank: time per operation and bus bandwidth, as nccl-tests.

    ``bytes`` is the message per rank (``count * itemsize``; sizes below one element become
    one element). ``time_us`` is the slowest rank's time per operation; ``algbw_GBps`` =
    bytes / time; ``busbw_GBps`` = algbw * 2(n-1)/n; ``throughput_GBps`` = algbw. The sum
    is checked exactly once per size (small random integers, so the sum is exact in any type).
    """
    sizes = check_sizes(sizes, "nccl_allreduce")
    check_counts(iters, warmup, "nccl_allreduce")
    if dtype not in _DTYPES:
        raise ConfigError(f"nccl_allreduce: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    const_name, itemsize, bound = _DTYPES[dtype]
    reason = _unavailable(world, "nccl")
    if reason:
        return skipped_rows("nccl", sizes, reason, op="allreduce", dtype=dtype)
    import cupy
    import numpy as np

    nccl, comm, stream = _communicator(world, timeout)
    nccl_dtype = getattr(nccl, const_name)
    n = world.size
    rank = world.rank
    counts = list(dict.fromkeys(max(1, s // itemsize) for s in sizes))  # sizes below one element collapse
    with cupy.cuda.Device(world.device):
        sendbuf = cupy.empty(max(counts), dtype=dtype)
        recvbuf = cupy.empty(max(counts), dtype=dtype)
    rows: list[dict] = []
    try:
        for count in counts:
            nbytes = count * itemsize
            deadline = Deadline.after(timeout)  # bounds every wait of this size's measurement
            base = world.broadcast_object(fresh_seed() if rank == 0 else None, timeout=deadline)

            def contribution(r: int, count=count, base=base):
                rng = np.random.default_rng(base + r)
                return rng.integers(0, bound, count, dtype=np.int64)

            mine = contribution(rank)
            expected = mine.copy()
            for r in range(n):
                if r != rank:
                    expected += contribution(r)
            expected = expected.astype(dtype)
            sendbuf[:count].set(mine.astype(dtype))
            recvbuf[:count].set(expected + np.array(1, dtype=dtype))  # poisoned: wrong everywhere

            def allreduce(count=count) -> None:
                comm.allReduce(sendbuf.data.ptr, recvbuf.data.ptr, count, nccl_dtype, nccl.NCCL_SUM, stream.ptr)

            def describe(nbytes=nbytes) -> str:
                return f"NCCL all-reduce of {nbytes} B on rank {rank} (waiting on the other {n - 1} rank(s))"

            cupy.cuda.Device(world.device).synchronize()
            world.barrier(deadline)
            allreduce()
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(stream)
            _wait_event(world, ev, deadline, describe)
            got = recvbuf[:count].get()
            ok = bool(np.array_equal(got.view(np.uint8), expected.view(np.uint8)))
            detail = ""
            if not ok:
                first = int(np.flatnonzero(got != expected)[0])
                detail = f"element {first} is {got[first]!r}, expected {expected[first]!r}"
            _verify_all(world, ok, "nccl_allreduce", detail, deadline)
            seconds = _timed(world, stream, allreduce, iters, warmup, deadline, describe)
            per_op = max(world.allgather_object(seconds, deadline)) / iters
            algbw = gbps(nbytes, per_op)
            busbw = algbw * 2 * (n - 1) / n if algbw is not None else None
            rows.append({"impl": "nccl", "op": "allreduce", "dtype": dtype, "bytes": nbytes, "count": count,
                         "nranks": n, "latency_us": per_op * 1e6, "time_us": per_op * 1e6,
                         "algbw_GBps": algbw, "busbw_GBps": busbw, "throughput_GBps": algbw, "iters": iters})
    except nccl.NcclError as exc:
        raise BackendError(f"NCCL all-reduce failed on rank {rank}: {exc}") from None
    return rows


# -- grouped send/recv --------------------------------------------------------------------------
def _normalise_plan(entries: Any, rank: int, size: int) -> list[tuple[int, int, int]]:
    """[(peer, send_nbytes, recv_nbytes), ...] from (peer, nbytes) or (peer, send, recv) entries."""
    out = []
    for i, entry in enumerate(entries or []):
        try:
            items = tuple(entry)
        except TypeError:
            raise ConfigError(f"nccl_grouped_sendrecv: rank {rank} entry {i} {entry!r} is not a tuple") from None
        if len(items) == 2:
            peer, send, recv = items[0], items[1], items[1]
        elif len(items) == 3:
            peer, send, recv = items
        else:
            raise ConfigError(
                f"nccl_grouped_sendrecv: rank {rank} entry {i} {entry!r} must be (peer, nbytes) "
                "or (peer, send_nbytes, recv_nbytes)"
            )
        for name, v in (("peer", peer), ("send_nbytes", send), ("recv_nbytes", recv)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"nccl_grouped_sendrecv: rank {rank} entry {i}: {name}={v!r} is not a valid integer")
        if not 0 <= peer < size or peer == rank:
            raise ConfigError(
                f"nccl_grouped_sendrecv: rank {rank} entry {i}: peer {peer} must be another rank in 0..{size - 1}"
            )
        if send == 0 and recv == 0:
            raise ConfigError(f"nccl_grouped_sendrecv: rank {rank} entry {i} moves no bytes")
        out.append((peer, send, recv))
    return out


def _check_plans(plans: Sequence[list[tuple[int, int, int]]]) -> None:
    """Every message a rank sends must be matched, in order and size, by a receive on its peer."""
    for a, plan_a in enumerate(plans):
        for b in range(len(plans)):
            if a == b:
                continue
            sends = [s for p, s, _ in plan_a if p == b and s > 0]
            recvs = [r for p, _, r in plans[b] if p == a and r > 0]
            if sends != recvs:
                raise ConfigError(
                    f"nccl_grouped_sendrecv: rank {a} sends {sends} bytes to rank {b}, but rank {b} "
                    f"receives {recvs} bytes from rank {a}: the plans must match message by message"
                )


def _message_seed(base: int, sender: int, receiver: int, index: int) -> int:
    # Distinct, reproducible seeds per message: the receiver regenerates what the sender sent.
    return (base * 1_000_003 + sender * 10_007 + receiver * 101 + index) % (1 << 63)


def nccl_grouped_sendrecv(world: Any, peers_per_rank: dict | list, iters: int, warmup: int,
                          timeout: float | None = None) -> dict:
    """Time one grouped exchange: every rank's sends and receives inside one groupStart/groupEnd.

    ``peers_per_rank`` is either ``{rank: [(peer, nbytes), ...]}`` for the whole job or this
    rank's own list. ``(peer, nbytes)`` sends ``nbytes`` to ``peer`` *and* receives ``nbytes``
    from it; ``(peer, send_nbytes, recv_nbytes)`` gives each direction (0 for none), e.g. the RMA
    benchmark's chain of k one-way writes: rank 0 ``[(1, s, 0)] * k``, rank 1 ``[(0, 0, s)] * k``.
    Each message has its own buffer. Collective; returns the same dict on every rank:
    ``{"impl": "nccl-grouped-sendrecv", "bytes" (most bytes sent by one rank), "messages" (most
    messages sent by one rank), "time_us" and "latency_us" (slowest rank, per exchange),
    "throughput_GBps", "iters", "nranks"}``, or with ``"skipped": reason``.
    """
    check_counts(iters, warmup, "nccl_grouped_sendrecv")
    rank, size = world.rank, world.size
    mine_raw = peers_per_rank.get(rank, []) if isinstance(peers_per_rank, dict) else peers_per_rank
    mine = _normalise_plan(mine_raw, rank, size)
    plans = world.allgather_object(mine, timeout)
    _check_plans(plans)
    total_sent = max(sum(s for _, s, _ in p) for p in plans)
    messages = max(sum(1 for _, s, _ in p if s > 0) for p in plans)
    summary = {"impl": "nccl-grouped-sendrecv", "bytes": total_sent, "messages": messages, "nranks": size}
    reason = _unavailable(world, "nccl-grouped-sendrecv")
    if reason:
        return dict(summary, skipped=reason)
    import cupy
    import numpy as np

    nccl, comm, stream = _communicator(world, timeout)
    base = world.broadcast_object(fresh_seed() if rank == 0 else None, timeout=timeout)
    sends, recvs = [], []  # (peer, device array, expected bytes or None)
    sent_count: dict[int, int] = {}
    recv_count: dict[int, int] = {}
    with cupy.cuda.Device(world.device):
        for peer, s, r in mine:
            if s:
                index = sent_count.get(peer, 0)
                sent_count[peer] = index + 1
                data = random_bytes(_message_seed(base, rank, peer, index), s)
                sends.append((peer, cupy.asarray(data), None))
            if r:
                index = recv_count.get(peer, 0)
                recv_count[peer] = index + 1
                expected = random_bytes(_message_seed(base, peer, rank, index), r)
                recvs.append((peer, cupy.asarray(expected ^ 0xFF), expected))
        cupy.cuda.Device(world.device).synchronize()

    def exchange() -> None:
        nccl.groupStart()
        try:
            # Issue order per peer is the matching order, so sends and receives keep the plan's order.
            for peer, buf, _ in sends:
                comm.send(buf.data.ptr, buf.size, nccl.NCCL_UINT8, peer, stream.ptr)
            for peer, buf, _ in recvs:
                comm.recv(buf.data.ptr, buf.size, nccl.NCCL_UINT8, peer, stream.ptr)
        finally:
            nccl.groupEnd()

    peers = sorted({p for p, _, _ in mine})

    def describe() -> str:
        return f"NCCL grouped send/recv on rank {rank} (waiting on rank(s) {', '.join(map(str, peers)) or '-'})"

    deadline = Deadline.after(timeout)  # bounds every wait of the measurement
    try:
        world.barrier(deadline)
        exchange()
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(stream)
        _wait_event(world, ev, deadline, describe)
        ok, detail = True, ""
        for peer, buf, expected in recvs:
            got = buf.get()
            if not np.array_equal(got, expected):
                first = int(np.flatnonzero(got != expected)[0])
                ok, detail = False, f"message from rank {peer} differs at offset {first}"
                break
        _verify_all(world, ok, "nccl_grouped_sendrecv", detail, deadline)
        seconds = _timed(world, stream, exchange, iters, warmup, deadline, describe)
    except nccl.NcclError as exc:
        raise BackendError(f"NCCL grouped send/recv failed on rank {rank}: {exc}") from None
    per_exchange = max(world.allgather_object(seconds, deadline)) / iters
    return dict(summary, time_us=per_exchange * 1e6, latency_us=per_exchange * 1e6,
                throughput_GBps=gbps(total_sent, per_exchange), iters=iters)
