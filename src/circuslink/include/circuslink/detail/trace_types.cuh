// circuslink/detail/trace_types.cuh - the trace record and handle layouts.
//
// The host's ABI tables of Record and Handle are circuslink/trace/_layout.py (RECORD, HANDLE);
// tests/test_abi.py checks that both sides agree. Plain structs: visible to host C++ as well.
#pragma once

namespace circuslink {
namespace trace {

// Event ids (14 bits). Ids below USER are circuslink's own; USER + k are the user's,
// named on the host with Tracer(names={USER + k: "..."}).
enum : unsigned int {
  KERNEL = 1,   // a kernel (or a block of it) running: kernel_begin / kernel_end
  SEND = 2,     // a packet / chunk written into a channel (arg = channel id)
  RECV = 3,     // a packet / chunk read from a channel (arg = channel id)
  CREDITS = 4,  // credits returned to a sender (arg = channel id)
  COMPUTE = 5,  // user computation between communication steps
  USER = 256,
  MAX_EVENT = 0x3FFF
};

// The phase lives in the top two bits of the 16-bit event field.
enum : unsigned int { PHASE_INSTANT = 0, PHASE_BEGIN = 1, PHASE_END = 2 };
enum : unsigned int { PHASE_SHIFT = 14 };

// One event: 16 bytes, written with a single vector store.
struct alignas(16) Record {
  unsigned long long time_ns;  // %globaltimer of the recording GPU (host clock on cpu)
  unsigned short event;        // event id | phase << 14
  unsigned short block;        // linear block index, saturated at 0xFFFF
  unsigned int arg;            // channel id or user argument
};

// What a kernel receives: 24 bytes, trivially copyable, passed by value.
struct Handle {
  Record* records;               // capacity records in this rank's device memory
  unsigned long long* cursor;    // events attempted so far (> capacity: the excess was dropped)
  unsigned int capacity;
  unsigned int rank;
};

}  // namespace trace
}  // namespace circuslink
