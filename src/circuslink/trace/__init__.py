"""The tracer: timestamps of chosen events on every rank, merged on one time base.

Device side (``#include <circuslink/trace.cuh>``)::

    extern "C" __global__ void step(circuslink::trace::Handle h, ...) {
      namespace tr = circuslink::trace;
      if (threadIdx.x == 0) tr::begin(h, tr::RECV, channel_id);
      ...
    }

Host side::

    tracer = circuslink.trace.Tracer(world)          # collective
    kernel(grid, block, (tracer.device_handle(), ...))
    trace = tracer.collect()                          # collective: every rank's events, one clock
    if world.rank == 0:
        trace.export_chrome("run.json")               # ui.perfetto.dev / chrome://tracing
        trace.plot_waveform("run.png")                # send / receive activity per rank
        print(trace.overlap_fraction(1, "recv", "send"))

On the cpu back-end the same events are recorded from Python: ``tracer.begin(RECV, ch)``,
``tracer.end(RECV, ch)``, ``tracer.instant(...)``, ``with tracer.span(...)``.
See docs/trace.md for the record format, the clock alignment and its residual.
"""

from __future__ import annotations

from ._layout import COMPUTE, CREDITS, KERNEL, PHASE_BEGIN, PHASE_END, PHASE_INSTANT, RECV, SEND, USER
from ._model import ClockSample, Trace, TraceMeta, interval_overlap_fraction, union_intervals
from ._tracer import DEFAULT_CAPACITY, Tracer

__all__ = [
    "COMPUTE",
    "CREDITS",
    "DEFAULT_CAPACITY",
    "KERNEL",
    "PHASE_BEGIN",
    "PHASE_END",
    "PHASE_INSTANT",
    "RECV",
    "SEND",
    "USER",
    "ClockSample",
    "Trace",
    "TraceMeta",
    "Tracer",
    "interval_overlap_fraction",
    "union_intervals",
]
