"""NVSHMEM baselines: build a CUDA program with nvcc and run it under mpirun. ``nvshmem_pingpong.cu`` (put-with-signal
pingpong, 2 PEs), ``nvshmem_stencil.cu`` (the 2-D Jacobi stencil of examples/stencil with NVSHMEM halos, N PEs),
``nvshmem_allreduce.cu`` (float32 sum reductions, N PEs) and ``nvshmem_rma_chain.cu`` (put-with-signal chains in a
ring of N PEs, the exchange of ``bench rma``).

Build (the image's NVSHMEM wheel, found by the one toolchain of ``circuslink.transport._build``), NV = the
``nvidia/nvshmem`` folder of site-packages (or ``NVSHMEM_HOME``)::

    nvcc -std=c++17 -rdc=true -arch=sm_90a -O2 -I$NV/include $(mpicc --showme:compile) \\
        nvshmem_pingpong.cu -o BIN -L$NV/lib -l:libnvshmem_host.so.3 -lnvshmem_device \\
        $(mpicc --showme:link) -Xlinker -rpath=$NV/lib

Run::

    LD_LIBRARY_PATH=$NV/lib NVSHMEM_BOOTSTRAP=MPI NVSHMEM_DISABLE_NVLS=1 \\
        mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH -x NVSHMEM_BOOTSTRAP ... BIN sizes=...

The binary is cached in the build folder under a name that hashes the source, the header every program shares
(``nvshmem_common.cuh``: errors, the global timer, the hash, arguments) and the command, so a second call (or a
second benchmark) does not rebuild it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..._wait import Deadline
from ...errors import BackendError, ConfigError, TimeoutError
from ...transport import _build
from ._common import MULTICAST_OFF, check_counts, check_sizes, fresh_seed

SOURCE = Path(__file__).with_name("nvshmem_pingpong.cu")
STENCIL_SOURCE = Path(__file__).with_name("nvshmem_stencil.cu")
ALLREDUCE_SOURCE = Path(__file__).with_name("nvshmem_allreduce.cu")
RMA_CHAIN_SOURCE = Path(__file__).with_name("nvshmem_rma_chain.cu")
COMMON = Path(__file__).with_name("nvshmem_common.cuh")  # every program includes it: its build hashes it too
_ARCH = "sm_90a"
_HEAP_SLACK = 64 << 20  # NVSHMEM's own allocations next to our two buffers
# What identifies an enclosing job's rank to Open MPI / PMIx: a nested mpirun must not inherit it.
# Other OMPI_MCA_* settings (the machine's MPI configuration, e.g. plm_rsh_agent) are kept.
_ENV_OF_ENCLOSING_JOB = (
    "OMPI_COMM_WORLD_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir", "OMPI_UNIVERSE_",
    "OMPI_APP_CTX_", "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_ARGV", "OMPI_FILE_LOCATION", "OMPI_COMMAND",
    "PMIX_", "PMI_", "CIRCUSLINK_RANK", "CIRCUSLINK_STORE",
)


def find_nvshmem() -> Path:
    """NVSHMEM's folder: the one toolchain's rule (``circuslink.transport._build``)."""
    return _build.find_nvshmem()


def build_command(output: Path, source: Path | None = None) -> list[str]:
    """The nvcc command that builds a baseline program (default the pingpong) into ``output``."""
    source = source or SOURCE
    nv = _build.find_nvshmem()
    mpi_compile, mpi_link = _build.mpi_flags()
    return [
        _build.find_nvcc(), "-std=c++17", "-rdc=true", f"-arch={_ARCH}", "-O2",
        f"-I{nv / 'include'}", *mpi_compile,
        str(source), "-o", str(output),
        *_build.nvshmem_link_args(nv), *mpi_link,
    ]


def _build_program(name: str, source: Path, build_dir: str | os.PathLike | None, force: bool = False) -> Path:
    """Build baseline program ``name`` from ``source`` (cached by source and command,
    ``~/.cache/circuslink/baselines`` unless ``build_dir``); return the binary's path."""
    return _build.build_cached("baselines", name, source, lambda out: build_command(out, source), suffix="",
                               what="nvcc", folder=Path(build_dir) if build_dir else None, force=force,
                               includes=[COMMON])


def build_nvshmem_pingpong(build_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Build the NVSHMEM pingpong (cached by source and command, ``~/.cache/circuslink/baselines`` unless
    ``build_dir``); return the binary's path."""
    return _build_program("nvshmem_pingpong", SOURCE, build_dir, force)


def build_nvshmem_stencil(build_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Build the NVSHMEM stencil (cached as :func:`build_nvshmem_pingpong` is); return the binary's path."""
    return _build_program("nvshmem_stencil", STENCIL_SOURCE, build_dir, force)


def build_nvshmem_rma_chain(build_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Build the NVSHMEM put-with-signal chains (cached as :func:`build_nvshmem_pingpong` is); the binary's path."""
    return _build_program("nvshmem_rma_chain", RMA_CHAIN_SOURCE, build_dir, force)


def nvshmem_rma_chains(
    npes: int,
    pairs: Sequence[tuple[int, int]],
    layouts: Sequence[str] = ("contiguous", "strided"),
    forms: Sequence[str] = ("thread", "grid"),
    iters: int = 200,
    warmup: int = 20,
    samples: int = 10,
    thread_max: int = 64 << 10,
    sample_bytes: int = 256 << 20,
    out_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
) -> list[dict]:
    """NVSHMEM put-with-signal chains in a ring of ``npes`` PEs (``nvshmem_rma_chain.cu``), the same exchange
    as ``bench rma``'s queues; called from ONE process, not collectively (the PEs share its GPU as the caller's
    ranks do). ``pairs``: (puts per chain, bytes per put). Rows ``{"impl": "nvshmem-put-signal-chain"`` (one
    thread puts the chain; chains up to ``thread_max`` bytes) or ``"nvshmem-put-signal-chain-grid"`` (blocks
    share every put), ``"layout", "chain", "bytes", "total_bytes", "neighbours", "time_us", "time_min_us",
    "throughput_GBps", "samples", "cycles_per_sample", "blocks", "verified"}``: start-to-wait per cycle, the
    median and the fastest of ``samples`` samples, each the slowest PE's; every received byte is checked.
    Raises BackendError when nvcc, NVSHMEM, mpicc or mpirun are missing or the run fails, TimeoutError past
    ``timeout`` (default CIRCUSLINK_TIMEOUT)."""
    check_counts(iters, warmup, "nvshmem_rma_chains")
    if not isinstance(npes, int) or npes < 2:
        raise ConfigError(f"nvshmem_rma_chains: npes must be at least 2 (a ring), got {npes!r}")
    bad = [p for p in pairs if len(p) != 2 or min(p) < 1]
    if bad or not pairs:
        raise ConfigError(f"nvshmem_rma_chains: pairs must be (chain, bytes) with both >= 1, got "
                          f"{list(bad or pairs)!r}")
    unknown = [x for x in (*layouts, *forms) if x not in ("contiguous", "strided", "thread", "grid")]
    if unknown or not layouts or not forms:
        raise ConfigError(f"nvshmem_rma_chains: layouts are contiguous / strided and forms thread / grid, got "
                          f"{list(layouts)!r} and {list(forms)!r}")
    nv = find_nvshmem()
    binary = build_nvshmem_rma_chain(out_dir)
    biggest = max(c * s for c, s in pairs)
    env = _job_env(nv, 4 * biggest)  # sources 2 x 2 regions, destinations 2 x 3 slots
    args = ["pairs=" + ",".join(f"{c}:{s}" for c, s in pairs), f"layouts={','.join(layouts)}",
            f"forms={','.join(forms)}", f"iters={iters}", f"warmup={warmup}", f"samples={samples}",
            f"seed={fresh_seed() >> 1}", f"thread_max={thread_max}", f"sample_bytes={sample_bytes}"]
    return _run("nvshmem_rma_chain", binary, mpirun_command(binary, args, env, npes), env, timeout, npes,
                lambda row: f"{row['impl']} {row['layout']} {row['chain']} x {row['bytes']} B")


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


def mpirun_command(binary: Path, args: Sequence[str], env: dict[str, str], npes: int = 2) -> list[str]:
    """``mpirun --allow-run-as-root -np NPES -x VAR ... BINARY ARGS`` for the PEs (the pingpong's 2 by default)."""
    mpirun = shutil.which("mpirun", path=env.get("PATH"))
    if mpirun is None:
        raise BackendError(f"mpirun not found: the NVSHMEM baseline runs its {npes} PEs under Open MPI's mpirun")
    exported = ["LD_LIBRARY_PATH", "NVSHMEM_BOOTSTRAP", "NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE",
                "NVSHMEM_SYMMETRIC_SIZE"]
    exported += [k for k in ("CUDA_VISIBLE_DEVICES", "NVSHMEM_DEBUG", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") if k in env]
    cmd = [mpirun, "--allow-run-as-root", "-np", str(npes)]
    if npes > 2:
        cmd.append("--oversubscribe")  # the PEs share a GPU (under MPS); the machine may have fewer cores
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
    return _run("nvshmem_pingpong", binary, mpirun_command(binary, args, env), env, timeout, 2,
                lambda row: f"{row['impl']} {row['bytes']} B")


def nvshmem_stencil(
    npes: int,
    domains: Sequence[tuple[tuple[int, int], tuple[int, int]]],
    dtypes: Sequence[str] = ("float32", "float64"),
    forms: Sequence[str] = ("launch", "persistent"),
    iters: int = 50,
    warmup: int = 5,
    samples: int = 10,
    check_cells: int = 1 << 20,
    persistent_kernel: str = "auto",
    out_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
) -> list[dict]:
    """Run the 2-D Jacobi stencil with NVSHMEM halos on ``npes`` PEs (``nvshmem_stencil.cu``); called from ONE
    process, not collectively (the PEs share its GPU as the caller's job's ranks do: MPS and its share of the
    SMs come from the caller's environment).

    ``domains``: ``((nx, ny), (px, py))`` global domains with their process grids (``px * py == npes``). Rows,
    one per domain, dtype and form: ``{"impl": "nvshmem-launch" | "nvshmem-persistent", "dtype", "domain",
    "grid", "nranks", "local", "time_per_iter_us", "min_us", "gcells_per_s", "iters", "samples", "blocks",
    "kernel", "checked"}`` (persistent rows also ``"event_us", "timed_from"``): the median and the fastest over
    ``samples`` loops of ``iters`` iterations, each the slowest PE's (the launch form: CUDA events around the loop,
    after an MPI barrier; the persistent form: the device's clock inside the kernel from iteration ``timed_from``,
    the PE count, on, with the event-timed loop in ``event_us``); domains up to ``check_cells`` cells are checked
    bit for bit against the whole domain run on one GPU (the program fails otherwise). ``persistent_kernel``: the
    persistent form's kernel, "auto" (on chip where a PE's block fits one block's shared memory, as the channel
    stencil picks it), "grid" or "onchip"; each row's "kernel" says which ran. Raises BackendError
    when nvcc, NVSHMEM, mpicc or mpirun are missing or the run fails, and TimeoutError past ``timeout``
    (default CIRCUSLINK_TIMEOUT)."""
    check_counts(iters, warmup, "nvshmem_stencil")
    if not isinstance(npes, int) or npes < 1:
        raise ConfigError(f"nvshmem_stencil: npes must be a positive integer, got {npes!r}")
    bad = [d for d in domains if d[1][0] * d[1][1] != npes or d[0][0] < d[1][0] or d[0][1] < d[1][1]]
    if bad or not domains:
        raise ConfigError(f"nvshmem_stencil: domains must be ((nx, ny), (px, py)) with px * py == {npes} PEs and "
                          f"at least one cell a PE, got {list(bad or domains)!r}")
    unknown = [x for x in (*dtypes, *forms) if x not in ("float32", "float64", "launch", "persistent")]
    if unknown or not dtypes or not forms:
        raise ConfigError(f"nvshmem_stencil: dtypes are float32 / float64 and forms launch / persistent, got "
                          f"{list(dtypes)!r} and {list(forms)!r}")
    if persistent_kernel not in ("auto", "grid", "onchip"):
        raise ConfigError(f"nvshmem_stencil: persistent_kernel={persistent_kernel!r}: choose auto, grid or onchip")
    nv = find_nvshmem()
    binary = build_nvshmem_stencil(out_dir)
    env = _job_env(nv, 0)
    args = ["domains=" + ",".join(f"{nx}x{ny}:{px}x{py}" for (nx, ny), (px, py) in domains),
            f"dtypes={','.join(dtypes)}", f"forms={','.join(forms)}", f"iters={iters}", f"warmup={warmup}",
            f"samples={samples}", f"seed={fresh_seed() >> 1}", f"check_cells={check_cells}",
            f"persistent_kernel={persistent_kernel}"]
    return _run("nvshmem_stencil", binary, mpirun_command(binary, args, env, npes), env, timeout, npes,
                lambda row: f"{row['impl']} {row['dtype']} {row['domain']}")


def nvshmem_allreduce(sizes: Iterable[int], npes: int, iters: int, warmup: int, samples: int = 10,
                      forms: Sequence[str] = ("stream", "device"), bytes_per_sample: int = 1 << 30,
                      out_dir: str | os.PathLike | None = None, timeout: float | None = None) -> list[dict]:
    """NVSHMEM's float32 sum reductions on ``npes`` PEs (``nvshmem_allreduce.cu``); called from ONE process.

    Rows: ``{"impl": "nvshmem-reduce-stream"`` (``nvshmemx_float_sum_reduce_on_stream``, event-timed) or
    ``"nvshmem-reduce-device"`` (``nvshmemx_float_sum_reduce_block`` called from a kernel after a device-side
    barrier, %globaltimer-timed), ``"bytes", "count", "nranks", "time_us"`` (median over ``samples`` of the
    slowest PE's time per operation), ``"min_time_us", "algbw_GBps", "busbw_GBps", "iters", "samples",
    "verified"}``. Under MPS every PE gets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / npes (NVSHMEM runs
    collectives only then: "not supported with limited MPG" otherwise). Raises as :func:`nvshmem_pingpong`.
    """
    sizes = check_sizes(sizes, "nvshmem_allreduce")
    check_counts(iters, warmup, "nvshmem_allreduce")
    if isinstance(npes, bool) or not isinstance(npes, int) or npes < 1:
        raise ConfigError(f"nvshmem_allreduce: npes must be a positive integer, got {npes!r}")
    if not forms or any(f not in ("stream", "device") for f in forms):
        raise ConfigError(f"nvshmem_allreduce: forms must be some of 'stream', 'device', got {list(forms)!r}")
    nv = find_nvshmem()
    binary = _build_program("nvshmem_allreduce", ALLREDUCE_SOURCE, out_dir)
    env = _job_env(nv, max(sizes))
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, 100 // npes))
    args = [f"sizes={','.join(map(str, sizes))}", f"iters={iters}", f"warmup={warmup}", f"samples={samples}",
            f"bytes_per_sample={bytes_per_sample}", f"forms={','.join(forms)}"]
    return _run("nvshmem_allreduce", binary, mpirun_command(binary, args, env, npes), env, timeout, npes,
                lambda row: f"{row['impl']} {row['bytes']} B")


def _run(name: str, binary: Path, cmd: list[str], env: dict[str, str], timeout: float | None, npes: int,
         describe) -> list[dict]:
    """Run a baseline program under mpirun, bounded; its rows (each with the NVSHMEM version), or one line saying
    why not (the last row that finished, on a time-out)."""
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
        last = describe(done[-1]) if done else "nothing"
        raise TimeoutError(
            f"{name} ({npes} PEs under mpirun) did not finish within {deadline.limit:g} s; last finished: {last}"
            f"{_tail(stderr, name=name)}"
        ) from None
    _save_log(name, binary.parent, cmd, stdout, stderr)
    if proc.returncode != 0:
        raise BackendError(f"{name} failed (exit code {proc.returncode}){_tail(stderr, stdout, name=name)}"
                           f" (full output in {binary.parent / (name + '.log')})")
    info, rows = parse_output(stdout)
    if not rows:
        raise BackendError(f"{name} printed no results{_tail(stderr, stdout, name=name)}")
    for row in rows:
        if info.get("nvshmem_header_version"):
            row["nvshmem_version"] = info["nvshmem_header_version"]
    return rows


def _save_log(name: str, folder: Path, cmd: Sequence[str], stdout: str, stderr: str) -> None:
    """Keep the last run's full output next to the binary (NVSHMEM's warnings explain odd figures)."""
    try:
        (folder / f"{name}.log").write_text(
            "$ " + " ".join(cmd) + "\n--- stdout\n" + (stdout or "") + "--- stderr\n" + (stderr or "")
        )
    except OSError:
        pass  # the log is a convenience; the result or the error already reached the caller


def _tail(*texts: str | None, lines: int = 8, name: str = "nvshmem_pingpong") -> str:
    """The program's (``name``'s) own error lines if any, else the last lines of its output."""
    all_lines = [ln for t in texts if t for ln in t.strip().splitlines()]
    ours = [ln for ln in all_lines if ln.startswith(f"{name}:")]
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
