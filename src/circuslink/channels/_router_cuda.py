"""The forwarding agent of the cuda back-end: a grid of ``router_kernels.cu`` per rank, resident for the job.

Started by open() on its own non-blocking stream (the world's stream stays free for the channels' host
write/read kernels, which run beside it) and stopped by close() through a host-mapped stop word. Block 0
routes (a warp per input; a keeper warp sends the credit reports and reads the host's words:
detail/router_impl.cuh), blocks 1..``ncopy`` copy bulk packets. It stays resident (``backends/_resident.py``): a
launch ends only when the back-end pauses it for a device-wide synchronization of this process (the yield word),
after ``SLICE_S`` (the bound for synchronizations the back-end does not see: another library's
``cudaDeviceSynchronize`` or ``cudaFree``), or on stop; the next launch is already queued and takes the state over
from device memory. Bounded like every wait: close() waits for it with ``backend.wait_stream`` (which sets the
abort word on time-out), and the agent reads the abort word too. It takes ``sms`` of the rank's SM share: kernels
that wait on peers while routed channels are open size their grids with ``channels.max_blocks`` (that many SMs
fewer).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import math
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..backends._resident import ResidentKernel
from ..errors import ChannelError, TimeoutError
from . import _routed as R
from . import protocol as P

AGENT_THREADS = 512  # block 0: 15 routing warps and the keeper; the copy blocks: a 64 KiB packet's loads at once
BLOCKS_PER_SM = 2  # router_kernels.cu: __launch_bounds__(AGENT_THREADS, 2)
SLICE_S = 0.25  # the longest launch: a device-wide synchronization the back-end does not pause for waits this long
_KERNELS = Path(__file__).with_name("router_kernels.cu")
JOBS_PER_COPY_BLOCK = 4  # bulk jobs queued per copy block: it copies one while the router posts the next ones
# control words (router_types.cuh: kCtl*)
_STOP, _STATE, _ERROR, _INPUT, _SEQ, _WORD, _YIELD, _WORDS = 0, 1, 2, 3, 4, 5, 6, 8
_ERRORS = {
    1: "packet seq {seq} of {input} has a corrupt header (word {word:#x})",
    2: "packet seq {seq} of {input} names channel id {word}, which this rank does not deliver or gate",
    3: "packet seq {seq} of {input} has no link out toward rank {word}",
    4: "packet seq {seq} of {input}: its header arrived but its data did not within the time-out",
    5: "the host aborted it (a bounded wait for device work gave up)",
    6: "a bulk copy of packet seq {seq} of {input} (job {word}) did not complete within the time-out: a copy block "
       "of the agent never ran (its SMs are taken by other kernels: size grids with channels.max_blocks)",
}


def copy_blocks(sm_budget: int | None) -> int:
    """Copy blocks beside the router block: 3 where the rank has 8 SMs or more (or the whole GPU), 1 down to 3
    SMs, else none (the routing warps copy). ``CIRCUSLINK_ROUTER_COPY_BLOCKS`` overrides it (0..16)."""
    forced = os.environ.get("CIRCUSLINK_ROUTER_COPY_BLOCKS", "")
    if forced:
        try:
            n = int(forced)
        except ValueError:
            n = -1
        if not 0 <= n <= 16:
            raise ChannelError(f"CIRCUSLINK_ROUTER_COPY_BLOCKS={forced!r}: expected a number of blocks from 0 to 16")
        return n
    if not sm_budget or sm_budget >= 8:
        return 3
    return 1 if sm_budget >= 3 else 0


def agent_sms(ncopy: int) -> int:
    """SMs the agent's grid (router block and copy blocks) takes."""
    return math.ceil((1 + ncopy) / BLOCKS_PER_SM)


@functools.lru_cache(maxsize=4)
def _kernel(device: int):
    from ..device_code import compile

    return compile(_KERNELS.read_text()).get_function("circuslink_router_agent")


class CudaRouter:
    """One rank's agent kernel, with the device tables it serves (see the module docstring)."""

    def __init__(self, channels: Any) -> None:
        import cupy as cp

        world = channels.world
        self.backend = world.backend
        self.rank = world.rank
        buf = channels._buf
        plan = channels._plan.router
        tables = plan.agent(self.rank)
        self.tables = tables
        self._names = {r.index: r.link.name for r in plan.routed}  # routed channel index -> its name

        relays = channels._relays

        def ptr(addr: R.Addr | None) -> int:
            if addr is None:
                return 0
            peer = R.relay_peer(addr)
            if peer is not None:  # a relay's ring: wherever its transport keeps it, reachable from this GPU
                return relays[peer].ptr + addr[1]
            return buf.ptr(addr[0]) + addr[1]

        inputs = P.ROUTER_INPUT.array(max(1, len(tables.inputs)))
        for k, s in enumerate(tables.inputs):
            inputs[k] = (ptr(s.ring), ptr(s.credit), ptr(s.slot_credit), ptr(s.chain), s.nslots, s.slot_bytes,
                         s.chunk, s.kind, s.channel, s.entry, 0, 0)
        outputs = P.ROUTER_OUTPUT.array(max(1, len(tables.outputs)))
        for k, o in enumerate(tables.outputs):
            if o is not None:
                outputs[k] = (ptr(o.ring), ptr(o.credit), ptr(o.down_chain), o.nslots, o.slot_bytes,
                              R.entry_of_link(o.link, o.vc), P.ROUTER_HOP_RELAY if o.relay else P.ROUTER_HOP_MAPPED)
        chans = P.ROUTER_CHANNEL.array(max(1, len(tables.channels)))
        reporters = []
        for k, ch in enumerate(tables.channels):
            if ch is not None:
                chans[k] = (ptr(ch.ring), ptr(ch.board), ch.nslots, ch.slot_bytes, ch.route, ch.role, ch.first,
                            ch.arrival)
                if ch.role & R.ROLE_LAST and not ch.role & R.ROLE_FIRST:
                    reporters.append(k)
        state = P.ROUTER_STATE.array(max(1, len(tables.channels)))
        in_state = P.ROUTER_INPUT_STATE.array(max(1, len(tables.inputs)))
        out_state = P.ROUTER_OUTPUT_STATE.array(max(1, len(tables.outputs)))
        entries = plan.routing.table[self.rank]
        nids = max(tables.channel_of_id, default=0) + 1
        of_id = np.full(nids, R.NO_CHANNEL, dtype="<u2")
        for rid, c in tables.channel_of_id.items():
            of_id[rid] = c
        rep = np.array(reporters or [0], dtype="<u4")
        self.ncopy = copy_blocks(self.backend.sm_budget)
        self.sms = agent_sms(self.ncopy)
        njobs = self.ncopy * JOBS_PER_COPY_BLOCK
        jobs = P.ROUTER_JOB.array(max(1, njobs))
        copy = P.ROUTER_COPY_STATE.array(1)
        rt = cp.cuda.runtime
        self._control_ptr = rt.hostAlloc(4 * _WORDS, rt.hostAllocMapped)
        self.control = np.frombuffer((ctypes.c_uint32 * _WORDS).from_address(self._control_ptr), dtype=np.uint32)
        self.control[:] = 0
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:  # uploads and launch in order on the agent's stream
            self._device = [cp.asarray(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
                            for a in (inputs, outputs, chans, state, in_state, out_state, entries, of_id, rep, jobs,
                                      copy)]
        (d_in, d_out, d_ch, d_state, d_ins, d_outs, d_entries, d_ids, d_rep, d_jobs,
         d_copy) = (int(a.data.ptr) for a in self._device)
        timeout = channels.timeout or channels.host_timeout
        agent = P.ROUTER_AGENT.pack(
            inputs=d_in, outputs=d_out, channels=d_ch, state=d_state, input_state=d_ins, output_state=d_outs,
            entries=d_entries, channel_of_id=d_ids, reporters=d_rep, control=self._control_ptr,
            abort=self.backend.abort_ptr, timeout_ns=int(timeout * 1e9),
            report_after_ns=int(R.report_after(timeout) * 1e9), slice_ns=int(SLICE_S * 1e9), jobs=d_jobs,
            copy=d_copy, njobs=njobs, ncopy=self.ncopy, flags=P.ROUTER_GPU_SCOPE if channels.one_gpu else 0, pad=0,
            ninputs=len(tables.inputs), noutputs=len(tables.outputs), nchannels=len(tables.channels), nids=nids,
            rank=self.rank, nranks=tables.nranks, vcs=tables.vcs, nreporters=len(reporters))
        shared = (P.ROUTER_SHARED_PER_INPUT * len(tables.inputs) + P.ROUTER_SHARED_PER_OUTPUT * len(tables.outputs)
                  + P.ROUTER_SHARED_PER_RANK * tables.nranks)
        kernel = _kernel(world.device)
        if shared > 48 << 10:
            kernel.max_dynamic_shared_size_bytes = shared
        self._final: str | None = None
        grid = 1 + self.ncopy

        def launch() -> None:
            kernel((grid,), (AGENT_THREADS,), (agent,), shared_mem=shared)  # on self.stream (ResidentKernel)

        def set_yield(on: bool) -> None:
            if self.control is not None:
                self.control[_YIELD] = 1 if on else 0

        self._running = True
        def failed() -> bool:
            return self.control is None or bool(self.control[_ERROR])

        self._resident = ResidentKernel(self.backend, world.device, self.stream, launch,
                                        f"circuslink-agent-{self.rank}", failed, set_yield)
        ref = weakref.ref(self)
        self._at_exit = lambda: (r := ref()) is not None and r.stop(0)
        atexit.register(self._at_exit)  # an open Channels at exit: let the process's last synchronizations return

    def _describe_input(self, k: int) -> str:
        if not 0 <= k < len(self.tables.inputs):
            return "an input"
        s = self.tables.inputs[k]
        if s.kind == R.IN_INJECT:
            return f"the injection ring of channel {self._names.get(s.channel, '#' + str(s.channel))}"
        return f"link ring {self.tables.link_labels.get(s.link, s.link)} vc {s.vc}"

    def check(self) -> str | None:
        """The agent's error, if it recorded one (it stops on its first)."""
        if self.control is None:
            return self._final
        code = int(self.control[_ERROR])
        if not code:
            return None
        text = _ERRORS.get(code, "failed (code {code})").format(
            seq=int(self.control[_SEQ]), input=self._describe_input(int(self.control[_INPUT])),
            word=int(self.control[_WORD]), code=code)
        return f"rank {self.rank}: {text}"

    def stop(self, timeout: float | None) -> None:
        """Stop launching slices, set the stop word and wait (bounded) for the last to exit; a time-out aborts it
        and raises."""
        if not self._running:
            return
        self._running = False
        self.control[_STOP] = 1
        atexit.unregister(self._at_exit)
        self._resident.stop(timeout)
        if timeout == 0:
            return
        try:
            self.backend.wait_stream(self.stream, timeout, f"the forwarding agent of rank {self.rank}: it did not stop")
        except TimeoutError as exc:
            raise ChannelError(str(exc)) from None  # still running: its tables must stay allocated
        self._final = self.check()
        self._free()

    def _free(self) -> None:
        self._device = []
        if self._control_ptr:
            import cupy as cp

            self.control = None
            try:
                cp.cuda.runtime.freeHost(self._control_ptr)
            except Exception:
                pass  # a context already torn down at exit
            self._control_ptr = 0

