"""Where every channel of an open() lives in the one symmetric allocation."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from . import _routed as R
from . import protocol as P

RDV_OPTIONS = ("window", "rendezvous_min")
OPTIONS = ("nslots", "chunk", "ll_max") + RDV_OPTIONS  # what options may give a channel end


def rendezvous_options(link: Any, opts: dict[str, Any], routed: bool) -> tuple[Any, int] | None:
    """(window, rendezvous_min) of one channel, or None: the options "window" (a symmetric buffer holding the
    writer's sources) and "rendezvous_min" (bytes, default protocol.RDV_MIN_DEFAULT), removed from ``opts``."""
    window = opts.pop("window", None)
    least = opts.pop("rendezvous_min", None)
    if window is None:
        if least is not None:
            raise ConfigError(f"channel {link.name}: rendezvous_min needs a window (the symmetric buffer the writer's "
                              "large messages are pulled from)")
        return None
    if not all(hasattr(window, a) for a in ("ptr", "nbytes", "mapped")):
        raise ConfigError(f"channel {link.name}: window must be a symmetric buffer (world.alloc), got "
                          f"{type(window).__name__}")
    if routed:
        raise ConfigError(f"channel {link.name}: a window needs the reader to map the writer's memory; ranks "
                          f"{link.src_rank} and {link.dst_rank} are not neighbours on this topology (the channel is "
                          "routed)")
    least = P.RDV_MIN_DEFAULT if least is None else least
    if isinstance(least, bool) or not isinstance(least, int) or not 1 <= least < 1 << 32:
        raise ConfigError(f"channel {link.name}: rendezvous_min {least!r} must be a number of bytes in 1..2^32-1")
    return window, least


class Plan:
    """Every channel's ring geometry and byte offsets; identical on every rank (checked by digest).

    With a ``topology``, channels whose ends are not mapped neighbours are routed (``_routed``): ``routed`` maps
    their sender's name to their route and ``router`` holds the link rings the forwarding agents share (and the
    relays that routes between nodes cross, with ``relay_slots`` packets per ring)."""

    def __init__(self, links: list, options: Mapping[str, Mapping[str, Any]], topology: Any = None,
                 vcs: int | None = None, allow_cycles: bool = False, link_slots: int | None = None,
                 relay_slots: int = R.RELAY_SLOTS_DEFAULT) -> None:
        known = {n for link in links for n in (link.name, link.receiver_name)}
        for name in options:
            if name not in known:
                raise ConfigError(f"channels.open: options name channel {name!r}, which the spec does not declare")
        routing, to_route = (None, set()) if topology is None else R.plan_routes(links, topology, vcs)
        self.topology = topology
        self.entries: list[tuple[Any, P.RingGeometry, Any]] = []
        self.routed: dict[str, R.Routed] = {}
        self.windows: dict[str, tuple[Any, int]] = {}  # sender name -> (window, rendezvous_min)
        offset = 0
        for link in links:
            opts = dict(options.get(link.name, {}))
            opts.update(options.get(link.receiver_name, {}))
            bad = set(opts) - set(OPTIONS)
            if bad:
                raise ConfigError(f"channel {link.name}: unknown option(s) {', '.join(sorted(bad))} "
                                  f"(expected {', '.join(OPTIONS)})")
            rdv = rendezvous_options(link, opts, link.name in to_route)
            if rdv is not None:
                self.windows[link.name] = rdv
            geo = P.geometry(link.depth, link.element.nbytes, name=link.name, **opts)
            if link.name in to_route:
                lay = R.routed_layout(offset, geo)
                self.routed[link.name] = R.make_routed(len(self.routed), link, geo, lay, routing)
            else:
                lay = P.layout(offset, geo)
            offset = lay.end
            self.entries.append((link, geo, lay))
        self.router: R.RouterPlan | None = None
        if self.routed:
            slots = R.LINK_SLOTS_DEFAULT if link_slots is None else link_slots
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 2 or slots & (slots - 1) \
                    or slots > 1 << 16:
                raise ConfigError(f"channels.open: link_slots {link_slots!r} must be a power of two in 2..65536")
            self.router = R.RouterPlan(topology, routing, list(self.routed.values()), offset, slots, relay_slots)
            offset = self.router.end
            if not allow_cycles:
                cycle = self.router.cycle()
                if cycle:
                    raise ConfigError(
                        f"channels.open: the routed channels on {topology.name} with {routing.vcs} virtual channel(s) "
                        f"can deadlock: these (link, vc) buffers can wait on each other in a cycle: "
                        f"{self.router.cycle_text(cycle)}; use the default virtual channels (dateline), or "
                        "allow_cycles=True to run it anyway (a deadlock then ends in time-outs naming the cycle)")
        self.nbytes = max(256, offset)

    def window_of(self, link: Any) -> tuple[Any, int] | None:
        """(window, rendezvous_min) of a channel opened with a window, else None."""
        return self.windows.get(link.name)

    def routed_of(self, link: Any) -> R.Routed | None:
        return self.routed.get(link.name)

    def digest(self) -> str:
        h = hashlib.sha256()
        for link, geo, lay in self.entries:
            h.update(repr((link.name, link.receiver_name, link.send_id, link.recv_id, link.src_rank,
                           link.dst_rank, link.element.nbytes, geo, lay)).encode())
            if link.name in self.windows:
                window, least = self.windows[link.name]
                h.update(repr(("window", window.nbytes, least)).encode())
        if self.router is not None:
            h.update(repr(self.router.digest_items()).encode())
        return h.hexdigest()[:16]
