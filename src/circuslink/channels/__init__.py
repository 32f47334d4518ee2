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
:class:`Link` records (``open(world, [Link(...), ...])``), and :func:`open_halo` opens the channels toward
every neighbour of a process grid in one call, indexed by direction (``circuslink/halo.cuh``). The protocol
is in docs/protocol.md; the back-end modules are ``channels._cpu`` (the reference) and ``channels._cuda``.
Memory comes from the transport that maps it inside a node (``circuslink.transport.map_memory``: ipc); routes
between nodes cross relays (``circuslink.transport.open_relays``), whatever transport carries them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .._config import default_timeout, resolve_timeout
from ..errors import ConfigError
from ._ends import Channels, Receiver, Sender
from ._halo import DIRECTIONS, Halo, open_halo
from ._model import ElementType, Link, Spec, element_type, struct_type
from ._plan import OPTIONS, Plan
from ._routed import RELAY_SLOTS_DEFAULT, mapped_neighbours

__all__ = ["DIRECTIONS", "OPTIONS", "Channels", "ElementType", "Halo", "Link", "Receiver", "Sender", "Spec",
           "element_type", "open", "open_halo", "struct_type"]


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
         allow_cycles: bool = False, link_slots: int | None = None,
         relay: Mapping[str, Any] | None = None) -> Channels:
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

    On a topology of nodes (``nodes:2x4``, docs/scale.md) a channel between ranks of different nodes goes
    through the gateways: its network hop crosses a relay (``circuslink.transport``) that a transport between
    nodes carries: nvshmem where it can run, else mpi (which needs a job started by mpirun: ``circuslink run
    --ranks-per-node K`` starts one when mpirun is there), or the one the link or ``CIRCUSLINK_TRANSPORT``
    names. ``relay`` shapes the relays: ``{"nslots": packets per ring (power of two, default 64), "batch":
    packets per transport message (default a quarter ring), "spin": relays poll without sleeping (default
    False)}``.
    """
    timeout_s = 0.0 if timeout == 0 else resolve_timeout(timeout)
    host_timeout = timeout_s or default_timeout()
    spec = _as_spec(spec_or_links, world.size)
    topo, vcs = _topology_of(spec, topology, vcs, world.size)
    if topo is not None and topo.has_nodes:
        topo.check_nodes(world.nodes, world.describe_nodes())  # memory is mapped only inside the job's nodes
    relay_opts = _relay_options(relay)
    plan = Plan(spec.links, options or {}, topo, vcs, bool(allow_cycles), link_slots, relay_opts["nslots"])
    gathered = world.allgather_object((plan.digest(), tuple(sorted(relay_opts.items())),
                                       world.backend.device_identity), host_timeout)
    digests = [g[:2] for g in gathered]
    if len(set(digests)) != 1:
        groups = ", ".join(f"rank {r}: {d[0]}" for r, d in enumerate(digests))
        raise ConfigError(f"channels.open is collective and needs the same spec and options on every rank ({groups})")
    one_gpu = fences_at_gpu_scope([g[2] for g in gathered])
    router = plan.router
    if router is not None and router.relay_pairs:
        _check_network_possible(world, plan)
    from .. import transport

    peers = None if topo is None else mapped_neighbours(topo, world.rank)
    buf = transport.map_memory(world, peers, plan.nbytes, host_timeout)
    relays = None
    try:
        if router is not None and router.relay_pairs:
            geo = router.relay_geometry
            relays = transport.open_relays(world, router.relay_pairs, nslots=geo.nslots, chunk=geo.chunk,
                                           ll_max=geo.ll_max, batch=relay_opts["batch"], timeout=host_timeout,
                                           spin=relay_opts["spin"], transport=router.relay_transports or None)
        channels = Channels(world, spec, plan, buf, timeout_s, host_timeout, relays, one_gpu=one_gpu)
    except BaseException:
        if relays is not None:
            relays.release_local()
        buf.release_local()
        raise
    world.barrier(host_timeout)
    return channels


def shares_one_gpu(identities: list[str | None]) -> bool:
    """Whether every rank's memory is on one GPU (ranks under MPS): then bulk packets need only .gpu-scoped
    fences (docs/protocol.md). ``identities``: each rank's ``backend.device_identity`` (None without a GPU)."""
    return bool(identities) and identities[0] is not None and len(set(identities)) == 1


def fences_at_gpu_scope(identities: list[str | None]) -> bool:
    """Whether device code shared by these ranks (channels' bulk packets, RMA queues' counters) may release and
    acquire at .gpu scope: every rank on one GPU, unless CIRCUSLINK_SYS_FENCES=1 (a diagnosis switch) asks for
    .sys everywhere."""
    return shares_one_gpu(identities) and os.environ.get("CIRCUSLINK_SYS_FENCES", "") in ("", "0")


_RELAY_KEYS = ("nslots", "batch", "spin")


def _relay_options(relay: Mapping[str, Any] | None) -> dict[str, Any]:
    """The relays' shape for routed channels that cross nodes, checked (one line per bad key or value)."""
    if relay is None:
        relay = {}
    if not isinstance(relay, Mapping):
        raise ConfigError(f"channels.open: relay must be a mapping such as {{'nslots': 64}}, got {relay!r}")
    bad = sorted(set(relay) - set(_RELAY_KEYS))
    if bad:
        raise ConfigError(f"channels.open: relay: unknown option(s) {', '.join(map(str, bad))} (expected "
                          f"{', '.join(_RELAY_KEYS)})")
    nslots = relay.get("nslots", RELAY_SLOTS_DEFAULT)
    if isinstance(nslots, bool) or not isinstance(nslots, int) or nslots < 2 or nslots & (nslots - 1) \
            or nslots > 1 << 16:
        raise ConfigError(f"channels.open: relay nslots {nslots!r} must be a power of two in 2..65536")
    batch = relay.get("batch")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= nslots):
        raise ConfigError(f"channels.open: relay batch {batch!r} must be a number of packets in 1..nslots ({nslots})")
    return {"nslots": nslots, "batch": batch, "spin": bool(relay.get("spin", False))}


def _check_network_possible(world: Any, plan: Plan) -> None:
    """Refuse, in one line and before any allocation, routed channels between nodes in a job where no transport
    joins nodes (every rank computes the same plan, so every rank refuses alike)."""
    from .. import transport
    from ..launcher import ENV_NOT_MPIRUN

    router = plan.router
    names = set(router.relay_transports.values()) or {transport.forced()}
    context = transport.Context.of(world)
    reasons = [transport.why_not_between_nodes(context, name) for name in sorted(names, key=str)]
    if not any(reasons):
        return
    crossing = next(r for r in router.routed if any(h.link.network for h in r.path.hops))
    a, b = crossing.link.src_rank, crossing.link.dst_rank
    how = f"this job was started by {world.launched_by}"
    why = os.environ.get(ENV_NOT_MPIRUN)  # set by circuslink run: why it did not start the job by mpirun
    if why:
        how += f" ({why})"
    raise ConfigError(f"channels.open: channel {crossing.link.name} goes from rank {a} (node {world.node_of(a)}) to "
                      f"rank {b} (node {world.node_of(b)}) through the gateways, and "
                      f"{'; '.join(r for r in reasons if r)}; {how}: start it under mpirun (circuslink run "
                      "--ranks-per-node K does so by itself when mpirun and mpi4py are installed), e.g. "
                      "CIRCUSLINK_RANKS_PER_NODE=2 mpirun -np 4 python app.py")


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
