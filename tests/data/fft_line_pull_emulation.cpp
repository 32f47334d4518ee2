// The pull's line kernel (src/circuslink/apps/fft/line_pull.cu) run on the cpu: each block's threads are host
// threads meeting at a std::barrier for __syncthreads, so the CUDA source's index maths is checked without a GPU
// (tests/test_fft_line_pull.py compiles this with -DKERNEL_SOURCE naming that file). Every output
// point is compared with a direct DFT in long double, sources scattered through a pool in a random order.
#include <barrier>
#include <thread>
#include <vector>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <cmath>
#include <algorithm>
struct float2 { float x, y; };
struct double2 { double x, y; };
struct Dim { int x = 0; };
thread_local Dim threadIdx, blockIdx;
std::barrier<>* bar;
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
#define __restrict__
#define __shared__
#define __align__(x)
inline void __syncthreads() { bar->arrive_and_wait(); }
alignas(16) unsigned char circuslink_fft_shared[1 << 20];
#include KERNEL_SOURCE

template <typename V, int N, int T, int E, int S> double run(long long J, unsigned seed) {
  typedef typename Real<V>::T F;
  std::mt19937_64 g(seed);
  std::normal_distribution<double> nd;
  // sources: N runs of J elements at scrambled places in one pool with gaps
  long long gap = 3;
  std::vector<V> pool((J + gap) * N);
  std::vector<int> perm(N); for (int i = 0; i < N; ++i) perm[i] = i; std::shuffle(perm.begin(), perm.end(), g);
  std::vector<const V*> table(N);
  std::vector<std::complex<long double>> x((size_t)J * N);
  for (int b = 0; b < N; ++b) {
    V* run = pool.data() + perm[b] * (J + gap);
    table[b] = run;
    for (long long j = 0; j < J; ++j) { double a = nd(g), c = nd(g); run[j].x = (F)a; run[j].y = (F)c; x[j * N + b] = {(long double)run[j].x, (long double)run[j].y}; }
  }
  std::vector<V> tw(N);
  for (int k = 0; k < N; ++k) { long double ang = S * 2.0L * M_PIl * k / N; tw[k].x = (F)cosl(ang); tw[k].y = (F)sinl(ang); }
  std::vector<V> out((size_t)J * N, V{-7, -7});
  constexpr int THREADS = T * N / E;
  long long blocks = (J + T - 1) / T;
  for (long long bk = 0; bk < blocks; ++bk) {
    std::barrier<> b(THREADS); bar = &b;
    std::vector<std::thread> th;
    for (int t = 0; t < THREADS; ++t) th.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = (int)bk;
      circuslink_fft_line_pull<V, N, T, E, S>(table.data(), tw.data(), out.data(), J); });
    for (auto& t : th) t.join();
  }
  long double err = 0, mx = 0;
  for (long long j = 0; j < J; ++j) for (int k = 0; k < N; ++k) {
    std::complex<long double> s = 0;
    for (int b = 0; b < N; ++b) { long double ang = S * 2.0L * M_PIl * (long double)((long long)b * k % N) / N; s += x[j * N + b] * std::complex<long double>(cosl(ang), sinl(ang)); }
    std::complex<long double> got(out[j * N + k].x, out[j * N + k].y);
    err = std::max(err, std::abs(got - s)); mx = std::max(mx, std::abs(s));
  }
  return (double)(err / mx);
}
unsigned long long seed;
int failed = 0;
// The tile and threads as _line_pull.shape picks them (TILE_BYTES 64, THREADS 256, at least 8 elements a thread).
template <typename V, int N> void both() {
  constexpr int IS = sizeof(V), T = 64 / IS, E0 = T * N / 256, E = E0 > 8 ? E0 : 8;
  std::mt19937_64 g(seed * 4099 + N * 2 + IS);
  const long long J = 1 + (long long)(g() % (3 * T + 2));  // a partial tile most of the time
  const double tol = IS == 8 ? 1e-6 : 1e-13;
  double f = run<V, N, T, E, -1>(J, (unsigned)g()), i = run<V, N, T, E, 1>(J, (unsigned)g());
  const bool bad = !(f < tol) || !(i < tol);
  failed |= bad;
  printf("%s n=%d runs=%lld threads=%d forward %.2e inverse %.2e%s\n", IS == 8 ? "complex64 " : "complex128", N, J,
         T * N / E, f, i, bad ? "  FAILED" : "");
}
template <typename V> void sizes() {
  both<V, 2>(); both<V, 4>(); both<V, 8>(); both<V, 16>(); both<V, 32>(); both<V, 64>(); both<V, 128>();
  both<V, 256>(); both<V, 512>(); both<V, 1024>();
}
int main(int argc, char** argv) {
  seed = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1;
  sizes<float2>(); sizes<double2>();
  return failed;
}
