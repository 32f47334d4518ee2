// circuslink/detail/collectives_types.cuh - the Ring record, the Rings handle and the reduction operators.
//
// The host's ABI tables of Ring and Rings are circuslink/collectives/_layout.py (RING, RINGS);
// tests/test_abi.py checks that both sides agree. Plain structs: visible to host C++ as well.
#pragma once

#include <circuslink/channel.cuh>  // via -I<include>, which NVRTC and nvcc both get

namespace circuslink {
namespace collectives {

// One rank's place in one ring of byte channels.
struct Ring {
  Sender<unsigned char> right;    // byte channel to rank + 1
  Receiver<unsigned char> left;   // byte channel from rank - 1
  unsigned char* scratch;         // `piece` bytes of this rank's device memory (data from the left)
  unsigned long long piece;       // bytes per piece: a multiple of 16, at most half the ring
  unsigned int rank;
  unsigned int size;
};

// What a kernel receives (16 bytes, by value): comm.device_handle(nbytes) on the host. `rings`
// points at `count` Ring records in this rank's device memory; slice s of a *_grid call travels
// over rings[s].
struct Rings {
  const Ring* rings;
  unsigned int count;
  unsigned int pad;

  CIRCUSLINK_HD const Ring& operator[](unsigned int i) const { return rings[i]; }
};

// The shared-memory team (ranks that map each other's memory: one GPU under MPS, one node): what a
// kernel receives by value from comm.device_team(). `peers[q]` is rank q's team buffer as mapped
// here; every team buffer has the layout of team_*_offset below (the host's table: collectives/_layout.py,
// team_offsets). `counters` and `error` are this rank's private device words.
struct Team {
  unsigned char* const* peers;          // `size` pointers in device memory
  unsigned int* counters;               // kTeamCounters words: grid barrier, team barrier, LL chunk calls
  unsigned int* error;                  // 4 words: what timed out (kTeamError*), the peer, the slot, the call
  const volatile unsigned int* abort;   // host-mapped: the host ends every device wait (may be null)
  unsigned long long timeout_ns;        // every wait gives up after this long (0: never)
  unsigned long long stage_bytes;       // the stage: two-shot calls move pieces of at most this
  unsigned long long oneshot_max;       // the switch point: one-shot up to this many bytes per rank
  unsigned int rank;
  unsigned int size;
  unsigned int flags;                   // kTeamGpuScope: every rank on one GPU (barriers at .gpu scope)
  unsigned int pad;
};

// Team::flags: every rank of the team runs on one GPU (ranks under MPS), so the barrier's release and
// acquire need only .gpu scope; a .sys fence there costs microseconds under MPS.
constexpr unsigned int kTeamGpuScope = 1u;

// LL slots of the one-shot all-reduce: kLLChunks chunks of kLLChunkBytes of data; each chunk has two
// parities x size sources x kLLLines lines of 16 bytes {data0, flag, data1, flag}.
constexpr unsigned int kLLChunkBytes = 1024;
constexpr unsigned int kLLChunks = 64;
constexpr unsigned int kLLLines = kLLChunkBytes / 8;
constexpr unsigned int kTeamCounterGrid = 0, kTeamCounterBarrier = 2, kTeamCounterChunk = 3;
constexpr unsigned int kTeamCounters = kTeamCounterChunk + kLLChunks;
constexpr unsigned int kTeamErrorBarrier = 1, kTeamErrorSlot = 2, kTeamErrorGrid = 3, kTeamErrorStage = 4;
constexpr unsigned int kTeamErrorClaimed = 0xFFFFFFFFu;  // a record whose fields are being written

CIRCUSLINK_HD inline unsigned long long team_ll_offset(unsigned int size) { return (4ull * size + 255) / 256 * 256; }
CIRCUSLINK_HD inline unsigned long long team_stage_offset(unsigned int size) {
  return team_ll_offset(size) + 2ull * kLLChunks * size * kLLLines * 16;
}

// bfloat16 as its bit pattern. Reduced as the cpu back-end reduces it (collectives/_reduce.py): both
// operands widened to float (exact), the op in float, rounded back to nearest, ties to even (NaN stays
// a quiet NaN): one rounding per step, so both back-ends agree bitwise.
struct bf16 {
  unsigned short bits;
};
namespace detail {
CIRCUSLINK_HD inline float bf16_widen(bf16 a) {
  union { unsigned int u; float f; } v;
  v.u = static_cast<unsigned int>(a.bits) << 16;
  return v.f;
}
CIRCUSLINK_HD inline bf16 bf16_round(float x) {
  union { unsigned int u; float f; } v;
  v.f = x;
  bf16 out;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) {
    out.bits = static_cast<unsigned short>((v.u >> 16) | 0x40u);
  } else {
    out.bits = static_cast<unsigned short>((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
  }
  return out;
}
}  // namespace detail

struct Sum {
  template <class T> CIRCUSLINK_HD T operator()(T a, T b) const { return a + b; }
  CIRCUSLINK_HD bf16 operator()(bf16 a, bf16 b) const {
    return detail::bf16_round(detail::bf16_widen(a) + detail::bf16_widen(b));
  }
};
struct Max {
  template <class T> CIRCUSLINK_HD T operator()(T a, T b) const { return a < b ? b : a; }
  CIRCUSLINK_HD bf16 operator()(bf16 a, bf16 b) const {
    return detail::bf16_widen(a) < detail::bf16_widen(b) ? b : a;
  }
};
struct Min {
  template <class T> CIRCUSLINK_HD T operator()(T a, T b) const { return b < a ? b : a; }
  CIRCUSLINK_HD bf16 operator()(bf16 a, bf16 b) const {
    return detail::bf16_widen(b) < detail::bf16_widen(a) ? b : a;
  }
};

}  // namespace collectives
}  // namespace circuslink
