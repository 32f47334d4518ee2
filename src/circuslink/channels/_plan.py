"""Where every channel of an open() lives in the one symmetric allocation."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from . import protocol as P

OPTIONS = ("nslots", "chunk", "ll_max")


class Plan:
    """Every channel's ring geometry and byte offsets; identical on every rank (checked by digest)."""

    def __init__(self, links: list, options: Mapping[str, Mapping[str, Any]]) -> None:
        known = {n for link in links for n in (link.name, link.receiver_name)}
        for name in options:
            if name not in known:
                raise ConfigError(f"channels.open: options name channel {name!r}, which the spec does not declare")
        self.entries: list[tuple[Any, P.RingGeometry, P.ChannelLayout]] = []
        offset = 0
        for link in links:
            opts = dict(options.get(link.name, {}))
            opts.update(options.get(link.receiver_name, {}))
            bad = set(opts) - set(OPTIONS)
            if bad:
                raise ConfigError(f"channel {link.name}: unknown option(s) {', '.join(sorted(bad))} "
                                  f"(expected {', '.join(OPTIONS)})")
            geo = P.geometry(link.depth, link.element.nbytes, name=link.name, **opts)
            lay = P.layout(offset, geo)
            offset = lay.end
            self.entries.append((link, geo, lay))
        self.nbytes = max(256, offset)

    def digest(self) -> str:
        h = hashlib.sha256()
        for link, geo, lay in self.entries:
            h.update(repr((link.name, link.receiver_name, link.send_id, link.recv_id, link.src_rank,
                           link.dst_rank, link.element.nbytes, geo, lay)).encode())
        return h.hexdigest()[:16]
