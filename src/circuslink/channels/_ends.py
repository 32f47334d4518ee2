"""The host objects of the channels: Channels (what open() returns) and the Sender / Receiver ends."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lifecycle import Resource
from ..errors import ChannelError
from . import protocol as P


def describe_end(link: Any, kind: str, rank: int) -> str:
    """How messages name one end: "channel X (id 7, rank 0, sender to rank 1)"."""
    if kind == "send":
        return f"channel {link.name} (id {link.send_id}, rank {rank}, sender to rank {link.dst_rank})"
    return f"channel {link.receiver_name} (id {link.recv_id}, rank {rank}, receiver from rank {link.src_rank})"


class _End:
    def __init__(self, channels: Channels, link: Any, geo: P.RingGeometry, lay: P.ChannelLayout,
                 impl: Any) -> None:
        self._channels = channels
        self.link = link
        self.geometry = geo
        self._layout = lay
        self._impl = impl

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
        """Raise :class:`ChannelError` if device code recorded an error on this end."""
        self._impl.check()


class Sender(_End):
    """The writing end of a channel, on this rank."""

    @property
    def name(self) -> str:
        return self.link.name

    def write(self, data: Any) -> None:
        """Send every element of ``data`` (an array of the channel's element type, any shape), in order.

        Returns when the data is in the receiver's ring; blocks (with a time-out) while the ring is full.
        """
        self._impl.write(self._as_elements(data))

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
        return self._impl.read(int(n))


class Channels(Resource):
    """Every channel of a spec, opened collectively. ``channels[name]`` is the end on this rank."""

    _kind = "set of channels"

    def __init__(self, world: Any, spec: Any, plan: Any, buf: Any, timeout_s: float, host_timeout_s: float) -> None:
        self._world = world
        self.world = world
        self.spec = spec
        self._plan = plan
        self._buf = buf
        self.timeout = timeout_s  # device waits (0: never give up)
        self.host_timeout = host_timeout_s  # host waits: always bounded
        self._ends: dict[str, _End] = {}
        self._where: dict[str, int] = {}
        engine = world.engine("circuslink.channels")
        for link, geo, lay in plan.entries:
            self._where[link.name] = link.src_rank
            self._where[link.receiver_name] = link.dst_rank
            for kind in ("send", "recv"):
                rank = link.src_rank if kind == "send" else link.dst_rank
                if rank != world.rank:
                    continue
                impl = engine.make_end(self, link, geo, lay, kind, describe_end(link, kind, world.rank))
                end = (Sender if kind == "send" else Receiver)(self, link, geo, lay, impl)
                self._ends[end.name] = end
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
        """Raise :class:`ChannelError` naming the first end of this rank whose device code recorded an error."""
        for end in self._ends.values():
            end.check()

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

    def wait_kernel(self, stream: Any, what: Any) -> None:
        """Wait, bounded by :attr:`kernel_wait_s`, for ``stream``'s kernels that use these channels, then
        raise the first error device code recorded on this rank's ends (it names the channel and the
        wait). ``what`` (a string or a function) names the kernel if the host's limit runs out first."""
        try:
            self._world.backend.wait_stream(stream, self.kernel_wait_s, what)
        finally:
            self.check()

    def _check_open(self, op: str = "use") -> None:
        if self._closed:
            raise ChannelError(f"{op}: these channels are closed")

    def _close(self, timeout: float | None) -> None:
        """Collective: free the channels' memory."""
        for end in self._ends.values():
            end._impl.close()
        self._buf.close(timeout)

    def _release_local(self) -> None:
        self._buf.release_local()
