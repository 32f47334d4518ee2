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


# -- a GPU that MPS keeps "busy or unavailable" for a while (backends/cuda.py, _use_device) -----------------
class FakeRuntimeError(Exception):
    def __init__(self, status):
        super().__init__(f"cudaError {status}")
        self.status = status


def fake_cupy(fail_times: int, status: int = 46):
    calls = []

    class Device:
        def __init__(self, n):
            self.n = n

        def use(self):
            calls.append(self.n)
            if len(calls) <= fail_times:
                raise FakeRuntimeError(status)

    runtime = SimpleNamespace(CUDARuntimeError=FakeRuntimeError, errorDevicesUnavailable=46)
    return SimpleNamespace(cuda=SimpleNamespace(Device=Device, runtime=runtime)), calls


def test_use_device_waits_out_a_gpu_that_mps_keeps_unavailable():
    from circuslink.backends.cuda import _use_device

    cp, calls = fake_cupy(fail_times=3)
    _use_device(cp, 0, wait_s=10)
    assert calls == [0, 0, 0, 0]


def test_use_device_names_the_mps_pipe_when_the_gpu_stays_unavailable(monkeypatch):
    from circuslink.backends.cuda import _use_device

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/some-pipe")
    cp, _ = fake_cupy(fail_times=10**6)
    with pytest.raises(BackendError, match=r"GPU 1 is busy or unavailable .* the MPS server of /tmp/some-pipe failed"):
        _use_device(cp, 1, wait_s=0.3)


def test_use_device_passes_other_errors_through():
    from circuslink.backends.cuda import _use_device

    cp, _ = fake_cupy(fail_times=1, status=101)
    with pytest.raises(FakeRuntimeError):
        _use_device(cp, 0, wait_s=5)
