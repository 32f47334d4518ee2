"""The host objects of the channels: Channels (what open() returns) and the Sender / Receiver ends."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lifecycle import Resource
from ..errors import ChannelError, TransportError
from . import _routed as R
from . import protocol as P


def describe_end(link: Any, kind: str, rank: int, routed: Any = None) -> str:
    """How messages name one end: "channel X (id 7, rank 0, sender to rank 1)", and its route when routed."""
    via = f", routed {R.route_text(routed)}" if routed is not None else ""
    if kind == "send":
        return f"channel {link.name} (id {link.send_id}, rank {rank}, sender to rank {link.dst_rank}{via})"
    return f"channel {link.receiver_name} (id {link.recv_id}, rank {rank}, receiver from rank {link.src_rank}{via})"


class _End:
    def __init__(self, channels: Channels, link: Any, geo: P.RingGeometry, lay: P.ChannelLayout,
                 impl: Any) -> None:
        self._channels = channels
        self.link = link
        self.geometry = geo
        self._layout = lay
        self._impl = impl

    @property
    def channels(self) -> Channels:
        """The set of channels this end was opened with (its time-outs, :meth:`Channels.wait_kernel`)."""
        return self._channels

    @property
    def element(self):
        """The channel's element type (:class:`~circuslink.channels.ElementType`)."""
        return self.link.element

    def device_handle(self) -> np.void:
        """This end as the kernel argument ``circuslink::Sender<T>`` / ``Receiver<T>`` (by value)."""
        self._channels._check_open("device_handle")
        if self._impl.handle is None:
            raise ChannelError(f"channel {self.name}: device_handle() is for kernels, and this world's "
                               f"{self._channels._world.backend.name} back-end runs none")
        return self._impl.handle

    def check(self) -> None:
        """Raise :class:`ChannelError` if device code recorded an error on this end (on a routed channel the
        message also says where its packets wait), or :class:`TransportError` if this rank's relays failed."""
        self._channels._check_relays()
        with self._channels._explained(self):
            self._impl.check()

    @property
    def routed(self) -> bool:
        """Whether this channel is routed (its ends are not neighbours on the channels' topology)."""
        return self._channels._plan.routed_of(self.link) is not None


class Sender(_End):
    """The writing end of a channel, on this rank."""

    @property
    def name(self) -> str:
        return self.link.name

    def write(self, data: Any) -> None:
        """Send every element of ``data`` (an array of the channel's element type, any shape), in order.

        Returns when the data is in the receiver's ring; blocks (with a time-out) while the ring is full.
        """
        arr = self._as_elements(data)
        self._channels._check_relays()
        with self._channels._explained(self):
            self._impl.write(arr)

    def flush(self) -> None:
        """Every write publishes all its bytes (docs/protocol.md), so nothing is ever held back; kept for
        CIRCUS-style code."""
        self._channels._check_open("flush")

    def _as_elements(self, data: Any):
        self._channels._check_open("write")
        xp = self._channels._world.xp
        dtype = self.element.numpy_dtype
        arr = data if hasattr(data, "dtype") else np.asarray(data, dtype=dtype)
        # the bytes travel as they are: same-size dtypes, or rows that make up one element each
        # (an (n, 4) uint32 array for a uint4 channel)
        rows = arr.ndim >= 1 and arr.shape[-1] * arr.dtype.itemsize == dtype.itemsize and arr.dtype.names is None
        if arr.dtype.itemsize != dtype.itemsize and not rows:
            raise ChannelError(f"channel {self.name}: write() got {arr.dtype} elements, the channel carries "
                               f"{self.element.name} ({dtype.itemsize} bytes)")
        if hasattr(arr, "__cuda_array_interface__"):
            return xp.ascontiguousarray(arr).reshape(-1)
        flat = np.ascontiguousarray(arr).reshape(-1)
        return flat if flat.dtype.itemsize == dtype.itemsize else flat.view(np.uint8).view(dtype)


class Receiver(_End):
    """The reading end of a channel, on this rank."""

    @property
    def name(self) -> str:
        return self.link.receiver_name

    def read(self, n: int):
        """The next ``n`` elements, in order (numpy on cpu, cupy on cuda); waits with a time-out."""
        self._channels._check_open("read")
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ChannelError(f"channel {self.name}: read(n) needs a non-negative integer, got {n!r}")
        self._channels._check_relays()
        with self._channels._explained(self):
            return self._impl.read(int(n))


class Channels(Resource):
    """Every channel of a spec, opened collectively. ``channels[name]`` is the end on this rank."""

    _kind = "set of channels"

    def __init__(self, world: Any, spec: Any, plan: Any, buf: Any, timeout_s: float, host_timeout_s: float,
                 relays: Any = None, one_gpu: bool = False) -> None:
        self._world = world
        self.one_gpu = one_gpu  # every rank on one GPU: device fences at .gpu scope (docs/protocol.md)
        self.world = world
        self.spec = spec
        self._plan = plan
        self._buf = buf
        self.timeout = timeout_s  # device waits (0: never give up)
        self.host_timeout = host_timeout_s  # host waits: always bounded
        self._ends: dict[str, _End] = {}
        self._where: dict[str, int] = {}
        self._router = None
        self._relays = relays  # this rank's relays (transport.Relays) when routes cross nodes here
        module = world.backend_module("circuslink.channels")
        for link, geo, lay in plan.entries:
            self._where[link.name] = link.src_rank
            self._where[link.receiver_name] = link.dst_rank
            for kind in ("send", "recv"):
                rank = link.src_rank if kind == "send" else link.dst_rank
                if rank != world.rank:
                    continue
                describe = describe_end(link, kind, world.rank, plan.routed_of(link))
                impl = module.make_end(self, link, geo, lay, kind, describe)
                if relays is not None and hasattr(impl, "watch"):
                    impl.watch = self._check_relays  # a host wait on this rank ends at once if a relay fails
                end = (Sender if kind == "send" else Receiver)(self, link, geo, lay, impl)
                self._ends[end.name] = end
        if plan.router is not None:
            # The forwarding agent of this rank: it only reads this rank's memory and writes its neighbours',
            # which every rank has allocated (zeroed) by now.
            self._router = module.make_router(self)
        self._register(world)

    @property
    def nbytes(self) -> int:
        """Symmetric memory the channels take on each rank."""
        return self._plan.nbytes

    def __getitem__(self, name: str) -> Sender | Receiver:
        self._check_open("channels[name]")
        end = self._ends.get(name)
        if end is None:
            if name in self._where:
                raise ChannelError(f"channel end {name!r} lives on rank {self._where[name]}, "
                                   f"not on this rank ({self._world.rank})")
            raise ChannelError(f"no channel end called {name!r} (known: {', '.join(sorted(self._where))})")
        return end

    def __contains__(self, name: str) -> bool:
        return name in self._ends

    def ends(self) -> list[Sender | Receiver]:
        """The ends living on this rank, in spec order."""
        return list(self._ends.values())

    def check(self) -> None:
        """Raise :class:`ChannelError` naming the first end of this rank whose device code recorded an error,
        or this rank's forwarding agent if it stopped on an error."""
        for end in self._ends.values():
            end.check()
        self._check_router()

    @property
    def topology(self) -> Any:
        """The topology the channels were opened on (None: every rank maps every other)."""
        return self._plan.topology

    @property
    def router(self) -> Any:
        """The routed channels' plan (``_routed.RouterPlan``: link rings, routes), None without routed channels."""
        return self._plan.router

    def route(self, name: str) -> list[int] | None:
        """The ranks a channel's packets pass, sender to receiver, when it is routed (None: a direct channel)."""
        link = self.spec.link(name)
        routed = self._plan.routed_of(link)
        return list(routed.path.ranks) if routed is not None else None

    def max_blocks(self, kernel: Any, threads: int, shared_bytes: int = 0) -> int:
        """Blocks of ``kernel`` this rank may have resident beside its forwarding agent: the back-end's bound
        (``world.backend.max_blocks``) less the agent's SMs while routed channels are open, and an SM for each block
        of a relay's proxy kernel on this rank's GPU (a transport that carries relays from device code)."""
        backend = self._world.backend
        most = backend.max_blocks(kernel, threads, shared_bytes)
        if self._router is None or not backend.sm_budget or backend.sm_budget < 2:
            return most
        proxies = self._relays.device_blocks if self._relays is not None else 0
        reserved = min(getattr(self._router, "sms", 1) + proxies, backend.sm_budget - 1)
        return max(1, most * (backend.sm_budget - reserved) // backend.sm_budget)  # the bound scaled to fewer SMs

    @property
    def relays(self) -> Any:
        """This rank's relays (``transport.Relays``) when routed channels cross nodes here, else None."""
        return self._relays

    def _check_relays(self) -> None:
        """Raise the transport's :class:`TransportError` (naming the link, both ranks and the transport) if one of
        this rank's relays failed."""
        if self._relays is not None and not self._relays.closed:
            self._relays.check()

    def _check_router(self) -> None:
        if self._router is not None:
            err = self._router.check()
            if err:
                raise ChannelError(f"the forwarding agent stopped: {err}")

    def _explained(self, end: _End):
        """A context that adds, to a ChannelError of a routed end, where its packets wait."""
        return _Explained(self, end)

    def _diagnose(self, end: _End) -> str:
        """Where a routed end's packets wait, from the chain records the agents publish (docs/routing.md)."""
        routed = self._plan.routed_of(end.link)
        if routed is None:
            return ""
        parts = []
        err = self._router.check() if self._router is not None else None
        if err:
            parts.append(f"the forwarding agent of rank {self._world.rank} stopped: {err}")
        plan = self._plan.router
        lay = routed.lay
        if isinstance(end, Sender):
            at, offset = routed.path.first, lay.chain
        elif routed.path.first == routed.path.last:
            at, offset = routed.path.last, lay.chain
        else:  # the link ring (or relay) the channel arrives on at its last agent
            hop = routed.path.arrival
            port = self._plan.topology.ports[hop.dst]
            p = next(i for i, pt in enumerate(port) if pt.in_link == hop.link.id)
            at, offset = routed.path.last, plan.link_chain(p, hop.vc)
        try:
            words = self._buf.peer(at)[offset:offset + R.CHAIN_BYTES]
            words = words.get() if hasattr(words, "get") else words
            text = R.describe_chain(R.decode_chain(np.asarray(words).view("<u4")), plan, routed, at)
        except Exception as exc:  # the diagnosis must never hide the error it explains
            text = f"(where its packets wait is unknown: {type(exc).__name__}: {exc})"
        if text:
            parts.append(text)
        return "; ".join(parts)

    @property
    def kernel_wait_s(self) -> float:
        """How long the host waits for a kernel that uses these channels. Longer than the device's own
        waits, so that a stalled channel ends the kernel with an error that names it before the host
        gives up; bounded even when the device waits are not (``timeout=0``)."""
        return 2 * self.timeout + 5 if self.timeout else self.host_timeout

    @property
    def device_timeout_ns(self) -> int:
        """The device waits' limit in nanoseconds (0: none), for a kernel's own waits (``grid_sync``)."""
        return int(self.timeout * 1e9)

    def wait_kernel(self, stream: Any = None, what: Any = None) -> None:
        """Wait, bounded by :attr:`kernel_wait_s`, for ``stream``'s kernels that use these channels (default:
        the caller's current CuPy stream), then raise the first error device code recorded on this rank's
        ends (it names the channel and the wait). ``what`` (a string or a function) names the kernel if the
        host's limit runs out first; on that time-out the host aborts every device wait of this process."""
        backend = self._world.backend
        if stream is None and backend.runs_kernels:
            stream = backend.xp.cuda.get_current_stream()
        if what is None:
            what = f"a kernel using channels on rank {self._world.rank}"
        try:
            backend.wait_stream(stream, self.kernel_wait_s, what)
        finally:
            self.check()

    def _check_open(self, op: str = "use") -> None:
        if self._closed:
            raise ChannelError(f"{op}: these channels are closed")

    def _close(self, timeout: float | None) -> None:
        """Collective: stop this rank's forwarding agent once every rank is done, then free the channels' memory."""
        for end in self._ends.values():
            end._impl.close()
        if self._router is not None:
            self._world.barrier(timeout if timeout is not None else self.host_timeout)  # no rank still sends
            router, self._router = self._router, None
            router.stop(self.host_timeout)
            err = router.check()
            if err:
                self._close_relays(timeout)
                self._buf.close(timeout)
                raise ChannelError(f"the forwarding agent had stopped: {err}")
        self._close_relays(timeout)  # after the agents: they write its out rings until they stop
        self._buf.close(timeout)

    def _close_relays(self, timeout: float | None) -> None:
        if self._relays is not None:
            relays, self._relays = self._relays, None
            # The agent here has stopped; peers' agents may still send (credit reports) until theirs stop: taken
            # and dropped, or a peer's flush would wait for in-ring room no agent frees.
            relays.discard_incoming()
            relays.close(timeout)

    def _release_local(self) -> None:
        if self._router is not None:
            router, self._router = self._router, None
            router.stop(0)
        if self._relays is not None:
            relays, self._relays = self._relays, None
            relays.release_local()
        self._buf.release_local()


class _Explained:
    def __init__(self, channels: Channels, end: _End) -> None:
        self.channels = channels
        self.end = end

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None or not issubclass(exc_type, ChannelError):
            return False
        try:
            self.channels._check_relays()  # a failed transport is the cause: say that, naming the link and both ranks
        except TransportError as failure:
            raise failure from None
        if self.channels._plan.routed_of(self.end.link) is None:
            return False
        extra = self.channels._diagnose(self.end)
        if extra:
            # on a routed channel credits come from the route's first agent, not straight from the reader
            text = str(exc).replace(": its reader stopped consuming", "")
            raise ChannelError(f"{text}; {extra}") from None
        return False
