// The non-blocking channel calls on the GPU (tests/test_channels_try_gpu.py), public API only.
//
// fill   (rank 0, one warp, the reader not started): try_write_warp the messages in order until the first
//        false: the ring takes exactly the packets it has slots for, and the false moved nothing;
// drain  (rank 1, one warp): test / test_warp of what arrived and of one element more, try_read_warp each
//        message that was written (in two pieces, the second starting inside a packet), then a try_read of
//        the next message (false, nothing moved);
// after  (rank 0, one thread): tx.test() now that everything written was read;
// stream (both ranks at once, 128 threads): the remaining messages, each side only polling try_* calls:
//        message i by one warp, by the whole block or element by element by one thread (i % 3).
#include <circuslink/channel.cuh>

typedef unsigned char u8;
typedef unsigned long long u64;

namespace {
constexpr unsigned long long kSpins = 1ull << 24;  // polls before a stream call gives up (a test failure)
}

extern "C" __global__ void fill(circuslink::Sender<u8> tx, const u8* src, const u64* offsets, const u64* sizes,
                                unsigned int count, int* out) {
  const bool before = tx.test();  // nothing written: nothing to wait for
  unsigned int k = 0;
  while (k < count && tx.try_write_warp(src + offsets[k], sizes[k])) ++k;
  const bool consumed = tx.test();
  if (threadIdx.x == 0) {
    out[0] = before;
    out[1] = (int)k;
    out[2] = consumed;
    out[3] = tx.failed();
  }
}

extern "C" __global__ void drain(circuslink::Receiver<u8> rx, u8* dst, const u64* offsets, const u64* sizes,
                                 const u64* splits, unsigned int written, unsigned int count, u64 arrived, int* out) {
  const bool t_all = rx.test(arrived), t_more = rx.test(arrived + 1);
  const bool w_all = rx.test_warp(arrived), w_more = rx.test_warp(arrived + 1);
  int reads_ok = 1;
  for (unsigned int i = 0; i < written; ++i) {
    const bool a = rx.try_read_warp(dst + offsets[i], splits[i]);
    const bool b = rx.try_read_warp(dst + offsets[i] + splits[i], sizes[i] - splits[i]);
    reads_ok &= (a && b) ? 1 : 0;
  }
  const bool next = written < count ? rx.try_read_warp(dst + offsets[written], sizes[written]) : false;
  const bool t_after = rx.test(1), w_after = rx.test_warp(1);
  if (threadIdx.x == 0) {
    out[0] = t_all;
    out[1] = t_more;
    out[2] = w_all;
    out[3] = w_more;
    out[4] = reads_ok;
    out[5] = next;
    out[6] = t_after;
    out[7] = w_after;
    out[8] = rx.failed();
  }
}

extern "C" __global__ void after(circuslink::Sender<u8> tx, int* out) { out[0] = tx.test(); }

// Poll `call` until it returns true or kSpins polls passed (the same count on every thread of the group).
template <typename Call>
__device__ bool spin(Call call) {
  for (unsigned long long s = 0; s < kSpins; ++s)
    if (call()) return true;
  return false;
}

// Messages [first, count): rank 0 writes them with try_* calls, rank 1 reads them with try_* calls.
extern "C" __global__ void stream(circuslink::Sender<u8> tx, circuslink::Receiver<u8> rx, int writer, u8* buf,
                                  const u64* offsets, const u64* sizes, unsigned int first, unsigned int count,
                                  int* out) {
  int ok = 1;
  for (unsigned int i = first; i < count && ok; ++i) {
    u8* p = buf + offsets[i];
    const u64 n = sizes[i];
    bool done = true;
    switch (i % 3) {
      case 0:
        if (threadIdx.x < 32)
          done = writer ? spin([&] { return tx.try_write_warp(p, n); }) : spin([&] { return rx.try_read_warp(p, n); });
        break;
      case 1:
        done = writer ? spin([&] { return tx.try_write_block(p, n); }) : spin([&] { return rx.try_read_block(p, n); });
        break;
      default:
        if (threadIdx.x == 0)
          for (u64 b = 0; b < n && done; ++b)
            done = writer ? spin([&] { return tx.try_write(p[b]); }) : spin([&] { return rx.try_read(p + b); });
    }
    ok = __syncthreads_and(done ? 1 : 0);  // the same on every thread
  }
  if (threadIdx.x == 0) {
    out[0] = ok;
    out[1] = writer ? tx.failed() : rx.failed();
  }
}
