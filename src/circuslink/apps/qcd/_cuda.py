"""The cuda back-end module of the distributed Wilson operator: the kernels of ``dslash.cu`` driven from the host.

Fields live on the GPU in the kernels' layout: one parity of a spinor field is ``(12 / W, Vh, W)`` complex
with ``W`` complex numbers per 16-byte vector (2 in single, 1 in double), so a thread loads its site with 6
float4 or 12 double2 loads, coalesced across the warp; the gauge field is ``(parity, mu, 9, Vh)``. Fields are
converted at the boundary (``from_half`` / ``to_half``); the vector updates of the solver do not care.

A hop with a halo exchange is: ``start()`` (the faces the previous kernel wrote leave), the interior kernel on
the caller's stream (the RMA copy runs on the world's stream meanwhile), ``wait()``, the exterior kernel
(ghost terms of the boundary sites, then the faces of the result for the next hop). With ``rma-device`` the
whole hop is one launch whose block 0 starts and waits on the queue itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..._abi import F64, I32, I64, PTR, U64, Struct
from ..._config import default_timeout
from ..._wait import Deadline
from ...errors import ConfigError, TimeoutError
from . import _cgstate as cg
from ._lattice import Lattice
from ._phases import NO_PHASES, PHASES

#: The kernels' argument block (include/circuslink/qcd/dslash_types.cuh), passed by value.
DSLASH_ARGS = Struct("circuslink::qcd::DslashArgs", "circuslink/qcd/dslash_types.cuh", [
    ("out", PTR), ("in", PTR), ("x", PTR), ("gauge", PTR), ("send", PTR), ("ghost", PTR), ("face_to", PTR, 8),
    ("sites", PTR),
    ("a", F64), ("b", F64), ("fwd_sign", F64, 4), ("bwd_sign", F64, 4),
    ("dims", I32, 4), ("face_offset", I32, 8), ("vh", I32), ("faces", I32), ("n_sites", I32), ("parity", I32),
    ("dagger", I32), ("emit", I32), ("partitioned", I32), ("has_x", I32),
])

#: The resident CG kernel's arguments (CgResidentArgs in the same header), passed by value.
CG_RESIDENT_ARGS = Struct("circuslink::qcd::CgResidentArgs", "circuslink/qcd/dslash_types.cuh", [
    ("hops", PTR), ("x", PTR), ("r", PTR), ("p", PTR), ("ap", PTR), ("precise_hops", PTR), ("y", PTR),
    ("rhs", PTR), ("precise_r", PTR), ("precise_ap", PTR), ("s", PTR), ("partial", PTR), ("done", PTR),
    ("phase_ns", PTR), ("peers", PTR), ("seq", PTR), ("status", PTR), ("n", I64), ("n_precise", I64),
    ("delta2", F64), ("timeout_ns", U64), ("rank", I32), ("size", I32), ("iterations", I32), ("halo", I32),
    ("updates", I32), ("split", I32), ("face_blocks", I32), ("direct", I32), ("one_pass", I32), ("gpu_scope", I32),
])
# CgStatus codes the resident kernel and qcd_cg_scalars record (two int32 after the scalars: _STATUS)
_CG_HALO_FAILED, _CG_BARRIER_FAILED, _CG_SUM_FAILED = 1, 2, 3
_STATUS = cg.SLOTS  # the state array's last double holds the status (code, peer): one read brings both back

_SOURCE = Path(__file__).with_name("dslash.cu")
THREADS = 256
_REDUCE_BLOCKS = 1024  # most blocks of a reduction launch (its partial sums)
#: dslash.cu's modules (CIRCUSLINK_QCD_KERNELS): each compiled on first use, so a single-precision run never
#: waits for NVRTC to build the double-precision kernels.
_PARTS = {"f": 1, "d": 2, "fd": 3}
_modules: dict[str, Any] = {}


def kernels(part: str = "f"):
    """The compiled module of ``part``: "f" (single precision), "d" (double) or "fd" (the resident CG that makes
    its reliable updates in double). One per process; NVRTC's cache makes later processes quick."""
    module = _modules.get(part)
    if module is None:
        from ...device_code import compile as compile_device

        module = _modules[part] = compile_device(_SOURCE.read_text(),
                                                 options=(f"-DCIRCUSLINK_QCD_KERNELS={_PARTS[part]}",))
    return module


def _ptr(a: Any) -> int:
    return 0 if a is None else int(a.data.ptr)


class EventPhases:
    """The time split on the GPU's timeline: each ``mark`` records a CUDA event on the current stream, and
    the time between consecutive events goes to the phase the first one opened (``_phases``). Nothing is
    read back until ``totals()``, which waits for the last event."""

    enabled = True

    def __init__(self) -> None:
        import cupy as cp

        self.cp = cp
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._marks: list[tuple[str | None, Any]] = []
        self._spare: list[Any] = []

    def mark(self, label: str | None) -> None:
        event = self._spare.pop() if self._spare else self.cp.cuda.Event()
        event.record(self.cp.cuda.get_current_stream())
        self._marks.append((label, event))

    def totals(self) -> dict[str, float]:
        self.mark(None)
        marks = self._marks
        marks[-1][1].synchronize()
        for (label, start), (_, end) in zip(marks, marks[1:], strict=False):
            if label is not None:
                self.seconds[label] += self.cp.cuda.get_elapsed_time(start, end) * 1e-3
        self._spare.extend(e for _, e in marks[:-1])
        self._marks = [marks[-1]]
        return dict(self.seconds)


Phases = EventPhases  # the time split of this back-end module: CUDA events


class Dslash:
    """``out = a x + b D_{p <- 1-p} in`` on the GPU, with halos from a halo exchange (or none)."""

    def __init__(self, world: Any, lattice: Lattice, gauge: Any, dtype: Any, halo: Any) -> None:
        import cupy as cp

        self.cp = cp
        self.world = world
        self.lat = lattice
        self.dtype = np.dtype(dtype)
        self.halo = halo
        single = self.dtype == np.complex64
        self.suffix = "f" if single else "d"
        self.width = 2 if single else 1
        self.real = np.float32 if single else np.float64
        module = kernels(self.suffix)
        get = module.get_function
        self.k_interior = get(f"qcd_dslash_interior_{self.suffix}")
        self.k_exterior = get(f"qcd_dslash_exterior_{self.suffix}")
        self.k_xpay_pack = get(f"qcd_xpay_pack_{self.suffix}")
        self.k_dot = get(f"qcd_dot_{self.suffix}")
        self.k_axpy_norm = get(f"qcd_axpy_norm_{self.suffix}")
        # The device-resident CG's kernels (loaded now: nothing may load while a CUDA graph is captured).
        self.k_axpy_norm_state = get(f"qcd_axpy_norm_state_{self.suffix}")
        self.k_xpay_pack_state = get(f"qcd_xpay_pack_state_{self.suffix}")
        self.k_cg_scalars = get("qcd_cg_scalars")
        self.k_cg_resident = get(f"qcd_cg_resident_{self.suffix}")
        self.k_cg_resident_local = get(f"qcd_cg_resident_local_{self.suffix}")
        self.cg_sums = None      # the slots of the CG's sums over ranks (symmetric memory), made by cg_state
        self.cg_base: dict[str, Any] = {}
        self.cg_other_halos: list[Any] = []  # the precise operator's, where the resident CG makes the updates
        self._recording: list[tuple[Any, Any]] | None = None
        self.wait_ns = int(default_timeout() * 1e9)
        vh = lattice.half
        # Reordered on the GPU: at 32^4 the field is 600 MB, seconds of numpy copies on the host.
        links = cp.ascontiguousarray(cp.moveaxis(cp.asarray(gauge), 0, 4))  # (T, Z, Y, X, mu, 3, 3)
        halves = lattice.split(links)
        del links
        packed = cp.stack([h.reshape(vh, 4, 9).transpose(1, 2, 0) for h in halves])  # (parity, mu, 9, Vh)
        del halves
        self.gauge = cp.ascontiguousarray(packed, dtype=self.dtype)
        del packed
        self.boundary = [cp.asarray(lattice.on_boundary(p)) for p in (0, 1)]
        offsets = [0] * 8
        for (mu, d), off in lattice.slot_offset.items():
            offsets[2 * mu + d] = off
        self.base = {
            "gauge": _ptr(self.gauge), "fwd_sign": lattice.forward_sign, "bwd_sign": lattice.backward_sign,
            "dims": lattice.local, "face_offset": offsets, "vh": vh, "faces": lattice.face_total,
            "partitioned": sum(1 << mu for mu in range(4) if lattice.partitioned[mu]), "emit": -1,
        }
        self.send_ptr = _ptr(halo.send) if halo is not None else 0
        self.phases = NO_PHASES
        self._args: dict[tuple, Any] = {}
        self.partial = cp.zeros(_REDUCE_BLOCKS, dtype=cp.float64)
        self.done = cp.zeros(1, dtype=cp.uint32)
        self.fused = None
        self._met = False  # whether a device-driven hop has met the peers (apply)
        if halo is not None and halo.device_driven:
            self.fused = get(f"qcd_dslash_device_{self.suffix}")
            try:
                resident = int(world.backend.max_blocks(self.fused, THREADS))
            except (AttributeError, TypeError):
                resident = int(world.sm_budget or 1)  # one block per SM is always resident
            self.fused_grid = max(1, min(resident, -(-vh // THREADS)))
            self.grid_barrier = cp.zeros(2, dtype=cp.uint32)
            self.status = cp.zeros(1, dtype=cp.int32)
            self.timeout_ns = np.uint64(int(default_timeout() * 1e9))

    # -- fields -----------------------------------------------------------------------------
    def new_field(self):
        return self.cp.zeros((12 // self.width, self.lat.half, self.width), dtype=self.dtype)

    def from_half(self, half: Any):
        """(Vh, 4, 3) -> the kernels' layout."""
        cp = self.cp
        h = cp.asarray(half).reshape(self.lat.half, 12 // self.width, self.width)
        return cp.ascontiguousarray(h.transpose(1, 0, 2), dtype=self.dtype)

    def to_half(self, field: Any):
        return field.transpose(1, 0, 2).reshape(self.lat.half, 4, 3)

    def site_reals(self, field: Any) -> tuple[Any, tuple[int, int]]:
        """A real view of ``field`` and the axes that hold one site's 24 reals (``(12 / W, Vh, 2 W)``)."""
        return field.view(self.real), (0, 2)

    # -- launches ---------------------------------------------------------------------------
    def _pack_args(self, key: tuple, **values: Any):
        """The argument block for ``values`` (cached: the CG reuses a handful of field combinations)."""
        args = self._args.get(key)
        if args is None:
            values.setdefault("face_to", [values.get("send", 0)] * 8)  # the faces written go to send
            args = DSLASH_ARGS.pack(**{**self.base, **values})
            if len(self._args) > 256:
                self._args.clear()
            self._args[key] = args
        return args

    def _hop_args(self, kind: str, out: Any, inp: Any, parity: int, dagger: bool, a: float, x: Any, b: float,
                  emit: bool | None, ghost: Any = None):
        sites = self.boundary[parity]
        key = (kind, _ptr(out), _ptr(inp), _ptr(x), parity, bool(dagger), a, b, emit, _ptr(ghost))
        return self._pack_args(key, out=_ptr(out), **{"in": _ptr(inp)}, x=_ptr(x), send=self.send_ptr,
                               ghost=_ptr(ghost), sites=_ptr(sites), n_sites=int(sites.size), a=a, b=b,
                               parity=parity, dagger=int(bool(dagger)), has_x=int(x is not None),
                               emit=-1 if emit is None else int(bool(emit)))

    @staticmethod
    def _blocks(n: int) -> int:
        return max(1, -(-n // THREADS))

    def apply(self, out: Any, inp: Any, parity: int, dagger: bool, a: float = 0.0, x: Any = None, b: float = 1.0,
              emit: bool | None = None) -> None:
        """``out = a x + b D_{parity <- 1-parity} inp``; see _cpu.Dslash.apply."""
        halo, phases = self.halo, self.phases
        interior = self._hop_args("interior", out, inp, parity, dagger, a, x, b, None)
        if self._recording is not None:  # the resident CG takes the hop's arguments instead of a launch
            ghost = halo.ghost if halo is not None else None
            self._recording.append((interior, self._hop_args("exterior", out, inp, parity, dagger, a, x, b, emit,
                                                             ghost)))
            return
        if halo is None:
            phases.mark("dslash")
            self.k_interior((self._blocks(self.lat.half),), (THREADS,), (interior,))
            return
        if self.fused is not None:
            # One kernel starts, waits for and applies the halo: its time is all dslash on the timeline.
            phases.mark("dslash")
            if not self._met:
                # The first such hop meets the peers on the host first. Ranks whose hops already waited on the
                # GPU for a late peer still setting up (its checkerboard split, CuPy loading kernels) stalled
                # until the time-out at 32^4 on 2x2x1x1 ranks under MPS, the late rank's setup not returning.
                self.world.barrier()
                self._met = True
            exterior = self._hop_args("exterior", out, inp, parity, dagger, a, x, b, emit, halo.ghost)
            self.fused((self.fused_grid,), (THREADS,),
                       (interior, exterior, halo.device_handle(), self.grid_barrier, self.timeout_ns,
                        self.status))
            halo.exchanges += 1  # the exchange happened inside the kernel: no host wait to count it
            return
        phases.mark("halo")
        halo.start()
        phases.mark("dslash")
        self.k_interior((self._blocks(self.lat.half),), (THREADS,), (interior,))
        phases.mark("halo")  # from the interior's end until the stream may use the ghosts
        ghost = halo.wait()
        phases.mark("dslash")
        exterior = self._hop_args("exterior", out, inp, parity, dagger, a, x, b, emit, ghost)
        n = int(self.boundary[parity].size)
        self.k_exterior((self._blocks(n),), (THREADS,), (exterior,))

    def pack(self, field: Any, parity: int, dagger: bool) -> None:
        """Project the faces of ``field`` (of ``parity``) for a next hop with ``dagger`` into the send array."""
        if self.halo is None:
            return
        sites = self.boundary[parity]
        args = self._pack_args(("pack", _ptr(field), parity, bool(dagger)), out=_ptr(field), **{"in": _ptr(field)},
                               send=self.send_ptr, sites=_ptr(sites), n_sites=int(sites.size), parity=parity,
                               dagger=int(bool(dagger)), has_x=0)
        self.k_xpay_pack((self._blocks(int(sites.size)),), (THREADS,), (args, np.float64(0.0)))

    def xpay_pack(self, p: Any, r: Any, beta: float, parity: int, dagger: bool) -> None:
        """``p = r + beta p`` and, in the same kernel, the faces of the new ``p``."""
        args = self._pack_args(("xpay", _ptr(p), _ptr(r), parity, bool(dagger)), out=_ptr(p), **{"in": _ptr(p)},
                               x=_ptr(r), send=self.send_ptr if self.halo is not None else 0, sites=0,
                               n_sites=0, parity=parity, dagger=int(bool(dagger)), has_x=1)
        self.k_xpay_pack((self._blocks(self.lat.half),), (THREADS,), (args, np.float64(beta)))

    # -- reductions (local parts: a 1-element float64 device array) ---------------------------
    def _reduce_grid(self, n: int) -> int:
        return max(1, min(_REDUCE_BLOCKS, -(-n // THREADS)))

    def redot(self, a: Any, b: Any):
        cp = self.cp
        result = cp.empty(1, dtype=cp.float64)
        ra, rb = a.reshape(-1).view(self.real), b.reshape(-1).view(self.real)
        n = int(ra.size)
        self.k_dot((self._reduce_grid(n),), (THREADS,), (ra, rb, np.int64(n), self.partial, self.done, result))
        return result

    def norm2(self, a: Any):
        return self.redot(a, a)

    def axpy_norm(self, x: Any, r: Any, p: Any, ap: Any, alpha: float):
        cp = self.cp
        result = cp.empty(1, dtype=cp.float64)
        views = [f.reshape(-1).view(self.real) for f in (x, r, p, ap)]
        n = int(views[0].size)
        self.k_axpy_norm((self._reduce_grid(n),), (THREADS,),
                         (*views, np.float64(alpha), np.int64(n), self.partial, self.done, result))
        return result

    # -- the device-resident CG (_cgstate): scalars in device memory, summed over ranks on the device ---------
    def cg_state(self):
        """Collective (the first time): the scalars' array, and the slots of the sums over ranks (two banks of
        {value, sequence number} per rank in symmetric memory: ``rank_sum`` in dslash.cu). The array has one
        double more than the scalars: the kernels' status (code, peer) as two int32, read back with them."""
        cp = self.cp
        if not self.cg_base:  # once per operator: every state array of it shares the sums' slots and clocks
            size = self.world.size
            self.cg_sums = self.world.alloc(2 * 2 * size * 8) if size > 1 else None
            ptrs = self.cg_sums.ptrs if self.cg_sums is not None else [0]
            self.cg_peers = cp.asarray(np.array(ptrs, dtype=np.uint64))
            self.cg_seq = cp.zeros(1, dtype=cp.uint64)
            # the phases' sums, then the dev trace's stamps (dslash.cu: CIRCUSLINK_QCD_DEV_TRACE)
            self.cg_phase_ns = cp.zeros(len(PHASES) + _TRACE_HOPS * len(_TRACE_EVENTS), dtype=cp.uint64)
            from ...channels import fences_at_gpu_scope

            # every rank on this GPU: the sums' release / acquire at .gpu scope (CIRCUSLINK_SYS_FENCES=1: .sys)
            gpu_scope = fences_at_gpu_scope(self.world.allgather_object(self.world.backend.device_identity))
            self.cg_base = {"peers": _ptr(self.cg_peers), "seq": _ptr(self.cg_seq), "partial": _ptr(self.partial),
                            "done": _ptr(self.done), "timeout_ns": self.wait_ns, "rank": self.world.rank,
                            "size": size, "gpu_scope": int(gpu_scope)}
        return cp.zeros(cg.SLOTS + 1, dtype=cp.float64)

    @staticmethod
    def _status_ptr(s: Any) -> int:
        return _ptr(s) + 8 * _STATUS

    def dot_into(self, a: Any, b: Any, s: Any) -> None:
        ra, rb = a.reshape(-1).view(self.real), b.reshape(-1).view(self.real)
        n = int(ra.size)
        self.k_dot((self._reduce_grid(n),), (THREADS,), (ra, rb, np.int64(n), self.partial, self.done, s))

    def cg_scalars(self, s: Any, step: int, delta2: float) -> None:
        args = CG_RESIDENT_ARGS.pack(**self.cg_base, s=_ptr(s), status=self._status_ptr(s), delta2=delta2)
        self.k_cg_scalars((1,), (32,), (args, np.int32(step), np.uint64(self.world.backend.abort_ptr)))

    def axpy_norm_state(self, x: Any, r: Any, p: Any, ap: Any, s: Any) -> None:
        views = [f.reshape(-1).view(self.real) for f in (x, r, p, ap)]
        n = int(views[0].size)
        self.k_axpy_norm_state((self._reduce_grid(n),), (THREADS,),
                               (*views, s, np.int64(n), self.partial, self.done))

    def _xpay_state_args(self, p: Any, r: Any, parity: int, dagger: bool):
        return self._pack_args(("xpay", _ptr(p), _ptr(r), parity, bool(dagger)), out=_ptr(p), **{"in": _ptr(p)},
                               x=_ptr(r), send=self.send_ptr if self.halo is not None else 0, sites=0,
                               n_sites=0, parity=parity, dagger=int(bool(dagger)), has_x=1)

    def xpay_pack_state(self, p: Any, r: Any, s: Any, parity: int, dagger: bool) -> None:
        args = self._xpay_state_args(p, r, parity, dagger)
        self.k_xpay_pack_state((self._blocks(self.lat.half),), (THREADS,), (args, s))

    def record(self, normal: Any, out: Any, inp: Any) -> list[tuple[Any, Any]]:
        """The hops of ``normal(out, inp)`` (an operator of this Dslash), recorded, not run: each hop's interior
        and exterior argument blocks."""
        self._recording = []
        try:
            normal(out, inp)
        finally:
            hops, self._recording = self._recording, None
        if len(hops) != 4:
            raise AssertionError(f"the normal operator made {len(hops)} hops, the resident CG runs 4")
        return hops

    def cg_resident(self, normal: Any, x: Any, r: Any, p: Any, ap: Any, s: Any, delta2: float, parity: int,
                    timed: bool, update: Any = None) -> ResidentCG | None:
        """The resident CG over these fields (``normal(ap, p)``: the operator's hops, recorded, not run), or
        None where the halos need the host between hops (host-driven exchanges). ``timed``: block 0 stamps
        the phases (a few globaltimer reads an iteration). ``update`` (the solver's ``PreciseSide``: the
        precise operator's Dslash and normal operator, y, rhs, r and A y): the kernel makes the reliable
        updates itself where a kernel for the two precisions exists (single iterations, double updates);
        elsewhere the host makes them."""
        if self.halo is not None and not self.halo.device_driven:
            return None
        if update is not None and (self.suffix + update.d.suffix not in _PARTS
                                   or (update.d.halo is not None and not update.d.halo.device_driven)):
            update = None
        return ResidentCG(self, self.record(normal, ap, p), x, r, p, ap, s, delta2, parity, timed, update)

    def read_state(self, s: Any) -> np.ndarray:
        """The scalars, after a bounded wait for the work queued so far (the one host wait of a batch)."""
        rank = self.world.rank
        # The kernel's own waits time out first and name what stalled (read below); the host's only backs them up.
        self.world.backend.wait_stream(self.cp.cuda.get_current_stream(), Deadline.behind_device(),
                                       lambda: f"qcd device-resident CG on rank {rank}: its kernels did not finish")
        if self.fused is not None:
            self.synchronize()  # a device-driven halo that timed out, named by its queue
        values = s.get()
        code, peer = (int(v) for v in values[_STATUS:].view(np.int32))
        if code:
            s[_STATUS:] = 0
            if code == _CG_HALO_FAILED:
                for halo in [self.halo, *self.cg_other_halos]:
                    if halo is not None:
                        halo.check_device()  # raises the queue's error, naming the rank that stalled
            what = {_CG_HALO_FAILED: "the RMA queue's start or wait",
                    _CG_BARRIER_FAILED: "a grid barrier between its phases",
                    _CG_SUM_FAILED: f"a global sum waiting for rank {peer}'s part"}.get(code, f"status {code}")
            raise TimeoutError(f"qcd device-resident CG on rank {rank}: {what} timed out "
                               "(CIRCUSLINK_TIMEOUT sets the limit)")
        return values[:cg.SLOTS]

    def write_state(self, s: Any, values: np.ndarray) -> None:
        s[:cg.SLOTS].set(np.asarray(values, dtype=np.float64))

    def synchronize(self) -> None:
        rank = self.world.rank
        self.world.backend.wait_stream(self.cp.cuda.get_current_stream(), Deadline.behind_device(),
                                       lambda: f"qcd on rank {rank}: its device work did not finish")
        if self.fused is not None:
            self.halo.check_device()  # a wait that timed out on the device, named by the queue
            code = int(self.status.get()[0])
            if code:
                self.status[...] = 0
                what = ("the RMA queue's start or wait" if code == 1
                        else "the grid barrier between interior and exterior")
                raise TimeoutError(f"qcd device-driven dslash on rank {self.world.rank}: {what} timed out "
                                   "(CIRCUSLINK_TIMEOUT sets the limit)")

    def close(self) -> None:
        self._args.clear()
        if self.cg_sums is not None:
            self.cg_sums.close()
            self.cg_sums = None


class ResidentCG:
    """The resident CG kernel of one solve's fields: ``run(k)`` launches up to ``k`` iterations as one co-resident
    grid (``backend.launch_resident``), which ends early once the scalars freeze (converged, stalled, or a reliable
    update due); with ``updates`` it makes a due reliable update itself and ends only where the host must decide
    (``_cgstate.update_step``). ``split()`` the phases' seconds on block 0's clock since the start."""

    def __init__(self, d: Dslash, hops: list[tuple[Any, Any]], x: Any, r: Any, p: Any, ap: Any, s: Any,
                 delta2: float, parity: int, timed: bool, update: Any = None) -> None:
        cp = d.cp
        self.d = d
        self.update = update
        self.updates = update is not None
        # Direct faces (the default where the halo offers them): the hops write their faces into the neighbours'
        # ghosts themselves and the queue only signals (DirectFaces); else the queue copies them from `send`.
        want = direct_faces_wanted()
        self.direct = d.halo.direct_faces() if want and hasattr(d.halo, "direct_faces") else None
        self.hops = _hop_table(cp, hops, d._xpay_state_args(p, r, parity, False), self.direct)  # alive while read
        backend = d.world.backend
        # Alone (one rank, no halo): the kernel built without the exchanges, whose code made the CG spill.
        alone = d.world.size == 1 and d.halo is None and (update is None or update.d.halo is None)
        local = "local_" if alone else ""
        self.fn = d.k_cg_resident_local if alone else d.k_cg_resident
        precise: dict[str, Any] = {}
        self.precise_queue = np.uint64(0)  # RmaHandle{nullptr}: no second queue
        if update is not None:
            u = update.d
            self.fn = kernels(d.suffix + u.suffix).get_function(f"qcd_cg_resident_{local}{d.suffix}{u.suffix}")
            fold = u._pack_args(("fold", _ptr(update.y)), out=_ptr(update.y), **{"in": _ptr(update.y)},
                                send=u.send_ptr, sites=0, n_sites=0, parity=parity, dagger=0, has_x=0)
            # (the kernel takes both operators' hops the same way: direct faces for both or for neither)
            precise_direct = u.halo.direct_faces() if self.direct is not None and u.halo is not None else None
            self.precise_hops = _hop_table(cp, u.record(update.normal, update.ay, update.y), fold, precise_direct)
            wide = [f.reshape(-1).view(u.real) for f in (update.y, update.rhs, update.r, update.ay)]
            precise = dict(precise_hops=_ptr(self.precise_hops), y=_ptr(wide[0]), rhs=_ptr(wide[1]),
                           precise_r=_ptr(wide[2]), precise_ap=_ptr(wide[3]), n_precise=int(wide[0].size), updates=1)
            if u.halo is not None:
                self.precise_queue = (precise_direct or u.halo).device_handle()
                d.cg_other_halos = [u.halo]
        # Lanes a site in the hops (hop_split), and enough blocks for that many lanes where the rank's share of
        # the GPU holds them; grid-stride beyond.
        resident = int(backend.max_blocks(self.fn, THREADS))
        share = min(resident, int(d.world.sm_budget or resident))  # one block an SM of the rank's share
        self.lanes = hop_split(d.lat.half, share)
        # (with halos a team of blocks copies the faces while the others take the interior: that many blocks more)
        # (none with direct faces: nothing to copy)
        self.face_blocks = (face_blocks(12 * np.dtype(d.real).itemsize * d.lat.face_total, resident)
                            if d.halo and self.direct is None else 0)
        self.blocks = max(1, min(resident, d._blocks(d.lat.half * self.lanes) + self.face_blocks))
        self.barrier = backend.grid_barrier(timeout=None)
        # RmaHandle{nullptr}: no halos
        self.queue = (self.direct or d.halo).device_handle() if d.halo is not None else np.uint64(0)
        self.timed = timed
        d.cg_phase_ns.fill(0)
        views = [f.reshape(-1).view(d.real) for f in (x, r, p, ap)]
        self.base = dict(d.cg_base, hops=_ptr(self.hops), x=_ptr(views[0]), r=_ptr(views[1]), p=_ptr(views[2]),
                         ap=_ptr(views[3]), s=_ptr(s), status=d._status_ptr(s), n=int(views[0].size), delta2=delta2,
                         phase_ns=_ptr(d.cg_phase_ns) if timed else 0, halo=int(d.halo is not None),
                         split=self.lanes, face_blocks=max(1, self.face_blocks), direct=int(self.direct is not None),
                         one_pass=int(self.direct is not None and one_pass(d.lat.half, share * THREADS)), **precise)
        self._args: dict[int, Any] = {}
        self._met = False  # whether a launch has met the peers (run)

    def run(self, iterations: int) -> None:
        args = self._args.get(iterations)
        if args is None:
            args = self._args[iterations] = CG_RESIDENT_ARGS.pack(**self.base, iterations=iterations)
        if not self._met and self.d.world.size > 1:
            # As the first device-driven hop (Dslash.apply): the kernel waits on the GPU for the peers' faces and
            # sums, so its first launch meets them on the host while one may still be setting up.
            self.d.world.barrier()
        self._met = True
        self.d.world.backend.launch_resident(self.fn, self.blocks, THREADS,
                                             (args, self.barrier.device_handle(), self.queue, self.precise_queue))

    def count(self, iterations: int, updates: int = 0) -> None:
        """``iterations`` (and ``updates`` reliable updates) ran inside the kernel: their halo exchanges (4 hops
        each) happened without a host call."""
        if self.d.halo is not None:
            self.d.halo.exchanges += 4 * iterations
        if updates and self.update is not None and self.update.d.halo is not None:
            self.update.d.halo.exchanges += 4 * updates

    def split(self) -> dict[str, float]:
        if not self.timed:
            return {}
        ns = self.d.cg_phase_ns.get()
        _write_trace(self.d, ns[len(PHASES):])
        return {name: float(v) * 1e-9 for name, v in zip(PHASES, ns[:len(PHASES)], strict=True)}


# The dev trace (dslash.cu's CIRCUSLINK_QCD_DEV_TRACE, kTraceHops and TraceEvent): stamps of the last timed launch's
# first hops, written by split() where CIRCUSLINK_QCD_DEV_TRACE_DIR names a folder (scripts/dev/qcd_trace.py reads it).
_TRACE_HOPS = 64
_TRACE_EVENTS = ("begin", "started", "arrived", "interior", "end", "last_interior", "dot", "sum0", "axpy", "sum1",
                 "vector")


def _write_trace(d: Dslash, stamps: np.ndarray) -> None:
    folder = os.environ.get("CIRCUSLINK_QCD_DEV_TRACE_DIR", "")
    if not folder or not stamps.any():
        return
    hops = stamps.reshape(_TRACE_HOPS, len(_TRACE_EVENTS)).astype(np.int64)
    used = hops[hops[:, 0] > 0]
    zero = int(used[0, 0])
    rows = [{e: (int(v) - zero) * 1e-3 if v else None for e, v in zip(_TRACE_EVENTS, h, strict=True)} for h in used]
    grid = "x".join(map(str, d.lat.grid))
    name = f"trace-{'x'.join(map(str, d.lat.global_dims))}-{grid}-rank{d.world.rank}.json"
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"rank": d.world.rank, "grid": grid, "unit": "us", "t0_ns": zero, "hops": rows}, f)


_SPLITS = (8, 4, 2, 1)
_FACE_BYTES_A_BLOCK = 32 << 10


def face_blocks(face_bytes: int, resident: int) -> int:
    """Blocks of the resident CG that copy a hop's faces together while the others take the interior
    (``rma_start_team``). CIRCUSLINK_QCD_FACE_BLOCKS: unset or ``1`` (the default), one block, as the CG was last
    measured on a GPU; ``auto``, one per 32 KiB of faces (a block's copy moves a few tens of GB/s, so each takes
    about a microsecond), at most an eighth of the grid; a whole number, that many. The team stays opt-in: on one
    H100 it moved no iteration beyond the spread of repeated runs (BENCHMARKS.md)."""
    text = os.environ.get("CIRCUSLINK_QCD_FACE_BLOCKS", "").strip().lower() or "1"
    if text != "auto":
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"CIRCUSLINK_QCD_FACE_BLOCKS={text!r}: auto, or a whole number of blocks, at least 1")
        return int(text)
    return max(1, min(-(-int(face_bytes) // _FACE_BYTES_A_BLOCK), max(1, int(resident) // 8)))


def hop_split(sites: int, blocks: int) -> int:
    """Lanes of a warp a site takes in the resident CG's hops: the most of 8, 4, 2, 1 for which ``blocks``
    blocks (one an SM of the rank's share, at most) still give every lane at most one site. A small lattice then
    has its 8 directions loaded at once instead of a few at a time; where the sites fill one block an SM, more
    blocks cost more in every grid barrier than the split saves (16^4 on one H200: 2 lanes on 256 blocks took
    70 us an iteration, 1 on 128 blocks 59-64). CIRCUSLINK_QCD_HOP_SPLIT (1, 2, 4 or 8) fixes it, for A/B runs."""
    text = os.environ.get("CIRCUSLINK_QCD_HOP_SPLIT", "").strip()
    if text:
        if text not in {str(v) for v in _SPLITS}:
            raise ConfigError(f"CIRCUSLINK_QCD_HOP_SPLIT={text!r}: one of 1, 2, 4, 8 (lanes a site in the hops)")
        return int(text)
    lanes = blocks * THREADS
    return next(v for v in _SPLITS if v == 1 or sites * v <= lanes)


def _hop_table(cp: Any, hops: list[tuple[Any, Any]], last: Any, direct: Any = None) -> Any:
    """The kernel's table of argument blocks in device memory: the 4 interiors, the 4 exteriors, then ``last``.
    With ``direct`` (_halo.DirectFaces) hop h reads ghost half h & 1 and writes the next hop's faces into the
    neighbours' half (h + 1) & 1; ``last`` (p's or y's faces, for hop 0) into their half 0."""
    table = np.array([i for i, _ in hops] + [e for _, e in hops] + [last], dtype=DSLASH_ARGS.dtype)
    if direct is not None:
        for h in range(4):
            table[4 + h]["ghost"] = direct.ghost(h & 1)
            table[4 + h]["face_to"] = direct.face_to((h + 1) & 1)
        table[8]["face_to"] = direct.face_to(0)
    return cp.asarray(table.view(np.uint8))


def one_pass(sites: int, threads: int) -> bool:
    """Whether a hop of the resident CG with direct faces is one pass over its sites (the ghosts' terms inline,
    one grid barrier) rather than the interior, a barrier and the exterior: CIRCUSLINK_QCD_ONE_PASS, 1, 0, or
    ``auto`` (the default): one pass where the hop's ``sites`` fit the ``threads`` of the rank's blocks (one block
    an SM of its share) at one site a thread or fewer, where a hop is latency, not bandwidth, and the one pass was
    measured faster (16^4 on 2 ranks with SMs of their own, one H100: 107 us an iteration against 182 with the
    faces copied in the same call; on 4, 178 against 233); else two passes: at 32^4 on 2 ranks the one pass, then
    through the split path's selects, took 1,474 us against 1,320 copied (and 1,244 with two passes, another call;
    BENCHMARKS.md; the pass with the plain hop's constants is not measured there yet)."""
    text = os.environ.get("CIRCUSLINK_QCD_ONE_PASS", "auto").strip().lower() or "auto"
    if text not in ("auto", "0", "1"):
        raise ConfigError(f"CIRCUSLINK_QCD_ONE_PASS={text!r}: auto, 1 (one pass a hop) or 0 (interior, exterior)")
    return sites <= threads if text == "auto" else text == "1"


def direct_faces_wanted() -> bool:
    """Whether the resident CG writes its faces straight into the neighbours' ghosts (_halo.DirectFaces):
    CIRCUSLINK_QCD_DIRECT_FACES, 1 (the default) or 0 (the queue copies them from the send array, for A/B runs)."""
    text = os.environ.get("CIRCUSLINK_QCD_DIRECT_FACES", "1").strip() or "1"
    if text not in ("0", "1"):
        raise ConfigError(f"CIRCUSLINK_QCD_DIRECT_FACES={text!r}: 1 (faces written into the neighbours' ghosts) "
                          "or 0 (copied by the RMA queue)")
    return text == "1"
