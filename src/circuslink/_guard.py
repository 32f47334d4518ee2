"""A job's guard: cleans up after a launcher that died without cleaning up itself.

``circuslink run`` and ``circuslink mps`` start one guard per job, in its own session, with a
pipe from the launcher on its standard input. The launcher tells it what the job holds (the
ranks' process groups or pids, a private MPS daemon's directory) and says ``done`` when it has
cleaned up itself. If the pipe closes without ``done`` (the launcher was killed, even with
SIGKILL, which no handler can catch), the guard ends the ranks, removes the shared memory files
they left (those matching the job's pattern in /dev/shm), quits the MPS daemon and removes its
directory. So nothing outlives a job: no orphaned rank, no MPS daemon, no temporary files.

The same file, run as ``_guard.py --exec CMD...``, is how each rank starts: it asks the kernel
to kill it when its parent (the launcher) dies (``PR_SET_PDEATHSIG``) and then becomes CMD. Under
mpirun it first gives the rank torchrun's names for its place (``RANK``, ``WORLD_SIZE``...), from the
MPI launcher's own, as ``circuslink run`` gives them to the ranks it starts itself.

This file imports the standard library only: it runs as ``python -I -S _guard.py`` so that it
starts in milliseconds.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

_TERM_GRACE_S = 2.0
_PR_SET_PDEATHSIG = 1


class Guard:
    """The launcher's side: start the guard process, tell it what to clean, release it when done."""

    def __init__(self, session=None, shm_pattern: str | None = None) -> None:
        config = {}
        if session is not None and getattr(session, "job_dir", None):
            config = {"mps_binary": session.binary, "mps_job_dir": session.job_dir}
        if shm_pattern:
            config["shm_pattern"] = shm_pattern
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "--guard", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True)

    def _say(self, line: str) -> None:
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def watch(self, pid: int, group: bool = False) -> None:
        """Kill this process (``group``: its whole process group) if the launcher dies."""
        self._say(f"{'pgid' if group else 'pid'} {int(pid)}")

    def close(self) -> None:
        """The launcher cleaned up itself: the guard exits doing nothing."""
        if self._proc.poll() is None:
            self._say("done")
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def exec_command() -> list[str]:
    """The prefix that starts a rank under a parent-death signal: ``[python, -I, -S, _guard.py, --exec]``."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), "--exec"]


def _alive(pid: int, group: bool) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _end(targets: list[tuple[int, bool]]) -> None:
    for pid, group in targets:
        try:
            (os.killpg if group else os.kill)(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + _TERM_GRACE_S
    while time.monotonic() < deadline and any(_alive(p, g) for p, g in targets):
        time.sleep(0.05)
    for pid, group in targets:
        try:
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_mps(binary: str, job_dir: str) -> None:
    pipe = os.path.join(job_dir, "pipe")
    if os.path.exists(os.path.join(pipe, "control")):
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe)
        try:
            subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True, timeout=15)
        except (subprocess.TimeoutExpired, OSError):
            pass
        deadline = time.monotonic() + 15
        while os.path.exists(os.path.join(pipe, "control")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the daemon removes its pipe when it has quit
    shutil.rmtree(job_dir, ignore_errors=True)


def _guard_main(config_json: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the job is the launcher's to handle
    config = json.loads(config_json)
    targets: list[tuple[int, bool]] = []
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "done":
            return 0
        if word in ("pid", "pgid") and arg.isdigit():
            targets.append((int(arg), word == "pgid"))
    # The pipe closed without "done": the launcher died. Clean up after it.
    _end(targets)
    for path in glob.glob(config["shm_pattern"]) if config.get("shm_pattern") else ():
        try:
            os.unlink(path)
        except OSError:
            pass
    if config.get("mps_job_dir"):
        _stop_mps(config.get("mps_binary") or "nvidia-cuda-mps-control", config["mps_job_dir"])
    return 0


# torchrun's names for a rank's place, and an MPI launcher's for the same: Open MPI's, then MPICH's (Hydra).
_TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_MPI_NAMES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"))


def _torchrun_names(env) -> None:
    """Set torchrun's names in ``env`` from the MPI launcher's that started this rank (those already set stay)."""
    for names in _MPI_NAMES:
        if names[0] in env:
            for torchrun, mpi in zip(_TORCHRUN_NAMES, names, strict=True):
                if mpi in env:
                    env.setdefault(torchrun, env[mpi])
            return


def _exec_main(command: list[str]) -> int:
    _torchrun_names(os.environ)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # If the launcher died between our fork and the prctl, nobody would send the signal.
            launcher = os.environ.get("CIRCUSLINK_LAUNCHER_PID", "")
            if launcher.isdigit() and os.getppid() != int(launcher):
                return 1
        except (OSError, AttributeError):
            pass
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"circuslink run: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--guard":
        raise SystemExit(_guard_main(sys.argv[2]))
    if len(sys.argv) >= 3 and sys.argv[1] == "--exec":
        raise SystemExit(_exec_main(sys.argv[2:]))
    print("usage: _guard.py --guard CONFIG_JSON | --exec CMD ...", file=sys.stderr)
    raise SystemExit(2)
