"""The forward-progress rule of the cuda back-end's grid sizing (backends/cuda.py, max_blocks, launch_resident),
checked on the cpu with a stand-in occupancy query: a rank alone on its GPU gets every block that fits its SM
budget; ranks sharing a GPU get half of their 1/k share of those blocks, counted over the budget's SMs (one block
where that is less, if the k ranks' single blocks fit the SMs they share; else none, and the grid is refused), which
stopped the grid-barrier time-outs that the full share gave under MPS on an H100; and k,
counted at init from every rank's device identity, also where `circuslink run` pins each rank's GPU. The rule
itself, for every register count, is tests/test_occupancy.py."""

from types import SimpleNamespace

import pytest

from circuslink.backends.cuda import CudaBackend
from circuslink.errors import BackendError


class FakeDriverError(Exception):
    def __init__(self, status):
        super().__init__(f"CUDA_ERROR {status}")
        self.status = status


def fake_backend(per_sm: int, sm_budget: int, ranks_on_gpu: int):
    """A CudaBackend with a stand-in driver (its occupancy answer is ``per_sm``), built without a GPU."""
    driver = SimpleNamespace(occupancyMaxActiveBlocksPerMultiprocessor=lambda ptr, threads, shared: per_sm,
                             CUDADriverError=FakeDriverError)
    backend = CudaBackend.__new__(CudaBackend)
    backend.xp = SimpleNamespace(cuda=SimpleNamespace(driver=driver, get_current_stream=lambda: "current"))
    backend.sm_budget, backend.ranks_on_gpu, backend.device = sm_budget, ranks_on_gpu, 0
    backend.boot = SimpleNamespace(rank=1)
    backend._cooperative = True
    return backend


KERNEL = SimpleNamespace(kernel=SimpleNamespace(ptr=0), name="k", num_regs=32)


class FakeFunction:
    """cupy's Function: records launches; fails cooperative ones with ``coop_status`` when set."""

    ptr = 0

    def __init__(self, coop_status=None):
        self.launches = []
        self.coop_status = coop_status

    def __call__(self, grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
        if enable_cooperative_groups and self.coop_status is not None:
            raise FakeDriverError(self.coop_status)
        self.launches.append((grid, block, args, shared_mem, stream, enable_cooperative_groups))


@pytest.mark.parametrize("per_sm,budget,k,want", [
    (8, 132, 1, 1056),  # alone: every block that fits
    (8, 66, 2, 132),    # 2 ranks: half of 4 an SM
    (2, 66, 2, 33),     # 86 registers at 256 threads: 2 an SM, so 33 (the old "one an SM" gave 66 and timed out)
    (16, 33, 4, 66),
    (2, 10, 16, 1),     # less than one block by the half share: one, since 16 single blocks fit 10 SMs of 2
    (1, 10, 48, 0),     # 48 ranks' single blocks on the 10 SMs they share, one an SM: none can be resident
])
def test_max_blocks_keeps_shared_gpus_below_half_their_share(per_sm, budget, k, want):
    assert CudaBackend.max_blocks(fake_backend(per_sm, budget, k), KERNEL, 256) == want


@pytest.mark.parametrize("per_sm,budget,k", [(8, 132, 1), (4, 66, 2), (2, 33, 4), (1, 10, 48)])
def test_wave_blocks_fill_the_budget_once_whatever_the_share(per_sm, budget, k):
    """A streaming grid (no block waits) takes a full wave of the rank's SMs, not the resident share."""
    backend = fake_backend(per_sm, budget, k)
    wave = CudaBackend.wave_blocks(backend, KERNEL, 256)
    assert wave == per_sm * budget
    assert wave >= CudaBackend.max_blocks(backend, KERNEL, 256) and (k == 1 or wave > backend.max_blocks(KERNEL, 256))


def test_max_blocks_refuses_a_kernel_that_fits_no_sm():
    with pytest.raises(BackendError, match=r"kernel k does not fit an SM \(32 registers a thread, 1024 threads a "):
        CudaBackend.max_blocks(fake_backend(0, 66, 2), KERNEL, 1024)


def test_launch_resident_refuses_a_grid_that_cannot_be_resident_in_one_line():
    """The issue's kernel: 86 registers, 472 B of stack, 256 threads a block, 2 an SM; 2 ranks on a GPU of 132 SMs."""
    kernel = SimpleNamespace(kernel=FakeFunction(), name="jacobi_persistent", num_regs=86, local_size_bytes=472)
    backend = fake_backend(2, 66, 2)
    with pytest.raises(BackendError) as info:
        backend.launch_resident(kernel, (66,), (256,), ())
    text = str(info.value)
    assert "\n" not in text and kernel.kernel.launches == []
    assert text.startswith("kernel jacobi_persistent: a persistent grid of 66 blocks cannot be resident on rank 1: "
                           "33 fit (86 registers a thread, 472 B of stack, 256 threads a block")
    assert "2 blocks an SM; 2 ranks share GPU 0, 66 SMs each); launch at most 33 blocks" in text


def test_launch_resident_refuses_every_grid_where_the_ranks_single_blocks_do_not_fit():
    """16 capped ranks sharing 8 SMs, a kernel of one block an SM: one block a rank would be 16 blocks on 8 SMs."""
    kernel = SimpleNamespace(kernel=FakeFunction(), name="jacobi_onchip", num_regs=128)
    backend = fake_backend(1, 8, 16)
    with pytest.raises(BackendError) as info:
        backend.launch_resident(kernel, 1, 512, ())
    text = str(info.value)
    assert "\n" not in text and kernel.kernel.launches == []
    assert text.startswith("kernel jacobi_onchip: a persistent grid of 1 blocks cannot be resident on rank 1: 0 fit")
    assert "16 ranks share GPU 0, 8 SMs each); no grid of it can be" in text and "run fewer ranks" in text


def test_launch_resident_launches_a_grid_that_fits_cooperatively():
    kernel = SimpleNamespace(kernel=FakeFunction(), name="k", num_regs=40)
    backend = fake_backend(4, 66, 2)
    backend.launch_resident(kernel, 66, 128, [1, 2], shared_bytes=512)
    assert kernel.kernel.launches == [((66,), (128,), (1, 2), 512, "current", True)]
    with pytest.raises(BackendError, match="persistent grid of 65 blocks .* 64 fit"):
        backend.launch_resident(kernel, (5, 13), (16, 8), (), limit=64)  # e.g. channels.max_blocks while routed


def test_launch_resident_falls_back_to_a_plain_launch_where_cooperative_is_not_supported():
    kernel = SimpleNamespace(kernel=FakeFunction(coop_status=801), name="k", num_regs=40)
    backend = fake_backend(4, 66, 1)
    backend.launch_resident(kernel, (8, 2), (256,), (), stream="s")
    backend.launch_resident(kernel, (8, 2), (256,), (), stream="s")
    assert kernel.kernel.launches == [((8, 2), (256,), (), 0, "s", False)] * 2 and not backend._cooperative


def test_launch_resident_reports_a_failed_cooperative_launch_in_one_line():
    kernel = SimpleNamespace(kernel=FakeFunction(coop_status=720), name="k", num_regs=40)  # launch too large
    with pytest.raises(BackendError, match=r"^kernel k: the cooperative launch of 16 blocks failed on rank 1: "):
        fake_backend(4, 66, 1).launch_resident(kernel, 16, 256, ())


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


def test_use_device_waits_the_longer_of_15_s_and_circuslink_timeout(monkeypatch):
    """A client killed mid-kernel keeps the MPS server down past 15 s: the next job's ranks wait as long as the
    job's own waits (CIRCUSLINK_TIMEOUT), never less than 15 s."""
    from circuslink.backends import cuda

    assert cuda._unavailable_wait_s({}) == 120.0
    assert cuda._unavailable_wait_s({"CIRCUSLINK_TIMEOUT": "20"}) == 20.0
    assert cuda._unavailable_wait_s({"CIRCUSLINK_TIMEOUT": "2"}) == 15.0
    monkeypatch.setenv("CIRCUSLINK_TIMEOUT", "0.4")
    monkeypatch.setattr(cuda, "_UNAVAILABLE_WAIT_S", 0.2)  # the floor, shortened so that the test is quick
    cp, _ = fake_cupy(fail_times=10**6)
    with pytest.raises(BackendError, match=r"GPU 0 is busy or unavailable to this process for 0.4 s "):
        cuda._use_device(cp, 0)
    monkeypatch.setenv("CIRCUSLINK_TIMEOUT", "0.1")
    with pytest.raises(BackendError, match=r"GPU 0 is busy or unavailable to this process for 0.2 s "):
        cuda._use_device(cp, 0)


def test_use_device_passes_other_errors_through():
    from circuslink.backends.cuda import _use_device

    cp, _ = fake_cupy(fail_times=1, status=101)
    with pytest.raises(FakeRuntimeError):
        _use_device(cp, 0, wait_s=5)


# -- how many ranks share this rank's GPU (backends/cuda.py, CudaBackend.__init__) --------------------------
class _GpuStandIn:
    """CuPy as CudaBackend.__init__ uses it, for a machine of ``len(buses)`` GPUs with ``sms`` SMs each (under
    MPS CUDA reports a client's capped count), built without a GPU; one process's mapped host words are a ctypes
    buffer."""

    def __init__(self, buses: list[str], sms: int) -> None:
        import ctypes

        self._words = ctypes.create_string_buffer(8)
        words = ctypes.addressof(self._words)

        class Device:
            def __init__(self, n):
                self.attributes = {"MultiProcessorCount": sms}
                self.pci_bus_id = buses[n]

            def use(self):
                return None

        standin = self
        self.streams_used = 0  # streams made CuPy's current stream (Stream.use)

        class Stream:
            def __init__(self, non_blocking: bool) -> None:
                self.non_blocking = non_blocking

            def use(self) -> None:
                standin.streams_used += 1

        runtime = SimpleNamespace(getDeviceCount=lambda: len(buses), hostAllocMapped=2,
                                  hostAlloc=lambda nbytes, flags: words, CUDARuntimeError=FakeRuntimeError)
        self.cuda = SimpleNamespace(runtime=runtime, Device=Device, Stream=Stream,
                                    Event=lambda disable_timing: "event")


def built_backend(monkeypatch, rank: int, device_of_rank: list[int], buses: list[str], sms: int = 33,
                  share: str | None = None, partition: str = "off"):
    """Rank ``rank``'s CudaBackend, built by its own __init__, in a job whose rank r uses GPU
    ``device_of_rank[r]`` (pinned by CIRCUSLINK_DEVICE, as ``circuslink run`` pins every rank's GPU), under the
    MPS cap ``circuslink run`` gives ranks sharing a GPU unless ``share`` says otherwise ("100": uncapped)."""
    import socket

    from circuslink.backends import cuda

    host = socket.gethostname()
    monkeypatch.setattr(cuda, "_cupy", lambda: _GpuStandIn(buses, sms))
    monkeypatch.setenv("CIRCUSLINK_DEVICE", str(device_of_rank[rank]))
    monkeypatch.delenv("CIRCUSLINK_SM_BUDGET", raising=False)
    monkeypatch.setenv("CIRCUSLINK_SM_PARTITION", partition)  # never a real green context without a GPU
    sharing = device_of_rank.count(device_of_rank[rank])
    if share is None and sharing > 1:
        share = str(100 // sharing)  # as `circuslink run` caps ranks that share a GPU
    if share is None:
        monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    else:
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share)
    gathered = []

    def allgather_object(obj, timeout=None):
        gathered.append(timeout)
        peers = [f"{host}:{buses[d]}" for d in device_of_rank]
        assert obj == peers[rank]
        return peers

    boot = SimpleNamespace(rank=rank, size=len(device_of_rank), local_rank=rank, local_size=len(device_of_rank),
                           allgather_object=allgather_object)
    backend = cuda.CudaBackend(boot)
    backend.gathered_with = gathered  # the time-outs of its allgathers
    return backend


def test_ranks_pinned_to_one_gpu_by_circuslink_run_count_each_other(monkeypatch):
    """`circuslink run` sets CIRCUSLINK_DEVICE for every rank. The count of ranks on a GPU once took a pinned
    device for a GPU of the rank's own, so 4 ranks under MPS each sized a persistent grid to their whole share:
    the stencil's 168-register kernel (one block an SM) got 33 blocks a rank, 4 x 33 for one GPU of 132 SMs,
    and one rank's grid did not start until another's had given up. Half of a 1/4 share is 4 blocks."""
    backend = built_backend(monkeypatch, rank=2, device_of_rank=[0, 0, 0, 0], buses=["0000:19:00.0"])
    assert backend.ranks_on_gpu == 4
    assert len(backend.gathered_with) == 1 and backend.gathered_with[0] > 0  # one collective, bounded
    per_sm_one = fake_backend(1, backend.sm_budget, backend.ranks_on_gpu)
    assert CudaBackend.max_blocks(per_sm_one, KERNEL, 256) == 4
    assert 4 * CudaBackend.max_blocks(per_sm_one, KERNEL, 256) <= backend.sm_budget  # all 4 fit one rank's SMs


def test_uncapped_ranks_each_take_their_share_of_the_gpu(monkeypatch):
    """Ranks sharing a GPU uncapped (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100) see all its SMs: each rank's budget is
    its 1/k of them and its grids half of the blocks those hold, so the 4 grids together fill half the GPU."""
    backend = built_backend(monkeypatch, rank=1, device_of_rank=[0, 0, 0, 0], buses=["0000:19:00.0"], sms=132,
                            share="100")
    assert backend.ranks_on_gpu == 4 and not backend.capped and backend.sm_budget == 33
    one_an_sm = fake_backend(1, backend.sm_budget, backend.ranks_on_gpu)
    one_an_sm.capped = backend.capped
    assert CudaBackend.max_blocks(one_an_sm, KERNEL, 256) == 16
    assert 4 * CudaBackend.max_blocks(one_an_sm, KERNEL, 256) <= 132 // 2
    capped = built_backend(monkeypatch, rank=1, device_of_rank=[0, 0, 0, 0], buses=["0000:19:00.0"], sms=33)
    assert capped.capped and capped.sm_budget == 33  # the count CUDA reports under the 25 % cap


def test_ranks_on_other_gpus_are_not_counted(monkeypatch):
    buses = ["0000:19:00.0", "0000:3b:00.0"]
    backend = built_backend(monkeypatch, rank=1, device_of_rank=[0, 1, 0, 1, 1], buses=buses)
    assert backend.ranks_on_gpu == 3 and backend.device == 1
    assert built_backend(monkeypatch, rank=0, device_of_rank=[0, 1], buses=buses).ranks_on_gpu == 1


def test_ranks_sharing_counts_equal_identities_and_this_rank_at_least():
    from circuslink.backends.cuda import _ranks_sharing

    assert _ranks_sharing(["a:1", "a:1", "b:1", "a:2", "a:1"], "a:1") == 3  # same bus id on another host differs
    assert _ranks_sharing([None], "a:1") == 1


def test_shared_gpus_groups_by_identity_not_ordinal():
    """Two hosts' GPU 0 are two GPUs: ranks are grouped by the GPU's identity (host and PCI bus); a repeated
    ordinal is named with its identity."""
    import types

    from circuslink.backends import describe_shared_gpus, shared_gpus

    def world(gathered):
        return types.SimpleNamespace(device=0, backend=types.SimpleNamespace(device_identity="a:0"),
                                     allgather_object=lambda obj: gathered)

    one_host = [("a:0", 0), ("a:0", 0), ("a:1", 1)]
    assert shared_gpus(world(one_host)) == {0: [0, 1]}
    two_hosts = [("a:0", 0), ("b:0", 0), ("a:0", 0), ("b:0", 0)]
    groups = shared_gpus(world(two_hosts))
    assert sorted(groups.values()) == [[0, 2], [1, 3]]
    assert describe_shared_gpus(groups) == "ranks 0, 2 share GPU 0 (a:0); ranks 1, 3 share GPU 0 (b:0)"
    assert shared_gpus(world([("a:0", 0), ("b:0", 0)])) == {}
    assert shared_gpus(types.SimpleNamespace(device=None)) == {}
