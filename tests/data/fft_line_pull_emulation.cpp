// The FFT pull's kernels (src/circuslink/apps/fft/line_pull.cu) run on the cpu: each block's threads are host
// threads meeting at a std::barrier for __syncthreads, so the CUDA source's index maths is checked without a GPU
// (tests/test_fft_line_pull.py compiles this with -DKERNEL_SOURCE naming that file). A thread-block cluster's
// blocks run at once, each with shared memory of its own, and meet at a barrier of all their threads. Sources are
// scattered through a pool in a random order; every output point is compared with a long-double FFT of the input.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>
struct float2 { float x, y; };
struct double2 { double x, y; };
struct Dim { unsigned x = 0, y = 0; };
thread_local Dim threadIdx, blockIdx;
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
#define __cluster_dims__(x, y, z)
#define __restrict__
#define __align__(x)
#define CIRCUSLINK_FFT_EMULATION
struct Block {  // one block's shared memory and barrier
  std::vector<unsigned char> shared = std::vector<unsigned char>(1 << 18);
  std::barrier<>* bar = nullptr;
};
struct Cluster {
  std::vector<Block>* blocks = nullptr;
  std::barrier<>* bar = nullptr;
};
thread_local Block* block;
thread_local Cluster cluster;
thread_local unsigned rank_in_cluster;
thread_local std::optional<std::barrier<>::arrival_token> arrival;
inline void __syncthreads() { block->bar->arrive_and_wait(); }
inline unsigned char* fft_shared() { return block->shared.data(); }
inline unsigned cluster_rank() { return rank_in_cluster; }
inline void cluster_arrive() { arrival = cluster.bar->arrive(); }
inline void cluster_wait() { cluster.bar->wait(std::move(*arrival)); arrival.reset(); }
template <typename T> T* cluster_peer(T* p, unsigned rank) {
  const size_t at = reinterpret_cast<unsigned char*>(p) - block->shared.data();
  return reinterpret_cast<T*>((*cluster.blocks)[rank].shared.data() + at);
}
#include KERNEL_SOURCE

typedef std::complex<long double> C;

// A radix-2 FFT in long double: the reference (exp(S 2 pi i b k / n)).
void reference(std::vector<C>& a, int S) {
  const size_t n = a.size();
  for (size_t i = 1, j = 0; i < n; ++i) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (size_t len = 2; len <= n; len <<= 1)
    for (size_t i = 0; i < n; i += len)
      for (size_t k = 0; k < len / 2; ++k) {
        long double ang = S * 2.0L * M_PIl * k / len;
        C w(cosl(ang), sinl(ang)), u = a[i + k], v = a[i + k + len / 2] * w;
        a[i + k] = u + v; a[i + k + len / 2] = u - v;
      }
}

// Blocks in clusters of `size` along x (1: one block at a time), every cluster's blocks at once.
void launch(unsigned gx, unsigned gy, int threads, const std::function<void()>& body, unsigned size = 1) {
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x0 = 0; x0 < gx; x0 += size) {
      std::vector<Block> blocks(size);
      std::vector<std::unique_ptr<std::barrier<>>> bars;
      for (auto& b : blocks) b.bar = bars.emplace_back(std::make_unique<std::barrier<>>(threads)).get();
      std::barrier<> cbar(threads * size);
      std::vector<std::thread> th;
      for (unsigned c = 0; c < size; ++c)
        for (int t = 0; t < threads; ++t)
          th.emplace_back([&, c, t] {
            threadIdx.x = t; blockIdx.x = x0 + c; blockIdx.y = y;
            block = &blocks[c]; cluster = Cluster{&blocks, &cbar}; rank_in_cluster = c;
            body();
          });
      for (auto& t : th) t.join();
    }
}

template <typename V> std::vector<V> table_of(int n, long double S) {
  typedef typename Real<V>::T F;
  std::vector<V> tw(n);
  for (int k = 0; k < n; ++k) { long double ang = S * 2.0L * M_PIl * k / n; tw[k].x = (F)cosl(ang); tw[k].y = (F)sinl(ang); }
  return tw;
}

// The tile and threads as _line_pull.shape picks them (TILE_BYTES 64, THREADS 256, at least 8 elements a thread).
template <typename V, int N> struct Shape {
  static constexpr int T = 64 / (int)sizeof(V), E0 = T * N / 256, E = E0 > 8 ? E0 : 8, THREADS = T * N / E;
};

// FOUR = 0: the line kernel (N points), or with CE > 0 the cluster kernel with CE elements a thread (CE < 0: -CE,
// on rows in memory); else the four-step's halves with M1 = N, M2 = FOUR.
template <typename V, int N, int FOUR, int S, int CE> double run(long long J, std::mt19937_64& g) {
  typedef typename Real<V>::T F;
  constexpr int M2 = FOUR ? FOUR : 1, n = N * M2;
  std::normal_distribution<double> nd;
  const long long gap = 3;
  std::vector<V> pool((J + gap) * n);
  std::vector<int> perm(n);
  for (int i = 0; i < n; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), g);
  std::vector<const V*> table(n);
  std::vector<C> x((size_t)J * n);
  for (int b = 0; b < n; ++b) {
    V* run = pool.data() + perm[b] * (J + gap);
    table[b] = run;
    for (long long j = 0; j < J; ++j) {
      run[j].x = (F)nd(g); run[j].y = (F)nd(g);
      x[j * n + b] = C(run[j].x, run[j].y);
    }
  }
  std::vector<V> out((size_t)J * n, V{-7, -7});
  if constexpr (CE > 0) {  // _line_pull.cluster_blocks: two blocks a run above 128 KiB
    constexpr int T = 64 / (int)sizeof(V), H = N * (int)sizeof(V) > (128 << 10) ? 2 : 1;
    auto twm = table_of<V>(N / H, S), twn = table_of<V>(N, S);
    launch((J + T - 1) / T * T * H, 1, N / H / CE, [&] {
      circuslink_fft_line_pull_cluster<V, N, T, H, CE, S>(table.data(), twm.data(), twn.data(), out.data(), J, 1);
    }, T * H);
  } else if constexpr (CE < 0) {  // the cluster kernel on rows in memory (T = 1, stride n): a local transform
    constexpr int H = N * (int)sizeof(V) > (128 << 10) ? 2 : 1;
    std::vector<V> rows((size_t)J * n);
    for (int b = 0; b < n; ++b)
      for (long long j = 0; j < J; ++j) rows[j * n + b] = table[b][j];
    std::vector<const V*> first(n);
    for (int b = 0; b < n; ++b) first[b] = rows.data() + b;
    auto twm = table_of<V>(N / H, S), twn = table_of<V>(N, S);
    launch((unsigned)J * H, 1, N / H / -CE, [&] {
      circuslink_fft_line_pull_cluster<V, N, 1, H, -CE, S>(first.data(), twm.data(), twn.data(), out.data(), J, n);
    }, H);
  } else if constexpr (!FOUR) {
    typedef Shape<V, N> A;
    auto tw = table_of<V>(N, S);
    launch((J + A::T - 1) / A::T, 1, A::THREADS, [&] {
      circuslink_fft_line_pull<V, N, A::T, A::E, S>(table.data(), tw.data(), out.data(), J); });
  } else {
    typedef Shape<V, N> A;
    typedef Shape<V, M2> B;
    auto tw1 = table_of<V>(N, S), tw2 = table_of<V>(M2, S), twn = table_of<V>(n, S);
    std::vector<V> mid((size_t)J * n, V{-5, -5});
    launch((J + A::T - 1) / A::T, M2, A::THREADS, [&] {
      circuslink_fft_pull_half1<V, N, A::T, A::E, S>(table.data(), tw1.data(), twn.data(), mid.data(), J, M2); });
    launch(J, (N + B::T - 1) / B::T, B::THREADS, [&] {
      circuslink_fft_pull_half2<V, M2, B::T, B::E, S>(mid.data(), tw2.data(), out.data(), N); });
  }
  long double err = 0, mx = 0;
  for (long long j = 0; j < J; ++j) {
    std::vector<C> want(x.begin() + j * n, x.begin() + (j + 1) * n);
    reference(want, S);
    for (int k = 0; k < n; ++k) {
      C got(out[j * n + k].x, out[j * n + k].y);
      err = std::max(err, std::abs(got - want[k])); mx = std::max(mx, std::abs(want[k]));
    }
  }
  return (double)(err / mx);
}

unsigned long long seed;
int failed = 0;
template <typename V, int N, int FOUR = 0, int CE = 0> void both() {
  constexpr int IS = sizeof(V), T = 64 / IS;
  std::mt19937_64 g(seed * 4099 + N * 2 + IS + FOUR * 7 + CE * 13);
  const long long J = FOUR ? 1 + (long long)(g() % 4) : 1 + (long long)(g() % (3 * T + 2));  // a partial tile mostly
  const double tol = IS == 8 ? 1e-6 : 1e-13;
  double f = run<V, N, FOUR, -1, CE>(J, g), i = run<V, N, FOUR, 1, CE>(J, g);
  const bool bad = !(f < tol) || !(i < tol);
  failed |= bad;
  printf("%s %s n=%d runs=%lld forward %.2e inverse %.2e%s\n", IS == 8 ? "complex64 " : "complex128",
         FOUR ? "four-step" : CE > 0 ? "cluster  " : CE ? "rows     " : "line     ", N * (FOUR ? FOUR : 1), J, f, i,
         bad ? "  FAILED" : "");
}
template <typename V> void line_sizes() {
  both<V, 2>(); both<V, 4>(); both<V, 8>(); both<V, 16>(); both<V, 32>(); both<V, 64>(); both<V, 128>();
  both<V, 256>(); both<V, 512>(); both<V, 1024>();
  both<V, 2, 2>(); both<V, 8, 4>(); both<V, 32, 64>(); both<V, 64, 32>(); both<V, 128, 128>(); both<V, 1024, 16>();
}
bool cluster_only = false;  // argv[2] "cluster": the cluster kernel's cases alone
template <typename V> void sizes() {
  if (!cluster_only) line_sizes<V>();
  // The cluster kernel: 2048 and 4096 points with _line_pull.shape's elements a thread; its largest sizes (at
  // complex128 16384, two blocks a run) with more elements a thread than the GPU's, for fewer host threads (the
  // index maths is the same for any E).
  both<V, 2048, 0, 8>(); both<V, 4096, 0, 8>();
  if constexpr (sizeof(V) == 16) { both<V, 8192, 0, 8>(); both<V, 16384, 0, 64>(); }
  else { both<V, 8192, 0, 64>(); both<V, 16384, 0, 128>(); }
  both<V, 2048, 0, -8>(); both<V, 16384, 0, -64>();  // on rows in memory (at complex128 16384, two blocks a row)
}
int main(int argc, char** argv) {
  seed = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1;
  cluster_only = argc > 2 && std::string(argv[2]) == "cluster";
  sizes<float2>(); sizes<double2>();
  return failed;
}
