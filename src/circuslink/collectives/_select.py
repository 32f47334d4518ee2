"""Which all-reduce runs at which size: the one table of switch points.

Where every rank maps every other rank's memory (one node: ranks sharing a GPU under MPS, or the
cpu back-end's shared memory) the all-reduce is one-shot up to ``ONESHOT_MAX_BYTES[n]`` bytes per rank
and two-shot above; where they do not (ranks on several nodes, routed topologies) it is the ring over
channels at every size. The device code reads the same switch point from the ``Team`` handle
(``oneshot_max``), so host and device calls pick alike.

The defaults are estimates until the benchmark measures them (``circuslink bench allreduce
--algorithm`` times every algorithm at every size; docs/collectives.md, "Switch points"): one-shot
moves (n - 1) x the message per rank as 16-byte LL lines carrying 8 bytes each, two-shot 2 (n - 1) / n
x the message plus three barriers (about three round trips, ~1 us on one H200). With a round trip of
~0.3 us and ~1 TB/s of LL stores shared by the ranks, the two meet near 64 KiB at 2 ranks and at
roughly 64 KiB / (n / 2) above: the same region where TensorRT-LLM's custom all-reduce and NCCL's
NVLS switch from one-shot to two-shot.
"""

from __future__ import annotations

from ..errors import ConfigError
from ._layout import LL_MAX_BYTES

ALGORITHMS = ("oneshot", "twoshot", "ring")

# ranks -> one-shot up to this many bytes per rank (inclusive); ranks between rows take the next row up.
ONESHOT_MAX_BYTES = {2: 64 << 10, 4: 32 << 10, 8: 16 << 10, 16: 8 << 10}


def oneshot_max(nranks: int) -> int:
    """The one-shot switch point for ``nranks`` (never above what the LL slots hold)."""
    for n in sorted(ONESHOT_MAX_BYTES):
        if nranks <= n:
            return min(ONESHOT_MAX_BYTES[n], LL_MAX_BYTES)
    return min(ONESHOT_MAX_BYTES[max(ONESHOT_MAX_BYTES)], LL_MAX_BYTES)


def choose(nbytes: int, nranks: int, shares_memory: bool) -> str:
    """The all-reduce for a message of ``nbytes`` per rank."""
    if not shares_memory:
        return "ring"
    return "oneshot" if nbytes <= oneshot_max(nranks) else "twoshot"


def resolve(nbytes: int, nranks: int, shares_memory: bool, wanted: str | None) -> str:
    """``wanted`` checked against what the ranks can run, or :func:`choose`'s pick when it is None."""
    if wanted is None:
        return choose(nbytes, nranks, shares_memory)
    if wanted != "ring" and not shares_memory:
        raise ConfigError(f"allreduce: algorithm={wanted!r} needs ranks that share memory; these do not (use 'ring')")
    if wanted == "oneshot" and nbytes > LL_MAX_BYTES:
        raise ConfigError(f"allreduce: algorithm='oneshot' moves at most {LL_MAX_BYTES} bytes per rank, not {nbytes}")
    return wanted
