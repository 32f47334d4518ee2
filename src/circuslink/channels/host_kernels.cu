// The channels' host API on the cuda back-end (channels/_cuda.py): Sender.write and Receiver.read
// launch one block of these, built on the same device calls users' kernels make.
#include <circuslink/channel.cuh>

extern "C" __global__ void circuslink_channel_write(circuslink::Sender<unsigned char> tx, const unsigned char* src,
                                                    unsigned long long n) {
  tx.write_block(src, n);
}
extern "C" __global__ void circuslink_channel_read(circuslink::Receiver<unsigned char> rx, unsigned char* dst,
                                                   unsigned long long n) {
  rx.read_block(dst, n);
}
