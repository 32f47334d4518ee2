"""How many blocks of a kernel may be resident at once: the occupancy of one SM, and this rank's share of a GPU.

Two pure functions, so that the rule is tested on any machine (tests/test_occupancy.py):

* :func:`blocks_per_sm` is NVIDIA's occupancy calculation (the one ``cuda_occupancy.h`` ships and
  ``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` answers) from a kernel's attributes (registers a
  thread, static shared memory, the block size it was built for), the launch (threads a block, dynamic
  shared memory) and the device's limits. Registers are allocated per warp in units of 256, and per
  sub-partition of the SM (4 on Volta and later), so 86 registers a thread at 256 threads a block fit 2
  blocks on an SM, not 2.9. The cuda back-end asks the driver for this number; the model is what the
  tests check the rule with, and it agrees with NVIDIA's header for every register count.
* :func:`resident_blocks` is the forward-progress rule: of the blocks this rank's SMs hold, how many its
  grid may use so that every block of every rank sharing the GPU is resident at once. A rank alone on its
  GPU may fill every SM. Ranks sharing a GPU run under MPS, by default each capped to 100/k percent of it
  (``mps.py``): CUDA reports the capped SM count (the rank's budget), but MPS caps how many SMs a client
  uses, not which, and all k ranks may run on the same ones (measured on an H200, 2026-11-29: two ranks
  capped at 50 % both on SMs 0-65, four at 25 % all on SMs 0-31). So the k ranks' grids together must fit
  on one rank's SMs, and with room to spare: each takes half of 1/k of them. At the full 1/k (k = 2, 4
  blocks of 256 threads an SM on each rank's 66 SMs of an H100) some blocks of a streaming grid started
  only after others had left and a grid barrier timed out (2026-11-24); at half of it that never happened.
  The rule counts blocks over all of a rank's SMs, not per SM, so a kernel that fits only 2 blocks an SM
  gets ``66 * 2 / (2 * 2) = 33`` blocks at 2 ranks, where rounding "1/k of an SM, at least one block" up
  gave 66 and let a grid of such a kernel time out in its grid barrier.
  Ranks run uncapped where the environment sets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100``: the hardware then
  spreads every rank's blocks over the whole GPU, each rank's budget is its 1/k of the GPU's SMs (what code
  that sizes its work by SMs takes as its own), and its grids take half of the blocks those hold, so the k
  grids together fill half of the GPU. A rank in a group of SMs of its own (a green context, ``_partition.py``,
  `CIRCUSLINK_SM_PARTITION=auto`) is uncapped and its budget is its group, which runs no other rank's blocks: its
  grids take half of what the group holds, room for its own kernels on other streams (``half``;
  ``CIRCUSLINK_PARTITION_GRID=whole`` takes all of it, ``_partition.grid_share``). At the full share (two
  uncapped ranks of 132 blocks of 2 an SM on an H200's 132 SMs: the GPU exactly full) the device-resident CG
  stalled (2026-11-29).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_REG_UNIT = 256  # registers are allocated to warps in units of this many (every architecture since Kepler)
_SUB_PARTITIONS = 4  # an SM's register file is split between this many schedulers (Volta and later)
_MAX_REGS_PER_THREAD = 255


@dataclass(frozen=True)
class KernelAttributes:
    """What a compiled kernel needs per thread and per block (``cudaFuncAttributes``; a cupy RawKernel's
    ``num_regs``, ``shared_size_bytes``, ``max_threads_per_block``, ``max_dynamic_shared_size_bytes``)."""

    name: str
    num_regs: int
    shared_size_bytes: int = 0  # static shared memory of one block
    max_threads_per_block: int = 1024  # the largest block it can launch (``__launch_bounds__`` lowers it)
    max_dynamic_shared_size_bytes: int = 48 * 1024  # dynamic shared memory it may be given (opt-in raises it)
    local_size_bytes: int = 0  # stack a thread (spills and local arrays): costs memory, not occupancy


@dataclass(frozen=True)
class DeviceLimits:
    """The resources of one SM and one block of a device (``cudaDeviceProp``). The defaults are Hopper's
    (H100 / H200, compute capability 9.0)."""

    major: int = 9
    minor: int = 0
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    max_blocks_per_sm: int = 32
    shared_per_sm: int = 233472  # 228 KiB
    shared_per_block: int = 49152  # without opt-in
    shared_per_block_optin: int = 232448
    reserved_shared_per_block: int = 1024  # the driver's own shared memory in every block (Ampere and later)
    warp_size: int = 32


# The shared-memory sizes an SM can be configured to (the L1 / shared carve-out), by architecture.
_KIB = 1024
_CARVEOUTS = {
    (7, 0): (0, 8, 16, 32, 64, 96),
    (7, 5): (32, 64),
    (8, 0): (0, 8, 16, 32, 64, 100, 132, 164),
    (8, 7): (0, 8, 16, 32, 64, 100, 132, 164),
    (8, None): (0, 8, 16, 32, 64, 100),
    (9, None): (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    (10, None): (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    (11, None): (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    (12, None): (0, 8, 16, 32, 64, 100),
}


def _carveout(device: DeviceLimits, nbytes: int) -> int | None:
    """The smallest shared-memory configuration of an SM that holds ``nbytes`` (None: none does)."""
    sizes = _CARVEOUTS.get((device.major, device.minor)) or _CARVEOUTS.get((device.major, None))
    if sizes is None:
        return nbytes  # an architecture this table does not know: take the size as it is
    for kib in sizes:
        if nbytes <= kib * _KIB:
            return kib * _KIB
    return None


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def blocks_per_sm(kernel: KernelAttributes, device: DeviceLimits, threads: int, dynamic_shared: int = 0) -> int:
    """Blocks of ``kernel`` at ``threads`` threads a block and ``dynamic_shared`` bytes of dynamic shared
    memory that one SM holds at once (0: the launch cannot run at all). Volta and later."""
    if threads < 1 or threads > min(device.max_threads_per_block, kernel.max_threads_per_block):
        return 0
    warps = -(-threads // device.warp_size)
    limits = [device.max_blocks_per_sm, (device.max_threads_per_sm // device.warp_size) // warps]
    # registers: per warp in units of 256, per sub-partition of the SM
    if kernel.num_regs > _MAX_REGS_PER_THREAD:
        return 0
    if kernel.num_regs > 0:
        per_warp = _round_up(kernel.num_regs * device.warp_size, _REG_UNIT)
        if per_warp * _round_up(warps, _SUB_PARTITIONS) > device.regs_per_block:  # the hardware's per-block check
            return 0
        warps_per_partition = (device.regs_per_sm // _SUB_PARTITIONS) // per_warp
        limits.append(warps_per_partition * _SUB_PARTITIONS // warps)
    # shared memory: static + the driver's reserve + dynamic, in units of 128 bytes (256 before Ampere)
    reserved = device.reserved_shared_per_block if device.major >= 8 else 0
    static = kernel.shared_size_bytes + reserved
    per_block = _round_up(static + dynamic_shared, 128 if device.major >= 8 else 256)
    optin = static + kernel.max_dynamic_shared_size_bytes > device.shared_per_block  # as the driver decides
    block_limit = (device.shared_per_block_optin if optin else device.shared_per_block) + reserved
    if dynamic_shared > kernel.max_dynamic_shared_size_bytes or per_block > block_limit:
        return 0
    if per_block > 0:
        preferred = _carveout(device, device.shared_per_sm)
        if preferred is None or preferred < per_block:
            preferred = _carveout(device, per_block)
        if preferred is None:
            return 0
        limits.append(preferred // per_block)
    return max(0, min(limits))


def resident_blocks(per_sm: int, sm_budget: int, ranks_on_gpu: int, capped: bool = True, whole: bool = False) -> int:
    """Blocks a rank's grid may have so that it is resident at once beside the grids of the other ranks on
    its GPU (the module's docstring says why): every block of every SM of its budget when alone, else half
    of them, counted over the budget's SMs. Where half is less than one block, one block, if the k ranks' one
    blocks all fit at once; else 0: no grid of this kernel can be guaranteed resident (capped, with more ranks
    than the SMs all of them may share hold blocks of it: 16 ranks of a 1-block-an-SM kernel on 8 capped SMs),
    and the back-end refuses it rather than let half the ranks wait for SMs the others never give back.
    ``per_sm`` is :func:`blocks_per_sm`'s answer, ``ranks_on_gpu`` the k ranks sharing the GPU, ``sm_budget``
    the rank's SMs: where an MPS cap is set (``capped``, the launcher's default) the count CUDA reports under
    it, which all k ranks may share, so that the rank takes half of 1/k of it; else its own 1/k of the GPU's.
    ``whole``: the budget is SMs no other rank runs on (a green context) and the rank takes all of them, as a
    rank alone does (``_partition.grid_share``)."""
    if per_sm < 1 or sm_budget < 1:
        return 0
    if ranks_on_gpu <= 1 or whole:
        return per_sm * sm_budget
    # the k ranks' SMs: capped, the one budget they may all land on; uncapped, k budgets side by side
    ranks_sharing = ranks_on_gpu if capped else 1
    half = per_sm * sm_budget // (2 * ranks_sharing)
    if half >= 1:
        return half
    return 1 if per_sm * sm_budget >= ranks_sharing else 0


def describe(kernel: KernelAttributes, threads: int, dynamic_shared: int) -> str:
    """``86 registers a thread, 472 B of stack, 256 threads a block, 0 B of shared memory``: why a kernel
    fits as it does, for messages."""
    shared = kernel.shared_size_bytes + dynamic_shared
    stack = f", {kernel.local_size_bytes} B of stack" if kernel.local_size_bytes else ""
    return f"{kernel.num_regs} registers a thread{stack}, {threads} threads a block, {shared} B of shared memory"


# -- reading the attributes of real kernels and devices (cupy) -------------------------------------------
def attributes_of(kernel: Any) -> KernelAttributes:
    """A cupy RawKernel's attributes (the driver's ``cuFuncGetAttribute``)."""
    def get(name: str, default: int) -> int:
        try:
            value = int(getattr(kernel, name))
        except Exception:  # an attribute this toolkit lacks (cupy answers -1 for those too)
            return default
        return default if value < 0 else value

    return KernelAttributes(name=str(getattr(kernel, "name", "?")), num_regs=get("num_regs", 0),
                            shared_size_bytes=get("shared_size_bytes", 0),
                            max_threads_per_block=get("max_threads_per_block", 1024),
                            max_dynamic_shared_size_bytes=get("max_dynamic_shared_size_bytes", 48 * 1024),
                            local_size_bytes=get("local_size_bytes", 0))


def limits_of(props: dict) -> DeviceLimits:
    """A device's limits from ``cupy.cuda.runtime.getDeviceProperties`` (Hopper's values where a key is missing)."""
    base = DeviceLimits()

    def get(key: str, default: int) -> int:
        value = props.get(key)
        return int(value) if isinstance(value, int | float) and value > 0 else default

    return DeviceLimits(
        major=get("major", base.major), minor=int(props.get("minor", base.minor) or 0),
        regs_per_sm=get("regsPerMultiprocessor", base.regs_per_sm),
        regs_per_block=get("regsPerBlock", base.regs_per_block),
        max_threads_per_sm=get("maxThreadsPerMultiProcessor", base.max_threads_per_sm),
        max_threads_per_block=get("maxThreadsPerBlock", base.max_threads_per_block),
        max_blocks_per_sm=get("maxBlocksPerMultiProcessor", base.max_blocks_per_sm),
        shared_per_sm=get("sharedMemPerMultiprocessor", base.shared_per_sm),
        shared_per_block=get("sharedMemPerBlock", base.shared_per_block),
        shared_per_block_optin=get("sharedMemPerBlockOptin", base.shared_per_block_optin),
        reserved_shared_per_block=get("reservedSharedMemPerBlock", base.reserved_shared_per_block),
        warp_size=get("warpSize", base.warp_size))


def grid_blocks(grid: Any) -> int:
    """The number of blocks of a launch's grid (an int or a tuple of up to 3)."""
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    return math.prod(int(d) for d in dims)
