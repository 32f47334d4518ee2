"""Shared test machinery: run a snippet of Python as N ranks, the way users run programs.

``spmd(n, code)`` writes ``code`` to a file and runs it under ``circuslink run -n N``
(``launcher="mpirun"`` runs it under ``mpirun`` instead; ``tag=True`` adds ``--tag-output``). The
snippet asserts on every rank; the test asserts on the job's exit code and output, a rank's lines
read by its tag (``job.rank_lines(r)``), never from lines that ranks' output may have interleaved.
Every job has a wall-clock limit, so a hang fails the test instead of the suite.

Random inputs: the ``seed`` fixture draws a fresh seed per test (or takes
``CIRCUSLINK_TEST_SEED``), ``rng`` is a numpy Generator seeded with it, and a failing test's
report says ``seed N`` with the command that replays it. Jobs started by ``spmd`` see the seed
as ``CIRCUSLINK_TEST_SEED`` (read it with ``int(os.environ["CIRCUSLINK_TEST_SEED"])``).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from circuslink import mps
from circuslink.launcher import mpirun_command

REPO = Path(__file__).resolve().parents[1]
SEED_ENV = "CIRCUSLINK_TEST_SEED"
NVCC_TIMEOUT_S = 240  # one nvcc compile in a test: a stalled compiler fails that test, not the whole run


def on_backend(backend: str, *values, marks=(), id=None):
    """One parameter set that runs on ``backend`` (and ``values``): cuda sets carry the ``gpu`` mark, so they
    run where a GPU is visible and are skipped elsewhere. The one cpu/cuda parametrisation of the suite."""
    marks = list(marks) if isinstance(marks, list | tuple) else [marks]
    if backend == "cuda":
        marks.append(pytest.mark.gpu)
    return pytest.param(backend, *values, marks=marks, id=id)


BACKENDS = [on_backend("cpu"), on_backend("cuda")]  # @pytest.mark.parametrize("backend", BACKENDS)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie still answers kill(0): its state says otherwise)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def seed(request) -> int:
    """This test's random seed: CIRCUSLINK_TEST_SEED if set, else fresh; reported on failure."""
    raw = os.environ.get(SEED_ENV)
    value = int(raw) if raw else int(np.random.SeedSequence().entropy % (1 << 31))
    request.node._circuslink_seed = value
    return value


@pytest.fixture
def rng(seed) -> np.random.Generator:
    """A numpy Generator seeded with this test's ``seed``."""
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    value = getattr(item, "_circuslink_seed", None)
    if value is not None and report.failed:
        report.sections.append(
            ("random seed", f"seed {value}: replay with {SEED_ENV}={value} python -m pytest '{item.nodeid}'"))


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


# -- compiles started early -------------------------------------------------------------------------------
# A test module may define ``background_builds(root)``: its compile jobs, (name, function, args), with a scratch
# directory ``root``. In a run of several modules, every selected module's jobs are queued as soon as the tests
# are collected and run on one worker thread, so that a 2-core CI machine compiles while the mostly
# single-threaded tests before those modules run; a module's tests (builds_for) add a worker a core, queue the
# jobs if they were not, and wait for each result.
class Builds:
    def __init__(self) -> None:
        self.modules: dict[str, dict[str, Future]] = {}  # module -> job name -> its result
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._roots: list[Path] = []

    def add(self, module) -> None:
        root = Path(tempfile.mkdtemp(prefix="circuslink-test-builds-"))
        self._roots.append(root)
        futures = self.modules[module.__name__] = {}
        for name, fn, args in module.background_builds(root):
            future = futures[name] = Future()
            self._queue.put((future, fn, args))
        if not any(t.is_alive() for t in self._threads):
            self._add_workers(1)

    def _add_workers(self, n: int) -> None:
        for _ in range(n):
            thread = threading.Thread(target=self._work, name="circuslink-test-builds", daemon=True)
            thread.start()
            self._threads.append(thread)

    def use_every_core(self) -> None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._add_workers(max(0, cores - len([t for t in self._threads if t.is_alive()])))

    def _next(self) -> tuple | None:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def _work(self) -> None:
        while (job := self._next()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # the test that waits for it reports it
                future.set_exception(exc)

    def close(self) -> None:
        """Cancel what has not started, wait for the compilers running (no orphaned nvcc), remove the scratch."""
        while (job := self._next()) is not None:
            job[0].cancel()
        for thread in self._threads:
            thread.join()
        for root in self._roots:
            shutil.rmtree(root, ignore_errors=True)


_BUILDS = Builds()


def builds_for(module) -> dict[str, Future]:
    """Name -> the Future of test module ``module``'s background build of that name (queued now if the session did
    not queue it), with a worker for every core from now on."""
    if module.__name__ not in _BUILDS.modules:
        _BUILDS.add(module)
    _BUILDS.use_every_core()
    return _BUILDS.modules[module.__name__]


def pytest_collection_finish(session):
    # Early only where there is something to overlap with: a run of one module builds when its tests ask.
    if len({getattr(item, "module", None) for item in session.items}) < 2:
        return
    for item in session.items:
        module = getattr(item, "module", None)
        if (module is not None and hasattr(module, "background_builds") and module.__name__ not in _BUILDS.modules
                and not item.get_closest_marker("skip")
                and not any(m.args and m.args[0] for m in item.iter_markers("skipif"))):
            _BUILDS.add(module)


def pytest_sessionfinish(session, exitstatus):
    _BUILDS.close()


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


_RANK_TAG = re.compile(r"^\[(\d+)\] ", re.M)  # circuslink run: "[rank] " before every line
_OMPI_TAG = re.compile(r"\[\d+,(\d+)\]<stdout>:")  # mpirun --tag-output: before every chunk a rank wrote


class Job:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def rank_lines(self, rank: int) -> list[str]:
        """The lines ``rank`` wrote to stdout, whole, found by their rank tags (``circuslink run``'s ``[r]``, or
        mpirun's ``--tag-output`` chunks, joined per rank): never lines that two ranks' output interleaved."""
        text = self.stdout
        if _OMPI_TAG.search(text):
            parts = _OMPI_TAG.split(text)  # [before, rank, chunk, rank, chunk, ...]
            mine = "".join(chunk for r, chunk in zip(parts[1::2], parts[2::2], strict=True) if int(r) == rank)
            return mine.splitlines()
        return [line[m.end():] for line in text.splitlines()
                if (m := _RANK_TAG.match(line)) and int(m.group(1)) == rank]

    def check(self) -> Job:
        assert self.returncode == 0, f"job failed (rc={self.returncode}):\n{self.output}"
        return self


@pytest.fixture
def spmd(tmp_path, request):
    def run(n: int, code: str, backend: str = "cpu", timeout: float = 180, env: dict | None = None,
            launcher: str = "circuslink", job_timeout: float | None = None, tag: bool = False) -> Job:
        script = tmp_path / f"job_{n}.py"
        script.write_text(textwrap.dedent(code))
        full_env = dict(os.environ)
        full_env.setdefault("CIRCUSLINK_TIMEOUT", "60")
        test_seed = getattr(request.node, "_circuslink_seed", None)
        if test_seed is None:  # the job draws its own inputs: give it a seed the report names
            raw = os.environ.get(SEED_ENV)
            test_seed = int(raw) if raw else int(np.random.SeedSequence().entropy % (1 << 31))
            request.node._circuslink_seed = test_seed
        full_env[SEED_ENV] = str(test_seed)
        full_env.update(env or {})
        if launcher == "circuslink":
            cmd = [sys.executable, "-m", "circuslink", "run", "-n", str(n), "--backend", backend, "--",
                   sys.executable, str(script)]
        elif launcher == "mpirun":
            # the library's own command line: it forwards CIRCUSLINK_*, CUDA_* (the MPS pipe) and the rest
            full_env["CIRCUSLINK_BACKEND"] = backend
            if backend == "cuda":  # ranks sharing the GPU under MPS, as `circuslink run` would give them
                full_env.setdefault(mps.ENV_SHARE, mps.rank_share(n, full_env))
            cmd = mpirun_command(n, [sys.executable, str(script)], full_env)
            if tag:  # every chunk a rank writes tagged with its rank (Job.rank_lines reads them)
                cmd.insert(1, "--tag-output")
        else:
            raise ValueError(launcher)
        return Job(run_job(cmd, env=full_env, cwd=str(tmp_path), timeout=_within_test_budget(request,
                                                                                          job_timeout or timeout)))

    return run


_STOP_GRACE_S = 15.0  # a launcher given SIGINT ends its ranks within its own grace (3 s) and cleans up


def _within_test_budget(request, seconds: float) -> float:
    """``seconds``, cut to end 10 s before this test's pytest-timeout: the job's own time-out then fires first,
    stopping the job cleanly and keeping its output, instead of pytest-timeout killing the launcher outright."""
    marker = request.node.get_closest_marker("timeout")
    limit = marker.args[0] if marker and marker.args else request.config.getoption("timeout", None) \
        or request.config.getini("timeout")
    try:
        limit = float(limit)
    except (TypeError, ValueError):
        return seconds
    return min(seconds, limit - 10) if limit > 20 else seconds


def run_job(cmd: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """Run a launcher (``circuslink run``, ``mpirun``) in its own session and always stop it cleanly.

    On a time-out, or anything else that ends the wait (pytest-timeout, Ctrl-C), the launcher gets SIGINT
    so that it ends its ranks itself, then its whole session gets SIGKILL after a grace period. Killing the
    launcher alone (what ``subprocess.run`` does) leaves ranks that die mid-kernel by PR_SET_PDEATHSIG; on a
    GPU under MPS such a death can take the MPS server down for the jobs that follow."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:
        _stop_session(proc)
        try:
            out, err = proc.communicate(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:  # a process outside the session holds the pipes: report without them
            out, err = "", "(no output: the job's pipes stayed open after it was stopped)"
        if isinstance(exc, subprocess.TimeoutExpired):
            pytest.fail(f"job timed out after {timeout:g} s and was stopped: {' '.join(cmd[:6])} ...\n"
                        f"{out}{err}", pytrace=False)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _stop_session(proc: subprocess.Popen) -> None:
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
