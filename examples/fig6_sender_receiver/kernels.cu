// CIRCUS Fig. 6 on GPUs. In CIRCUS (OpenCL on FPGAs):
//     sender:   for (i...) write_channel_intel(simple_out, data[i]);
//     receiver: for (i...) out[i] = read_channel_intel(simple_in);
// Here a warp moves the elements in order; the generated header (circuslink gen app.xml) gives
// the typed handles app::simple_out_t / app::simple_in_t.
#include "app_channels.cuh"

extern "C" __global__ void sender(app::simple_out_t simple_out, const unsigned int* data, unsigned long long n,
                                  int* ok) {
  // 1024 elements per call: each call publishes its bytes, the next call streams behind it
  for (unsigned long long i = 0; i < n; i += 1024) {
    const unsigned long long k = n - i < 1024 ? n - i : 1024;
    if (!simple_out.write_warp(data + i, k)) { if (threadIdx.x == 0) *ok = 0; return; }
  }
}

extern "C" __global__ void receiver(app::simple_in_t simple_in, unsigned int* out, unsigned long long n, int* ok) {
  for (unsigned long long i = 0; i < n; i += 1000) {  // read sizes need not match write sizes
    const unsigned long long k = n - i < 1000 ? n - i : 1000;
    if (!simple_in.read_warp(out + i, k)) { if (threadIdx.x == 0) *ok = 0; return; }
  }
}
