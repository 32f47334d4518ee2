"""SMs of its own for each rank sharing a GPU (backends/_partition.py): the split's arithmetic, the mode, the
launcher's share, and the back-end built around a partition, all without a GPU (the driver is a stand-in).
The GPU side (blocks confined to a rank's SMs, ranks' SMs disjoint) is tests/test_partition_gpu.py."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from test_backend_blocks import KERNEL, FakeDriverError, built_backend

from circuslink import mps
from circuslink.backends import _partition, cuda
from circuslink.errors import BackendError, ConfigError


def test_groups_are_equal_whole_units_of_the_driver_alignment():
    assert _partition.group_sms(132, 2) == 64  # an H100 / H200: 2 x 64, 4 SMs left over
    assert _partition.group_sms(132, 4) == 32
    assert _partition.group_sms(132, 3) == 40
    assert _partition.group_sms(132, 16) == 8
    assert _partition.group_sms(132, 17) == 0  # fewer than 8 SMs a group
    assert _partition.group_sms(78, 2, min_partition=2, alignment=2) == 38
    assert _partition.group_sms(0, 2) == 0 and _partition.group_sms(132, 0) == 0


def test_a_rank_takes_its_place_among_the_ranks_of_its_gpu():
    ids = ["h:a", "h:b", "h:a", "h:a", "h:b"]
    assert [_partition.index_on_gpu(ids, r) for r in range(5)] == [0, 0, 1, 2, 1]


@pytest.mark.parametrize("raw, want", [("", "off"), ("AUTO", "auto"), (" green ", "green"), ("off", "off")])
def test_mode_reads_the_environment(raw, want):
    assert _partition.mode({"CIRCUSLINK_SM_PARTITION": raw}) == want


def test_a_bad_mode_is_one_line_naming_the_variable():
    with pytest.raises(ConfigError, match=r"CIRCUSLINK_SM_PARTITION='green-ish'.*auto, green, off"):
        _partition.mode({"CIRCUSLINK_SM_PARTITION": "green-ish"})


def test_the_launcher_leaves_partitioned_ranks_uncapped(monkeypatch):
    monkeypatch.setattr(_partition, "available", lambda: True)
    assert mps.rank_share(4, {}) == "25"  # the default: MPS's cap
    assert mps.rank_share(4, {"CIRCUSLINK_SM_PARTITION": "auto"}) == "100"  # where the driver has green contexts
    assert mps.rank_share(4, {"CIRCUSLINK_SM_PARTITION": "off"}) == "25"
    monkeypatch.setattr(_partition, "available", lambda: False)
    assert mps.rank_share(4, {"CIRCUSLINK_SM_PARTITION": "auto"}) == "25"  # auto without them: the cap
    assert mps.rank_share(3, {"CIRCUSLINK_SM_PARTITION": "green"}) == "100"
    assert not _partition.wanted(1, {"CIRCUSLINK_SM_PARTITION": "green"})  # a rank alone needs none


class FakePartition:
    """A green context as the back-end uses it: its SM count, bind() on a thread, describe()."""

    made: list[tuple[int, int, int]] = []

    def __init__(self, device: int, groups: int, index: int) -> None:
        FakePartition.made.append((device, groups, index))
        self.sm_count, self.bound = 32, 0

    def bind(self) -> None:
        self.bound += 1

    def describe(self) -> str:
        return f"SM group of {self.sm_count} SMs"


def _occupancy_answer(backend, per_sm):
    driver = SimpleNamespace(occupancyMaxActiveBlocksPerMultiprocessor=lambda ptr, threads, shared: per_sm,
                             CUDADriverError=FakeDriverError)
    backend.xp = SimpleNamespace(cuda=SimpleNamespace(driver=driver, get_current_stream=lambda: "current"))
    return backend


def test_a_partitioned_rank_sizes_its_grids_by_its_own_sms(monkeypatch):
    backend = _built_with(monkeypatch, rank=2)
    assert FakePartition.made == [(0, 4, 2)]  # group 2 of 4: its place among the ranks of GPU 0
    assert backend.ranks_on_gpu == 4 and not backend.capped
    assert backend.sm_count == 32 and backend.sm_budget == 32
    assert backend.xp.streams_used == 1  # a stream of the partition is CuPy's current stream, not the null one
    # half of what its own 32 SMs hold (the margin uncapped ranks keep), where the 25 % cap gave half of 1/4
    assert cuda.CudaBackend.max_blocks(_occupancy_answer(backend, 2), KERNEL, 256) == 32
    backend.bind_thread()
    assert backend.partition.bound == 1
    with pytest.raises(BackendError, match="SM group of 32 SMs"):
        cuda.CudaBackend.check_resident(_occupancy_answer(backend, 2), SimpleNamespace(
            kernel=SimpleNamespace(ptr=0), name="k", num_regs=32), 33, 256)
    monkeypatch.setenv(_partition.GRID_ENV, "whole")  # all of it: no other rank's blocks run there
    assert cuda.CudaBackend.max_blocks(_occupancy_answer(backend, 2), KERNEL, 256) == 64


def _built_with(monkeypatch, rank, partition="auto", fail=False):
    """Rank ``rank`` of 4 sharing GPU 0 of 132 SMs uncapped, its green context a stand-in (or one that fails)."""
    FakePartition.made = []

    def make(device, groups, index):
        if fail:
            raise BackendError("CIRCUSLINK_SM_PARTITION: cuGreenCtxCreate failed on GPU 0: stand-in")
        return FakePartition(device, groups, index)

    monkeypatch.setattr(_partition, "GreenPartition", make)
    monkeypatch.setattr(_partition, "available", lambda: True)
    return built_backend(monkeypatch, rank=rank, device_of_rank=[0, 0, 0, 0], buses=["0000:19:00.0"], sms=132,
                         share="100", partition=partition)


def test_auto_falls_back_to_sharing_the_gpu_with_one_warning(monkeypatch, capsys):
    backend = _built_with(monkeypatch, rank=1, fail=True)
    assert backend.partition is None and backend.sm_count == 132 and backend.sm_budget == 33
    assert backend.xp.streams_used == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: rank 1" in err and "cuGreenCtxCreate failed" in err


def test_green_required_fails_in_one_line(monkeypatch):
    with pytest.raises(BackendError, match="cuGreenCtxCreate failed on GPU 0"):
        _built_with(monkeypatch, rank=1, partition="green", fail=True)


def test_capped_ranks_take_no_partition(monkeypatch):
    FakePartition.made = []
    monkeypatch.setattr(_partition, "GreenPartition", FakePartition)
    monkeypatch.setattr(_partition, "available", lambda: True)
    backend = built_backend(monkeypatch, rank=1, device_of_rank=[0, 0], buses=["0000:19:00.0"], sms=66,
                            partition="green")
    assert backend.capped and backend.partition is None and FakePartition.made == []


def test_info_says_how_ranks_sharing_a_gpu_split_its_sms(capsys):
    from circuslink import info

    facts = {"circuslink": "x", "python": "3", "platform": "p", "packages": {}, "tools": {},
             "backends": {"cpu": True, "cuda": True}, "default_backend": "cuda",
             "nodes": {"CIRCUSLINK_RANKS_PER_NODE": None, "host": "h"},
             "cuda": {"runtime": 13000, "driver": 13000}, "mps": {"active": True, "how": "started", "pipe_dir": "/p"},
             "sm_partition": {"mode": "auto", "green_contexts": False},
             "gpus": [{"index": 0, "name": "GPU", "sm": "9.0", "multiprocessors": 132, "memory_GiB": 80}],
             "peer_access": [[True]], "nvlinks": None}
    info._print(facts)
    out = capsys.readouterr().out
    assert "CIRCUSLINK_SM_PARTITION=auto (green contexts not available here; off: MPS's cap)" in out


@pytest.mark.parametrize("user,want", [(None, "auto"), ("off", "off"), ("green", "green")])
def test_a_command_s_partition_mode_is_a_default_the_user_overrides(monkeypatch, user, want):
    # The FFT's commands start their ranks in SMs of their own (measured faster) unless the user chose a mode.
    from circuslink import launcher

    monkeypatch.setattr(os, "environ", dict(os.environ))  # relaunch_self sets the mode in the environment
    if user is None:
        monkeypatch.delenv(_partition.ENV, raising=False)
    else:
        monkeypatch.setenv(_partition.ENV, user)
    seen = {}

    def launch(*args, **kwargs):
        seen["mode"] = os.environ.get(_partition.ENV)
        return 0

    monkeypatch.setattr(launcher, "launch", launch)
    launcher.relaunch_self(2, "cpu", argv=["fft2", "--help"], sm_partition="auto")
    assert seen["mode"] == want


def test_a_command_s_bad_partition_default_is_refused_before_any_rank(monkeypatch):
    from circuslink import launcher

    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.delenv(_partition.ENV, raising=False)
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: pytest.fail("a rank started"))
    with pytest.raises(ConfigError, match="CIRCUSLINK_SM_PARTITION='most'"):
        launcher.relaunch_self(2, "cpu", argv=["fft2"], sm_partition="most")


def test_the_fft_commands_ask_for_sms_of_their_own():
    from circuslink.apps.fft import _plan

    assert _plan.SM_PARTITION == "auto"
