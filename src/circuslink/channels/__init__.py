"""CIRCUS channels: typed, ordered, flow-controlled streams between ranks.

    import circuslink as cl
    world = cl.init()
    ch = cl.channels.open(world, cl.spec.load("app.xml", nranks=world.size))   # collective
    if world.rank == 0:
        ch["simple_out"].write(np.arange(100, dtype=np.uint32))
    else:
        data = ch["simple_in"].read(100)          # in order, exactly once
    ch.close()                                    # collective

``channels[name]`` is the end living on this rank: a :class:`Sender` or a :class:`Receiver` (host
objects); kernels get ``end.device_handle()``, the by-value device handle ``circuslink::Sender<T>`` /
``Receiver<T>`` of ``circuslink/channel.cuh``. A spec can also be built in Python from
:class:`Link` records (``open(world, [Link(...), ...])``). The protocol is in docs/protocol.md; the
back-end halves are the engines ``channels._cpu`` (the reference) and ``channels._cuda``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._config import default_timeout, resolve_timeout
from ..errors import ConfigError
from ._ends import Channels, Receiver, Sender
from ._model import ElementType, Link, Spec, element_type, struct_type
from ._plan import OPTIONS, Plan

__all__ = ["OPTIONS", "Channels", "ElementType", "Link", "Receiver", "Sender", "Spec", "element_type", "open",
           "struct_type"]


def _as_spec(spec_or_links: Any, nranks: int) -> Spec:
    if isinstance(spec_or_links, Spec):
        spec = spec_or_links
    elif isinstance(spec_or_links, Link):
        spec = Spec([spec_or_links])
    elif isinstance(spec_or_links, Iterable) and not isinstance(spec_or_links, str | bytes):
        links = list(spec_or_links)
        for i, link in enumerate(links):
            if not isinstance(link, Link):
                raise ConfigError(f"channels.open: item {i} is a {type(link).__name__}, not a circuslink.channels.Link")
        spec = Spec(links)
    else:
        raise ConfigError(f"channels.open: expected a Spec or Links, got {type(spec_or_links).__name__} "
                          "(an app.xml file: circuslink.spec.load(path, nranks=world.size) first)")
    spec.check_nranks(nranks)
    return spec


def open(world: Any, spec_or_links: Any, timeout: float | None = None,  # noqa: A001 - channels.open
         options: Mapping[str, Mapping[str, Any]] | None = None, *, topology: Any = None, vcs: int | None = None,
         allow_cycles: bool = False, link_slots: int | None = None) -> Channels:
    """Collective: open every channel of ``spec_or_links`` (a :class:`Spec`, a :class:`Link` or Links).

    All rings live in one symmetric allocation. ``timeout`` (seconds, default CIRCUSLINK_TIMEOUT)
    bounds every wait, host or device; ``timeout=0`` lets device waits run for ever (a kernel that
    streams for hours), while the host's waits for circuslink's own kernels stay bounded by
    CIRCUSLINK_TIMEOUT: on expiry the host aborts the device waits and raises. ``options`` maps a
    channel end name to ``{"nslots": power of two, "chunk": bytes, "ll_max": bytes}`` (docs/protocol.md,
    Sizing). Every rank must pass the same spec and options.

    ``topology`` (a :class:`~circuslink.topology.Topology` or a string such as ``"torus:4x4"``; default: the
    spec's ``<topology>``) declares a direct network: each rank maps only its neighbours' memory, and every
    channel whose ends are not neighbours is routed hop by hop through the forwarding agents of the ranks
    between (docs/routing.md), with the same device and host API. ``vcs``: virtual channels (default: the
    spec's, else the topology's: 2 with datelines on rings and tori). Routed channels whose buffers could
    wait on each other in a cycle are refused unless ``allow_cycles=True`` (a deadlock then ends in time-outs
    that name the cycle). ``link_slots``: packets each link ring holds (a power of two, default 8).
    """
    timeout_s = 0.0 if timeout == 0 else resolve_timeout(timeout)
    host_timeout = timeout_s or default_timeout()
    spec = _as_spec(spec_or_links, world.size)
    topo, vcs = _topology_of(spec, topology, vcs, world.size)
    plan = Plan(spec.links, options or {}, topo, vcs, bool(allow_cycles), link_slots)
    digests = world.allgather_object(plan.digest(), host_timeout)
    if len(set(digests)) != 1:
        groups = ", ".join(f"rank {r}: {d}" for r, d in enumerate(digests))
        raise ConfigError(f"channels.open is collective and needs the same spec and options on every rank ({groups})")
    peers = None if topo is None else topo.neighbours(world.rank)
    buf = world.alloc(plan.nbytes, host_timeout, peers=peers)
    try:
        channels = Channels(world, spec, plan, buf, timeout_s, host_timeout)
    except BaseException:
        buf.release_local()
        raise
    world.barrier(host_timeout)
    return channels


def _topology_of(spec: Spec, topology: Any, vcs: int | None, nranks: int) -> tuple[Any, int | None]:
    """The topology the channels run on (the argument, else the spec's) and its virtual-channel count."""
    if topology is None and vcs is not None and spec.topology is None:
        raise ConfigError("channels.open: vcs is given without a topology (virtual channels belong to routed links)")
    if topology is None:
        topo = spec.topology
    else:
        from .. import topology as _topology

        topo = _topology.parse(topology)
        if spec.topology is not None and (spec.topology.name, spec.topology.size) != (topo.name, topo.size):
            raise ConfigError(f"channels.open: topology {topo.name} differs from the spec's {spec.topology.name}")
    if topo is None:
        return None, None
    topo.check_nranks(nranks)
    topo.check_connected()
    chosen = vcs if vcs is not None else spec.vcs
    topo.routing(chosen)  # a count the topology cannot use fails here, naming it
    return topo, chosen
