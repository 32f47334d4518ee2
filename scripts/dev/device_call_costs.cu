// One small kernel per device call of the public headers, for the register and stack table of
// docs/user-kernels.md (scripts/dev/device_call_costs.py compiles this file with -Xptxas -v). Each kernel
// makes one call and stores its result, so that what ptxas reports is the call's own cost; "baseline" is
// a kernel that makes no call.
#include <circuslink/channel.cuh>
#include <circuslink/grid.cuh>
#include <circuslink/halo.cuh>

using circuslink::GridBarrier;
using circuslink::Receiver;
using circuslink::Sender;

extern "C" __global__ void baseline(float* x, int* ok) { x[threadIdx.x] = 2.0f * x[threadIdx.x] + (float)*ok; }

extern "C" __global__ void write_warp(Sender<float> tx, const float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = tx.write_warp(x, n);
}
extern "C" __global__ void read_warp(Receiver<float> rx, float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = rx.read_warp(x, n);
}
extern "C" __global__ void write_block(Sender<float> tx, const float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = tx.write_block(x, n);
}
extern "C" __global__ void read_block(Receiver<float> rx, float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = rx.read_block(x, n);
}
extern "C" __global__ void write_grid(Sender<float> tx, const float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = tx.write_grid(x, n);
}
extern "C" __global__ void read_grid(Receiver<float> rx, float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = rx.read_grid(x, n);
}
extern "C" __global__ void write_one(Sender<float> tx, const float* x, int* ok) { ok[threadIdx.x] = tx.write(*x); }
extern "C" __global__ void read_one(Receiver<float> rx, float* x, int* ok) { ok[threadIdx.x] = rx.read(x); }
extern "C" __global__ void session_write_warp(Sender<float> tx, const float* x, unsigned long long n, int* ok) {
  auto s = tx.session();
  ok[threadIdx.x] = s.write_warp(x, n);
  s.close();
}
extern "C" __global__ void session_read_warp(Receiver<float> rx, float* x, unsigned long long n, int* ok) {
  auto s = rx.session();
  ok[threadIdx.x] = s.read_warp(x, n);
  s.close();
}
extern "C" __global__ void try_write_warp(Sender<float> tx, const float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = tx.try_write_warp(x, n);
}
extern "C" __global__ void try_read_warp(Receiver<float> rx, float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = rx.try_read_warp(x, n);
}
extern "C" __global__ void test_one(Receiver<float> rx, unsigned long long n, int* ok) { ok[threadIdx.x] = rx.test(n); }
extern "C" __global__ void test_warp(Receiver<float> rx, unsigned long long n, int* ok) {
  ok[threadIdx.x] = rx.test_warp(n);
}
extern "C" __global__ void grid_sync(GridBarrier bar, int* ok) { ok[threadIdx.x] = circuslink::grid_sync(bar); }
extern "C" __global__ void halo_write_read_warp(circuslink::Halo<float> halo, float* x, unsigned long long n, int* ok) {
  ok[threadIdx.x] = halo.to[circuslink::kPlusX].write_warp(x, n) && halo.from[circuslink::kPlusX].read_warp(x, n);
}
extern "C" __global__ void halo_copied_ends(circuslink::Halo<float> halo, float* x, unsigned long long n, int* ok) {
  const int d = threadIdx.x / 32 % circuslink::kHaloDirections;
  const Sender<float> tx = halo.to[d];  // a copy of the end: only its 80 bytes go to the stack
  const Receiver<float> rx = halo.from[d];
  ok[threadIdx.x] = tx.write_warp(x, n) && rx.read_warp(x, n);
}
