"""CIRCUS channels: typed, ordered, flow-controlled streams between ranks.

    import circuslink as cl
    from circuslink import channels
    world = cl.init()
    ch = channels.open(world, "app.xml")          # collective; every rank passes the same spec
    if world.rank == 0:
        ch["simple_out"].write(np.arange(100, dtype=np.uint32))
    else:
        data = ch["simple_in"].read(100)          # in order, exactly once
    ch.close()                                    # collective

``channels[name]`` is the end living on this rank: a :class:`Sender` or a :class:`Receiver`.
Kernels get ``end.device_handle()`` (a numpy scalar with the layout of
``circuslink::Sender<T>`` / ``Receiver<T>``, passed by value). The protocol is in
docs/protocol.md; on the cpu back-end the Python methods are its reference implementation,
on cuda they launch small kernels built on the same device code users call.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .._config import default_timeout, resolve_timeout
from ..errors import ChannelError, ConfigError, SpecError
from . import protocol as _P

__all__ = ["Channels", "Receiver", "Sender", "open"]


def _load_links(spec_or_links: Any, nranks: int) -> tuple[list, Any]:
    from ..spec import Link, Spec, load

    if isinstance(spec_or_links, Spec):
        spec = spec_or_links
    elif isinstance(spec_or_links, Link):
        spec = Spec([spec_or_links])
    elif isinstance(spec_or_links, str | os.PathLike):
        spec = load(spec_or_links, nranks=nranks)
    elif isinstance(spec_or_links, Iterable):
        links = list(spec_or_links)
        for i, link in enumerate(links):
            if not isinstance(link, Link):
                raise ConfigError(f"channels.open: item {i} is a {type(link).__name__}, not a circuslink.spec.Link")
        spec = Spec(links)
    else:
        raise ConfigError(f"channels.open: expected a Spec, a list of Links, or a spec path / XML text, "
                          f"got {type(spec_or_links).__name__}")
    spec.check_nranks(nranks)
    return spec.links, spec


class _Plan:
    """Where every channel lives in the one symmetric allocation."""

    def __init__(self, links: list, options: Mapping[str, Mapping[str, Any]]) -> None:
        known = {n for link in links for n in (link.name, link.receiver_name)}
        for name in options:
            if name not in known:
                raise ConfigError(f"channels.open: options name channel {name!r}, which the spec does not declare")
        self.entries = []
        offset = 0
        for link in links:
            opts = dict(options.get(link.name, {}))
            opts.update(options.get(link.receiver_name, {}))
            bad = set(opts) - {"mode", "nslots", "chunk"}
            if bad:
                raise ConfigError(f"channel {link.name}: unknown option(s) {', '.join(sorted(bad))} "
                                  "(expected mode, nslots, chunk)")
            geo = _P.geometry(link.depth, link.element.nbytes, name=link.name, **opts)
            lay = _P.layout(offset, geo)
            offset = lay.end
            self.entries.append((link, geo, lay))
        self.nbytes = max(256, offset)

    def digest(self) -> str:
        h = hashlib.sha256()
        for link, geo, lay in self.entries:
            h.update(repr((link.name, link.receiver_name, link.send_id, link.recv_id, link.src_rank,
                           link.dst_rank, link.element.nbytes, geo, lay)).encode())
        return h.hexdigest()[:16]


class _EndBase:
    def __init__(self, channels: Channels, link: Any, geo: _P.RingGeometry, lay: _P.ChannelLayout,
                 impl: Any) -> None:
        self._channels = channels
        self.link = link
        self.geometry = geo
        self._layout = lay
        self._impl = impl

    @property
    def element(self):
        """The channel's :class:`~circuslink.spec.ElementType`."""
        return self.link.element

    @property
    def mode(self) -> str:
        return self.geometry.mode_name

    def device_handle(self) -> np.void:
        """This end as the kernel argument ``circuslink::Sender<T>`` / ``Receiver<T>`` (by value)."""
        if self._channels._world.backend.name != "cuda":
            raise ConfigError(f"channel {self.name}: device_handle() is for kernels on the cuda back-end")
        return self._impl.handle

    def check(self) -> None:
        """Raise :class:`ChannelError` if device code recorded an error on this end."""
        self._impl.check()


class Sender(_EndBase):
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
        self._channels._check_open()

    def _as_elements(self, data: Any):
        self._channels._check_open()
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


class Receiver(_EndBase):
    """The reading end of a channel, on this rank."""

    @property
    def name(self) -> str:
        return self.link.receiver_name

    def read(self, n: int):
        """The next ``n`` elements, in order (numpy on cpu, cupy on cuda); waits with a time-out."""
        self._channels._check_open()
        if not isinstance(n, int | np.integer) or n < 0:
            raise ChannelError(f"channel {self.name}: read(n) needs a non-negative integer, got {n!r}")
        return self._impl.read(int(n))


class Channels:
    """Every channel of a spec, opened collectively. ``channels[name]`` is the end on this rank."""

    def __init__(self, world: Any, spec: Any, plan: _Plan, buf: Any, timeout_s: float) -> None:
        self._world = world
        self.spec = spec
        self._plan = plan
        self._buf = buf
        self.timeout = timeout_s  # device waits (0: never give up)
        self.host_timeout = timeout_s or default_timeout()  # host waits: always bounded
        self._closed = False
        self._ends: dict[str, _EndBase] = {}
        self._where: dict[str, int] = {}
        if world.backend.name == "cuda":
            from . import cuda as backend_impl
        else:
            backend_impl = None
        for link, geo, lay in plan.entries:
            self._where[link.name] = link.src_rank
            self._where[link.receiver_name] = link.dst_rank
            for kind in ("send", "recv"):
                rank = link.src_rank if kind == "send" else link.dst_rank
                if rank != world.rank:
                    continue
                impl = (backend_impl.make_end if backend_impl else _make_cpu_end)(self, link, geo, lay, kind)
                cls = Sender if kind == "send" else Receiver
                end = cls(self, link, geo, lay, impl)
                self._ends[end.name] = end

    @property
    def nbytes(self) -> int:
        """Symmetric memory the channels take on each rank."""
        return self._plan.nbytes

    def __getitem__(self, name: str) -> Sender | Receiver:
        self._check_open()
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

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelError("these channels are closed")

    def close(self, timeout: float | None = None) -> None:
        """Collective: free the channels' memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for end in self._ends.values():
            close = getattr(end._impl, "close", None)
            if close:
                close()
        self._buf.close(timeout)

    def __enter__(self) -> Channels:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()


def _describe(link: Any, kind: str, rank: int) -> str:
    if kind == "send":
        return f"channel {link.name} (id {link.send_id}, rank {rank}, sender to rank {link.dst_rank})"
    return f"channel {link.receiver_name} (id {link.recv_id}, rank {rank}, receiver from rank {link.src_rank})"


def _make_cpu_end(channels: Channels, link: Any, geo: _P.RingGeometry, lay: _P.ChannelLayout, kind: str):
    from .cpu import CpuReceiver, CpuSender

    buf = channels._buf
    src, dst = buf.peer(link.src_rank), buf.peer(link.dst_rank)
    me = buf.local
    ring = dst[lay.ring:lay.ring + geo.ring_bytes]
    credit = src[lay.ctrl + _P.CTRL_CREDIT:lay.ctrl + _P.CTRL_CREDIT + 8].view("<u8")
    slot_credits = src[lay.slot_credits:lay.slot_credits + 4 * geo.nslots].view("<u4")
    err_off = lay.ctrl + (_P.CTRL_SEND_ERROR if kind == "send" else _P.CTRL_RECV_ERROR)
    error = me[err_off:err_off + 16].view("<u4")
    args = (link.name if kind == "send" else link.receiver_name, _describe(link, kind, channels._world.rank),
            link.send_id if kind == "send" else link.recv_id, geo, ring, credit, slot_credits, error,
            channels.host_timeout, _P.route_of(link.recv_id, link.dst_rank))
    impl = CpuSender(*args) if kind == "send" else CpuReceiver(*args)
    return _CpuEnd(impl, link.element.numpy_dtype)


class _CpuEnd:
    """Adapts the byte-level reference endpoints to typed arrays."""

    def __init__(self, impl: Any, dtype: np.dtype) -> None:
        self.impl = impl
        self.dtype = dtype
        self.handle = None

    def write(self, arr: np.ndarray) -> None:
        self.impl.write_bytes(arr.tobytes())

    def read(self, n: int) -> np.ndarray:
        return np.frombuffer(self.impl.read_bytes(n * self.dtype.itemsize), dtype=self.dtype).copy()

    def check(self) -> None:
        self.impl._check_error()


def open(world: Any, spec_or_links: Any, timeout: float | None = None,  # noqa: A001 - channels.open
         options: Mapping[str, Mapping[str, Any]] | None = None) -> Channels:
    """Collective: open every channel of ``spec_or_links`` (a Spec, Links, or a spec path / XML text).

    All rings live in one symmetric allocation. ``timeout`` (seconds, default CIRCUSLINK_TIMEOUT)
    bounds every wait, host or device; ``timeout=0`` lets device waits run for ever (a kernel that
    streams for hours), while the host's waits for circuslink's own kernels stay bounded by
    CIRCUSLINK_TIMEOUT: on expiry the host aborts the device waits and raises. ``options`` maps a channel end name to
    ``{"mode": "auto"|"ll"|"bw", "nslots": power of two, "chunk": bytes}`` (docs/protocol.md, Sizing).
    Every rank must pass the same spec and options.
    """
    timeout_s = 0.0 if timeout == 0 else resolve_timeout(timeout)
    timeout = timeout or None  # the host's own waits below are always bounded
    try:
        links, spec = _load_links(spec_or_links, world.size)
    except SpecError:
        raise
    plan = _Plan(links, options or {})
    digests = world.allgather_object(plan.digest(), timeout)
    if len(set(digests)) != 1:
        groups = ", ".join(f"rank {r}: {d}" for r, d in enumerate(digests))
        raise ConfigError(f"channels.open is collective and needs the same spec and options on every rank ({groups})")
    buf = world.alloc(plan.nbytes, timeout)
    try:
        channels = Channels(world, spec, plan, buf, timeout_s)
    except BaseException:
        buf.release_local()
        raise
    world.barrier(timeout)
    return channels
