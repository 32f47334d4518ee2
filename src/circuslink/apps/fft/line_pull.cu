// The FFT pull's own transforms of one axis (apps/fft/_line_pull.py says why and how they are launched).
//
// Point b of the axis has its run of untransformed points at table[b] (element j of the run: the input at run j,
// point b), an address in the window of the rank that holds it; out[j * n + k] is the DFT over b. A block owns T
// neighbouring runs and transforms them with a Stockham autosort FFT (radix 8, then one pass of 4 or 2) in place
// in shared memory: each pass reads every element it owns into registers, waits for the block, then writes. The
// first pass reads the holders (runs t fastest, so a warp's loads are whole sectors) and the last writes the
// output, so 8^3 points take four passes over shared memory, not eight. E elements a thread; S = -1 forward, +1
// inverse (unnormalised). Up to 1024 points in one kernel; up to 1024^2 as a four-step FFT in two (Bailey,
// "FFTs in external or hierarchical memory", J. Supercomputing 1990): the first pulls and transforms strided
// points and twiddles, the second transforms across them and writes the output. Up to 128 KiB of points (16384
// complex64, 8192 complex128) still in one pass, by a thread-block cluster: T blocks, one run each, each reading
// a T-th of the points of all T runs (whole sectors again) into the shared memory of the run's block; up to 256
// KiB with two blocks a run.

template <typename V> struct Real;
template <> struct Real<float2> { typedef float T; };
template <> struct Real<double2> { typedef double T; };

template <typename V> __device__ __forceinline__ V make(typename Real<V>::T x, typename Real<V>::T y) {
  V v; v.x = x; v.y = y; return v;
}
template <typename V> __device__ __forceinline__ V add(V a, V b) { return make<V>(a.x + b.x, a.y + b.y); }
template <typename V> __device__ __forceinline__ V sub(V a, V b) { return make<V>(a.x - b.x, a.y - b.y); }
template <typename V> __device__ __forceinline__ V mul(V a, V w) {
  return make<V>(a.x * w.x - a.y * w.y, a.x * w.y + a.y * w.x);
}
// a * (S i)
template <int S, typename V> __device__ __forceinline__ V rot(V a) { return make<V>(-S * a.y, S * a.x); }

// The radix-R DFT of v in place, natural order, exp(S 2 pi i r k / R).
template <int R, int S, typename V> __device__ __forceinline__ void dft(V* v) {
  typedef typename Real<V>::T F;
  if constexpr (R == 2) {
    V a = v[0]; v[0] = add(a, v[1]); v[1] = sub(a, v[1]);
  } else if constexpr (R == 4) {
    V t0 = add(v[0], v[2]), t1 = sub(v[0], v[2]), t2 = add(v[1], v[3]), t3 = rot<S>(sub(v[1], v[3]));
    v[0] = add(t0, t2); v[1] = add(t1, t3); v[2] = sub(t0, t2); v[3] = sub(t1, t3);
  } else {
    static_assert(R == 8, "radix 2, 4 or 8");
    V e[4] = {v[0], v[2], v[4], v[6]}, o[4] = {v[1], v[3], v[5], v[7]};
    dft<4, S>(e); dft<4, S>(o);
    const F h = (F)0.70710678118654752440;
    o[1] = make<V>((o[1].x - S * o[1].y) * h, (o[1].y + S * o[1].x) * h);
    o[2] = rot<S>(o[2]);
    o[3] = make<V>((-o[3].x - S * o[3].y) * h, (-o[3].y + S * o[3].x) * h);
#pragma unroll
    for (int k = 0; k < 4; ++k) { v[k] = add(e[k], o[k]); v[k + 4] = sub(e[k], o[k]); }
  }
}

template <int N, int NS> struct Radix { enum { value = (N / NS) >= 8 ? 8 : N / NS }; };

#ifndef CIRCUSLINK_FFT_CLUSTER_GROUP
#define CIRCUSLINK_FFT_CLUSTER_GROUP 64  // the cluster kernel's loads: bytes of neighbouring runs a lane group reads
#endif

// Shared memory and thread-block clusters (sm_90). tests/data/fft_line_pull_emulation.cpp defines these for the
// host when it compiles this file as C++.
#ifndef CIRCUSLINK_FFT_EMULATION
__device__ __forceinline__ unsigned char* fft_shared() {
  extern __shared__ __align__(16) unsigned char circuslink_fft_shared[];
  return circuslink_fft_shared;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The cluster's barrier in two halves, so that a block's own work goes on between its arrival and its wait; the
// arrival releases the block's writes (to any block's shared memory) and the wait acquires everyone's.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// p (this block's shared memory) in block `rank` of the cluster: a generic address of distributed shared memory.
template <typename T> __device__ __forceinline__ T* cluster_peer(T* p, unsigned rank) {
  unsigned long long a;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(a) : "l"(p), "r"(rank));
  return reinterpret_cast<T*>(a);
}
#endif

// Where a kernel's first pass reads and its last pass writes: valid(t), load(t, b) and store(t, k, v) of run t of
// the block's tile, point b in, point k out. STORE_T_FASTEST: the last pass gives neighbouring threads
// neighbouring runs (the output is contiguous along the runs), else neighbouring points. IN_SHARED: load reads
// the block's own shared memory (the first pass then waits for the block before it writes). PAD: one element of
// padding after every 2^PAD in shared memory (0: none), which keeps a pass's stores of one run free of bank
// conflicts (T = 1: nothing else spreads them).

// One pass over the whole axis: out[j * N + k] = DFT over b of table[b][j].
template <typename V, int N> struct LineIo {
  static constexpr bool STORE_T_FASTEST = false;
  static constexpr bool IN_SHARED = false, OUT_SHARED = false;
  static constexpr int PAD = 0;
  const V* const* table;
  V* out;
  long long j0, J;
  __device__ __forceinline__ bool valid(int t) const { return j0 + t < J; }
  __device__ __forceinline__ V load(int t, int b) const { return table[b][j0 + t]; }
  __device__ __forceinline__ void store(int t, int k, V v) const { out[(j0 + t) * N + k] = v; }
};

// Four-step, first half (n = M1 * m2 points, b = b1 * m2 + b2, k = k1 + M1 * k2): for the block's b2, the DFT
// over b1 of table[b1 * m2 + b2][j], twiddled by exp(S 2 pi i b2 k1 / n), to mid[(j * m2 + b2) * M1 + k1].
template <typename V, int M1> struct HalfOneIo {
  static constexpr bool STORE_T_FASTEST = false;
  static constexpr bool IN_SHARED = false, OUT_SHARED = false;
  static constexpr int PAD = 0;
  const V* const* table;
  const V* twn;  // exp(S 2 pi i m / n), m < n
  V* mid;
  long long j0, J;
  int b2, m2;
  __device__ __forceinline__ bool valid(int t) const { return j0 + t < J; }
  __device__ __forceinline__ V load(int t, int b1) const { return table[b1 * m2 + b2][j0 + t]; }
  __device__ __forceinline__ void store(int t, int k1, V v) const {
    mid[((j0 + t) * m2 + b2) * M1 + k1] = mul(v, twn[b2 * k1]);
  }
};

// Four-step, second half: for the block's run j and its tile of k1, the DFT over b2 of mid[(j * M2 + b2) * m1 +
// k1] to out[j * n + k1 + m1 * k2].
template <typename V, int M2> struct HalfTwoIo {
  static constexpr bool STORE_T_FASTEST = true;
  static constexpr bool IN_SHARED = false, OUT_SHARED = false;
  static constexpr int PAD = 0;
  const V* mid;
  V* out;
  long long j;
  int k10, m1;
  __device__ __forceinline__ bool valid(int t) const { return k10 + t < m1; }
  __device__ __forceinline__ V load(int t, int b2) const { return mid[(j * M2 + b2) * m1 + k10 + t]; }
  __device__ __forceinline__ void store(int t, int k2, V v) const {
    out[j * (long long)m1 * M2 + k10 + t + (long long)m1 * k2] = v;
  }
};

// The cluster kernel's one run in the block's shared memory, read by the first pass; the last writes out[j * N +
// k], or with TO_SHARED the shared memory again (in natural order, for the cluster's last radix-H step).
template <typename V, int N, int PAD_, bool TO_SHARED> struct SharedLineIo {
  static constexpr bool STORE_T_FASTEST = false;
  static constexpr bool IN_SHARED = true, OUT_SHARED = TO_SHARED;
  static constexpr int PAD = PAD_;
  V* buf;
  V* out;
  long long j, J;
  __device__ __forceinline__ bool valid(int) const { return j < J; }
  __device__ __forceinline__ V load(int, int b) const { return buf[b + (b >> PAD)]; }
  __device__ __forceinline__ void store(int, int k, V v) const {
    if constexpr (TO_SHARED) buf[k + (k >> PAD)] = v; else out[j * N + k] = v;
  }
};

// Point i of run t in shared memory.
template <int P, int PAD> __device__ __forceinline__ int slot(int t, int i) {
  return t * P + i + (PAD ? i >> PAD : 0);
}

// One Stockham pass of radix R after NS points: E / R butterflies a thread. The first reads io (runs t fastest,
// so that a warp's loads are whole sectors), the others shared memory; the last writes io.
template <typename V, int N, int T, int E, int S, int NS, class Io>
__device__ __forceinline__ void pass(V* buf, const V* tw, const Io& io) {
  constexpr int R = Radix<N, NS>::value;
  constexpr int THREADS = T * N / E;
  constexpr int BF = E / R;
  constexpr int P = N + 1;  // a run's pitch in shared memory: a run's neighbours fall in other banks
  constexpr bool FIRST = NS == 1, LAST = NS * R == N;
  constexpr bool TFAST = FIRST || (LAST && Io::STORE_T_FASTEST);
  V v[BF][R];
  int col[BF], at[BF];
#pragma unroll
  for (int k = 0; k < BF; ++k) {
    const int q = threadIdx.x + k * THREADS;
    const int t = TFAST ? q % T : q / (N / R), jj = TFAST ? q / T : q % (N / R);
    col[k] = t; at[k] = jj;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (FIRST) {
        v[k][r] = io.valid(t) ? io.load(t, jj + r * (N / R)) : make<V>(0, 0);
      } else {
        v[k][r] = buf[slot<P, Io::PAD>(t, jj + r * (N / R))];
        if (r > 0) {
          const V w = tw[(jj % NS) * r * (N / (NS * R))];
          v[k][r] = mul(v[k][r], w);
        }
      }
    }
  }
  if constexpr ((!FIRST || Io::IN_SHARED) && (!LAST || Io::OUT_SHARED))
    __syncthreads();  // in place: every read of the block before any write
#pragma unroll
  for (int k = 0; k < BF; ++k) {
    dft<R, S>(v[k]);
    const int t = col[k], jj = at[k], d = (jj / NS) * NS * R + jj % NS;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (LAST) {
        if (io.valid(t)) io.store(t, d + r * NS, v[k][r]);
      } else {
        buf[slot<P, Io::PAD>(t, d + r * NS)] = v[k][r];
      }
    }
  }
  if constexpr (!LAST) {
    __syncthreads();
    pass<V, N, T, E, S, NS * R>(buf, tw, io);
  }
}

#define CIRCUSLINK_FFT_SHARED(V) V* buf = reinterpret_cast<V*>(fft_shared())

// An axis of N <= 1024 points in one pass: block x = a tile of T runs.
template <typename V, int N, int T, int E, int S>
__global__ void __launch_bounds__(T * N / E) circuslink_fft_line_pull(const V* const* __restrict__ table,
                                                                        const V* __restrict__ tw,
                                                                        V* __restrict__ out, long long J) {
  CIRCUSLINK_FFT_SHARED(V);
  const LineIo<V, N> io{table, out, (long long)blockIdx.x * T, J};
  pass<V, N, T, E, S, 1>(buf, tw, io);
}

// The four-step's first half (M1 points a pass): block x = a tile of T runs, y = b2.
template <typename V, int M1, int T, int E, int S>
__global__ void __launch_bounds__(T * M1 / E) circuslink_fft_pull_half1(const V* const* __restrict__ table,
                                                                          const V* __restrict__ tw,
                                                                          const V* __restrict__ twn,
                                                                          V* __restrict__ mid, long long J, int m2) {
  CIRCUSLINK_FFT_SHARED(V);
  const HalfOneIo<V, M1> io{table, twn, mid, (long long)blockIdx.x * T, J, (int)blockIdx.y, m2};
  pass<V, M1, T, E, S, 1>(buf, tw, io);
}

// The four-step's second half (M2 points a pass): block x = the run j, y = a tile of T values of k1.
template <typename V, int M2, int T, int E, int S>
__global__ void __launch_bounds__(T * M2 / E) circuslink_fft_pull_half2(const V* __restrict__ mid,
                                                                          const V* __restrict__ tw,
                                                                          V* __restrict__ out, int m1) {
  CIRCUSLINK_FFT_SHARED(V);
  const HalfTwoIo<V, M2> io{mid, out, (long long)blockIdx.x, (int)blockIdx.y * T, m1};
  pass<V, M2, T, E, S, 1>(buf, tw, io);
}

// An axis of N points (N x sizeof(V) / H up to 128 KiB) in one pass by a cluster of T x H blocks (T x sizeof(V)
// = 64 bytes): blocks t H ... t H + H - 1 transform run j0 + t, block t H + h holding its points b = h mod H. Block
// c reads points [c N / (T H), (c + 1) N / (T H)) of all T runs (a warp's loads are whole sectors, as in the line
// kernel) and stores each into the shared memory of the block that holds it. After the cluster's barrier each
// block transforms its M = N / H points. With H = 2 (decimation in time) the two halves' transforms E0 and E1
// then meet through shared memory: block h writes X[k + h M] = E0[k] +- w^k E1[k], w = exp(S 2 pi i / N).
// twm: exp(S 2 pi i m / M); twn: exp(S 2 pi i m / N), m < M (H = 2 only). stride: elements between run j's and
// run j + 1's element of a point: 1 for a pull (runs contiguous), N for rows in memory (T = 1: a local
// transform of rows, table[b] = the first row's point b).
template <typename V, int N, int T, int H, int E, int S>
__global__ void __cluster_dims__(T * H, 1, 1) __launch_bounds__(N / H / E)
    circuslink_fft_line_pull_cluster(const V* const* __restrict__ table, const V* __restrict__ twm,
                                     const V* __restrict__ twn, V* __restrict__ out, long long J,
                                     long long stride) {
  static_assert(H == 1 || H == 2, "one block a run, or two");
  constexpr int M = N / H, THREADS = M / E, PAD = 4;  // PAD 4: no bank conflicts in any pass, either precision
  // Neighbouring lanes load G neighbouring runs of one point (G x sizeof(V) bytes, whole sectors down to 32), so a
  // warp's stores go to G blocks, 32 / G elements each. CIRCUSLINK_FFT_CLUSTER_GROUP (bytes; default 64, all T
  // runs) trades the loads' width against the stores' for A/B runs (CIRCUSLINK_DEVICE_DEFINES).
  constexpr int GB = CIRCUSLINK_FFT_CLUSTER_GROUP / (int)sizeof(V), G = GB < 1 ? 1 : GB > T ? T : GB;
  constexpr int P = N / (T * H);  // the points this block reads of every run
  CIRCUSLINK_FFT_SHARED(V);
  const int c = (int)cluster_rank(), h = c % H;
  const long long j0 = (long long)(blockIdx.x / (T * H)) * T, j = j0 + c / H;
  cluster_arrive();  // a block's shared memory takes stores once the block runs: wait for the others after the loads
  // element k of this thread: run t of the cluster, point b (the loads and the stores must agree)
  const auto run_of = [&](int k) { const int q = threadIdx.x + k * THREADS; return q % G + G * (q / (G * P)); };
  const auto point_of = [&](int k) { const int q = threadIdx.x + k * THREADS; return c * P + q / G % P; };
  V v[E];
#pragma unroll
  for (int k = 0; k < E; ++k) {
    const int t = run_of(k), b = point_of(k);
    v[k] = j0 + t < J ? table[b][(j0 + t) * stride] : make<V>(0, 0);
  }
  cluster_wait();
#pragma unroll
  for (int k = 0; k < E; ++k) {
    const int t = run_of(k), b = point_of(k), i = b / H;
    cluster_peer(buf, (unsigned)(t * H + b % H))[i + (i >> PAD)] = v[k];
  }
  cluster_arrive();  // every run's points are in: no store reaches another block after this
  cluster_wait();
  const SharedLineIo<V, M, PAD, H == 2> io{buf, out, j, J};
  pass<V, M, 1, E, S, 1>(buf, twm, io);
  if constexpr (H == 2) {
    cluster_arrive();  // both halves' transforms are in
    cluster_wait();
    const V* mine = buf;
    const V* other = cluster_peer(buf, (unsigned)(c ^ 1));
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int k = threadIdx.x + e * THREADS, i = k + (k >> PAD);
      v[e] = h ? other[i] : mine[i];  // E0[k]
      const V odd = mul(h ? mine[i] : other[i], twn[k]);
      v[e] = h ? sub(v[e], odd) : add(v[e], odd);
    }
    cluster_arrive();  // this block's reads of the other's shared memory are done: it may exit after its wait
    if (j < J) {
#pragma unroll
      for (int e = 0; e < E; ++e) out[j * N + h * M + threadIdx.x + e * THREADS] = v[e];
    }
    cluster_wait();
  }
}
