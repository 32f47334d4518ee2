"""CUDA MPS around jobs whose ranks share a GPU (circuslink.mps, the launcher, the job guard).

These run anywhere: tests/fakes holds stand-ins for nvidia-smi and nvidia-cuda-mps-control
(a "daemon" that is a sleeping process owning the pipe directory's control file), so the
launcher's decisions and its clean-up on every way a job can end are checked without a GPU.
The ranks here never initialise CUDA: they report the environment the launcher gave them.
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


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """PATH with the fake tools first, a private default pipe directory, and a log of daemon starts/stops."""
    log = tmp_path / "mps.log"
    env = dict(os.environ)
    env["PATH"] = f"{FAKES}{os.pathsep}{env['PATH']}"
    env["FAKE_MPS_LOG"] = str(log)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(tmp_path / "no-daemon-here")
    env["TMPDIR"] = str(tmp_path)
    env["CIRCUSLINK_SM_PARTITION"] = "off"  # MPS's cap, whatever this machine's driver offers (test_partition.py)
    for key in ("CIRCUSLINK_MPS", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_LOG_DIRECTORY", "CIRCUSLINK_RANK",
                "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        env.pop(key, None)
    return env, log, tmp_path


REPORT = ("import os; print('RANK', os.environ['CIRCUSLINK_RANK'], os.environ.get('CIRCUSLINK_DEVICE'), "
          "os.environ.get('CUDA_MPS_PIPE_DIRECTORY'), os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'), "
          "os.environ.get('NCCL_NVLS_ENABLE'), flush=True)")


def _run(env, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "circuslink", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _daemon_events(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _assert_stopped(log: Path, tmp: Path) -> None:
    events = _daemon_events(log)
    starts = [e for e in events if e[0] == "start"]
    quits = [e for e in events if e[0] == "quit"]
    assert len(starts) == 1 and len(quits) == 1, events
    assert not pid_alive(int(starts[0][1])), "the MPS daemon outlived the job"
    assert not list(tmp.glob("circuslink-mps-*")), "the job's MPS directory was left behind"


def test_shared_gpu_starts_a_private_daemon_and_gives_each_rank_its_share(fake_gpu):
    env, log, tmp = fake_gpu
    env["FAKE_GPUS"] = "1"
    job = _run(env, "run", "-n", "4", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
    assert job.returncode == 0, job.stderr
    rows = sorted(line.split("RANK", 1)[1].split() for line in job.stdout.splitlines() if "RANK" in line)
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    pipes = {r[2] for r in rows}
    assert len(pipes) == 1 and "circuslink-mps-" in pipes.pop()
    assert {r[1] for r in rows} == {"0"} and {r[3] for r in rows} == {"25"}  # 4 ranks share GPU 0
    assert {r[4] for r in rows} == {"0"}  # NVLink multicast stays off in every rank
    assert "warning" not in job.stderr.replace("warning: 4 ranks on", "")  # (more ranks than cores: another warning)
    _assert_stopped(log, tmp)


def test_ranks_with_sms_of_their_own_run_uncapped(fake_gpu):
    """With a green context a rank (CIRCUSLINK_SM_PARTITION=green) MPS must leave the ranks uncapped: it honours
    a client's green context only then."""
    env, log, tmp = fake_gpu
    env["FAKE_GPUS"] = "1"
    env["CIRCUSLINK_SM_PARTITION"] = "green"
    job = _run(env, "run", "-n", "2", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
    assert job.returncode == 0, job.stderr
    rows = [line.split("RANK", 1)[1].split() for line in job.stdout.splitlines() if "RANK" in line]
    assert len(rows) == 2 and {r[3] for r in rows} == {"100"}
    _assert_stopped(log, tmp)


def test_one_rank_per_gpu_needs_no_mps(fake_gpu):
    env, log, _ = fake_gpu
    env["FAKE_GPUS"] = "2"
    job = _run(env, "run", "-n", "2", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
    assert job.returncode == 0, job.stderr
    rows = sorted(line.split("RANK", 1)[1].split() for line in job.stdout.splitlines() if "RANK" in line)
    assert [r[1] for r in rows] == ["0", "1"] and {r[3] for r in rows} == {"None"}
    assert _daemon_events(log) == []


def test_running_daemon_is_reused_and_left_running(fake_gpu):
    env, log, tmp = fake_gpu
    pipe = tmp / "site-mps"
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
    subprocess.run([str(FAKES / "nvidia-cuda-mps-control"), "-d"], env=env, check=True, timeout=60)
    try:
        job = _run(env, "run", "-n", "2", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
        assert job.returncode == 0, job.stderr
        rows = [line.split("RANK", 1)[1].split() for line in job.stdout.splitlines() if "RANK" in line]
        assert {r[2] for r in rows} == {str(pipe)} and {r[3] for r in rows} == {"50"}
        assert [e[0] for e in _daemon_events(log)] == ["start"]  # not stopped: not ours
    finally:
        subprocess.run([str(FAKES / "nvidia-cuda-mps-control")], input="quit\n", text=True, env=env, timeout=60)


def test_auto_falls_back_with_one_warning_and_on_refuses(fake_gpu):
    env, log, _ = fake_gpu
    env["FAKE_MPS_FAIL"] = "1"
    job = _run(env, "run", "-n", "2", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
    assert job.returncode == 0, job.stderr
    warnings = [line for line in job.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "MPS" in warnings[0] and "time-sliced" in warnings[0], job.stderr
    rows = [line.split("RANK", 1)[1].split() for line in job.stdout.splitlines() if "RANK" in line]
    assert {r[2] for r in rows} == {env["CUDA_MPS_PIPE_DIRECTORY"]} and {r[3] for r in rows} == {"None"}
    job = _run(env, "run", "-n", "2", "--mps", "on", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
    assert job.returncode == 1
    lines = job.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("circuslink: error: --mps on: cannot use CUDA MPS"), job.stderr
    assert "RANK" not in job.stdout


def test_off_never_starts_mps(fake_gpu):
    env, log, _ = fake_gpu
    job = _run(env, "run", "-n", "2", "--mps", "off", "--backend", "cuda", "--", sys.executable, "-c", REPORT)
    assert job.returncode == 0, job.stderr
    assert _daemon_events(log) == [] and "MPS" not in job.stderr


def test_failed_rank_still_stops_the_daemon(fake_gpu):
    env, log, tmp = fake_gpu
    code = "import os, sys, time; sys.exit(3) if os.environ['CIRCUSLINK_RANK'] == '1' else time.sleep(60)"
    t0 = time.monotonic()
    job = _run(env, "run", "-n", "3", "--backend", "cuda", "--", sys.executable, "-c", code)
    assert job.returncode == 3 and "rank 1 exited with code 3" in job.stderr
    assert time.monotonic() - t0 < 30
    _assert_stopped(log, tmp)


def _start_launcher(env, tmp, ranks=3):
    marker = tmp / "ranks"
    marker.mkdir()
    code = (f"import os, time; open(os.path.join({str(marker)!r}, str(os.getpid())), 'w').close(); "
            "time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-m", "circuslink", "run", "-n", str(ranks), "--backend", "cuda", "--",
                             sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 30
    while len(list(marker.iterdir())) < ranks:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)
    return proc, [int(p.name) for p in marker.iterdir()]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_or_interrupted_launcher_leaves_nothing_running(fake_gpu, sig):
    env, log, tmp = fake_gpu
    proc, pids = _start_launcher(env, tmp)
    proc.send_signal(sig)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for p in pids) or len(_daemon_events(log)) < 2 or list(tmp.glob("circuslink-mps-*")):
        assert time.monotonic() < deadline, f"after {sig.name}: ranks {[p for p in pids if pid_alive(p)]} alive, " \
                                            f"daemon events {_daemon_events(log)}"
        time.sleep(0.05)
    _assert_stopped(log, tmp)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted" in proc.stderr.read()


def test_cuda_without_a_gpu_is_one_line(fake_gpu):
    env, _, _ = fake_gpu
    env["FAKE_GPUS"] = "0"
    for args in (["run", "-n", "2", "--backend", "cuda", "--", sys.executable, "-c", "pass"],
                 ["probe", "--backend", "cuda"], ["bench", "pingpong", "--backend", "cuda", "--quick"]):
        job = _run(env, *args)
        lines = job.stderr.strip().splitlines()
        assert job.returncode == 1 and len(lines) == 1, (args, job.stderr)
        assert lines[0].startswith("circuslink: error:") and "no GPU" in lines[0], job.stderr


def test_mps_command_wraps_a_command(fake_gpu):
    env, log, tmp = fake_gpu
    env["FAKE_GPUS"] = "1"
    code = ("import os; print('ENV', os.environ['CUDA_MPS_PIPE_DIRECTORY'], os.environ['CIRCUSLINK_MPS'], "
            "os.environ['CIRCUSLINK_GPU_COUNT'])")
    job = _run(env, "mps", "--", sys.executable, "-c", code)
    assert job.returncode == 0, job.stderr
    pipe, active, gpus = job.stdout.split("ENV", 1)[1].split()
    assert pipe == active and "circuslink-mps-" in pipe and gpus == "1"
    _assert_stopped(log, tmp)
    job = _run(env, "mps", "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert job.returncode == 7
    job = _run(env, "mps")
    assert job.returncode == 1 and "no command to run" in job.stderr
