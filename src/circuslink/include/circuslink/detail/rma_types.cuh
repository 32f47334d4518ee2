// circuslink/detail/rma_types.cuh: the device-side layout of a committed RMA queue.
// The host declares every struct here once, as a circuslink._abi table (circuslink/rma/_layout.py),
// packs it with the numpy dtype computed from that table and writes it byte for byte into device
// memory at commit (RmaHandle travels by value); tests/test_abi.py checks sizes and offsets with
// static_assert. Change both together.
#pragma once

namespace circuslink {

struct RmaTransposeChain;  // detail/transpose_types.cuh: the queue's transposing puts

// Work is cut into units of at most this many bytes (one warp copies one unit), so that one large
// block is copied by many warps, and blocks of at most half of it go several to a unit
// (RmaDescriptor::blocks_per_unit): a warp keeps a unit's worth of loads in flight either way.
constexpr unsigned long long kRmaChunkBytes = 4096;

// RmaQueue::flags.
// kRmaGpuScope: every rank of the queue's world shares one GPU (ranks under MPS), so the counters release
// and acquire at .gpu scope; otherwise at .sys scope, whose fence drains to the system's coherence point
// and costs microseconds (the host decides at window_alloc, as channels do for kHandleGpuScope).
constexpr unsigned long long kRmaGpuScope = 1ull;
// kRmaLowLatency: the small chain travels as low-latency lines: each 8-byte word as one 16-byte line {low half,
// epoch, high half, epoch} stored into the target's staging (RmaQueue::lines), whose wait polls the lines and
// copies them to their destinations. The epoch travels with the data, so no release fence and no arrival
// counter sit on the cycle's path (a release store and its acquire poll cost about 0.8 us on one H200 under
// MPS against 0.27 us for a relaxed store and poll: two of them made a cycle 1.6 us by hand, the lines 0.76).
// Origins never write a target's window: a target posts "consumed through epoch e" after its wait, and an
// origin writes epoch e only once every target has consumed e - kRmaLLDepth (kRmaLLDepth staging slots).
constexpr unsigned long long kRmaLowLatency = 2ull;
constexpr unsigned long long kRmaLLDepth = 4ull;
// kRmaSignalOnly: the queue has no chain; its writes are the origin's own stores into the targets' windows (mapped
// here: Window.peer), made before the start (Queue.add_target). The start releases them and raises the arrivals;
// nothing is posted and no post is waited for: which bytes an origin may write when is the caller's protocol (two
// halves alternating by epoch, for instance). What a kernel whose own output is the message saves: the copy.
constexpr unsigned long long kRmaSignalOnly = 4ull;

// A small chain (at most this many bytes of plain writes, every block a whole number of aligned 8- or
// 16-byte words) is committed as a list of words: thread i of the start copies word i with one load and
// one store, instead of a warp walking a descriptor each (a binary search and dependent loads).
constexpr unsigned long long kRmaSmallChainBytes = 4096;

// One word of a small chain (RmaQueue::words): a load from src, a store to dst, RmaQueue::word_bytes wide.
struct RmaWord {
  unsigned long long src;
  unsigned long long dst;
};

// One low-latency line a target receives (RmaQueue::lines): polled at staging + (epoch % kRmaLLDepth) *
// RmaQueue::ll_slot_bytes (my memory), its 8 bytes stored to dst (my window), from rank `origin`.
struct RmaLine {
  unsigned long long staging;
  unsigned long long dst;
  unsigned long long origin;
  unsigned long long reserved;
};

// One declared write, as the copy kernel reads it (72 bytes).
struct RmaDescriptor {
  unsigned long long src;          // my source address
  unsigned long long dst;          // destination, the target's memory mapped here (CUDA IPC)
  unsigned long long count;        // blocks
  unsigned long long block_bytes;
  unsigned long long src_stride;   // bytes between block starts
  unsigned long long dst_stride;
  unsigned long long unit_begin;   // first work unit of this descriptor (prefix sum over the chain)
  unsigned int units_per_block;    // ceil(block_bytes / kRmaChunkBytes) (1 when blocks_per_unit > 1)
  unsigned int align;              // widest access all addresses, sizes and strides allow: 16, 8, 4, 2, 1
  unsigned int blocks_per_unit;    // whole blocks per unit: kRmaChunkBytes / block_bytes for small blocks, else 1
  unsigned int reserved;
};

// Per-queue state that lives in this rank's device memory and survives launches.
struct RmaState {
  unsigned long long epoch;        // last epoch started on the device (host- or device-driven)
  unsigned long long done_ctas;    // CTAs of the current start launch that finished copying
  unsigned long long failed;       // set (atomically, in device memory) by the first failing wait
};

// The first failure a device-side wait saw; in host-mapped memory so the host reads it
// without a copy (written with plain stores by the one thread that won RmaState::failed:
// atomics on host memory would need PCIe atomics). code 0: none, 1: a target did not post, 2: an origin's writes did not arrive.
// 3: a device-driven rma_start compiled without <circuslink/transpose.cuh> on a queue with transposing puts.
// kRmaErrSession: rma_session on a queue a session does not take (rank: the block's threads).
constexpr unsigned long long kRmaErrSession = 4ull;
struct RmaErrorRecord {
  unsigned long long code;
  unsigned long long rank;
  unsigned long long epoch;
};

// A committed queue in device memory (RmaHandle::queue points at it).
// Counters (uint64, in each rank's `signals`): [0, size) arrivals, slot o raised by origin o
// once its writes of an epoch are visible; [size, 2 size) posts, slot t raised by target t
// when I may write epoch e into it.
struct RmaQueue {
  const RmaDescriptor* descs;
  unsigned long long n_descs;
  unsigned long long total_units;
  unsigned long long* signals;                      // my counters
  unsigned long long size;                          // ranks in the world
  const unsigned long long* targets;                // rank of each target
  unsigned long long* const* arrival_at_target;     // &target.signals[me], mapped here
  unsigned long long n_targets;
  const unsigned long long* origins;                // rank of each origin
  unsigned long long* const* post_at_origin;        // &origin.signals[size + me], mapped here
  unsigned long long n_origins;
  RmaState* state;
  RmaErrorRecord* error;
  unsigned long long timeout_ns;                    // the queue's time-out (commit); 0: never (the host may abort)
  unsigned long long post_at_wait;                  // 1: post epoch e+1 at the end of wait(e)
  const volatile unsigned int* abort;               // host-mapped: set by the host to end every wait
  const RmaTransposeChain* transposes;              // transposing puts (nullptr: none), after the copies
  unsigned long long flags;                         // kRmaGpuScope
  const RmaWord* words;                             // the plain writes as words (small chains), else nullptr
  unsigned long long n_words;
  unsigned long long word_bytes;                    // 8 or 16 (0 without words); 8 with kRmaLowLatency
  // kRmaLowLatency: words[i].dst is its line in the target's staging (slot 0, mapped here)
  const RmaLine* lines;                             // the lines I receive (nullptr: none)
  unsigned long long n_lines;
  unsigned long long ll_slot_bytes;                 // bytes between the staging slots of consecutive epochs
  unsigned long long ll_base;                       // the epoch at commit: credits are owed from ll_base + kRmaLLDepth
};

// The device handle of a committed queue: what Queue.device_handle() returns (a numpy scalar of this
// struct) and rma_start / rma_wait receive, by value, like every circuslink device handle. `q` is a copy
// of *queue (fixed from commit on): a kernel that takes the handle as a parameter reads the queue's fields
// from its parameters (the constant bank) instead of device memory, whose L1 copy every acquire poll
// invalidates, so that no field read is one more L2 trip on a cycle's critical path. A handle from before
// the queue's last commit is stale (as its pointer is).
struct RmaHandle {
  const RmaQueue* queue;
  RmaQueue q;
};

}  // namespace circuslink
