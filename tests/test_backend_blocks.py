"""The forward-progress rule of the cuda back-end's grid sizing (backends/cuda.py, max_blocks), checked on
the cpu with a stand-in occupancy query: a rank alone on its GPU gets every block that fits its SM budget;
ranks sharing a GPU get half of their 1/k share (at least one block an SM), which stopped the grid-barrier
time-outs that the full share gave under MPS on an H100."""

from types import SimpleNamespace

import pytest

from circuslink.backends.cuda import CudaBackend
from circuslink.errors import BackendError


def fake_backend(per_sm: int, sm_budget: int, ranks_on_gpu: int):
    driver = SimpleNamespace(occupancyMaxActiveBlocksPerMultiprocessor=lambda ptr, threads, shared: per_sm)
    return SimpleNamespace(xp=SimpleNamespace(cuda=SimpleNamespace(driver=driver)), sm_budget=sm_budget,
                           ranks_on_gpu=ranks_on_gpu)


KERNEL = SimpleNamespace(kernel=SimpleNamespace(ptr=0), name="k", num_regs=32)


@pytest.mark.parametrize("per_sm,budget,k,want", [
    (8, 132, 1, 1056),  # alone: every block that fits
    (8, 66, 2, 132),    # 2 ranks: half of 4 an SM
    (2, 66, 2, 66),     # never below one block an SM
    (16, 33, 4, 66),
    (1, 10, 48, 10),
])
def test_max_blocks_keeps_shared_gpus_below_half_their_share(per_sm, budget, k, want):
    assert CudaBackend.max_blocks(fake_backend(per_sm, budget, k), KERNEL, 256) == want


def test_max_blocks_refuses_a_kernel_that_fits_no_sm():
    with pytest.raises(BackendError, match="does not fit an SM at 1024 threads"):
        CudaBackend.max_blocks(fake_backend(0, 66, 2), KERNEL, 1024)
