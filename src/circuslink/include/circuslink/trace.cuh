// circuslink/trace.cuh - timestamps of chosen events, recorded from inside kernels.
//
// A kernel receives a circuslink::trace::Handle (from circuslink.trace.Tracer.device_handle()
// on the host) and calls, from ONE lane per event:
//
//     namespace tr = circuslink::trace;
//     tr::kernel_begin(h);                        // duration events come in begin/end pairs
//     tr::begin(h, tr::RECV, channel_id);  ...  tr::end(h, tr::RECV, channel_id);
//     tr::instant(h, tr::CREDITS, channel_id);   // a point in time
//     tr::begin(h, tr::USER + 3, my_arg);  ...  tr::end(h, tr::USER + 3, my_arg);
//     tr::kernel_end(h);
//
// or record_warp(...) from a whole warp (the lowest active lane records). Each event costs
// one atomicAdd on the rank's cursor plus one 16-byte store of
//     { %globaltimer (ns), event id | phase, block, arg }
// into a per-rank ring; when the ring is full the event is dropped and only counted (the
// cursor keeps counting), so tracing never blocks and never overwrites what it kept. The
// host merges the rings of all ranks on one time base (see docs/trace.md).
//
// A default-constructed Handle (records == nullptr) turns every call into one predictable
// branch, so kernels can take a Handle argument unconditionally and run untraced.
#pragma once

#include "detail/trace_types.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "detail/trace_impl.cuh"
#endif
