"""What a new user meets first: the launcher refuses what the machine cannot hold before any rank starts, says
how far it is, acts on signals at once, leaves no shared memory behind however a job ends, and gives ranks the
environment torchrun would.

The shared-memory tests point the cpu back-end at a folder of their own (``CIRCUSLINK_SHM_DIR``), so other
jobs on the machine cannot disturb what they count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import pid_alive

FAKES = Path(__file__).parent / "fakes"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, CIRCUSLINK_SHM_DIR=str(tmp_path / "shm"), CIRCUSLINK_TIMEOUT="60")
    (tmp_path / "shm").mkdir(exist_ok=True)
    env.update(extra)
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 120, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "circuslink", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _left(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "shm"))


# -- CIRCUSLINK_TIMEOUT: refused in one line before any rank starts ----------------------------------------------
@pytest.mark.parametrize("value,why", [("nan", "positive, finite"), ("inf", "positive, finite"),
                                       ("-1", "positive, finite"), ("abc", "not a number")])
def test_a_bad_timeout_is_one_line_before_any_rank(tmp_path, value, why):
    marker = tmp_path / "started"
    env = _env(tmp_path, CIRCUSLINK_TIMEOUT=value)
    proc = _cli(env, "run", "-n", "2", "--backend", "cpu", "--", sys.executable, "-c",
                f"open({str(marker)!r}, 'w').write('x')", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("circuslink: error: environment variable "
                                                                   f"CIRCUSLINK_TIMEOUT={value!r}"), proc.stderr
    assert why in proc.stderr and not marker.exists()  # no rank ever ran


@pytest.mark.parametrize("value", ["nan", "inf", "abc"])
def test_a_bad_timeout_stops_a_relaunching_command_first(tmp_path, value):
    proc = _cli(_env(tmp_path, CIRCUSLINK_TIMEOUT=value), "probe", "--backend", "cpu", "--quick", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "CIRCUSLINK_TIMEOUT" in proc.stderr and "[1]" not in proc.stderr and "Traceback" not in proc.stderr


def test_timeout_values_are_checked_in_the_library():
    import math

    from circuslink import ConfigError
    from circuslink._config import default_timeout, resolve_timeout

    for bad in (math.nan, math.inf, -2.0, 0, "3", True):
        with pytest.raises(ConfigError, match="positive, finite"):
            resolve_timeout(bad)
    assert resolve_timeout(2) == 2.0 and default_timeout({"CIRCUSLINK_TIMEOUT": "7.5"}) == 7.5
    assert default_timeout({}) == 120.0


# -- shared memory: nothing left behind, however a job ends -------------------------------------------------------
def test_probe_that_times_out_leaves_no_shared_memory(tmp_path):
    proc = _cli(_env(tmp_path, CIRCUSLINK_TIMEOUT="0.001"), "probe", "--backend", "cpu", "--quick", cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr  # a wait of 1 ms fails somewhere, naming what stalled
    assert "Traceback" not in proc.stderr
    assert _left(tmp_path) == []


STUCK_IN_ALLOC = """
import os, time, circuslink as cl
w = cl.init()
print("pid", w.rank, os.getpid(), flush=True)
w.alloc(1 << 20).close()                     # one allocation that completes
boot = w.backend.boot


def stuck(timeout=None):                     # the barrier inside alloc after every rank created its file
    print("in alloc", w.rank, flush=True)
    time.sleep(120)


boot.barrier = stuck
w.alloc(8 << 20)                             # the job ends here, every rank mid-allocation
"""


def _start_stuck(tmp_path: Path, n: int = 2) -> tuple[subprocess.Popen, dict[int, int]]:
    """A job whose ranks all sit inside an allocation, their files created and not yet unlinked."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_IN_ALLOC)
    proc = subprocess.Popen([sys.executable, "-m", "circuslink", "run", "-n", str(n), "--backend", "cpu", "--",
                             sys.executable, str(script)], env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    pids: dict[int, int] = {}
    inside = 0
    deadline = time.monotonic() + 60
    while inside < n:
        assert time.monotonic() < deadline, "the ranks never reached the allocation"
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        words = line.split()
        if "pid" in words:
            pids[int(words[2])] = int(words[3])
        elif "alloc" in words:
            inside += 1
    assert len(_left(tmp_path)) == n  # mid-allocation: every rank's file is there
    return proc, pids


def test_ctrl_c_while_ranks_allocate_leaves_no_shared_memory(tmp_path):
    proc, _ = _start_stuck(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err
    assert _left(tmp_path) == []


def test_killed_rank_while_allocating_leaves_no_shared_memory(tmp_path):
    proc, pids = _start_stuck(tmp_path)
    os.kill(pids[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "rank 1 was killed by SIGKILL" in err, err
    assert _left(tmp_path) == []


def test_killed_launcher_leaves_no_shared_memory(tmp_path):
    """SIGKILL of the launcher itself: its guard ends the ranks and removes their files."""
    proc, pids = _start_stuck(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_left(tmp_path) or any(pid_alive(p) for p in pids.values())):
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids.values())
    assert _left(tmp_path) == []


class _StalledPeers:
    """A job's bootstrap whose peers never answer: every collective times out, as under CIRCUSLINK_TIMEOUT=0.001.
    It notes what the folder held when the wait began (the rank's own file, created just before)."""

    rank, size, job_id = 0, 2, "stalled"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seen: list[str] = []

    def allgather_object(self, obj, timeout=None):
        from circuslink.errors import TimeoutError

        self.seen = sorted(os.listdir(self.folder))
        raise TimeoutError("allgather #1 on rank 0: rank(s) 1 did not arrive: timed out after 0.001 s")

    barrier = allgather_object


def test_an_alloc_whose_peers_time_out_unlinks_its_file(tmp_path, monkeypatch):
    """The rank itself removes its file when the collective inside alloc raises (no launcher needed)."""
    from circuslink import TimeoutError
    from circuslink.backends.cpu import CpuBackend

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("CIRCUSLINK_SHM_DIR", str(shm))
    boot = _StalledPeers(shm)
    backend = CpuBackend(boot)
    with pytest.raises(TimeoutError, match="did not arrive"):
        backend.alloc(1 << 20, timeout=0.001)
    assert boot.seen == ["circuslink-stalled-1-0"]  # the file existed while the rank waited ...
    assert os.listdir(shm) == []                      # ... and is gone once alloc has raised


# -- limits ------------------------------------------------------------------------------------------------------
def test_more_ranks_than_memory_is_refused_in_one_line(tmp_path):
    from circuslink import _sysinfo

    have, _ = _sysinfo.shared_memory()
    n = int(have // (48 << 20)) + 64
    marker = tmp_path / "started"
    proc = _cli(_env(tmp_path), "run", "-n", str(n), "--backend", "cpu", "--", sys.executable, "-c",
                f"open({str(marker)!r}, 'w').write('x')", timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[:2000]
    assert f"{n} ranks need about" in proc.stderr and "start at most" in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("extra", [(), ("--ranks-per-node", "2")])
def test_an_absurd_rank_count_is_refused_at_once(tmp_path, extra):
    """A mistyped -n (10^9 ranks) is refused by the memory check within seconds, before the launcher lays out a
    list of every rank (which alone would take many GiB, and minutes)."""
    n = 10**9
    t0 = time.monotonic()
    proc = _cli(_env(tmp_path), "run", "-n", str(n), *extra, "--backend", "cpu", "--", "true", timeout=30)
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[:2000]
    assert proc.stderr.startswith(f"circuslink: error: {n} ranks need about") and "start at most" in proc.stderr


def test_an_absurd_rank_count_on_gpus_is_refused_at_once(tmp_path):
    env = _env(tmp_path, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}", FAKE_GPUS="2")
    t0 = time.monotonic()
    proc = _cli(env, "run", "-n", str(10**9), "--backend", "cuda", "--", "true", timeout=30)
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[:2000]
    assert "500000000 ranks on GPU 0: an MPS server takes at most" in proc.stderr


def test_more_ranks_on_a_gpu_than_mps_clients_is_refused(tmp_path):
    from circuslink.launcher import MPS_CLIENTS_PER_GPU

    env = _env(tmp_path, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}", FAKE_GPUS="1")
    n = MPS_CLIENTS_PER_GPU + 1
    proc = _cli(env, "run", "-n", str(n), "--backend", "cuda", "--", "true", timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{n} ranks on GPU 0: an MPS server takes at most {MPS_CLIENTS_PER_GPU} clients" in proc.stderr


def test_gpu_memory_is_checked_before_the_ranks_start(tmp_path):
    env = _env(tmp_path, PATH=f"{FAKES}{os.pathsep}{os.environ['PATH']}", FAKE_GPUS="1", FAKE_GPU_FREE_MIB="1000")
    proc = _cli(env, "run", "-n", "4", "--backend", "cuda", "--mps", "off", "--", "true", timeout=60)
    assert proc.returncode == 1 and "on GPU 0, more than its 1.0 GiB free (nvidia-smi)" in proc.stderr, proc.stderr


def test_more_ranks_than_cores_warns_once(tmp_path):
    from circuslink._sysinfo import cores

    n = cores() + 1
    proc = _cli(_env(tmp_path), "run", "-n", str(n), "--backend", "cpu", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(f"warning: {n} ranks on {cores()} cores") == 1


def test_progress_while_many_ranks_start(tmp_path):
    from circuslink.launcher import MANY_RANKS

    script = tmp_path / "join.py"
    script.write_text("import circuslink as cl\nw = cl.init()\nw.barrier()\nw.close()\n")
    proc = _cli(_env(tmp_path), "run", "-n", str(MANY_RANKS), "--backend", "cpu", "--", sys.executable, str(script),
                timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("circuslink run:") and "warning" not in ln]
    assert lines[0] == f"circuslink run: starting {MANY_RANKS} ranks"
    assert any(f"started {MANY_RANKS} ranks" in ln for ln in lines)
    assert any(f"all {MANY_RANKS} ranks joined" in ln for ln in lines)


SLOW_SPAWN = """
import subprocess, sys, time
from circuslink import cli
real = subprocess.Popen
class SlowPopen(real):  # every rank takes 0.25 s to start, as on a machine short of memory
    def __init__(self, args, *a, **k):
        if "--exec" in args:
            time.sleep(0.25)
        super().__init__(args, *a, **k)
subprocess.Popen = SlowPopen
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigterm_while_starting_ranks_is_acted_on_at_once(tmp_path):
    """Ranks that are slow to start (0.25 s each, 40 of them): SIGTERM halfway through the start loop ends the
    job within seconds and starts no more ranks."""
    wrapper = tmp_path / "slow_launcher.py"
    wrapper.write_text(SLOW_SPAWN)
    started = tmp_path / "started"
    started.mkdir()
    proc = subprocess.Popen([sys.executable, str(wrapper), "run", "-n", "40", "--backend", "cpu", "--",
                             sys.executable, "-c", f"import os, time; open(os.path.join({str(started)!r}, "
                             "os.environ['RANK']), 'w').close(); time.sleep(60)"],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while "starting 40 ranks" not in line:
        line = proc.stderr.readline()
        assert line, proc.stderr.read()
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 6, "the launcher went on starting ranks after SIGTERM"
    assert proc.returncode == 130 and "interrupted by SIGTERM" in err, err
    assert len(os.listdir(started)) < 30


# -- the environment each rank sees --------------------------------------------------------------------------------
def test_ranks_see_torchrun_variables(spmd):
    job = spmd(3, """
        import os
        e = os.environ
        print("ENV", e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CIRCUSLINK_RANK"],
              e["CIRCUSLINK_SIZE"], flush=True)
    """).check()
    seen = sorted(line.split("ENV ")[1] for line in job.stdout.splitlines() if "ENV " in line)
    assert seen == [f"{r} 3 {r} 3 {r} 3" for r in range(3)]


@pytest.mark.mpi
@pytest.mark.parametrize("how", [("--launcher", "mpirun"), ("--ranks-per-node", "2")])
def test_ranks_started_by_mpirun_see_torchrun_variables_too(tmp_path, how):
    """`circuslink run` that starts its ranks by mpirun (asked for, or for declared nodes) gives them the same
    names: a torch.distributed program finds its rank however circuslink run started it."""
    code = ("import os; e = os.environ; print('ENV', e['RANK'], e['WORLD_SIZE'], e['LOCAL_RANK'], "
            "e['LOCAL_WORLD_SIZE'], flush=True)")
    proc = _cli(_env(tmp_path), "run", "-n", "4", *how, "--backend", "cpu", "--", sys.executable, "-c", code,
                timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = sorted(line.split("ENV ")[1] for line in proc.stdout.splitlines() if "ENV " in line)
    assert seen == [f"{r} 4 {r} 4" for r in range(4)]


# -- MPS messages on a machine without a GPU ------------------------------------------------------------------------
def _no_gpu_path(tmp_path: Path) -> str:
    """PATH on a machine without a GPU: an nvidia-smi that lists none, and no MPS control daemon."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "nvidia-smi").symlink_to(FAKES / "nvidia-smi")
    return f"{tools}{os.pathsep}{os.environ['PATH']}"


def test_mps_without_a_gpu_runs_the_command_without_a_warning(tmp_path):
    env = _env(tmp_path, PATH=_no_gpu_path(tmp_path), FAKE_GPUS="0", CUDA_VISIBLE_DEVICES="")
    proc = _cli(env, "mps", "--", sys.executable, "-c", "print('ran')")
    assert proc.returncode == 0 and proc.stdout == "ran\n" and "time-sliced" not in proc.stderr, proc.stderr


def test_mps_on_is_refused_alike_without_a_gpu(tmp_path):
    env = _env(tmp_path, PATH=_no_gpu_path(tmp_path), FAKE_GPUS="0", CUDA_VISIBLE_DEVICES="")
    mps = _cli(env, "mps", "--mps", "on", "--", "true")
    run = _cli(env, "run", "-n", "2", "--backend", "cpu", "--mps", "on", "--", "true")
    for proc in (mps, run):
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("circuslink: error: --mps on: ") and "no MPS" in proc.stderr
