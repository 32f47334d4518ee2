"""Putting every rank's clock on rank 0's time base: the exchange's protocol and its arithmetic.

Clocks of different ranks are not assumed to agree: GPUs of one machine may well share
%globaltimer, but nothing guarantees it, and hosts certainly do not. So each rank r > 0
measures its offset to rank 0 with an NTP-style exchange through symmetric memory:

    rank 0: t1 = clock(); store k into rank r's slot; wait for k in my slot r; t2 = clock()
    rank r: wait for k in my slot; tb = clock(); store k into rank 0's slot r

Causality puts rank 0's time at ``tb`` inside [t1, t2], so ``offset = tb - (t1 + t2) / 2``
is off by at most ``(t2 - t1) / 2``; of ``rounds`` exchanges the one with the shortest
round trip wins, and half its round trip is the stated residual. Each back-end's module runs
the exchange its own way (``trace/_cpu.py``: Python over shared memory, tens of us;
``trace/_cuda.py``: two one-thread kernels polling over NVLink, ~1-3 us round trip; ranks on
rank 0's GPU read the very same %globaltimer and skip it). The pairs take turns, each started
by a barrier, and one :class:`~circuslink._wait.Deadline` bounds the whole sync.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._wait import Deadline
from ._model import ClockSample

ROUNDS = 32


def estimate(t1: np.ndarray, t2: np.ndarray, tb: np.ndarray) -> ClockSample:
    """The offset of the round with the shortest round trip, and half that round trip as its residual."""
    rtt = t2 - t1
    k = int(np.argmin(rtt))
    # integer arithmetic: float64 would lose nanoseconds on 64-bit timer values
    offset = int(tb[k]) - (int(t1[k]) + int(t2[k])) // 2
    return ClockSample(local_ns=int(tb[k]), offset_ns=offset, residual_ns=(int(rtt[k]) + 1) // 2)


def combine(world: Any, mine: Any, now_ns: int, deadline: Deadline) -> list[ClockSample]:
    """Everyone's exchange results -> one ClockSample per rank, on every rank (collective).

    ``mine``: rank 0's ``{r: (t1, t2)}``; rank r's ``tb`` (None when it shares rank 0's clock)."""
    gathered = world.allgather_object(mine, deadline)
    ref = gathered[0]
    samples = [ClockSample(local_ns=now_ns if world.rank == 0 else 0, offset_ns=0, residual_ns=0)]
    for r in range(1, world.size):
        if gathered[r] is None:  # same clock as rank 0 by construction
            samples.append(ClockSample(local_ns=0, offset_ns=0, residual_ns=0))
            continue
        t1, t2 = ref[r]
        t1, t2, tb = (np.asarray(x, np.int64) for x in (t1, t2, gathered[r]))
        samples.append(estimate(t1, t2, tb))
    return samples
