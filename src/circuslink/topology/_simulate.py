"""A CPU reference of forwarding through the routing tables: a deterministic event simulation.

The model the device forwarding agents and the cpu back-end match:

* each ``(link, vc)`` has a FIFO buffer of ``buffer_slots`` packets at the link's far end; a packet may
  enter it only while it has a free slot (credit-based flow control: the credit returns the moment the
  packet leaves, nothing is dropped);
* a channel ``(src, dst)`` injects its packets in order into its first hop's ``(link, vc)`` buffer; each
  packet follows the tables hop by hop (the same links and VCs for every packet of a channel, so FIFO
  buffers keep a channel's order); a packet at the head of a buffer at its destination is delivered
  (the destination always consumes);
* time advances in steps: in a step every channel injects at most one packet and every buffer forwards at
  most its head, and a packet moves at most one hop. Within a step ranks act in rank order, each first
  injecting (its channels in order) then forwarding (its input buffers by link and VC); ``seed`` shuffles
  that order every step instead, so tests can try many interleavings.

A step in which nothing moves while packets remain is a deadlock: every blocked head waits for a full
buffer whose head waits too, and following the waits from any full buffer finds the cycle, which is
returned as ``(link, vc)`` pairs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ._model import Link, Topology, TopologyError, parse
from ._routing import Routing


@dataclass
class SimResult:
    """What :func:`simulate` returns.

    ``delivered[i]``: the packet numbers of message ``i`` in delivery order; ``deadlocked`` and, when so,
    ``cycle`` (the ``(link, vc)`` buffers, all full, each waiting for the next); ``steps`` taken; ``moves``
    (packet hops, deliveries included); ``remaining`` packets not delivered.
    """

    routing: Routing
    delivered: list[list[int]]
    deadlocked: bool
    steps: int
    moves: int
    remaining: int
    cycle: list[tuple[Link, int]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.deadlocked and self.remaining == 0

    def text(self) -> str:
        t = self.routing.topology
        if self.complete:
            return f"complete: {sum(map(len, self.delivered))} packets delivered in {self.steps} steps"
        ring = ", ".join(f"{t.link_label(link)} vc {vc}" for link, vc in self.cycle)
        return (f"deadlock after {self.steps} steps with {self.remaining} packets undelivered: "
                f"full buffers wait on each other in a cycle: {ring}")


def simulate(topology: Topology | str, vcs: int | None, messages: Iterable, buffer_slots: int = 2, *,
             seed: int | None = None) -> SimResult:
    """Move ``messages`` through ``topology``'s tables with ``vcs`` virtual channels (None: the default).

    ``messages``: ``(src, dst)`` or ``(src, dst, npackets)`` per channel (default 1 packet); packets are
    numbered 0.. per channel. ``buffer_slots`` packets fit in each ``(link, vc)`` buffer. Returns a
    :class:`SimResult`; raises :class:`TopologyError` for a bad message, an unreachable destination or a
    virtual-channel count the topology cannot use.
    """
    topo = parse(topology)
    routing = topo.routing(vcs)
    if isinstance(buffer_slots, bool) or not isinstance(buffer_slots, int | np.integer) or buffer_slots < 1:
        raise TopologyError(f"buffer_slots must be a positive integer, got {buffer_slots!r}")
    V = routing.vcs
    paths: list[list[int]] = []  # per channel: the buffer ids (link * V + vc) it enters, in order
    counts: list[int] = []
    sources: list[int] = []
    for i, msg in enumerate(messages):
        try:
            src, dst, *rest = msg
        except (TypeError, ValueError):
            raise TopologyError(f"message {i}: expected (src, dst) or (src, dst, npackets), got {msg!r}") from None
        npackets = rest[0] if rest else 1
        if len(rest) > 1 or isinstance(npackets, bool) or not isinstance(npackets, int | np.integer) \
                or npackets < 0:
            raise TopologyError(f"message {i}: expected (src, dst) or (src, dst, npackets >= 0), got {msg!r}")
        hops = routing.route(topo.check_rank(src, f"message {i} source"),
                             topo.check_rank(dst, f"message {i} destination"))
        paths.append([h.link.id * V + h.vc for h in hops])
        counts.append(int(npackets))
        sources.append(int(src))

    nbuf = len(topo.links) * V
    buffers: list[deque] = [deque() for _ in range(nbuf)]
    delivered: list[list[int]] = [[] for _ in paths]
    injected = [0] * len(paths)
    # Actors in the fixed order: per rank, its channels' injections then its input buffers.
    actors: list[tuple[int, int]] = []  # (0, channel) injects; (1, buffer) forwards
    by_rank: list[list[tuple[int, int]]] = [[] for _ in range(topo.size)]
    for ch, src in enumerate(sources):
        by_rank[src].append((0, ch))
    for rank in range(topo.size):
        for link in sorted(topo.in_links(rank), key=lambda k: k.id):
            by_rank[rank] += [(1, link.id * V + v) for v in range(V)]
        actors += by_rank[rank]
    rng = np.random.default_rng(seed) if seed is not None else None

    remaining = sum(counts)
    steps = moves = 0
    while remaining:
        steps += 1
        moved_before = moves
        order = actors if rng is None else [actors[i] for i in rng.permutation(len(actors))]
        for kind, idx in order:
            if kind == 0:
                ch = idx
                if injected[ch] == counts[ch]:
                    continue
                path = paths[ch]
                if not path:  # to itself: delivered at once
                    delivered[ch].append(injected[ch])
                elif len(buffers[path[0]]) < buffer_slots:
                    buffers[path[0]].append([ch, injected[ch], 0, steps])
                else:
                    continue
                injected[ch] += 1
                moves += 1
                if not path:
                    remaining -= 1
            else:
                buf = buffers[idx]
                if not buf or buf[0][3] == steps:  # empty, or its head arrived this step
                    continue
                packet = buf[0]
                ch, seq, hop, _ = packet
                path = paths[ch]
                if hop + 1 == len(path):
                    buf.popleft()
                    delivered[ch].append(seq)
                    remaining -= 1
                    moves += 1
                    continue
                target = buffers[path[hop + 1]]
                if len(target) < buffer_slots:
                    buf.popleft()
                    packet[2], packet[3] = hop + 1, steps
                    target.append(packet)
                    moves += 1
        if moves == moved_before:
            cycle = _wait_cycle(buffers, paths)
            links = topo.links
            return SimResult(routing, delivered, True, steps, moves, remaining,
                             [(links[b // V], b % V) for b in cycle])
    return SimResult(routing, delivered, False, steps, moves, 0)


def _wait_cycle(buffers: list[deque], paths: list[list[int]]) -> list[int]:
    """Follow 'the head of this buffer waits for that buffer' from the first non-empty buffer to a repeat."""
    start = next(b for b, buf in enumerate(buffers) if buf)
    seen: dict[int, int] = {}
    walk: list[int] = []
    b = start
    while b not in seen:
        seen[b] = len(walk)
        walk.append(b)
        ch, _, hop, _ = buffers[b][0]
        b = paths[ch][hop + 1]  # a blocked head never sits at its destination (it would be delivered)
    cycle = walk[seen[b]:]
    k = cycle.index(min(cycle))
    return cycle[k:] + cycle[:k]
