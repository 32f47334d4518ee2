// The nvshmem halo exchange's shared library (apps/qcd/_halo_cuda.py builds it with nvcc at first use and
// loads it with ctypes). Without NVSHMEM's headers on the include path it compiles to nothing, so the
// package's compile check of every .cu file passes on machines without NVSHMEM.
//
// Bootstrap by unique id (no mpirun needed): rank 0 gets the id, the world broadcasts it, every rank inits.
// A hop: qcd_nvshmem_start launches one block per face: 6 block puts (one per spin-colour component, S
// apart, as the faces lie in the send array) into the neighbour's ghost buffer of this epoch's parity,
// a fence, then the face's signal set to the epoch. qcd_nvshmem_wait launches a wait on every incoming
// face's signal. Ghost buffers alternate by epoch parity: a neighbour can only be one epoch ahead.
#if defined(__has_include)
#if __has_include(<nvshmem.h>) && __has_include(<nvshmemx.h>)
#define QCD_HAVE_NVSHMEM 1
#endif
#endif

#ifdef QCD_HAVE_NVSHMEM
#include <nvshmem.h>
#include <nvshmemx.h>

struct QcdNvshmemFace {
  unsigned long long offset;  // first face site of the slot in the (6, S) arrays
  unsigned long long count;   // face sites
  int dst;                    // PE the face goes to
  int src;                    // PE the same slot of my ghost array comes from
};

__global__ void qcd_nvshmem_put_kernel(const char* send, char* ghost, uint64_t* signals,
                                       const QcdNvshmemFace* faces, int n_faces, unsigned long long s_total,
                                       unsigned long long item, unsigned long long epoch) {
  const int f = blockIdx.x;
  if (f >= n_faces) return;
  const QcdNvshmemFace face = faces[f];
  char* dst = ghost + (epoch & 1ull) * 6ull * s_total * item;
  for (int c = 0; c < 6; ++c) {
    const unsigned long long at = (c * s_total + face.offset) * item;
    nvshmemx_putmem_block(dst + at, send + at, face.count * item, face.dst);
  }
  nvshmem_fence();
  __syncthreads();
  if (threadIdx.x == 0) nvshmemx_signal_op(signals + f, epoch, NVSHMEM_SIGNAL_SET, face.dst);
}

__global__ void qcd_nvshmem_wait_kernel(uint64_t* signals, int n_faces, unsigned long long epoch) {
  for (int f = threadIdx.x; f < n_faces; f += blockDim.x) nvshmem_signal_wait_until(signals + f, NVSHMEM_CMP_GE, epoch);
}

extern "C" {

int qcd_nvshmem_uid_size() { return (int)sizeof(nvshmemx_uniqueid_t); }

int qcd_nvshmem_get_uid(void* out) {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  const int rc = nvshmemx_get_uniqueid(&id);
  const char* from = reinterpret_cast<const char*>(&id);
  for (unsigned i = 0; i < sizeof id; ++i) static_cast<char*>(out)[i] = from[i];
  return rc;
}

int qcd_nvshmem_init(const void* uid, int rank, int npes) {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  char* to = reinterpret_cast<char*>(&id);
  for (unsigned i = 0; i < sizeof id; ++i) to[i] = static_cast<const char*>(uid)[i];
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  const int rc = nvshmemx_set_attr_uniqueid_args(rank, npes, &id, &attr);
  if (rc != 0) return rc;
  return nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
}

int qcd_nvshmem_my_pe() { return nvshmem_my_pe(); }

// Collective: a zeroed symmetric buffer.
void* qcd_nvshmem_malloc(unsigned long long nbytes) {
  void* p = nvshmem_malloc(nbytes);
  if (p != nullptr) cudaMemset(p, 0, nbytes);
  cudaDeviceSynchronize();
  nvshmem_barrier_all();
  return p;
}

void qcd_nvshmem_free(void* p) { nvshmem_free(p); }

int qcd_nvshmem_start(const void* send, void* ghost, uint64_t* signals, const void* faces, int n_faces,
                      unsigned long long s_total, unsigned long long item, unsigned long long epoch, void* stream) {
  qcd_nvshmem_put_kernel<<<n_faces, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const char*>(send), static_cast<char*>(ghost), signals, static_cast<const QcdNvshmemFace*>(faces),
      n_faces, s_total, item, epoch);
  return (int)cudaGetLastError();
}

int qcd_nvshmem_wait(uint64_t* signals, int n_faces, unsigned long long epoch, void* stream) {
  qcd_nvshmem_wait_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(signals, n_faces, epoch);
  return (int)cudaGetLastError();
}

void qcd_nvshmem_finalize() { nvshmem_finalize(); }

}  // extern "C"

#endif  // QCD_HAVE_NVSHMEM
