"""The tracer: timestamps of chosen events on every rank, merged on one time base.

Host side::

    with circuslink.trace.Tracer(world) as tracer:    # collective (a Resource: with / close())
        kernel(grid, block, (tracer.device_handle(), ...))   # the kernel records (trace.cuh)
        trace = tracer.collect()                      # collective: every rank's events, one clock
    if world.rank == 0:
        trace.export_chrome("run.json")               # ui.perfetto.dev / chrome://tracing
        trace.plot_waveform("run.png")                # send / receive activity per rank
        print(trace.overlap_fraction(1, "recv", "send"))

Device side: ``#include <circuslink/trace.cuh>``; a kernel takes a ``circuslink::trace::Handle``
by value and calls ``tr::begin(h, tr::RECV, channel_id)`` and friends from one lane
(``include/circuslink/trace.cuh``). On the cpu back-end the same events are recorded from Python:
``tracer.begin(RECV, ch)``, ``tracer.end(RECV, ch)``, ``tracer.instant(...)``, ``with tracer.span(...)``.
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
