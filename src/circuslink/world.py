"""Ranks: who am I, who else is there, and the collectives every other layer builds on.

:func:`init` works three ways, detected from the environment:

* started by ``circuslink run`` (``CIRCUSLINK_RANK`` is set): the launcher hosts the
  rendezvous store and records how each rank exits, so a collective waiting on a
  dead rank fails at once with that rank's name;
* started by ``mpirun`` (Open MPI's ``OMPI_COMM_WORLD_*`` or MPICH/PMI's ``PMI_*``):
  rank 0 hosts the store and sends its address to the others through mpi4py;
* a plain single process: a world of one rank.

Every collective of Python objects waits through one function (``Bootstrap.exchange``), so
every one of them has the same time-out and the same error, naming the ranks that did not arrive.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from . import _store
from ._bootstrap import Bootstrap
from ._config import resolve_timeout
from .errors import ConfigError


def _env_int(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        raw = env.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


class World:
    """The set of ranks of one job. Create it with :func:`circuslink.init`."""

    def __init__(
        self,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        job_id: str,
        store: _store.StoreClient | None,
        backend_name: str | None,
        launched_by: str,
        hosted_store: _store.StoreServer | None = None,
        mpi_comm: Any = None,
    ) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.job_id = job_id
        self.launched_by = launched_by
        self._boot = Bootstrap(rank, size, local_rank, local_size, job_id, store)
        self._hosted_store = hosted_store
        self._mpi_comm = mpi_comm
        self._closed = False
        self._resources: list = []  # live Resources (circuslink._lifecycle), closed newest first by close()
        self._registries: dict[str, Any] = {}  # per-world state of subsystems (see registry())
        from .backends import select_backend

        self.backend = select_backend(backend_name, self._boot)

    # -- identity ---------------------------------------------------------------------------
    @property
    def device(self) -> int | None:
        """The GPU ordinal this rank uses (None on the cpu back-end)."""
        return self.backend.device

    @property
    def xp(self):
        """The array module of this back-end: numpy (cpu) or cupy (cuda)."""
        return self.backend.xp

    @property
    def sm_budget(self) -> int | None:
        """SMs this rank's kernels may occupy at once (None on the cpu back-end).

        The forward-progress rule: ranks that share a GPU each get a share of its SMs, and a kernel
        that waits on a peer must never launch more resident blocks than its rank's share allows
        (``world.backend.max_blocks(kernel, threads)`` computes that bound), so the peer always has
        SMs to make progress on."""
        return self.backend.sm_budget

    def engine(self, package: str):
        """The back-end half of a subsystem (``world.engine("circuslink.rma")`` -> ``rma._cuda``)."""
        return self.backend.engine(package)

    @property
    def mpi_comm(self):
        """mpi4py's COMM_WORLD when started by mpirun, else None."""
        return self._mpi_comm

    def __repr__(self) -> str:
        return (
            f"World(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, "
            f"backend={self.backend.name!r}, device={self.device})"
        )

    # -- resources (circuslink._lifecycle) -----------------------------------------------------
    def _own(self, resource) -> None:
        """Hold ``resource`` (a Resource of this world): close() releases what the user left open."""
        self._resources.append(resource)

    def _disown(self, resource) -> None:
        if resource in self._resources:
            self._resources.remove(resource)

    def resources(self, kind: type | None = None) -> list:
        """The live resources of this world (of class ``kind``), oldest first."""
        return [r for r in self._resources if kind is None or isinstance(r, kind)]

    def registry(self, key: str, factory: Any) -> Any:
        """Per-world state of a subsystem (a counter, a default communicator, a cache), made by ``factory()``
        on first use. It lives on the World, so it dies with it: no module globals keyed by ``id(world)``."""
        if key not in self._registries:
            self._registries[key] = factory()
        return self._registries[key]

    # -- collectives of Python objects (through the rendezvous store) --------------------------
    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has called barrier; raise if one is dead or late."""
        self._check_open()
        self._boot.barrier(timeout)

    def allgather_object(self, obj: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's Python object ``obj``, in rank order (through the rendezvous store: for setup and
        small metadata; device data goes through circuslink.collectives). ``bytes`` travel as they are;
        anything else is pickled."""
        self._check_open()
        return self._boot.allgather_object(obj, timeout)

    def broadcast_object(self, obj: Any = None, root: int = 0, timeout: float | None = None) -> Any:
        """``root``'s Python object ``obj`` on every rank (through the store; arrays of device data go
        through circuslink.collectives.broadcast)."""
        self._check_open()
        return self._boot.broadcast_object(obj, root, timeout)

    # -- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int, timeout: float | None = None, peers: Any = None):
        """Collective: a :class:`~circuslink.memory.SymmetricBuffer` of ``nbytes`` on every rank.

        Each rank gets its own zeroed buffer plus mapped views of every peer's, as arrays
        and as raw pointers for kernels. ``peers`` (an iterable of ranks; None: every rank)
        limits what this rank maps to those ranks' buffers (a direct network: a rank maps its
        neighbours only); each rank passes its own list, and ``buf.peer(r)`` of another rank
        raises. Close it with ``buf.close()`` (collective) or let :meth:`close` do it.
        """
        self._check_open()
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ConfigError(f"alloc: nbytes must be a positive integer, got {nbytes!r}")
        wanted = None if peers is None else self._peer_set(peers)
        sizes = self.allgather_object(nbytes, timeout)
        if len(set(sizes)) != 1:
            detail = ", ".join(f"rank {r}: {n}" for r, n in enumerate(sizes))
            raise ConfigError(f"alloc is collective and needs the same nbytes on every rank ({detail})")
        buf = self.backend.alloc(nbytes, timeout, wanted)
        buf.world = self
        self._own(buf)
        return buf

    def _peer_set(self, peers: Any) -> frozenset[int]:
        """``peers`` checked: ranks of this world (this rank may be named; it is always mapped)."""
        try:
            ranks = list(peers)
        except TypeError:
            raise ConfigError(f"alloc: peers must be an iterable of ranks or None, got {peers!r}") from None
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= int(r) < self.size:
                raise ConfigError(f"alloc: peers holds {r!r}, which is not a rank of this world (0..{self.size - 1})")
        return frozenset(int(r) for r in ranks) | {self.rank}

    # -- teardown -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this World is closed")

    def close(self, timeout: float | None = None) -> None:
        """Close every resource left open (newest first), wait for every rank, and disconnect. Idempotent."""
        if self._closed:
            return
        try:
            for res in reversed(list(self._resources)):
                res.close(timeout)
            self.barrier(timeout)
            if self._mpi_comm is not None:
                # Under mpirun rank 0 hosts the store: a peer may still be reading the last
                # barrier's reply when rank 0 would close it, so wait on MPI, bounded, first.
                _bounded_mpi_barrier(self._mpi_comm, resolve_timeout(timeout), self.rank)
        finally:
            self._closed = True
            self.backend.close()
            self._boot.close()
            if self._hosted_store is not None:
                self._hosted_store.close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            # A failing rank must not wait in close()'s barrier for peers that will wait forever
            # on it; release local resources only and let the launcher end the job.
            self._closed = True
            for res in reversed(list(self._resources)):
                res.release_local()
            self.backend.close()


_current: World | None = None


def _bounded_mpi_barrier(comm, timeout: float, rank: int) -> None:
    from ._wait import wait_until

    request = comm.Ibarrier()
    wait_until(request.Test, timeout, f"the closing MPI barrier on rank {rank}")


_failing = False


def _note_failure(exc_type, exc, tb, _previous=None) -> None:
    global _failing
    _failing = True  # an unhandled error: exit now, do not wait in close() for peers
    (_previous or sys.__excepthook__)(exc_type, exc, tb)


def _close_at_exit() -> None:
    """Close a world the program left open, so that rank 0's store outlives its peers' last calls."""
    world = _current
    if world is not None and not world._closed and not _failing:
        try:
            world.close()
        except Exception as exc:  # exiting anyway; say why the clean close failed
            print(f"circuslink: rank {world.rank}: closing the world at exit failed: {exc}", file=sys.stderr)


def init(backend: str | None = None, timeout: float | None = None) -> World:
    """Join the job this process belongs to and return its :class:`World`.

    ``backend`` is ``"cpu"``, ``"cuda"`` or None for the default: ``CIRCUSLINK_BACKEND``
    if set, else cuda when a usable GPU is present, else cpu. Calling init again in the
    same process returns the same world.
    """
    global _current
    if _current is not None and not _current._closed:
        return _current
    env = os.environ
    connect_timeout = resolve_timeout(timeout)
    backend = backend or env.get("CIRCUSLINK_BACKEND") or None
    if "CIRCUSLINK_RANK" in env:
        rank = _env_int(env, "CIRCUSLINK_RANK")
        size = _env_int(env, "CIRCUSLINK_SIZE")
        if rank is None or size is None or not 0 <= rank < size:
            raise ConfigError(
                f"CIRCUSLINK_RANK={env.get('CIRCUSLINK_RANK')} and CIRCUSLINK_SIZE={env.get('CIRCUSLINK_SIZE')} "
                "are inconsistent"
            )
        local_rank = _env_int(env, "CIRCUSLINK_LOCAL_RANK")
        local_size = _env_int(env, "CIRCUSLINK_LOCAL_SIZE")
        store = _store.StoreClient(env["CIRCUSLINK_STORE"], env["CIRCUSLINK_STORE_TOKEN"], connect_timeout)
        world = World(
            rank, size, rank if local_rank is None else local_rank, size if local_size is None else local_size,
            env.get("CIRCUSLINK_JOB_ID", "job"), store, backend, "circuslink run",
        )
    else:
        mpi_rank = _env_int(env, "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
        if mpi_rank is not None:
            _mps_share_under_mpirun(env)
            world = _init_from_mpi(env, backend, connect_timeout)
        else:
            world = World(0, 1, 0, 1, _store.new_job_id(), None, backend, "single process")
    _current = world
    return world


def _mps_share_under_mpirun(env) -> None:
    """Under ``circuslink mps -- mpirun ...``: take this rank's share of its GPU's SMs, as ``circuslink run``
    gives it, before anything initialises CUDA (MPS reads the share when the context is made)."""
    from . import mps

    if not env.get(mps.ENV_ACTIVE) or env.get(mps.ENV_SHARE):
        return
    gpus = _env_int(env, mps.ENV_GPUS) or 0
    local = _env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE") or 0
    if gpus > 0 and local > gpus:
        os.environ[mps.ENV_SHARE] = str(mps.share_percent(-(-local // gpus)))


def _init_from_mpi(env: dict[str, str], backend: str | None, connect_timeout: float) -> World:
    try:
        import mpi4py

        # One thread talks to MPI (the store's thread never does). THREAD_MULTIPLE, mpi4py's
        # default, makes Open MPI 4.1 refuse one-sided windows on some builds (MPI_ERR_WIN).
        mpi4py.rc.thread_level = "funneled"
        from mpi4py import MPI
    except ImportError:
        raise ConfigError(
            "this process was started by mpirun but mpi4py is not installed: "
            "pip install mpi4py, or start the job with 'circuslink run'"
        ) from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    hosted = None
    if rank == 0:
        host = "127.0.0.1" if local_size == size else socket.gethostname()
        hosted = _store.StoreServer(host="0.0.0.0" if host != "127.0.0.1" else host)
        info = (f"{host}:{hosted.address.rsplit(':', 1)[1]}", hosted.token, _store.new_job_id())
    else:
        info = None
    address, token, job_id = comm.bcast(info, root=0)
    import atexit

    atexit.register(_close_at_exit)  # Python's atexit runs before mpi4py's MPI_Finalize
    previous = sys.excepthook
    sys.excepthook = lambda t, e, tb: _note_failure(t, e, tb, previous)
    store = _store.StoreClient(address, token, connect_timeout)
    return World(rank, size, local_rank, local_size, job_id, store, backend, "mpirun", hosted, comm)
