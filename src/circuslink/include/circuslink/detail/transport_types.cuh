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

// -- the nvshmem transport's proxy kernel (transport/nvshmem_proxy.cu; tables: transport/nvshmem.py) ------------
// A relay between two gateways whose rings live in NVSHMEM's symmetric heap: the proxy kernel on each gateway
// puts packet s of its out ring into packet s of the peer's in ring (payload, a quiet, then the slot's low-latency
// area with the header), and returns the agent's consumed count of its own in ring to the peer as a signal.
enum : unsigned int {
  // ProxyArgs::control words (host-mapped)
  kProxyStop = 0,       // host: stop after this slice
  kProxyClosing = 1,    // host: the agents are done; finish what the out rings hold, then say done
  kProxyDiscard = 2,    // host: no agent reads the in rings any more: take and drop what arrives
  kProxyError = 3,      // proxy: an error code (kProxyErr*), after the relay and the packet it concerns
  kProxyErrRelay = 4,   // 1 + the relay's index
  kProxyErrSeqLo = 5,
  kProxyErrSeqHi = 6,
  kProxyControlWords = 8,
  kProxyErrFull = 1u,     // the peer's in ring stayed full past the time-out
  kProxyErrHeader = 2u,   // a corrupt header in this rank's out ring
  kProxyErrAborted = 3u,  // the host's abort word was set
};

// One relay as the proxy kernel sees it (device memory; 112 bytes).
struct RelayEntry {
  unsigned char* out_slots;             // my out ring's slots (the agent writes them)
  unsigned long long* out_credit;       // my out ring's in-order credit counter (the proxy returns slots)
  unsigned int* out_slot_credits;       // my out ring's slot credits
  unsigned int* out_send_error;         // the out ring writer's error record (the proxy records aborts there)
  unsigned char* in_slots;              // my in ring's slots (the peer's proxy puts them)
  unsigned long long* in_credit;        // my in ring's in-order credit counter (the agent writes it)
  unsigned int* in_slot_credits;        // my in ring's slot credits (the agent writes them: grid agents, only these)
  unsigned int* in_recv_error;          // the in ring reader's error record
  unsigned char* peer_in_slots;         // the peer's in ring's slots (a symmetric address)
  unsigned long long* credit_from_peer; // my 2 signal words the peer sets: its in ring's consumed count, and
                                        // 1 + the packets it sent in all once it has closed (0: not yet)
  unsigned long long* credit_at_peer;   // the peer's 2 signal words for mine (a symmetric address)
  unsigned int nslots;
  unsigned int slot_bytes;              // 256 + chunk
  unsigned int chunk;
  unsigned int batch;                   // most packets put before one quiet
  int pe;                               // the peer's PE
  unsigned int pad;
};

// What the proxy keeps of each relay from one slice to the next (device memory, zeroed by the host).
struct RelayState {
  unsigned long long sent;              // packets put (their puts complete: slots returned)
  unsigned long long reported;          // my in ring's consumed count last signalled to the peer
  unsigned long long blocked_since;     // %globaltimer when the next packet began waiting for room, 0: not
  unsigned long long discarded;         // packets of my in ring taken and dropped (kProxyDiscard)
  unsigned long long done;              // closing: goodbyes exchanged, everything arrived (the host polls it)
  unsigned long long bye;               // closing: 1 + packets sent, signalled to the peer (0: not yet)
  unsigned long long consumed;          // packets of my in ring the agent has given back, in order
};

// What the proxy kernel receives by value (64 bytes).
struct ProxyArgs {
  const RelayEntry* relays;
  RelayState* state;
  unsigned int* control;                // host-mapped kProxy* words (plain stores only: no atomics over PCIe)
  unsigned int* claim;                  // device memory: the first failing block claims the error words
  const volatile unsigned int* abort;   // the back-end's abort word
  unsigned long long timeout_ns;        // a packet waits this long for room in the peer's in ring
  unsigned long long slice_ns;          // one launch runs this long, then exits (the host relaunches it)
  unsigned int nrelays;
  unsigned int rank;
};

}  // namespace transport
}  // namespace circuslink
