"""The forwarding agent of the cuda back-end: one block of ``router_kernels.cu`` per rank, always resident.

Started by open() on its own non-blocking stream (the world's stream stays free for the channels' host
write/read kernels, which run beside it) and stopped by close() through a host-mapped stop word. It runs as
a persistent kernel in **slices**: each launch serves for ``SLICE_S`` and stores its state in device memory,
and a host thread keeps two launches queued back to back (a few microseconds between them), so that a
device-wide synchronization elsewhere in the process (``cudaDeviceSynchronize``, ``cudaFree``, an
allocation) returns within a slice or two instead of waiting for the channels to close. Bounded like every
wait: close() waits for it with ``backend.wait_stream`` (which sets the abort word on time-out), and the
agent reads the abort word too. It takes one block (``AGENT_THREADS`` threads) of the rank's SM share:
kernels that wait on peers while routed channels are open size their grids with ``channels.max_blocks``
(one SM fewer).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ChannelError, TimeoutError
from . import _routed as R
from . import protocol as P

AGENT_THREADS = 512  # warp 0 routes; the block copies bulk packets (router_impl.cuh)
SLICE_S = 0.005  # one launch of the agent; a device-wide synchronization waits at most about two
_QUEUED = 2  # launches kept queued on the agent's stream, so that one follows the other at once
_KERNELS = Path(__file__).with_name("router_kernels.cu")
# control words (router_types.cuh: kCtl*)
_STOP, _STATE, _ERROR, _INPUT, _SEQ, _WORD, _WORDS = 0, 1, 2, 3, 4, 5, 8
_ERRORS = {
    1: "packet seq {seq} of {input} has a corrupt header (word {word:#x})",
    2: "packet seq {seq} of {input} names channel id {word}, which this rank does not deliver or gate",
    3: "packet seq {seq} of {input} has no link out toward rank {word}",
    4: "packet seq {seq} of {input}: its header arrived but its data did not within the time-out",
    5: "the host aborted it (a bounded wait for device work gave up)",
}


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
                chans[k] = (ptr(ch.ring), ptr(ch.board), ch.nslots, ch.slot_bytes, ch.route, ch.role, ch.first, 0)
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
        rt = cp.cuda.runtime
        self._control_ptr = rt.hostAlloc(4 * _WORDS, rt.hostAllocMapped)
        self.control = np.frombuffer((ctypes.c_uint32 * _WORDS).from_address(self._control_ptr), dtype=np.uint32)
        self.control[:] = 0
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:  # uploads and launch in order on the agent's stream
            self._device = [cp.asarray(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
                            for a in (inputs, outputs, chans, state, in_state, out_state, entries, of_id, rep)]
        d_in, d_out, d_ch, d_state, d_ins, d_outs, d_entries, d_ids, d_rep = (int(a.data.ptr) for a in self._device)
        timeout = channels.timeout or channels.host_timeout
        agent = P.ROUTER_AGENT.pack(
            inputs=d_in, outputs=d_out, channels=d_ch, state=d_state, input_state=d_ins, output_state=d_outs,
            entries=d_entries, channel_of_id=d_ids, reporters=d_rep, control=self._control_ptr,
            abort=self.backend.abort_ptr, timeout_ns=int(timeout * 1e9),
            report_after_ns=int(R.report_after(timeout) * 1e9), slice_ns=int(SLICE_S * 1e9),
            ninputs=len(tables.inputs), noutputs=len(tables.outputs), nchannels=len(tables.channels), nids=nids,
            rank=self.rank, nranks=tables.nranks, vcs=tables.vcs, nreporters=len(reporters))
        shared = (P.ROUTER_SHARED_PER_INPUT * len(tables.inputs) + P.ROUTER_SHARED_PER_OUTPUT * len(tables.outputs)
                  + P.ROUTER_SHARED_PER_RANK * tables.nranks)
        kernel = _kernel(world.device)
        if shared > 48 << 10:
            kernel.max_dynamic_shared_size_bytes = shared
        self._final: str | None = None
        self._launch = lambda: kernel((1,), (AGENT_THREADS,), (agent,), shared_mem=shared)
        with self.stream:
            self._launch()  # the first slice is queued before open() returns, like a persistent kernel
        self._stopping = threading.Event()
        self._running = True
        self._pump = threading.Thread(target=self._keep_running, args=(world.device,), daemon=True,
                                      name=f"circuslink-agent-{self.rank}")
        self._pump.start()
        ref = weakref.ref(self)
        self._at_exit = lambda: (r := ref()) is not None and r.stop(0)
        atexit.register(self._at_exit)  # an open Channels at exit: let the process's last synchronizations return

    def _keep_running(self, device: int) -> None:
        """Keep _QUEUED slices queued on the agent's stream until stopped or the agent records an error."""
        import cupy as cp

        with cp.cuda.Device(device), self.stream:
            queued = [cp.cuda.Event(disable_timing=True)]
            queued[0].record(self.stream)
            while not self._stopping.is_set() and not self.control[_ERROR]:
                if len(queued) < _QUEUED:
                    self._launch()
                    event = cp.cuda.Event(disable_timing=True)
                    event.record(self.stream)
                    queued.append(event)
                    continue
                if queued[0].done:
                    queued.pop(0)
                    continue
                time.sleep(SLICE_S / 20)

    def _describe_input(self, k: int) -> str:
        if not 0 <= k < len(self.tables.inputs):
            return "an input"
        s = self.tables.inputs[k]
        if s.kind == R.IN_INJECT:
            return f"the injection ring of routed channel #{s.channel}"
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
        self._stopping.set()
        self.control[_STOP] = 1
        atexit.unregister(self._at_exit)
        if timeout == 0:
            return
        self._pump.join(timeout)
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

