"""``circuslink run``: start N ranks on this machine and watch them.

The launcher hosts the rendezvous store, gives each rank its identity in the
environment (``CIRCUSLINK_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_STORE``...; and ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` as torchrun sets them), prefixes
every output line with the rank that wrote it, and when one rank fails (non-zero exit
or a signal) ends the others and exits non-zero naming it. It also records every exit
in the store, so ranks blocked in a collective on a dead peer fail at once with its name
instead of waiting for their time-out.

Before the first rank starts it refuses, in one line, a job this machine cannot hold: a bad
``CIRCUSLINK_TIMEOUT``, more ranks than host memory holds, more ranks on a GPU than MPS takes
clients. It warns when ranks outnumber cores, says how far it is while starting many ranks, and
acts on Ctrl-C or SIGTERM at once, even halfway through starting them. When the job ends, however it
ends, it removes the shared memory its ranks left (files of ranks killed while allocating).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from . import _store, _sysinfo
from ._config import default_timeout
from .backends import BACKENDS, default_backend_name, runs_kernels
from .errors import BackendError, ConfigError

_GRACE_S = 3.0  # between SIGTERM and SIGKILL when ending the other ranks
# Host memory one rank takes before the program allocates anything: the interpreter, numpy and circuslink
# (about 34 MiB resident, measured), and on a GPU also CuPy and the CUDA runtime's host side.
RANK_BYTES = {False: 48 << 20, True: 512 << 20}  # by whether the back-end runs kernels
GPU_CONTEXT_BYTES = 512 << 20  # GPU memory one rank's CUDA context takes before it allocates anything
MPS_CLIENTS_PER_GPU = 48  # an MPS server takes this many clients on one GPU; the 49th is refused
MANY_RANKS = 8  # from this many ranks on, the launcher says how far it is while starting them
_PROGRESS_EVERY_S = 5.0


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


def _gpus(extra_env: dict[str, str] | None) -> tuple[int, int | None]:
    """(GPUs visible, the GPU every rank is fixed to by CIRCUSLINK_DEVICE or None) for the cuda back-end, counted
    without making the launcher a CUDA client."""
    from . import mps

    gpus = mps.gpu_count()
    if gpus == 0:
        raise BackendError("--backend cuda: no GPU is visible on this machine (nvidia-smi and CuPy see none); "
                           "use --backend cpu")
    fixed = (extra_env or {}).get("CIRCUSLINK_DEVICE") or os.environ.get("CIRCUSLINK_DEVICE")
    if fixed in (None, ""):
        return gpus, None
    try:
        return gpus, int(fixed)
    except ValueError:
        raise ConfigError(f"CIRCUSLINK_DEVICE={fixed!r} is not an integer") from None


def _gpu_plan(nranks: int, extra_env: dict[str, str] | None) -> tuple[int, list[int]]:
    """(GPUs, GPU of each rank) for the cuda back-end: round robin, or every rank on CIRCUSLINK_DEVICE."""
    gpus, fixed = _gpus(extra_env)
    return gpus, [fixed] * nranks if fixed is not None else [r % gpus for r in range(nranks)]


def _gpu_counts(nranks: int, extra_env: dict[str, str] | None) -> dict[int, int]:
    """Ranks on each GPU as :func:`_gpu_plan` places them, counted without listing the ranks."""
    gpus, fixed = _gpus(extra_env)
    return {fixed: nranks} if fixed is not None else {g: len(range(g, nranks, gpus)) for g in range(min(gpus, nranks))}


def launch(
    nranks: int,
    command: Sequence[str],
    backend: str | None = None,
    tag_output: str = "all",
    extra_env: dict[str, str] | None = None,
    mps_mode: str = "auto",
    ranks_per_node: int | None = None,
    via: str | None = None,
    transport: str | None = None,
    rank_bytes: int = 0,
    gpu_bytes: int = 0,
) -> int:
    """Run ``command`` as ``nranks`` ranks; return the job's exit code (0 when every rank succeeded).

    ``tag_output``: "all" prefixes every line with ``[rank]``; "others" leaves rank 0's
    lines bare (used when a circuslink command launches itself and rank 0 prints the report).
    ``mps_mode``: "auto" | "on" | "off", how ranks that share a GPU get CUDA MPS (circuslink.mps).
    ``ranks_per_node``: declare nodes of that many consecutive ranks on this machine (sets
    ``CIRCUSLINK_RANKS_PER_NODE`` for the ranks; None keeps the variable's value, if any).
    ``via``: who starts the ranks: "circuslink" (this launcher), "mpirun", or "auto" (None: the
    ``CIRCUSLINK_LAUNCHER`` variable, else auto): mpirun when ``ranks_per_node`` declares more than one node
    (traffic between nodes takes a transport: mpi needs the ranks started by mpirun) and mpirun and
    mpi4py are installed, else this launcher (:func:`choose_launcher`). Under mpirun lines are tagged alike
    where mpirun is Open MPI's, and mpirun names a rank that fails. ``transport``: the transport between nodes,
    forced (``CIRCUSLINK_TRANSPORT`` for the ranks; default: chosen by capability, nvshmem when it can run,
    else mpi); the line that shows the nodes says which one they will take.
    ``rank_bytes``: host memory each rank needs beyond its interpreter (a command that relaunches itself
    knows its own need) and ``gpu_bytes`` GPU memory each needs beyond its CUDA context, counted in the
    refusal of a job that does not fit (:func:`check_limits`).
    """
    from . import _guard, mps
    from .world import ENV_RANKS_PER_NODE, describe_nodes, node_layout, ranks_per_node_from_env

    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise ConfigError(f"-n must be a positive number of ranks, got {nranks!r}")
    if not command:
        raise ConfigError("no command to run: give it after '--', e.g. circuslink run -n 2 -- python app.py")
    default_timeout(dict(os.environ, **(extra_env or {})))  # the ranks' time-out, refused here, not in every rank
    backend = resolve_backend(backend)
    # By the counts alone, before anything lists every rank (check_limits says it all again, warnings too, below).
    if runs_kernels(backend):
        _check_mps_clients(_gpu_counts(nranks, extra_env), mps_mode)
    _check_host_memory(nranks, backend, rank_bytes)
    command = list(command)
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    _check_runnable(command[0])
    # Nodes are checked here, before any rank or daemon exists: every rank would refuse them alike.
    if ranks_per_node is not None:
        per_node: int | None = ranks_per_node
        nodes, node_names, node_how = node_layout(nranks, None, per_node, f"--ranks-per-node {per_node}")
    else:
        per_node = ranks_per_node_from_env(dict(os.environ, **(extra_env or {}))) if nranks > 1 else None
        nodes, node_names, node_how = node_layout(nranks, None, per_node)
    node_of = {r: i for i, ranks in enumerate(nodes) for r in ranks}
    use_mpirun, why = choose_launcher(via, len(nodes), ranks_per_node is not None)
    forced = _transport_env(transport)
    if per_node is not None:
        how = "; started by mpirun" if use_mpirun else ""
        if len(nodes) > 1:
            from . import transport as _transport

            context = _transport.Context(runs_kernels=runs_kernels(backend), under_mpi=use_mpirun)
            how += "; " + _transport.network_choice(context, dict(os.environ, **forced))[1]
        print(f"circuslink run: {nranks} ranks in {describe_nodes(nodes, node_names, node_how)}{how}", file=sys.stderr)
    if use_mpirun:
        env = dict(extra_env or {}, CIRCUSLINK_BACKEND=backend, **forced)
        if ranks_per_node is not None:
            env[ENV_RANKS_PER_NODE] = str(ranks_per_node)
        return _mpirun_job(nranks, command, backend, mps_mode, env, tag_output, node_of if len(nodes) > 1 else None,
                           rank_bytes, gpu_bytes)

    devices: list[int] = []
    if runs_kernels(backend):
        _, devices = _gpu_plan(nranks, extra_env)
    elif mps_mode == "on":
        raise ConfigError(f"--mps on: the {backend} back-end runs no GPU work, so there is no MPS to run its ranks "
                          "under (--mps auto or off)")
    per_gpu = {d: devices.count(d) for d in set(devices)}
    check_limits(nranks, backend, per_gpu, mps_mode, rank_bytes, gpu_bytes)
    session = mps.start(mps_mode, needed=any(n > 1 for n in per_gpu.values()), label=f"run{os.getpid()}")
    if session.warning:
        print(f"circuslink run: warning: {session.warning}", file=sys.stderr)

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
        CIRCUSLINK_LAUNCHER_PID=str(os.getpid()),
        PYTHONUNBUFFERED="1",
        **forced,
        CIRCUSLINK_CORES=str(_sysinfo.cores()),
        # As torchrun sets them, so programs written for torch.distributed find their rank (one machine).
        WORLD_SIZE=str(nranks),
        LOCAL_WORLD_SIZE=str(nranks),
    )
    base_env.update(_NO_MULTICAST)
    if ranks_per_node is not None:
        base_env[ENV_RANKS_PER_NODE] = str(ranks_per_node)
    if why:  # channels.open names it when a routed channel finds no transport between nodes in this job
        base_env[ENV_NOT_MPIRUN] = why
    lock = threading.Lock()
    ranks: list[_Rank] = []
    interrupted = {"signal": None}

    def on_signal(signum, frame):  # forward Ctrl-C / SIGTERM to the whole job
        interrupted["signal"] = signum

    from .backends.cpu import job_files_pattern, sweep_job

    guard = _guard.Guard(session, shm_pattern=job_files_pattern(job_id))
    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    many = nranks >= MANY_RANKS
    t_start = time.monotonic()
    try:
        if many:
            print(f"circuslink run: starting {nranks} ranks", file=sys.stderr, flush=True)
        last_note = t_start
        # Every rank is started before any output thread: forking while threads run is best avoided.
        for r in range(nranks):
            if interrupted["signal"] is not None:
                break  # Ctrl-C or SIGTERM while starting: start no more, end those started (below)
            env = dict(base_env, CIRCUSLINK_RANK=str(r), CIRCUSLINK_LOCAL_RANK=str(r), RANK=str(r), LOCAL_RANK=str(r))
            if devices:
                env["CIRCUSLINK_DEVICE"] = str(devices[r])
                env.update(session.rank_env(per_gpu[devices[r]]))
            try:
                proc = subprocess.Popen(
                    _guard.exec_command() + command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ConfigError(f"cannot start {command[0]!r}: {exc.strerror}") from None
            guard.watch(proc.pid, group=True)
            ranks.append(_Rank(r, proc))
            if many and time.monotonic() - last_note >= _PROGRESS_EVERY_S:
                last_note = time.monotonic()
                print(f"circuslink run: started {r + 1} of {nranks} ranks ({last_note - t_start:.0f} s)",
                      file=sys.stderr, flush=True)
        if many and interrupted["signal"] is None:
            print(f"circuslink run: started {nranks} ranks ({time.monotonic() - t_start:.1f} s); waiting for them "
                  "to join", file=sys.stderr, flush=True)
        for rank in ranks:
            tag = "" if (tag_output == "others" and rank.rank == 0) or tag_output == "none" else f"[{rank.rank}] "
            for stream, sink in ((rank.proc.stdout, sys.stdout), (rank.proc.stderr, sys.stderr)):
                t = threading.Thread(target=_pump, args=(stream, sink, tag, lock), daemon=True)
                t.start()
                rank.threads.append(t)

        failed: tuple[int, int] | None = None
        running = {rk.rank: rk for rk in ranks}
        joined_note = time.monotonic() if many else None  # None: nothing more to say about joining
        if interrupted["signal"] is not None:
            failed = (-1, -interrupted["signal"])
            _end(running.values())
        while running:
            if interrupted["signal"] is not None and failed is None:
                failed = (-1, -interrupted["signal"])
                _end(running.values())
            if joined_note is not None:
                joined = store.joined()
                if joined >= nranks:
                    print(f"circuslink run: all {nranks} ranks joined ({time.monotonic() - t_start:.1f} s)",
                          file=sys.stderr, flush=True)
                    joined_note = None
                elif time.monotonic() - joined_note >= _PROGRESS_EVERY_S and joined > 0:
                    joined_note = time.monotonic()
                    print(f"circuslink run: {joined} of {nranks} ranks joined ({joined_note - t_start:.0f} s)",
                          file=sys.stderr, flush=True)
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
        if ranks:
            _end([rk for rk in ranks if rk.proc.poll() is None])  # an exception above: no rank outlives us
        for s, h in old_handlers.items():
            signal.signal(s, h)
        store.close()
        sweep_job(job_id)  # every rank has exited: what a killed rank left in /dev/shm goes now
        session.stop()
        guard.close()

    if failed is None:
        return 0
    r, code = failed
    if r < 0:
        print(f"circuslink run: interrupted by {signal.Signals(-code).name}; ended all ranks", file=sys.stderr)
        return 130
    where = f" (node {node_of[r]})" if len(nodes) > 1 else ""
    print(f"circuslink run: rank {r}{where} {_describe_exit(code)}; ended the other ranks", file=sys.stderr)
    return code if code > 0 else 128 - code


def _check_runnable(program: str) -> None:
    """Refuse a command that cannot start, before any rank or daemon exists (ranks start through
    the guard's exec, which would only report it as an exit code)."""
    if os.sep in program:
        if not os.path.exists(program):
            raise ConfigError(f"cannot start {program!r}: No such file or directory")
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise ConfigError(f"cannot start {program!r}: Permission denied")
    elif shutil.which(program) is None:
        raise ConfigError(f"cannot start {program!r}: not found on PATH")


def check_limits(nranks: int, backend: str, per_gpu: dict[int, int], mps_mode: str = "auto",
                 rank_bytes: int = 0, gpu_bytes: int = 0) -> None:
    """Refuse, before anything starts, a job this machine cannot hold (one line naming the limit); warn when
    its ranks outnumber the cores. ``per_gpu``: ranks on each GPU (empty on a back-end without kernels);
    ``rank_bytes``: host memory each rank needs beyond its interpreter (on the cpu back-end, where symmetric
    memory lives in /dev/shm, checked against its free space too); ``gpu_bytes``: GPU memory each rank needs
    beyond its CUDA context."""
    from . import mps

    _check_mps_clients(per_gpu, mps_mode)
    _check_host_memory(nranks, backend, rank_bytes)
    if per_gpu:
        mps.require_gpu_memory({d: n * (GPU_CONTEXT_BYTES + max(0, int(gpu_bytes))) for d, n in per_gpu.items()},
                               f"{nranks} ranks ({max(per_gpu.values())} on one GPU)", "start fewer ranks")
    cores = _sysinfo.cores()
    if nranks > cores:
        print(f"circuslink run: warning: {nranks} ranks on {cores} cores: ranks that wait for each other take turns "
              "on the cores, so their waits sleep and latencies measure the scheduler", file=sys.stderr)


def _check_mps_clients(per_gpu: dict[int, int], mps_mode: str) -> None:
    crowded = {d: n for d, n in per_gpu.items() if n > MPS_CLIENTS_PER_GPU}
    if crowded and mps_mode != "off":
        d, n = max(crowded.items(), key=lambda item: item[1])
        raise ConfigError(f"{n} ranks on GPU {d}: an MPS server takes at most {MPS_CLIENTS_PER_GPU} clients on one "
                          f"GPU; start at most {MPS_CLIENTS_PER_GPU * max(1, len(per_gpu))} ranks on "
                          f"{len(per_gpu)} GPU(s) (or --mps off, time-sliced)")


def _check_host_memory(nranks: int, backend: str, rank_bytes: int) -> None:
    """Refuse ranks that host memory (on the cpu back-end: /dev/shm) cannot hold. It needs only the count, so
    :func:`launch` asks it first, before anything that lists every rank (a mistyped -n of 10^9 is refused at
    once, not after minutes and GiBs spent laying out ranks that will never start)."""
    gpu = runs_kernels(backend)
    each = RANK_BYTES[gpu] + max(0, int(rank_bytes))
    need = nranks * each
    have, what = _sysinfo.host_memory() if gpu else _sysinfo.shared_memory()
    if need > have:
        advice = (f"start at most {have // each} ranks here" if have >= each else
                  "one rank alone needs more than there is: ask for less (smaller --sizes or problem)")
        raise ConfigError(f"{nranks} ranks need about {_sysinfo.gib(need)} of host memory ({each >> 20} MiB each), "
                          f"more than the {_sysinfo.gib(have)} of {what}: {advice}")


# Never NVLink multicast (it can take shared machines' GPUs down): also for programs we start.
_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def resolve_backend(backend: str | None) -> str:
    """The back-end a job will use: the argument, else CIRCUSLINK_BACKEND, else cuda if a GPU is there."""
    backend = (backend or os.environ.get("CIRCUSLINK_BACKEND") or "auto").lower()
    if backend == "auto":
        backend = default_backend_name()
    if backend not in BACKENDS:
        raise ConfigError(f"unknown back-end {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend


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


LAUNCHERS = ("auto", "mpirun", "circuslink")
ENV_LAUNCHER = "CIRCUSLINK_LAUNCHER"  # the default of circuslink run --launcher
ENV_NOT_MPIRUN = "CIRCUSLINK_NOT_MPIRUN"  # why a job of several nodes was not started by mpirun (for messages)
ENV_MPIRUN_JOB_ID = "CIRCUSLINK_MPIRUN_JOB_ID"  # the job id the launcher gave the ranks it started by mpirun


def _transport_env(name: str | None) -> dict[str, str]:
    """``{CIRCUSLINK_TRANSPORT: name}`` for the ranks when ``--transport`` forces one (checked), else ``{}``."""
    if name is None:
        return {}
    from . import transport as _transport

    if name not in _transport.names():
        raise ConfigError(f"--transport {name!r}: choose one of {', '.join(_transport.names())} (a plug-in the ranks "
                          f"register themselves: set {_transport.ENV_TRANSPORT} instead)")
    return {_transport.ENV_TRANSPORT: name}


def choose_launcher(via: str | None, nnodes: int, declared_here: bool = True) -> tuple[bool, str | None]:
    """``(use mpirun, why not)`` for a job of ``nnodes`` nodes started ``via`` "auto", "mpirun" or "circuslink"
    (None: ``CIRCUSLINK_LAUNCHER``, else auto). Auto takes mpirun for nodes declared on the command line
    (``declared_here``: ``--ranks-per-node K``; nodes the variable declares keep this launcher, the variable
    being how nodes are declared under an mpirun of one's own). ``why not`` is set only when the job has
    several nodes but is not started by mpirun: MPI between its nodes is then missing, and a
    routed channel that needs it is refused naming this reason."""
    via = (via or os.environ.get(ENV_LAUNCHER) or "auto").lower()
    if via not in LAUNCHERS:
        raise ConfigError(f"--launcher {via!r}: choose one of {', '.join(LAUNCHERS)} (or set {ENV_LAUNCHER})")
    if via == "mpirun":
        if not mpirun_available():
            raise ConfigError(f"--launcher mpirun: {_mpi_missing()}")
        return True, None
    if nnodes < 2:
        return False, None
    if via == "circuslink":
        return False, "--launcher circuslink was asked for"
    if not declared_here:
        from .world import ENV_RANKS_PER_NODE

        return False, f"its nodes were declared by {ENV_RANKS_PER_NODE}, not by --ranks-per-node"
    if not mpirun_available():
        return False, _mpi_missing()
    return True, None


def _mpi_missing() -> str:
    import importlib.util

    if shutil.which("mpirun") is None:
        return "mpirun is not on PATH"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return "mpirun and mpi4py are installed"


def _mpirun_job(nranks: int, command: Sequence[str], backend: str, mps_mode: str, env: dict[str, str],
                tag_output: str | None = None, node_of: dict[int, int] | None = None, rank_bytes: int = 0,
                gpu_bytes: int = 0) -> int:
    """Run ``command`` as ``nranks`` ranks started by mpirun, with ``env`` added to this environment (and
    forwarded) and MPS arranged around it as ``circuslink mps`` does; return mpirun's exit code. mpirun names
    a rank that fails (and a failing circuslink rank names itself and aborts the job). ``tag_output`` as
    :func:`launch` has it, where mpirun is Open MPI's (its ``--tag-output`` prefixes are rewritten to
    ``[rank]``); None leaves mpirun's output as it is."""
    from . import _guard, mps
    from .backends.cpu import job_files_pattern, sweep_job

    full = dict(os.environ)
    full.update(env)
    for key, value in _NO_MULTICAST.items():
        full.setdefault(key, value)
    default_timeout(full)  # the ranks' time-out, refused here, not in every rank
    if mps_mode == "on" and not runs_kernels(backend):
        raise ConfigError(f"--mps on: the {backend} back-end runs no GPU work, so there is no MPS to run its ranks "
                          "under (--mps auto or off)")
    devices = _gpu_plan(nranks, env)[1] if runs_kernels(backend) else []
    per_gpu = {d: devices.count(d) for d in set(devices)}
    check_limits(nranks, backend, per_gpu, mps_mode, rank_bytes, gpu_bytes)
    needed = any(n > 1 for n in per_gpu.values())
    tag = tag_output if tag_output in ("all", "others") and _open_mpi() else None
    job_id = _store.new_job_id()
    full[ENV_MPIRUN_JOB_ID] = job_id  # the ranks' job id (world.init), so that the sweep below finds their files
    full.setdefault(_sysinfo.ENV_CORES, str(_sysinfo.cores()))  # mpirun binds each rank to fewer cores than the job has
    session = mps.start(mps_mode, needed=needed, label=f"mpirun{os.getpid()}")
    if session.warning:
        print(f"circuslink: warning: {session.warning}", file=sys.stderr)
    guard = _guard.Guard(session, shm_pattern=job_files_pattern(job_id))
    try:
        full.update(session.env)
        if session.status.active:
            full[mps.ENV_GPUS] = str(mps.gpu_count())
        full.pop("CIRCUSLINK_LAUNCHER_PID", None)  # mpirun's daemon is the ranks' parent, not this process
        # each rank starts through the guard's exec, which gives it torchrun's names for its place
        cmd = mpirun_command(nranks, _guard.exec_command() + list(command), full)
        if tag:
            cmd.insert(1, "--tag-output")
        pipe = subprocess.PIPE if tag else None
        try:
            proc = subprocess.Popen(cmd, env=full, stdout=pipe, stderr=pipe)
        except OSError as exc:
            raise ConfigError(f"cannot start mpirun: {exc.strerror}") from None
        guard.watch(proc.pid)
        threads = []
        if tag:
            lock = threading.Lock()
            for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                t = threading.Thread(target=_pump_tagged, args=(stream, sink, tag, lock), daemon=True)
                t.start()
                threads.append(t)
        code = proc.wait()
        for t in threads:
            t.join(timeout=5)
    finally:
        sweep_job(job_id)
        session.stop()
        guard.close()
    if code != 0 and node_of is not None:
        print(f"circuslink run: the job (started by mpirun) failed with exit code {code}; mpirun's notice above "
              "names the rank", file=sys.stderr)
    return code


def _open_mpi() -> bool:
    """Whether ``mpirun`` is Open MPI's (it has ``--tag-output``, whose prefixes are rewritten)."""
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


# Open MPI's --tag-output prefixes every chunk a rank writes (not every line): [jobid,rank]<stdout>:
_OMPI_TAG = re.compile(rb"\[\d+,(\d+)\]<std(?:out|err)>:")
_OMPI_TAG_START = re.compile(rb"\[[\d,\]<stdouer>]{0,40}$")  # a buffer's tail that may be a tag cut in two


def _pump_tagged(stream, sink, tag_output: str, lock: threading.Lock) -> None:
    """Copy mpirun's tagged output to ``sink`` as whole lines ``[rank] line`` (rank 0's bare with "others"),
    each rank's chunks joined into its own lines; mpirun's own lines unchanged."""
    pending = b""
    lines: dict[int | None, bytes] = {}
    fd = stream.fileno()

    def emit(rank: int | None, data: bytes, final: bool = False) -> None:
        text = lines.pop(rank, b"") + data
        done, _, rest = text.rpartition(b"\n") if not final else (text, b"", b"")
        if rest:
            lines[rank] = rest
        if not done:
            return
        tag = "" if rank is None or (tag_output == "others" and rank == 0) else f"[{rank}] "
        out = "".join(tag + line + "\n" for line in done.decode(errors="replace").split("\n"))
        with lock:
            sink.write(out)
            sink.flush()

    rank: int | None = None
    while True:
        data = os.read(fd, 1 << 16)
        pending += data
        held = b""
        if data:
            cut = _OMPI_TAG_START.search(pending)
            if cut is not None:
                pending, held = pending[:cut.start()], pending[cut.start():]
        start = 0
        for m in _OMPI_TAG.finditer(pending):
            if m.start() > start:
                emit(rank, pending[start:m.start()])
            rank, start = int(m.group(1)), m.end()
        if start < len(pending):
            emit(rank, pending[start:])
        pending = held
        if not data:
            break
    for r in list(lines):
        emit(r, b"", final=True)
    stream.close()


_FORWARDED = (
    "CIRCUSLINK_", "NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "PYTHON", "CUDA_", "OMP_", "PATH", "LD_LIBRARY_PATH",
)


def mpirun_command(nranks: int, command: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
    """``mpirun`` for ``nranks`` local ranks, forwarding circuslink's and the GPU libraries' settings (those of
    ``env``, default this process's environment)."""
    cmd = ["mpirun", "-np", str(nranks), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in sorted(os.environ if env is None else env):
        if key.startswith(_FORWARDED):
            cmd += ["-x", key]
    return cmd + list(command)


_invocation: list[str] | None = None


def set_invocation(argv: Sequence[str]) -> None:
    """Remember the arguments the ``circuslink`` command was called with (cli.main does this)."""
    global _invocation
    _invocation = list(argv)


def relaunch_self(nranks: int, backend: str | None, prefer_mpirun: bool = False, mps_mode: str = "auto",
                  argv: Sequence[str] | None = None, ranks_per_node: int | None = None, rank_bytes: int = 0,
                  gpu_bytes: int = 0, sm_partition: str | None = None) -> int:
    """Run this ``circuslink`` command again as ``nranks`` ranks (multi-rank CLI commands call this
    when they are not inside a job yet); the one way a command relaunches itself.

    The ranks get the same arguments (``argv``, default: those of this invocation). With
    ``prefer_mpirun`` (benchmarks whose baselines need MPI) they are started by mpirun when it and
    mpi4py are there, with MPS arranged around it as ``circuslink mps`` does; otherwise by
    :func:`launch`. Either way ranks that share a GPU run under MPS (``mps_mode``). ``ranks_per_node``
    declares nodes on this machine (``CIRCUSLINK_RANKS_PER_NODE``, which mpirun forwards). ``rank_bytes`` and
    ``gpu_bytes``: host and GPU memory each rank needs beyond its interpreter and context (:func:`check_limits`).
    ``sm_partition``: the ``CIRCUSLINK_SM_PARTITION`` mode of the command's ranks where the environment sets none
    (a command measured faster with SMs of its own a rank passes ``auto``; a mode set by the user is kept).
    """
    from .backends import _partition
    from .world import ENV_RANKS_PER_NODE, node_layout

    if sm_partition is not None and not os.environ.get(_partition.ENV, "").strip():
        _partition.mode({_partition.ENV: sm_partition})  # a bad mode is refused here, before any rank starts
        os.environ[_partition.ENV] = sm_partition  # the ranks inherit it; so does the launcher's MPS share

    args = list(argv) if argv is not None else list(_invocation if _invocation is not None else sys.argv[1:])
    command = [sys.executable, "-m", "circuslink", *args]
    backend = resolve_backend(backend)
    if ranks_per_node is not None:
        node_layout(nranks, None, ranks_per_node, f"--ranks-per-node {ranks_per_node}")  # refused before any rank
    if prefer_mpirun and mpirun_available():
        env = {"CIRCUSLINK_BACKEND": backend}
        if ranks_per_node is not None:
            env[ENV_RANKS_PER_NODE] = str(ranks_per_node)
        return _mpirun_job(nranks, command, backend, mps_mode, env, rank_bytes=rank_bytes, gpu_bytes=gpu_bytes)
    return launch(nranks, command, backend=backend, tag_output="others", mps_mode=mps_mode,
                  ranks_per_node=ranks_per_node, rank_bytes=rank_bytes, gpu_bytes=gpu_bytes)
