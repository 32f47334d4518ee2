// circuslink/warp_ends.cuh - one warp serving many channel ends in turn.
//
// A rank with more ends than warps it may keep resident (an all-to-all of 16 ranks on one GPU, beside the router's
// agent) lets each warp serve several: round after round it visits each of its ends with the try calls, so that no
// end waits on another end of its own warp, and makes the blocking call on an end only once it has stalled for the
// channel's time-out (the call then goes on, or times out recording the error that names the end).
//
// WarpEnds<T> keeps the end visited last open as a session (its state in registers, as a kernel that serves one
// end keeps it); a visit to another end closes that one (its state stored in its control block, where the end's
// next session finds it) and opens the new one. Every lane of the warp makes each call, with the same arguments;
// the answers are the same on every lane.
//
//   circuslink::WarpEnds<unsigned char> ends;
//   for (bool pending = true; pending;) {           // round after round
//     pending = false;
//     for (unsigned int e = first; e < count; e += stride) {      // this warp's ends
//       ... const bool moved = ends.write(tx[e], e, buf, n, stalled);   // or ends.read(rx[e], e, buf, n, stalled)
//       if (!moved && circuslink::WarpEnds<unsigned char>::failed(tx[e])) ... // a failure, not a "not now"
//     }
//   }
//   ends.close();
//
// tests/kernels/routed_user.cu and bench/kernels/hops_load.cu (bench hops --load) are complete kernels that do this.
#pragma once

#include "channel.cuh"

namespace circuslink {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename T>
struct WarpEnds {
  union {
    SendSession<T> tx;
    RecvSession<T> rx;
  };
  unsigned int end = ~0u;  // the id of the end open (~0u: none)
  bool sending = false;

  __device__ WarpEnds() {}

  // One call on the end `id` (any number the caller gives each of its ends, fixed for the kernel): with `block` the
  // blocking call, which waits up to the channel's time-out and records why it gave up; else the try call, false
  // at once with nothing moved and nothing recorded when it would wait.
  __device__ bool write(const Sender<T>& end_of, unsigned int id, const T* src, unsigned long long n, bool block) {
    if (end != id) {
      close();
      __syncwarp();  // lane 0's stored state is what every lane's session() of that end loads next time
      tx = end_of.session();
      end = id;
      sending = true;
    }
    const bool moved = block ? tx.write_warp(src, n) : tx.try_write_warp(src, n);
    __syncwarp();
    return moved;
  }
  __device__ bool read(const Receiver<T>& end_of, unsigned int id, T* dst, unsigned long long n, bool block) {
    if (end != id) {
      close();
      __syncwarp();
      rx = end_of.session();
      end = id;
      sending = false;
    }
    const bool moved = block ? rx.read_warp(dst, n) : rx.try_read_warp(dst, n);
    __syncwarp();  // every lane's part of dst is in place before any lane reads it
    return moved;
  }

  // Closes the end open, if any (its state stored; a receiver's session hands back the credits it holds).
  __device__ void close() {
    if (end == ~0u) return;
    if (sending) tx.close();
    else rx.close();
    end = ~0u;
  }

  // Whether an error is recorded on the end (a Sender<T> or a Receiver<T>): a try call's false is a "not now"
  // unless it is (lane 0's load, the same answer on every lane).
  template <typename End>
  __device__ static bool failed(const End& end_of) {
    const bool mine = detail::lane_id() == 0 && end_of.failed();
    return __shfl_sync(0xffffffffu, mine ? 1 : 0, 0) != 0;
  }

  // Lane 0's reading of the GPU's global timer (ns), handed to the whole warp, so that every lane decides alike
  // whether an end has stalled.
  __device__ static unsigned long long now_ns() {
    unsigned long long t = 0;
    if (detail::lane_id() == 0) t = detail::globaltimer_ns();
    return __shfl_sync(0xffffffffu, t, 0);
  }
};

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace circuslink
