// Dev experiment (not shipped): the channel's small-message pingpong in ONE process, so that Nsight Compute can
// profile it (it does not profile MPS clients). Both ends of two channels live in one allocation; rank 0's and
// rank 1's roles run as two blocks (on two SMs) or as two warps of one block (one SM).
//
//   nvcc -std=c++17 -arch=sm_90a -I src/circuslink/include -o /tmp/ll_pair scripts/dev/ll_pair.cu && /tmp/ll_pair
//   ncu --clock-control none -k lib_pair --set full --import-source no -o rep /tmp/ll_pair --once
#include <circuslink/channel.cuh>

#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>

using namespace circuslink;
using namespace circuslink::detail;
typedef unsigned long long u64;
typedef unsigned int u32;
using Tx = Sender<unsigned char>;
using Rx = Receiver<unsigned char>;

__device__ __forceinline__ u32 smid() {
  u32 s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// role = block index (2 blocks) or warp index (1 block of 64 threads)
extern "C" __global__ void lib_pair(Tx tx0, Rx rx0, Tx tx1, Rx rx1, const unsigned char* src, unsigned char* dst,
                                    u64 n, int warmup, int iters, u64* times, int* status) {
  const int role = gridDim.x > 1 ? blockIdx.x : threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) times[8 + role] = smid();
  bool ok = true;
  if (role == 0) {
    auto out = tx0.session();
    auto in = rx0.session();
    for (int it = 0; ok && it < warmup + iters; ++it) {
      if (it == warmup && threadIdx.x % 32 == 0) times[0] = globaltimer_ns();
      ok = out.write_warp(src, n) && in.read_warp(dst, n);
    }
    if (threadIdx.x % 32 == 0) times[1] = globaltimer_ns();
    out.close();
    in.close();
  } else {
    auto out = tx1.session();
    auto in = rx1.session();
    for (int it = 0; ok && it < warmup + iters; ++it) ok = in.forward_warp(out, n);
    out.close();
    in.close();
  }
  if (!ok && threadIdx.x % 32 == 0) atomicExch(status, 0);
}

// The hand-written form of the same format, fixed slot: one 16-byte unit pair a lane, lanes 0-1.
extern "C" __global__ void hw_pair(unsigned char* ring0, unsigned char* ring1, u64 base, int warmup, int iters,
                                   u64* times) {
  const int role = gridDim.x > 1 ? blockIdx.x : threadIdx.x / 32;
  const u32 lane = threadIdx.x % 32;
  unsigned char* mine = role == 0 ? ring0 : ring1;
  unsigned char* peer = role == 0 ? ring1 : ring0;
  u64 a = 0, b = 0;
  for (int it = 0; it < warmup + iters; ++it) {
    const u32 flag = (u32)(base + it) | 1u;
    if (role == 0) {
      if (it == warmup && lane == 0) times[0] = globaltimer_ns();
      if (lane < 2) st_units2(peer + 16 * lane, unit(lane, flag), unit(lane + 1, flag));
    }
    while (true) {
      if (lane < 2) ld_units2(mine + 16 * lane, a, b);
      const bool ok = lane >= 2 || (unit_flag(a) == flag && unit_flag(b) == flag);
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if (role == 1 && lane < 2) st_units2(peer + 16 * lane, unit((u32)a, flag), unit((u32)b, flag));
  }
  if (role == 0 && lane == 0) times[1] = globaltimer_ns();
}

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int main(int argc, char** argv) {
  const bool once = argc > 1 && !strcmp(argv[1], "--once");  // one launch of each form (for the profiler)
  const u32 nslots = 16, chunk = 65536, slot_bytes = kLLAreaBytes + chunk;
  const size_t ring_bytes = (size_t)nslots * slot_bytes;
  unsigned char* mem;
  const size_t total = 2 * ring_bytes + (1 << 20);
  CK(cudaMalloc(&mem, total));
  CK(cudaMemset(mem, 0, total));
  unsigned char* ctl = mem + 2 * ring_bytes;  // credits, slot credits, states, error records
  auto handle = [&](int ch, bool sender) {
    ChannelHandle h{};
    h.ring = mem + ch * ring_bytes;
    h.credit = reinterpret_cast<u64*>(ctl + 4096 * ch);
    h.slot_credit = reinterpret_cast<u32*>(ctl + 4096 * ch + 1024);
    h.state = reinterpret_cast<u64*>(ctl + 4096 * ch + 2048 + (sender ? 0 : 256));
    h.error = reinterpret_cast<u32*>(ctl + 4096 * ch + 3072 + (sender ? 0 : 256));
    h.abort = nullptr;
    h.timeout_ns = 5000000000ull;
    h.nslots = nslots;
    h.slot_bytes = slot_bytes;
    h.chunk = chunk;
    h.route = (u32)ch;
    h.ll_max = 1024;
    h.channel_id = (u32)(2 * ch + (sender ? 0 : 1));
    h.flags = kHandleGpuScope;
    return h;
  };
  // channel 0: rank 0 -> rank 1 (ping), channel 1: rank 1 -> rank 0 (pong)
  Tx tx0{handle(0, true)}, tx1{handle(1, true)};
  Rx rx1{handle(0, false)}, rx0{handle(1, false)};
  unsigned char *src, *dst;
  u64* times;
  int* status;
  CK(cudaMalloc(&src, 4096));
  CK(cudaMalloc(&dst, 4096));
  CK(cudaMalloc(&times, 16 * sizeof(u64)));
  CK(cudaMalloc(&status, sizeof(int)));
  std::vector<unsigned char> hsrc(4096);
  for (int i = 0; i < 4096; ++i) hsrc[i] = (unsigned char)(i * 37 + 11);
  CK(cudaMemcpy(src, hsrc.data(), 4096, cudaMemcpyHostToDevice));
  const int warmup = 100, iters = once ? 2000 : 2000, samples = once ? 1 : 11;
  u64 base = 1 << 20;
  for (int form = 0; form < 4; ++form) {
    const bool lib = form < 2;
    const int blocks = form % 2 == 0 ? 2 : 1, threads = blocks == 2 ? 32 : 64;
    for (u64 n : {8ull, 120ull}) {
      if (!lib && n != 8) continue;
      std::vector<double> one_way;
      u64 t[16];
      for (int s = 0; s < samples; ++s) {
        int one = 1;
        CK(cudaMemcpy(status, &one, sizeof(int), cudaMemcpyHostToDevice));
        if (lib) lib_pair<<<blocks, threads>>>(tx0, rx0, tx1, rx1, src, dst, n, warmup, iters, times, status);
        else hw_pair<<<blocks, threads>>>(mem + 2 * ring_bytes + (512 << 10), mem + 2 * ring_bytes + (768 << 10),
                                          base, warmup, iters, times);
        base += warmup + iters + 16;
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(t, times, sizeof(t), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&one, status, sizeof(int), cudaMemcpyDeviceToHost));
        if (!one) { fprintf(stderr, "form %d: a call failed\n", form); return 1; }
        one_way.push_back((double)(t[1] - t[0]) / (2.0 * iters) / 1e3);
      }
      if (lib) {
        std::vector<unsigned char> back(n);
        CK(cudaMemcpy(back.data(), dst, n, cudaMemcpyDeviceToHost));
        if (memcmp(back.data(), hsrc.data(), n)) { fprintf(stderr, "form %d: bytes differ\n", form); return 1; }
      }
      std::sort(one_way.begin(), one_way.end());
      printf("%-4s %-22s %4llu B: one-way %.3f us (min %.3f)  SMs %llu %llu\n", lib ? "lib" : "hw",
             blocks == 2 ? "two blocks" : "two warps of one block", n, one_way[one_way.size() / 2], one_way[0],
             t[8], t[9]);
    }
  }
  return 0;
}
