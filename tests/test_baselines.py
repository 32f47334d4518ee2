"""The baselines (NCCL, MPI, NVSHMEM): what runs here on CPUs, and GPU tests for the device machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import types
from pathlib import Path

import numpy as np
import pytest

import circuslink as cl
from circuslink._wait import Deadline
from circuslink.bench import baselines
from circuslink.bench.baselines import _common, _nccl, _nvshmem
from circuslink.transport import _build

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def world():
    w = cl.init(backend="cpu")
    yield w
    w.close()


# -- shared pieces ----------------------------------------------------------------------------------
def test_random_bytes_reproducible_and_fresh():
    seed = _common.fresh_seed()
    a, b = _common.random_bytes(seed, 4099), _common.random_bytes(seed, 4099)
    assert a.dtype == np.uint8 and a.size == 4099 and np.array_equal(a, b)
    assert not np.array_equal(a, _common.random_bytes(seed + 1, 4099))
    assert len(np.unique(a)) > 200  # really random bytes, not a constant


def test_a_stalled_nccl_wait_names_it_and_aborts_the_communicator(world):
    """The one host wait, with the size's deadline: on time-out the error names what stalled, and the
    world's communicator (a Resource in its registry; it may be wedged) is aborted and forgotten."""
    calls = []
    held = object.__new__(_nccl.NcclComm)  # a communicator without NCCL: only its lifecycle is used
    held.world, held.stream = world, None
    held.comm = types.SimpleNamespace(abort=lambda: calls.append("abort"), destroy=lambda: calls.append("destroy"))
    held._register(world)
    world.registry(_nccl._REGISTRY_KEY, dict)["comm"] = held
    never = types.SimpleNamespace(done=False)
    with pytest.raises(cl.TimeoutError) as info:
        _nccl._wait_event(world, never, Deadline.after(0.2),
                          lambda: "NCCL pingpong of 8 B on rank 0 (waiting on rank 1)")
    assert str(info.value) == ("NCCL pingpong of 8 B on rank 0 (waiting on rank 1): timed out after 0.2 s "
                               "(CIRCUSLINK_TIMEOUT sets the limit)")
    assert calls == ["abort"] and held.closed and world.resources(_nccl.NcclComm) == []
    assert "comm" not in world.registry(_nccl._REGISTRY_KEY, dict)

    class DoneOnThirdLook:
        looks = 0

        @property
        def done(self) -> bool:
            self.looks += 1
            return self.looks >= 3

    event = DoneOnThirdLook()
    _nccl._wait_event(world, event, Deadline.after(1.0), "x")
    assert event.looks == 3


def test_the_gpu_paths_are_chosen_by_capability(world, monkeypatch):
    assert not _common.on_gpu(world)  # cpu: runs no kernels, no device
    monkeypatch.setattr(world.backend, "runs_kernels", True)
    assert not _common.on_gpu(world)  # kernels but no device: still not a GPU
    monkeypatch.setattr(world.backend, "device", 0)
    assert _common.on_gpu(world)


def test_disable_multicast(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    baselines.disable_multicast()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["NVSHMEM_DISABLE_NVLS"] == "1"


@pytest.mark.parametrize("call", [
    lambda w: baselines.nccl_pingpong(w, [], 10, 1),
    lambda w: baselines.nccl_pingpong(w, [8, 0], 10, 1),
    lambda w: baselines.nccl_pingpong(w, [8], 0, 1),
    lambda w: baselines.nccl_allreduce(w, [8], 10, -1),
    lambda w: baselines.nccl_allreduce(w, [8], 10, 1, dtype="complex64"),
    lambda w: baselines.mpi_pingpong(w, [8.5], 10, 1),
])
def test_bad_arguments_are_config_errors(world, call):
    with pytest.raises(cl.ConfigError):
        call(world)


# -- NCCL on a cpu world: skipped rows, never a crash -------------------------------------------------
def test_nccl_on_cpu_returns_skipped_rows(world):
    rows = baselines.nccl_pingpong(world, [8, 64], 10, 1)
    assert [r["bytes"] for r in rows] == [8, 64]
    assert all(r == {"impl": "nccl", "bytes": r["bytes"], "skipped": "nccl needs a back-end with a GPU (this run "
                                                                   "uses cpu)"} for r in rows), rows
    rows = baselines.nccl_allreduce(world, [1 * KiB], 10, 1, dtype="int32")
    assert rows[0]["skipped"] and rows[0]["op"] == "allreduce" and rows[0]["dtype"] == "int32"


def test_grouped_plan_validation():
    norm = _nccl._normalise_plan([(1, 8), (1, 16, 0), (2, 0, 32)], rank=0, size=3)
    assert norm == [(1, 8, 8), (1, 16, 0), (2, 0, 32)]
    for bad, field in [([(0, 8)], "peer 0"), ([(3, 8)], "peer 3"), ([(1, -8)], "send_nbytes"),
                       ([(1, 0, 0)], "moves no bytes"), ([(1,)], "must be"), ([5], "not a tuple")]:
        with pytest.raises(cl.ConfigError, match=field):
            _nccl._normalise_plan(bad, rank=0, size=3)
    # k one-way writes of s bytes from rank 0 to rank 1 match; a size or count mismatch does not.
    _nccl._check_plans([[(1, 64, 0)] * 4, [(0, 0, 64)] * 4])
    _nccl._check_plans([[(1, 8, 8), (2, 8, 8)], [(0, 8, 8)], [(0, 8, 8)]])
    with pytest.raises(cl.ConfigError, match="rank 0 sends .* rank 1"):
        _nccl._check_plans([[(1, 64, 0)] * 4, [(0, 0, 64)] * 3])
    with pytest.raises(cl.ConfigError, match="rank 1 sends"):
        _nccl._check_plans([[(1, 0, 8)], [(0, 16, 0)]])


def test_grouped_sendrecv_on_cpu_is_skipped_after_validation(spmd):
    job = spmd(2, """
        import circuslink as cl
        from circuslink.bench.baselines import nccl_grouped_sendrecv
        w = cl.init()
        plan = {0: [(1, 64, 0)] * 8, 1: [(0, 0, 64)] * 8}
        out = nccl_grouped_sendrecv(w, plan, iters=5, warmup=1)
        assert out["impl"] == "nccl-grouped-sendrecv" and out["bytes"] == 512 and out["messages"] == 8, out
        assert out["skipped"] == "nccl-grouped-sendrecv needs a back-end with a GPU (this run uses cpu)", out
        mine = [(1 - w.rank, 32)]  # this rank's own list: exchange 32 B with the other rank
        out = nccl_grouped_sendrecv(w, mine, iters=5, warmup=1)
        assert out["bytes"] == 32 and out["messages"] == 1 and out["skipped"]
        try:
            nccl_grouped_sendrecv(w, {0: [(1, 64)], 1: [(0, 32)]}, iters=5, warmup=1)
        except cl.ConfigError as exc:
            assert "rank 0 sends [64] bytes to rank 1" in str(exc), exc
        else:
            raise AssertionError("a mismatched plan was accepted")
        w.close()
        print("ok", w.rank)
    """, timeout=60)
    job.check()
    assert job.output.count("ok") == 2


# -- NCCL and host staging, driven through a fake CuPy on CPUs ---------------------------------------
# No GPU here, so the NCCL baselines' control flow (collective call order, verification, timing
# and rows) runs against a stand-in: "device" arrays are numpy arrays with CuPy's set/get, and
# "NCCL" moves the bytes with MPI. The real thing runs in the gpu tests below.
FAKE_CUPY = r"""
import ctypes
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
from mpi4py import MPI


class _Mem:
    def __init__(self, ptr):
        self.ptr = ptr


class FakeArray(np.ndarray):
    @property
    def data(self):
        return _Mem(self.__array_interface__["data"][0])

    def set(self, arr, stream=None):
        # As strict as CuPy: same shape and dtype, host arrays only.
        if not isinstance(arr, np.ndarray) or isinstance(arr, FakeArray):
            raise TypeError("set() takes a numpy array")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"set(): {arr.dtype}{arr.shape} into {self.dtype}{self.shape}")
        self.view(np.ndarray)[...] = arr

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is not None:
            if out.shape != self.shape or out.dtype != self.dtype:
                raise ValueError("get(out=...) has the wrong shape or dtype")
            out[...] = self.view(np.ndarray)
            return out
        return np.array(self.view(np.ndarray))


def empty(shape, dtype=np.float64):
    return np.empty(shape, dtype=dtype).view(FakeArray)


def asarray(a):
    return np.array(a).view(FakeArray)


class Device:
    def __init__(self, device=None):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def use(self):
        pass
    def synchronize(self):
        pass


class Stream:
    ptr = 0
    def __init__(self, non_blocking=False):
        pass
    def synchronize(self):
        pass


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.t = None
    def record(self, stream=None):
        self.t = time.perf_counter()
    @property
    def done(self):
        return self.t is not None


def get_elapsed_time(a, b):
    return (b.t - a.t) * 1e3


_NP = {1: np.uint8, 7: np.float32, 8: np.float64, 6: np.float16, 2: np.int32, 4: np.int64, 3: np.uint32,
       5: np.uint64, 0: np.int8}


class NcclError(Exception):
    pass


_group = []
_state = {"in_group": False}


def _view(ptr, count, dt):
    itemsize = np.dtype(_NP[dt]).itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (count * itemsize)).from_address(ptr))
    return raw.view(_NP[dt])


class NcclCommunicator:
    def __init__(self, ndev, uid, rank):
        assert ndev == MPI.COMM_WORLD.Get_size() and rank == MPI.COMM_WORLD.Get_rank(), (ndev, rank)
        assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "multicast must be off before NCCL starts"
        self.comm = MPI.COMM_WORLD.Dup()

    def send(self, ptr, count, dt, peer, stream):
        buf = _view(ptr, count, dt).copy()
        if _state["in_group"]:
            _group.append(("send", buf, peer, self.comm))
        else:
            self.comm.Send(buf, dest=peer, tag=7)

    def recv(self, ptr, count, dt, peer, stream):
        view = _view(ptr, count, dt)
        if _state["in_group"]:
            _group.append(("recv", view, peer, self.comm))
        else:
            self.comm.Recv(view, source=peer, tag=7)
            if os.environ.get("FAKE_NCCL_CORRUPT") and self.comm.Get_rank() == 1:
                view[-1] ^= 1

    def allReduce(self, sptr, rptr, count, dt, op, stream):
        parts = self.comm.allgather(_view(sptr, count, dt).copy())
        total = sum(p.astype(np.float64 if parts[0].dtype.kind == "f" else np.int64) for p in parts)
        _view(rptr, count, dt)[...] = total.astype(parts[0].dtype)

    def abort(self):
        pass

    def destroy(self):
        print("nccl communicator destroyed", MPI.COMM_WORLD.Get_rank(), flush=True)


def groupStart():
    _state["in_group"] = True


def groupEnd():
    _state["in_group"] = False
    reqs = []
    for kind, buf, peer, comm in _group:
        if kind == "send":
            reqs.append(comm.Isend(buf, dest=peer, tag=7))
        else:
            reqs.append(comm.Irecv(buf, source=peer, tag=7))
    MPI.Request.Waitall(reqs)
    _group.clear()


def get_unique_id():
    return tuple(range(8))


def install():
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    nccl.NcclError, nccl.NcclCommunicator = NcclError, NcclCommunicator
    nccl.groupStart, nccl.groupEnd, nccl.get_unique_id = groupStart, groupEnd, get_unique_id
    names = {"NCCL_UINT8": 1, "NCCL_FLOAT32": 7, "NCCL_FLOAT64": 8, "NCCL_FLOAT16": 6, "NCCL_INT32": 2,
             "NCCL_INT64": 4, "NCCL_UINT32": 3, "NCCL_UINT64": 5, "NCCL_INT8": 0, "NCCL_SUM": 0}
    for k, v in names.items():
        setattr(nccl, k, v)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl, cuda.Device, cuda.Stream, cuda.Event = nccl, Device, Stream, Event
    cuda.get_elapsed_time = get_elapsed_time
    cupy = types.ModuleType("cupy")
    cupy.cuda, cupy.empty, cupy.asarray, cupy.uint8 = cuda, empty, asarray, np.uint8
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype=np.float64: np.empty(shape, dtype=dtype)
    sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl, "cupyx": cupyx})
"""

FAKE_JOB_PREFIX = """
    import circuslink as cl
    w = cl.init()
    import fake_cupy
    fake_cupy.install()
    w.backend.runs_kernels = True  # the fake device: the baselines take their GPU code paths
    w.backend.device = w.rank  # one fake GPU per rank
    from circuslink.bench.baselines import (mpi_pingpong, nccl_allreduce, nccl_grouped_sendrecv,
                                            nccl_pingpong)
"""


@pytest.fixture
def fake_gpu(tmp_path):
    (tmp_path / "fake_cupy.py").write_text(FAKE_CUPY)
    return FAKE_JOB_PREFIX


@pytest.mark.mpi
def test_nccl_skips_ranks_that_share_a_gpu(spmd, fake_gpu):
    """NCCL refuses two ranks on one device: the baseline says so in skipped rows, naming them."""
    job = spmd(2, fake_gpu + """
    w.backend.device = 0
    rows = nccl_pingpong(w, [8, 4096], iters=5, warmup=1)
    assert [r["bytes"] for r in rows] == [8, 4096], rows
    assert all(r["skipped"] == "nccl needs one GPU per rank (ranks 0, 1 share GPU 0)" for r in rows), rows
    w.close()
    print("ok", w.rank)
    """, launcher="mpirun", timeout=120)
    job.check()
    assert job.output.count("ok") == 2


@pytest.mark.mpi
def test_nccl_and_staging_code_paths_with_a_fake_gpu(spmd, fake_gpu):
    job = spmd(2, fake_gpu + """
    sizes = [8, 1000, 1 << 20]
    rows = nccl_pingpong(w, sizes, iters=5, warmup=1)
    assert [r["bytes"] for r in rows] == sizes and all(r["impl"] == "nccl" for r in rows), rows
    assert all(r["latency_us"] > 0 and r["throughput_GBps"] > 0 and "skipped" not in r for r in rows), rows
    assert w.allgather_object(rows)[0] == rows

    for dtype in ("float32", "int8", "float16", "uint64"):
        ar = nccl_allreduce(w, [1, 8, 1000, 1 << 16], iters=3, warmup=1, dtype=dtype)
        item = {"float32": 4, "int8": 1, "float16": 2, "uint64": 8}[dtype]
        assert [r["bytes"] for r in ar] == list(dict.fromkeys(max(1, s // item) * item for s in [1, 8, 1000, 1 << 16]))
        assert all(r["dtype"] == dtype and r["nranks"] == 2 and "skipped" not in r for r in ar), ar

    chain = nccl_grouped_sendrecv(w, {0: [(1, 64, 0)] * 8, 1: [(0, 0, 64)] * 8}, iters=5, warmup=1)
    assert chain["messages"] == 8 and chain["bytes"] == 512 and chain["time_us"] > 0, chain
    both = nccl_grouped_sendrecv(w, [(1 - w.rank, 4096), (1 - w.rank, 100)], iters=5, warmup=1)
    assert both["bytes"] == 4196 and both["messages"] == 2, both

    staged = mpi_pingpong(w, [8, 65536], iters=5, warmup=1)
    assert [r["impl"] for r in staged] == ["mpi-host-staged"] * 2, staged
    from circuslink.bench.baselines._nccl import NcclComm
    assert len(w.resources(NcclComm)) == 1  # one communicator for every call, kept on the World
    w.close()  # destroys it
    print("ok", w.rank)
    """, launcher="mpirun", timeout=120)
    job.check()
    assert job.output.count("ok") == 2
    assert job.output.count("nccl communicator destroyed") == 2


@pytest.mark.mpi
def test_nccl_data_check_catches_corruption(spmd, fake_gpu):
    job = spmd(2, fake_gpu + """
    try:
        nccl_pingpong(w, [4096], iters=5, warmup=1)
    except cl.Error as exc:
        # rank 1's copy is corrupted, and so is the echo rank 0 gets back
        assert "data check failed (" in str(exc), exc
        assert "rank 1: got wrong bytes from rank 0 at offset 4095 of 4096" in str(exc), exc
        assert "rank 0: got wrong bytes from rank 1" in str(exc), exc
        print("caught", w.rank)
    w.close()
    """, launcher="mpirun", timeout=120, env={"FAKE_NCCL_CORRUPT": "1"})
    assert job.output.count("caught") == 2, job.output


# -- MPI ------------------------------------------------------------------------------------------
def test_mpi_pingpong_without_mpirun_returns_nothing(world, capsys):
    assert baselines.mpi_pingpong(world, [8], 10, 1) == []
    assert "mpirun" in capsys.readouterr().err


MPI_JOB = """
    import numpy as np
    import circuslink as cl
    from circuslink.bench.baselines import mpi_pingpong
    w = cl.init()
    sizes = [8, 1000, 64 * 1024, 1 << 20]
    rows = mpi_pingpong(w, sizes, iters=20, warmup=2)
    assert [r["bytes"] for r in rows] == sizes, rows
    for r in rows:
        assert r["impl"] == "mpi" and r["iters"] == 20 and r["latency_us"] > 0, r
    # every rank gets the same rows
    all_rows = w.allgather_object(rows)
    assert all(x == all_rows[0] for x in all_rows)
    w.close()
    print("ok", w.rank)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 3])
def test_mpi_pingpong_under_mpirun(spmd, nranks):
    job = spmd(nranks, MPI_JOB, launcher="mpirun", timeout=90)
    job.check()
    assert job.output.count("ok") == nranks


def test_mpi_wait_is_bounded_and_cancels_what_never_completes():
    from circuslink.bench.baselines import _mpi

    class Request:
        def __init__(self, completes_after):
            self.tests, self.completes_after, self.cancelled = 0, completes_after, False

        def Test(self):  # noqa: N802 - mpi4py's name
            self.tests += 1
            return self.tests > self.completes_after

        def Cancel(self):  # noqa: N802
            self.cancelled = True

    soon = Request(completes_after=500)  # past the back-off's spin phase: the wait keeps spinning
    _mpi._wait(soon, Deadline.after(5.0), lambda: "never named")
    assert soon.tests == 501 and not soon.cancelled
    never = Request(completes_after=1 << 62)
    with pytest.raises(cl.TimeoutError) as info:
        _mpi._wait(never, Deadline.after(0.1), lambda: "MPI receive of 8 B on rank 0 from rank 1")
    assert str(info.value) == ("MPI receive of 8 B on rank 0 from rank 1: timed out after 0.1 s "
                               "(CIRCUSLINK_TIMEOUT sets the limit)")
    assert never.cancelled


@pytest.mark.mpi
def test_mpi_data_check_catches_corruption(spmd):
    """The pingpong's check can fail: a byte flipped on arrival at rank 1 is reported by both ranks."""
    job = spmd(2, """
        import circuslink as cl
        from circuslink.bench.baselines import _mpi
        w = cl.init()
        arrived = _mpi._Endpoint.received

        def corrupted(self, n):
            got = arrived(self, n)
            if w.rank == 1:
                got[n // 2] ^= 0x40
            return got

        _mpi._Endpoint.received = corrupted
        try:
            _mpi.mpi_pingpong(w, [4096], iters=5, warmup=1)
        except cl.Error as exc:
            print("error:", exc)
        w.close()
    """, launcher="mpirun", timeout=90)
    job.check()
    # Both ranks raise the same line (the verdict is agreed); under mpirun their prints may interleave.
    assert job.output.count("mpi_pingpong: data check failed (rank 1: wrong byte from rank 0 at offset "
                            "2048 of 4096)") == 2, job.output


# -- NVSHMEM --------------------------------------------------------------------------------------
def _nvshmem_buildable() -> str | None:
    try:
        _build.find_nvshmem()
        _build.find_nvcc()
        _build.mpi_flags()
    except cl.BackendError as exc:
        return str(exc)
    return None


needs_nvshmem_build = pytest.mark.skipif(
    _nvshmem_buildable() is not None,
    reason=f"cannot build the NVSHMEM baseline here: {_nvshmem_buildable()}",
)


def test_nvshmem_missing_is_a_backend_error(monkeypatch, tmp_path):
    monkeypatch.setattr(_build, "nvidia_dirs", lambda: [])
    monkeypatch.setenv("NVSHMEM_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(cl.BackendError, match="NVSHMEM not found .*nvidia-nvshmem-cu13"):
        baselines.nvshmem_pingpong([8], 10, 1, out_dir=tmp_path)


def test_nvshmem_missing_nvcc_is_a_backend_error(monkeypatch, tmp_path):
    monkeypatch.setenv("NVCC", str(tmp_path / "no-nvcc"))
    with pytest.raises(cl.BackendError, match="NVCC=.*no-nvcc.* is not an executable"):
        _build.find_nvcc()


def test_nvshmem_run_environment_and_command(monkeypatch, tmp_path):
    nv = tmp_path / "nvshmem"
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("PMIX_RANK", "1")
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "7")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x")
    env = _nvshmem._job_env(nv, 256 * MiB)
    # The nested mpirun must not inherit the enclosing job's identity, but keeps the user's settings.
    assert not {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "OMPI_MCA_ess_base_jobid"} & set(env)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
    assert env["NVSHMEM_BOOTSTRAP"] == "MPI" and env["LD_LIBRARY_PATH"] == f"{nv / 'lib'}:/opt/x"
    assert int(env["NVSHMEM_SYMMETRIC_SIZE"]) >= 2 * 256 * MiB
    if shutil.which("mpirun"):
        cmd = _nvshmem.mpirun_command(tmp_path / "bin", ["sizes=8"], env)
        assert cmd[1:4] == ["--allow-run-as-root", "-np", "2"] and cmd[-2:] == [str(tmp_path / "bin"), "sizes=8"]
        exported = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
        assert {"LD_LIBRARY_PATH", "NVSHMEM_BOOTSTRAP", "NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE"} <= set(exported)


def test_nvshmem_stencil_refuses_bad_arguments_in_one_line(tmp_path):
    with pytest.raises(cl.ConfigError, match=r"px \* py == 4 PEs"):
        baselines.nvshmem_stencil(4, [((64, 64), (2, 1))], out_dir=tmp_path)
    with pytest.raises(cl.ConfigError, match="at least one cell a PE"):
        baselines.nvshmem_stencil(2, [((1, 64), (2, 1))], out_dir=tmp_path)
    with pytest.raises(cl.ConfigError, match="dtypes are float32 / float64"):
        baselines.nvshmem_stencil(1, [((8, 8), (1, 1))], dtypes=("float16",), out_dir=tmp_path)


def test_nvshmem_stencil_runs_more_pes_than_two(monkeypatch, tmp_path):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not found")
    env = _nvshmem._job_env(tmp_path, 0)
    cmd = _nvshmem.mpirun_command(tmp_path / "bin", ["domains=8x8:2x2"], env, npes=4)
    assert cmd[1:5] == ["--allow-run-as-root", "-np", "4", "--oversubscribe"] and env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_nvshmem_stencil_updates_cells_as_the_example_does():
    """The baseline's default CELL_UPDATE is the example's cell_update() traced to C++: the same arithmetic."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("stencil_example", root / "examples" / "stencil" / "stencil.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    source = (root / "src" / "circuslink" / "bench" / "baselines" / "nvshmem_stencil.cu").read_text()
    default = re.search(r"#ifndef CELL_UPDATE\n(#define CELL_UPDATE.*)\n#endif", source).group(1)
    assert default.strip() == example.cell_update_cxx().strip()


def test_nvshmem_output_parsing():
    rng = np.random.default_rng()
    lat = float(rng.random() * 3)
    out = "\n".join([
        "NVSHMEM banner {not json",
        json.dumps({"info": {"nvshmem_header_version": "3.4.5", "gpu": "NVIDIA H200"}}),
        json.dumps({"impl": "nvshmem-put-signal", "mode": "thread", "bytes": 8, "latency_us": lat}),
        "  " + json.dumps({"impl": "nvshmem-put-signal-block", "mode": "block", "bytes": 1 << 20}),
    ])
    info, rows = _nvshmem.parse_output(out)
    assert info["nvshmem_header_version"] == "3.4.5"
    assert [r["impl"] for r in rows] == ["nvshmem-put-signal", "nvshmem-put-signal-block"]
    assert rows[0]["latency_us"] == lat


@pytest.fixture(scope="module")
def nvshmem_build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("nvshmem-build")


def test_a_baselines_build_is_cached_by_its_shared_header_too(tmp_path):
    """Every NVSHMEM program includes nvshmem_common.cuh: a change there must rebuild them, as a change of their own
    source does (the cache names a build by a hash of the source, the headers it includes and the command)."""
    from circuslink.transport import _build

    source, header = tmp_path / "prog.cu", tmp_path / "common.cuh"
    source.write_text('#include "common.cuh"\n')
    header.write_text("// one\n")

    def build() -> Path:
        return _build.build_cached("baselines", "prog", source, lambda out: ["cp", str(source), str(out)], suffix="",
                                   folder=tmp_path / "cache", includes=[header])

    first = build()
    assert build() == first  # cached
    header.write_text("// two\n")
    second = build()
    assert second != first and second.is_file() and first.is_file()
    assert _nvshmem.COMMON.is_file() and '#include "nvshmem_common.cuh"' in _nvshmem.SOURCE.read_text()


@needs_nvshmem_build
def test_nvshmem_baseline_compiles_and_is_cached(nvshmem_build_dir):
    t0 = time.monotonic()
    binary = baselines.build_nvshmem_pingpong(nvshmem_build_dir)
    assert binary.is_file() and os.access(binary, os.X_OK)
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert baselines.build_nvshmem_pingpong(nvshmem_build_dir) == binary
    assert time.monotonic() - t0 < max(1.0, first / 4)  # cached, not rebuilt
    assert [p.name for p in nvshmem_build_dir.iterdir() if p.name.startswith(".")] == []  # no half-built leftovers
    # The program's own argument checks work without a GPU (they run before any CUDA call).
    if shutil.which("mpirun"):
        env = _nvshmem._job_env(_nvshmem.find_nvshmem(), 1024)
        cmd = _nvshmem.mpirun_command(binary, ["sizes=8", "colour=blue"], env)
        cmd.insert(1, "--oversubscribe")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode != 0
        assert "nvshmem_pingpong: PE 0: unknown argument colour" in proc.stderr


@needs_nvshmem_build
def test_nvshmem_stencil_compiles_and_checks_its_arguments(nvshmem_build_dir):
    binary = baselines.build_nvshmem_stencil(nvshmem_build_dir)
    assert binary.is_file() and os.access(binary, os.X_OK)
    assert baselines.build_nvshmem_stencil(nvshmem_build_dir) == binary  # cached
    if shutil.which("mpirun"):  # the program's own checks run before any CUDA call
        env = _nvshmem._job_env(_nvshmem.find_nvshmem(), 0)
        for args, why in ((["domains=8x8:1x1", "colour=blue"], "unknown argument colour"),
                          (["domains=8x8"], "domains: 8x8 is not NXxNY:PXxPY"),
                          (["domains=4x8:8x1"], "fewer cells than PEs along an axis")):
            cmd = _nvshmem.mpirun_command(binary, args, env, npes=1)
            cmd.insert(1, "--oversubscribe")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            assert proc.returncode != 0 and "nvshmem_stencil: PE 0: " in proc.stderr and why in proc.stderr, proc.stderr


@needs_nvshmem_build
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_nvshmem_without_a_gpu_fails_with_the_programs_message(nvshmem_build_dir):
    from circuslink.backends import cuda_device_count

    if cuda_device_count() > 0:
        pytest.skip("a GPU is present: test_nvshmem_pingpong_gpu runs the real thing")
    with pytest.raises(cl.BackendError, match="nvshmem_pingpong failed .*nvshmem_pingpong: PE [01]: "):
        baselines.nvshmem_pingpong([8], 10, 1, out_dir=nvshmem_build_dir, timeout=60)
    log = (nvshmem_build_dir / "nvshmem_pingpong.log").read_text()
    assert "--allow-run-as-root -np 2" in log and "sizes=8" in log


@needs_nvshmem_build
def test_nvshmem_compile_error_carries_the_log(tmp_path, monkeypatch):
    broken = tmp_path / "broken.cu"
    broken.write_text("int main() { return undefined_symbol; }\n")
    monkeypatch.setattr(_nvshmem, "SOURCE", broken)
    with pytest.raises(cl.CompileError, match="undefined_symbol"):
        baselines.build_nvshmem_pingpong(tmp_path / "build")


# -- GPU (device machine) ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.two_gpus
def test_nccl_pingpong_gpu(spmd):
    job = spmd(2, """
        import circuslink as cl
        from circuslink.bench.baselines import nccl_pingpong
        w = cl.init()
        sizes = [8, 4096, 1 << 20, 64 << 20]
        rows = nccl_pingpong(w, sizes, iters=50, warmup=5)
        assert [r["bytes"] for r in rows] == sizes and all("skipped" not in r for r in rows), rows
        assert all(0 < r["latency_us"] < 10000 for r in rows), rows
        assert rows[-1]["throughput_GBps"] > 50, rows  # NVLink, not PCIe staging
        if w.rank == 0:
            print("ROWS", rows)
        w.close()
    """, backend="cuda", timeout=300)
    job.check()
    assert "ROWS" in job.output


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
@pytest.mark.two_gpus
def test_nccl_allreduce_gpu(spmd, dtype):
    job = spmd(2, f"""
        import circuslink as cl
        from circuslink.bench.baselines import nccl_allreduce
        w = cl.init()
        rows = nccl_allreduce(w, [8, 1000, 1 << 20, 64 << 20], iters=20, warmup=2, dtype={dtype!r})
        assert all("skipped" not in r for r in rows), rows
        for r in rows:
            assert abs(r["busbw_GBps"] - r["algbw_GBps"]) < 1e-9 * max(1, r["algbw_GBps"])  # 2(n-1)/n = 1 at n=2
        if w.rank == 0:
            print("ROWS", rows)
        w.close()
    """, backend="cuda", timeout=300)
    job.check()


@pytest.mark.gpu
@pytest.mark.two_gpus
def test_nccl_grouped_sendrecv_gpu(spmd):
    job = spmd(2, """
        import circuslink as cl
        from circuslink.bench.baselines import nccl_grouped_sendrecv
        w = cl.init()
        out = nccl_grouped_sendrecv(w, {0: [(1, 8, 0)] * 8, 1: [(0, 0, 8)] * 8}, iters=50, warmup=5)
        assert "skipped" not in out and out["messages"] == 8 and out["time_us"] > 0, out
        ring = nccl_grouped_sendrecv(w, [(1 - w.rank, 1 << 20)], iters=20, warmup=2)
        assert ring["throughput_GBps"] > 10, ring
        if w.rank == 0:
            print("OUT", out, ring)
        w.close()
    """, backend="cuda", timeout=300)
    job.check()


@pytest.mark.gpu
@pytest.mark.mpi
def test_mpi_pingpong_host_staged_gpu(spmd):
    job = spmd(2, """
        import circuslink as cl
        from circuslink.bench.baselines import mpi_pingpong
        w = cl.init()
        rows = mpi_pingpong(w, [8, 1 << 20, 16 << 20], iters=20, warmup=2)
        assert [r["impl"] for r in rows] == ["mpi-host-staged"] * 3, rows
        if w.rank == 0:
            print("ROWS", rows)
        w.close()
    """, backend="cuda", launcher="mpirun", timeout=300)
    job.check()


@pytest.mark.slow
@pytest.mark.gpu
@needs_nvshmem_build
def test_nvshmem_pingpong_gpu(tmp_path):
    sizes = [8, 64, 4096, 1 << 20, 64 << 20]
    rows = baselines.nvshmem_pingpong(sizes, iters=200, warmup=20, out_dir=tmp_path, timeout=300,
                                      modes=("thread", "warp", "block", "stream"), samples=3, messages=4,
                                      bytes_per_sample=256 << 20)
    by = {impl: [r for r in rows if r["impl"] == impl] for impl in
          ("nvshmem-put-signal", "nvshmem-put-signal-warp", "nvshmem-put-signal-block", "nvshmem-put-block-stream")}
    for impl, got in by.items():  # every form at every size, with the median and the minimum
        assert [r["bytes"] for r in got] == sizes, (impl, got)
    assert all(r["verified"] and r["min_one_way_us"] <= r["one_way_us"] and r["samples"] == 3 for r in rows)
    # 2.16 us on 2 x H200, 1.28 us with 2 PEs on one H100 under MPS
    assert by["nvshmem-put-signal"][0]["one_way_us"] < 20
    print(rows)


def test_nvshmem_rma_chains_refuses_bad_arguments_in_one_line(tmp_path):
    with pytest.raises(cl.ConfigError, match="npes must be at least 2 .a ring., got 1"):
        baselines.nvshmem_rma_chains(1, [(1, 8)], out_dir=tmp_path)
    with pytest.raises(cl.ConfigError, match=r"pairs must be \(chain, bytes\) with both >= 1, got \[\(0, 8\)\]"):
        baselines.nvshmem_rma_chains(2, [(0, 8)], out_dir=tmp_path)
    with pytest.raises(cl.ConfigError, match="layouts are contiguous / strided and forms thread / grid"):
        baselines.nvshmem_rma_chains(2, [(1, 8)], layouts=("diagonal",), out_dir=tmp_path)


@needs_nvshmem_build
def test_nvshmem_rma_chain_compiles_and_checks_its_arguments(nvshmem_build_dir):
    binary = baselines.build_nvshmem_rma_chain(nvshmem_build_dir)
    assert binary.is_file() and os.access(binary, os.X_OK)
    assert baselines.build_nvshmem_rma_chain(nvshmem_build_dir) == binary  # cached
    if shutil.which("mpirun"):  # the program's own checks run before any CUDA call
        env = _nvshmem._job_env(_nvshmem.find_nvshmem(), 0)
        for args, why in ((["pairs=1:8", "colour=blue"], "unknown argument colour"),
                          (["pairs=8"], "pairs: 8 is not CHAIN:BYTES"),
                          (["pairs=0:8"], "pairs: 0:8 has a zero"),
                          (["pairs=1:8", "threads=48"], "threads must be a multiple of 32")):
            cmd = _nvshmem.mpirun_command(binary, args, env, npes=1)
            cmd.insert(1, "--oversubscribe")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            assert proc.returncode != 0 and "nvshmem_rma_chain: PE 0: " in proc.stderr and why in proc.stderr, \
                proc.stderr


@pytest.mark.gpu
@needs_nvshmem_build
def test_nvshmem_rma_chains_gpu(tmp_path):
    """Both forms, both layouts, small and large chains, 2 PEs sharing the GPU: every received byte checked by
    the program, a row per form x layout x pair (the thread form up to its 64 KiB)."""
    pairs = [(1, 8), (8, 8), (8, 64 << 10), (1, 1 << 20)]
    rows = baselines.nvshmem_rma_chains(2, pairs, iters=40, warmup=4, samples=10, out_dir=tmp_path, timeout=300)
    got = {(r["impl"], r["layout"], r["chain"], r["bytes"]) for r in rows}
    want = {("nvshmem-put-signal-chain-grid", lay, c, s) for lay in ("contiguous", "strided") for c, s in pairs}
    want |= {("nvshmem-put-signal-chain", lay, c, s) for lay in ("contiguous", "strided") for c, s in pairs
             if c * s <= 64 << 10}
    assert got == want, got ^ want
    assert all(r["verified"] and 0 < r["time_min_us"] <= r["time_us"] and r["samples"] == 10 for r in rows), rows
    print(rows)


def test_mpi_flags_without_mpicc(monkeypatch, tmp_path):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "mpi.h").write_text("/* test */\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").write_bytes(b"")
    monkeypatch.setattr(_build.shutil, "which", lambda name, path=None: None)
    monkeypatch.setenv("MPI_HOME", str(tmp_path))
    assert _build.mpi_flags() == ([f"-I{tmp_path / 'include'}"], [f"-L{tmp_path / 'lib'}", "-lmpi"])
    monkeypatch.setattr(_build, "MPI_GUESSES", ())
    monkeypatch.setenv("MPI_HOME", str(tmp_path / "none"))
    with pytest.raises(cl.BackendError, match="MPI_HOME"):
        _build.mpi_flags()


def test_nvshmem_allreduce_runs_n_pes_with_their_mps_share(monkeypatch, tmp_path):
    """The all-reduce baseline: -np n, every PE's MPS share 100 / n (NVSHMEM's collectives need it), NVLS off."""
    seen = {}
    monkeypatch.setattr(_nvshmem, "find_nvshmem", lambda: tmp_path / "nvshmem")
    monkeypatch.setattr(_build, "build_cached", lambda *a, **k: tmp_path / "bin")
    monkeypatch.setattr(shutil, "which", lambda name, path=None: "/usr/bin/" + name)

    def fake_run(name, binary, cmd, env, timeout, npes, describe):
        seen.update(name=name, cmd=cmd, env=env, npes=npes)
        return [{"impl": "nvshmem-reduce-stream", "bytes": 8}]

    monkeypatch.setattr(_nvshmem, "_run", fake_run)
    rows = baselines.nvshmem_allreduce([8, 4096], 4, 10, 1, samples=12)
    assert rows and seen["name"] == "nvshmem_allreduce" and seen["npes"] == 4
    cmd, env = seen["cmd"], seen["env"]
    assert cmd[1:4] == ["--allow-run-as-root", "-np", "4"]
    exported = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in exported and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "sizes=8,4096" in cmd and "samples=12" in cmd and "forms=stream,device" in cmd
    with pytest.raises(cl.ConfigError, match="forms must be some of"):
        baselines.nvshmem_allreduce([8], 2, 10, 1, forms=("host",))


@needs_nvshmem_build
def test_nvshmem_allreduce_compiles(tmp_path):
    cmd = _nvshmem.build_command(tmp_path / "bin", _nvshmem.ALLREDUCE_SOURCE)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
