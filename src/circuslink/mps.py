"""CUDA MPS for ranks that share a GPU: find it, or start a private one for the job, and stop it.

Without MPS the GPU time-slices the CUDA contexts of processes that share it, so a kernel
spinning on a peer in another process waits for the next time slice (milliseconds one-way).
Under MPS the ranks' kernels run side by side and a store+poll between two of them takes a
fraction of a microsecond. So whenever ranks share a GPU, ``circuslink run`` (and every command
that relaunches itself) runs them under MPS:

* an MPS control daemon already answering on ``CUDA_MPS_PIPE_DIRECTORY`` (default
  ``/tmp/nvidia-mps``) is used as it is and left running;
* otherwise a private daemon is started for the job, with its pipe and log directories in a
  per-job temporary directory, and stopped when the job ends: normally, on a failed or killed
  rank, on Ctrl-C, and (through the job's guard process, ``_guard.py``) when the launcher itself
  is killed.

``--mps auto`` (default) falls back to time slicing with one warning when MPS cannot start;
``on`` makes that an error; ``off`` never uses MPS. Under ``mpirun``, ``circuslink mps -- mpirun -np 4 python
app.py`` does the same around the whole command.

Which SMs each rank runs on. MPS's cap (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks on its GPU``) limits
how many SMs a rank uses, not which: on an H200 (2026-11-29, ``scripts/dev/sm_placement.py``) two ranks capped
at 50 % both ran on SMs 0-65 and four at 25 % all on SMs 0-31, the rest of the GPU idle. With
``CIRCUSLINK_SM_PARTITION=auto`` (the FFT's commands' default; not yet the library's) each rank takes a disjoint
group of the GPU's SMs instead, a CUDA green context (``backends/_partition.py``), and the launcher leaves such
ranks uncapped (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100``: MPS honours a client's green context only then);
otherwise each gets the cap, the basis of the forward-progress rule (``World.sm_budget``). A share set before the
launch is kept as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .errors import BackendError, ConfigError

CONTROL = "nvidia-cuda-mps-control"
# Where the binary lives on machines whose PATH lacks the driver's folder (the device image).
_CONTROL_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
MODES = ("auto", "on", "off")
_ANSWER_TIMEOUT_S = 10.0  # a control daemon that does not answer get_server_list in this long is not there
_START_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 15.0
ENV_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_LOG = "CUDA_MPS_LOG_DIRECTORY"
ENV_SHARE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_ACTIVE = "CIRCUSLINK_MPS"  # set for the ranks: the pipe directory of the MPS they run under
ENV_GPUS = "CIRCUSLINK_GPU_COUNT"  # set by `circuslink mps`: ranks under mpirun compute their share from it


def control_binary() -> str | None:
    """Path of nvidia-cuda-mps-control, or None when this machine has none."""
    found = shutil.which(CONTROL)
    if found:
        return found
    for d in _CONTROL_DIRS:
        path = os.path.join(d, CONTROL)
        if os.access(path, os.X_OK):
            return path
    return None


def _control(binary: str, pipe_dir: str, command: str, timeout: float) -> subprocess.CompletedProcess | None:
    """Send one command to the control daemon on ``pipe_dir``; None when it does not answer."""
    env = dict(os.environ, **{ENV_PIPE: pipe_dir})
    try:
        return subprocess.run([binary], input=command + "\n", env=env, capture_output=True, text=True,
                              timeout=timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None


def answering(pipe_dir: str, binary: str | None = None) -> bool:
    """True when an MPS control daemon answers on ``pipe_dir``."""
    binary = binary or control_binary()
    if binary is None or not os.path.exists(os.path.join(pipe_dir, "control")):
        return False
    done = _control(binary, pipe_dir, "get_server_list", _ANSWER_TIMEOUT_S)
    return done is not None and done.returncode == 0


@dataclass
class Status:
    """Whether this process's CUDA work runs under MPS, and how that was arranged."""

    active: bool
    pipe_dir: str | None = None
    how: str = ""  # "started for this job", "already running", or why not

    def describe(self) -> str:
        if self.active:
            return f"MPS active ({self.how}; pipe directory {self.pipe_dir})"
        return f"MPS not active ({self.how})" if self.how else "MPS not active"


def status() -> Status:
    """The MPS situation of this process (for ``circuslink info`` and the probe)."""
    pipe = os.environ.get(ENV_ACTIVE) or os.environ.get(ENV_PIPE) or DEFAULT_PIPE_DIR
    binary = control_binary()
    if binary is None:
        return Status(False, None, f"{CONTROL} not found")
    if answering(pipe, binary):
        how = "started for this job" if os.environ.get(ENV_ACTIVE) == pipe else "already running"
        return Status(True, pipe, how)
    return Status(False, None, f"no control daemon answers on {pipe}")


@dataclass
class Session:
    """The MPS arrangement of one job: the environment its ranks need and what to undo at the end."""

    status: Status
    env: dict[str, str] = field(default_factory=dict)
    job_dir: str | None = None  # our private daemon's directory (None when we started nothing)
    binary: str | None = None
    warning: str | None = None

    @property
    def started(self) -> bool:
        return self.job_dir is not None

    def rank_env(self, ranks_on_my_gpu: int) -> dict[str, str]:
        """Environment for one rank: the pipe directory and its share of the GPU's SMs."""
        if not self.status.active:
            return {}
        env = dict(self.env)
        if ranks_on_my_gpu > 1 and ENV_SHARE not in os.environ:
            env[ENV_SHARE] = rank_share(ranks_on_my_gpu)
        return env

    def stop(self) -> None:
        """Stop the daemon this session started (nothing if it reused one). Idempotent."""
        if self.job_dir is None:
            return
        job_dir, self.job_dir = self.job_dir, None
        stop_private(self.binary or CONTROL, job_dir)


def share_percent(ranks_on_gpu: int) -> int:
    """Each of ``ranks_on_gpu`` ranks gets this percentage of the GPU's threads (at least 1)."""
    return max(1, 100 // max(1, ranks_on_gpu))


def rank_share(ranks_on_gpu: int, env: dict[str, str] | None = None) -> str:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for each of ``ranks_on_gpu`` ranks sharing a GPU: 100 where each takes
    SMs of its own through a green context (MPS honours one only uncapped; ``backends/_partition.py``), else
    ``100 / ranks_on_gpu``."""
    from .backends import _partition

    return "100" if _partition.wanted(ranks_on_gpu, env) else str(share_percent(ranks_on_gpu))


def start(mode: str, needed: bool, label: str = "job") -> Session:
    """Arrange MPS for a job whose ranks share a GPU when ``needed``.

    mode ``off`` or not needed: nothing. ``auto``: reuse a running daemon or start a private one;
    if neither works, a Session without MPS and a warning. ``on``: the same, but failing raises
    :class:`~circuslink.BackendError` naming why.
    """
    if mode not in MODES:
        raise ConfigError(f"--mps {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        return Session(Status(False, None, "--mps off"))
    if not needed:
        return Session(Status(False, None, "no two ranks share a GPU"))
    binary = control_binary()
    why = None
    if binary is None:
        why = f"{CONTROL} was not found (on PATH or in {', '.join(_CONTROL_DIRS)})"
    else:
        existing = os.environ.get(ENV_ACTIVE) or os.environ.get(ENV_PIPE) or DEFAULT_PIPE_DIR
        if answering(existing, binary):
            env = {ENV_PIPE: existing, ENV_ACTIVE: existing}
            if os.environ.get(ENV_LOG):
                env[ENV_LOG] = os.environ[ENV_LOG]
            return Session(Status(True, existing, "already running"), env, None, binary)
        try:
            job_dir = start_private(binary, label)
        except BackendError as exc:
            why = str(exc)
        else:
            pipe, log = os.path.join(job_dir, "pipe"), os.path.join(job_dir, "log")
            env = {ENV_PIPE: pipe, ENV_LOG: log, ENV_ACTIVE: pipe}
            return Session(Status(True, pipe, "started for this job"), env, job_dir, binary)
    if mode == "on":
        raise BackendError(f"--mps on: cannot use CUDA MPS: {why}")
    warning = (f"ranks share a GPU but CUDA MPS is unavailable ({why}); they will run time-sliced, so "
               "their waits on each other take milliseconds (--mps off silences this)")
    return Session(Status(False, None, why or ""), warning=warning)


def start_private(binary: str, label: str) -> str:
    """Start a control daemon with its pipe and log directories under a new temporary directory."""
    job_dir = tempfile.mkdtemp(prefix=f"circuslink-mps-{label}-")
    pipe, log = os.path.join(job_dir, "pipe"), os.path.join(job_dir, "log")
    os.makedirs(pipe)
    os.makedirs(log)
    env = dict(os.environ, **{ENV_PIPE: pipe, ENV_LOG: log})
    try:
        done = subprocess.run([binary, "-d"], env=env, capture_output=True, text=True, timeout=_START_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError) as exc:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise BackendError(f"{CONTROL} -d did not start: {exc}") from None
    if done.returncode != 0:
        shutil.rmtree(job_dir, ignore_errors=True)
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise BackendError(f"{CONTROL} -d exited with code {done.returncode}"
                           + (f": {detail[-1]}" if detail else ""))
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not answering(pipe, binary):
        if time.monotonic() > deadline:
            stop_private(binary, job_dir)
            raise BackendError(f"the MPS control daemon started in {job_dir} did not answer within "
                               f"{_START_TIMEOUT_S:g} s (see {log}/control.log)")
        time.sleep(0.05)
    return job_dir


def stop_private(binary: str, job_dir: str) -> None:
    """Quit the daemon of ``job_dir`` (and its server), wait until it is gone, remove the directory."""
    pipe = os.path.join(job_dir, "pipe")
    if os.path.exists(os.path.join(pipe, "control")):
        _control(binary, pipe, "quit", _STOP_TIMEOUT_S)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while answering(pipe, binary) and time.monotonic() < deadline:
            time.sleep(0.05)
    shutil.rmtree(job_dir, ignore_errors=True)


def _nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi") or next(
        (os.path.join(d, "nvidia-smi") for d in _CONTROL_DIRS if os.access(os.path.join(d, "nvidia-smi"), os.X_OK)),
        None)


def _visible(count: int) -> list[int]:
    """The physical indices of the GPUs this job sees, of ``count`` on the machine (CUDA_VISIBLE_DEVICES applied;
    entries that are not indices, such as UUIDs, count as the first GPUs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    entries = [v.strip() for v in visible.split(",") if v.strip() != ""]
    if all(e.isdigit() for e in entries):
        return [int(e) for e in entries if int(e) < count]
    return list(range(min(count, len(entries))))


def gpu_count() -> int:
    """GPUs visible to this job, counted without initialising CUDA in this process.

    The launcher must not become a CUDA client itself (it would take an MPS client slot and a
    context on every GPU), so it asks nvidia-smi and applies CUDA_VISIBLE_DEVICES."""
    smi = _nvidia_smi()
    count = 0
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (subprocess.TimeoutExpired, OSError):
            count = 0
    if count == 0:
        from .backends import cuda_device_count  # last resort: asks CUDA (no context is created)

        return cuda_device_count()
    return len(_visible(count))


def gpu_memory_free() -> list[int] | None:
    """Free memory of each GPU this job sees, in bytes (nvidia-smi, no CUDA context); None when unknown."""
    smi = _nvidia_smi()
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30)
        free = [int(float(line.strip())) << 20 for line in out.stdout.splitlines() if line.strip()]
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return None
    if out.returncode != 0 or not free:
        return None
    return [free[i] for i in _visible(len(free))]


def require_gpu_memory(per_gpu: dict[int, int], what: str, advice: str) -> None:
    """Refuse, in one line, work that needs more memory on a GPU than it has free: ``per_gpu`` maps a visible
    GPU to the bytes the job needs there. Nothing is refused where nvidia-smi cannot say (the ranks' own
    allocations then fail with CUDA's error, naming the rank)."""
    free = gpu_memory_free()
    if free is None:
        return
    for gpu, need in sorted(per_gpu.items()):
        if gpu < len(free) and need > free[gpu]:
            raise ConfigError(f"{what} needs about {need / (1 << 30):.1f} GiB on GPU {gpu}, more than its "
                              f"{free[gpu] / (1 << 30):.1f} GiB free (nvidia-smi): {advice}")


def add_arguments(p) -> None:
    p.add_argument("--mps", choices=MODES, default="auto",
                   help="run ranks that share a GPU under CUDA MPS: auto (default: reuse or start one, "
                        "else warn and time-slice), on (fail without MPS), off")
    p.add_argument("command", nargs="...", metavar="-- CMD ...",
                   help="the command to run under MPS, e.g. mpirun -np 4 python app.py")


def run(args) -> int:
    """``circuslink mps -- CMD ...``: run CMD (e.g. an mpirun job) with MPS arranged around it."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no command to run: give it after '--', e.g. circuslink mps -- mpirun -np 4 python app.py")
    from . import _guard

    if args.mps != "off" and gpu_count() == 0:
        if args.mps == "on":
            raise BackendError("--mps on: no GPU is visible on this machine, so there is no MPS to run the command "
                               "under (--mps auto runs it as it is)")
        session = start("off", needed=False)  # nothing shares a GPU that is not there: run it as it is
    else:
        session = start(args.mps, needed=True, label="mps")
    if session.warning:
        print(f"circuslink mps: warning: {session.warning}", file=sys.stderr)
    guard = _guard.Guard(session)
    try:
        env = dict(os.environ, **session.env)
        if session.status.active:
            env[ENV_GPUS] = str(gpu_count())
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        try:
            proc = subprocess.Popen(command, env=env, start_new_session=False)
        except OSError as exc:
            raise ConfigError(f"cannot start {command[0]!r}: {exc.strerror}") from None
        guard.watch(proc.pid)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
            print("circuslink mps: interrupted; stopped the command", file=sys.stderr)
            return 130
    finally:
        session.stop()
        guard.close()
