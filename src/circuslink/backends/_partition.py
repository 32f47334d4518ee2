"""SMs of its own for each rank that shares a GPU: one CUDA green context a rank.

Ranks sharing a GPU run under MPS. MPS's cap (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100/k``) bounds how many SMs
a client uses, not which: on an H200 two ranks capped at 50 % both ran on SMs 0-65 and four at 25 % all on SMs
0-31, the rest of the GPU idle (2026-11-29). Uncapped, the hardware spreads every rank's blocks over the whole
GPU, and one rank's blocks may then hold the SMs another rank's persistent grid needs. A green context (CUDA 12.4
and later) is a context limited to a set of SMs; the driver splits the device's SMs into disjoint groups, and
under MPS a client's green context is honoured when the client is uncapped (NVIDIA: leave the share unset or at
100). So rank i of the k ranks on a GPU takes group i of a split into k groups, and its streams run there only.

Measured on an H100 under MPS (2026-12-07, ``scripts/dev/green_ctx.py``): 132 SMs split into 2 groups of 64 or
4 of 32 (groups come in multiples of 8 SMs); a rank alone with two 1,024-thread blocks per SM of its group took
twice as long as with one (its blocks stayed in the group), and all ranks at once with one block per SM of their
groups took as long as one rank alone (the groups are disjoint). Work submitted to a stream made while the green
context was current ran in the group; work on the legacy null stream and on streams made before ran on every
SM. So the back-end switches to the green context before it makes any stream, and makes a stream of it CuPy's
current stream.

``CIRCUSLINK_SM_PARTITION``: ``off`` (default: the ranks share the GPU under MPS's cap), ``auto`` (a green
context a rank where the driver offers them, else the cap; where it offers them but one cannot be made, the
rank says so in one line and shares the GPU uncapped), ``green`` (required: an error where it cannot be made).
The library's default stays ``off`` until the whole GPU suite has run under ``auto``. Commands measured faster
with it ask for ``auto`` where the user sets no mode (``launcher.relaunch_self``'s ``sm_partition``): the FFT's
(fft2, fft3, bench fft: at 4 ranks on one H100, 16384^2 complex64 4.96 ms against 6.27 capped, 2026-12-07). On
the same GPU the device-resident CG at 32^4 ran partitioned on 2 and 4 ranks in 1.4-1.6x of one rank against
2.3-4.9x capped (BENCHMARKS.md); ``bench qcd`` still runs as the user sets it: its halo engines (NVSHMEM's among
them) have been measured under the cap only.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import BackendError, ConfigError

ENV = "CIRCUSLINK_SM_PARTITION"
MODES = ("auto", "green", "off")
DEFAULT = "off"
_MIN_DRIVER = 12040  # green contexts: CUDA 12.4


GRID_ENV = "CIRCUSLINK_PARTITION_GRID"
GRID_SHARES = ("half", "whole")


def grid_share(env: dict[str, str] | None = None) -> str:
    """How much of its group a partitioned rank's persistent grid may take (``CIRCUSLINK_PARTITION_GRID``):
    ``half`` (default: what the group holds, halved, the margin uncapped ranks without a partition keep:
    ``_occupancy.py``) or ``whole`` (every block the group holds, as a rank alone on the GPU takes; the group's
    SMs run no other rank's blocks). On one H100 (2026-12-07, BENCHMARKS.md) the device-resident CG with the whole
    group took 32^4 on 2 and 4 ranks in 1,281 and 1,267 us an iteration against 1,318 and 1,344 with half, 16^4
    on 2 ranks 127.6 against 137.8 (the same call), and none of 18 such runs stalled. Not the default: the gain is
    within the spread between calls, and the half keeps room for the rank's own kernels on other streams (the
    FFT's transforms beside its puts, whose start launch waits on peers), which whole grids have not run beside.
    With one pass a hop as well (CIRCUSLINK_QCD_ONE_PASS=1), 32^4 on 2x2x1x1 stalled in both calls that ran it
    (2026-12-07, one H100: every rank's host waiting in the resident CG's status read; stack dumps in
    benchmarks/results/qcd-stall-whole-1pass*), a cause not yet found."""
    raw = (os.environ if env is None else env).get(GRID_ENV, "").strip().lower() or "half"
    if raw not in GRID_SHARES:
        raise ConfigError(f"{GRID_ENV}={raw!r}: choose one of {', '.join(GRID_SHARES)}")
    return raw


def mode(env: dict[str, str] | None = None) -> str:
    """The partition mode the environment asks for (``off`` unless set); a bad value is one line naming it."""
    raw = (os.environ if env is None else env).get(ENV, "").strip().lower() or DEFAULT
    if raw not in MODES:
        raise ConfigError(f"{ENV}={raw!r}: choose one of {', '.join(MODES)}")
    return raw


def _driver() -> Any | None:
    try:
        import cuda.bindings.driver as driver
    except ImportError:
        return None
    return driver if hasattr(driver, "cuGreenCtxCreate") else None


_available: bool | None = None


def available() -> bool:
    """Whether this machine's CUDA driver and cuda-python offer green contexts (asked once a process; makes no
    context)."""
    global _available
    if _available is None:
        driver = _driver()
        ok = False
        if driver is not None:
            try:
                err, version = driver.cuDriverGetVersion()
                ok = err == driver.CUresult.CUDA_SUCCESS and int(version) >= _MIN_DRIVER
            except Exception:
                ok = False
        _available = ok
    return _available


def wanted(ranks_on_gpu: int, env: dict[str, str] | None = None) -> bool:
    """Whether ranks sharing a GPU (``ranks_on_gpu`` of them) take a green context each: the launcher leaves such
    ranks uncapped (MPS honours a green context only then)."""
    if ranks_on_gpu < 2:
        return False
    m = mode(env)
    return m == "green" or (m == "auto" and available())


def group_sms(sm_count: int, groups: int, min_partition: int = 8, alignment: int = 8) -> int:
    """SMs of each of ``groups`` equal groups of a device of ``sm_count`` SMs, in whole units of ``alignment``
    and at least ``min_partition`` (the driver's rules for a split; Hopper: 8 and 8); 0 where they do not fit."""
    if groups < 1 or sm_count < 1:
        return 0
    unit = max(1, alignment)
    size = sm_count // groups // unit * unit
    return size if size >= max(1, min_partition) and size * groups <= sm_count else 0


def index_on_gpu(identities: list[str | None], rank: int) -> int:
    """This rank's place among the ranks of the job whose GPU is the same as its own (by device identity)."""
    mine = identities[rank]
    return sum(1 for r in range(rank) if identities[r] == mine)


class GreenPartition:
    """Group ``index`` of ``groups`` disjoint SM groups of CUDA device ``device``, as a green context made current
    on the calling thread. ``sm_count``: its SMs. :meth:`bind` makes it current on another thread."""

    def __init__(self, device: int, groups: int, index: int) -> None:
        driver = _driver()
        if driver is None:
            raise BackendError(f"{ENV}: this cuda-python has no green contexts (cuda.bindings.driver."
                               "cuGreenCtxCreate); install cuda-python 12.4 or later, or set "
                               f"{ENV}=off")
        self._d = driver
        self.device = device
        dev = self._call("cuDeviceGet", device)
        whole = self._call("cuDeviceGetDevResource", dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
        size = group_sms(int(whole.sm.smCount), groups, int(getattr(whole.sm, "minSmPartitionSize", 8) or 8),
                         int(getattr(whole.sm, "smCoscheduledAlignment", 8) or 8))
        if size == 0:
            raise BackendError(f"{ENV}: GPU {device}'s {whole.sm.smCount} SMs do not split into {groups} groups "
                               f"(at least {getattr(whole.sm, 'minSmPartitionSize', 8)} SMs each); run fewer "
                               f"ranks on it or set {ENV}=off")
        parts, made, _rest = self._call("cuDevSmResourceSplitByCount", groups, whole, 0, size)
        if int(made) < groups:
            raise BackendError(f"{ENV}: the driver split GPU {device}'s SMs into {made} groups of {size}, not "
                               f"{groups}; set {ENV}=off")
        self.sm_count = int(parts[index].sm.smCount)
        desc = self._call("cuDevResourceGenerateDesc", [parts[index]], 1)
        flags = driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        self._green = self._call("cuGreenCtxCreate", desc, dev, flags)
        self._ctx = self._call("cuCtxFromGreenCtx", self._green)
        self.index, self.groups = index, groups
        self.bind()

    def _call(self, name: str, *args: Any) -> Any:
        out = getattr(self._d, name)(*args)
        err, rest = out[0], out[1:]
        if err != self._d.CUresult.CUDA_SUCCESS:
            raise BackendError(f"{ENV}: {name} failed on GPU {self.device}: {err}; set {ENV}=off to share the "
                               "GPU under MPS's cap instead")
        return rest[0] if len(rest) == 1 else rest

    def bind(self) -> None:
        """Make the green context current on the calling thread (a thread's first CUDA call otherwise binds the
        device's primary context, whose streams run on every SM)."""
        self._call("cuCtxSetCurrent", self._ctx)

    def describe(self) -> str:
        return f"SM group {self.index} of {self.groups} ({self.sm_count} SMs) of GPU {self.device}"
