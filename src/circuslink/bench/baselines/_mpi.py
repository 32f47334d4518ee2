"""MPI point-to-point pingpong (mpi4py), host-staged on the cuda back-end.

The device image's Open MPI is not CUDA-aware, so on cuda the data takes the path a user of
that MPI would write: device -> pinned host buffer (cudaMemcpy), MPI send, MPI receive into a
pinned host buffer, host -> device. The copies are part of every one-way trip. On the cpu
back-end the numpy buffers go to MPI directly (impl ``mpi``).

Each MPI wait polls ``Test`` through the one host wait (:func:`circuslink._wait.wait_until`: it
spins first, so latency stays honest) within the size's deadline, naming the peer, so a dead peer
ends the benchmark with an error instead of a hang.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

from ..._wait import Deadline, wait_until
from ...errors import Error, TimeoutError
from .._driver import progress
from ._common import check_counts, check_sizes, fresh_seed, gbps, on_gpu, random_bytes

_TAG = 0x5C1C  # one tag of our own, so the pingpong never matches a user's pending message


def _wait(request, deadline: Deadline, what: Callable[[], str]) -> None:
    """MPI ``Wait`` within ``deadline``; a request that never completes is cancelled, then the error raised.
    The waits sit inside the host-timed loop, so they poll without sleeping (as MPI's own Wait does)."""
    try:
        wait_until(request.Test, deadline, what, spin_s=deadline.remaining())
    except TimeoutError:
        try:
            request.Cancel()
        except Exception:
            pass
        raise


class _Endpoint:
    """One side of the pingpong: where its bytes live and how they get into MPI and back.

    ``echo`` is rank 1, which sends back the bytes it received; rank 0 sends from its own
    buffer and receives into another, so a message that never arrived cannot pass the check.
    """

    def __init__(self, world: Any, max_bytes: int, echo: bool) -> None:
        self.cuda = on_gpu(world)  # device data, staged through pinned host memory
        self.echo = echo
        if self.cuda:
            import cupy
            import cupyx

            with cupy.cuda.Device(world.device):
                self.device_send = None if echo else cupy.empty(max_bytes, dtype=cupy.uint8)
                self.device_recv = cupy.empty(max_bytes, dtype=cupy.uint8)
                self.stream = cupy.cuda.Stream(non_blocking=True)
            # Pinned, so the staging copies run at full speed, as a careful user would do.
            self.host_send = cupyx.empty_pinned(max_bytes, dtype="uint8")
            self.host_recv = cupyx.empty_pinned(max_bytes, dtype="uint8")
        else:
            import numpy as np

            self.host_send = np.empty(max_bytes, dtype=np.uint8)
            self.host_recv = np.empty(max_bytes, dtype=np.uint8)

    def prepare(self, expected) -> None:
        """Load the bytes to send (rank 0) and poison every receive buffer (every byte wrong)."""
        n = expected.size
        poison = expected ^ 0xFF
        self.host_recv[:n] = poison
        if not self.echo:
            self.host_send[:n] = expected
        if self.cuda:
            self.device_recv[:n].set(self.host_recv[:n], stream=self.stream)
            if not self.echo:
                self.device_send[:n].set(self.host_send[:n], stream=self.stream)
            self.stream.synchronize()

    def stage_out(self, n: int):
        """The host buffer MPI sends from; on cuda, first copied out of device memory."""
        if self.cuda:
            source = self.device_recv if self.echo else self.device_send
            source[:n].get(stream=self.stream, out=self.host_send[:n])
            self.stream.synchronize()
            return self.host_send[:n]
        return self.host_recv[:n] if self.echo else self.host_send[:n]

    def stage_in(self, n: int) -> None:
        """After a receive, on cuda: host -> device, where the application reads it."""
        if self.cuda:
            self.device_recv[:n].set(self.host_recv[:n], stream=self.stream)
            self.stream.synchronize()

    def received(self, n: int):
        """The bytes that arrived, read where the application would read them."""
        if self.cuda:
            return self.device_recv[:n].get()
        return self.host_recv[:n].copy()


def mpi_pingpong(world: Any, sizes: Iterable[int], iters: int, warmup: int,
                 timeout: float | None = None, pair: tuple[int, int] = (0, 1), samples: int = 1) -> list[dict]:
    """MPI Send/Recv pingpong between ranks ``pair`` (default 0 and 1; the first sends, the second echoes),
    collective over the world (others wait).

    Needs ``world.mpi_comm`` (a job started by mpirun); otherwise returns ``[]`` and says why
    on stderr. Timed with ``MPI.Wtime`` over ``iters`` round trips on rank 0; one-way latency
    = total / (2 * iters), the median over ``samples`` such loops (``min_latency_us``: the fastest).
    Rows (the same on every rank): ``{"impl": "mpi-host-staged"`` on cuda or ``"mpi"`` on cpu,
    ``"bytes", "latency_us", "min_latency_us", "time_us", "throughput_GBps", "iters", "samples"}``.
    """
    sizes = check_sizes(sizes, "mpi_pingpong")
    check_counts(iters, warmup, "mpi_pingpong")
    comm = world.mpi_comm
    if comm is None:
        progress("mpi_pingpong: skipped, the job was not started by mpirun (world.mpi_comm is None)")
        return []
    if world.size < 2:
        progress("mpi_pingpong: skipped, it needs at least 2 ranks")
        return []
    MPI = world.mpi.MPI  # noqa: N806 - the module, from the world's bootstrap

    impl = "mpi-host-staged" if on_gpu(world) else "mpi"
    rank = world.rank
    ping, pong = pair
    if not (0 <= ping < world.size and 0 <= pong < world.size and ping != pong):
        raise Error(f"mpi_pingpong: pair {pair!r} is not two ranks of this world of {world.size}")
    plays = rank in pair
    peer = pong if rank == ping else ping if rank == pong else None
    ep = _Endpoint(world, max(sizes), echo=rank == pong) if plays else None
    rows: list[dict] = []
    for nbytes in sizes:
        deadline = Deadline.after(timeout)  # bounds every wait of this size's measurement
        seed = world.broadcast_object(fresh_seed() if rank == ping else None, root=ping, timeout=deadline)
        if plays:
            expected = random_bytes(seed, nbytes)
            ep.prepare(expected)

        def send(n: int = nbytes, deadline: Deadline = deadline) -> None:
            buf = ep.stage_out(n)
            _wait(comm.Isend([buf, MPI.BYTE], dest=peer, tag=_TAG), deadline,
                  lambda: f"MPI send of {n} B from rank {rank} to rank {peer}")

        def recv(n: int = nbytes, deadline: Deadline = deadline) -> None:
            _wait(comm.Irecv([ep.host_recv[:n], MPI.BYTE], source=peer, tag=_TAG), deadline,
                  lambda: f"MPI receive of {n} B on rank {rank} from rank {peer}")
            ep.stage_in(n)

        def round_trips(count: int) -> None:
            for _ in range(count):
                if rank == ping:
                    send()
                    recv()
                elif rank == pong:
                    recv()
                    send()

        world.barrier(deadline)
        round_trips(1)
        ok, detail = True, ""
        if plays:
            import numpy as np

            got = ep.received(nbytes)
            if not np.array_equal(got, expected):
                first = int(np.flatnonzero(got != expected)[0])
                ok, detail = False, f"rank {rank}: wrong byte from rank {peer} at offset {first} of {nbytes}"
        reports = world.allgather_object((ok, detail), deadline)
        bad = [d for fine, d in reports if not fine]
        if bad:
            raise Error(f"mpi_pingpong: data check failed ({'; '.join(bad)})")
        round_trips(warmup)
        times = []
        for _ in range(max(1, samples)):
            world.barrier(deadline)
            t0 = MPI.Wtime()
            round_trips(iters)
            times.append((MPI.Wtime() - t0) / (2 * iters))
        if rank == ping:
            one_way = statistics.median(times)
            rows.append({"impl": impl, "bytes": nbytes, "latency_us": one_way * 1e6, "time_us": one_way * 1e6,
                         "min_latency_us": min(times) * 1e6, "throughput_GBps": gbps(nbytes, one_way),
                         "iters": iters, "samples": len(times)})
    return world.broadcast_object(rows if rank == ping else None, root=ping, timeout=timeout)
