"""The transport registry: the ONE place that names transports (tests/test_layers.py checks that no other code
tests a transport's name), and the rule that chooses one for a pair of ranks.

Choosing, never by name: the candidates are the registered transports that can run in the job (their
``unavailable(context)`` is None) and whose scope covers the pair (same node, or the network between nodes),
optionally only those whose peer memory is mapped; among them the narrowest adequate scope wins (a transport
made for inside a node beats one made for the network, as NCCL prefers p2p over net), then device-initiated
beats proxied, then the lower latency this job measured (:func:`record_figures`), then registration order. So
between nodes NVSHMEM (device-initiated) is taken when it is installed and the job runs kernels, else MPI.
``CIRCUSLINK_TRANSPORT=NAME`` (``circuslink run --transport NAME``) forces one for links between nodes; a
forced transport that cannot run is refused in one line that says why.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..errors import ConfigError
from ._base import FIGURES_KEY, Capabilities, Context, Scope, Transport

ENV_TRANSPORT = "CIRCUSLINK_TRANSPORT"  # the transport between nodes, forced (circuslink run --transport)

# name -> (module, class). Adding a transport: one line here, one module (and its test) in this package.
_BUILTIN: dict[str, tuple[str, str]] = {
    "ipc": ("circuslink.transport.ipc", "IpcTransport"),
    "mpi": ("circuslink.transport.mpi", "MpiTransport"),
    "nvshmem": ("circuslink.transport.nvshmem", "NvshmemTransport"),
}
_registered: dict[str, type[Transport]] = {}
_order: list[str] = list(_BUILTIN)


def names() -> list[str]:
    """Every registered transport's name, in registration order."""
    return list(_order)


def get(name: str) -> type[Transport]:
    """The transport called ``name`` (one line naming the known ones when there is none)."""
    cls = _registered.get(name)
    if cls is not None:
        return cls
    where = _BUILTIN.get(name)
    if where is None:
        raise ConfigError(f"unknown transport {name!r}: choose one of {', '.join(_order)}")
    cls = getattr(importlib.import_module(where[0]), where[1])
    cls.name = name
    _registered[name] = cls
    return cls


def register(name: str, transport_class: type[Transport]) -> type[Transport]:
    """Register ``transport_class`` under ``name`` (a transport outside this package: a plug-in, a test's fake)."""
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"transport name {name!r} must be a short word")
    transport_class.name = name
    _registered[name] = transport_class
    if name not in _order:
        _order.append(name)
    return transport_class


def unregister(name: str) -> None:
    """Remove a transport registered with :func:`register` (the built-in ones stay)."""
    if name in _BUILTIN:
        raise ConfigError(f"transport {name!r} is built in and stays registered")
    _registered.pop(name, None)
    if name in _order:
        _order.remove(name)


def forced(env: dict[str, str] | None = None) -> str | None:
    """The transport ``CIRCUSLINK_TRANSPORT`` forces between nodes (checked), or None."""
    raw = (os.environ if env is None else env).get(ENV_TRANSPORT, "").strip()
    if not raw:
        return None
    if raw not in _order:
        raise ConfigError(f"{ENV_TRANSPORT}={raw!r} is not a transport: choose one of {', '.join(_order)}")
    return raw


def record_figures(world: Any, name: str, latency_us: float | None, bandwidth_GBps: float | None) -> None:
    """The hook that takes a probe's or benchmark's figures for transport ``name`` in this job (call it on every
    rank with the same figures: choices made from them must agree)."""
    get(name)
    world.registry(FIGURES_KEY, dict)[name] = (latency_us, bandwidth_GBps)


def record_floor(world: Any, floor: dict) -> None:
    """The hook for the probe's figures (``circuslink.probe.measure``, collective): the mapped memory's floor
    (relaxed store-and-poll one-way latency, the best raw bandwidth, of the pair 0 -> 1) is what the transports
    that map peers' memory can reach; rank 0's figures for every rank, so choices made from them agree."""
    summary = floor.get("summary") or {}
    figures = (summary.get("lat_relaxed_us"), max(summary.get("ce_GBps") or 0, summary.get("sm_store_GBps") or 0)
               or None)
    latency, bandwidth = world.broadcast_object(figures if world.rank == 0 else None)
    if latency is None:
        return
    for name in _order:
        if get(name).capabilities.mapped:
            world.registry(FIGURES_KEY, dict)[name] = (latency, bandwidth)


def baseline_rows(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The results rows that measure transport ``name``'s own point-to-point: (latency rows, bandwidth rows)."""
    return get(name).baseline_rows


def why_not(name: str, context: Context, scope: Scope | None = None, mapped: bool = False) -> str | None:
    """Why transport ``name`` cannot carry pairs of ``scope`` in a job like ``context`` (one line), or None."""
    cls = get(name)
    caps: Capabilities = cls.capabilities
    if scope is not None and caps.scope < scope:
        return f"it joins ranks up to {caps.scope.describe()}, and this pair is joined by {scope.describe()}"
    if mapped and not caps.mapped:
        return "it does not map the peer's memory"
    return cls.unavailable(context)


def choose(context: Context, scope: Scope, *, mapped: bool = False, name: str | None = None,
           figures: dict[str, tuple] | None = None, what: str = "transport") -> type[Transport]:
    """The transport for a pair of ``scope`` (see the module docstring); ``name`` forces one (refused in one
    line when it cannot); ``figures``: the job's measured ``{name: (latency_us, bandwidth_GBps)}``."""
    if name is not None:
        why = why_not(name, context, scope, mapped)
        if why:
            raise ConfigError(f"{what}: transport {name} cannot be used: {why}")
        return get(name)
    figures = figures or {}
    ranked = []
    reasons = []
    for position, candidate in enumerate(_order):
        why = why_not(candidate, context, scope, mapped)
        if why:
            if get(candidate).capabilities.scope >= scope:  # one made for narrower pairs is no candidate at all
                reasons.append(f"{candidate}: {why}")
            continue
        caps = get(candidate).capabilities
        latency = (figures.get(candidate) or (None,))[0]
        ranked.append((caps.scope, not caps.device_initiated, latency is None, latency or 0.0, position, candidate))
    if not ranked:
        raise ConfigError(f"{what}: no transport joins ranks across {scope.describe()} in this job ("
                          + "; ".join(reasons) + ")")
    return get(min(ranked)[-1])


def network_choice(context: Context, env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(the transport links between nodes will take in a job like ``context``, or None; a line saying why):
    what ``circuslink run --ranks-per-node K`` reports before starting the job. A name this process does not know
    (a plug-in the ranks register themselves) is reported as it is."""
    raw = (os.environ if env is None else env).get(ENV_TRANSPORT, "").strip()
    if raw and raw not in _order:
        return raw, f"between nodes: transport {raw} (forced by {ENV_TRANSPORT}; registered by the ranks themselves)"
    name = forced(env)
    try:
        chosen = choose(context, Scope.NETWORK, name=name, what="between nodes")
    except ConfigError as exc:
        return None, str(exc)
    how = "forced by " + ENV_TRANSPORT if name else "chosen by capability"
    return chosen.name, f"between nodes: transport {chosen.name} ({how}: {chosen.capabilities.describe()})"
