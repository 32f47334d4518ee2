// circuslink/detail/channel_types.cuh - channel handle, state and packet layouts (plain structs).
//
// The host's tables of these structs are circuslink.channels.protocol (HANDLE, SEND_STATE,
// RECV_STATE); tests/test_abi.py checks them against this file with nvcc. docs/protocol.md explains
// the format. Visible to host C++ as well as device code.
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

// One ring of slots per channel, in the receiver's memory. A slot holds one packet of either kind:
//   [0, 256)            the low-latency area: 32 units of 8 bytes, {word, flag} each; units 0 and 1
//                       are the header {route, flag} {nbytes | kind, flag}, units 2..31 carry 4 payload
//                       bytes each (a low-latency packet: up to 120 bytes)
//   [256, 256 + chunk)  the bulk area: a bulk packet's payload (up to `chunk` bytes), published by its
//                       header (units 0 and 1) stored after a release fence
// Bulk payload never lands in the low-latency area, so a unit's flag is only ever a flag.
enum : unsigned int {
  kUnitBytes = 8,
  kLLUnits = 32,
  kLLAreaBytes = 256,      // kLLUnits * kUnitBytes
  kLLPayload = 120,        // (kLLUnits - 2) * 4
  kKindBulk = 0x80000000u, // in header word 2 with nbytes
  kNbytesMask = 0x7FFFFFFFu,
  // with kKindBulk: a rendezvous descriptor (a low-latency packet of kRdvBytes: the message's offset in the
  // writer's window and its size, u64 each); the reader pulls the message from the window (docs/protocol.md)
  kKindRdv = 0x40000000u,
  kRdvBytes = 16,
};
// error codes recorded in an end's error record {code, channel id, seq lo, seq hi}; kErrClaimed marks a
// record whose fields are being written (the code is published last)
enum : unsigned int {
  kErrNone = 0, kErrDataTimeout = 1, kErrCreditTimeout = 2, kErrMisuse = 3, kErrAborted = 4,
  kErrClaimed = 0xFFFFFFFFu,
};
// ChannelHandle.flags
enum : unsigned int {
  kHandleGpuScope = 1u,  // both ends (and every rank between) share one GPU: bulk packets fence at .gpu, not .sys
};

// What a kernel receives (104 bytes, by value). Pointers are valid on the end's own GPU. The host's
// table of this struct is circuslink.channels.protocol.HANDLE (tests/test_abi.py checks both agree).
struct ChannelHandle {
  unsigned char* ring;               // the receiver's ring (sender: mapped peer memory; receiver: local)
  unsigned long long* credit;        // slots consumed in order; in the sender's memory
  unsigned int* slot_credit;         // per-slot credits (grid forms); in the sender's memory
  unsigned long long* state;         // this end's SendState / RecvState, in its own memory
  unsigned int* error;               // this end's error record (4 x u32), in its own memory
  const volatile unsigned int* abort;  // host-mapped: set by the host to end every device wait (sync.cuh)
  unsigned long long timeout_ns;     // device waits give up after this long (0: never; the host still aborts)
  unsigned int nslots;               // power of two, at least 2
  unsigned int slot_bytes;           // kLLAreaBytes + chunk
  unsigned int chunk;                // bulk payload capacity of one packet (a multiple of 16)
  unsigned int route;                // header word: recv_id | dst_rank << 16
  unsigned int ll_max;               // writes of at most this many bytes travel as low-latency packets
  unsigned int channel_id;           // this end's ID, for error records
  unsigned int flags;                // kHandle* bits, chosen when the channel opens
  unsigned int rdv_min;              // grid writes of at least this many bytes from the window go by rendezvous (0: never)
  unsigned char* window;             // the writer's window as mapped on this end's GPU (null: no rendezvous)
  unsigned long long window_bytes;
};

// Control-block words of the rendezvous (docs/protocol.md, "Rendezvous"), at byte 112 of the sender's copy:
// u64 `done` (the reading warps add to it: finished messages in units of 2^20), u64 `posted` (the writing
// group's first warp: the descriptor it posted last and the message's number).
enum : unsigned int { kCtrlRdv = 112, kCtrlSendState = 16, kCtrlRecvState = 48 };

struct SendState {                   // control block + 16
  unsigned long long seq;            // slots (= packets) written so far
  unsigned long long credit_cache;   // last credit counter value read
  unsigned int departed;             // grid forms: warps that left the current call
  unsigned int pad;
};

struct RecvState {                   // control block + 48
  unsigned long long seq;            // packets fully consumed so far
  unsigned int offset;               // bytes of packet `seq` already consumed
  unsigned int departed;             // grid forms: warps that left the current call
  unsigned long long returned;       // credit counter value last stored into the sender
};

}  // namespace detail
}  // namespace circuslink
