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
// i * a
template <typename R>
QCD_HD Cx<R> times_i(Cx<R> a) { return cx(-a.im, a.re); }

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
template <typename R>
QCD_HD void load_link(const R* gauge, int vh, int parity, int mu, int site, Link<R>& u) {
  const unsigned long long base = ((unsigned long long)(parity * 4 + mu) * 9) * vh + site;
#pragma unroll
  for (int e = 0; e < 9; ++e) u.m[e] = load_cx(gauge, base + (unsigned long long)e * vh);
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
// h = psi_up + s A_mu psi_down
template <typename R>
QCD_HD void project(int mu, R s, const Spinor<R>& p, Half<R>& h) {
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const Cx<R> u0 = p.c[c], u1 = p.c[3 + c], d0 = p.c[6 + c], d1 = p.c[9 + c];
    switch (mu) {
      case 0:  // A = i s1 = ((0, i), (i, 0))
        h.c[c] = u0 + s * times_i(d1);
        h.c[3 + c] = u1 + s * times_i(d0);
        break;
      case 1:  // A = -i s2 = ((0, -1), (1, 0))
        h.c[c] = u0 - s * d1;
        h.c[3 + c] = u1 + s * d0;
        break;
      case 2:  // A = i s3 = ((i, 0), (0, -i))
        h.c[c] = u0 + s * times_i(d0);
        h.c[3 + c] = u1 - s * times_i(d1);
        break;
      default:  // A = 1
        h.c[c] = u0 + s * d0;
        h.c[3 + c] = u1 + s * d1;
        break;
    }
  }
}

// acc += (h, s A_mu^dagger h)
template <typename R>
QCD_HD void accumulate(int mu, R s, const Half<R>& h, Spinor<R>& acc) {
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const Cx<R> h0 = h.c[c], h1 = h.c[3 + c];
    acc.c[c] = acc.c[c] + h0;
    acc.c[3 + c] = acc.c[3 + c] + h1;
    Cx<R> l0, l1;
    switch (mu) {
      case 0:  // A^dagger = ((0, -i), (-i, 0))
        l0 = (-s) * times_i(h1);
        l1 = (-s) * times_i(h0);
        break;
      case 1:  // A^dagger = ((0, 1), (-1, 0))
        l0 = s * h1;
        l1 = (-s) * h0;
        break;
      case 2:  // A^dagger = ((-i, 0), (0, i))
        l0 = (-s) * times_i(h0);
        l1 = s * times_i(h1);
        break;
      default:
        l0 = s * h0;
        l1 = s * h1;
        break;
    }
    acc.c[6 + c] = acc.c[6 + c] + l0;
    acc.c[9 + c] = acc.c[9 + c] + l1;
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

QCD_HD int checkerboard_index(const DslashArgs& A, const int c[4]) {
  return (((c[3] * A.dims[2] + c[2]) * A.dims[1] + c[1]) * A.dims[0] + c[0]) >> 1;
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

// -- the hop --------------------------------------------------------------------------------------------
// Every hop of site `cb` whose neighbour lives on this rank (all of them when nothing is partitioned).
template <typename R, bool kLdg = true>
QCD_HD void interior_site(const DslashArgs& A, int cb) {
  const R* in = static_cast<const R*>(A.in);
  const R* gauge = static_cast<const R*>(A.gauge);
  const int p = A.parity, q = 1 - p;
  const R s_up = A.dagger ? R(1) : R(-1);
  const Site s = site_coords(A, cb, p);
  Spinor<R> acc;
#pragma unroll
  for (int k = 0; k < 12; ++k) acc.c[k] = cx(R(0), R(0));
#pragma unroll
  for (int mu = 0; mu < 4; ++mu) {
    const int L = A.dims[mu];
    const bool split = partitioned(A, mu);
    {  // forward: (1 + s_up g) U_mu(x) psi(x + mu)
      const bool edge = s.c[mu] == L - 1;
      if (!(edge && split)) {
        int n[4] = {s.c[0], s.c[1], s.c[2], s.c[3]};
        n[mu] = edge ? 0 : s.c[mu] + 1;
        Spinor<R> psi;
        load_field<kLdg>(in, A.vh, checkerboard_index(A, n), psi);
        Half<R> h, uh;
        project(mu, s_up, psi, h);
        if (edge && A.fwd_sign[mu] < 0) {  // crossed the antiperiodic t boundary (the local wrap)
#pragma unroll
          for (int k = 0; k < 6; ++k) h.c[k] = R(-1) * h.c[k];
        }
        Link<R> u;
        load_link(gauge, A.vh, p, mu, cb, u);
        link_times(u, h, uh);
        accumulate(mu, s_up, uh, acc);
      }
    }
    {  // backward: (1 - s_up g) U_mu(x - mu)^dagger psi(x - mu)
      const bool edge = s.c[mu] == 0;
      if (!(edge && split)) {
        int n[4] = {s.c[0], s.c[1], s.c[2], s.c[3]};
        n[mu] = edge ? L - 1 : s.c[mu] - 1;
        const int nb = checkerboard_index(A, n);
        Spinor<R> psi;
        load_field<kLdg>(in, A.vh, nb, psi);
        Half<R> h, uh;
        project(mu, -s_up, psi, h);
        if (edge && A.bwd_sign[mu] < 0) {
#pragma unroll
          for (int k = 0; k < 6; ++k) h.c[k] = R(-1) * h.c[k];
        }
        Link<R> u;
        load_link(gauge, A.vh, q, mu, nb, u);
        link_dagger_times(u, h, uh);
        accumulate(mu, -s_up, uh, acc);
      }
    }
  }
  Spinor<R> out;
  const R b = R(A.b);
  if (A.has_x) {
    Spinor<R> x;
    load_field<kLdg>(static_cast<const R*>(A.x), A.vh, cb, x);
    const R a = R(A.a);
#pragma unroll
    for (int k = 0; k < 12; ++k) out.c[k] = a * x.c[k] + b * acc.c[k];
  } else {
#pragma unroll
    for (int k = 0; k < 12; ++k) out.c[k] = b * acc.c[k];
  }
  store_spinor(static_cast<R*>(A.out), A.vh, cb, out);
}

// The faces of `psi` (site `cb` of parity `parity`) that a next hop with `dagger` needs, into send.
template <typename R>
QCD_HD void emit_faces(const DslashArgs& A, const Site& s, int cb, int parity, int dagger,
                                           const Spinor<R>& psi) {
  const R s_up = dagger ? R(1) : R(-1);
  R* send = static_cast<R*>(A.send);
#pragma unroll
  for (int mu = 0; mu < 4; ++mu) {
    if (!partitioned(A, mu)) continue;
    if (s.c[mu] == 0) {  // feeds the backward neighbour's forward hop
      Half<R> h;
      project(mu, s_up, psi, h);
      store_half(send, A.faces, A.face_offset[2 * mu] + face_index(A, s, mu), h);
    }
    if (s.c[mu] == A.dims[mu] - 1) {  // feeds the forward neighbour's backward hop, U^dagger applied here
      Half<R> h, uh;
      project(mu, -s_up, psi, h);
      Link<R> u;
      load_link(static_cast<const R*>(A.gauge), A.vh, parity, mu, cb, u);
      link_dagger_times(u, h, uh);
      store_half(send, A.faces, A.face_offset[2 * mu + 1] + face_index(A, s, mu), uh);
    }
  }
}

// The faces of `psi` (site `cb` of A.parity) for a next hop with A.dagger, where the site lies on one.
template <typename R>
QCD_HD void emit_if_on_face(const DslashArgs& A, int cb, const Spinor<R>& psi) {
  const Site s = site_coords(A, cb, A.parity);
  bool face = false;
#pragma unroll
  for (int mu = 0; mu < 4; ++mu) face |= partitioned(A, mu) && (s.c[mu] == 0 || s.c[mu] == A.dims[mu] - 1);
  if (face) emit_faces(A, s, cb, A.parity, A.dagger, psi);
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

// Every thread of every block brings its part v; true on thread 0 of the last block to finish, which gets
// the total (the block sums added in block order: the same total whatever order the blocks finish in).
__device__ __forceinline__ bool block_total(double v, double* partial, unsigned int* done, double& total) {
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
  if (!(last && threadIdx.x == 0)) return false;
  __threadfence();
  double t = 0;
  for (unsigned int b = 0; b < gridDim.x; ++b) t += static_cast<volatile double*>(partial)[b];
  total = t;
  *done = 0;  // ready for the next reduction
  return true;
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
// A sum over ranks of one double, by thread 0 of one block. Each rank's buffer (symmetric memory, mapped by
// every rank) holds two banks of one slot per rank: {value, sequence number}. Sum number q writes my part
// into slot `rank` of bank q & 1 of every rank's buffer (the value, then the number with a system-scope
// release), waits until every slot of bank q & 1 of mine carries q, and adds them in rank order, so every
// rank gets bitwise the same total. Two banks suffice: a rank writes its part of sum q + 2 only after it has
// read every part of sum q + 1, which every rank writes only after it has read all of sum q. Bounded: a
// part that does not come records the rank it waited for.
__device__ bool rank_sum(const CgResidentArgs& A, const volatile unsigned int* abort, double& value) {
  if (A.size <= 1) return true;
  // (volatile: the previous sum's last block, which wrote the count, may have run on another SM)
  const unsigned long long q = *static_cast<volatile unsigned long long*>(A.seq) + 1ull;
  *static_cast<volatile unsigned long long*>(A.seq) = q;
  const unsigned long long bank = (q & 1ull) * static_cast<unsigned long long>(A.size);
  for (int r = 0; r < A.size; ++r) {
    unsigned long long* slot = A.peers[r] + 2ull * (bank + A.rank);
    detail::st_relaxed_u64(slot, static_cast<unsigned long long>(__double_as_longlong(value)));
    detail::st_release_sys_u64(slot + 1, q);
  }
  const unsigned long long* mine = A.peers[A.rank];
  double total = 0.0;
  for (int r = 0; r < A.size; ++r) {
    const unsigned long long* slot = mine + 2ull * (bank + r);
    detail::Deadline deadline = detail::Deadline::after(A.timeout_ns, abort);
    if (!detail::spin_until([&] { return detail::ld_relaxed_u64(slot + 1) >= q; }, deadline)) {
      A.status[1] = r;
      atomicExch(A.status, kCgSumFailed);
      return false;
    }
    (void)detail::ld_acquire_sys_u64(slot + 1);
    total += __longlong_as_double(static_cast<long long>(detail::ld_relaxed_u64(slot)));
  }
  value = total;
  return true;
}

// Block sums of v, then (the last block to finish) the sum over ranks into s[kCgLocal] and the scalars' step:
// 0 and 1 cg_scalar_step's, kUpdateStep cg_update_step. The caller's grid barrier makes the new scalars
// visible to every block.
constexpr int kUpdateStep = 2;
__device__ __forceinline__ void reduce_step(const CgResidentArgs& A, const volatile unsigned int* abort, double v,
                                            int step) {
  double total;
  if (!block_total(v, A.partial, A.done, total)) return;
  if (!rank_sum(A, abort, total)) return;
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

// Block 0's clock: the time since its last lap goes to `phase`. Block 0 drives the halos and waits at every
// grid barrier, so its laps add up to the launch's whole time.
struct Laps {
  unsigned long long* ns;
  unsigned long long since;
  __device__ __forceinline__ void lap(int phase) {
    if (ns == nullptr) return;
    const unsigned long long now = detail::globaltimer_ns();
    ns[phase] += now - since;
    since = now;
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

// The four hops of a normal operator M_pc^dagger M_pc (hops[0..3] interiors, hops[4..7] exteriors), each
// interior first while block 0 moves the faces through queue q, then the exterior once they have landed.
// Fields written in this launch are read with plain loads. False: the kernel returns (status recorded).
template <typename R>
__device__ __forceinline__ bool normal_hops(const CgResidentArgs& A, const DslashArgs* hops, const GridBarrier& bar,
                                            RmaHandle q, Laps& laps, int first, int stride) {
  __shared__ int ok;
  const volatile int* status = A.status;
  for (int h = 0; h < 4; ++h) {
    const DslashArgs& I = hops[h];
    if (A.halo) {
      if (blockIdx.x == 0) {
        const bool started = rma_start(q);
        if (threadIdx.x == 0) ok = started;
        laps.lap(kPhaseHalo);
      }
      for (int cb = first; cb < I.vh; cb += stride) interior_site<R, false>(I, cb);
      if (blockIdx.x == 0) {
        laps.lap(kPhaseDslash);
        __syncthreads();
        const bool arrived = ok && rma_wait(q);
        if (!arrived && threadIdx.x == 0) atomicExch(A.status, kCgHaloFailed);
      }
      if (!barrier(A, bar)) return false;
      laps.lap(kPhaseHalo);
      if (*status != kCgOk) return false;  // every block sees it after the barrier
      const DslashArgs& E = hops[4 + h];
      for (int j = first; j < E.n_sites; j += stride) exterior_site<R>(E, E.sites[j]);
    } else {
      for (int cb = first; cb < I.vh; cb += stride) interior_site<R, false>(I, cb);
    }
    if (!barrier(A, bar)) return false;
    laps.lap(kPhaseDslash);
  }
  return true;
}

// The reliable update, as the host makes it (_solver.py) but without it: y += x, x = 0 (and y's faces);
// A y with the precise operator (its own queue qp); r = rhs - A y and |r|^2 summed over ranks; the book
// (cg_update_step); unless that hands the CG to the host, r_s = r rounded and p += r_new - r_s (and p's
// faces). False: the kernel returns (status recorded).
template <typename RS, typename RP>
__device__ bool reliable_update(const CgResidentArgs& A, const GridBarrier& bar, RmaHandle qp, Laps& laps,
                                int first, int stride) {
  const DslashArgs& Y = A.precise_hops[8];
  RS* x = static_cast<RS*>(A.x);
  for (int cb = first; cb < Y.vh; cb += stride) fold_site<RS, RP>(Y, x, cb);
  if (!barrier(A, bar)) return false;
  laps.lap(kPhaseVector);
  if (!normal_hops<RP>(A, A.precise_hops, bar, qp, laps, first, stride)) return false;
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
  reduce_step(A, bar.abort, v, kUpdateStep);
  if (!barrier_after_sum(A, bar)) return false;
  laps.lap(kPhaseReduction);
  if (flags_of(A.s) & kCgFrozen) return true;  // the host takes over from here (the same on every block)
  const DslashArgs& P = A.hops[8];
  for (int cb = first; cb < P.vh; cb += stride) new_residual_site<RS, RP>(P, r, cb);
  if (!barrier(A, bar)) return false;
  laps.lap(kPhaseVector);
  return true;
}

// Up to A.iterations CG iterations; with kUpdates (and A.updates) a due reliable update is made here, the
// precise operator being RP. Every block makes the same decisions: they read the flags after a barrier.
template <typename R, typename RP, bool kUpdates>
__device__ void cg_resident(const CgResidentArgs& A, const GridBarrier& bar, RmaHandle q, RmaHandle qp) {
  const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  Laps laps{blockIdx.x == 0 && threadIdx.x == 0 ? A.phase_ns : nullptr, 0ull};
  if (laps.ns != nullptr) laps.since = detail::globaltimer_ns();
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
        if (!reliable_update<R, RP>(A, bar, qp, laps, first, stride)) return;
      }
      if (flags_of(A.s) & kCgFrozen) break;
    }
    if (done == A.iterations) break;
    // A p = M_pc^dagger M_pc p
    if (!normal_hops<R>(A, A.hops, bar, q, laps, first, stride)) return;
    // <p, A p>, summed over ranks: alpha.
    double v = 0.0;
    for (long long i = first; i < A.n; i += stride) v += (double)p[i] * (double)ap[i];
    reduce_step(A, bar.abort, v, 0);
    if (!barrier_after_sum(A, bar)) return;
    laps.lap(kPhaseReduction);
    // x += alpha p, r -= alpha A p, |r|^2 summed over ranks: beta, the count and the flags.
    const R alpha = R(static_cast<const volatile double*>(A.s)[kCgAlpha]);
    v = 0.0;
    for (long long i = first; i < A.n; i += stride) {
      x[i] += alpha * p[i];
      const R ri = r[i] - alpha * ap[i];
      r[i] = ri;
      v += (double)ri * (double)ri;
    }
    laps.lap(kPhaseVector);
    reduce_step(A, bar.abort, v, 1);
    if (!barrier_after_sum(A, bar)) return;
    laps.lap(kPhaseReduction);
    // p = r + beta p and its faces for the next iteration's first hop (skipped once frozen at its start).
    if (!(flags_of(A.s) & kCgSkip)) {
      const DslashArgs& P = A.hops[8];
      const double beta = static_cast<const volatile double*>(A.s)[kCgBeta];
      for (int cb = first; cb < P.vh; cb += stride) xpay_pack_site<R, false>(P, cb, beta);
    }
    if (!barrier(A, bar)) return;
    laps.lap(kPhaseVector);
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
// 3 the mixed-precision resident CG. Without the macro (host builds, nvcc checks) everything is built.
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
  /* The resident CG: up to A.iterations iterations in one co-resident launch (launch_resident); qp unused */ \
  extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)                                                \
      qcd_cg_resident_##SUFFIX(CgResidentArgs A, GridBarrier bar, RmaHandle q, RmaHandle qp) {                \
    circuslink::qcd::cg_resident<R, R, false>(A, bar, q, qp);                                                  \
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
  circuslink::qcd::cg_resident<float, double, true>(A, bar, q, qp);
}
#endif
