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
  kCgSlots = 16,
};
enum CgFlag : int {
  kCgConverged = 1,   // |r|^2 <= stop: the CG freezes (alpha = 0, p kept) until the host looks
  kCgDue = 2,         // |r|^2 < delta^2 max |r|^2: a reliable update is due at the host's next look
  kCgStalled = 4,     // <p, Ap> <= 0: frozen; the host restarts from the true residual
  kCgSkip = 8,        // this iteration began frozen: its p = r + beta p is skipped
};

}  // namespace qcd
}  // namespace circuslink
