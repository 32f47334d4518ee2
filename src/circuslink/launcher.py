"""``circuslink run``: start N ranks on this machine and watch them.

The launcher hosts the rendezvous store, gives each rank its identity in the
environment (``CIRCUSLINK_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_STORE``...), prefixes
every output line with the rank that wrote it, and when one rank fails (non-zero exit
or a signal) ends the others and exits non-zero naming it. It also records every exit
in the store, so ranks blocked in a collective on a dead peer fail at once with its name
instead of waiting for their time-out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from . import _store
from .backends import BACKENDS, cuda_device_count, default_backend_name
from .errors import ConfigError

_GRACE_S = 3.0  # between SIGTERM and SIGKILL when ending the other ranks


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen) -> None:
        self.rank = rank
        self.proc = proc
        self.threads: list[threading.Thread] = []


def _pump(stream, sink, tag: str, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        with lock:
            sink.write(tag + line if line.endswith("\n") else tag + line + "\n")
            sink.flush()
    stream.close()


def launch(
    nranks: int,
    command: Sequence[str],
    backend: str | None = None,
    tag_output: str = "all",
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run ``command`` as ``nranks`` ranks; return the job's exit code (0 when every rank succeeded).

    ``tag_output``: "all" prefixes every line with ``[rank]``; "others" leaves rank 0's
    lines bare (used when a circuslink command launches itself and rank 0 prints the report).
    """
    if not isinstance(nranks, int) or nranks < 1:
        raise ConfigError(f"-n must be a positive number of ranks, got {nranks!r}")
    if not command:
        raise ConfigError("no command to run: give it after '--', e.g. circuslink run -n 2 -- python app.py")
    backend = (backend or os.environ.get("CIRCUSLINK_BACKEND") or "auto").lower()
    if backend == "auto":
        backend = default_backend_name()
    if backend not in BACKENDS:
        raise ConfigError(f"unknown back-end {backend!r}: choose one of {', '.join(BACKENDS)}")
    command = list(command)
    if command[0].endswith(".py"):
        command = [sys.executable, *command]

    store = _store.StoreServer()
    job_id = _store.new_job_id()
    base_env = dict(os.environ)
    base_env.update(extra_env or {})
    base_env.update(
        CIRCUSLINK_SIZE=str(nranks),
        CIRCUSLINK_LOCAL_SIZE=str(nranks),
        CIRCUSLINK_STORE=store.address,
        CIRCUSLINK_STORE_TOKEN=store.token,
        CIRCUSLINK_JOB_ID=job_id,
        CIRCUSLINK_BACKEND=backend,
        PYTHONUNBUFFERED="1",
    )
    if backend == "cuda":
        gpus = cuda_device_count()
    lock = threading.Lock()
    ranks: list[_Rank] = []
    interrupted = {"signal": None}

    def on_signal(signum, frame):  # forward Ctrl-C / SIGTERM to the whole job
        interrupted["signal"] = signum

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for r in range(nranks):
            env = dict(base_env, CIRCUSLINK_RANK=str(r), CIRCUSLINK_LOCAL_RANK=str(r))
            if backend == "cuda" and "CIRCUSLINK_DEVICE" not in (extra_env or {}):
                env["CIRCUSLINK_DEVICE"] = str(r % gpus)
            try:
                proc = subprocess.Popen(
                    command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
                )
            except OSError as exc:
                raise ConfigError(f"cannot start {command[0]!r}: {exc.strerror}") from None
            rank = _Rank(r, proc)
            tag = "" if (tag_output == "others" and r == 0) or tag_output == "none" else f"[{r}] "
            for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                t = threading.Thread(target=_pump, args=(stream, sink, tag, lock), daemon=True)
                t.start()
                rank.threads.append(t)
            ranks.append(rank)

        failed: tuple[int, int] | None = None
        running = {rk.rank: rk for rk in ranks}
        while running:
            if interrupted["signal"] is not None and failed is None:
                failed = (-1, -interrupted["signal"])
                _end(running.values())
            for r, rk in list(running.items()):
                code = rk.proc.poll()
                if code is None:
                    continue
                del running[r]
                store.set_local(_store.EXIT_PREFIX + str(r), _describe_exit(code).encode())
                if code != 0 and failed is None:
                    failed = (r, code)
                    _end(running.values())
            time.sleep(0.02)
        for rk in ranks:
            for t in rk.threads:
                t.join(timeout=5)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        store.close()

    if failed is None:
        return 0
    r, code = failed
    if r < 0:
        print(f"circuslink run: interrupted by {signal.Signals(-code).name}; ended all ranks", file=sys.stderr)
        return 130
    print(f"circuslink run: rank {r} {_describe_exit(code)}; ended the other ranks", file=sys.stderr)
    return code if code > 0 else 128 - code


def _end(ranks) -> None:
    """SIGTERM each rank's process group, then SIGKILL what is left after a grace period."""
    ranks = list(ranks)
    for rk in ranks:
        _signal_group(rk.proc, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for rk in ranks:
        try:
            rk.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(rk.proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def inside_job() -> bool:
    """True when this process is already a rank (of circuslink run or mpirun)."""
    env = os.environ
    return any(k in env for k in ("CIRCUSLINK_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"))


def mpirun_available() -> bool:
    """mpirun on PATH and mpi4py importable: what the MPI baselines and back-ends need."""
    import importlib.util
    import shutil

    return shutil.which("mpirun") is not None and importlib.util.find_spec("mpi4py") is not None


_FORWARDED = (
    "CIRCUSLINK_", "NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "PYTHON", "CUDA_", "OMP_", "PATH", "LD_LIBRARY_PATH",
)


def mpirun_command(nranks: int, command: Sequence[str]) -> list[str]:
    """``mpirun`` for ``nranks`` local ranks, forwarding circuslink's and the GPU libraries' settings."""
    cmd = ["mpirun", "-np", str(nranks), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in sorted(os.environ):
        if key.startswith(_FORWARDED):
            cmd += ["-x", key]
    return cmd + list(command)


def relaunch_self(nranks: int, argv: Sequence[str], backend: str | None, prefer_mpirun: bool = False) -> int:
    """Run ``python -m circuslink ARGV`` as ``nranks`` ranks (used by multi-rank CLI commands).

    With ``prefer_mpirun`` (benchmarks whose baselines need MPI) the ranks are started by
    mpirun when it and mpi4py are there; otherwise by :func:`launch`.
    """
    command = [sys.executable, "-m", "circuslink", *argv]
    if prefer_mpirun and mpirun_available():
        backend = (backend or os.environ.get("CIRCUSLINK_BACKEND") or "auto").lower()
        if backend == "auto":
            backend = default_backend_name()
        os.environ["CIRCUSLINK_BACKEND"] = backend
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        try:
            return subprocess.run(mpirun_command(nranks, command)).returncode
        except OSError as exc:
            raise ConfigError(f"cannot start mpirun: {exc.strerror}") from None
    return launch(nranks, command, backend=backend, tag_output="others")
