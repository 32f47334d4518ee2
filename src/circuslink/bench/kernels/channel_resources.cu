// One kernel per channel call form, each doing nothing but that call: their registers, shared and local
// memory are what the channel machinery takes from a user's kernel (circuslink bench resources; CIRCUS
// reported the FPGA area of its channels the same way).
#include <circuslink/channel.cuh>

using Tx = circuslink::Sender<unsigned char>;
using Rx = circuslink::Receiver<unsigned char>;
typedef unsigned long long u64;

extern "C" __global__ void res_write_warp(Tx tx, const unsigned char* s, u64 n) { tx.write_warp(s, n); }
extern "C" __global__ void res_read_warp(Rx rx, unsigned char* d, u64 n) { rx.read_warp(d, n); }
extern "C" __global__ void res_session_write_warp(Tx tx, const unsigned char* s, u64 n) {
  auto o = tx.session();
  o.write_warp(s, n);
  o.close();
}
extern "C" __global__ void res_session_read_warp(Rx rx, unsigned char* d, u64 n) {
  auto i = rx.session();
  i.read_warp(d, n);
  i.close();
}
extern "C" __global__ void res_write_block(Tx tx, const unsigned char* s, u64 n) { tx.write_block(s, n); }
extern "C" __global__ void res_read_block(Rx rx, unsigned char* d, u64 n) { rx.read_block(d, n); }
extern "C" __global__ void res_write_grid(Tx tx, const unsigned char* s, u64 n) { tx.write_grid(s, n); }
extern "C" __global__ void res_read_grid(Rx rx, unsigned char* d, u64 n) { rx.read_grid(d, n); }
extern "C" __global__ void res_forward_warp(Rx rx, Tx tx, u64 n) {
  auto i = rx.session();
  auto o = tx.session();
  i.forward_warp(o, n);
  i.close();
  o.close();
}
extern "C" __global__ void res_forward_grid(Rx rx, Tx tx, u64 n) { rx.forward_grid(tx, n); }
extern "C" __global__ void res_write_thread(Tx tx, const unsigned char* s) { tx.write(s[0]); }
extern "C" __global__ void res_read_thread(Rx rx, unsigned char* d) { rx.read(d); }
