"""The mpi transport: the portable one, between any two ranks of a job started by mpirun; proxied.

Every byte goes through MPI point-to-point on a duplicated communicator, moved by a **compiled progress
thread** (``mpi_progress.cpp``, built on first use with mpicxx, or a C++ compiler with MPI's flags, and cached
under the user's cache folder by source hash): no packet and no put waits for Python's interpreter loop. Python
opens the memory, hands the thread the addresses, and reads its one-line failure. MPI stays at
THREAD_SERIALIZED: the thread and Python's MPI calls share one mutex (``world.mpi.lock`` joins the native one).

* **Connections**: each side's inbox and signal words are host memory (pinned and mapped into the GPU on cuda:
  kernels read the inbox and wait on the signals through the device handle); ``put`` copies the data into a
  staged buffer and returns, the thread sends it, the peer's thread lands it in its inbox and then sets the
  signal word. Device arrays are staged through the host (this MPI is not CUDA-aware).
* **Relays**: the rings live in host memory (pinned and mapped on cuda: the GPU agent stores its packets over
  PCIe, MPI sends from there with no copy, the peer receives in place); the thread batches packets into META /
  BULK messages under end-to-end credits, as docs/scale.md describes.

Failures are one line naming the link, both ranks and the transport (:class:`circuslink.TransportError`), e.g.
``link rank 0 <-> rank 2 (transport mpi): MPI error in sending packets 1..1 to rank 2: MPI_ERR_TRUNCATE: message
truncated (error class 15)``.
"""

from __future__ import annotations

import ctypes
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._wait import Deadline, wait_until
from ..errors import BackendError, TransportError
from . import _build
from ._base import HANDLE, MODE_PROXY, Capabilities, Connection, Context, Part, Scope, Transport, as_bytes
from ._relay import Relay, RelayGroup
from ._rings import relay_layouts

SOURCE = Path(__file__).with_name("mpi_progress.cpp")
_ERROR_BYTES = 1024
_SIGNAL_ALIGN = 256


def _command(output: Path) -> list[str]:
    cxx = _build.find_mpi_cxx()
    return [cxx[0], "-O2", "-std=c++17", "-shared", "-fPIC", "-pthread", "-DOMPI_SKIP_MPICXX=1",
            "-DMPICH_SKIP_MPICXX=1", *cxx[1:], str(SOURCE), "-o", str(output)]


@functools.lru_cache(maxsize=1)
def _library() -> Any:
    """The progress thread, built (once per source and command, cached) and loaded (once per process)."""
    path = _build.build_cached("transport", "libcircuslink_mpi", SOURCE, _command, what="the mpi transport's "
                               "progress thread")
    lib = ctypes.CDLL(str(path))
    vp, u64, u32, i32 = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_int
    sig = {
        "clm_abi_version": (i32, []), "clm_lock": (None, []), "clm_unlock": (None, []),
        "clm_progress_new": (vp, [ctypes.c_longlong, i32, ctypes.c_double, i32]),
        "clm_progress_add_relay": (i32, [vp, i32, vp, vp, vp, vp, vp, vp, vp, vp, u32, u32, u32]),
        "clm_progress_add_connection": (i32, [vp, i32, vp, u64, vp, u32]),
        "clm_progress_start": (i32, [vp]),
        "clm_put": (i32, [vp, i32, u64, vp, u64, u32, u64]),
        "clm_puts_pending": (u64, [vp]),
        "clm_progress_close": (None, [vp]), "clm_progress_discard": (None, [vp]), "clm_progress_finished": (i32, [vp]),
        "clm_progress_error": (i32, [vp, ctypes.c_char_p, i32]), "clm_progress_fail": (None, [vp, ctypes.c_char_p]),
        "clm_progress_stop": (None, [vp]), "clm_progress_free": (None, [vp]),
        "clm_progress_fault": (None, [vp, ctypes.c_long, i32]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if lib.clm_abi_version() != 2:
        raise BackendError(f"{path}: the mpi transport's progress thread has another ABI version; delete it to rebuild")
    return lib


class MpiTransport(Transport):
    capabilities = Capabilities(device_initiated=False, scope=Scope.NETWORK, mapped=False, compiled_relay=True)
    baseline_rows = (("mpi", "mpi-host-staged"), ("mpi", "mpi-host-staged"))  # bench/baselines/_mpi.py

    @classmethod
    def unavailable(cls, context: Context) -> str | None:
        if not context.under_mpi:
            return "it needs a job started by mpirun (MPI between the ranks)"
        try:
            _build.find_mpi_cxx()
        except BackendError as exc:
            return f"its progress thread cannot be built: {exc}"
        return None

    @classmethod
    def connect(cls, world: Any, peers: list[int], nbytes: int, nsignals: int,
                timeout: float) -> tuple[Part, dict[int, Connection]]:
        part = _MpiPart(cls, world, timeout, spin=False)
        try:
            conns = {}
            for peer in peers:
                conns[peer] = MpiConnection(cls, world, peer, nbytes, nsignals, timeout, part)
            part.start()
        except BaseException:
            part.release_local()
            raise
        return part, conns

    @classmethod
    def open_relays(cls, world: Any, peers: list[int], geometry: Any, batch: int, timeout: float,
                    spin: bool) -> tuple[RelayGroup, dict[int, Relay]]:
        group = _MpiRelays(cls, world, geometry, timeout)
        part = group.part = _MpiPart(cls, world, timeout, spin)
        try:
            _, _, stride = relay_layouts(geometry)
            if peers:
                part.memory.append(world.backend.host_memory(len(peers) * stride))
            for i, peer in enumerate(peers):
                mem = part.memory[0]
                relay = Relay(group, peer, mem.array[i * stride:(i + 1) * stride], mem.ptr + i * stride)
                group.relays[peer] = relay
                addr = int(relay.memory.ctypes.data)
                o, n = relay.out_ring.layout, relay.in_ring.layout
                from ..channels import protocol as P

                part.lib.clm_progress_add_relay(
                    part.progress, peer, addr + o.ring, addr + o.ctrl + P.CTRL_CREDIT, addr + o.slot_credits,
                    addr + o.ctrl + P.CTRL_SEND_ERROR, addr + n.ring, addr + n.ctrl + P.CTRL_CREDIT,
                    addr + n.slot_credits, addr + n.ctrl + P.CTRL_RECV_ERROR, geometry.nslots, geometry.chunk, batch)
            part.start()
        except BaseException:
            part.release_local()
            raise
        return group, group.relays


class _MpiPart(Part):
    """One progress thread (its thread, its duplicated communicator, its memory) of one connect() or
    open_relays() on this rank. Collective to make and to close, like the communicator."""

    def __init__(self, transport: type[Transport], world: Any, timeout: float, spin: bool) -> None:
        self.transport = transport
        self.world = world
        self.timeout = timeout
        self.memory: list[Any] = []
        self.progress = None
        self.comm = None
        self.lib = _library()
        session = world.mpi
        session.lock.attach(self.lib.clm_lock, self.lib.clm_unlock)
        with session.lock:
            self.comm = session.comm.Dup()  # collective; the transport's traffic never meets the user's
        self.progress = self.lib.clm_progress_new(self.comm.py2f(), world.rank, float(timeout), int(bool(spin)))
        self._started = False

    def start(self) -> None:
        if self.lib.clm_progress_start(self.progress) != 0:
            self.check()
        self._started = True
        self.world.barrier(self.timeout)  # every rank's thread has posted its receives

    def error(self) -> TransportError | None:
        if not self.progress:
            return None
        buf = ctypes.create_string_buffer(_ERROR_BYTES)
        if self.lib.clm_progress_error(self.progress, buf, _ERROR_BYTES):
            return TransportError(buf.value.decode(errors="replace"))
        return None

    def check(self) -> None:
        error = self.error()
        if error is not None:
            raise error

    def close(self, timeout: float | None) -> None:
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        try:
            if self._started:
                self.lib.clm_progress_close(self.progress)
                try:
                    wait_until(lambda: self.lib.clm_progress_finished(self.progress), deadline.remaining() + 1.0,
                               "the mpi transport's progress thread closing")
                except Exception:
                    what = f"mpi transport progress of rank {self.world.rank}: closing did not finish within " \
                           f"{deadline.limit:g} s"
                    self.lib.clm_progress_fail(self.progress, what.encode())
                    self._join_bounded()
            self.check()
        finally:
            self._free(collective=True)

    def release_local(self) -> None:
        if self.progress:
            self.lib.clm_progress_stop(self.progress)
            self._join_bounded()
        self._free(collective=False)

    def _join_bounded(self) -> None:
        limit = time.monotonic() + 2.0
        while self._started and not self.lib.clm_progress_finished(self.progress) and time.monotonic() < limit:
            time.sleep(1e-3)

    def _free(self, collective: bool) -> None:
        running = self._started and self.progress and not self.lib.clm_progress_finished(self.progress)
        if self.progress and not running:
            self.lib.clm_progress_free(self.progress)
            self.progress = None
        if self.comm is not None:
            if collective:
                with self.world.mpi.lock:
                    self.comm.Free()  # collective, like the Dup
            self.comm = None
        if not running:  # never free memory a running thread may still touch
            for mem in self.memory:
                mem.release()
            self.memory = []


class _MpiRelays(RelayGroup):
    part: _MpiPart

    def check(self) -> None:
        self.part.check()

    def discard_incoming(self) -> None:
        if self.part.progress:
            self.part.lib.clm_progress_discard(self.part.progress)

    def close(self, timeout: float | None) -> None:
        self.part.close(timeout)

    def release_local(self) -> None:
        self.part.release_local()

    def _inject_fault(self, nth_send: int, error_class: int) -> None:
        """Tests: this rank's ``nth_send``-th MPI send (1-based, every message) fails with ``error_class``."""
        self.part.lib.clm_progress_fault(self.part.progress, nth_send, error_class)


class MpiConnection(Connection):
    """An mpi connection's end: inbox and signal words in host memory, puts staged and sent by the thread."""

    def __init__(self, transport: type[Transport], world: Any, peer: int, nbytes: int, nsignals: int, timeout: float,
                 part: _MpiPart) -> None:
        super().__init__(transport, world, peer, nbytes, nsignals, timeout)
        self._part = part
        at = -(-max(nbytes, 1) // _SIGNAL_ALIGN) * _SIGNAL_ALIGN
        mem = world.backend.host_memory(at + 8 * nsignals)
        part.memory.append(mem)
        self._inbox = mem.array[:nbytes]
        self._signals = mem.array[at:at + 8 * nsignals].view("<u8")
        self._ptr = mem.ptr
        self._signals_ptr = mem.ptr + at
        part.lib.clm_progress_add_connection(part.progress, peer, int(mem.array.ctypes.data), nbytes,
                                           int(mem.array.ctypes.data) + at, nsignals)

    def _put(self, offset: int, data: Any, index: int, value: int) -> None:
        self.check()
        raw = as_bytes(data.get() if hasattr(data, "__cuda_array_interface__") else data)
        self._check_range(offset, len(raw))
        if self._part.lib.clm_put(self._part.progress, self.peer, offset, int(raw.ctypes.data) if len(raw) else None,
                                  len(raw), index, value) != 0:
            self.check()
            raise TransportError(f"{self.describe()}: the progress thread refused a put")

    def put(self, offset: int, data: Any) -> None:
        self._put(offset, data, 0, 0)

    def put_with_signal(self, offset: int, data: Any, index: int, value: int) -> None:
        self._check_index(index)
        self._put(offset, data, index + 1, value)

    def signal(self, index: int, value: int) -> None:
        self._check_index(index)
        self._put(0, b"", index + 1, value)

    def signals(self) -> np.ndarray:
        return self._signals.copy()

    def inbox(self) -> np.ndarray:
        return self._inbox

    def flush(self, timeout: float | None = None) -> None:
        wait_until(lambda: self._part.lib.clm_puts_pending(self._part.progress) == 0,
                   self.timeout if timeout is None else timeout, lambda: f"{self.describe()}: flushing its puts",
                   self.check)

    def check(self) -> None:
        self._part.check()

    def device_handle(self) -> np.void:
        return HANDLE.pack(remote=0, remote_signals=0, local=self._ptr, local_signals=self._signals_ptr,
                           abort=self.world.backend.abort_ptr, timeout_ns=int(self.timeout * 1e9), nbytes=self.nbytes,
                           nsignals=self.nsignals, mode=MODE_PROXY, rank=self.rank, peer=self.peer)
