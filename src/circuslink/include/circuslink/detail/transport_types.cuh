// circuslink/detail/transport_types.cuh - a Connection's device handle (docs/architecture.md, "Transports").
//
// The host object is circuslink.transport.Connection; its device handle is this struct, passed to kernels
// by value (the MSCCL++ pattern: a host object, a small copyable device struct). Its host table is
// circuslink.transport._base.HANDLE; tests/test_abi.py compiles static_asserts of both with nvcc.
// Plain structs, visible to host C++ as well as device code.
#pragma once

namespace circuslink {
namespace transport {

enum : unsigned int {
  // Handle::mode: how device code reaches the peer
  kModeStore = 0u,   // the peer's inbox and signal words are mapped: device code stores into them itself
  kModeProxy = 1u,   // a proxy carries puts (a host thread or a device kernel): device code cannot put itself
  // error codes the device functions return (0: done)
  kOk = 0u,
  kErrTimeout = 1u,  // a wait ran past the handle's time-out
  kErrAborted = 2u,  // the host's abort word was set
  kErrProxied = 3u,  // a put or signal through a handle whose transport is not device-initiated
  kErrRange = 4u,    // offset + bytes beyond the inbox, or a signal index beyond the signal words
};

// What a kernel receives by value (72 bytes).
struct Handle {
  unsigned char* remote;                  // kModeStore: the peer's inbox (my writes land here); else null
  unsigned long long* remote_signals;     // kModeStore: the peer's signal words; else null
  const unsigned char* local;             // my inbox (what the peer wrote)
  unsigned long long* local_signals;      // my signal words (what wait polls)
  const volatile unsigned int* abort;     // the back-end's abort word (host-mapped); may be null
  unsigned long long timeout_ns;          // every device wait of this handle (0: none)
  unsigned long long nbytes;              // bytes of each inbox
  unsigned int nsignals;                  // signal words of each side
  unsigned int mode;                      // kModeStore or kModeProxy
  unsigned int rank;                      // this end
  unsigned int peer;                      // the other end
};

}  // namespace transport
}  // namespace circuslink
