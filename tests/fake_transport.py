"""A third transport, written outside circuslink's package as a plug-in would be: each rank's inboxes are POSIX
shared-memory segments the peers open by name, puts are copies, signals 8-byte stores (x86 keeps them in
order). It states its capabilities (proxied, network scope) and nothing more; circuslink gives it the generic
relay, so routed channels cross nodes through it (tests/test_transport_fake.py). About 100 lines: what adding a
transport costs.
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from circuslink.transport import Capabilities, Connection, Scope, Transport
from circuslink.transport._base import Part, as_bytes


def _segment_name(world: Any, writer: int, reader: int) -> str:
    return f"clfake-{world.job_id}-{writer}-{reader}"[:60]


class FakeTransport(Transport):
    capabilities = Capabilities(device_initiated=False, scope=Scope.NETWORK)

    @classmethod
    def unavailable(cls, context: Any) -> str | None:
        return None

    @classmethod
    def connect(cls, world: Any, peers: list[int], nbytes: int, nsignals: int,
                timeout: float) -> tuple[Part, dict[int, Connection]]:
        size = 8 * nsignals + max(nbytes, 1)
        part = _Segments()
        for p in peers:  # my inbox for each peer: the peer writes it
            seg = shared_memory.SharedMemory(_segment_name(world, p, world.rank), create=True, size=size)
            seg.buf[:size] = bytes(size)
            part.mine.append(seg)
        world.barrier(timeout)  # every inbox exists before anyone opens a peer's
        conns = {}
        for p, mine in zip(peers, part.mine, strict=True):
            theirs = shared_memory.SharedMemory(_segment_name(world, world.rank, p))
            resource_tracker.unregister(theirs._name, "shared_memory")  # its owner unlinks it, not this process
            part.theirs.append(theirs)
            conns[p] = FakeConnection(cls, world, p, nbytes, nsignals, timeout, mine, theirs)
        part.world = world
        return part, conns


class _Segments(Part):
    def __init__(self) -> None:
        self.mine: list[shared_memory.SharedMemory] = []
        self.theirs: list[shared_memory.SharedMemory] = []
        self.world: Any = None

    def close(self, timeout: float | None) -> None:
        if self.world is not None:
            self.world.barrier(timeout)  # nobody writes into an inbox any more
        self.release_local()

    def release_local(self) -> None:
        for seg in self.theirs:
            seg.close()
        for seg in self.mine:
            seg.close()
            seg.unlink()
        self.mine, self.theirs = [], []


class FakeConnection(Connection):
    def __init__(self, transport: Any, world: Any, peer: int, nbytes: int, nsignals: int, timeout: float,
                 mine: shared_memory.SharedMemory, theirs: shared_memory.SharedMemory) -> None:
        super().__init__(transport, world, peer, nbytes, nsignals, timeout)
        at = 8 * nsignals
        self._my_signals = np.ndarray((nsignals,), dtype="<u8", buffer=mine.buf)
        self._my_inbox = np.ndarray((nbytes,), dtype=np.uint8, buffer=mine.buf, offset=at)
        self._their_signals = np.ndarray((nsignals,), dtype="<u8", buffer=theirs.buf)
        self._their_inbox = np.ndarray((nbytes,), dtype=np.uint8, buffer=theirs.buf, offset=at)

    def put(self, offset: int, data: Any) -> None:
        raw = as_bytes(data)
        self._check_range(offset, len(raw))
        self._their_inbox[offset:offset + len(raw)] = raw

    def signal(self, index: int, value: int) -> None:
        self._check_index(index)
        self._their_signals[index] = value

    def signals(self) -> np.ndarray:
        return self._my_signals.copy()

    def inbox(self) -> np.ndarray:
        return self._my_inbox
