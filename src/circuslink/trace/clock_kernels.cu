// Clock-sync kernels of the tracer (circuslink/trace/_cuda.py, protocol in _clock.py): one thread
// each, polling over NVLink. Compiled at run time with circuslink.compile (NVRTC). Every wait ends
// at its deadline or when the host sets the abort word (its own bounded wait gave up).
#include <circuslink/trace.cuh>
using namespace circuslink::detail;

// out[2k], out[2k+1] = t1, t2 of round k; out[2*rounds] = 0 or (round that timed out) + 1
extern "C" __global__ void clock_ping(unsigned long long* peer_slot, const unsigned long long* my_slot,
                                      unsigned long long base, unsigned int rounds,
                                      unsigned long long timeout_ns, const volatile unsigned int* abort,
                                      unsigned long long* out) {
  for (unsigned int k = 0; k < rounds; ++k) {
    unsigned long long seq = base + k + 1;
    Deadline d = Deadline::after(timeout_ns, abort);
    unsigned long long t1 = globaltimer_ns();
    st_relaxed_u64(peer_slot, seq);
    while (ld_relaxed_u64(my_slot) != seq) {
      if (d.expired()) { out[2 * rounds] = k + 1; return; }
    }
    unsigned long long t2 = globaltimer_ns();
    out[2 * k] = t1;
    out[2 * k + 1] = t2;
  }
  out[2 * rounds] = 0;
}

// out[k] = tb of round k; out[rounds] = 0 or (round that timed out) + 1
extern "C" __global__ void clock_pong(unsigned long long* ref_slot, const unsigned long long* my_slot,
                                      unsigned long long base, unsigned int rounds,
                                      unsigned long long timeout_ns, const volatile unsigned int* abort,
                                      unsigned long long* out) {
  for (unsigned int k = 0; k < rounds; ++k) {
    unsigned long long seq = base + k + 1;
    Deadline d = Deadline::after(timeout_ns, abort);
    while (ld_relaxed_u64(my_slot) != seq) {
      if (d.expired()) { out[rounds] = k + 1; return; }
    }
    unsigned long long tb = globaltimer_ns();
    st_relaxed_u64(ref_slot, seq);
    out[k] = tb;
  }
  out[rounds] = 0;
}

extern "C" __global__ void clock_read(unsigned long long* out) { out[0] = globaltimer_ns(); }
