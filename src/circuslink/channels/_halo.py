"""Halo channels in one call: a channel toward each neighbour of a process grid, indexed by direction.

    halo = cl.channels.open_halo(world, "mesh:2x3", "float", depth=2 * 1024)   # collective
    box = halo.block((1000, 700))           # this rank's block of the global array (uneven splits)
    got = halo.exchange({d: edge(d) for d in halo.directions})   # host API: the cpu back-end's way
    kernel(..., halo.device_handle())       # circuslink::Halo<float> (circuslink/halo.cuh) on cuda

A process grid is ``ring:N`` or ``line:N`` (one dimension), ``mesh:XxY[xZ]`` or ``torus:XxY[xZ]``; rank
``r`` sits at ``topology.coords(r)`` (x fastest). Directions number ``2 * dim`` toward +dim and
``2 * dim + 1`` toward -dim (+x 0, -x 1, +y 2, -y 3, +z 4, -z 5), as the topologies number their ports.
Periodic grids (ring, torus) wrap every dimension, also of 1 or 2 ranks: a rank with one neighbour along a
dimension of 2 gets two channels to it (its two edges are different data), and a dimension of 1 wraps onto
the rank itself. Meshes and lines have no neighbour past their boundary: ``has(d)`` is False there.

The channels are plain :class:`~circuslink.channels.Link` records opened with :func:`circuslink.channels.open`,
one per rank and direction, ``depth`` elements each; the channel toward direction d is the neighbour's
receiver "from the opposite direction" (``d ^ 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import _abi
from ..errors import ConfigError
from . import protocol as P
from ._model import ElementType, Link, element_type

DIRECTIONS = ("+x", "-x", "+y", "-y", "+z", "-z")
MAX_DIMS = 3
_PERIODIC = {"ring": True, "torus": True, "line": False, "mesh": False}

# circuslink::Halo<T> (circuslink/halo.cuh); T does not change the layout: every end is a ChannelHandle.
HALO = _abi.Struct("circuslink::Halo<unsigned char>", "circuslink/halo.cuh", [
    ("to", P.HANDLE, 2 * MAX_DIMS), ("from", P.HANDLE, 2 * MAX_DIMS), ("present", _abi.U32), ("dims", _abi.U32)])


def direction(name: str | int) -> int:
    """A direction's index from its name (``"+x"`` -> 0, ``"-y"`` -> 3) or its index, checked."""
    if isinstance(name, str) and name in DIRECTIONS:
        return DIRECTIONS.index(name)
    if isinstance(name, int | np.integer) and not isinstance(name, bool) and 0 <= int(name) < len(DIRECTIONS):
        return int(name)
    raise ConfigError(f"halo: {name!r} is not a direction (one of {', '.join(DIRECTIONS)}, or 0..5)")


def opposite(d: int) -> int:
    """The direction a neighbour in direction ``d`` sees this rank in."""
    return d ^ 1


def split_extent(n: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, count)`` of part ``index`` when ``n`` cells are split into ``parts`` contiguous parts as evenly
    as they go: the first ``n % parts`` parts get one cell more."""
    if parts < 1 or not 0 <= index < parts:
        raise ConfigError(f"halo: part {index} of {parts} does not exist")
    if n < parts:
        raise ConfigError(f"halo: {n} cells cannot be split among {parts} ranks (each needs at least one)")
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def _grid_of(topology: Any, nranks: int) -> tuple[Any, tuple[int, ...], bool]:
    from .. import topology as _topology

    topo = _topology.parse(topology)
    if topo.kind not in _PERIODIC:
        raise ConfigError(f"open_halo: topology {topo.name} is not a process grid (ring:N, line:N, mesh:XxY[xZ] "
                          "or torus:XxY[xZ])")
    if len(topo.dims) > MAX_DIMS:
        raise ConfigError(f"open_halo: topology {topo.name} has {len(topo.dims)} dimensions; halos have at most "
                          f"{MAX_DIMS}")
    if topo.size != nranks:
        raise ConfigError(f"open_halo: topology {topo.name} has {topo.size} ranks, but the job has {nranks}")
    return topo, tuple(topo.dims), _PERIODIC[topo.kind]


def neighbours(dims: Sequence[int], periodic: bool, rank: int) -> list[int | None]:
    """The rank in each direction of ``rank`` on a grid of ``dims`` (x fastest), None past a mesh's boundary."""
    strides = [int(np.prod(dims[:k])) for k in range(len(dims))]
    coords = [(rank // strides[k]) % dims[k] for k in range(len(dims))]
    out: list[int | None] = []
    for k, n in enumerate(dims):
        for sign in (+1, -1):
            c = coords[k] + sign
            if not 0 <= c < n:
                if not periodic:
                    out.append(None)
                    continue
                c %= n
            out.append(rank + (c - coords[k]) * strides[k])
    return out + [None] * (2 * MAX_DIMS - len(out))


def halo_links(dims: Sequence[int], periodic: bool, element: ElementType, depth: int,
               name: str = "halo") -> list[Link]:
    """The links of a halo: for every rank and direction with a neighbour, ``{name}.{rank}.to{dir}`` on the rank,
    received as ``{name}.{neighbour}.from{opposite}`` on the neighbour."""
    nranks = int(np.prod(dims))
    if 4 * MAX_DIMS * nranks > 1 << 16:
        raise ConfigError(f"open_halo: {nranks} ranks need more channel IDs than a spec has (65536)")
    links = []
    for rank in range(nranks):
        for d, peer in enumerate(neighbours(dims, periodic, rank)):
            if peer is None:
                continue
            ident = 2 * (2 * MAX_DIMS * rank + d)
            links.append(Link(f"{name}.{rank}.to{DIRECTIONS[d]}", f"{name}.{peer}.from{DIRECTIONS[opposite(d)]}",
                              ident, ident + 1, rank, peer, element, depth))
    return links


class Halo:
    """This rank's halo channels (what :func:`open_halo` returns): the sender toward and the receiver from each
    neighbour, by direction; the process grid; and the kernel argument ``circuslink::Halo<T>``."""

    def __init__(self, world: Any, channels: Any, topology: Any, dims: tuple[int, ...], periodic: bool,
                 name: str) -> None:
        self.world = world
        self.channels = channels
        self.topology = topology
        self.dims = dims
        self.periodic = periodic
        self.coords = tuple(topology.coords(world.rank))
        self._peers = neighbours(dims, periodic, world.rank)
        self._name = name

    @property
    def directions(self) -> list[int]:
        """The directions in which this rank has a neighbour, in order."""
        return [d for d, p in enumerate(self._peers) if p is not None]

    def has(self, d: str | int) -> bool:
        return self._peers[direction(d)] is not None

    def neighbour(self, d: str | int) -> int | None:
        """The rank in direction ``d`` (None past a mesh's boundary)."""
        return self._peers[direction(d)]

    def sender(self, d: str | int):
        """The channel end toward the neighbour in direction ``d``."""
        return self.channels[f"{self._name}.{self.world.rank}.to{DIRECTIONS[self._present(d)]}"]

    def receiver(self, d: str | int):
        """The channel end from the neighbour in direction ``d``."""
        return self.channels[f"{self._name}.{self.world.rank}.from{DIRECTIONS[self._present(d)]}"]

    def _present(self, d: str | int) -> int:
        k = direction(d)
        if self._peers[k] is None:
            raise ConfigError(f"halo: rank {self.world.rank} at {self.coords} of {self.topology.name} has no neighbour "
                              f"in direction {DIRECTIONS[k]}")
        return k

    def block(self, shape: Sequence[int]) -> tuple[slice, ...]:
        """This rank's block of a global array of ``shape``: process dimension k splits axis k as evenly as it goes
        (the first ``n % parts`` ranks along it get one cell more); axes past the grid's stay whole."""
        if len(shape) < len(self.dims):
            raise ConfigError(f"halo: a {len(shape)}-D array cannot be split over the {len(self.dims)}-D grid "
                              f"{self.topology.name}")
        out = []
        for k, n in enumerate(shape):
            if k < len(self.dims):
                start, count = split_extent(int(n), self.dims[k], self.coords[k])
                out.append(slice(start, start + count))
            else:
                out.append(slice(0, int(n)))
        return tuple(out)

    def exchange(self, edges: Mapping[Any, Any]) -> dict[int, Any]:
        """Host API: send ``edges[d]`` (an array) toward every neighbour d, then return ``{d: halo}`` with what each
        neighbour sent this way, shaped as ``edges[d]`` (an edge and the halo beside it are faces of the same
        shape). Every present direction must be given. Writes go first, and every neighbour's reads follow its
        own writes, so a write that finds its ring full only waits for a read that is under way (edges sent
        as low-latency packets take a slot per 120 bytes, so even a ring of two edges' bytes can fill)."""
        given = {direction(d): e for d, e in edges.items()}
        missing = [DIRECTIONS[d] for d in self.directions if d not in given]
        extra = [DIRECTIONS[d] for d in given if self._peers[d] is None]
        if missing or extra:
            raise ConfigError(f"halo.exchange on rank {self.world.rank}: "
                              + (f"no edge for direction(s) {', '.join(missing)}" if missing else
                                 f"edge(s) for direction(s) {', '.join(extra)} without a neighbour"))
        for d in self.directions:
            self.sender(d).write(given[d])
        return {d: self.receiver(d).read(int(np.prod(given[d].shape))).reshape(given[d].shape)
                for d in self.directions}

    def device_handle(self) -> np.void:
        """The kernel argument ``circuslink::Halo<T>`` (circuslink/halo.cuh): ``to[d]`` / ``from[d]`` by direction,
        zeroed where ``has(d)`` is false."""
        h = np.zeros((), dtype=HALO.dtype)
        h["present"], h["dims"] = sum(1 << d for d in self.directions), len(self.dims)
        for d in self.directions:
            h["to"][d] = self.sender(d).device_handle()
            h["from"][d] = self.receiver(d).device_handle()
        return h[()]

    def check(self) -> None:
        """Raise the error device code recorded on one of this rank's halo channels, naming it."""
        self.channels.check()

    def close(self, timeout: float | None = None) -> None:
        """Collective: close the halo's channels."""
        self.channels.close(timeout)

    def __enter__(self) -> Halo:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.channels.__exit__(exc_type, exc, tb)


def open_halo(world: Any, topology: Any, element: ElementType | str, depth: int, *, timeout: float | None = None,
              options: Mapping[str, Mapping[str, Any]] | None = None, name: str = "halo") -> Halo:
    """Collective: the halo channels of ``topology`` (a grid topology or its string: ``ring:N``, ``line:N``,
    ``mesh:XxY[xZ]``, ``torus:XxY[xZ]``; one rank per position) for elements of ``element`` (a type name such
    as ``"float"`` or an :class:`~circuslink.channels.ElementType`), each channel ``depth`` elements deep.
    ``timeout`` and ``options`` are :func:`circuslink.channels.open`'s (``options`` by end name, e.g.
    ``{"halo.0.to+x": {...}}``). Another ``name`` lets one job hold several halos."""
    from . import open as open_channels

    topo, dims, periodic = _grid_of(topology, world.size)
    if isinstance(element, str):
        element = element_type(element)
    if not isinstance(element, ElementType):
        raise ConfigError(f"open_halo: element must be a type name such as 'float' or an ElementType, got {element!r}")
    if isinstance(depth, bool) or not isinstance(depth, int | np.integer) or depth < 1:
        raise ConfigError(f"open_halo: depth must be a positive number of elements, got {depth!r}")
    links = halo_links(dims, periodic, element, int(depth), name)
    channels = open_channels(world, links, timeout=timeout, options=options) if links else None
    if channels is None:  # one rank on a mesh or line: no neighbour, nothing to open
        return _Lonely(world, topo, dims, periodic, name)
    return Halo(world, channels, topo, dims, periodic, name)


class _Lonely(Halo):
    """A halo without neighbours (one rank on a mesh or line): every direction is absent."""

    def __init__(self, world: Any, topology: Any, dims: tuple[int, ...], periodic: bool, name: str) -> None:
        super().__init__(world, None, topology, dims, periodic, name)

    def device_handle(self) -> np.void:
        return HALO.pack(present=0, dims=len(self.dims))

    def check(self) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        return None
