"""The transport interface: what every transport provides, and what a Connection offers (docs/architecture.md).

A **transport** is one way of moving bytes between two ranks: mapped memory inside a node (CUDA IPC, or the cpu
back-end's shared memory), MPI, NVSHMEM. It states what it can do as :class:`Capabilities` (device-initiated or
proxied, the widest scope it joins, whether the peer's memory is mapped, the latency and bandwidth the probe
measured) and subsystems choose by those, never by name (``_registry`` is the one place that names transports).

A **Connection** joins this rank to one peer through one transport: a host object (put, put-with-signal,
signal, wait, flush) with a by-value device handle (``circuslink::transport::Handle``, the MSCCL++ pattern).
Each side has an **inbox** of ``nbytes`` (what the peer put) and ``nsignals`` 64-bit signal words (what the peer
signalled). Semantics, the same on every transport:

* ``put(offset, data)``: ``data`` lands in the peer's inbox at ``offset``; ``data`` may be reused on return;
* ``put_with_signal(offset, data, index, value)``: the same, then the peer's signal word ``index`` becomes
  ``value``, visible only after the data;
* ``signal(index, value)``: the peer's signal word ``index`` becomes ``value`` (after every earlier put);
* ``wait(index, value)``: until my signal word ``index`` is at least ``value`` (bounded; one line on expiry);
* ``flush()``: every put and signal issued so far has left this rank (bounded).

A **relay** is what gateways use between nodes: two packet rings in the channel format at this rank (the
**out ring**, which a forwarding agent fills, and the **in ring**, which it reads), and the transport moving
packet ``s`` of this out ring into the peer's in ring as packet ``s``, under end-to-end credits (a packet
crosses only while the peer's in ring has room). A transport that moves packets with compiled code (mpi: a
progress thread; nvshmem: a proxy kernel) brings its own relays; any other gets the generic one of
``_relay.py``, built on its Connections' put-with-signal.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import _abi as abi
from .._lifecycle import Resource

_TYPES = "circuslink/detail/transport_types.cuh"
MODE_STORE = 0  # Handle::mode: the peer's inbox is mapped; device code stores into it
MODE_PROXY = 1  # a proxy carries the puts; device code cannot put itself
HANDLE = abi.Struct("circuslink::transport::Handle", _TYPES, [
    ("remote", abi.PTR), ("remote_signals", abi.PTR), ("local", abi.PTR), ("local_signals", abi.PTR),
    ("abort", abi.PTR), ("timeout_ns", abi.U64), ("nbytes", abi.U64), ("nsignals", abi.U32), ("mode", abi.U32),
    ("rank", abi.U32), ("peer", abi.U32)])
DEVICE_ERRORS = {1: "a device wait timed out", 2: "the host aborted a device wait",
                 3: "device code put through a proxied connection", 4: "an offset or signal index out of range"}


class Scope(enum.IntEnum):
    """How far apart two ranks a transport can join (a transport joins every pair up to its scope)."""

    SAME_GPU = 0
    SAME_NODE = 1
    NETWORK = 2

    def describe(self) -> str:
        return {Scope.SAME_GPU: "the same GPU", Scope.SAME_NODE: "the same node", Scope.NETWORK: "the network"}[self]


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do. ``latency_us`` / ``bandwidth_GBps`` are what a probe or benchmark of this job
    measured (:func:`circuslink.transport.record_figures`), None until one did."""

    device_initiated: bool  # device code moves the bytes itself (stores, or a device kernel as proxy)
    scope: Scope  # the widest pair it joins
    mapped: bool = False  # the peer's memory is load/store-addressable (device code and numpy views reach it)
    compiled_relay: bool = False  # it relays packet rings with compiled code (else: the generic relay)
    latency_us: float | None = None  # one-way, small message
    bandwidth_GBps: float | None = None

    @property
    def proxied(self) -> bool:
        """A host thread or a proxy kernel carries its puts (the opposite of device-initiated stores)."""
        return not self.device_initiated

    def measured(self, latency_us: float | None, bandwidth_GBps: float | None) -> Capabilities:
        return replace(self, latency_us=latency_us, bandwidth_GBps=bandwidth_GBps)

    def describe(self) -> str:
        how = "device-initiated" if self.device_initiated else "proxied"
        figures = ""
        if self.latency_us is not None:
            figures = f", {self.latency_us:.2f} us"
            if self.bandwidth_GBps is not None:
                figures += f", {self.bandwidth_GBps:.2f} GB/s"
        return f"{how}, up to {self.scope.describe()}{', mapped' if self.mapped else ''}{figures}"


@dataclass(frozen=True)
class Context:
    """What decides whether a transport can run in a job: its back-end runs kernels, it was started by mpirun."""

    runs_kernels: bool
    under_mpi: bool

    @classmethod
    def of(cls, world: Any) -> Context:
        return cls(bool(world.backend.runs_kernels), getattr(world, "mpi", None) is not None)


class Connection(ABC):
    """This rank's end of a connection to ``peer`` (see the module docstring for the semantics)."""

    def __init__(self, transport: type[Transport], world: Any, peer: int, nbytes: int, nsignals: int,
                 timeout: float) -> None:
        self.transport = transport
        self.world = world
        self.rank = world.rank
        self.peer = peer
        self.nbytes = nbytes
        self.nsignals = nsignals
        self.timeout = timeout
        self._group: Any = None  # the Connections of the connect() that made it (set there)

    @property
    def capabilities(self) -> Capabilities:
        return self.transport.capabilities_in(self.world)

    def describe(self) -> str:
        """``link rank 0 <-> rank 2 (transport mpi)``: how errors name it."""
        return describe_link(self.rank, self.peer, self.transport.name)

    # -- host operations ------------------------------------------------------------------------------
    @abstractmethod
    def put(self, offset: int, data: Any) -> None:
        """Put ``data`` (bytes, or a numpy / device array, contiguous) into the peer's inbox at ``offset``."""

    @abstractmethod
    def signal(self, index: int, value: int) -> None:
        """Set the peer's signal word ``index`` to ``value``, after every earlier put of this connection."""

    def put_with_signal(self, offset: int, data: Any, index: int, value: int) -> None:
        """Put, then signal: the peer sees the data before the signal."""
        self.put(offset, data)
        self.signal(index, value)

    @abstractmethod
    def signals(self) -> np.ndarray:
        """My signal words as they are now (a host copy, uint64)."""

    def wait(self, index: int, value: int, timeout: float | None = None) -> int:
        """Wait until my signal word ``index`` is at least ``value``; return it. One line names the link on
        expiry."""
        from .._wait import wait_until
        from ..errors import TimeoutError

        self._check_index(index)
        limit = self.timeout if timeout is None else timeout
        got = [0]

        def ready() -> bool:
            got[0] = int(self.signals()[index])
            return got[0] >= value

        try:
            wait_until(ready, limit, self.describe, self.check)
        except TimeoutError:
            raise TimeoutError(f"{self.describe()}: waited {limit:g} s for signal {index} to reach {value} (it is "
                               f"{got[0]}): rank {self.peer} did not signal") from None
        return got[0]

    def flush(self, timeout: float | None = None) -> None:
        """Every put and signal issued so far has left this rank (transports that complete on return: nothing)."""
        self.check()

    @abstractmethod
    def inbox(self) -> Any:
        """My inbox as an array (numpy on the host, cupy on a GPU): what the peer put."""

    def device_handle(self) -> np.void:
        """``circuslink::transport::Handle`` by value (``circuslink/transport.cuh``)."""
        from ..errors import BackendError

        raise BackendError(f"{self.describe()}: this transport has no device handle on the {self.world.backend.name} "
                           "back-end")

    def check(self) -> None:  # noqa: B027 - transports whose operations fail at once record nothing
        """Raise the transport's recorded failure (:class:`circuslink.TransportError`), if any."""

    def close(self, timeout: float | None = None) -> None:
        """Collective: close the connect() this connection came from (both ends call it)."""
        if self._group is not None:
            self._group.close(timeout)

    def _check_index(self, index: int) -> None:
        from ..errors import ConfigError

        if isinstance(index, bool) or not isinstance(index, int | np.integer) or not 0 <= index < self.nsignals:
            raise ConfigError(f"{self.describe()}: signal index {index!r} is not in 0..{self.nsignals - 1}")

    def _check_range(self, offset: int, nbytes: int) -> None:
        from ..errors import ConfigError

        if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0 \
                or offset + nbytes > self.nbytes:
            raise ConfigError(f"{self.describe()}: a put of {nbytes} bytes at offset {offset!r} does not fit the "
                              f"peer's inbox of {self.nbytes} bytes")


class Connections(Resource):
    """This rank's connections of one :func:`~circuslink.transport.connect` (``group[peer]``), whatever their
    transports. Close it (collective) when done."""

    _kind = "connections"

    def __init__(self, world: Any, parts: list[Any], connections: dict[int, Connection]) -> None:
        self.world = world
        self._parts = parts  # each transport's own group, closed in order
        self.connections = connections
        self._register(world)

    def __getitem__(self, peer: int) -> Connection:
        from ..errors import ConfigError

        try:
            return self.connections[peer]
        except KeyError:
            raise ConfigError(f"rank {self.world.rank} has no connection to rank {peer} (its peers: "
                              f"{', '.join(map(str, sorted(self.connections))) or 'none'})") from None

    def __contains__(self, peer: int) -> bool:
        return peer in self.connections

    def __iter__(self):
        return iter(sorted(self.connections))

    def __len__(self) -> int:
        return len(self.connections)

    def _close(self, timeout: float | None) -> None:
        for part in self._parts:
            part.close(timeout)

    def _release_local(self) -> None:
        for part in self._parts:
            part.release_local()


class Part(ABC):
    """A transport's share of one connect() or open_relays(): what it must close (collectively) or release."""

    @abstractmethod
    def close(self, timeout: float | None) -> None: ...

    @abstractmethod
    def release_local(self) -> None: ...


class Transport(ABC):
    """One transport (a class, never instantiated): registered under a name by ``_registry``, which sets
    :attr:`name`. Adding one means one module with such a class, its test, and one line in the registry."""

    name: str = "?"  # set by the registry; for messages and labels only (never branch on it)
    capabilities: Capabilities
    # The results rows (``impl``) that measure this transport's own point-to-point, for a benchmark to hold a relay
    # or a routed channel over it to: (latency rows, bandwidth rows); empty where there is no such baseline.
    baseline_rows: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    @classmethod
    def capabilities_in(cls, world: Any) -> Capabilities:
        """Its capabilities, with the figures this job measured (:func:`~circuslink.transport.record_figures`)."""
        figures = world.registry(FIGURES_KEY, dict).get(cls.name)
        return cls.capabilities.measured(*figures) if figures else cls.capabilities

    @classmethod
    @abstractmethod
    def unavailable(cls, context: Context) -> str | None:
        """Why it cannot run in a job like ``context`` (one line), or None when it can."""

    @classmethod
    @abstractmethod
    def connect(cls, world: Any, peers: list[int], nbytes: int, nsignals: int,
                timeout: float) -> tuple[Part | None, dict[int, Connection]]:
        """Collective over the world (every rank calls it, ``peers`` its own, possibly empty): this rank's
        connections to ``peers`` and the part that closes them."""

    @classmethod
    def map_memory(cls, world: Any, peers: list[int] | None, nbytes: int, timeout: Any) -> Any:
        """Collective: symmetric memory mapped into ``peers`` (transports whose capabilities say ``mapped``)."""
        from ..errors import ConfigError

        raise ConfigError(f"transport {cls.name} does not map peers' memory")

    @classmethod
    def open_relays(cls, world: Any, peers: list[int], geometry: Any, batch: int, timeout: float,
                    spin: bool) -> tuple[Part | None, dict[int, Any]]:
        """Collective over the world: this rank's relays to ``peers`` (see the module docstring). The default is
        the generic relay over this transport's own connections (``_relay.GenericRelays``)."""
        from ._relay import open_generic_relays

        return open_generic_relays(cls, world, peers, geometry, batch, timeout, spin)


FIGURES_KEY = "circuslink.transport.figures"  # World.registry key: {transport name: (latency_us, bandwidth_GBps)}


def describe_link(rank: int, peer: int, name: str) -> str:
    """How every transport's errors name a link: ``link rank 0 <-> rank 2 (transport mpi)``."""
    return f"link rank {rank} <-> rank {peer} (transport {name})"


def as_bytes(data: Any) -> np.ndarray:
    """``data`` (bytes, numpy array) as a flat uint8 numpy view."""
    if isinstance(data, bytes | bytearray | memoryview):
        return np.frombuffer(data, dtype=np.uint8)
    arr = np.ascontiguousarray(data)
    return arr.reshape(-1).view(np.uint8)


def peer_list(world: Any, peers: int | Iterable[int] | None, what: str) -> list[int]:
    """``peers`` (one rank, ranks, or None) as sorted ranks of the world other than this one; one line when bad."""
    from ..errors import ConfigError

    if peers is None:
        return []
    items = [peers] if isinstance(peers, int | np.integer) and not isinstance(peers, bool) else peers
    try:
        items = list(items)
    except TypeError:
        raise ConfigError(f"{what}: peers must be a rank, ranks or None, got {peers!r}") from None
    out = set()
    for p in items:
        if isinstance(p, bool) or not isinstance(p, int | np.integer) or not 0 <= p < world.size:
            raise ConfigError(f"{what}: peer {p!r} is not a rank of this world of {world.size}")
        if p == world.rank:
            raise ConfigError(f"{what}: rank {world.rank} cannot connect to itself")
        out.add(int(p))
    return sorted(out)
