"""How the ranks of a job find each other and agree on small things: the store-based collectives.

The World and its back-end both use a :class:`Bootstrap` (the back-end gets it instead of the
World, so the layers only point down). Every exchange waits through :meth:`Bootstrap.exchange`,
the one wait of the collectives: one time-out, one error naming the ranks that did not arrive,
and a :class:`~circuslink.PeerError` naming a rank that died (the launcher records exits).
"""

from __future__ import annotations

import pickle
from typing import Any

from . import _store
from ._wait import Deadline, timeout_error
from .errors import ConfigError, PeerError

_POLL_SLICE_S = 0.5  # how long one store poll blocks before the client re-checks its deadline


class Bootstrap:
    """Rank, size and the store-based collectives of one job (a world of one rank needs no store)."""

    def __init__(self, rank: int, size: int, local_rank: int, local_size: int, job_id: str,
                 store: _store.StoreClient | None) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.job_id = job_id
        self._store = store
        self._seq = 0
        self.closed = False

    def exchange(self, what: str, payload: bytes, timeout: float | Deadline | None) -> list[bytes]:
        """Post ``payload`` and return every rank's, in rank order."""
        if self.closed:
            raise ConfigError("this World is closed")
        self._seq += 1
        if self.size == 1:
            return [payload]
        assert self._store is not None
        seq = self._seq
        deadline = Deadline.after(timeout)
        prefix = f"c/{seq}/"
        self._store.set(prefix + str(self.rank), payload)
        wanted = {prefix + str(r): r for r in range(self.size)}
        values: dict[str, bytes] = {}
        while True:
            missing = {k: r for k, r in wanted.items() if k not in values}
            present, exited = self._store.poll(missing, min(_POLL_SLICE_S, deadline.remaining()))
            values.update(present)
            if len(values) == self.size:
                break
            if exited:
                r, how = sorted(exited.items())[0]
                raise PeerError(f"rank {r} {how} before joining {what} #{seq} (waiting on rank {self.rank})")
            if deadline.expired():
                late = sorted(r for k, r in wanted.items() if k not in values)
                raise timeout_error(f"{what} #{seq} on rank {self.rank}: rank(s) {', '.join(map(str, late))} "
                                    "did not arrive", deadline)
        # Everyone has posted exchange seq, so everyone has finished reading seq-1.
        if seq > 1:
            self._store.delete(f"c/{seq - 1}/{self.rank}")
        return [values[prefix + str(r)] for r in range(self.size)]

    def barrier(self, timeout: float | Deadline | None = None) -> None:
        self.exchange("barrier", b"", timeout)

    def allgather_object(self, obj: Any, timeout: float | Deadline | None = None) -> list[Any]:
        if isinstance(obj, bytes | bytearray | memoryview):
            payload = b"B" + bytes(obj)
        else:
            payload = b"P" + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return [raw[1:] if raw[:1] == b"B" else pickle.loads(raw[1:])
                for raw in self.exchange("allgather", payload, timeout)]

    def broadcast_object(self, obj: Any = None, root: int = 0, timeout: float | Deadline | None = None) -> Any:
        if not 0 <= root < self.size:
            raise ConfigError(f"broadcast_object root={root} is out of range for a world of {self.size} ranks")
        return self.allgather_object(obj if self.rank == root else None, timeout)[root]

    def close(self) -> None:
        self.closed = True
        if self._store is not None:
            self._store.close()
