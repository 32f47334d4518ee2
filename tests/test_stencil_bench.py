"""``circuslink bench stencil`` on the cpu back-end: it times the example's host form (and the MPI host-staged
baseline under mpirun) at one rank of the whole domain and at N ranks, checks every small domain bit for bit
against numpy, writes the one results format with time per iteration, Gcell/s and strong-scaling efficiency,
and says why the rows it cannot run here are skipped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from circuslink.bench import stencil as bench
from circuslink.errors import ConfigError


def _run(tmp_path, *argv: str) -> dict:
    out = tmp_path / "stencil.json"
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "stencil", "--backend", "cpu", "--json",
                           str(out), "--iters", "3", "--samples", "2", "--warmup", "1", *argv],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_host_form_rows_at_one_and_three_ranks(tmp_path):
    data = _run(tmp_path, "--ranks", "3", "--domains", "20x17,9x31", "--impls", "host,channel-persistent,nvshmem")
    assert data["benchmark"] == "stencil" and data["backend"] == "cpu"
    timed = [r for r in data["rows"] if "skipped" not in r]
    assert {(r["nranks"], r["domain"], r["dtype"]) for r in timed} == {
        (n, d, t) for n in (1, 3) for d in ("20x17", "9x31") for t in ("float32", "float64")}
    for r in timed:
        assert r["impl"] == "host" and r["checked"] is True and r["time_per_iter_us"] > 0
        assert r["gcells_per_s"] > 0 and r["min_us"] <= r["time_per_iter_us"]
        assert r["efficiency"] == pytest.approx(1.0 / (r["nranks"] * r["vs_one_rank"]))  # cpu: a device a rank
    skipped = {(r["impl"], r["skipped"]) for r in data["rows"] if "skipped" in r}
    assert ("channel-persistent", "the cpu back-end runs no device kernels") in skipped
    assert ("nvshmem", "the cpu back-end runs no device kernels") in skipped


@pytest.mark.mpi
def test_mpi_host_staged_rows_under_mpirun(tmp_path):
    data = _run(tmp_path, "--ranks", "2", "--domains", "12x10", "--per-rank", "--impls", "mpi-host-staged",
                "--dtypes", "float64")
    timed = sorted((r for r in data["rows"] if "skipped" not in r), key=lambda r: r["nranks"])
    got = [(r["nranks"], r["domain"], r["grid"]) for r in timed]
    assert got == [(1, "12x10", "mesh:1x1"), (2, "24x10", "mesh:2x1")]  # blocks stay 12x10
    assert all(r["checked"] for r in timed) and timed[1]["bytes"] == 2 * (12 + 10) * 8


def test_scaling_is_against_one_rank_of_the_same_family_and_domain():
    rows = [{"impl": "host", "dtype": "float32", "domain": "8x8", "nranks": 1, "devices": 1, "time_per_iter_us": 10.0},
            {"impl": "host", "dtype": "float32", "domain": "8x8", "nranks": 4, "devices": 1, "time_per_iter_us": 12.5},
            {"impl": "host", "dtype": "float32", "domain": "8x8", "nranks": 2, "devices": 2, "time_per_iter_us": 4.0},
            {"impl": "host", "dtype": "float64", "domain": "8x8", "nranks": 2, "devices": 1, "time_per_iter_us": 9.0},
            {"impl": "nvshmem", "bytes": 0, "nranks": 2, "skipped": "why"}]
    bench._add_scaling(rows)
    assert rows[1]["vs_one_rank"] == 1.25 and rows[1]["efficiency"] == 0.8  # four ranks sharing one GPU
    assert rows[2]["efficiency"] == 1.25 and "efficiency" not in rows[3]  # no float64 one-rank row


def test_channel_rows_are_compared_with_nvshmem_of_the_same_form_type_domain_and_ranks(capsys):
    def row(impl, t, dtype="float32", domain="64x64", n=2):
        return {"impl": impl, "dtype": dtype, "domain": domain, "nranks": n, "time_per_iter_us": t}

    rows = [row("channel-persistent", 6.0), row("channel-launch", 30.0), row("nvshmem-persistent", 8.0),
            row("nvshmem-launch", 20.0), row("channel-persistent", 5.0, n=4), row("nvshmem-persistent", 4.0, n=4),
            row("channel-persistent", 5.0, dtype="float64"), row("host", 9.0),
            {"impl": "nvshmem", "bytes": 0, "nranks": 8, "skipped": "why"}]
    bench._add_vs_nvshmem(rows)
    assert rows[0]["vs_nvshmem"] == 0.75 and rows[1]["vs_nvshmem"] == 1.5 and rows[4]["vs_nvshmem"] == 1.25
    assert "vs_nvshmem" not in rows[6] and "vs_nvshmem" not in rows[7]  # no float64 NVSHMEM row; not a channel row
    assert not any("vs_nvshmem" in r for r in rows if r["impl"].startswith("nvshmem"))
    bench._summary(rows, {})
    out = capsys.readouterr().out
    assert "channel-persistent, 64x64, 2 ranks, float32: 0.75 x the NVSHMEM stencil's time (target <= 1.0): met" in out
    assert "channels vs NVSHMEM, worst: 1.50 x (channel-launch, 64x64, 2 ranks, float32" in out
    assert out.rstrip().endswith("MISSED")


@pytest.mark.parametrize("option,text,why", [
    ("--domains", "64x", "bad domain '64x'"),
    ("--impls", "host,cuda-graph", "unknown cuda-graph"),
    ("--ranks", "2,x", "expected rank counts"),
])
def test_bad_options_are_one_line(tmp_path, option, text, why):
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "stencil", "--backend", "cpu", option, text],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1 and why in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("extra", [(), ("--per-rank", "--ranks", "4")])
def test_a_domain_too_large_for_the_machine_is_refused_up_front(tmp_path, extra):
    """As qcd invert and fft2 do: the need is checked before any job starts (the ranks died of numpy's
    MemoryError one job after another, each a traceback, and the bench exited 0)."""
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "stencil", "--backend", "cpu", "--domains",
                           "64x64,100000x100000", "--impls", "host", *extra],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("circuslink: error: bench stencil: the float64 domain ")
    assert "needs about" in proc.stderr and "use smaller --domains" in proc.stderr and proc.stdout == ""


def test_a_missing_example_is_named(tmp_path):
    with pytest.raises(ConfigError, match="bench stencil times the program of examples/stencil, which is not at"):
        bench.load_example(str(tmp_path))


@pytest.mark.gpu
def test_channel_and_nvshmem_stencils_side_by_side_gpu(tmp_path):
    """Both forms through channels and through NVSHMEM in the same jobs (1 and 2 ranks, an uneven split), every
    domain checked bit for bit, the channel rows compared with NVSHMEM's."""
    out = tmp_path / "stencil.json"
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "stencil", "--backend", "cuda", "--json",
                           str(out), "--iters", "5", "--samples", "3", "--warmup", "1", "--ranks", "2", "--domains",
                           "64x64,33x70", "--impls", "channel-launch,channel-persistent,nvshmem"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if "skipped" in r], [r for r in rows if "skipped" in r]
    for impl in ("nvshmem-launch", "nvshmem-persistent"):
        got = {(r["nranks"], r["domain"], r["dtype"]) for r in rows if r["impl"] == impl}
        assert got == {(n, d, t) for n in (1, 2) for d in ("64x64", "33x70") for t in ("float32", "float64")}, impl
    assert all(r.get("checked") for r in rows), [r for r in rows if not r.get("checked")]
    assert all(r["vs_nvshmem"] > 0 for r in rows if r["impl"].startswith("channel-"))
    # these blocks fit one block's shared memory: both persistent stencils run their on-chip kernels
    persistent = [r for r in rows if r["impl"] in ("channel-persistent", "nvshmem-persistent")]
    assert persistent and all(r.get("kernel") == "onchip" for r in persistent), persistent
    # timed on the device's clock from iteration min(nranks, iters - 1) on, the event-timed loop beside it
    assert all(r["timed_from"] == r["nranks"] and r["time_per_iter_us"] > 0 and r["event_us"] > 0
               for r in persistent), persistent
    assert "x the NVSHMEM stencil's time (target <= 1.0)" in proc.stdout


class _FakeEvent:
    def record(self, stream):
        pass


class _FakeRun:
    """The example's KernelRun as _Stepper drives it: records each steps() call, checks timed_from as it does."""

    stream = None

    def __init__(self):
        self.calls = []

    def steps(self, iters, form, timed_from=None):
        if timed_from is not None and not 0 <= timed_from < iters:
            raise ConfigError(f"timed_from={timed_from} outside 0..{iters - 1}")
        self.calls.append((iters, form, timed_from))

    def wait(self, what):
        pass


@pytest.mark.parametrize("nranks,n,want", [(2, 0, None), (2, 1, 0), (2, 50, 2), (8, 5, 4), (1, 10, 1)])
def test_the_persistent_loop_is_timed_from_the_rank_count_and_a_warmup_of_no_steps_is_not(nranks, n, want):
    """A persistent loop stamps the device's clock from iteration min(nranks, n - 1); a loop of no steps (--warmup 0)
    stamps nothing (it asked KernelRun for timed_from=-1, which it refuses)."""
    from types import SimpleNamespace

    stepper = object.__new__(bench._Stepper)
    xp = SimpleNamespace(cuda=SimpleNamespace(Event=_FakeEvent, get_elapsed_time=lambda a, b: 1.0))
    stepper.world = SimpleNamespace(size=nranks, rank=0, xp=xp)
    stepper.impl, stepper.form, stepper.run = "channel-persistent", "persistent", _FakeRun()
    assert stepper.steps(n) == pytest.approx(1e-3)
    assert stepper.run.calls == [(n, "persistent", want)]
