"""Ranks: who am I, who else is there, and the collectives every other layer builds on.

:func:`init` works three ways, detected from the environment:

* started by ``circuslink run`` (``CIRCUSLINK_RANK`` is set): the launcher hosts the
  rendezvous store and records how each rank exits, so a collective waiting on a
  dead rank fails at once with that rank's name;
* started by ``mpirun`` (Open MPI's ``OMPI_COMM_WORLD_*`` or MPICH/PMI's ``PMI_*``):
  rank 0 hosts the store and sends its address to the others through mpi4py;
* a plain single process: a world of one rank.

Ranks are grouped into **nodes** (:func:`node_layout`): by host name, or in blocks of K consecutive ranks
when ``CIRCUSLINK_RANKS_PER_NODE=K`` is set (``circuslink run --ranks-per-node K`` sets it), which
declares node boundaries on one machine. Memory is mapped only inside a node; traffic between nodes
goes through gateway ranks over a transport (``circuslink.transport``, docs/scale.md).

Under mpirun the world's bootstrap initialises MPI once (:class:`MpiSession`, ``world.mpi``): the only
place outside ``circuslink.transport`` that imports mpi4py. Back-ends and baselines that call MPI themselves
(RMA's MPI-3 windows, the MPI baselines) take the module, the communicator and the lock from it.

Every collective of Python objects waits through one function (``Bootstrap.exchange``), so
every one of them has the same time-out and the same error, naming the ranks that did not arrive.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from . import _store
from ._bootstrap import Bootstrap
from ._config import resolve_timeout
from .errors import ConfigError

ENV_RANKS_PER_NODE = "CIRCUSLINK_RANKS_PER_NODE"


def _env_int(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        raw = env.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def ranks_per_node_from_env(env: dict[str, str] | None = None) -> int | None:
    """``CIRCUSLINK_RANKS_PER_NODE`` as a positive integer, or None when unset (empty counts as unset)."""
    env = os.environ if env is None else env
    k = _env_int(env, ENV_RANKS_PER_NODE)
    if k is not None and k < 1:
        raise ConfigError(f"environment variable {ENV_RANKS_PER_NODE}={k} must be a positive number of ranks")
    return k


def node_layout(size: int, hosts: Sequence[str] | None = None, ranks_per_node: int | None = None,
                source: str | None = None) -> tuple[list[list[int]], list[str], str]:
    """How ``size`` ranks group into nodes: ``(nodes, names, how)``.

    ``nodes[i]`` lists node i's ranks (ascending); ``names[i]`` names it; ``how`` says where the grouping
    came from, for messages. With ``ranks_per_node`` K, node i holds ranks iK .. iK+K-1 (K must divide
    ``size``, and a declared node may not span two hosts); otherwise ranks sharing a host name form a node,
    nodes numbered in order of their lowest rank. ``hosts[r]`` is rank r's host name (None: one host).
    ``source`` names where K came from in messages (default ``CIRCUSLINK_RANKS_PER_NODE=K``).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"node layout: the job needs at least 1 rank, got {size!r}")
    if hosts is not None and len(hosts) != size:
        raise ConfigError(f"node layout: {len(hosts)} host names for {size} ranks")
    if ranks_per_node is not None:
        k = ranks_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"{source or 'ranks per node'}: must be a positive number of ranks, got {k!r}")
        source = source or f"{ENV_RANKS_PER_NODE}={k}"
        if size % k:
            raise ConfigError(f"{source} does not divide the job's {size} ranks into whole nodes "
                              f"(use a K that divides {size})")
        nodes = [list(range(i, i + k)) for i in range(0, size, k)]
        for i, ranks in enumerate(nodes):
            seen = {hosts[r] for r in ranks} if hosts is not None else set()
            if len(seen) > 1:
                a = ranks[0]
                b = next(r for r in ranks if hosts[r] != hosts[a])
                raise ConfigError(f"{source} puts rank {a} (host {hosts[a]}) and rank {b} (host "
                                  f"{hosts[b]}) in node {i}: a declared node cannot span two hosts")
        return nodes, [f"node{i}" for i in range(len(nodes))], f"declared by {source}"
    if hosts is None:
        return [list(range(size))], [socket.gethostname()], "one host"
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    return list(by_host.values()), list(by_host), "by host name"


def _job_layout(size: int, hosts: Sequence[str] | None) -> tuple[list[list[int]], list[str], str]:
    """This job's nodes, from the environment. A world of one rank is one node whatever the environment
    says (a plain ``python app.py`` with the variable exported keeps working)."""
    return node_layout(size, hosts, ranks_per_node_from_env() if size > 1 else None)


def _span(ranks: Sequence[int]) -> str:
    """``0-3`` for a run of consecutive ranks, else ``0,2,5``."""
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def describe_nodes(nodes: Sequence[Sequence[int]], names: Sequence[str], how: str) -> str:
    """One line: ``2 nodes of 2 ranks (declared by ...): node 0 = ranks 0-1, node 1 = ranks 2-3``."""
    sizes = {len(n) for n in nodes}
    shape = f"{len(nodes)} node{'s' * (len(nodes) != 1)}" + (f" of {len(nodes[0])} rank{'s' * (len(nodes[0]) != 1)}"
                                                           if len(sizes) == 1 else "")
    parts = []
    for i, (ranks, name) in enumerate(zip(nodes, names, strict=True)):
        label = f"node {i}" if name == f"node{i}" else f"node {i} ({name})"
        parts.append(f"{label} = rank{'s' * (len(ranks) != 1)} {_span(ranks)}")
    return f"{shape} ({how}): " + ", ".join(parts)


class MpiLock:
    """The lock every circuslink MPI call holds (MPI runs at THREAD_SERIALIZED). A reentrant lock of Python's,
    joined by a native one once compiled code calls MPI from its own thread (:meth:`attach`: the mpi transport's
    progress thread takes the native lock around its calls; Python's holders take it too)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # nesting of the thread that holds it
        self._native: tuple[Any, Any] | None = None

    def attach(self, acquire: Any, release: Any) -> None:
        """Take ``acquire()`` / ``release()`` (a native mutex) on every outermost acquisition from now on."""
        with self._lock:
            if self._native is None:
                self._native = (acquire, release)

    def __enter__(self) -> MpiLock:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1 and self._native is not None:
            self._native[0]()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._native is not None:
            self._native[1]()
        self._lock.release()


class MpiSession:
    """The job's MPI, initialised once by the world's bootstrap (mpi4py, THREAD_SERIALIZED): ``MPI`` (the
    module), ``comm`` (COMM_WORLD) and ``lock`` (:class:`MpiLock`, held around every circuslink MPI call that may
    overlap another thread's)."""

    def __init__(self, mpi_module: Any, comm: Any) -> None:
        self.MPI = mpi_module
        self.comm = comm
        self.lock = MpiLock()


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
        mpi: MpiSession | None = None,
        layout: tuple[list[list[int]], list[str], str] | None = None,
    ) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.job_id = job_id
        self.launched_by = launched_by
        self._boot = Bootstrap(rank, size, local_rank, local_size, job_id, store)
        self._hosted_store = hosted_store
        self._mpi = mpi
        # Held around every MPI call circuslink makes from a thread other than the main one (the mpi transport's
        # progress thread) and around the main thread's calls that may overlap it: MPI runs SERIALIZED.
        self.mpi_lock = self._mpi.lock if self._mpi is not None else MpiLock()
        self._closed = False
        self._resources: list = []  # live Resources (circuslink._lifecycle), closed newest first by close()
        self._registries: dict[str, Any] = {}  # per-world state of subsystems (see registry())
        self._nodes, self._node_names, self._node_how = layout or _job_layout(size, None)
        self._node_index = [0] * size
        for i, ranks in enumerate(self._nodes):
            for r in ranks:
                self._node_index[r] = i
        self._declared_nodes = self._node_how.startswith("declared")
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

    def backend_module(self, package: str):
        """This world's back-end module of a subsystem (``world.backend_module("circuslink.rma")``: ``rma._cuda``)."""
        return self.backend.module(package)

    @property
    def mpi(self) -> MpiSession | None:
        """The job's MPI (:class:`MpiSession`) when started by mpirun, else None."""
        return self._mpi

    @property
    def mpi_comm(self):
        """mpi4py's COMM_WORLD when started by mpirun, else None."""
        return self._mpi.comm if self._mpi is not None else None

    def __repr__(self) -> str:
        return (
            f"World(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, node={self.node}, "
            f"backend={self.backend.name!r}, device={self.device})"
        )

    # -- nodes --------------------------------------------------------------------------------
    @property
    def node(self) -> int:
        """This rank's node index (nodes numbered by their lowest rank)."""
        return self._node_index[self.rank]

    @property
    def nodes(self) -> list[list[int]]:
        """Every node's ranks, ascending: ``world.nodes[world.node]`` holds this rank."""
        return [list(ranks) for ranks in self._nodes]

    @property
    def node_names(self) -> list[str]:
        """The nodes' names: host names, or ``node0``, ``node1``... for declared nodes."""
        return list(self._node_names)

    @property
    def node_rank(self) -> int:
        """This rank's index inside its node."""
        return self._nodes[self.node].index(self.rank)

    @property
    def nodes_declared(self) -> bool:
        """True when node boundaries come from ``CIRCUSLINK_RANKS_PER_NODE`` (``--ranks-per-node``), not hosts."""
        return self._declared_nodes

    def node_of(self, rank: int) -> int:
        """The node index of ``rank``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ConfigError(f"node_of: rank {rank!r} is out of range for a world of {self.size} ranks")
        return self._node_index[rank]

    def describe_nodes(self) -> str:
        """One line naming the nodes and their ranks (what ``circuslink run`` and ``info`` print)."""
        return describe_nodes(self._nodes, self._node_names, self._node_how)

    def check_mappable(self, peers: Iterable[int] | None = None, what: str = "alloc") -> list[int]:
        """The ranks whose memory this rank may map: ``peers`` (None: every rank of this rank's node),
        sorted. Memory is mapped only inside a node, so a peer in another node raises one line naming it,
        its node and how the nodes were formed (``what`` names the caller: ``alloc``, ``peer view``...)."""
        if peers is None:
            return list(self._nodes[self.node])
        out = set()
        for p in peers:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self.size:
                raise ConfigError(f"{what}: peer {p!r} is not a rank of this world of {self.size} ranks")
            if self._node_index[p] != self.node:
                raise ConfigError(
                    f"{what}: rank {self.rank} (node {self.node}) cannot map the memory of rank {p}, which is on "
                    f"node {self._node_index[p]} (nodes {self._node_how}): memory is mapped only inside a node; "
                    "traffic between nodes goes through gateway ranks over a transport, docs/scale.md")
            out.add(int(p))
        return sorted(out)

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
        if len(self._nodes) > 1 and not self._declared_nodes:
            # Ranks on other hosts cannot be mapped at all: say so before the back-end tries. (Declared
            # nodes on one machine still map; the routed channels map only their neighbours.)
            self.check_mappable(range(self.size) if wanted is None else wanted, "alloc")
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
            if self._mpi is not None:
                # Under mpirun rank 0 hosts the store: a peer may still be reading the last
                # barrier's reply when rank 0 would close it, so wait on MPI, bounded, first.
                _bounded_mpi_barrier(self._mpi.comm, resolve_timeout(timeout), self.rank, self.mpi_lock)
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


def _bounded_mpi_barrier(comm, timeout: float, rank: int, lock) -> None:
    from ._wait import wait_until

    def test() -> bool:
        with lock:
            return request.Test()

    with lock:
        request = comm.Ibarrier()
    wait_until(test, timeout, f"the closing MPI barrier on rank {rank}")


_failing = False


def _note_failure(exc_type, exc, tb, _previous=None) -> None:
    global _failing
    _failing = True  # an unhandled error: exit now, do not wait in close() for peers
    (_previous or sys.__excepthook__)(exc_type, exc, tb)
    world = _current
    if world is not None and world._mpi is not None and world.size > 1:
        # Under mpirun a rank that leaves with an error would wait in MPI_Finalize for peers that wait for
        # it: abort the job instead, now, naming the rank (mpirun names it too).
        where = f" (node {world.node})" if len(world._nodes) > 1 else ""
        sys.stderr.write(f"circuslink: rank {world.rank}{where} failed ({exc_type.__name__}: {exc}); aborting the "
                         "MPI job\n")
        sys.stderr.flush()
        world._mpi.comm.Abort(1)


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
        layout = _job_layout(size, None)  # the launcher starts every rank on its own host
        store = _store.StoreClient(env["CIRCUSLINK_STORE"], env["CIRCUSLINK_STORE_TOKEN"], connect_timeout)
        world = World(
            rank, size, rank if local_rank is None else local_rank, size if local_size is None else local_size,
            env.get("CIRCUSLINK_JOB_ID", "job"), store, backend, "circuslink run", layout=layout,
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
        os.environ[mps.ENV_SHARE] = mps.rank_share(-(-local // gpus), env)


def _init_from_mpi(env: dict[str, str], backend: str | None, connect_timeout: float) -> World:
    try:
        import mpi4py

        # One thread at a time talks to MPI: the main thread, and the mpi transport's progress thread
        # under world.mpi_lock (MpiLock). THREAD_MULTIPLE, mpi4py's default, makes Open MPI
        # 4.1 refuse one-sided windows on some builds (MPI_ERR_WIN); SERIALIZED takes no locks either.
        mpi4py.rc.thread_level = "serialized"
        from mpi4py import MPI
    except ImportError:
        raise ConfigError(
            "this process was started by mpirun but mpi4py is not installed: "
            "pip install mpi4py, or start the job with 'circuslink run'"
        ) from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # Nodes are hosts unless CIRCUSLINK_RANKS_PER_NODE declares them; a bad value fails here, on every rank alike.
    layout = _job_layout(size, comm.allgather(socket.gethostname()))
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    hosted = None
    if rank == 0:
        host = "127.0.0.1" if local_size == size else socket.gethostname()
        hosted = _store.StoreServer(host="0.0.0.0" if host != "127.0.0.1" else host)
        # The launcher that started mpirun names the job, so that it can remove what ranks leave behind.
        info = (f"{host}:{hosted.address.rsplit(':', 1)[1]}", hosted.token,
                env.get("CIRCUSLINK_MPIRUN_JOB_ID") or _store.new_job_id())
    else:
        info = None
    address, token, job_id = comm.bcast(info, root=0)
    import atexit

    atexit.register(_close_at_exit)  # Python's atexit runs before mpi4py's MPI_Finalize
    previous = sys.excepthook
    sys.excepthook = lambda t, e, tb: _note_failure(t, e, tb, previous)
    store = _store.StoreClient(address, token, connect_timeout)
    session = MpiSession(MPI, comm)
    return World(rank, size, local_rank, local_size, job_id, store, backend, "mpirun", hosted, session, layout)
