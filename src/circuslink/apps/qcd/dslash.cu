// Wilson dslash on the even-odd checkerboard, single and double precision (docs/qcd.md).
//
// One thread per output site. A hop out = a x + b D_{p <- 1-p} in is split in two launches when
// directions are partitioned over ranks:
//   qcd_dslash_interior_*  every hop whose neighbour is on this rank (launched while the faces travel),
//   qcd_dslash_exterior_*  the hops across partitioned boundaries, from the ghost half spinors, for the
//                          boundary sites only; it can write the projected faces of the finished output
//                          for the next hop (`emit`), so no separate pack kernel runs between hops.
// qcd_dslash_device_* does both in one launch and drives the RMA queue itself (circuslink::rma_start /
// rma_wait from block 0, a grid barrier between interior and exterior). qcd_xpay_pack_* is the CG's
// p = r + beta p fused with the projection of p's faces (or, without x, a plain projection of a field's
// faces). qcd_dot_* and qcd_axpy_norm_* are the CG's reductions (double accumulation, one launch each:
// the last block to finish adds the block sums).
//
// The device-resident CG (apps/qcd/_cgstate.py) keeps its scalars in a double array in device memory:
// qcd_cg_scalars sums a reduction over ranks with the device collectives (one block, the low-latency
// ring) and computes alpha, or beta, |r|^2 and the flags; qcd_axpy_norm_state_* and qcd_xpay_pack_state_*
// read alpha and beta from that array, so an iteration never waits for the host and can be a CUDA graph.
//
// Conventions: D psi(x) = sum_mu (1 - g_mu) U_mu(x) psi(x + mu) + (1 + g_mu) U_mu(x - mu)^dagger psi(x - mu)
// (dagger: the signs flip), DeGrand-Rossi gammas g_mu = ((0, A_mu), (A_mu^dagger, 0)) with A_x = i s1,
// A_y = -i s2, A_z = i s3, A_t = 1. The half spinor of (1 + s g_mu) psi is h = psi_up + s A_mu psi_down
// (2 spins x 3 colours = 12 reals); the lower half is s A_mu^dagger h.
#include <circuslink/detail/sync.cuh>
#include <circuslink/grid.cuh>
#include <circuslink/qcd/dslash_types.cuh>
// One low-latency line a thread at a time in the queue's waits (four by default), and one small chain's word a
// thread loaded ahead in its starts (two): inlined into the resident CG, the defaults made ptxas spill its
// registers (sm_90, single precision: 496 bytes of spill stores, none with one of each; double 1,408 and 464),
// and a kernel that spilled so ran its one-rank iteration 11 % slower (BENCHMARKS.md). Faces travel as lines and
// words only below 4 KiB a rank (tiny local lattices), where one at a time costs little.
#ifndef CIRCUSLINK_RMA_LINES_IN_FLIGHT
#define CIRCUSLINK_RMA_LINES_IN_FLIGHT 1
#endif
#ifndef CIRCUSLINK_RMA_WORDS_AHEAD
#define CIRCUSLINK_RMA_WORDS_AHEAD 1
#endif
#include <circuslink/rma.cuh>

// The per-site functions are __host__ __device__ so that a host program can run them over a lattice and
// compare them with the numpy back-end module (tests/qcd_dslash_host.cu): the kernels' index arithmetic, layouts and
// spin algebra are checked on machines without a GPU.
#ifdef __CUDA_ARCH__
#define QCD_LDG(p) __ldg(p)
#else
#define QCD_LDG(p) (*(p))
#endif
#define QCD_HD __host__ __device__ __forceinline__

namespace circuslink {
namespace qcd {
namespace {

template <typename R>
struct Cx {
  R re, im;
};

template <typename R>
QCD_HD Cx<R> cx(R re, R im) {
  Cx<R> c;
  c.re = re;
  c.im = im;
  return c;
}
template <typename R>
QCD_HD Cx<R> operator+(Cx<R> a, Cx<R> b) { return cx(a.re + b.re, a.im + b.im); }
template <typename R>
QCD_HD Cx<R> operator-(Cx<R> a, Cx<R> b) { return cx(a.re - b.re, a.im - b.im); }
template <typename R>
QCD_HD Cx<R> operator*(R s, Cx<R> a) { return cx(s * a.re, s * a.im); }
// a * b and conj(a) * b
template <typename R>
QCD_HD Cx<R> mul(Cx<R> a, Cx<R> b) { return cx(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re); }
template <typename R>
QCD_HD Cx<R> cmul(Cx<R> a, Cx<R> b) { return cx(a.re * b.re + a.im * b.im, a.re * b.im - a.im * b.re); }

template <typename R>
struct Spinor {
  Cx<R> c[12];  // 3 spin + colour
};
template <typename R>
struct Half {
  Cx<R> c[6];  // 3 spin + colour, spin 0..1
};

// -- loads and stores in the kernels' layouts ----------------------------------------------------------
QCD_HD void load_spinor(const float* f, int vh, int i, Spinor<float>& s) {
  const float4* v = reinterpret_cast<const float4*>(f);
#pragma unroll
  for (int k = 0; k < 6; ++k) {
    const float4 q = QCD_LDG(v + (unsigned long long)k * vh + i);
    s.c[2 * k] = cx(q.x, q.y);
    s.c[2 * k + 1] = cx(q.z, q.w);
  }
}
QCD_HD void load_spinor(const double* f, int vh, int i, Spinor<double>& s) {
  const double2* v = reinterpret_cast<const double2*>(f);
#pragma unroll
  for (int k = 0; k < 12; ++k) {
    const double2 q = QCD_LDG(v + (unsigned long long)k * vh + i);
    s.c[k] = cx(q.x, q.y);
  }
}
// Without __ldg: a field this kernel (or its launch) also writes.
QCD_HD void load_spinor_rw(const float* f, int vh, int i, Spinor<float>& s) {
  const float4* v = reinterpret_cast<const float4*>(f);
#pragma unroll
  for (int k = 0; k < 6; ++k) {
    const float4 q = v[(unsigned long long)k * vh + i];
    s.c[2 * k] = cx(q.x, q.y);
    s.c[2 * k + 1] = cx(q.z, q.w);
  }
}
QCD_HD void load_spinor_rw(const double* f, int vh, int i, Spinor<double>& s) {
  const double2* v = reinterpret_cast<const double2*>(f);
#pragma unroll
  for (int k = 0; k < 12; ++k) {
    const double2 q = v[(unsigned long long)k * vh + i];
    s.c[k] = cx(q.x, q.y);
  }
}
QCD_HD void store_spinor(float* f, int vh, int i, const Spinor<float>& s) {
  float4* v = reinterpret_cast<float4*>(f);
#pragma unroll
  for (int k = 0; k < 6; ++k) {
    float4 q;  // (no make_float4: NVRTC without the runtime headers)
    q.x = s.c[2 * k].re;
    q.y = s.c[2 * k].im;
    q.z = s.c[2 * k + 1].re;
    q.w = s.c[2 * k + 1].im;
    v[(unsigned long long)k * vh + i] = q;
  }
}
QCD_HD void store_spinor(double* f, int vh, int i, const Spinor<double>& s) {
  double2* v = reinterpret_cast<double2*>(f);
#pragma unroll
  for (int k = 0; k < 12; ++k) {
    double2 q;
    q.x = s.c[k].re;
    q.y = s.c[k].im;
    v[(unsigned long long)k * vh + i] = q;
  }
}

// A field that a hop reads: through the read-only cache (kLdg), or - inside the resident CG kernel, where
// the field was written earlier in the same launch by other blocks - with plain loads.
template <bool kLdg, typename R>
QCD_HD void load_field(const R* f, int vh, int i, Spinor<R>& s) {
  if (kLdg) {
    load_spinor(f, vh, i, s);
  } else {
    load_spinor_rw(f, vh, i, s);
  }
}

template <typename R>
QCD_HD Cx<R> load_cx(const R* base, unsigned long long index) {
  return cx(QCD_LDG(base + 2 * index), QCD_LDG(base + 2 * index + 1));
}
template <typename R>
QCD_HD void store_cx(R* base, unsigned long long index, Cx<R> v) {
  base[2 * index] = v.re;
  base[2 * index + 1] = v.im;
}

template <typename R>
struct Link {
  Cx<R> m[9];  // 3 a + b
};
// U^dagger (element 3 a + b is conj(U's 3 b + a)) where `dagger`, else U: the backward hop's link is then
// applied as a forward one's, by the same instructions (a select of the address, a sign).
template <typename R>
QCD_HD void load_link(const R* gauge, int vh, int parity, int mu, int site, bool dagger, Link<R>& u) {
  const unsigned long long base = ((unsigned long long)(parity * 4 + mu) * 9) * vh + site;
  const R im = dagger ? R(-1) : R(1);
#pragma unroll
  for (int e = 0; e < 9; ++e) {
    const int from = dagger ? 3 * (e % 3) + e / 3 : e;
    const Cx<R> v = load_cx(gauge, base + (unsigned long long)from * vh);
    u.m[e] = cx(v.re, im * v.im);
  }
}
template <typename R>
QCD_HD void load_link(const R* gauge, int vh, int parity, int mu, int site, Link<R>& u) {
  load_link(gauge, vh, parity, mu, site, false, u);
}

// Plain loads: in the device-driven hop the ghosts arrive from peers while the kernel runs.
template <typename R>
QCD_HD void load_half(const R* ghost, int faces, int index, R sign, Half<R>& h) {
#pragma unroll
  for (int k = 0; k < 6; ++k) {
    const unsigned long long at = (unsigned long long)k * faces + index;
    h.c[k] = sign * cx(ghost[2 * at], ghost[2 * at + 1]);
  }
}
template <typename R>
QCD_HD void store_half(R* send, int faces, int index, const Half<R>& h) {
#pragma unroll
  for (int k = 0; k < 6; ++k) store_cx(send, (unsigned long long)k * faces + index, h.c[k]);
}

// -- spin projection and reconstruction ----------------------------------------------------------------
// Branch-free in mu, so that lanes of one warp can take different directions (the split hop below) without
// diverging; where mu is a constant the selects and the multiplications by +-1 fold away. A_mu has two
// non-zero entries, each +-1 or +-i: off the diagonal for mu = 0, 1 (h0 takes psi_down's spin 1), on it for
// mu = 2, 3. A unit u is {rot: u is imaginary, sign}.
struct Unit {
  bool rot;
  int sign;
};
template <typename R>
QCD_HD Cx<R> times(Unit u, R s, Cx<R> a) {  // s u a
  const R k = u.sign < 0 ? -s : s;
  return u.rot ? cx(-k * a.im, k * a.re) : cx(k * a.re, k * a.im);
}
QCD_HD bool off_diagonal(int mu) { return mu < 2; }
// A_mu's entry in row 0 and in row 1: i s1 -> (i, i); -i s2 -> (-1, 1); i s3 -> (i, -i); 1 -> (1, 1)
QCD_HD Unit gamma_entry0(int mu) { return Unit{(mu & 1) == 0, mu == 1 ? -1 : 1}; }
QCD_HD Unit gamma_entry1(int mu) { return Unit{(mu & 1) == 0, mu == 2 ? -1 : 1}; }
QCD_HD Unit conj(Unit u) { return Unit{u.rot, u.rot ? -u.sign : u.sign}; }

// h = psi_up + s A_mu psi_down
template <typename R>
QCD_HD void project(int mu, R s, const Spinor<R>& p, Half<R>& h) {
  const bool swap = off_diagonal(mu);
  const Unit e0 = gamma_entry0(mu), e1 = gamma_entry1(mu);
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const Cx<R> u0 = p.c[c], u1 = p.c[3 + c], d0 = p.c[6 + c], d1 = p.c[9 + c];
    h.c[c] = u0 + times(e0, s, swap ? d1 : d0);
    h.c[3 + c] = u1 + times(e1, s, swap ? d0 : d1);
  }
}

// acc += (h, s A_mu^dagger h)
template <typename R>
QCD_HD void accumulate(int mu, R s, const Half<R>& h, Spinor<R>& acc) {
  const bool swap = off_diagonal(mu);
  const Unit e0 = conj(gamma_entry0(mu)), e1 = conj(gamma_entry1(mu));
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const Cx<R> h0 = h.c[c], h1 = h.c[3 + c];
    acc.c[c] = acc.c[c] + h0;
    acc.c[3 + c] = acc.c[3 + c] + h1;
    // A^dagger's row 0 is (conj A_00, conj A_10), row 1 (conj A_01, conj A_11)
    acc.c[6 + c] = acc.c[6 + c] + (swap ? times(e1, s, h1) : times(e0, s, h0));
    acc.c[9 + c] = acc.c[9 + c] + (swap ? times(e0, s, h0) : times(e1, s, h1));
  }
}

// U h and U^dagger h, colour by colour for both spins
template <typename R>
QCD_HD void link_times(const Link<R>& u, const Half<R>& h, Half<R>& out) {
#pragma unroll
  for (int sp = 0; sp < 2; ++sp)
#pragma unroll
    for (int a = 0; a < 3; ++a)
      out.c[3 * sp + a] = mul(u.m[3 * a], h.c[3 * sp]) + mul(u.m[3 * a + 1], h.c[3 * sp + 1]) +
                          mul(u.m[3 * a + 2], h.c[3 * sp + 2]);
}
template <typename R>
QCD_HD void link_dagger_times(const Link<R>& u, const Half<R>& h, Half<R>& out) {
#pragma unroll
  for (int sp = 0; sp < 2; ++sp)
#pragma unroll
    for (int a = 0; a < 3; ++a)
      out.c[3 * sp + a] = cmul(u.m[a], h.c[3 * sp]) + cmul(u.m[3 + a], h.c[3 * sp + 1]) +
                          cmul(u.m[6 + a], h.c[3 * sp + 2]);
}

// -- geometry -------------------------------------------------------------------------------------------
struct Site {
  int c[4];
};

QCD_HD Site site_coords(const DslashArgs& A, int cb, int parity) {
  Site s;
  const int lex0 = 2 * cb;
  const int x0 = lex0 % A.dims[0];
  int rest = lex0 / A.dims[0];
  s.c[1] = rest % A.dims[1];
  rest /= A.dims[1];
  s.c[2] = rest % A.dims[2];
  s.c[3] = rest / A.dims[2];
  s.c[0] = x0 + ((parity + s.c[1] + s.c[2] + s.c[3]) & 1);
  return s;
}

// A site's index within the face of direction mu: its other three coordinates, t slowest, halved.
QCD_HD int face_index(const DslashArgs& A, const Site& s, int mu) {
  int idx = 0;
#pragma unroll
  for (int nu = 3; nu >= 0; --nu)
    if (nu != mu) idx = idx * A.dims[nu] + s.c[nu];
  return idx >> 1;
}

QCD_HD bool partitioned(const DslashArgs& A, int mu) { return (A.partitioned >> mu) & 1; }

// -- the hop ----------------------------------------------------------------------------------------------
// A site's coordinates and its lexicographic index (the checkerboard index is half of it).
struct Where {
  Site s;
  int lex;
};
QCD_HD Where where(const DslashArgs& A, int cb, int parity) {
  Where w;
  w.s = site_coords(A, cb, parity);
  w.lex = ((w.s.c[3] * A.dims[2] + w.s.c[2]) * A.dims[1] + w.s.c[1]) * A.dims[0] + w.s.c[0];
  return w;
}

// Direction d of site `cb`'s interior hop: mu = d / 2, forward (d even: (1 + s_up g) U_mu(x) psi(x + mu)) or
// backward ((1 - s_up g) U_mu(x - mu)^dagger psi(x - mu)), added to acc; nothing where the neighbour is on
// another rank (with kGhosts, the ghost's term instead: the exterior's, in the same pass). Written with selects
// on d rather than branches: the split hop gives the lanes of one site different d, and with d a constant (the
// unrolled loop of interior_site) it compiles to the plain hop.
template <typename R, bool kLdg, bool kGhosts = false>
QCD_HD void hop_term(const DslashArgs& A, const Where& w, int cb, int d, R s_up, Spinor<R>& acc) {
  const int mu = d >> 1;
  const bool back = (d & 1) != 0;
  const int L = A.dims[mu];
  const int c = mu == 0 ? w.s.c[0] : mu == 1 ? w.s.c[1] : mu == 2 ? w.s.c[2] : w.s.c[3];
  const bool edge = back ? c == 0 : c == L - 1;
  const R sign = back ? -s_up : s_up;
  if (edge && partitioned(A, mu)) {
    if constexpr (kGhosts) {  // as exterior_site: the neighbour's projected spinor (U^dagger applied there)
      Half<R> h;
      load_half(static_cast<const R*>(A.ghost), A.faces, A.face_offset[2 * mu + (back ? 1 : 0)] +
                face_index(A, w.s, mu), R(back ? A.bwd_sign[mu] : A.fwd_sign[mu]), h);
      if (back) {
        accumulate(mu, sign, h, acc);
      } else {
        Link<R> u;
        Half<R> uh;
        load_link(static_cast<const R*>(A.gauge), A.vh, A.parity, mu, cb, u);
        link_times(u, h, uh);
        accumulate(mu, sign, uh, acc);
      }
    }
    return;
  }
  const int stride = mu == 0 ? 1 : mu == 1 ? A.dims[0] : mu == 2 ? A.dims[0] * A.dims[1]
                                                                 : A.dims[0] * A.dims[1] * A.dims[2];
  const int step = back ? (edge ? L - 1 : -1) : (edge ? 1 - L : 1);
  const int nb = (w.lex + step * stride) >> 1;
  Spinor<R> psi;
  load_field<kLdg>(static_cast<const R*>(A.in), A.vh, nb, psi);
  Half<R> h, uh;
  project(mu, sign, psi, h);
  if (edge && (back ? A.bwd_sign[mu] : A.fwd_sign[mu]) < 0) {  // crossed the antiperiodic t boundary (local wrap)
#pragma unroll
    for (int k = 0; k < 6; ++k) h.c[k] = R(-1) * h.c[k];
  }
  Link<R> u;
  load_link(static_cast<const R*>(A.gauge), A.vh, back ? 1 - A.parity : A.parity, mu, back ? nb : cb, back, u);
  link_times(u, h, uh);
  accumulate(mu, sign, uh, acc);
}

// Directions first, first + step, ... < 8 of site cb's interior hop, into acc (zeroed here).
template <typename R, bool kLdg, bool kGhosts = false>
QCD_HD void interior_part(const DslashArgs& A, const Where& w, int cb, int first, int step, Spinor<R>& acc) {
  const R s_up = A.dagger ? R(1) : R(-1);
#pragma unroll
  for (int k = 0; k < 12; ++k) acc.c[k] = cx(R(0), R(0));
#pragma unroll
  for (int d = first; d < 8; d += step) hop_term<R, kLdg, kGhosts>(A, w, cb, d, s_up, acc);
}

// One 16-byte vector of a field (k of the site's 6 in single, 12 in double: the layout of load_spinor), as
// complex numbers.
template <bool kLdg>
QCD_HD void load_vector(const float* f, int vh, int k, int i, Cx<float>* v) {
  const float4* at = reinterpret_cast<const float4*>(f) + (unsigned long long)k * vh + i;
  const float4 q = kLdg ? QCD_LDG(at) : *at;
  v[0] = cx(q.x, q.y);
  v[1] = cx(q.z, q.w);
}
template <bool kLdg>
QCD_HD void load_vector(const double* f, int vh, int k, int i, Cx<double>* v) {
  const double2* at = reinterpret_cast<const double2*>(f) + (unsigned long long)k * vh + i;
  const double2 q = kLdg ? QCD_LDG(at) : *at;
  v[0] = cx(q.x, q.y);
}
QCD_HD void store_vector(float* f, int vh, int k, int i, const Cx<float>* v) {
  float4 q;
  q.x = v[0].re;
  q.y = v[0].im;
  q.z = v[1].re;
  q.w = v[1].im;
  reinterpret_cast<float4*>(f)[(unsigned long long)k * vh + i] = q;
}
QCD_HD void store_vector(double* f, int vh, int k, int i, const Cx<double>* v) {
  double2 q;
  q.x = v[0].re;
  q.y = v[0].im;
  reinterpret_cast<double2*>(f)[(unsigned long long)k * vh + i] = q;
}

// out = a x + b acc at site cb: the 16-byte vectors k with k % split == part (all of them for split 1), so
// that the lanes of a split site share its stores.
template <typename R, bool kLdg>
QCD_HD void interior_finish(const DslashArgs& A, int cb, const Spinor<R>& acc, int part, int split) {
  constexpr int kPer = 16 / (2 * sizeof(R));  // complex numbers in a 16-byte vector
  const R a = R(A.a), b = R(A.b);
#pragma unroll
  for (int k = 0; k < 12 / kPer; ++k) {
    if ((k & (split - 1)) != part) continue;
    Cx<R> v[kPer];
    if (A.has_x) {
      load_vector<kLdg>(static_cast<const R*>(A.x), A.vh, k, cb, v);
#pragma unroll
      for (int j = 0; j < kPer; ++j) v[j] = a * v[j] + b * acc.c[kPer * k + j];
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) v[j] = b * acc.c[kPer * k + j];
    }
    store_vector(static_cast<R*>(A.out), A.vh, k, cb, v);
  }
}

// Every hop of site `cb` whose neighbour lives on this rank (all of them when nothing is partitioned).
template <typename R, bool kLdg = true>
QCD_HD void interior_site(const DslashArgs& A, int cb) {
  const Where w = where(A, cb, A.parity);
  Spinor<R> acc;
  interior_part<R, kLdg>(A, w, cb, 0, 1, acc);
  interior_finish<R, kLdg>(A, cb, acc, 0, 1);
}

// The faces of `psi` (site `cb` of parity `parity`) that a next hop with `dagger` needs, into send.
template <typename R>
QCD_HD void emit_faces(const DslashArgs& A, const Site& s, int cb, int parity, int dagger,
                                           const Spinor<R>& psi) {
  const R s_up = dagger ? R(1) : R(-1);
#pragma unroll
  for (int mu = 0; mu < 4; ++mu) {
    if (!partitioned(A, mu)) continue;
    if (s.c[mu] == 0) {  // feeds the backward neighbour's forward hop
      Half<R> h;
      project(mu, s_up, psi, h);
      store_half(static_cast<R*>(A.face_to[2 * mu]), A.faces, A.face_offset[2 * mu] + face_index(A, s, mu), h);
    }
    if (s.c[mu] == A.dims[mu] - 1) {  // feeds the forward neighbour's backward hop, U^dagger applied here
      Half<R> h, uh;
      project(mu, -s_up, psi, h);
      Link<R> u;
      load_link(static_cast<const R*>(A.gauge), A.vh, parity, mu, cb, u);
      link_dagger_times(u, h, uh);
      store_half(static_cast<R*>(A.face_to[2 * mu + 1]), A.faces, A.face_offset[2 * mu + 1] + face_index(A, s, mu),
                 uh);
    }
  }
}

QCD_HD bool on_face(const DslashArgs& A, const Site& s) {
  bool face = false;
#pragma unroll
  for (int mu = 0; mu < 4; ++mu) face |= partitioned(A, mu) && (s.c[mu] == 0 || s.c[mu] == A.dims[mu] - 1);
  return face;
}

// The faces of `psi` (site `cb` of A.parity) for a next hop with A.dagger, where the site lies on one.
template <typename R>
QCD_HD void emit_if_on_face(const DslashArgs& A, int cb, const Spinor<R>& psi) {
  const Site s = site_coords(A, cb, A.parity);
  if (on_face(A, s)) emit_faces(A, s, cb, A.parity, A.dagger, psi);
}

// The faces of A.out as it stands (site `cb`), read only where the site lies on one.
template <typename R>
QCD_HD void emit_out_if_on_face(const DslashArgs& A, int cb) {
  const Site s = site_coords(A, cb, A.parity);
  if (!on_face(A, s)) return;
  Spinor<R> psi;
  load_spinor_rw(static_cast<const R*>(A.out), A.vh, cb, psi);
  emit_faces(A, s, cb, A.parity, A.dagger, psi);
}

// The hops of boundary site `cb` that cross partitioned boundaries, from the ghosts; then its faces.
template <typename R>
QCD_HD void exterior_site(const DslashArgs& A, int cb) {
  const R* gauge = static_cast<const R*>(A.gauge);
  const R* ghost = static_cast<const R*>(A.ghost);
  const int p = A.parity;
  const R s_up = A.dagger ? R(1) : R(-1);
  const Site s = site_coords(A, cb, p);
  Spinor<R> acc;
#pragma unroll
  for (int k = 0; k < 12; ++k) acc.c[k] = cx(R(0), R(0));
#pragma unroll
  for (int mu = 0; mu < 4; ++mu) {
    if (!partitioned(A, mu)) continue;
    if (s.c[mu] == A.dims[mu] - 1) {
      Half<R> h, uh;
      load_half(ghost, A.faces, A.face_offset[2 * mu] + face_index(A, s, mu), R(A.fwd_sign[mu]), h);
      Link<R> u;
      load_link(gauge, A.vh, p, mu, cb, u);
      link_times(u, h, uh);
      accumulate(mu, s_up, uh, acc);
    }
    if (s.c[mu] == 0) {
      Half<R> h;
      load_half(ghost, A.faces, A.face_offset[2 * mu + 1] + face_index(A, s, mu), R(A.bwd_sign[mu]), h);
      accumulate(mu, -s_up, h, acc);
    }
  }
  R* out = static_cast<R*>(A.out);
  Spinor<R> o;
  load_spinor_rw(out, A.vh, cb, o);
  const R b = R(A.b);
#pragma unroll
  for (int k = 0; k < 12; ++k) o.c[k] = o.c[k] + b * acc.c[k];
  store_spinor(out, A.vh, cb, o);
  if (A.emit >= 0) emit_faces(A, s, cb, p, A.emit, o);
}

template <typename R, bool kLdg = true>
QCD_HD void xpay_pack_site(const DslashArgs& A, int cb, double beta_) {
  Spinor<R> p;
  R* out = static_cast<R*>(A.out);
  if (A.has_x) {  // p = x + beta p
    Spinor<R> x;
    load_field<kLdg>(static_cast<const R*>(A.x), A.vh, cb, x);
    load_spinor_rw(out, A.vh, cb, p);
    const R beta = R(beta_);
#pragma unroll
    for (int k = 0; k < 12; ++k) p.c[k] = x.c[k] + beta * p.c[k];
    store_spinor(out, A.vh, cb, p);
  } else {
    load_spinor_rw(static_cast<const R*>(A.in), A.vh, cb, p);
  }
  emit_if_on_face(A, cb, p);
}

// The mixed-precision reliable update's per-site steps (the resident CG makes them itself; _solver.py makes
// the same ones with array operations). Y: out = y (precise) and the faces of y for the precise operator's
// next hop. y += x (x converted up exactly), x = 0.
template <typename RS, typename RP>
QCD_HD void fold_site(const DslashArgs& Y, RS* x, int cb) {
  Spinor<RS> a;
  load_spinor_rw(x, Y.vh, cb, a);
  Spinor<RP> y;
  RP* out = static_cast<RP*>(Y.out);
  load_spinor_rw(out, Y.vh, cb, y);
#pragma unroll
  for (int k = 0; k < 12; ++k) y.c[k] = y.c[k] + cx(RP(a.c[k].re), RP(a.c[k].im));
  store_spinor(out, Y.vh, cb, y);
#pragma unroll
  for (int k = 0; k < 12; ++k) a.c[k] = cx(RS(0), RS(0));
  store_spinor(x, Y.vh, cb, a);
  emit_if_on_face(Y, cb, y);
}

// P: out = p, x = r_s (sloppy), and the faces of p for the next hop. The new residual r (precise) rounded to
// the sloppy precision replaces r_s, and p takes it in place of the iterated one: p += r_new - r_s.
template <typename RS, typename RP>
QCD_HD void new_residual_site(const DslashArgs& P, const RP* r, int cb) {
  Spinor<RP> wide;
  load_spinor_rw(r, P.vh, cb, wide);
  Spinor<RS> fresh, old, p;
#pragma unroll
  for (int k = 0; k < 12; ++k) fresh.c[k] = cx(RS(wide.c[k].re), RS(wide.c[k].im));
  RS* rs = static_cast<RS*>(const_cast<void*>(P.x));
  RS* out = static_cast<RS*>(P.out);
  load_spinor_rw(rs, P.vh, cb, old);
  load_spinor_rw(out, P.vh, cb, p);
#pragma unroll
  for (int k = 0; k < 12; ++k) p.c[k] = p.c[k] + (fresh.c[k] - old.c[k]);
  store_spinor(out, P.vh, cb, p);
  store_spinor(rs, P.vh, cb, fresh);
  emit_if_on_face(P, cb, p);
}

#ifdef __CUDACC__
// The interior hops of sites first / split, ... (stride / split apart) with `split` (1, 2, 4 or 8) lanes of a
// warp to a site: lane `part` of a site takes directions part, part + split, ..., the lanes add their parts
// (a butterfly: every lane ends with the same sum) and share the stores. On a lattice too small to give every
// thread a site, a hop then waits for one or two neighbours' loads, not eight in a row (the per-site hop keeps
// a few directions in flight at a time within its registers).
template <typename R>
__device__ __forceinline__ void interior_sites(const DslashArgs& A, int first, int stride, int split) {
  if (split == 1) {
    for (int cb = first; cb < A.vh; cb += stride) interior_site<R, false>(A, cb);
    return;
  }
  const int part = first & (split - 1);
  const int lane = threadIdx.x & 31;
  const unsigned int group = ((1u << split) - 1u) << (lane & ~(split - 1));
  for (int cb = first / split; cb < A.vh; cb += stride / split) {
    const Where w = where(A, cb, A.parity);
    Spinor<R> acc;
    interior_part<R, false>(A, w, cb, part, split, acc);
    for (int o = split >> 1; o > 0; o >>= 1) {
#pragma unroll
      for (int k = 0; k < 12; ++k) {
        acc.c[k].re += __shfl_xor_sync(group, acc.c[k].re, o, split);
        acc.c[k].im += __shfl_xor_sync(group, acc.c[k].im, o, split);
      }
    }
    interior_finish<R, false>(A, cb, acc, part, split);
  }
}
#endif

// The whole hop of sites first / split, ... in one pass, the ghosts' terms included (their faces have landed:
// the resident CG's direct faces), as interior_sites; a site on a face then writes the faces of its result for
// the next hop (E.emit). One pass instead of the interior, a grid barrier and the exterior's second pass over
// the boundary sites (their `out` loaded and stored again). whole_hop_finish: a site's end once its lanes have
// added their parts into acc (lane `part` of `split`: its share of the stores; lane 0 the faces);
// whole_hop_site: one site, by lane `part` of the `split` lanes of `group` that share it.
template <typename R>
QCD_HD void whole_hop_finish(const DslashArgs& E, int cb, const Where& w, const Spinor<R>& acc, int part, int split) {
  interior_finish<R, false>(E, cb, acc, part, split);
  if (E.emit < 0 || part != 0 || !on_face(E, w.s)) return;
  const R a = R(E.a), b = R(E.b);
  Spinor<R> o;
  if (E.has_x) {
    load_field<false>(static_cast<const R*>(E.x), E.vh, cb, o);
#pragma unroll
    for (int k = 0; k < 12; ++k) o.c[k] = a * o.c[k] + b * acc.c[k];
  } else {
#pragma unroll
    for (int k = 0; k < 12; ++k) o.c[k] = b * acc.c[k];
  }
  emit_faces(E, w.s, cb, E.parity, E.emit, o);
}

#ifdef __CUDACC__
template <typename R>
__device__ __forceinline__ void whole_hop_site(const DslashArgs& E, int cb, int part, int split, unsigned int group) {
  const Where w = where(E, cb, E.parity);
  Spinor<R> acc;
  interior_part<R, false, true>(E, w, cb, part, split, acc);
  for (int o = split >> 1; o > 0; o >>= 1) {
#pragma unroll
    for (int k = 0; k < 12; ++k) {
      acc.c[k].re += __shfl_xor_sync(group, acc.c[k].re, o, split);
      acc.c[k].im += __shfl_xor_sync(group, acc.c[k].im, o, split);
    }
  }
  whole_hop_finish<R>(E, cb, w, acc, part, split);
}

template <typename R>
__device__ __forceinline__ void whole_hop_sites(const DslashArgs& E, int first, int stride, int split) {
  if (split == 1) {  // constants: the directions' loop unrolls into the plain hop (hop_term's selects fold away)
    for (int cb = first; cb < E.vh; cb += stride) whole_hop_site<R>(E, cb, 0, 1, 0xffffffffu);
    return;
  }
  const int part = first & (split - 1);
  const unsigned int group = ((1u << split) - 1u) << ((threadIdx.x & 31) & ~(split - 1));
  for (int cb = first / split; cb < E.vh; cb += stride / split) whole_hop_site<R>(E, cb, part, split, group);
}
#endif

// -- a grid barrier for the device-driven hop (every block resident: the grid is sized by max_blocks) ----
__device__ __forceinline__ bool grid_barrier(unsigned int* bar, unsigned long long timeout_ns) {
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = 1;
    unsigned int* count = bar;
    unsigned int* generation = bar + 1;
    const unsigned int gen = detail::ld_relaxed(generation);
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      atomicExch(count, 0u);
      __threadfence();
      atomicExch(generation, gen + 1);
    } else {
      detail::Deadline d = detail::Deadline::after(timeout_ns);
      ok = detail::spin_until([&] { return detail::ld_relaxed(generation) != gen; }, d) ? 1 : 0;
    }
    __threadfence();
  }
  __syncthreads();
  return ok != 0;
}

template <typename R>
__device__ __forceinline__ void device_driven(const DslashArgs& I, const DslashArgs& E, RmaHandle q,
                                              unsigned int* bar, unsigned long long timeout_ns, int* status) {
  __shared__ int started;
  if (blockIdx.x == 0) {
    const bool ok = rma_start(q);
    if (threadIdx.x == 0) started = ok;
  }
  for (int cb = blockIdx.x * blockDim.x + threadIdx.x; cb < I.vh; cb += gridDim.x * blockDim.x)
    interior_site<R>(I, cb);
  if (blockIdx.x == 0) {
    __syncthreads();
    const bool ok = started && rma_wait(q);
    if (!ok && threadIdx.x == 0) atomicExch(status, 1);
  }
  if (!grid_barrier(bar, timeout_ns)) {
    if (threadIdx.x == 0) atomicExch(status, 2);
    return;
  }
  if (*static_cast<volatile int*>(status) != 0) return;  // halos missing: the host raises the queue's error
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < E.n_sites; j += gridDim.x * blockDim.x)
    exterior_site<R>(E, E.sites[j]);
}

// -- reductions: sum over blocks by the last block to finish ------------------------------------------
constexpr int kReduceThreads = 256;

// Every thread of every block brings its part v; true on every lane of the first warp of the last block to
// finish, each with the total. The block sums are added by that warp in a fixed tree (lane l takes blocks l,
// l + 32, ..., then a butterfly, whose every step adds the same two numbers on both lanes of a pair, so all lanes
// end with the same bits): the same total whatever order the blocks finish in, and 32 loads in flight where one
// thread would wait for each in turn.
__device__ __forceinline__ bool block_total_warp(double v, double* partial, unsigned int* done, double& total) {
  __shared__ double sums[kReduceThreads / 32];
  __shared__ bool last;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < kReduceThreads / 32; ++w) t += sums[w];
    partial[blockIdx.x] = t;
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x >= 32) return false;
  __threadfence();
  double t = 0;
  for (unsigned int b = threadIdx.x; b < gridDim.x; b += 32) t += static_cast<volatile double*>(partial)[b];
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  total = t;
  if (threadIdx.x == 0) *done = 0;  // ready for the next reduction (every lane has read the partial sums)
  return true;
}

// The same, true on thread 0 of the last block only.
__device__ __forceinline__ bool block_total(double v, double* partial, unsigned int* done, double& total) {
  return block_total_warp(v, partial, done, total) && threadIdx.x == 0;
}

__device__ __forceinline__ void finish_sum(double v, double* partial, unsigned int* done, double* result) {
  double t;
  if (block_total(v, partial, done, t)) *result = t;
}

template <typename R>
__device__ __forceinline__ void dot(const R* a, const R* b, long long n, double* partial, unsigned int* done,
                                    double* result) {
  double v = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    v += (double)a[i] * (double)b[i];
  finish_sum(v, partial, done, result);
}

template <typename R>
__device__ __forceinline__ void axpy_norm(R* x, R* r, const R* p, const R* ap, double alpha, long long n,
                                          double* partial, unsigned int* done, double* result) {
  double v = 0;
  const R al = R(alpha);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    x[i] += al * p[i];
    const R ri = r[i] - al * ap[i];
    r[i] = ri;
    v += (double)ri * (double)ri;
  }
  finish_sum(v, partial, done, result);
}

}  // namespace

// One step of the device-resident CG's scalars once s[kCgLocal] holds a global sum: step 0 after <p, Ap>
// (alpha), step 1 after |r|^2 (beta, |r|^2, the count and the flags). _cgstate.scalar_step is the same in
// Python; the host test runs this one against it.
QCD_HD void cg_scalar_step(double* s, int step, double delta2) {
  int flags = static_cast<int>(s[kCgFlags]);
  const double g = s[kCgLocal];
  const int frozen = kCgFrozen;
  if (step == 0) {
    if (flags & frozen) {
      s[kCgFlags] = static_cast<double>(flags | kCgSkip);
      s[kCgAlpha] = 0.0;
    } else if (!(g > 0.0)) {
      s[kCgFlags] = static_cast<double>(flags | kCgStalled | kCgSkip);
      s[kCgAlpha] = 0.0;
    } else {
      s[kCgAlpha] = s[kCgRr] / g;
    }
    return;
  }
  if (flags & frozen) return;
  s[kCgBeta] = g / s[kCgRr];
  s[kCgRr] = g;
  s[kCgIterations] += 1.0;
  if (g > s[kCgMaxRr]) s[kCgMaxRr] = g;
  if (g <= s[kCgStop]) flags |= kCgConverged;
  if (g < delta2 * s[kCgMaxRr]) flags |= kCgDue;
  s[kCgFlags] = static_cast<double>(flags);
}

// The book of a reliable update whose |rhs - A y|^2 is `rr` (QUDA's maxResIncrease counts): the host's and
// the kernel's. _cgstate.count_update is the same in Python.
QCD_HD void cg_count_update(double* s, double rr) {
  const bool grew = rr > s[kCgTrueRr];
  s[kCgIncreases] = grew ? s[kCgIncreases] + 1.0 : 0.0;
  if (grew) s[kCgIncreasesTotal] += 1.0;
  s[kCgTrueRr] = rr;
  s[kCgUpdates] += 1.0;
}

QCD_HD bool cg_stuck(const double* s) {
  return s[kCgIncreases] > kCgMaxIncreases || s[kCgIncreasesTotal] > kCgMaxIncreasesTotal;
}

// After the resident kernel's own reliable update, once s[kCgLocal] holds the global |rhs - A y|^2: the book,
// then either the CG goes on from the new residual (|r|^2 and its largest since the update restart, flags
// clear) or it stays frozen with kCgUpdated for the host (the full system's residual is due, or the true
// residual grew too often). _cgstate.update_step is the same in Python.
QCD_HD void cg_update_step(double* s) {
  const double rr = s[kCgLocal];
  cg_count_update(s, rr);
  if (rr <= s[kCgStop] || cg_stuck(s)) {
    s[kCgFlags] = static_cast<double>(static_cast<int>(s[kCgFlags]) | kCgUpdated);
    return;
  }
  s[kCgRr] = rr;
  s[kCgMaxRr] = rr;
  s[kCgFlags] = 0.0;
}

namespace {

// -- the resident CG: the global sums, and an iteration inside one launch --------------------------------
// A sum over ranks of one double, by `lanes` lanes of one warp (lanes 0 .. lanes-1 call it with the same value:
// 32, the first warp of a block, or 1, one thread). Each rank's buffer (symmetric memory, mapped by every rank)
// holds two banks of one slot per rank: {value, sequence number}. Sum number q writes my part into slot `rank` of
// bank q & 1 of every rank's buffer (the value, then the number with a release), waits until every slot of bank
// q & 1 of mine carries q, and adds them in rank order, so every rank gets bitwise the same total. The release
// and the acquire are at .gpu scope where every rank shares this GPU (A.gpu_scope, as the RMA queues' counters:
// a .sys fence drains to the system's coherence point, microseconds on one H200 under MPS), else at .sys.
// Lane l takes ranks l, l + lanes, ...: the writes to the ranks and the waits for them overlap, where one thread
// paid a release per rank one after the other. Two banks suffice: a rank writes its part of sum q + 2
// only after it has read every part of sum q + 1, which every rank writes only after it has read all of sum q.
// Bounded: a part that does not come records the rank it waited for. The same answer on every lane.
//
// CIRCUSLINK_QCD_DEV_ALONE (a timing experiment, never a solve: the answers are wrong) takes the ranks apart:
// bit 1 skips the halo exchanges (the ghosts keep what they hold), bit 2 the sums over ranks (each rank its own).
// With both, each rank runs the CG of its own sub-lattice on its SMs: what the iteration costs without peers.
#ifndef CIRCUSLINK_QCD_DEV_ALONE
#define CIRCUSLINK_QCD_DEV_ALONE 0
#endif
__device__ bool rank_sum(const CgResidentArgs& A, const volatile unsigned int* abort, double& value,
                         unsigned int lane = 0u, unsigned int lanes = 1u) {
  if (A.size <= 1 || (CIRCUSLINK_QCD_DEV_ALONE & 2)) return true;
  // (volatile: the previous sum's last block, which wrote the count, may have run on another SM)
  const unsigned long long q = *static_cast<volatile unsigned long long*>(A.seq) + 1ull;
  if (lanes > 1u) __syncwarp();  // every lane has read the count before lane 0 moves it on
  if (lane == 0u) *static_cast<volatile unsigned long long*>(A.seq) = q;
  const unsigned long long bank = (q & 1ull) * static_cast<unsigned long long>(A.size);
  for (int r = static_cast<int>(lane); r < A.size; r += static_cast<int>(lanes)) {
    unsigned long long* slot = A.peers[r] + 2ull * (bank + A.rank);
    detail::st_relaxed_u64(slot, static_cast<unsigned long long>(__double_as_longlong(value)));
    if (A.gpu_scope) detail::st_release_gpu_u64(slot + 1, q);
    else detail::st_release_sys_u64(slot + 1, q);
  }
  const unsigned long long* mine = A.peers[A.rank];
  bool ok = true;
  for (int r = static_cast<int>(lane); r < A.size; r += static_cast<int>(lanes)) {
    const unsigned long long* slot = mine + 2ull * (bank + r);
    detail::Deadline deadline = detail::Deadline::after(A.timeout_ns, abort);
    if (!detail::spin_until([&] { return detail::ld_relaxed_u64(slot + 1) >= q; }, deadline)) {
      A.status[1] = r;
      atomicExch(A.status, kCgSumFailed);
      ok = false;
      break;
    }
    if (A.gpu_scope) (void)detail::ld_acquire_gpu_u64(slot + 1);
    else (void)detail::ld_acquire_sys_u64(slot + 1);
  }
  // __syncwarp orders memory among the lanes: each part a lane acquired is visible to every lane after it.
  if (lanes > 1u) ok = __all_sync(0xffffffffu, ok);
  if (!ok) return false;
  if (lanes > 1u) __syncwarp();
  double total = 0.0;
  for (int r = 0; r < A.size; ++r)
    total += __longlong_as_double(static_cast<long long>(detail::ld_relaxed_u64(mine + 2ull * (bank + r))));
  value = total;
  return true;
}

// The CG's vector steps as a thread's part of a launch-wide loop, a 16-byte vector at a time (n: reals, a
// multiple of 24): every load of a vector is issued before its stores, which the fields' possible aliasing
// would otherwise order one element after another.
template <typename R>
struct Wide;
template <>
struct Wide<float> {
  using T = float4;
  static constexpr int kReals = 4;
};
template <>
struct Wide<double> {
  using T = double2;
  static constexpr int kReals = 2;
};

// This thread's part of <a, b>.
template <typename R>
__device__ __forceinline__ double dot_part(const R* a, const R* b, long long n, int first, int stride) {
  using V = typename Wide<R>::T;
  constexpr int kW = Wide<R>::kReals;
  double v = 0.0;
  for (long long i = first; i < n / kW; i += stride) {
    const V av = reinterpret_cast<const V*>(a)[i], bv = reinterpret_cast<const V*>(b)[i];
    const R* as = reinterpret_cast<const R*>(&av);
    const R* bs = reinterpret_cast<const R*>(&bv);
#pragma unroll
    for (int k = 0; k < kW; ++k) v += (double)as[k] * (double)bs[k];
  }
  return v;
}

// x += alpha p, r -= alpha ap; this thread's part of |r|^2.
template <typename R>
__device__ __forceinline__ double axpy_norm_part(R* x, R* r, const R* p, const R* ap, R alpha, long long n,
                                                 int first, int stride) {
  using V = typename Wide<R>::T;
  constexpr int kW = Wide<R>::kReals;
  double v = 0.0;
  for (long long i = first; i < n / kW; i += stride) {
    V xv = reinterpret_cast<V*>(x)[i], rv = reinterpret_cast<V*>(r)[i];
    const V pv = reinterpret_cast<const V*>(p)[i], av = reinterpret_cast<const V*>(ap)[i];
    R* xs = reinterpret_cast<R*>(&xv);
    R* rs = reinterpret_cast<R*>(&rv);
    const R* ps = reinterpret_cast<const R*>(&pv);
    const R* as = reinterpret_cast<const R*>(&av);
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      xs[k] += alpha * ps[k];
      rs[k] = rs[k] - alpha * as[k];
      v += (double)rs[k] * (double)rs[k];
    }
    reinterpret_cast<V*>(x)[i] = xv;
    reinterpret_cast<V*>(r)[i] = rv;
  }
  return v;
}

// Block sums of v, then (the first warp of the last block to finish) the sum over ranks into s[kCgLocal] and
// the scalars' step: 0 and 1 cg_scalar_step's, kUpdateStep cg_update_step. The caller's grid barrier makes the
// new scalars visible to every block.
constexpr int kUpdateStep = 2;
// Lanes of the sum over ranks: 1 (the default, as the CG was last measured on a GPU: one thread writes to the
// ranks and waits for them in turn) or 32 (-DCIRCUSLINK_QCD_SUM_LANES=32 through CIRCUSLINK_DEVICE_DEFINES: a lane
// a rank; opt-in until a GPU run has measured it).
#ifndef CIRCUSLINK_QCD_SUM_LANES
#define CIRCUSLINK_QCD_SUM_LANES 1
#endif
static_assert(CIRCUSLINK_QCD_SUM_LANES == 32 || CIRCUSLINK_QCD_SUM_LANES == 1, "the sum's lanes: 32 or 1");
template <bool kPeers>
__device__ __forceinline__ void reduce_step(const CgResidentArgs& A, const volatile unsigned int* abort, double v,
                                            int step) {
  double total;
  if (!block_total_warp(v, A.partial, A.done, total)) return;
  if ((!kPeers || CIRCUSLINK_QCD_SUM_LANES == 1) && threadIdx.x != 0) return;
  if constexpr (kPeers) {
    if (!rank_sum(A, abort, total, threadIdx.x, CIRCUSLINK_QCD_SUM_LANES) || threadIdx.x != 0) return;
  }
  A.s[kCgLocal] = total;
  if (step == kUpdateStep) {
    cg_update_step(A.s);
  } else {
    cg_scalar_step(A.s, step, A.delta2);
  }
}

__device__ __forceinline__ int flags_of(const double* s) {
  return static_cast<int>(static_cast<const volatile double*>(s)[kCgFlags]);
}

// CIRCUSLINK_QCD_DEV_TRACE=N (a dev aid, through CIRCUSLINK_DEVICE_DEFINES; at most kTraceHops): a timed launch
// also stamps its first N hops' events (kTrace*) on the GPU clock after the phases (CgResidentArgs::phase_ns +
// kPhases, kTraceEvents a hop, the last launch's): where in a hop the time goes, which the phases' sums hide.
#ifndef CIRCUSLINK_QCD_DEV_TRACE
#define CIRCUSLINK_QCD_DEV_TRACE 0
#endif
constexpr int kTraceHops = 64;
static_assert(CIRCUSLINK_QCD_DEV_TRACE >= 0 && CIRCUSLINK_QCD_DEV_TRACE <= kTraceHops, "CIRCUSLINK_QCD_DEV_TRACE");
// Block 0: the hop starts, its start returns, the faces have arrived, the barrier after the interior, the hop
// ends; the last block: its interior share is done. After an iteration's last hop (in that hop's record), block
// 0: its part of <p, A p> is done, the barrier after that sum over ranks is passed, its part of x, r and |r|^2 is
// done, the barrier after that sum is passed, the barrier after p's update is passed: where the sums' time goes
// (the first iteration of a launch on 2 and 4 ranks took 0.6-1.0 ms longer there than the others, H100, 2026-12-07).
enum TraceEvent : int { kTraceBegin, kTraceStarted, kTraceArrived, kTraceInterior, kTraceEnd, kTraceLastInterior,
                        kTraceDot, kTraceSum0, kTraceAxpy, kTraceSum1, kTraceVector, kTraceEvents };

// Block 0's clock: the time since its last lap goes to `phase`. Block 0 drives the halos and waits at every
// grid barrier, so its laps add up to the launch's whole time.
struct Laps {
  unsigned long long* ns;
  unsigned long long since;
  int hop = 0;  // hops begun by this block (the trace's)
  __device__ __forceinline__ void lap(int phase) {
    if (ns == nullptr) return;
    const unsigned long long now = detail::globaltimer_ns();
    ns[phase] += now - since;
    since = now;
  }
  // The trace's event for this hop, by block 0 (or the last block: trace_last).
  __device__ __forceinline__ void trace(int event) {
    if constexpr (CIRCUSLINK_QCD_DEV_TRACE > 0) {
      if (ns != nullptr && hop < CIRCUSLINK_QCD_DEV_TRACE)
        ns[kPhases + hop * kTraceEvents + event] = detail::globaltimer_ns();
    }
  }
  // An event of the iteration after its last hop, in that hop's record (hop has moved past it).
  __device__ __forceinline__ void trace_after(int event) {
    if constexpr (CIRCUSLINK_QCD_DEV_TRACE > 0) {
      if (ns != nullptr && hop > 0 && hop - 1 < CIRCUSLINK_QCD_DEV_TRACE)
        ns[kPhases + (hop - 1) * kTraceEvents + event] = detail::globaltimer_ns();
    }
  }
  __device__ __forceinline__ void trace_last(const CgResidentArgs& A, int event) {
    if constexpr (CIRCUSLINK_QCD_DEV_TRACE > 0) {
      if (A.phase_ns != nullptr && threadIdx.x == 0 && blockIdx.x == gridDim.x - 1 && gridDim.x > 1 &&
          hop < CIRCUSLINK_QCD_DEV_TRACE)
        A.phase_ns[kPhases + hop * kTraceEvents + event] = detail::globaltimer_ns();
    }
  }
};

// A grid barrier that records its failure (false on every thread: the kernel returns).
__device__ __forceinline__ bool barrier(const CgResidentArgs& A, const GridBarrier& bar) {
  if (grid_sync(bar)) return true;
  if (threadIdx.x == 0) atomicExch(A.status, kCgBarrierFailed);
  return false;
}

// A barrier after a global sum: false also where the sum failed (every block sees the status after it).
__device__ __forceinline__ bool barrier_after_sum(const CgResidentArgs& A, const GridBarrier& bar) {
  const volatile int* status = A.status;
  if (grid_sync(bar) && *status == kCgOk) return true;
  if (threadIdx.x == 0 && *status == kCgOk) atomicExch(A.status, kCgBarrierFailed);
  return false;
}

#ifndef CIRCUSLINK_QCD_FACE_GRID
#define CIRCUSLINK_QCD_FACE_GRID 0
#endif
// A hop's faces out (blocks 0 .. team-1, or every block in the grid form) and in (block 0), through queue q;
// nothing where CIRCUSLINK_QCD_DEV_ALONE's bit 1 compiles the exchange out.
__device__ __forceinline__ bool face_start(const RmaHandle& q, const GridBarrier& bar, unsigned int team, bool grid,
                                           unsigned long long& epoch) {
  if constexpr ((CIRCUSLINK_QCD_DEV_ALONE & 1) != 0) return true;
  if constexpr (CIRCUSLINK_QCD_FACE_GRID != 0) {
    if (grid) return rma_start_grid(q, bar);  // the same answer on every thread
  }
  return team == 1u ? rma_start(q) : rma_start_team(q, bar, team, epoch);
}
__device__ __forceinline__ bool face_wait(const RmaHandle& q, unsigned int team, unsigned long long epoch) {
  if constexpr ((CIRCUSLINK_QCD_DEV_ALONE & 1) != 0) return true;
  return team == 1u ? rma_wait(q) : rma_wait_epoch(q, epoch);
}
// Direct faces: any block's wait for the neighbours' signal of `epoch` (its own count of the queue's epochs).
__device__ __forceinline__ bool faces_landed(const RmaHandle& q, unsigned long long epoch) {
  if constexpr ((CIRCUSLINK_QCD_DEV_ALONE & 1) != 0) return true;
  return rma_wait_epoch(q, epoch);
}

// The four hops of a normal operator M_pc^dagger M_pc (hops[0..3] interiors, hops[4..7] exteriors), each
// interior first while block 0 moves the faces through queue q, then the exterior once they have landed.
// Fields written in this launch are read with plain loads. False: the kernel returns (status recorded).
// With direct faces (A.direct) and A.one_pass (kOnePass: compiled in) a hop is one pass instead: its faces are
// already in the neighbours' ghosts (the last pass wrote them), so block 0 only signals, every block waits for the
// neighbours' signals (`epoch`: the block's count of q's epochs) and takes its share of the whole hop
// (whole_hop_sites), one grid barrier after.
template <typename R, bool kPeers, bool kOnePass = true>
__device__ __forceinline__ bool normal_hops(const CgResidentArgs& A, const DslashArgs* hops, const GridBarrier& bar,
                                            RmaHandle q, Laps& laps, int first, int stride,
                                            unsigned long long& epoch) {
  __shared__ int ok;
  const volatile int* status = A.status;
  if (kPeers && kOnePass && A.halo && A.direct && A.one_pass) {
    for (int h = 0; h < 4; ++h, ++laps.hop) {
      laps.trace(kTraceBegin);
      bool landed = true;
      if (blockIdx.x == 0) {
        unsigned long long unused = 0ull;
        landed = face_start(q, bar, 1u, false, unused);  // the same on every thread of the block
        laps.trace(kTraceStarted);
      }
      landed = faces_landed(q, ++epoch) && landed;
      if (!landed && threadIdx.x == 0) atomicExch(A.status, kCgHaloFailed);
      laps.lap(kPhaseHalo);
      laps.trace(kTraceArrived);
      whole_hop_sites<R>(hops[4 + h], first, stride, A.split);
      laps.trace_last(A, kTraceLastInterior);
      if (!barrier(A, bar)) return false;
      laps.lap(kPhaseDslash);
      laps.trace(kTraceEnd);
      if (*status != kCgOk) return false;  // every block sees it after the barrier
    }
    return true;
  }
  // Blocks 0 .. team-1 copy the faces (A.face_blocks: block 0 alone by default; one block's copy moves a few tens
  // of GB/s) while the others take the interior: were they to take their share too, every block would wait at the
  // barrier for the copy and its sites one after the other.
  // CIRCUSLINK_QCD_FACE_GRID=1 (through CIRCUSLINK_DEVICE_DEFINES; an A/B switch, compiled in only then: the
  // code of a third form made the kernel spill): the grid form instead, every block copying its share before its
  // interior (rma_start_grid, whose grid barrier ends the copy: the faces leave at the copy's full rate, and
  // every block waits for the slowest share).
  const bool grid_faces = CIRCUSLINK_QCD_FACE_GRID != 0 && gridDim.x > 1;
  const unsigned int team = A.face_blocks < 1 || gridDim.x == 1 ? 1u
                            : static_cast<unsigned int>(min(A.face_blocks, static_cast<int>(gridDim.x) - 1));
  const int skip = gridDim.x == 1 || grid_faces ? 0 : static_cast<int>(team * blockDim.x);
  for (int h = 0; h < 4; ++h, ++laps.hop) {
    const DslashArgs& I = hops[h];
    laps.trace(kTraceBegin);
    if (kPeers && A.halo) {
      unsigned long long epoch = 0ull;
      if (grid_faces || blockIdx.x < team) {
        const bool started = face_start(q, bar, team, grid_faces, epoch);
        if (threadIdx.x == 0) ok = started;
        laps.lap(kPhaseHalo);
        laps.trace(kTraceStarted);
      }
      if (gridDim.x == 1 || grid_faces || blockIdx.x >= team)
        interior_sites<R>(I, first - skip, stride - skip, A.split);
      laps.trace_last(A, kTraceLastInterior);
      if (blockIdx.x == 0) {
        laps.lap(kPhaseDslash);  // its interior share where it is the only block
        __syncthreads();
        const bool arrived = ok && face_wait(q, team, epoch);
        if (!arrived && threadIdx.x == 0) atomicExch(A.status, kCgHaloFailed);
        laps.lap(kPhaseHalo);
        laps.trace(kTraceArrived);
      }
      // Block 0's wait at this barrier is the interior the other blocks have still to do once the ghosts are in:
      // dslash time. (Until the previous lap it was the faces' trip, however much interior ran meanwhile.)
      if (!barrier(A, bar)) return false;
      laps.lap(kPhaseDslash);
      laps.trace(kTraceInterior);
      if (*status != kCgOk) return false;  // every block sees it after the barrier
      const DslashArgs& E = hops[4 + h];
      for (int j = first; j < E.n_sites; j += stride) exterior_site<R>(E, E.sites[j]);
    } else {
      interior_sites<R>(I, first, stride, A.split);
    }
    if (!barrier(A, bar)) return false;
    laps.lap(kPhaseDslash);
    laps.trace(kTraceEnd);
  }
  return true;
}

// The reliable update, as the host makes it (_solver.py) but without it: y += x, x = 0 (and y's faces);
// A y with the precise operator (its own queue qp); r = rhs - A y and |r|^2 summed over ranks; the book
// (cg_update_step); unless that hands the CG to the host, r_s = r rounded and p += r_new - r_s (and p's
// faces). False: the kernel returns (status recorded).
template <typename RS, typename RP, bool kPeers>
__device__ bool reliable_update(const CgResidentArgs& A, const DslashArgs* hops, const DslashArgs* precise_hops,
                                const GridBarrier& bar, RmaHandle qp, Laps& laps, int first, int stride) {
  const DslashArgs& Y = precise_hops[8];
  RS* x = static_cast<RS*>(A.x);
  for (int cb = first; cb < Y.vh; cb += stride) fold_site<RS, RP>(Y, x, cb);
  if (!barrier(A, bar)) return false;
  laps.lap(kPhaseVector);
  // Two passes (block 0 counts qp's epochs): the one pass's code in the precise precision too made the mixed
  // kernel spill 1,020 bytes against 812 (ptxas, sm_90); the update is one operator's hops every so many iterations.
  unsigned long long unused = 0ull;
  if (!normal_hops<RP, kPeers, false>(A, precise_hops, bar, qp, laps, first, stride, unused)) return false;
  RP* r = static_cast<RP*>(A.precise_r);
  const RP* rhs = static_cast<const RP*>(A.rhs);
  const RP* ay = static_cast<const RP*>(A.precise_ap);
  double v = 0.0;
  for (long long i = first; i < A.n_precise; i += stride) {
    const RP ri = rhs[i] - ay[i];
    r[i] = ri;
    v += (double)ri * (double)ri;
  }
  laps.lap(kPhaseVector);
  reduce_step<kPeers>(A, bar.abort, v, kUpdateStep);
  if (!barrier_after_sum(A, bar)) return false;
  laps.lap(kPhaseReduction);
  if (flags_of(A.s) & kCgFrozen) return true;  // the host takes over from here (the same on every block)
  const DslashArgs& P = hops[8];
  for (int cb = first; cb < P.vh; cb += stride) new_residual_site<RS, RP>(P, r, cb);
  if (!barrier(A, bar)) return false;
  laps.lap(kPhaseVector);
  return true;
}

// Up to A.iterations CG iterations; with kUpdates (and A.updates) a due reliable update is made here, the
// precise operator being RP. Every block makes the same decisions: they read the flags after a barrier.
// kPeers false (the _local kernels, for one rank: no halo, no sums over ranks) compiles the exchanges out. Their
// code, though never run on one rank, shares the kernel's register allocation: built with it (and four low-latency
// lines in flight) the single-precision kernel spilled 496 bytes (ptxas, sm_90; none without), and on one H100 its
// one-rank iteration at 32^4 took 952-967 us against 851-855 us without it (2026-12-07, BENCHMARKS.md).
template <typename R, typename RP, bool kUpdates, bool kPeers>
__device__ void cg_resident(const CgResidentArgs& A, const GridBarrier& bar, RmaHandle q, RmaHandle qp) {
  const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  Laps laps{blockIdx.x == 0 && threadIdx.x == 0 ? A.phase_ns : nullptr, 0ull};
  if (laps.ns != nullptr) laps.since = detail::globaltimer_ns();
  // The hops' argument blocks in shared memory for the launch: read at every site, from global memory they
  // would be loaded again after every store (which might alias them), each load a round trip before the
  // site's own loads can start.
  constexpr int kTable = 9 * sizeof(DslashArgs) / sizeof(int);
  __shared__ DslashArgs hops[9];
  __shared__ DslashArgs precise_hops[kUpdates ? 9 : 1];
  for (int i = threadIdx.x; i < kTable; i += blockDim.x) {
    reinterpret_cast<int*>(hops)[i] = reinterpret_cast<const int*>(A.hops)[i];
    if (kUpdates && A.updates)
      reinterpret_cast<int*>(precise_hops)[i] = reinterpret_cast<const int*>(A.precise_hops)[i];
  }
  __syncthreads();
  // With direct faces every block counts q's epochs itself (normal_hops' one pass), from where the last launch
  // left them: read here, before the barrier below lets block 0 start the next.
  unsigned long long epoch_q = 0ull;
  if constexpr (kPeers) {
    if (A.direct) {
      if (A.halo) epoch_q = q.q.state->epoch;
      // The faces of p go straight into the neighbours' ghosts, which only this kernel writes: p's may have
      // changed on the host since the last launch (a reliable update, the first p). Safe to write: every
      // neighbour is past its reads of that half (the last launch waited for its faces of the hop after them).
      const DslashArgs& P = hops[8];
      for (int cb = first; cb < P.vh; cb += stride) emit_out_if_on_face<R>(P, cb);
      if (!barrier(A, bar)) return;
    }
  }
  R* x = static_cast<R*>(A.x);
  R* r = static_cast<R*>(A.r);
  const R* p = static_cast<const R*>(A.p);
  const R* ap = static_cast<const R*>(A.ap);
  for (int done = 0;; ++done) {
    const int flags = flags_of(A.s);
    if (flags & kCgFrozen) {
      // Converged or due, not stalled: the reliable update (which also checks convergence) is made here.
      bool update = false;
      if constexpr (kUpdates) update = A.updates && !(flags & (kCgStalled | kCgUpdated));
      if (!update) break;
      if constexpr (kUpdates) {
        if (!reliable_update<R, RP, kPeers>(A, hops, precise_hops, bar, qp, laps, first, stride)) return;
      }
      if (flags_of(A.s) & kCgFrozen) break;
    }
    if (done == A.iterations) break;
    // A p = M_pc^dagger M_pc p
    if (!normal_hops<R, kPeers>(A, hops, bar, q, laps, first, stride, epoch_q)) return;
    // <p, A p>, summed over ranks: alpha.
    double v = dot_part(p, ap, A.n, first, stride);
    laps.trace_after(kTraceDot);
    reduce_step<kPeers>(A, bar.abort, v, 0);
    if (!barrier_after_sum(A, bar)) return;
    laps.lap(kPhaseReduction);
    laps.trace_after(kTraceSum0);
    // x += alpha p, r -= alpha A p, |r|^2 summed over ranks: beta, the count and the flags.
    const R alpha = R(static_cast<const volatile double*>(A.s)[kCgAlpha]);
    v = axpy_norm_part(x, r, p, ap, alpha, A.n, first, stride);
    laps.lap(kPhaseVector);
    laps.trace_after(kTraceAxpy);
    reduce_step<kPeers>(A, bar.abort, v, 1);
    if (!barrier_after_sum(A, bar)) return;
    laps.lap(kPhaseReduction);
    laps.trace_after(kTraceSum1);
    // p = r + beta p and its faces for the next iteration's first hop (skipped once frozen at its start).
    if (!(flags_of(A.s) & kCgSkip)) {
      const DslashArgs& P = hops[8];
      const double beta = static_cast<const volatile double*>(A.s)[kCgBeta];
      for (int cb = first; cb < P.vh; cb += stride) xpay_pack_site<R, false>(P, cb, beta);
    }
    if (!barrier(A, bar)) return;
    laps.lap(kPhaseVector);
    laps.trace_after(kTraceVector);
  }
}

}  // namespace

}  // namespace qcd
}  // namespace circuslink

using circuslink::RmaHandle;
using circuslink::qcd::DslashArgs;

using circuslink::GridBarrier;
using circuslink::qcd::CgResidentArgs;

// The kernels come in three modules, each compiled on first use (NVRTC takes seconds for each; the host
// picks one with -DCIRCUSLINK_QCD_KERNELS=): 1 the single-precision kernels, 2 the double-precision ones,
// 3 the mixed-precision resident CG. Without the macro (nvcc checks) everything is built; -1 builds none but
// qcd_cg_scalars (host programs that run the site functions, which then compile in seconds, not minutes).
#ifndef CIRCUSLINK_QCD_KERNELS
#define CIRCUSLINK_QCD_KERNELS 0
#endif

#if CIRCUSLINK_QCD_KERNELS != 3
// The batched CG's reduction step where its halos need the host (so the iteration is a chain of launches):
// one thread sums s[kCgLocal] over ranks as the resident kernel does, then steps the scalars. Every rank
// computes bitwise the same scalars and flags.
extern "C" __global__ void qcd_cg_scalars(CgResidentArgs A, int step, const unsigned int* abort) {
  if (threadIdx.x != 0) return;
  double total = A.s[circuslink::qcd::kCgLocal];
  if (!circuslink::qcd::rank_sum(A, abort, total)) return;
  A.s[circuslink::qcd::kCgLocal] = total;
  circuslink::qcd::cg_scalar_step(A.s, step, A.delta2);
}

// Registers: 256-thread blocks, at least MIN_BLOCKS of them per SM (double needs the cap to keep 2 blocks).
#define QCD_KERNELS(SUFFIX, R, MIN_BLOCKS)                                                                       \
  extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) qcd_dslash_interior_##SUFFIX(DslashArgs A) {    \
    const int cb = blockIdx.x * blockDim.x + threadIdx.x;                                                     \
    if (cb < A.vh) circuslink::qcd::interior_site<R>(A, cb);                                                   \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) qcd_dslash_exterior_##SUFFIX(DslashArgs A) {    \
    const int j = blockIdx.x * blockDim.x + threadIdx.x;                                                      \
    if (j < A.n_sites) circuslink::qcd::exterior_site<R>(A, A.sites[j]);                                       \
  }                                                                                                            \
  extern "C" __global__ void qcd_xpay_pack_##SUFFIX(DslashArgs A, double beta) {                               \
    const int j = blockIdx.x * blockDim.x + threadIdx.x;                                                      \
    if (A.sites == nullptr) {                                                                                  \
      if (j < A.vh) circuslink::qcd::xpay_pack_site<R>(A, j, beta);                                            \
    } else if (j < A.n_sites) {                                                                                \
      circuslink::qcd::xpay_pack_site<R>(A, A.sites[j], beta);                                                 \
    }                                                                                                          \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)                                                \
      qcd_dslash_device_##SUFFIX(DslashArgs I, DslashArgs E, RmaHandle q,                                      \
                                                        unsigned int* bar, unsigned long long timeout_ns,      \
                                                        int* status) {                                          \
    circuslink::qcd::device_driven<R>(I, E, q, bar, timeout_ns, status);                                       \
  }                                                                                                            \
  extern "C" __global__ void qcd_dot_##SUFFIX(const R* a, const R* b, long long n, double* partial,             \
                                              unsigned int* done, double* result) {                            \
    circuslink::qcd::dot<R>(a, b, n, partial, done, result);                                                   \
  }                                                                                                            \
  extern "C" __global__ void qcd_axpy_norm_##SUFFIX(R* x, R* r, const R* p, const R* ap, double alpha,          \
                                                    long long n, double* partial, unsigned int* done,          \
                                                    double* result) {                                          \
    circuslink::qcd::axpy_norm<R>(x, r, p, ap, alpha, n, partial, done, result);                               \
  }                                                                                                            \
  /* The device-resident CG: alpha and beta from the scalars in device memory; a frozen CG keeps p. */         \
  extern "C" __global__ void qcd_axpy_norm_state_##SUFFIX(R* x, R* r, const R* p, const R* ap, const double* s,  \
                                                          long long n, double* partial, unsigned int* done) {  \
    circuslink::qcd::axpy_norm<R>(x, r, p, ap, s[circuslink::qcd::kCgAlpha], n, partial, done,                 \
                                  const_cast<double*>(s) + circuslink::qcd::kCgLocal);                         \
  }                                                                                                            \
  extern "C" __global__ void qcd_xpay_pack_state_##SUFFIX(DslashArgs A, const double* s) {                     \
    using namespace circuslink::qcd;                                                                           \
    if (static_cast<int>(s[kCgFlags]) & kCgSkip) return;                                                       \
    const int j = blockIdx.x * blockDim.x + threadIdx.x;                                                      \
    if (j < A.vh) xpay_pack_site<R>(A, j, s[kCgBeta]);                                                         \
  }                                                                                                            \
  /* The resident CG: up to A.iterations iterations in one co-resident launch (launch_resident); qp unused. */ \
  /* Two blocks an SM: the split hop's lanes hold a direction's link, spinor and the sum without spilling. */  \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                         \
      qcd_cg_resident_##SUFFIX(CgResidentArgs A, GridBarrier bar, RmaHandle q, RmaHandle qp) {                \
    circuslink::qcd::cg_resident<R, R, false, true>(A, bar, q, qp);                                            \
  }                                                                                                            \
  /* ... on one rank: the exchanges compiled out (cg_resident's kPeers). */                                   \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                         \
      qcd_cg_resident_local_##SUFFIX(CgResidentArgs A, GridBarrier bar, RmaHandle q, RmaHandle qp) {          \
    circuslink::qcd::cg_resident<R, R, false, false>(A, bar, q, qp);                                           \
  }

#endif

#if CIRCUSLINK_QCD_KERNELS == 0 || CIRCUSLINK_QCD_KERNELS == 1
QCD_KERNELS(f, float, 3)
#endif
#if CIRCUSLINK_QCD_KERNELS == 0 || CIRCUSLINK_QCD_KERNELS == 2
QCD_KERNELS(d, double, 2)
#endif

// The resident CG in single precision that makes its reliable updates in double itself (qp: the double
// operator's queue). Two blocks an SM: the double hops of the update need the registers.
#if CIRCUSLINK_QCD_KERNELS == 0 || CIRCUSLINK_QCD_KERNELS == 3
extern "C" __global__ void __launch_bounds__(256, 2)
    qcd_cg_resident_fd(CgResidentArgs A, GridBarrier bar, RmaHandle q, RmaHandle qp) {
  circuslink::qcd::cg_resident<float, double, true, true>(A, bar, q, qp);
}
extern "C" __global__ void __launch_bounds__(256, 2)
    qcd_cg_resident_local_fd(CgResidentArgs A, GridBarrier bar, RmaHandle q, RmaHandle qp) {
  circuslink::qcd::cg_resident<float, double, true, false>(A, bar, q, qp);
}
#endif
