"""The ring of channels the host-side collectives run over: rank r -> rank r+1 (mod n)."""

from __future__ import annotations

from typing import Any

from .._config import resolve_timeout
from ..channels import Link, element_type
from ..channels import open as open_channels
from ..errors import ConfigError

# Bytes of buffer per ring channel. Pieces are half of it (see _algorithms), so 64 KiB
# keeps ~32 KiB in flight per hop: enough to hide a hop's latency on the cpu back-end.
DEFAULT_DEPTH_BYTES = 1 << 16


class ChannelRing:
    """Opens (collectively) ``count`` parallel rings of byte channels, rank r -> rank r+1.

    ``right`` / ``left`` are ring 0's ends on this rank (the host algorithms use one ring);
    ``rights`` / ``lefts`` all of them (device code gives each block its own ring).
    """

    def __init__(self, world: Any, depth_bytes: int = DEFAULT_DEPTH_BYTES, timeout: float | None = None,
                 count: int = 1, tag: str = "", id_base: int = 0x8000) -> None:
        if not isinstance(depth_bytes, int) or depth_bytes < 32:
            raise ConfigError(f"collectives: depth_bytes must be an integer >= 32, got {depth_bytes!r}")
        if not isinstance(count, int) or count < 1:
            raise ConfigError(f"collectives: the number of rings must be a positive integer, got {count!r}")
        self.world = world
        # Pieces are half a ring, rounded down to 16 bytes so that device code moves whole vectors and
        # every element size (1..8 bytes) divides a piece.
        self.piece = max(16, (depth_bytes // 2) & ~15)
        self.count = count
        self.timeout = 0.0 if timeout == 0 else resolve_timeout(timeout)  # the channels' device waits
        self.channels = None
        self.right = self.left = None
        self.rights: list = []
        self.lefts: list = []
        n = world.size
        if n == 1:
            return
        byte = element_type("uchar")
        if id_base + 2 * n * count > 0xFFFF:
            raise ConfigError(f"collectives: {count} rings x {n} ranks need more channel IDs than 16 bits hold")
        links = []
        for i in range(count):
            for r in range(n):
                first = id_base + 2 * (i * n + r)
                name = f"collectives{tag}.ring{i}.{r}"
                links.append(Link(name=name, receiver_name=name + ".in", send_id=first, recv_id=first + 1,
                                  src_rank=r, dst_rank=(r + 1) % n, element=byte, depth=depth_bytes))
        self.channels = open_channels(world, links, timeout=timeout)
        for i in range(count):
            self.rights.append(self.channels[f"collectives{tag}.ring{i}.{world.rank}"])
            self.lefts.append(self.channels[f"collectives{tag}.ring{i}.{(world.rank - 1) % n}.in"])
        self.right, self.left = self.rights[0], self.lefts[0]

    def check(self) -> None:
        """Raise :class:`~circuslink.ChannelError` naming a ring channel whose device code recorded an error."""
        if self.channels is not None:
            self.channels.check()

    def close(self, timeout: float | None = None) -> None:
        """Collective: free the rings' channels."""
        channels, self.channels = self.channels, None
        if channels is not None:
            channels.close(timeout)

    def release_local(self) -> None:
        """Drop this rank's channels without waiting for peers (the error path)."""
        channels, self.channels = self.channels, None
        release = getattr(channels, "release_local", None)  # channels that hold memory release it here;
        if release is not None:  # otherwise the World releases their buffer with its other resources
            release()
