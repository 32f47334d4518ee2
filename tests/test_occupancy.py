"""How many blocks of a kernel may be resident (backends/_occupancy.py), for any kernel.

* The occupancy model against NVIDIA's own calculator (cuda_occupancy.h, compiled for the host here):
  every register count 0..255, block sizes 32..1024, static and dynamic shared memory, on six architectures.
* The forward-progress rule, exhaustively for kernels of 32..255 registers at 1, 2, 4 and 8 ranks on a GPU:
  the grids of all ranks sharing a GPU fit, with half of it to spare, on the SMs any one of them may use,
  whichever resource binds; a rank alone gets every block (the cooperative launch's maximum).
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from circuslink.backends._occupancy import (
    DeviceLimits,
    KernelAttributes,
    blocks_per_sm,
    describe,
    limits_of,
    resident_blocks,
)

HERE = Path(__file__).resolve().parent
NVCC = shutil.which("nvcc")

# (major, minor): regs/SM, regs/block, threads/SM, blocks/SM, shared/SM, shared/block, opt-in, reserved
ARCHS = {
    (7, 0): DeviceLimits(7, 0, 65536, 65536, 2048, 1024, 32, 98304, 49152, 98304, 0),
    (8, 0): DeviceLimits(8, 0, 65536, 65536, 2048, 1024, 32, 167936, 49152, 166912, 1024),
    (8, 6): DeviceLimits(8, 6, 65536, 65536, 1536, 1024, 16, 102400, 49152, 101376, 1024),
    (9, 0): DeviceLimits(),  # H100 / H200
    (10, 0): DeviceLimits(10, 0, 65536, 65536, 2048, 1024, 32, 233472, 49152, 232448, 1024),
    (12, 0): DeviceLimits(12, 0, 65536, 65536, 1536, 1024, 24, 102400, 49152, 101376, 1024),
}
THREADS = (32, 64, 96, 128, 160, 192, 256, 384, 512, 640, 768, 1024)
SHARED = [(0, 0, 48 * 1024), (0, 1000, 48 * 1024), (4096, 20000, 48 * 1024 - 4096), (40000, 100000, 48 * 1024 - 40000),
          (0, 100000, 200 * 1024), (2048, 150000, 180 * 1024)]  # (static, dynamic, max dynamic)


def _cases():
    for (_arch, dev), regs, threads, (static, dynamic, max_dynamic) in itertools.product(
            ARCHS.items(), range(256), THREADS, SHARED):
        yield dev, KernelAttributes("k", regs, static, 1024, max_dynamic), threads, dynamic


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """NVIDIA's calculator as a host program (nvcc brings cuda_occupancy.h and a host compiler)."""
    if NVCC is None:
        pytest.skip("nvcc not found: cuda_occupancy.h comes with the CUDA toolkit")
    out = tmp_path_factory.mktemp("occupancy") / "occupancy_reference"
    proc = subprocess.run([NVCC, "-x", "c++", str(HERE / "occupancy_reference.cpp"), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_model_agrees_with_nvidias_calculator(reference):
    cases = list(_cases())
    lines = [f"{d.major} {d.minor} {d.regs_per_sm} {d.regs_per_block} {d.max_threads_per_sm} {d.max_blocks_per_sm} "
             f"{d.shared_per_sm} {d.shared_per_block} {d.shared_per_block_optin} {d.reserved_shared_per_block} "
             f"{k.num_regs} {k.shared_size_bytes} {k.max_dynamic_shared_size_bytes} {t} {dyn}"
             for d, k, t, dyn in cases]
    proc = subprocess.run([str(reference)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                          check=True, timeout=300)
    theirs = [int(x) for x in proc.stdout.split()]
    assert len(theirs) == len(cases) and -1 not in theirs
    wrong = [(c[0].major, c[0].minor, c[1], c[2], c[3], ours, t) for c, t in zip(cases, theirs, strict=True)
             if (ours := blocks_per_sm(c[1], c[0], c[2], c[3])) != t]
    assert not wrong, f"{len(wrong)} of {len(cases)} cases differ, e.g. {wrong[:5]}"
    assert len(set(theirs)) > 20  # the cases reach every kind of limit, not a constant


def test_the_issue_kernel_fits_two_blocks_an_sm():
    """86 registers at 256 threads: 2816 registers a warp, 5 warps a sub-partition, 20 warps an SM: 2 blocks."""
    kernel = KernelAttributes("jacobi", 86, local_size_bytes=472)
    assert blocks_per_sm(kernel, DeviceLimits(), 256) == 2
    assert resident_blocks(2, 66, 2, capped=True) == 33  # capped at 50 %; the issue's rule gave 66 (one an SM)
    assert resident_blocks(2, 66, 2, capped=False) == 66  # uncapped, 2 ranks of 66 SMs each: half of 264 slots
    assert describe(kernel, 256, 0) == ("86 registers a thread, 472 B of stack, 256 threads a block, "
                                        "0 B of shared memory")


GPU_SMS = 132


def _budget(ranks: int) -> int:
    """A rank's SMs, the same count either way: under the launcher's MPS cap of 100/k percent the count CUDA
    reports (which every rank may share), uncapped its own 1/k of the GPU's."""
    return GPU_SMS if ranks == 1 else GPU_SMS // ranks


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
@pytest.mark.parametrize("ranks", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("threads,dynamic", [(64, 0), (128, 0), (256, 0), (256, 16384), (512, 0), (1024, 0)])
def test_every_rank_grid_is_resident_for_every_register_count(ranks, threads, dynamic, capped):
    dev = DeviceLimits()
    budget = _budget(ranks)
    warps = threads // 32
    previous = None
    for regs in range(32, 256):
        kernel = KernelAttributes("k", regs)
        per_sm = blocks_per_sm(kernel, dev, threads, dynamic)
        blocks = resident_blocks(per_sm, budget, ranks, capped)
        if per_sm == 0:  # no SM holds one block (255 registers at 1024 threads): the back-end refuses it
            assert regs * threads > dev.regs_per_block and blocks == 0
            continue
        if capped and ranks > per_sm * budget:  # the k ranks' one blocks do not fit the SMs they all share
            assert blocks == 0, (regs, per_sm, budget)
            continue
        assert blocks >= 1
        # what the k grids take, against half of what the SMs they may all run on hold: the whole GPU's
        # uncapped, one rank's budget where a cap lets every rank land on the same SMs
        room = budget if ranks == 1 else (budget if capped else GPU_SMS) / 2
        regs_block = math.ceil(regs * 32 / 256) * 256 * warps
        shared_block = math.ceil((dynamic + dev.reserved_shared_per_block) / 128) * 128
        if capped and ranks > 1:  # every rank's grid at once on the one budget they may all land on
            assert ranks * blocks <= per_sm * budget, (regs, per_sm, blocks)
        if blocks > 1:
            assert ranks * blocks * regs_block <= room * dev.regs_per_sm, (regs, blocks)
            assert ranks * blocks * warps <= room * dev.max_threads_per_sm // 32, (regs, blocks)
            assert ranks * blocks <= room * dev.max_blocks_per_sm
            assert ranks * blocks * shared_block <= room * dev.shared_per_sm
        if ranks == 1:
            assert blocks == per_sm * budget  # alone: every block that fits, as a cooperative launch allows
        elif capped:
            assert blocks == max(1, per_sm * budget // (2 * ranks))  # 0 only where they do not fit (above)
        else:
            assert blocks == max(1, per_sm * budget // 2)
        if previous is not None:
            assert blocks <= previous  # more registers never buy more blocks
        previous = blocks


def test_limits_of_reads_cupys_device_properties_and_fills_gaps():
    props = {"major": 8, "minor": 6, "regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 1536,
             "sharedMemPerMultiprocessor": 102400, "maxBlocksPerMultiProcessor": 16, "reservedSharedMemPerBlock": 1024}
    got = limits_of(props)
    assert (got.major, got.minor, got.max_threads_per_sm, got.max_blocks_per_sm) == (8, 6, 1536, 16)
    assert got.shared_per_block_optin == DeviceLimits().shared_per_block_optin  # missing: Hopper's value


def test_more_capped_ranks_than_their_shared_sms_hold_get_no_block():
    """16 ranks capped to 6 % of an H200 (8 SMs, which all of them may share) and a kernel of one block an SM
    (512 threads at 128 registers: the stencil's persistent kernels): one block each would be 16 blocks on 8 SMs,
    half of them waiting for SMs whose blocks wait for theirs. None is granted, and launch_resident refuses the
    grid in one line. Uncapped, each rank's 8 SMs are its own."""
    assert resident_blocks(1, 8, 16, capped=True) == 0
    assert resident_blocks(2, 8, 16, capped=True) == 1  # 16 blocks on 8 SMs of 2 each: they fit, no margin
    assert resident_blocks(1, 16, 8, capped=True) == 1  # 8 ranks on 16 SMs: the stencil at 8 ranks still runs
    assert resident_blocks(1, 8, 16, capped=False) == 4  # half of its own 8 SMs


def test_a_block_larger_than_the_kernel_allows_fits_nowhere():
    bounded = KernelAttributes("k", 32, max_threads_per_block=256)  # __launch_bounds__(256)
    assert blocks_per_sm(bounded, DeviceLimits(), 256) == 8
    assert blocks_per_sm(bounded, DeviceLimits(), 512) == 0
    assert resident_blocks(0, 66, 2) == 0


def test_a_rank_budget_is_its_share_of_the_gpu_unless_capped(monkeypatch):
    """Uncapped ranks (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100) each get 1/k of the GPU's SMs, so code sizing its work
    by SMs takes its own share; under an MPS cap (the launcher's) CUDA already reports the capped count.
    CIRCUSLINK_SM_BUDGET overrides."""
    from circuslink.backends.cuda import _mps_capped, _sm_budget

    monkeypatch.delenv("CIRCUSLINK_SM_BUDGET", raising=False)
    assert [_sm_budget(132, k, False) for k in (1, 2, 3, 4, 8)] == [132, 66, 44, 33, 16]
    assert _sm_budget(66, 2, True) == 66 and _sm_budget(2, 4, False) == 1
    monkeypatch.setenv("CIRCUSLINK_SM_BUDGET", "20")
    assert _sm_budget(132, 2, False) == 20
    for value, capped in (("", False), ("100", False), ("50", True), ("25.5", True), ("junk", False)):
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", value)
        assert _mps_capped() is capped, value


def test_a_rank_in_sms_of_its_own_may_take_the_whole_group_when_asked():
    assert resident_blocks(2, 64, 2, capped=False) == 64  # half of its group's 128 slots (the default)
    assert resident_blocks(2, 64, 2, capped=False, whole=True) == 128
    assert resident_blocks(2, 32, 4, capped=False, whole=True) == 64


def test_the_partition_grid_share_is_read_and_checked():
    from circuslink.backends import _partition
    from circuslink.errors import ConfigError

    assert _partition.grid_share({}) == "half"
    assert _partition.grid_share({"CIRCUSLINK_PARTITION_GRID": " Whole "}) == "whole"
    with pytest.raises(ConfigError, match="CIRCUSLINK_PARTITION_GRID='most'"):
        _partition.grid_share({"CIRCUSLINK_PARTITION_GRID": "most"})
