// The RMA queues' device code (src/circuslink/include/circuslink/rma.cuh) run on the cpu: every rank's block is a
// set of host threads meeting at a std::barrier for __syncthreads, the ranks' memory one host allocation, and
// detail/sync.cuh replaced by tests/data/rma_sync_host.cuh (tests/test_rma_session.py builds the include tree).
// Queues are laid out as the cuda module commits a low-latency queue (rma/_cuda.py: staging_layout, the words and
// lines); each rank drives its queue with rma_start / rma_wait, with an rma_session, or with both in turn, and
// checks every byte it received at every cycle.
//
//   rma_session_emulation RANKS THREADS CYCLES SEED MODES [SILENT [STOPPED [TIMEOUT_MS]]]
//     MODES: one letter a rank: c (rma_start / rma_wait), s (a session), m (session, classic, session again)
//     SILENT: a rank with no writes of its own (-1: none); STOPPED: a rank that never runs (-1: none)
//   TIMEOUT_MS: every device wait's time-out (default 20000)
//   prints one line a rank: "rank R done D bad B taken T error CODE RANK EPOCH epoch E words W lines L to A,B,..
//   from C,D,..." (its targets and origins, - for none; taken: 1 the rank's session took the queue, 0 it refused it, 2 the rank opened none)
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

struct uint4 { unsigned int x, y, z, w; };
struct Dim3 { unsigned int x = 0, y = 0, z = 0; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim{1, 1, 1};

struct Block {  // one rank's block: its barrier and __syncthreads_and's two alternating vote words
  std::unique_ptr<std::barrier<>> bar;
  std::atomic<int> failed[2];
  unsigned int threads = 0;
};
thread_local Block* block;
thread_local unsigned int thread_in_block;
thread_local unsigned int votes;
inline unsigned int block_thread_of_emulation() { return thread_in_block; }
inline unsigned int block_threads_of_emulation() { return block->threads; }

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
inline void __syncthreads() { block->bar->arrive_and_wait(); }
inline int __syncthreads_and(int p) {  // call k votes in word k % 2, and clears the other for call k + 1
  const unsigned int k = votes++;
  if (!p) block->failed[k & 1].store(1);
  block->bar->arrive_and_wait();
  if (thread_in_block == 0) block->failed[(k + 1) & 1].store(0);
  const int all = block->failed[k & 1].load() == 0;
  block->bar->arrive_and_wait();
  return all;
}
inline void __syncwarp(unsigned int = 0xffffffffu) {}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T>
inline T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);
  return expected;
}
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { return std::atomic_ref<unsigned int>(*p).fetch_add(v); }
inline unsigned int atomicExch(unsigned int* p, unsigned int v) { return std::atomic_ref<unsigned int>(*p).exchange(v); }

#define __CUDACC__ 1
#include <circuslink/rma.cuh>
#undef __CUDACC__

using u64 = unsigned long long;
using circuslink::RmaHandle;
using circuslink::RmaLine;
using circuslink::RmaQueue;
using circuslink::RmaWord;

static unsigned char value(u64 rank, u64 cycle, u64 i) {
  u64 x = (rank * 0x9E3779B97F4A7C15ull) ^ (cycle * 0xBF58476D1CE4E5B9ull) ^ (i * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86774B5D3ull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x >> 24);
}

constexpr u64 kWindow = 4096, kSources = 1024, kIncoming = 2048, kSlice = 256;
struct Write { u64 src, dst, size; };  // offsets: src in the origin's window, dst in the target's

struct Rank {
  unsigned char* window;
  u64* signals;                  // [0, R) arrivals, [R, 2R) posts (the credits of a low-latency queue)
  unsigned char* staging;
  circuslink::RmaState* state;
  circuslink::RmaErrorRecord* error;
  std::vector<u64> targets, arrival_at_target, origins, post_at_origin;
  std::vector<RmaWord> words;
  std::vector<RmaLine> lines;
  RmaQueue* queue;
  RmaHandle handle;
  u64 done = 0, bad = 0, taken = 2;  // taken: 2 no session opened, else whether the last one took the queue
};

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s RANKS THREADS CYCLES SEED MODES [SILENT [STOPPED [TIMEOUT_MS]]]\n", argv[0]);
    return 2;
  }
  const int R = std::atoi(argv[1]);
  const unsigned int T = static_cast<unsigned int>(std::atoi(argv[2]));
  const u64 cycles = std::strtoull(argv[3], nullptr, 10);
  const u64 seed = std::strtoull(argv[4], nullptr, 10);
  const char* modes = argv[5];
  const int silent = argc > 6 ? std::atoi(argv[6]) : -1;
  const int stopped = argc > 7 ? std::atoi(argv[7]) : -1;
  const u64 timeout_ns = (argc > 8 ? std::strtoull(argv[8], nullptr, 10) : 20000ull) * 1000000ull;
  if (static_cast<int>(std::strlen(modes)) != R) {
    std::fprintf(stderr, "MODES needs one letter a rank\n");
    return 2;
  }
  std::mt19937_64 g(seed);
  // The plan: every rank but the silent one writes 1-3 blocks of 8-32 bytes (8-byte multiples) to a random non-empty
  // set of the others, into its own slice of each target's incoming region.
  std::map<std::pair<int, int>, std::vector<Write>> plan;
  for (int o = 0; o < R; ++o) {
    if (o == silent) continue;
    bool any = false;
    for (int t = 0; t < R; ++t) {
      if (t == o || (g() % 3 == 0 && (any || t != (o + 1) % R))) continue;
      any = true;
      std::vector<Write>& w = plan[{o, t}];
      const int n = 1 + static_cast<int>(g() % 3);
      for (int j = 0; j < n; ++j)
        w.push_back({(g() % (kSources / 8 - 4)) * 8, kIncoming + o * kSlice + j * 64, (1 + g() % 4) * 8});
    }
  }
  // Staging: origin o's lines for target t at region[(o, t)] of each of t's kRmaLLDepth slots (staging_layout).
  std::map<std::pair<int, int>, u64> region;
  std::vector<u64> used(R, 0);
  for (auto& [ot, w] : plan) {
    u64 lines = 0;
    for (auto& x : w) lines += x.size / 8;
    region[ot] = used[ot.second];
    used[ot.second] += lines * 16;
  }
  const u64 most = *std::max_element(used.begin(), used.end());
  const u64 slot_bytes = std::max<u64>(128, (most + 127) / 128 * 128);
  const u64 per_rank = kWindow + 16 * R + circuslink::kRmaLLDepth * slot_bytes + 64 + 64 + sizeof(RmaQueue) + 64;
  std::vector<unsigned char> memory(per_rank * R + 64, 0);
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(memory.data()) + 63) & ~uintptr_t(63));
  unsigned int abort_word = 0;
  std::vector<Rank> ranks(R);
  for (int r = 0; r < R; ++r) {
    unsigned char* at = base + r * per_rank;
    Rank& k = ranks[r];
    k.window = at;
    std::memset(k.window, 0xA5, kWindow);
    k.signals = reinterpret_cast<u64*>(at + kWindow);
    k.staging = at + kWindow + 16 * R;
    k.state = reinterpret_cast<circuslink::RmaState*>(k.staging + circuslink::kRmaLLDepth * slot_bytes);
    k.error = reinterpret_cast<circuslink::RmaErrorRecord*>(reinterpret_cast<unsigned char*>(k.state) + 64);
    k.queue = reinterpret_cast<RmaQueue*>(reinterpret_cast<unsigned char*>(k.error) + 64);
  }
  for (int me = 0; me < R; ++me) {
    Rank& k = ranks[me];
    for (auto& [ot, w] : plan) {
      if (ot.first == me) {
        k.targets.push_back(ot.second);
        const u64 line0 = reinterpret_cast<u64>(ranks[ot.second].staging) + region[ot];
        u64 j = 0;
        for (auto& x : w)
          for (u64 b = 0; b < x.size; b += 8, ++j)
            k.words.push_back({reinterpret_cast<u64>(k.window) + x.src + b, line0 + 16 * j});
      }
      if (ot.second == me) {
        k.origins.push_back(ot.first);
        const u64 line0 = reinterpret_cast<u64>(k.staging) + region[ot];
        u64 j = 0;
        for (auto& x : w)
          for (u64 b = 0; b < x.size; b += 8, ++j)
            k.lines.push_back({line0 + 16 * j, reinterpret_cast<u64>(k.window) + x.dst + b, static_cast<u64>(ot.first), 0});
      }
    }
    for (u64 t : k.targets) k.arrival_at_target.push_back(reinterpret_cast<u64>(ranks[t].signals + me));
    for (u64 o : k.origins) k.post_at_origin.push_back(reinterpret_cast<u64>(ranks[o].signals + R + me));
    RmaQueue q{};
    q.signals = k.signals;
    q.size = static_cast<u64>(R);
    q.targets = k.targets.data();
    q.arrival_at_target = reinterpret_cast<u64* const*>(k.arrival_at_target.data());
    q.n_targets = k.targets.size();
    q.origins = k.origins.data();
    q.post_at_origin = reinterpret_cast<u64* const*>(k.post_at_origin.data());
    q.n_origins = k.origins.size();
    q.state = k.state;
    q.error = k.error;
    q.timeout_ns = timeout_ns;
    q.abort = &abort_word;
    q.flags = circuslink::kRmaGpuScope | circuslink::kRmaLowLatency;
    q.words = k.words.empty() ? nullptr : k.words.data();
    q.n_words = k.words.size();
    q.word_bytes = 8;
    q.lines = k.lines.empty() ? nullptr : k.lines.data();
    q.n_lines = k.lines.size();
    q.ll_slot_bytes = slot_bytes;
    q.ll_base = 0;
    *k.queue = q;
    k.handle = RmaHandle{k.queue, q};
  }

  blockDim = Dim3{T, 1, 1};
  std::vector<Block> blocks(R);
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    blocks[r].bar = std::make_unique<std::barrier<>>(T);
    blocks[r].failed[0] = 0;
    blocks[r].failed[1] = 0;
    blocks[r].threads = T;
    if (r == stopped) continue;
    for (unsigned int t = 0; t < T; ++t) {
      threads.emplace_back([&, r, t] {
        block = &blocks[r];
        thread_in_block = t;
        threadIdx.x = t;
        Rank& k = ranks[r];
        const char mode = modes[r];
        u64 bad = 0, done = 0;
        bool open = false;
        circuslink::RmaSession s{};
        auto session_at = [&](u64 c) {  // m: a session for the first third and the last third of the cycles
          return mode == 's' || (mode == 'm' && (3 * c < cycles || 3 * c >= 2 * cycles));
        };
        for (u64 c = 0; c < cycles; ++c) {
          const bool want = session_at(c);
          if (want && !open) {
            s = circuslink::rma_session(k.handle);
            open = true;
            if (t == 0) k.taken = s.taken ? 1 : 0;
          } else if (!want && open) {
            s.close();
            open = false;
          }
          // Ranks drift apart (a quarter of the cycles, thread 0 dawdles up to 255 us; the silent rank, which waits
          // for no one, at every cycle), so origins run ahead of their targets by the staging's depth and the
          // credits are waited for.
          if (t == 0 && (r == silent || (value(r, c, kWindow) & 3) == 0))
            std::this_thread::sleep_for(std::chrono::microseconds(value(r, c, 1)));
          for (u64 i = t; i < kSources; i += T) k.window[i] = value(r, c, i);
          const bool ok = open ? (s.start() && s.wait()) : (circuslink::rma_start(k.handle) && circuslink::rma_wait(k.handle));
          if (!ok) break;
          for (auto& [ot, w] : plan) {
            if (ot.second != r) continue;
            for (auto& x : w)
              for (u64 b = t; b < x.size; b += T) bad += k.window[x.dst + b] != value(ot.first, c, x.src + b);
          }
          __syncthreads();  // every thread has read this cycle's bytes before the next one's sources change
          ++done;
        }
        if (open) s.close();
        static std::atomic<u64> sums[64];
        sums[r].fetch_add(bad);
        if (t == 0) k.done = done;
        __syncthreads();
        if (t == 0) k.bad = sums[r].load();
      });
    }
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < R; ++r) {
    const Rank& k = ranks[r];
    auto list = [](const std::vector<u64>& v) {
      std::string out = v.empty() ? "-" : "";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
      return out;
    };
    std::printf("rank %d done %llu bad %llu taken %llu error %llu %llu %llu epoch %llu words %zu lines %zu "
                "to %s from %s\n", r, k.done, k.bad, k.taken, k.error->code, k.error->rank, k.error->epoch,
                k.state->epoch, k.words.size(), k.lines.size(), list(k.targets).c_str(), list(k.origins).c_str());
  }
  return 0;
}
