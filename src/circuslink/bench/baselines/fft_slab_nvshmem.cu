// The slab FFT with NVSHMEM: the NVSHMEM baseline of `circuslink bench fft` (bench/fft_baseline.py builds it
// with nvcc -rdc and runs it under mpirun; see nvshmem_build_command there for the exact command line).
//
// Complex-to-complex, forward, 2-D (n0 x n1) or 3-D (n0 x n1 x n2) over P PEs, the slabs of axis 0 cut as
// evenly as they go (uneven sizes allowed), as cuFFTMp and heFFTe do it:
//   1. cuFFT batched over my slab's local axes (1-D rows, or 2-D planes), in place;
//   2. the textbook tiled transpose (bench/kernels/fft_baseline.cu) of each destination PE's block into a
//      send buffer: for PE t, [j1 in t's axis-1 range][i2][i0 in my rows];
//   3. a put kernel per destination: one warp per row of the block, into PE t's symmetric receive buffer
//      laid out [j1][i2][i0] (direct stores through nvshmem_ptr where the PE is reachable by load/store,
//      nvshmemx_putmem_nbi_warp otherwise), then nvshmemx_barrier_all_on_stream (every put has landed);
//   4. cuFFT along axis 0, contiguous in the receive buffer, in place.
// The output is the slab of axis 1, stored with axis 0 fastest: circuslink's transposed layout.
// Steps 1-3 are cut into `chunks` along my rows: chunk j's transform and transpose (compute stream) are
// followed by its puts (comm stream), so that they overlap chunk j + 1's transform.
//
// Every iteration: restore the input, a device-side barrier (the handshake), then the timed transform; the
// phases are timed with events (transform, transpose, communication, total); the host reduces the slowest
// PE of each iteration. Before timing, a small case of each precision (uneven over the PEs) is transformed
// and every PE's output compared with a double-precision DFT on the host.
//
// Output: JSON lines on PE 0's stdout ({"info": ...} first, then one row per case and chunk count); errors
// go to stderr as "fft_slab_nvshmem: PE n: ..." and the job aborts.
// Arguments (key=value): cases=8192x8192:complex64;512x512x512:complex128 iters=N warmup=N chunks=1,4 seed=N
//
// Without NVSHMEM's or cuFFT's headers on the include path this file compiles to nothing.
#if defined(__has_include)
#if __has_include(<nvshmem.h>) && __has_include(<nvshmemx.h>) && __has_include(<cufft.h>) && __has_include(<mpi.h>)
#define FFT_HAVE_NVSHMEM 1
#endif
#endif

#ifdef FFT_HAVE_NVSHMEM
#include <cuda_runtime.h>
#include <cufft.h>
#include <mpi.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define BASELINE_PROGRAM "fft_slab_nvshmem"
#include "nvshmem_common.cuh"

#include "../kernels/fft_baseline.cu"

#define CHECK_CUFFT(call)                                                                \
  do {                                                                                   \
    cufftResult res_ = (call);                                                           \
    if (res_ != CUFFT_SUCCESS) fail("%s failed: cuFFT error %d", #call, (int)res_);      \
  } while (0)

// -- element types -----------------------------------------------------------------------------------
template <typename C>
struct Traits;
template <>
struct Traits<cufftComplex> {
  using Word = unsigned long long;
  static constexpr cufftType kType = CUFFT_C2C;
  static constexpr double kTolerance = 1e-5;
  static const char* name() { return "complex64"; }
  static cufftResult exec(cufftHandle p, cufftComplex* d) { return cufftExecC2C(p, d, d, CUFFT_FORWARD); }
};
template <>
struct Traits<cufftDoubleComplex> {
  using Word = ulonglong2;
  static constexpr cufftType kType = CUFFT_Z2Z;
  static constexpr double kTolerance = 1e-12;
  static const char* name() { return "complex128"; }
  static cufftResult exec(cufftHandle p, cufftDoubleComplex* d) { return cufftExecZ2Z(p, d, d, CUFFT_FORWARD); }
};

// -- input: a hash of the global index, the same on every PE and on the host ----------------------------
__host__ __device__ inline double unit(unsigned long long h) { return (double)(h >> 11) * 0x1.0p-52 - 1.0; }

template <typename C>
__global__ void fill_input(C* x, unsigned long long first, unsigned long long count, unsigned long long seed) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long g = first + i;
    x[i].x = unit(mix64(seed ^ (2 * g)));
    x[i].y = unit(mix64(seed ^ (2 * g + 1)));
  }
}

// -- the put: one warp per row of a block --------------------------------------------------------------
// Row r of the block (len words at send + r * len) goes to PE `pe`'s receive buffer at dst + r * n0.
template <typename W>
__global__ void put_rows(const W* __restrict__ send, W* recv, unsigned long long dst, unsigned long long rows,
                         unsigned long long len, unsigned long long n0, int pe) {
  const unsigned int lane = threadIdx.x & 31u;
  const unsigned long long warp = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) >> 5;
  const unsigned long long warps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
  W* direct = static_cast<W*>(nvshmem_ptr(recv, pe));
  for (unsigned long long r = warp; r < rows; r += warps) {
    const W* from = send + r * len;
    if (direct != nullptr) {
      W* to = direct + dst + r * n0;
      for (unsigned long long i = lane; i < len; i += 32) to[i] = from[i];
    } else {
      nvshmemx_putmem_nbi_warp(recv + dst + r * n0, from, len * sizeof(W), pe);
    }
  }
}

// -- options ------------------------------------------------------------------------------------------
struct Case {
  std::vector<long long> shape;  // 2 or 3 axes
  std::string dtype;
};

struct Options {
  std::vector<Case> cases;
  long long iters = 20, warmup = 3;
  std::vector<int> chunks{1};
  unsigned long long seed = 1;
};

static long long number(const std::string& key, const std::string& value) {
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 0) fail("argument %s=%s is not a non-negative number", key.c_str(),
                                                   value.c_str());
  return v;
}

static std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return out;
}

static Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const auto [key, value] = key_value(argv[i]);
    if (key == "cases") {
      for (const std::string& c : split(value, ';')) {
        std::vector<std::string> parts = split(c, ':');
        if (parts.size() != 2) fail("case %s is not SHAPE:DTYPE", c.c_str());
        Case cs;
        for (const std::string& n : split(parts[0], 'x')) cs.shape.push_back(number("cases", n));
        cs.dtype = parts[1];
        if (cs.shape.size() < 2 || cs.shape.size() > 3) fail("case %s: 2-D or 3-D shapes only", c.c_str());
        for (long long n : cs.shape)
          if (n < 1) fail("case %s: every axis needs a point", c.c_str());
        if (cs.dtype != "complex64" && cs.dtype != "complex128") fail("case %s: complex64 or complex128", c.c_str());
        o.cases.push_back(cs);
      }
    } else if (key == "iters") {
      o.iters = number(key, value);
    } else if (key == "warmup") {
      o.warmup = number(key, value);
    } else if (key == "chunks") {
      o.chunks.clear();
      for (const std::string& k : split(value, ',')) o.chunks.push_back((int)std::max(1LL, number(key, k)));
    } else if (key == "seed") {
      o.seed = (unsigned long long)number(key, value);
    } else {
      fail("unknown argument %s", key.c_str());
    }
  }
  if (o.cases.empty()) fail("no cases given (cases=8192x8192:complex64;...)");
  if (o.iters <= 0) fail("iters must be positive");
  return o;
}

static long long span_lo(long long n, int parts, int p) { return (long long)p * n / parts; }

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// -- one case ------------------------------------------------------------------------------------------
struct Timing {
  double total_ms = 0, total_min_ms = 0, fft_ms = 0, transpose_ms = 0, comm_ms = 0;
  int chunks = 1;
  long long samples = 0;
};

template <typename C>
class SlabFft {
 public:
  using W = typename Traits<C>::Word;
  SlabFft(const std::vector<long long>& shape, int me, int npes, int chunks, int sms, unsigned long long seed)
      : me_(me), npes_(npes), sms_(sms) {
    n0_ = shape[0];
    n1_ = shape[1];
    n2_ = shape.size() == 3 ? shape[2] : 1;
    a0_ = span_lo(n0_, npes, me);
    b0_ = span_lo(n0_, npes, me + 1) - a0_;
    for (int t = 0; t <= npes; ++t) a1_.push_back(span_lo(n1_, npes, t));
    plane_ = n1_ * n2_;
    long long most_b1 = 0;
    for (int t = 0; t < npes; ++t) most_b1 = std::max(most_b1, a1_[t + 1] - a1_[t]);
    const size_t slab = (size_t)std::max(1LL, b0_ * plane_);
    CHECK_CUDA(cudaMalloc(&data_, slab * sizeof(C)));
    CHECK_CUDA(cudaMalloc(&orig_, slab * sizeof(C)));
    CHECK_CUDA(cudaMalloc(&send_, slab * sizeof(C)));
    recv_ = static_cast<C*>(nvshmem_malloc((size_t)std::max(1LL, n0_ * most_b1 * n2_) * sizeof(C)));
    if (recv_ == nullptr) fail("nvshmem_malloc of %lld elements failed (raise NVSHMEM_SYMMETRIC_SIZE)", n0_ * most_b1 * n2_);
    if (b0_ > 0) {
      fill_input<C><<<1024, 256>>>(orig_, (unsigned long long)(a0_ * plane_), (unsigned long long)(b0_ * plane_), seed);
      CHECK_CUDA(cudaGetLastError());
    }
    CHECK_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    chunks_ = (int)std::max(1LL, std::min<long long>(chunks, std::max(1LL, b0_)));
    int all_chunks = chunks_;
    MPI_Allreduce(&chunks_, &all_chunks, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);  // the same cut everywhere
    chunks_ = all_chunks;
    for (int j = 0; j <= chunks_; ++j) cut_.push_back(span_lo(b0_, chunks_, j));
    // cuFFT: the local axes of every chunk (planes of n1 x n2, or rows of n1), and axis 0 in the receive buffer
    for (int j = 0; j < chunks_; ++j) {
      const int batch = (int)(cut_[j + 1] - cut_[j]);
      cufftHandle p = 0;
      if (batch > 0) {
        int dims[2] = {(int)n1_, (int)n2_};
        CHECK_CUFFT(cufftPlanMany(&p, n2_ > 1 ? 2 : 1, dims, nullptr, 1, 0, nullptr, 1, 0, Traits<C>::kType, batch));
        CHECK_CUFFT(cufftSetStream(p, compute_));
      }
      local_.push_back(p);
    }
    const long long my_b1 = a1_[me + 1] - a1_[me];
    if (my_b1 > 0) {
      int dims[1] = {(int)n0_};
      CHECK_CUFFT(cufftPlanMany(&last_, 1, dims, nullptr, 1, 0, nullptr, 1, 0, Traits<C>::kType, (int)(my_b1 * n2_)));
      CHECK_CUFFT(cufftSetStream(last_, compute_));
    }
    events_.resize(4 * chunks_ + 8);
    for (cudaEvent_t& e : events_) CHECK_CUDA(cudaEventCreate(&e));
    CHECK_CUDA(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming));
    CHECK_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();
  }

  ~SlabFft() {
    cudaDeviceSynchronize();
    nvshmem_barrier_all();
    for (cufftHandle p : local_)
      if (p) cufftDestroy(p);
    if (last_) cufftDestroy(last_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaEventDestroy(handoff_);
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(comm_);
    nvshmem_free(recv_);
    cudaFree(data_);
    cudaFree(orig_);
    cudaFree(send_);
  }

  // One transform (the input restored first); returns (total, fft, transpose, comm) in ms for this PE.
  std::vector<double> run() {
    if (b0_ > 0) CHECK_CUDA(cudaMemcpyAsync(data_, orig_, (size_t)(b0_ * plane_) * sizeof(C), cudaMemcpyDeviceToDevice,
                                            compute_));
    CHECK_CUDA(cudaStreamSynchronize(compute_));
    nvshmemx_barrier_all_on_stream(comm_);  // the device-side handshake before the clock
    CHECK_CUDA(cudaEventRecord(handoff_, comm_));
    CHECK_CUDA(cudaStreamWaitEvent(compute_, handoff_, 0));
    cudaEvent_t* ev = events_.data();
    CHECK_CUDA(cudaEventRecord(ev[0], compute_));  // start
    long long sent = 0;
    for (int j = 0; j < chunks_; ++j) {
      const long long r0 = cut_[j], rows = cut_[j + 1] - cut_[j];
      CHECK_CUDA(cudaEventRecord(ev[8 + 4 * j], compute_));
      if (rows > 0) CHECK_CUFFT(Traits<C>::exec(local_[j], data_ + r0 * plane_));
      CHECK_CUDA(cudaEventRecord(ev[9 + 4 * j], compute_));
      std::vector<long long> offsets;
      for (int t = 0; t < npes_; ++t) {  // the transposed block of PE t: (b1_t * n2) rows of my chunk's rows
        const long long cols = (a1_[t + 1] - a1_[t]) * n2_;
        offsets.push_back(sent);
        if (rows > 0 && cols > 0) {
          const unsigned long long tiles = (unsigned long long)((rows + 31) / 32) * ((cols + 31) / 32);
          const unsigned int grid = (unsigned int)std::min<unsigned long long>(tiles, 8ull * sms_);
          transpose(send_ + sent, (unsigned long long)rows, data_ + r0 * plane_ + a1_[t] * n2_,
                    (unsigned long long)plane_, (unsigned long long)rows, (unsigned long long)cols, grid);
        }
        sent += rows * cols;
      }
      CHECK_CUDA(cudaEventRecord(ev[10 + 4 * j], compute_));
      CHECK_CUDA(cudaStreamWaitEvent(comm_, ev[10 + 4 * j], 0));
      if (j == 0) CHECK_CUDA(cudaEventRecord(ev[1], comm_));  // communication starts
      for (int t = 0; t < npes_; ++t) {
        const long long cols = (a1_[t + 1] - a1_[t]) * n2_;
        if (rows == 0 || cols == 0) continue;
        const unsigned long long warps_wanted = (unsigned long long)cols;
        const unsigned int grid = (unsigned int)std::min<unsigned long long>((warps_wanted + 7) / 8, 4ull * sms_);
        put_rows<W><<<grid, 256, 0, comm_>>>(reinterpret_cast<const W*>(send_ + offsets[t]),
                                               reinterpret_cast<W*>(recv_), (unsigned long long)(a0_ + r0),
                                               (unsigned long long)cols, (unsigned long long)rows,
                                               (unsigned long long)n0_, t);
        CHECK_CUDA(cudaGetLastError());
      }
    }
    nvshmemx_barrier_all_on_stream(comm_);  // every PE's puts into me have landed
    CHECK_CUDA(cudaEventRecord(ev[2], comm_));  // communication ends
    CHECK_CUDA(cudaStreamWaitEvent(compute_, ev[2], 0));
    CHECK_CUDA(cudaEventRecord(ev[3], compute_));
    if (last_) CHECK_CUFFT(Traits<C>::exec(last_, recv_));
    CHECK_CUDA(cudaEventRecord(ev[4], compute_));  // end
    CHECK_CUDA(cudaEventSynchronize(ev[4]));
    float ms = 0;
    std::vector<double> out(4, 0.0);
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[4]));
    out[0] = ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[3], ev[4]));
    out[1] = ms;
    for (int j = 0; j < chunks_; ++j) {
      CHECK_CUDA(cudaEventElapsedTime(&ms, ev[8 + 4 * j], ev[9 + 4 * j]));
      out[1] += ms;
      CHECK_CUDA(cudaEventElapsedTime(&ms, ev[9 + 4 * j], ev[10 + 4 * j]));
      out[2] += ms;
    }
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[1], ev[2]));
    out[3] = ms;
    return out;
  }

  // Max |got - want| / max |want| of my output against a double-precision DFT of the whole input (small cases).
  double check(unsigned long long seed) {
    const long long n = n0_ * plane_;
    std::vector<std::complex<double>> y(n);
    for (long long g = 0; g < n; ++g)
      y[g] = {unit(mix64(seed ^ (2 * (unsigned long long)g))), unit(mix64(seed ^ (2 * (unsigned long long)g + 1)))};
    // a 1-D DFT along each axis in turn (separable), in double precision
    const long long dims[3] = {n0_, n1_, n2_}, strides[3] = {plane_, n2_, 1};
    std::vector<std::complex<double>> line;
    for (int axis = 0; axis < 3; ++axis) {
      const long long len = dims[axis], stride = strides[axis];
      if (len == 1) continue;
      line.assign(len, 0);
      for (long long base = 0; base < n; ++base) {
        if ((base / stride) % len != 0) continue;  // the first element of each line
        for (long long k = 0; k < len; ++k) {
          std::complex<double> s = 0;
          for (long long i = 0; i < len; ++i) {
            const double phase = -2.0 * M_PI * (double)((k * i) % len) / (double)len;
            s += y[base + i * stride] * std::complex<double>(std::cos(phase), std::sin(phase));
          }
          line[k] = s;
        }
        for (long long k = 0; k < len; ++k) y[base + k * stride] = line[k];
      }
    }
    double scale = 0;
    for (const auto& v : y) scale = std::max(scale, std::abs(v));
    const long long b1 = a1_[me_ + 1] - a1_[me_];
    std::vector<C> got((size_t)std::max(1LL, n0_ * b1 * n2_));
    if (b1 > 0) CHECK_CUDA(cudaMemcpy(got.data(), recv_, (size_t)(n0_ * b1 * n2_) * sizeof(C), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (long long j1 = 0; j1 < b1; ++j1)
      for (long long i2 = 0; i2 < n2_; ++i2)
        for (long long i0 = 0; i0 < n0_; ++i0) {
          const C& v = got[(size_t)((j1 * n2_ + i2) * n0_ + i0)];
          const std::complex<double> want = y[i0 * plane_ + (a1_[me_] + j1) * n2_ + i2];
          worst = std::max(worst, std::abs(std::complex<double>(v.x, v.y) - want));
        }
    return worst / std::max(scale, 1e-300);
  }

  int chunks() const { return chunks_; }

 private:
  void transpose(C* dst, unsigned long long dst_ld, const C* src, unsigned long long src_ld, unsigned long long rows,
                 unsigned long long cols, unsigned int grid) {
    dim3 threads(FFT_TILE, FFT_ROWS_PER_PASS);
    if (sizeof(C) == 8) {
      fft_transpose8<<<grid, threads, 0, compute_>>>(reinterpret_cast<unsigned long long*>(dst), dst_ld,
                                                     reinterpret_cast<const unsigned long long*>(src), src_ld, rows,
                                                     cols);
    } else {
      fft_transpose16<<<grid, threads, 0, compute_>>>(reinterpret_cast<ulonglong2*>(dst), dst_ld,
                                                      reinterpret_cast<const ulonglong2*>(src), src_ld, rows, cols);
    }
    CHECK_CUDA(cudaGetLastError());
  }

  int me_, npes_, sms_, chunks_ = 1;
  long long n0_, n1_, n2_, a0_, b0_, plane_;
  std::vector<long long> a1_, cut_;
  C *data_ = nullptr, *orig_ = nullptr, *send_ = nullptr, *recv_ = nullptr;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  std::vector<cufftHandle> local_;
  cufftHandle last_ = 0;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t handoff_ = nullptr;
};

template <typename C>
static Timing time_case(const Case& c, const Options& o, int chunks, int me, int npes, int sms) {
  SlabFft<C> fft(c.shape, me, npes, chunks, sms, o.seed);
  std::vector<double> totals, ffts, transposes, comms;
  for (long long i = 0; i < o.warmup + o.iters; ++i) {
    std::vector<double> t = fft.run();
    double slowest = 0;
    MPI_Allreduce(&t[0], &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i < o.warmup) continue;
    totals.push_back(slowest);
    ffts.push_back(t[1]);
    transposes.push_back(t[2]);
    comms.push_back(t[3]);
  }
  Timing r;
  r.total_ms = median(totals);
  r.total_min_ms = *std::min_element(totals.begin(), totals.end());
  double mine[3] = {median(ffts), median(transposes), median(comms)}, worst[3];
  MPI_Allreduce(mine, worst, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  r.fft_ms = worst[0];
  r.transpose_ms = worst[1];
  r.comm_ms = worst[2];
  r.chunks = fft.chunks();
  r.samples = (long long)totals.size();
  return r;
}

template <typename C>
static double self_check(const Options& o, int me, int npes, int sms, int ndim, int chunks) {
  // Small and uneven over the PEs: the same code paths as the timed cases.
  std::vector<long long> shape = ndim == 2 ? std::vector<long long>{3 * npes + 5, 2 * npes + 3}
                                           : std::vector<long long>{2 * npes + 3, npes + 2, 6};
  SlabFft<C> fft(shape, me, npes, chunks, sms, o.seed ^ 0xC0FFEEull);
  fft.run();
  const double err = fft.check(o.seed ^ 0xC0FFEEull);
  double worst = 0;
  MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (!(worst <= Traits<C>::kTolerance))
    fail("self-check of a %lld-point %s FFT with %d chunk(s): relative error %.3g above %g", (long long)shape[0],
         Traits<C>::name(), chunks, worst, Traits<C>::kTolerance);
  return worst;
}

int main(int argc, char** argv) {
  const Job job = start_job(&argc, &argv);
  Options o = parse(argc, argv);
  const int device = job.local_rank % gpu_count();
  CHECK_CUDA(cudaSetDevice(device));  // before nvshmem_init, which binds this PE to the current GPU
  nvshmem_init();  // NVSHMEM_BOOTSTRAP=MPI: reuses the MPI job started above
  const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  if (me == 0) {
    std::printf("{\"info\": {\"nvshmem_header_version\": \"%d.%d.%d\", \"gpu\": \"%s\", \"sms\": %d, \"npes\": %d}}\n",
                NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION, prop.name,
                prop.multiProcessorCount, npes);
    std::fflush(stdout);
  }
  const int sms = prop.multiProcessorCount;
  const int most_chunks = *std::max_element(o.chunks.begin(), o.chunks.end());
  double err64 = -1, err128 = -1;
  for (const Case& c : o.cases) {
    const int ndim = (int)c.shape.size();
    double& err = c.dtype == "complex64" ? err64 : err128;
    if (err < 0) {
      err = c.dtype == "complex64" ? self_check<cufftComplex>(o, me, npes, sms, ndim, most_chunks)
                                   : self_check<cufftDoubleComplex>(o, me, npes, sms, ndim, most_chunks);
    }
    for (int chunks : o.chunks) {
      Timing t = c.dtype == "complex64" ? time_case<cufftComplex>(c, o, chunks, me, npes, sms)
                                        : time_case<cufftDoubleComplex>(c, o, chunks, me, npes, sms);
      if (me == 0) {
        long long points = 1;
        std::string shape;
        for (size_t a = 0; a < c.shape.size(); ++a) {
          points *= c.shape[a];
          shape += (a ? "," : "") + std::to_string(c.shape[a]);
        }
        const size_t bytes = (size_t)points * (c.dtype == "complex64" ? 8 : 16);
        std::printf("{\"impl\": \"baseline-nvshmem\", \"shape\": [%s], \"dtype\": \"%s\", \"bytes\": %zu, "
                    "\"time_ms\": %.5f, \"time_min_ms\": %.5f, \"fft_ms\": %.5f, \"transpose_ms\": %.5f, "
                    "\"comm_ms\": %.5f, \"chunks\": %d, \"samples\": %lld, \"verified\": true, "
                    "\"max_rel_err\": %.3g}\n",
                    shape.c_str(), c.dtype.c_str(), bytes, t.total_ms, t.total_min_ms, t.fft_ms, t.transpose_ms,
                    t.comm_ms, t.chunks, t.samples, err);
        std::fflush(stdout);
      }
    }
  }
  nvshmem_finalize();
  MPI_Finalize();
  return 0;
}

#endif  // FFT_HAVE_NVSHMEM
