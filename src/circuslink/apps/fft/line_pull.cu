// The FFT pull's own transform of one axis (apps/fft/_line_pull.py says why and how it is launched).
//
// A block owns T neighbouring runs j of every point b of the axis: dst[j * N + b] is the DFT over b of
// table[b][j], table[b] the address of point b's run in the window of the rank that holds it. A Stockham
// autosort FFT (radix 8, then one pass of 4 or 2) in place in shared memory: each pass reads every element it
// owns into registers, waits for the block, then writes. The first pass reads the holders (runs t fastest, so a
// warp's loads are whole sectors), the last writes the output rows (whole lines), so 8^3 points take four
// passes over shared memory, not eight. E elements a thread; S = -1 forward, +1 inverse (unnormalised).

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

// One Stockham pass of radix R after NS points: E / R butterflies a thread. FIRST reads the peers (runs t
// fastest, so that a warp's loads are whole sectors), the others shared memory; LAST writes the output rows.
template <typename V, int N, int T, int E, int S, int NS>
__device__ __forceinline__ void pass(V* buf, const V* const* table, const V* tw, V* out, long long j0,
                                     long long J) {
  constexpr int R = Radix<N, NS>::value;
  constexpr int THREADS = T * N / E;
  constexpr int BF = E / R;
  constexpr int P = N + 1;  // a run's pitch in shared memory: a run's neighbours fall in other banks
  constexpr bool FIRST = NS == 1, LAST = NS * R == N;
  V v[BF][R];
  int col[BF], at[BF];
#pragma unroll
  for (int k = 0; k < BF; ++k) {
    const int q = threadIdx.x + k * THREADS;
    const int t = FIRST ? q % T : q / (N / R), jj = FIRST ? q / T : q % (N / R);
    col[k] = t; at[k] = jj;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (FIRST) {
        v[k][r] = j0 + t < J ? table[jj + r * (N / R)][j0 + t] : make<V>(0, 0);
      } else {
        v[k][r] = buf[t * P + jj + r * (N / R)];
        if (r > 0) {
          const V w = tw[(jj % NS) * r * (N / (NS * R))];
          v[k][r] = mul(v[k][r], w);
        }
      }
    }
  }
  if constexpr (!FIRST && !LAST) __syncthreads();  // in place: every read of this pass before any write
#pragma unroll
  for (int k = 0; k < BF; ++k) {
    dft<R, S>(v[k]);
    const int t = col[k], jj = at[k], d = (jj / NS) * NS * R + jj % NS;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (LAST) {
        if (j0 + t < J) out[(j0 + t) * N + d + r * NS] = v[k][r];
      } else {
        buf[t * P + d + r * NS] = v[k][r];
      }
    }
  }
  if constexpr (!LAST) {
    __syncthreads();
    pass<V, N, T, E, S, NS * R>(buf, table, tw, out, j0, J);
  }
}

template <typename V, int N, int T, int E, int S>
__global__ void __launch_bounds__(T * N / E) circuslink_fft_line_pull(const V* const* __restrict__ table,
                                                                        const V* __restrict__ tw,
                                                                        V* __restrict__ out, long long J) {
  extern __shared__ __align__(16) unsigned char circuslink_fft_shared[];
  V* buf = reinterpret_cast<V*>(circuslink_fft_shared);
  pass<V, N, T, E, S, 1>(buf, table, tw, out, (long long)blockIdx.x * T, J);
}
