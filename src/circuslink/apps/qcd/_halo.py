"""Halo exchanges: one interface, seven ways to move the faces of a spinor field to the neighbouring ranks.

Every exchange owns a send array and a ghost array, both ``(6, S)`` complex (the layout of ``_lattice``): the
kernel that produces a field writes its projected faces into ``send``; ``start()`` sends them; ``wait()``
returns ``ghost`` once every neighbour's faces have arrived. The operator does not know which exchange it has
(the device-driven one says ``device_driven`` and hands its queue to the dslash kernel instead).

=============  ==================================================================================================
``rma``        circuslink RMA queue (host-driven): one block-stride write per face (6 component blocks, strided
               by S in the send and in the ghost array: no packing), declared and committed once
``rma-device`` the same queue, started and waited on by the dslash kernel itself (``circuslink::rma_start`` /
               ``rma_wait``): no host call per hop (cuda)
``transport``  Connections to the neighbours (``circuslink.transport``, chosen by capability: ipc inside a node,
               nvshmem or mpi between nodes): a put per face component, a signal per face
``mpi-p2p``    MPI persistent point-to-point (``Send_init`` / ``Recv_init`` with vector datatypes,
               ``Startall`` / ``Waitall``), host-staged on the GPU (needs mpirun)
``mpi-rma``    the same RMA queue on ``window_alloc(..., memory="mpi3")``: MPI-3 ``MPI_Put`` in PSCW epochs
               (needs mpirun)
``nvshmem``    NVSHMEM puts with a signal per face, from a small shared library built with nvcc at first use
               (cuda; see ``_nvshmem_halo``)
``nccl``       NCCL grouped send/recv (cuda, one GPU per rank)
=============  ==================================================================================================
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..._lifecycle import Resource
from ...errors import ConfigError
from ._lattice import Lattice

HALO_EXCHANGES = ("rma", "rma-device", "transport", "mpi-p2p", "mpi-rma", "nvshmem", "nccl")
NEEDS_MPIRUN = ("mpi-p2p", "mpi-rma")
NEEDS_GPU = ("rma-device", "nvshmem", "nccl")


def check_exchange(name: str) -> str:
    if name not in HALO_EXCHANGES:
        raise ConfigError(f"--halo {name!r}: choose one of {', '.join(HALO_EXCHANGES)}")
    return name


def make_halo(name: str, world: Any, lattice: Lattice, dtype: Any) -> Halo | None:
    """Collective: the halo exchange ``name`` for fields of ``dtype``; None when no direction is partitioned."""
    check_exchange(name)
    if lattice.face_total == 0:
        return None  # one rank in every direction: nothing travels, any exchange will do
    if name in NEEDS_MPIRUN and world.mpi_comm is None:
        raise ConfigError(f"--halo {name} needs a job started by mpirun (MPI's COMM_WORLD); this one was started "
                          f"by {world.launched_by}: run it with mpirun, or let 'circuslink qcd' start itself")
    if name in NEEDS_GPU and world.device is None:
        raise ConfigError(f"--halo {name} needs the cuda back-end (GPU memory); this job runs on "
                          f"{world.backend.name}")
    if name in ("rma", "rma-device"):
        return RmaHalo(world, lattice, dtype, "mapped", device_driven=name == "rma-device")
    if name == "mpi-rma":
        return RmaHalo(world, lattice, dtype, "mpi3")
    if name == "mpi-p2p":
        return MpiP2PHalo(world, lattice, dtype)
    if name == "transport":
        return ConnectionHalo(world, lattice, dtype)
    if name == "nccl":
        from ._halo_cuda import NcclHalo

        return NcclHalo(world, lattice, dtype)
    from ._halo_cuda import NvshmemHalo

    return NvshmemHalo(world, lattice, dtype)


def transfers(lattice: Lattice) -> list[tuple[int, int, int, int]]:
    """(slot offset, face sites, destination rank, source rank) of every face I send and receive.

    Slot (mu, 0) of a ghost array is filled by my forward neighbour (from its x_mu = 0 sites), so the slot
    (mu, 0) of my send array goes to my backward neighbour; slot (mu, 1) the other way round."""
    out = []
    for mu, d in lattice.slots:
        dst = lattice.backward[mu] if d == 0 else lattice.forward[mu]
        src = lattice.forward[mu] if d == 0 else lattice.backward[mu]
        out.append((lattice.slot_offset[(mu, d)], lattice.face_sites[mu], dst, src))
    return out


class Halo(Resource):
    """What every exchange provides: ``send``, ``start()``, ``wait() -> ghost``, ``wait_seconds``."""

    name = "halo"
    device_driven = False
    _kind = "halo exchange"

    def __init__(self, world: Any, lattice: Lattice, dtype: Any) -> None:
        self.world = world
        self.lat = lattice
        self.dtype = np.dtype(dtype)
        self.faces = lattice.face_total
        self.wait_seconds = 0.0  # host time spent in wait(): the share of a solve spent waiting on halos
        self.exchanges = 0
        self._register(world)

    def start(self) -> None:
        raise NotImplementedError

    def wait(self):
        raise NotImplementedError

    def _timed_wait(self, wait) -> Any:
        t0 = time.perf_counter()
        out = wait()
        self.wait_seconds += time.perf_counter() - t0
        self.exchanges += 1
        return out


class RmaHalo(Halo):
    """Faces through one circuslink RMA queue: a block-stride write per face, committed once.

    The window holds ``[send (6, S) | ghost (6, S)]``. Face (mu, d) of the send array is 6 blocks (one per
    spin-colour component) of ``n`` complex numbers, ``S`` apart; it lands in the same slot of the
    neighbour's ghost array, also ``S`` apart: one ``declare_strided_write``, no packing. ``memory="mpi3"``
    makes it MPI-3 RMA (the mpi-rma exchange)."""

    def __init__(self, world: Any, lattice: Lattice, dtype: Any, memory: str, device_driven: bool = False) -> None:
        super().__init__(world, lattice, dtype)
        from ... import rma

        self.name = "mpi-rma" if memory == "mpi3" else ("rma-device" if device_driven else "rma")
        self.device_driven = device_driven
        item = self.dtype.itemsize
        S = self.faces
        region = 6 * S * item
        self.window = rma.window_alloc(world, 2 * region, memory=memory)
        fields = self.window.view(self.dtype)
        self.send = fields[: 6 * S].reshape(6, S)
        self.ghost = fields[6 * S: 12 * S].reshape(6, S)
        self.queue = rma.Queue.alloc(self.window)
        origins = set()
        for offset, n, dst, src in transfers(lattice):
            self.queue.push(rma.declare_strided_write(self.window, region + offset * item, self.window, offset * item,
                                                      6, n * item, S * item, S * item, dst))
            origins.add(src)
        for o in sorted(origins):
            self.queue.add_origin(o)
        self.queue.commit()
        self._direct: DirectFaces | None = None

    def start(self) -> None:
        self.queue.start()

    def wait(self):
        self._timed_wait(self.queue.wait)
        return self.ghost

    def device_handle(self) -> Any:
        """The queue's ``circuslink::RmaHandle`` (a numpy scalar the dslash kernel takes by value)."""
        return self.queue.device_handle()

    def direct_faces(self) -> DirectFaces:
        """Collective (the first call): the faces written straight into the neighbours' ghosts (see
        :class:`DirectFaces`), on a window and a signal-only queue of their own."""
        if self._direct is None:
            self._direct = DirectFaces(self.world, self.lat, 6 * self.faces * self.dtype.itemsize)
        return self._direct

    def check_device(self) -> None:
        self.queue.check_device()
        if self._direct is not None:
            self._direct.queue.check_device()

    def _close(self, timeout: float | None) -> None:
        self.send = self.ghost = None
        if self._direct is not None:
            self._direct.window.free(timeout)
        self.window.free(timeout)

    def _release_local(self) -> None:
        self.send = self.ghost = None


class DirectFaces:
    """A device-resident CG's faces without a copy (QUDA's remote write): the kernel that computes a hop's
    output writes its faces straight into the neighbours' ghost arrays (mapped here, ``Window.peer``) and a
    signal-only queue (``Queue.add_target``) only tells them, after the grid barrier that ends the writes.

    The window holds two ghost halves, ``(6, S)`` each; hop ``h`` of the CG's four reads half ``h & 1`` and
    writes the next hop's faces into the neighbours' half ``(h + 1) & 1``, p's (for hop 0) into half 0. Two are
    enough: a rank writes a half only after waiting for the neighbour's faces of the hop after the one that last
    read it, which the neighbour signals once that read is done."""

    def __init__(self, world: Any, lattice: Lattice, region: int) -> None:
        from ... import rma

        self.region = region
        self.window = rma.window_alloc(world, 2 * region)
        self.queue = rma.Queue.alloc(self.window)
        plan = transfers(lattice)
        for t in sorted({dst for _, _, dst, _ in plan}):
            self.queue.add_target(t)
        for o in sorted({src for _, _, _, src in plan}):
            self.queue.add_origin(o)
        self.queue.commit()
        # slot (mu, d) of my faces feeds the same slot of rank dst's ghost array (transfers)
        self._to = {2 * mu + d: dst for ((mu, d), (_, _, dst, _)) in zip(lattice.slots, plan, strict=True)}
        self._peer = {r: int(self.window.peer(r).data.ptr) for r in set(self._to.values())}
        self._local = int(self.window.local.data.ptr)

    def ghost(self, half: int) -> int:
        """The address of my ghost half ``half``."""
        return self._local + half * self.region

    def face_to(self, half: int) -> list[int]:
        """Per slot (index 2 mu + d), the address of the ghost half ``half`` that slot's faces go to (0 where
        the direction is not split)."""
        return [self._peer[self._to[k]] + half * self.region if k in self._to else 0 for k in range(8)]

    def device_handle(self) -> Any:
        return self.queue.device_handle()


class ConnectionHalo(Halo):
    """Faces through Connections (``circuslink.transport``): to each neighbour, the 6 component blocks of a face
    (``n`` complex numbers each, ``S`` apart in the send array) are puts into its inbox, laid out as the ghost
    array, the last one with the face's signal set to the epoch; ``wait()`` waits for every incoming face's
    signal and copies the blocks into the ghost array. Two inbox halves alternate by epoch parity: a neighbour is
    at most one epoch ahead (its next faces follow my next start, which follows my last read)."""

    name = "transport"

    def __init__(self, world: Any, lattice: Lattice, dtype: Any) -> None:
        super().__init__(world, lattice, dtype)
        from ... import transport

        self.plan = transfers(lattice)
        S, xp = self.faces, world.xp
        self.region = 6 * S * self.dtype.itemsize
        peers = sorted({t[2] for t in self.plan} | {t[3] for t in self.plan})
        # slot k of my ghost array is filled by the rank that sends its slot k to me: signal k on that connection
        self.group = transport.connect(world, peers, nbytes=2 * self.region, nsignals=max(1, len(self.plan)))
        self.send = xp.zeros((6, S), dtype=self.dtype)
        self.ghost = xp.zeros((6, S), dtype=self.dtype)
        self.epoch = 0

    def start(self) -> None:
        self.epoch += 1
        half, item, S = (self.epoch & 1) * self.region, self.dtype.itemsize, self.faces
        for k, (offset, n, dst, _) in enumerate(self.plan):
            conn = self.group[dst]
            for c in range(6):
                block = self.send[c, offset:offset + n]
                at = half + (c * S + offset) * item
                if c < 5:
                    conn.put(at, block)
                else:
                    conn.put_with_signal(at, block, k, self.epoch)

    def wait(self):
        def arrive() -> None:
            half, item, S, xp = (self.epoch & 1) * self.region, self.dtype.itemsize, self.faces, self.world.xp
            for k, (offset, n, _, src) in enumerate(self.plan):
                conn = self.group[src]
                conn.wait(k, self.epoch)
                inbox = conn.inbox()
                for c in range(6):
                    at = half + (c * S + offset) * item
                    self.ghost[c, offset:offset + n] = xp.asarray(inbox[at:at + n * item]).view(self.dtype)
            for conn in self.group.connections.values():
                conn.flush()  # my faces have left: the send array may be written again

        self._timed_wait(arrive)
        return self.ghost

    def _close(self, timeout: float | None) -> None:
        self.send = self.ghost = None
        self.group.close(timeout)

    def _release_local(self) -> None:
        self.send = self.ghost = None
        self.group.release_local()


class MpiP2PHalo(Halo):
    """MPI persistent point-to-point: one ``Send_init`` / ``Recv_init`` per face, on host buffers.

    Each face is a vector datatype (6 blocks of ``2 n`` reals, stride ``2 S``), so nothing is packed by hand;
    on the GPU the whole send array is copied to the host before ``Startall`` and the ghost array back after
    ``Waitall`` (this Open MPI is not CUDA-aware: a user of it stages the same way)."""

    name = "mpi-p2p"

    def __init__(self, world: Any, lattice: Lattice, dtype: Any) -> None:
        super().__init__(world, lattice, dtype)
        MPI = self._mpi = world.mpi.MPI  # the world's bootstrap initialised MPI
        S = self.faces
        xp = world.xp
        self.send_host = np.zeros((6, S), dtype=self.dtype)
        self.ghost_host = np.zeros((6, S), dtype=self.dtype)
        self.on_device = xp is not np
        self.send = xp.zeros((6, S), dtype=self.dtype) if self.on_device else self.send_host
        self.ghost = xp.zeros((6, S), dtype=self.dtype) if self.on_device else self.ghost_host
        real = MPI.DOUBLE if self.dtype == np.complex128 else MPI.FLOAT
        comm = world.mpi_comm
        self.types = []
        self.requests = []
        send_reals = self.send_host.view(np.float64 if self.dtype == np.complex128 else np.float32).reshape(-1)
        ghost_reals = self.ghost_host.view(send_reals.dtype).reshape(-1)
        for slot, (offset, n, dst, src) in enumerate(transfers(lattice)):
            vec = real.Create_vector(6, 2 * n, 2 * S).Commit()
            self.types.append(vec)
            # Tag = slot: with two ranks in a direction both faces of that direction go to the same peer.
            self.requests.append(comm.Recv_init([ghost_reals[2 * offset:], 1, vec], src, tag=slot))
            self.requests.append(comm.Send_init([send_reals[2 * offset:], 1, vec], dst, tag=slot))
        self._started = False

    def start(self) -> None:
        if self.on_device:
            self.world.xp.cuda.get_current_stream().synchronize()  # the faces were written on it
            self.send.get(out=self.send_host)
        self._mpi.Prequest.Startall(self.requests)
        self._started = True

    def wait(self):
        from ..._wait import Deadline
        from ...rma._mpi import poll_request

        def finish() -> None:
            lat = self.lat
            deadline = Deadline.after(None)  # one limit for the whole exchange
            for r in self.requests:
                poll_request(r, deadline, lambda: (
                    f"qcd halo mpi-p2p on rank {lat.rank}: MPI_Wait waiting for neighbour rank(s) "
                    f"{', '.join(map(str, sorted({t[3] for t in transfers(lat)})))}"))

        self._timed_wait(finish)
        self._started = False
        if self.on_device:
            self.ghost.set(self.ghost_host)
        return self.ghost

    def _close(self, timeout: float | None) -> None:
        for r in self.requests:
            r.Free()
        for t in self.types:
            t.Free()
        self.requests, self.types = [], []
        self.world.barrier(timeout)

    def _release_local(self) -> None:
        self.requests, self.types = [], []
