"""The nvshmem transport: device-initiated, between any two GPUs of a job (NVSHMEM's own transports: P2P inside a
node, IB / IBGDA between nodes); the default between nodes where NVSHMEM is installed and the ranks run kernels.

Its library (``nvshmem_proxy.cu``) is built with nvcc -rdc against the nvidia-nvshmem-cu13 package at first use
(cached by source hash, ``transport._build``) and loaded with ctypes; NVSHMEM is initialised once per process
with a unique id that rank 0 makes and the world's store carries (no MPI bootstrap needed, so it also runs
under ``circuslink run``).

* **Connections**: each side's inbox and signal words live in the symmetric heap; host ``put`` /
  ``put_with_signal`` / ``signal`` are NVSHMEM's on-stream operations on a stream of the connection (ordered
  after the caller's), ``flush`` a quiet on it. The device handle stores straight into the peer's inbox where
  NVSHMEM maps the peer (``nvshmem_ptr``: inside a node); elsewhere NVRTC-compiled kernels, which cannot link
  NVSHMEM's device library, get a proxied handle (they read their inbox and wait on their signals only).
* **Relays**: both rings of every relay live in the symmetric heap (the gateway's GPU memory), so the
  forwarding agent stores its packets locally; a proxy kernel (one block per relay, nvcc-built, sliced and
  relaunched by a host thread like the agent) puts them into the peer's in ring with NVSHMEM and signals the
  consumed counts back: no host in the loop per packet (docs/architecture.md, "The nvshmem transport").
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import _abi as abi
from .._lifecycle import Resource
from .._wait import Deadline, wait_until
from ..backends._resident import ResidentKernel
from ..errors import BackendError, TransportError
from . import _build
from ._base import HANDLE, MODE_PROXY, MODE_STORE, Capabilities, Connection, Context, Part, Scope, Transport
from ._relay import Relay, RelayGroup
from ._rings import relay_layouts

SOURCE = Path(__file__).with_name("nvshmem_proxy.cu")
_ARCH = "sm_90a"
_TYPES = "circuslink/detail/transport_types.cuh"
RELAY_ENTRY = abi.Struct("circuslink::transport::RelayEntry", _TYPES, [
    ("out_slots", abi.PTR), ("out_credit", abi.PTR), ("out_slot_credits", abi.PTR), ("out_send_error", abi.PTR),
    ("in_slots", abi.PTR), ("in_credit", abi.PTR), ("in_slot_credits", abi.PTR), ("in_recv_error", abi.PTR),
    ("peer_in_slots", abi.PTR),
    ("credit_from_peer", abi.PTR), ("credit_at_peer", abi.PTR), ("nslots", abi.U32), ("slot_bytes", abi.U32),
    ("chunk", abi.U32), ("batch", abi.U32), ("pe", abi.I32), ("pad", abi.U32)])
RELAY_STATE = abi.Struct("circuslink::transport::RelayState", _TYPES, [
    ("sent", abi.U64), ("reported", abi.U64), ("blocked_since", abi.U64), ("discarded", abi.U64), ("done", abi.U64),
    ("bye", abi.U64), ("consumed", abi.U64)])
PROXY_ARGS = abi.Struct("circuslink::transport::ProxyArgs", _TYPES, [
    ("relays", abi.PTR), ("state", abi.PTR), ("control", abi.PTR), ("claim", abi.PTR), ("abort", abi.PTR),
    ("timeout_ns", abi.U64),
    ("slice_ns", abi.U64), ("nrelays", abi.U32), ("rank", abi.U32)])
# ProxyArgs::control (transport_types.cuh: kProxy*)
_STOP, _CLOSING, _DISCARD, _ERROR, _ERR_RELAY, _ERR_SEQ_LO, _ERR_SEQ_HI = range(7)
_CONTROL_WORDS = 8
_ERRORS = {1: "rank {peer}'s in ring stayed full for {timeout:g} s (its agent stopped taking packets; packet {seq} "
              "waits to cross)",
           2: "packet {seq} in this rank's out ring has a corrupt header",
           3: "the host aborted the proxy kernel (a bounded wait for device work gave up)"}
MAX_BATCH = 64  # packets one proxy block puts before one quiet (the kernel's Decision::sizes)
SLICE_S = 0.005  # one launch of the proxy kernel, as the forwarding agent's
_HEAP_DEFAULT = 1 << 30  # NVSHMEM_SYMMETRIC_SIZE unless set: rings of relays carrying 64 MiB messages fit
_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}
_SIGNAL_ALIGN = 256


def _command(output: Path) -> list[str]:
    from ..device_code import include_dir

    nv = _build.find_nvshmem()
    return [_build.find_nvcc(), "-std=c++17", "-rdc=true", "-shared", "-Xcompiler", "-fPIC", f"-arch={_ARCH}", "-O2",
            f"-I{include_dir()}", f"-I{nv / 'include'}", str(SOURCE), "-o", str(output), *_build.nvshmem_link_args(nv)]


@functools.lru_cache(maxsize=1)
def _library() -> Any:
    path = _build.build_cached("transport", "libcircuslink_nvshmem", SOURCE, _command,
                               what="nvcc (the nvshmem transport's library)")
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    vp, u64, i32 = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int
    sig = {"circuslink_nvshmem_uid_size": (i32, []), "circuslink_nvshmem_get_uid": (i32, [vp]),
           "circuslink_nvshmem_init": (i32, [vp, i32, i32]), "circuslink_nvshmem_finalize": (None, []),
           "circuslink_nvshmem_malloc": (vp, [u64]), "circuslink_nvshmem_free": (None, [vp]),
           "circuslink_nvshmem_ptr": (vp, [vp, i32]), "circuslink_nvshmem_put": (i32, [vp, vp, u64, i32, vp]),
           "circuslink_nvshmem_put_signal": (i32, [vp, vp, u64, vp, u64, i32, vp]),
           "circuslink_nvshmem_signal": (i32, [vp, u64, i32, vp]), "circuslink_nvshmem_quiet": (i32, [vp]),
           "circuslink_nvshmem_proxy_launch": (i32, [vp, vp]), "circuslink_nvshmem_proxy_args_bytes": (i32, []),
           "circuslink_nvshmem_relay_entry_bytes": (i32, [])}
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if (lib.circuslink_nvshmem_proxy_args_bytes(), lib.circuslink_nvshmem_relay_entry_bytes()) != \
            (PROXY_ARGS.size, RELAY_ENTRY.size):
        raise BackendError(f"{path}: its structs differ from circuslink's tables; delete it to rebuild")
    return lib


_INIT = "circuslink.transport.nvshmem"  # World.registry key: NVSHMEM initialised for this world


class _Session(Resource):
    """NVSHMEM initialised for a world: finalised (collectively) when the world closes, after every symmetric
    allocation made later (the world closes its resources newest first); a failing rank leaves it to exit."""

    _kind = "NVSHMEM session"

    def __init__(self, world: Any, lib: Any) -> None:
        self.lib = lib
        self._register(world)

    def _close(self, timeout: float | None) -> None:
        self.lib.circuslink_nvshmem_finalize()


def _initialised(world: Any) -> Any:
    """Collective (the first time): build (rank 0 first), load and initialise NVSHMEM for this world's ranks."""
    state = world.registry(_INIT, dict)
    if "lib" in state:
        return state["lib"]
    if _library.cache_info().currsize and getattr(_library(), "_circuslink_used", False):
        raise TransportError("transport nvshmem: NVSHMEM was initialised for an earlier world of this process and "
                             "cannot be initialised again")
    error = None
    if world.rank == 0:
        try:
            _library()
        except (BackendError, OSError) as exc:
            error = str(exc).splitlines()[0]
    error = world.broadcast_object(error)
    if error:
        raise TransportError(f"transport nvshmem: {error}")
    for key, value in _NO_MULTICAST.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(_HEAP_DEFAULT))
    lib = _library()
    uid = ctypes.create_string_buffer(int(lib.circuslink_nvshmem_uid_size()))
    if world.rank == 0 and lib.circuslink_nvshmem_get_uid(uid) != 0:
        raise TransportError("transport nvshmem: nvshmemx_get_uniqueid failed")
    raw = world.broadcast_object(uid.raw)
    uid = ctypes.create_string_buffer(raw, len(raw))
    if lib.circuslink_nvshmem_init(uid, world.rank, world.size) != 0:
        raise TransportError(f"transport nvshmem: NVSHMEM's initialisation failed on rank {world.rank}")
    lib._circuslink_used = True
    _Session(world, lib)
    state["lib"] = lib
    return lib


class NvshmemTransport(Transport):
    capabilities = Capabilities(device_initiated=True, scope=Scope.NETWORK, mapped=False, compiled_relay=True)
    # bench/baselines/_nvshmem.py: one thread's put-with-signal (latency), block puts (bandwidth)
    baseline_rows = (("nvshmem-put-signal",), ("nvshmem-put-signal-block", "nvshmem-put-signal"))

    @classmethod
    def unavailable(cls, context: Context) -> str | None:
        if not context.runs_kernels:
            return "it needs a back-end that runs kernels (GPUs)"
        try:
            _build.find_nvshmem()
            _build.find_nvcc()
        except BackendError as exc:
            return str(exc)
        return None

    @classmethod
    def connect(cls, world: Any, peers: list[int], nbytes: int, nsignals: int,
                timeout: float) -> tuple[Part, dict[int, Connection]]:
        lib = _initialised(world)
        writers = world.allgather_object(peers, timeout)
        sig_bytes = -(-8 * nsignals // _SIGNAL_ALIGN) * _SIGNAL_ALIGN
        region = sig_bytes + -(-max(nbytes, 1) // _SIGNAL_ALIGN) * _SIGNAL_ALIGN
        most = max(1, max(len(w) for w in writers))
        part = _Symmetric(lib, world, timeout)
        base = part.alloc(most * region)
        conns = {p: NvshmemConnection(cls, world, p, nbytes, nsignals, timeout, lib, base, region, sig_bytes,
                                      writers[p].index(world.rank), writers[world.rank].index(p)) for p in peers}
        return part, conns

    @classmethod
    def open_relays(cls, world: Any, peers: list[int], geometry: Any, batch: int, timeout: float,
                    spin: bool) -> tuple[RelayGroup, dict[int, Relay]]:
        group = NvshmemRelays(cls, world, peers, geometry, min(batch, MAX_BATCH), timeout)
        return group, group.relays


class _Symmetric(Part):
    """Symmetric allocations of one connect() or open_relays(): freed collectively (nvshmem_free)."""

    def __init__(self, lib: Any, world: Any, timeout: float) -> None:
        self.lib = lib
        self.world = world
        self.timeout = timeout
        self.blocks: list[int] = []

    def alloc(self, nbytes: int) -> int:
        ptr = self.lib.circuslink_nvshmem_malloc(nbytes)  # collective
        if not ptr:
            raise TransportError(f"transport nvshmem: nvshmem_malloc of {nbytes} bytes failed on rank "
                                 f"{self.world.rank} (raise NVSHMEM_SYMMETRIC_SIZE, now "
                                 f"{os.environ.get('NVSHMEM_SYMMETRIC_SIZE')})")
        self.blocks.append(int(ptr))
        return int(ptr)

    def close(self, timeout: float | None) -> None:
        self.world.barrier(self.timeout if timeout is None else timeout)  # nobody puts into these any more
        for ptr in reversed(self.blocks):
            self.lib.circuslink_nvshmem_free(ptr)  # collective
        self.blocks = []

    def release_local(self) -> None:
        self.blocks = []  # nvshmem_free is collective: a failing rank leaves them to nvshmem_finalize


def _device_view(ptr: int, nbytes: int, owner: Any) -> Any:
    import cupy as cp

    mem = cp.cuda.UnownedMemory(ptr, nbytes, owner=owner)
    return cp.ndarray((nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))


class NvshmemConnection(Connection):
    """An nvshmem connection's end: regions in the symmetric heap (as the ipc transport lays them out); host
    operations on NVSHMEM's stream API."""

    def __init__(self, transport: type[Transport], world: Any, peer: int, nbytes: int, nsignals: int, timeout: float,
                 lib: Any, base: int, region: int, sig_bytes: int, there: int, here: int) -> None:
        import cupy as cp

        super().__init__(transport, world, peer, nbytes, nsignals, timeout)
        self._lib = lib
        self._remote = base + there * region  # my region at the peer (a symmetric address)
        self._local = base + here * region  # the peer's region here
        self._sig_bytes = sig_bytes
        self._stream = cp.cuda.Stream(non_blocking=True)
        self._inbox = _device_view(self._local + sig_bytes, max(nbytes, 1), self)[:nbytes]
        self._signals = _device_view(self._local, 8 * nsignals, self).view(cp.uint64)
        self._mapped = int(lib.circuslink_nvshmem_ptr(self._remote, peer) or 0)

    def _after_caller(self) -> Any:
        import cupy as cp

        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cp.cuda.get_current_stream())
        self._stream.wait_event(ready)
        return self._stream

    def _source(self, data: Any) -> Any:
        import cupy as cp

        src = data if hasattr(data, "__cuda_array_interface__") else cp.asarray(np.frombuffer(
            bytes(data) if isinstance(data, bytes | bytearray | memoryview) else np.ascontiguousarray(data).tobytes(),
            dtype=np.uint8))
        return cp.ascontiguousarray(src).reshape(-1).view(cp.uint8)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise TransportError(f"{self.describe()}: {what} failed (CUDA error {rc})")

    def put(self, offset: int, data: Any) -> None:
        src = self._source(data)
        self._check_range(offset, src.nbytes)
        if src.nbytes:
            self._check(self._lib.circuslink_nvshmem_put(self._remote + self._sig_bytes + offset, src.data.ptr,
                                                         src.nbytes, self.peer, self._after_caller().ptr), "put")
            self._keep = src  # alive until the stream has sent it (flush)

    def put_with_signal(self, offset: int, data: Any, index: int, value: int) -> None:
        self._check_index(index)
        src = self._source(data)
        self._check_range(offset, src.nbytes)
        self._check(self._lib.circuslink_nvshmem_put_signal(
            self._remote + self._sig_bytes + offset, src.data.ptr, src.nbytes, self._remote + 8 * index, value,
            self.peer, self._after_caller().ptr), "put with signal")
        self._keep = src

    def signal(self, index: int, value: int) -> None:
        self._check_index(index)
        self._check(self._lib.circuslink_nvshmem_signal(self._remote + 8 * index, value, self.peer,
                                                        self._after_caller().ptr), "signal")

    def signals(self) -> np.ndarray:
        return self._signals.get()

    def inbox(self) -> Any:
        return self._inbox

    def flush(self, timeout: float | None = None) -> None:
        self._check(self._lib.circuslink_nvshmem_quiet(self._stream.ptr), "quiet")
        self.world.backend.wait_stream(self._stream, self.timeout if timeout is None else timeout,
                                       lambda: f"{self.describe()}: flushing its puts")
        self._keep = None

    def device_handle(self) -> np.void:
        mode = MODE_STORE if self._mapped else MODE_PROXY
        remote = self._mapped + self._sig_bytes if self._mapped else 0
        return HANDLE.pack(remote=remote, remote_signals=self._mapped, local=self._local + self._sig_bytes,
                           local_signals=self._local, abort=self.world.backend.abort_ptr,
                           timeout_ns=int(self.timeout * 1e9), nbytes=self.nbytes, nsignals=self.nsignals, mode=mode,
                           rank=self.rank, peer=self.peer)


class NvshmemRelays(RelayGroup):
    """This rank's nvshmem relays: rings in the symmetric heap, the proxy kernel, the host thread relaunching it."""

    def __init__(self, transport: Any, world: Any, peers: list[int], geometry: Any, batch: int,
                 timeout: float) -> None:
        import cupy as cp

        from ..channels import protocol as P

        super().__init__(transport, world, geometry, timeout)
        lib = self._lib = _initialised(world)
        self._part = _Symmetric(lib, world, timeout)
        everyone = world.allgather_object(peers, timeout)
        out_lay, in_lay, stride = relay_layouts(geometry)
        most = max(1, max(len(p) for p in everyone))
        base = self._part.alloc(most * stride)
        credits = self._part.alloc(16 * most)  # per relay: the peer's consumed count, its goodbye
        self._running = False
        self._pump: ResidentKernel | None = None
        self.stream = cp.cuda.Stream(non_blocking=True)
        table = RELAY_ENTRY.array(max(1, len(peers)))
        for i, peer in enumerate(peers):
            mine, there = base + i * stride, base + everyone[peer].index(world.rank) * stride
            relay = Relay(self, peer, _device_view(mine, stride, self), mine)
            self.relays[peer] = relay
            table[i] = (mine + out_lay.ring, mine + out_lay.ctrl + P.CTRL_CREDIT, mine + out_lay.slot_credits,
                        mine + out_lay.ctrl + P.CTRL_SEND_ERROR, mine + in_lay.ring, mine + in_lay.ctrl + P.CTRL_CREDIT,
                        mine + in_lay.slot_credits, mine + in_lay.ctrl + P.CTRL_RECV_ERROR, there + in_lay.ring,
                        credits + 16 * i, credits + 16 * everyone[peer].index(world.rank), geometry.nslots,
                        geometry.slot_bytes, geometry.chunk, batch, peer, 0)
        self._peers = peers
        self.device_blocks = len(peers)  # the proxy kernel: one block per relay, always resident
        rt = cp.cuda.runtime
        self._control_ptr = rt.hostAlloc(4 * _CONTROL_WORDS, rt.hostAllocMapped)
        self.control = np.frombuffer((ctypes.c_uint32 * _CONTROL_WORDS).from_address(self._control_ptr), np.uint32)
        self.control[:] = 0
        with self.stream:
            self._table = cp.asarray(np.ascontiguousarray(table).view(np.uint8))
            self._state = cp.zeros(max(1, len(peers)) * RELAY_STATE.size, dtype=cp.uint8)
            self._claim = cp.zeros(1, dtype=cp.uint32)
        self._args = np.ascontiguousarray(PROXY_ARGS.pack(
            relays=self._table.data.ptr, state=self._state.data.ptr, control=self._control_ptr,
            claim=self._claim.data.ptr,
            abort=world.backend.abort_ptr, timeout_ns=int(timeout * 1e9), slice_ns=int(SLICE_S * 1e9),
            nrelays=len(peers), rank=world.rank))
        self.stream.synchronize()
        world.barrier(timeout)  # every rank's rings exist (zeroed) before any proxy puts into them
        if peers:
            self._running = True
            # resident like the forwarding agent (one mechanism: backends/_resident.py); its launches end by
            # themselves after a slice, so a device-wide synchronization waits at most one
            self._pump = ResidentKernel(world.backend, world.device, self.stream, self._launch,
                                        f"circuslink-nvshmem-proxy-{world.rank}", self._failed)

    def _launch(self) -> None:
        rc = self._lib.circuslink_nvshmem_proxy_launch(self._args.ctypes.data, self.stream.ptr)
        if rc:
            self.error = TransportError(f"relay (transport nvshmem) of rank {self.world.rank}: the proxy kernel "
                                        f"failed to launch (CUDA error {rc})")

    def _failed(self) -> bool:
        return self.control is None or bool(self.control[_ERROR]) or self.error is not None

    def check(self) -> None:
        if self.error is None and self.control is not None and self.control[_ERROR]:
            code, k = int(self.control[_ERROR]), int(self.control[_ERR_RELAY]) - 1
            seq = int(self.control[_ERR_SEQ_LO]) | int(self.control[_ERR_SEQ_HI]) << 32
            peer = self._peers[k] if 0 <= k < len(self._peers) else -1
            text = _ERRORS.get(code, "failed (code {code})").format(peer=peer, seq=seq, timeout=self.timeout, code=code)
            self.error = TransportError(f"{self.relays[peer].describe() if peer >= 0 else 'relay'}: {text}")
        super().check()

    def discard_incoming(self) -> None:
        if self.control is not None:
            self.control[_DISCARD] = 1

    def close(self, timeout: float | None) -> None:
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        try:
            if self._running:
                self.control[_CLOSING] = 1
                wait_until(lambda: self._all_done() or bool(self.control[_ERROR]), deadline.remaining() + 1.0,
                           lambda: f"the nvshmem proxy of rank {self.world.rank} closing its relays", None)
            self.check()
        finally:
            self._stop(deadline.remaining() + 1.0)
            self._part.close(deadline.remaining() + 1.0)
            self._free()

    def _all_done(self) -> bool:
        """Every relay has exchanged goodbyes and taken all the peer sent (RelayState::done, read from the device
        on a stream of its own while the proxy runs)."""
        import cupy as cp

        with cp.cuda.Stream(non_blocking=True) as side:
            state = self._state.get(stream=side)
        return bool(np.all(state.view(RELAY_STATE.dtype)["done"][:len(self._peers)]))

    def release_local(self) -> None:
        from ..errors import TimeoutError

        try:
            self._stop(2.0)
        except TimeoutError:
            return  # a proxy still running: its control words stay allocated (a leak, not a corruption)
        self._part.release_local()
        self._free()

    def _stop(self, timeout: float) -> None:
        if self.control is not None:
            self.control[_STOP] = 1
        self._running = False
        if self._pump is not None:
            self._pump.stop(max(timeout, 0.1))
        self.world.backend.wait_stream(self.stream, timeout, f"the nvshmem proxy of rank {self.world.rank}: it did "
                                                             "not stop")

    def _free(self) -> None:
        if self._control_ptr:
            import cupy as cp

            self.control = None
            cp.cuda.runtime.freeHost(self._control_ptr)
            self._control_ptr = 0
