"""The ipc transport: mapped memory inside a node, device-initiated (CUDA IPC over NVLink / PCIe on cuda; on the
cpu back-end its CPU form, POSIX shared memory mapped by every rank of the machine).

A peer's memory is load/store-addressable, so device code puts with plain stores (``circuslink/transport.cuh``,
mode ``kModeStore``) and the channels, routed hops and RMA windows inside a node use the mapped memory itself
(:meth:`IpcTransport.map_memory`: a :class:`~circuslink.memory.SymmetricBuffer`, whose peers' views are the
peers' memory). Connections carve it into regions: in rank ``d``'s buffer, one region per rank that may write to
it (its signal words, then its inbox).

Host operations: a put is a copy into the peer's mapped inbox (numpy on cpu; a cupy copy on the back-end's
stream on cuda), a signal one 8-byte store after it (x86's total store order on cpu, stream order on cuda), a
wait polls this rank's own signal word. Relays (gateways) never take it: it joins ranks of one node only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._base import HANDLE, MODE_STORE, Capabilities, Connection, Context, Part, Scope, Transport, as_bytes

_ALIGN = 256


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class IpcTransport(Transport):
    capabilities = Capabilities(device_initiated=True, scope=Scope.SAME_NODE, mapped=True)

    @classmethod
    def unavailable(cls, context: Context) -> str | None:
        return None  # every back-end maps the memory of its node's ranks

    @classmethod
    def map_memory(cls, world: Any, peers: list[int] | None, nbytes: int, timeout: Any) -> Any:
        """Collective: ``nbytes`` of symmetric memory on every rank, mapped into this rank's ``peers`` (None: every
        rank it may map): the world's back-end allocation (``world.alloc``)."""
        return world.alloc(nbytes, timeout, peers=peers)

    @classmethod
    def connect(cls, world: Any, peers: list[int], nbytes: int, nsignals: int,
                timeout: float) -> tuple[Part, dict[int, Connection]]:
        writers = world.allgather_object(peers, timeout)  # writers[d]: the ranks that put into d's memory
        region = _align(8 * nsignals) + _align(max(nbytes, 1))
        most = max(1, max(len(w) for w in writers))
        buf = world.alloc(most * region, timeout, peers=peers)
        part = _IpcPart(buf)
        conns = {p: IpcConnection(cls, world, p, nbytes, nsignals, timeout, buf, region,
                                  writers[p].index(world.rank), writers[world.rank].index(p)) for p in peers}
        return part, conns


class _IpcPart(Part):
    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def close(self, timeout: float | None) -> None:
        self.buf.close(timeout)

    def release_local(self) -> None:
        self.buf.release_local()


class IpcConnection(Connection):
    """One end of an ipc connection: my region in the peer's buffer (where I put) and the peer's in mine."""

    def __init__(self, transport: type[Transport], world: Any, peer: int, nbytes: int, nsignals: int, timeout: float,
                 buf: Any, region: int, there: int, here: int) -> None:
        super().__init__(transport, world, peer, nbytes, nsignals, timeout)
        self._buf = buf
        self._sig_bytes = _align(8 * nsignals)
        self._remote = there * region  # my region in the peer's buffer
        self._local = here * region  # the peer's region in mine
        self._device = world.backend.runs_kernels

    def _remote_view(self, at: int, n: int) -> Any:
        return self._buf.peer(self.peer)[self._remote + at:self._remote + at + n]

    def put(self, offset: int, data: Any) -> None:
        n = int(data.nbytes) if hasattr(data, "nbytes") else len(data)
        self._check_range(offset, n)
        if n == 0:
            return
        dst = self._remote_view(self._sig_bytes + offset, n)
        if self._device:
            xp = self.world.xp
            src = data if hasattr(data, "__cuda_array_interface__") else xp.asarray(as_bytes(data))
            self.world.backend.after_caller()
            with self.world.backend.stream:
                dst[...] = src.reshape(-1).view(xp.uint8)
        else:
            dst[...] = as_bytes(data)

    def signal(self, index: int, value: int) -> None:
        self._check_index(index)
        word = self._remote_view(8 * index, 8).view("<u8")
        if self._device:
            with self.world.backend.stream:
                word[...] = value  # after the puts on the same stream
        else:
            word[0] = value  # x86 keeps stores in order: after the put's data

    def signals(self) -> np.ndarray:
        words = self._buf.local[self._local:self._local + 8 * self.nsignals].view("<u8")
        return words.get() if hasattr(words, "get") else words.copy()

    def inbox(self) -> Any:
        at = self._local + self._sig_bytes
        return self._buf.local[at:at + self.nbytes]

    def flush(self, timeout: float | None = None) -> None:
        if self._device:
            self.world.backend.wait_stream(self.world.backend.stream, self.timeout if timeout is None else timeout,
                                           lambda: f"{self.describe()}: flushing its puts")

    def device_handle(self) -> np.void:
        there, here = self._buf.ptr(self.peer) + self._remote, self._buf.ptr() + self._local
        return HANDLE.pack(remote=there + self._sig_bytes, remote_signals=there, local=here + self._sig_bytes,
                           local_signals=here, abort=self.world.backend.abort_ptr, timeout_ns=int(self.timeout * 1e9),
                           nbytes=self.nbytes, nsignals=self.nsignals, mode=MODE_STORE, rank=self.rank,
                           peer=self.peer)
