"""Shared test machinery: run a snippet of Python as N ranks, the way users run programs.

``spmd(n, code)`` writes ``code`` to a file and runs it under ``circuslink run -n N``
(``launcher="mpirun"`` runs it under ``mpirun`` instead). The snippet asserts on every
rank; the test asserts on the job's exit code and output. Every job has a wall-clock
limit, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    from circuslink.backends import SHARED_GPU_NOTE, cuda_device_count

    gpus = cuda_device_count()
    mpi = shutil.which("mpirun") is not None and _importable("mpi4py")
    for item in items:
        if "gpu" in item.keywords and not gpus:
            item.add_marker(pytest.mark.skip(reason="needs a GPU (the device machine runs scripts/gpu-check.sh)"))
        elif "two_gpus" in item.keywords and gpus < 2:
            why = f"NCCL and NVSHMEM refuse two ranks on one GPU, and {SHARED_GPU_NOTE}"
            item.add_marker(pytest.mark.skip(reason=f"needs 2 GPUs, found {gpus}: {why}"))
        if "mpi" in item.keywords and not mpi:
            item.add_marker(pytest.mark.skip(reason="needs mpirun and mpi4py"))


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


class Job:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def check(self) -> Job:
        assert self.returncode == 0, f"job failed (rc={self.returncode}):\n{self.output}"
        return self


@pytest.fixture
def spmd(tmp_path):
    def run(n: int, code: str, backend: str = "cpu", timeout: float = 180, env: dict | None = None,
            launcher: str = "circuslink", job_timeout: float | None = None) -> Job:
        script = tmp_path / f"job_{n}.py"
        script.write_text(textwrap.dedent(code))
        full_env = dict(os.environ)
        full_env.setdefault("CIRCUSLINK_TIMEOUT", "60")
        full_env.update(env or {})
        if launcher == "circuslink":
            cmd = [sys.executable, "-m", "circuslink", "run", "-n", str(n), "--backend", backend, "--",
                   sys.executable, str(script)]
        elif launcher == "mpirun":
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
                   "-x", "CIRCUSLINK_TIMEOUT", "-x", "CIRCUSLINK_BACKEND",
                   sys.executable, str(script)]
            full_env["CIRCUSLINK_BACKEND"] = backend
        else:
            raise ValueError(launcher)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=job_timeout or timeout,
                              cwd=str(tmp_path))
        return Job(proc)

    return run
