// circuslink/qcd/dslash_types.cuh: the arguments of the Wilson dslash kernels (apps/qcd/dslash.cu).
//
// The host packs this struct from its ABI table (circuslink/apps/qcd/_cuda.py, DSLASH_ARGS) and passes it
// by value; change both together (the ABI test compiles static_asserts of the table against this header).
//
// Layouts (docs/qcd.md): a spinor field of one parity is 24*Vh reals, stored as (24 / V, Vh, V) with V the
// reals of one 16-byte vector (4 in single, 2 in double): a thread reads its site's spinor as 6 float4 or 12
// double2 loads, coalesced across the warp; spin-colour component k = 3 spin + colour. The gauge field is
// (parity, mu, 9, Vh) complex (element 3 a + b). Send and ghost arrays of half spinors are (6, S) complex.
#pragma once

namespace circuslink {
namespace qcd {

struct DslashArgs {
  void* out;              // the field written (of parity `parity`)
  const void* in;         // the field hopped from (the other parity); pack: the field whose faces are sent
  const void* x;          // out = a x + b D in when has_x; xpay_pack: p = x + beta p (beta: a kernel argument)
  const void* gauge;      // (2, 4, 9, Vh) complex
  void* send;             // (6, faces) half spinors this rank sends
  const void* ghost;      // (6, faces) half spinors received
  // Where the faces written (emit, pack) go, slot (mu, d) at index 2 mu + d, laid out as `send`: `send` itself,
  // or, for the resident CG's direct faces, the ghost half of the neighbour that slot feeds (mapped here)
  void* face_to[8];
  const int* sites;       // checkerboard sites a list kernel visits (exterior, pack); n_sites of them
  double a;               // out = a x + b D in
  double b;
  double fwd_sign[4];     // sign of a forward hop that leaves the local lattice (antiperiodic t)
  double bwd_sign[4];
  int dims[4];            // local X, Y, Z, T (all even)
  int face_offset[8];     // first face site of slot (mu, d) at index 2 mu + d
  int vh;                 // sites of one parity
  int faces;              // S: face sites of all slots
  int n_sites;
  int parity;             // parity of `out` (pack / xpay_pack: of the field packed)
  int dagger;             // the hop's dagger (pack: of the hop the faces are for)
  int emit;               // -1: none; 0 / 1: write the faces of `out` for a next hop of that dagger
  int partitioned;        // bit mu set: direction mu is split over ranks (faces travel)
  int has_x;
};

// The device-resident CG's scalars: a double array in device memory (apps/qcd/_cgstate.py mirrors these).
enum CgSlot : int {
  kCgLocal = 0,       // in: this rank's part of a reduction; out: the global sum
  kCgRr = 1,          // iterated |r|^2
  kCgAlpha = 2,
  kCgBeta = 3,
  kCgStop = 4,        // converged when |r|^2 <= this
  kCgMaxRr = 5,       // the largest |r|^2 since the last reliable update
  kCgIterations = 6,  // iterations done (frozen ones not counted)
  kCgFlags = 7,       // CgFlag bits, as a double
  // The reliable updates' book (QUDA's maxResIncrease counts), kept by the host and by the resident kernel
  // that makes the updates itself (cg_update_step)
  kCgUpdates = 8,          // reliable updates made
  kCgTrueRr = 9,           // |rhs - A y|^2 of the last one
  kCgIncreases = 10,       // consecutive updates whose |rhs - A y|^2 grew
  kCgIncreasesTotal = 11,  // and in all
  kCgSlots = 16,
};
enum CgFlag : int {
  kCgConverged = 1,   // |r|^2 <= stop: the CG freezes (alpha = 0, p kept) until the host looks
  kCgDue = 2,         // |r|^2 < delta^2 max |r|^2: frozen until the reliable update is made
  kCgStalled = 4,     // <p, Ap> <= 0: frozen; the host restarts from the true residual
  kCgSkip = 8,        // this iteration began frozen: its p = r + beta p is skipped
  kCgUpdated = 16,    // frozen after a reliable update made on the device (y, r and kCgTrueRr are current, x
                      // is zero): |rhs - A y|^2 <= stop, or it grew too often; the host decides what follows
  kCgFrozen = kCgConverged | kCgDue | kCgStalled,
};
// A true residual that grew at more than this many reliable updates in a row, or in all, ends the solve
// (QUDA's maxResIncrease and maxResIncreaseTotal; apps/qcd/_cgstate.py mirrors them)
enum CgLimits : int { kCgMaxIncreases = 1, kCgMaxIncreasesTotal = 10 };

// The resident CG kernel's arguments (qcd_cg_resident_*, by value; the host's table is
// apps/qcd/_cuda.py, CG_RESIDENT_ARGS). One launch runs up to `iterations` CG iterations and ends early
// once the scalars freeze: hops, halos (the rank's RMA queue, from block 0), reductions over ranks and
// the vector updates all happen inside it, separated by grid barriers. With `updates`, a due reliable
// update is made inside it too (the precise operator's hops on the precise fields, its own queue), and
// the launch ends only where the host must decide (the true residual of the full system, a stall).
enum CgPhase : int { kPhaseDslash = 0, kPhaseHalo = 1, kPhaseReduction = 2, kPhaseVector = 3, kPhases = 4 };
enum CgStatus : int { kCgOk = 0, kCgHaloFailed = 1, kCgBarrierFailed = 2, kCgSumFailed = 3 };

struct CgResidentArgs {
  const DslashArgs* hops;             // device array of 9: the 4 hops' interiors, their exteriors, p = r + beta p
  void* x;                            // the iterated increment, residual, direction and A p (the sloppy
  void* r;                            // precision's reals, n of each)
  const void* p;
  const void* ap;
  // The reliable update made inside the kernel (mixed precision, `updates` = 1): the precise operator's 4
  // hops (interiors, exteriors) and the faces of y (entry 8, out = in = y), and the precise fields
  const DslashArgs* precise_hops;
  void* y;                            // the solution so far
  const void* rhs;                    // the normal equations' right-hand side
  void* precise_r;                    // rhs - A y
  const void* precise_ap;             // A y
  double* s;                          // the scalars (CgSlot)
  double* partial;                    // one double per block (block sums of a reduction)
  unsigned int* done;                 // blocks done with a reduction (the last one adds up; back to 0)
  unsigned long long* phase_ns;       // kPhases accumulators on block 0's clock (globaltimer)
  unsigned long long* const* peers;   // every rank's sum slots, mapped here (rank order; mine included)
  unsigned long long* seq;            // this rank's count of global sums (every rank makes the same ones)
  int* status;                        // [CgStatus, the rank a sum waited for]
  long long n;                        // reals in one field
  long long n_precise;                // reals in one precise field
  double delta2;                      // the reliable-update threshold squared
  unsigned long long timeout_ns;      // a wait for a peer's part of a sum gives up after this long
  int rank;
  int size;
  int iterations;                     // at most this many iterations in this launch
  int halo;                           // 1: partitioned directions: the hops exchange faces through the queue
  int updates;                        // 1: a due reliable update is made here (the precise fields are given)
  int split;                          // lanes a site in the hops' interiors: 1, 2, 4 or 8 (a lattice too small to
                                      // give every thread a site spreads its 8 directions)
  int face_blocks;                    // blocks that copy the faces of a hop together (rma_start_team), the rest
                                      // taking the interior meanwhile
  int direct;                         // 1: the hops' faces go straight into the neighbours' ghost halves
                                      // (face_to) and the queues only signal; each launch first writes p's
  int one_pass;                       // with direct: a hop is one pass over its sites (whole_hop_sites), not
                                      // the interior, a grid barrier and the exterior
  int gpu_scope;                      // 1: every rank shares this GPU (under MPS): the sums over ranks release
                                      // and acquire at .gpu scope, as the RMA queues' counters do
};

}  // namespace qcd
}  // namespace circuslink
