"""NVSHMEM put-with-signal pingpong: build ``nvshmem_pingpong.cu`` with nvcc and run it under mpirun.

Build (the image's NVSHMEM wheel), NV = the ``nvidia/nvshmem`` folder of site-packages (or
``NVSHMEM_HOME``)::

    nvcc -std=c++17 -rdc=true -arch=sm_90a -O2 -I$NV/include $(mpicc --showme:compile) \\
        nvshmem_pingpong.cu -o BIN -L$NV/lib -l:libnvshmem_host.so.3 -lnvshmem_device \\
        $(mpicc --showme:link) -Xlinker -rpath=$NV/lib

Run::

    LD_LIBRARY_PATH=$NV/lib NVSHMEM_BOOTSTRAP=MPI NVSHMEM_DISABLE_NVLS=1 \\
        mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH -x NVSHMEM_BOOTSTRAP ... BIN sizes=...

The binary is cached in the build folder under a name that hashes the source and the command,
so a second call (or a second benchmark) does not rebuild it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..._wait import Deadline
from ...errors import BackendError, CompileError, ConfigError, TimeoutError
from ._common import MULTICAST_OFF, check_counts, check_sizes, fresh_seed

SOURCE = Path(__file__).with_name("nvshmem_pingpong.cu")
_ARCH = "sm_90a"
_COMPILE_TIMEOUT_S = 600.0
_HEAP_SLACK = 64 << 20  # NVSHMEM's own allocations next to our two buffers
# What identifies an enclosing job's rank to Open MPI / PMIx: a nested mpirun must not inherit it.
# Other OMPI_MCA_* settings (the machine's MPI configuration, e.g. plm_rsh_agent) are kept.
_ENV_OF_ENCLOSING_JOB = (
    "OMPI_COMM_WORLD_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir", "OMPI_UNIVERSE_",
    "OMPI_APP_CTX_", "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_ARGV", "OMPI_FILE_LOCATION", "OMPI_COMMAND",
    "PMIX_", "PMI_", "CIRCUSLINK_RANK", "CIRCUSLINK_STORE",
)


def _nvidia_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def find_nvshmem() -> Path:
    """NVSHMEM's folder (with ``include/nvshmem.h`` and ``lib``): ``NVSHMEM_HOME`` or the pip package."""
    candidates = []
    if os.environ.get("NVSHMEM_HOME"):
        candidates.append(Path(os.environ["NVSHMEM_HOME"]))
    candidates += [d / "nvshmem" for d in _nvidia_dirs()]
    for c in candidates:
        if (c / "include" / "nvshmem.h").is_file() and (c / "lib").is_dir():
            return c
    looked = ", ".join(str(c) for c in candidates) or "no nvidia/ package folder found"
    raise BackendError(f"NVSHMEM not found (looked in {looked}): pip install nvidia-nvshmem-cu13 or set NVSHMEM_HOME")


def _nvshmem_link_args(nv: Path) -> list[str]:
    """Link flags for the host library (a versioned .so in the pip wheel) and the static device library."""
    lib = nv / "lib"
    if (lib / "libnvshmem_host.so").exists():
        host = ["-lnvshmem_host"]
    else:
        versioned = sorted(p.name for p in lib.glob("libnvshmem_host.so.*"))
        if not versioned:
            raise BackendError(f"NVSHMEM host library libnvshmem_host.so* not found in {lib}")
        host = [f"-l:{versioned[0]}"]
    if not (lib / "libnvshmem_device.a").exists():
        raise BackendError(f"NVSHMEM device library libnvshmem_device.a not found in {lib}")
    return ["-L", str(lib), *host, "-lnvshmem_device", "-Xlinker", f"-rpath={lib}"]


def _find_nvcc() -> str:
    explicit = os.environ.get("NVCC")
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise BackendError(f"NVCC={explicit!r} is not an executable file")
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise BackendError("nvcc not found (set NVCC, put it on PATH, or install the CUDA toolkit)")


_MPI_GUESSES = ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/aarch64-linux-gnu/openmpi", "/usr/local",
                "/opt/openmpi", "/usr/lib64/openmpi", "/usr")


def _mpi_flags() -> tuple[list[str], list[str]]:
    """MPI's compile and link flags: ``mpicc --showme:compile`` / ``--showme:link`` (Open MPI).

    Without mpicc (an image with the MPI runtime and headers but no compiler wrapper), ``MPI_HOME``
    or a few usual prefixes are searched for ``include/mpi.h`` and ``lib/libmpi.so``.
    """
    mpicc = shutil.which("mpicc")
    if mpicc is None:
        return _mpi_flags_from_prefix()
    flags = []
    for what in ("compile", "link"):
        try:
            out = subprocess.run([mpicc, f"--showme:{what}"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendError(f"mpicc --showme:{what} failed: {exc}") from None
        if out.returncode != 0:
            raise BackendError(f"mpicc --showme:{what} failed (is this Open MPI?): {out.stderr.strip()}")
        flags.append(out.stdout.split())
    # nvcc does not understand gcc's -Wl,/-pthread spellings: keep only -I, -L, -l.
    compile_flags = [f for f in flags[0] if f.startswith("-I")]
    link_flags = [f for f in flags[1] if f.startswith(("-L", "-l"))]
    if not any(f.startswith("-lmpi") for f in link_flags):
        link_flags.append("-lmpi")
    return compile_flags, link_flags


def _mpi_flags_from_prefix() -> tuple[list[str], list[str]]:
    prefixes = ([os.environ["MPI_HOME"]] if os.environ.get("MPI_HOME") else []) + list(_MPI_GUESSES)
    for prefix in map(Path, prefixes):
        includes = [d for d in (prefix / "include", prefix / "include" / "openmpi") if d.is_dir()]
        libs = [d for d in (prefix / "lib", prefix / "lib64") if any(d.glob("libmpi.so*"))]
        if (prefix / "include" / "mpi.h").is_file() and libs:
            return [f"-I{d}" for d in includes], [f"-L{libs[0]}", "-lmpi"]
    raise BackendError(
        "neither mpicc nor MPI's mpi.h + libmpi.so were found (set MPI_HOME): the NVSHMEM baseline "
        "links against MPI for its bootstrap"
    )


def _default_build_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "circuslink" / "baselines"


def build_command(output: Path) -> list[str]:
    """The nvcc command that builds the baseline into ``output``."""
    nv = find_nvshmem()
    mpi_compile, mpi_link = _mpi_flags()
    return [
        _find_nvcc(), "-std=c++17", "-rdc=true", f"-arch={_ARCH}", "-O2",
        f"-I{nv / 'include'}", *mpi_compile,
        str(SOURCE), "-o", str(output),
        *_nvshmem_link_args(nv), *mpi_link,
    ]


def build_nvshmem_pingpong(build_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Build the NVSHMEM pingpong (cached by source and command); return the binary's path."""
    folder = Path(build_dir) if build_dir else _default_build_dir()
    probe_cmd = build_command(folder / "BIN")
    digest = hashlib.sha256(SOURCE.read_bytes() + "\0".join(probe_cmd).encode()).hexdigest()[:16]
    binary = folder / f"nvshmem_pingpong-{digest}"
    if binary.is_file() and not force:
        return binary
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendError(f"cannot create the build folder {str(folder)!r}: {exc.strerror or exc}") from None
    # Build into a temporary name and rename, so a concurrent caller never runs half a binary.
    fd, tmp_name = tempfile.mkstemp(prefix=".nvshmem_pingpong-", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = build_command(tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise CompileError(f"nvcc did not finish building {SOURCE.name} within {_COMPILE_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        log = (proc.stderr or proc.stdout).strip()
        raise CompileError(f"nvcc failed to build {SOURCE.name} (command: {' '.join(cmd)}):\n{log}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, binary)
    return binary


def _job_env(nv: Path, max_bytes: int) -> dict[str, str]:
    # A rank of an enclosing mpirun job must not pass its identity on: the nested mpirun would
    # think it is a singleton of that job.
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_OF_ENCLOSING_JOB)}
    env.update(MULTICAST_OFF)
    lib = str(nv / "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["NVSHMEM_BOOTSTRAP"] = "MPI"
    heap = 2 * max_bytes + _HEAP_SLACK
    env.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(max(heap, 1 << 30)))
    return env


def mpirun_command(binary: Path, args: Sequence[str], env: dict[str, str]) -> list[str]:
    """``mpirun --allow-run-as-root -np 2 -x VAR ... BINARY ARGS`` for the two PEs."""
    mpirun = shutil.which("mpirun", path=env.get("PATH"))
    if mpirun is None:
        raise BackendError("mpirun not found: the NVSHMEM baseline runs its 2 PEs under Open MPI's mpirun")
    exported = ["LD_LIBRARY_PATH", "NVSHMEM_BOOTSTRAP", "NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE",
                "NVSHMEM_SYMMETRIC_SIZE"]
    exported += [k for k in ("CUDA_VISIBLE_DEVICES", "NVSHMEM_DEBUG") if k in env]
    cmd = [mpirun, "--allow-run-as-root", "-np", "2"]
    for name in exported:
        cmd += ["-x", name]
    return [*cmd, str(binary), *args]


def parse_output(stdout: str) -> tuple[dict, list[dict]]:
    """({info}, [rows]) from the program's JSON lines; other lines (NVSHMEM's banners) are ignored."""
    info: dict = {}
    rows: list[dict] = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a banner that happens to start with a brace
        if "info" in obj:
            info = obj["info"]
        elif "impl" in obj and "bytes" in obj:
            rows.append(obj)
    return info, rows


def nvshmem_pingpong(
    sizes: Iterable[int],
    iters: int,
    warmup: int,
    out_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
    thread_max: int | None = None,
    modes: Sequence[str] = ("thread", "warp", "block"),
    samples: int = 10,
    messages: int = 16,
    bytes_per_sample: int = 1 << 30,
) -> list[dict]:
    """Run the NVSHMEM put-with-signal pingpong on 2 PEs; called from ONE process, not collectively.

    ``out_dir``: where the binary is built and cached (default ``~/.cache/circuslink/baselines``),
    and where the last run's full output is kept (``nvshmem_pingpong.log``).
    Rows: ``{"impl": "nvshmem-put-signal"`` (one thread, ``nvshmem_putmem_signal_nbi``, sizes up
    to ``thread_max``, default every size), ``"nvshmem-put-signal-warp"`` (one warp,
    ``nvshmemx_putmem_signal_warp``), ``"nvshmem-put-signal-block"`` (one block per 64 KiB chunk up to one
    per SM, ``nvshmemx_putmem_signal_block``) or ``"nvshmem-put-block-stream"`` (mode ``stream``: the block
    put streaming ``messages`` messages a round, one_way_us per message), ``"bytes", "one_way_us",
    "min_one_way_us", "throughput_GBps", "max_throughput_GBps", "iters", "samples", "blocks", "threads",
    "verified"}``: the median and the fastest of ``samples`` launches, each timed on the device
    (``%globaltimer``); a launch moves at most ``bytes_per_sample`` bytes one way (at least one round).
    Raises BackendError when nvcc, NVSHMEM, mpicc or mpirun are missing or the run fails, and
    TimeoutError when it runs past ``timeout`` (default CIRCUSLINK_TIMEOUT).
    """
    sizes = check_sizes(sizes, "nvshmem_pingpong")
    check_counts(iters, warmup, "nvshmem_pingpong")
    unknown = [m for m in modes if m not in ("thread", "warp", "block", "stream")]
    if unknown or not modes:
        raise ConfigError(f"nvshmem_pingpong: modes must be some of 'thread', 'warp', 'block', 'stream', got "
                          f"{list(modes)!r}")
    if thread_max is None:
        thread_max = max(sizes)
    nv = find_nvshmem()
    binary = build_nvshmem_pingpong(out_dir)
    env = _job_env(nv, max(sizes))
    args = [f"sizes={','.join(map(str, sizes))}", f"iters={iters}", f"warmup={warmup}", f"samples={samples}",
            f"messages={messages}", f"bytes_per_sample={bytes_per_sample}", f"seed={fresh_seed()}",
            f"thread_max={thread_max}", f"modes={','.join(modes)}"]
    cmd = mpirun_command(binary, args, env)
    deadline = Deadline.after(timeout)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        # Not a poll: communicate() drains both pipes while it waits (a full pipe would stall the child).
        stdout, stderr = proc.communicate(timeout=deadline.remaining())
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        _, done = parse_output(stdout or "")
        last = f"{done[-1]['impl']} {done[-1]['bytes']} B" if done else "nothing"
        raise TimeoutError(
            f"nvshmem_pingpong (2 PEs under mpirun) did not finish within {deadline.limit:g} s; last finished: {last}"
            f"{_tail(stderr)}"
        ) from None
    _save_log(binary.parent, cmd, stdout, stderr)
    if proc.returncode != 0:
        raise BackendError(f"nvshmem_pingpong failed (exit code {proc.returncode}){_tail(stderr, stdout)}"
                           f" (full output in {binary.parent / 'nvshmem_pingpong.log'})")
    info, rows = parse_output(stdout)
    if not rows:
        raise BackendError(f"nvshmem_pingpong printed no results{_tail(stderr, stdout)}")
    for row in rows:
        if info.get("nvshmem_header_version"):
            row["nvshmem_version"] = info["nvshmem_header_version"]
    return rows


def _save_log(folder: Path, cmd: Sequence[str], stdout: str, stderr: str) -> None:
    """Keep the last run's full output next to the binary (NVSHMEM's warnings explain odd figures)."""
    try:
        (folder / "nvshmem_pingpong.log").write_text(
            "$ " + " ".join(cmd) + "\n--- stdout\n" + (stdout or "") + "--- stderr\n" + (stderr or "")
        )
    except OSError:
        pass  # the log is a convenience; the result or the error already reached the caller


def _tail(*texts: str | None, lines: int = 8) -> str:
    """The program's own error lines if any, else the last lines of its output."""
    all_lines = [ln for t in texts if t for ln in t.strip().splitlines()]
    ours = [ln for ln in all_lines if ln.startswith("nvshmem_pingpong:")]
    chosen = ours or all_lines[-lines:]
    return (": " + " | ".join(chosen[:lines])) if chosen else ""


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue
