// circuslink/detail/channel_types.cuh - channel handle and state layouts (plain structs).
//
// Mirrored by circuslink/channels/protocol.py (HANDLE_DTYPE, CTRL_*, LL_*); change both
// together. Visible to host C++ as well as device code (docs/protocol.md explains them).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CIRCUSLINK_HD __host__ __device__
#else
#define CIRCUSLINK_HD
#endif

namespace circuslink {

// OpenCL-style vector element: uint16 = vec<unsigned int, 16>. As in OpenCL a 3-vector takes
// the room (and alignment) of a 4-vector, so sizeof(vec<T,3>) == 4 * sizeof(T).
template <typename T, int N>
struct alignas((sizeof(T) * (N == 3 ? 4 : N)) < 16 ? (sizeof(T) * (N == 3 ? 4 : N)) : 16) vec {
  T s[N == 3 ? 4 : N];
  CIRCUSLINK_HD T& operator[](int i) { return s[i]; }
  CIRCUSLINK_HD const T& operator[](int i) const { return s[i]; }
};

namespace detail {

enum : unsigned int { kModeLL = 0, kModeBW = 1 };
enum : unsigned int {
  kLineBytes = 16,
  kLLLines = 16,
  kLLSlotBytes = 256,
  kLLLinePayload = 8,
  kLLPayload = 120,
  kBWHeaderBytes = 16,
};
// error codes recorded in an end's error record {code, channel id, seq lo, seq hi}
enum : unsigned int { kErrNone = 0, kErrDataTimeout = 1, kErrCreditTimeout = 2, kErrMisuse = 3, kErrAborted = 4 };

// What a kernel receives (80 bytes, by value). Pointers are valid on the end's own GPU. The host's
// table of this struct is circuslink.channels.protocol.HANDLE (tests/test_abi.py checks both agree).
struct ChannelHandle {
  unsigned char* ring;               // the receiver's ring (sender: mapped peer memory; receiver: local)
  unsigned long long* credit;        // packets consumed in order; in the sender's memory
  unsigned int* slot_credit;         // per-slot credits (bandwidth mode); in the sender's memory
  unsigned long long* state;         // this end's SendState / RecvState, in its own memory
  unsigned int* error;               // this end's error record (4 x u32), in its own memory
  const volatile unsigned int* abort;  // host-mapped: set by the host to end every device wait (sync.cuh)
  unsigned long long timeout_ns;     // device waits give up after this long (0: never; the host still aborts)
  unsigned int nslots;               // power of two
  unsigned int slot_bytes;           // 256 (LL) or 16 + chunk (BW)
  unsigned int payload;              // payload capacity of one packet: 120 (LL) or chunk (BW)
  unsigned int route;                // header word: recv_id | dst_rank << 16
  unsigned int mode;                 // kModeLL or kModeBW
  unsigned int channel_id;           // this end's ID, for error records
};

struct SendState {                   // control block + 16
  unsigned long long seq;            // packets written so far
  unsigned long long credit_cache;   // last credit counter value read
  unsigned int departed;             // grid forms: blocks that left the current call
  unsigned int pad;
};

struct RecvState {                   // control block + 48
  unsigned long long seq;            // packets fully consumed so far
  unsigned int offset;               // bytes of packet `seq` already consumed
  unsigned int departed;             // grid forms: blocks that left the current call
  unsigned long long returned;       // credit counter value last stored into the sender
};

}  // namespace detail
}  // namespace circuslink
