"""Transports: one interface under channels, RMA and gateways (docs/architecture.md, "Transports").

::

    from circuslink import transport
    conn = transport.connect(world, peer, nbytes=1 << 20)       # collective; one peer (or a list: a group)
    conn.put_with_signal(0, data, 0, epoch)                     # data lands in the peer's inbox, then signal 0
    conn.wait(0, epoch); got = conn.inbox()[:n]                 # what the peer put, once it signalled
    conn.capabilities                                           # device-initiated? scope? latency, bandwidth
    kernel(..., conn.device_handle())                           # circuslink::transport::Handle, by value
    conn.close()                                                # collective

    relays = transport.open_relays(world, [(0, 2)], nslots=64, chunk=65536)   # gateways: packet rings
    relays[2].sender_handle(route), relays[2].receiver_handle()             # a forwarding agent's ends

Which transport carries a pair is chosen by capability and measurement (``_registry``, the one place that
names transports): inside a node the mapped one (ipc: CUDA IPC, or the cpu back-end's shared memory), between
nodes a device-initiated one (nvshmem) when it can run, else a proxied one (mpi). ``transport=NAME`` or
``CIRCUSLINK_TRANSPORT=NAME`` (``circuslink run --transport NAME``) forces one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._config import resolve_timeout
from ..errors import ConfigError
from . import _registry
from ._base import HANDLE, Capabilities, Connection, Connections, Context, Scope, Transport, peer_list
from ._registry import (
    ENV_TRANSPORT,
    baseline_rows,
    forced,
    names,
    network_choice,
    record_figures,
    record_floor,
    register,
    unregister,
)
from ._relay import Relay, Relays

__all__ = ["ENV_TRANSPORT", "HANDLE", "Capabilities", "Connection", "Connections", "Context", "Relay", "Relays",
           "Scope", "Transport", "baseline_rows", "capabilities", "connect", "forced", "map_memory", "names",
           "network_choice", "open_relays", "record_figures", "record_floor", "register", "unregister",
           "why_not_between_nodes"]


def capabilities(world: Any, name: str) -> Capabilities:
    """Transport ``name``'s capabilities in this job (with the figures measured so far)."""
    return _registry.get(name).capabilities_in(world)


def map_memory(world: Any, peers: Iterable[int] | None, nbytes: int, timeout: Any = None) -> Any:
    """Collective: ``nbytes`` of symmetric memory on every rank, mapped into this rank's ``peers`` (None: every rank
    it may map), from the transport that maps peers' memory inside a node (chosen by capability: ipc). What
    channels, routed hops and RMA windows inside a node store into."""
    chosen = _registry.choose(Context.of(world), Scope.SAME_NODE, mapped=True, what="mapped memory")
    return chosen.map_memory(world, None if peers is None else sorted(set(peers)), nbytes, timeout)


def why_not_between_nodes(context: Context, name: str | None = None) -> str | None:
    """None when transport ``name`` (None: any) can join ranks of different nodes in a job like ``context``; else
    one line saying why not."""
    try:
        _registry.choose(context, Scope.NETWORK, name=name, what="between nodes")
    except ConfigError as exc:
        text = str(exc).removeprefix("between nodes: ")
        return text if name else text.replace("no transport joins ranks across the network in this job",
                                              "no transport joins nodes in this job")
    return None


def _scope(world: Any, a: int, b: int, devices: list[Any]) -> Scope:
    if world.node_of(a) != world.node_of(b):
        return Scope.NETWORK
    return Scope.SAME_GPU if devices[a] is not None and devices[a] == devices[b] else Scope.SAME_NODE


def _choose(world: Any, a: int, b: int, devices: list[Any], name: Any, mapped: bool, what: str) -> str:
    scope = _scope(world, a, b, devices)
    if isinstance(name, dict):  # per pair (the transports a topology's links name)
        name = name.get((a, b))
    if name is None and scope == Scope.NETWORK:
        name = forced()
    figures = world.registry("circuslink.transport.figures", dict)
    return _registry.choose(Context.of(world), scope, mapped=mapped, name=name, figures=figures,
                            what=f"{what} rank {a} <-> rank {b}").name


def connect(world: Any, peers: int | Iterable[int] | None, *, nbytes: int = 0, nsignals: int = 8,
            transport: str | None = None, mapped: bool = False, timeout: float | None = None) -> Any:
    """Collective: connect this rank to ``peers`` (one rank: a :class:`Connection`; ranks: :class:`Connections`;
    None: none, but take part). Every rank calls it; a rank that names a peer must be named by it.

    ``nbytes``: each side's inbox; ``nsignals``: each side's signal words; ``transport``: force one by name
    (else chosen by capability: see the module docstring); ``mapped``: only transports that map the peer's
    memory; ``timeout``: every wait of the connections (default CIRCUSLINK_TIMEOUT).
    """
    world._check_open()
    single = isinstance(peers, int) and not isinstance(peers, bool)
    mine = peer_list(world, peers, "connect")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ConfigError(f"connect: nbytes {nbytes!r} must be a number of bytes >= 0")
    if isinstance(nsignals, bool) or not isinstance(nsignals, int) or not 1 <= nsignals <= 1 << 16:
        raise ConfigError(f"connect: nsignals {nsignals!r} must be in 1..65536")
    if transport is not None:
        _registry.get(transport)
    limit = resolve_timeout(timeout)
    shape = (nbytes, nsignals, transport, bool(mapped))
    everyone = world.allgather_object((mine, shape, world.device))
    differ = [r for r, theirs in enumerate(everyone) if theirs[1] != shape]
    if differ:
        raise ConfigError(f"connect is collective and needs the same nbytes, nsignals and transport on every rank; "
                          f"rank {differ[0]} asked for {everyone[differ[0]][1]}, rank {world.rank} for {shape}")
    for r, (theirs, _, _) in enumerate(everyone):
        for p in theirs:
            if r not in everyone[p][0]:
                raise ConfigError(f"connect: rank {r} connects to rank {p}, but rank {p} does not connect to rank {r} "
                                  "(a connection has two ends: each names the other)")
    devices = [d for _, _, d in everyone]
    chosen = {}
    for r, (theirs, _, _) in enumerate(everyone):
        for p in theirs:
            if r < p:
                chosen[(r, p)] = _choose(world, r, p, devices, transport, mapped, "connect:")
    _agree(world, chosen, "connect")
    used = [n for n in _registry.names() if n in set(chosen.values())]
    parts, connections = [], {}
    try:
        for name in used:
            peers_here = [p for p in mine if chosen[(min(p, world.rank), max(p, world.rank))] == name]
            part, conns = _registry.get(name).connect(world, peers_here, nbytes, nsignals, limit)
            if part is not None:
                parts.append(part)
            connections.update(conns)
    except BaseException:
        for part in parts:
            part.release_local()
        raise
    group = Connections(world, parts, connections)
    for conn in connections.values():
        conn._group = group
    return group[mine[0]] if single else group


def open_relays(world: Any, pairs: Iterable[tuple[int, int]], *, nslots: int = 64, chunk: int = 64 << 10,
                ll_max: int | None = None, batch: int | None = None, timeout: float | None = None, spin: bool = False,
                transport: str | dict[tuple[int, int], str] | None = None) -> Relays:
    """Collective: the relays of ``pairs`` (``(a, b)`` ranks of different nodes, the same list on every rank),
    each end two rings of ``nslots`` slots of ``chunk``-byte bulk packets (docs/scale.md).

    ``batch``: most packets one transport message carries (default a quarter ring); ``timeout``: every wait of
    the relays (default CIRCUSLINK_TIMEOUT); ``spin``: relays poll without sleeping (for measurements);
    ``transport``: force one, for every pair or per ``(a, b)`` pair (else ``CIRCUSLINK_TRANSPORT``, else chosen
    by capability). A rank in no pair takes part and holds none.
    """
    from ..channels import protocol as P

    world._check_open()
    try:
        geo = P.geometry(1, 1, nslots=nslots, chunk=chunk, ll_max=P.LL_MAX_DEFAULT if ll_max is None else ll_max,
                         name="relay")
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("channel relay:", "relays:")) from None
    batch = max(1, nslots // 4) if batch is None else batch
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= nslots:
        raise ConfigError(f"relays: batch {batch!r} must be a number of packets in 1..nslots ({nslots})")
    for name in (transport.values() if isinstance(transport, dict) else [transport]):
        if name is not None:
            _registry.get(name)
    limit = resolve_timeout(timeout)
    checked = _relay_pairs(world, pairs)
    named = sorted(transport.items()) if isinstance(transport, dict) else transport
    mine = (checked, geo.nslots, geo.chunk, geo.ll_max, batch, named)
    everyone = world.allgather_object((mine, world.device))
    differ = [r for r, theirs in enumerate(everyone) if theirs[0] != mine]
    if differ:
        raise ConfigError(f"open_relays is collective and needs the same pairs and ring shape on every rank; rank "
                          f"{differ[0]} asked for {everyone[differ[0]][0]}, rank {world.rank} for {mine}")
    devices = [d for _, d in everyone]
    chosen = {(a, b): _choose(world, a, b, devices, transport, False, "relays:") for a, b in checked}
    _agree(world, chosen, "open_relays")
    used = [n for n in _registry.names() if n in set(chosen.values())]
    groups = []
    try:
        for name in used:
            peers = sorted(b if a == world.rank else a for (a, b), n in chosen.items()
                           if n == name and world.rank in (a, b))
            group, _ = _registry.get(name).open_relays(world, peers, geo, batch, limit, spin)
            if group is not None:
                groups.append(group)
    except BaseException:
        for group in groups:
            group.release_local()
        raise
    return Relays(world, geo, limit, groups)


def _agree(world: Any, chosen: dict[tuple[int, int], str], what: str) -> None:
    """Every rank chose the same transport for every pair (the choice is collective: each transport's part is);
    ranks that measured different figures, or registered different plug-ins, are told in one line."""
    everyone = world.allgather_object(sorted(chosen.items()))
    for r, theirs in enumerate(everyone):
        other = dict(theirs)
        for pair in sorted(set(chosen) | set(other)):
            if chosen.get(pair) != other.get(pair):
                raise ConfigError(f"{what}: ranks chose different transports: for ranks {pair[0]} <-> {pair[1]} rank "
                                  f"{world.rank} takes {chosen.get(pair)}, rank {r} {other.get(pair)} (record the same "
                                  "figures and register the same transports on every rank)")


def _relay_pairs(world: Any, pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``pairs`` as sorted ``(a, b)`` with ``a < b``, every pair joining ranks of different nodes; one line when
    bad."""
    import numpy as np

    out = set()
    try:
        items = list(pairs)
    except TypeError:
        raise ConfigError("relays: give (a, b) rank pairs") from None
    for item in items:
        try:
            a, b = item
        except (TypeError, ValueError):
            raise ConfigError(f"relays: {item!r} is not an (a, b) pair of ranks") from None
        for r in (a, b):
            if isinstance(r, bool) or not isinstance(r, int | np.integer) or not 0 <= r < world.size:
                raise ConfigError(f"relays: rank {r!r} is not a rank of this world of {world.size}")
        if a == b:
            raise ConfigError(f"relays: a relay joins two ranks, got ({a}, {b})")
        out.add((int(min(a, b)), int(max(a, b))))
    for a, b in sorted(out):
        if world.node_of(a) == world.node_of(b):
            raise ConfigError(f"relays: ranks {a} and {b} are both in node {world.node_of(a)}: relays join nodes, and "
                              "inside a node ranks map each other's memory")
    return sorted(out)
