// What every NVSHMEM baseline program of circuslink's benchmarks (bench/baselines/*.cu) needs beside its own work:
// one-line fatal errors that name the program and the PE and end the whole job, the GPU's global timer, the
// splitmix64 hash their data patterns are made of, the MPI job and the GPU a PE takes, medians, and key=value
// arguments. A program defines BASELINE_PROGRAM (its name in messages) before including this. The programs are
// built by bench/baselines/_nvshmem.py (and bench/fft_baseline.py), whose build cache hashes this header with each.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#ifndef BASELINE_PROGRAM
#error "define BASELINE_PROGRAM (the program's name in its messages) before including nvshmem_common.cuh"
#endif

static int g_pe = -1;  // this PE, in every message (-1 before NVSHMEM is up)

// "PROGRAM: PE n: message" on stderr, written once (the PEs' errors do not interleave mid-line), then the job ends.
[[noreturn]] static void fail(const char* fmt, ...) {
  char message[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(message, sizeof(message), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, BASELINE_PROGRAM ": PE %d: %s\n", g_pe, message);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) fail("%s failed: %s", #call, cudaGetErrorString(err_));     \
  } while (0)

// Nanoseconds on the GPU's global timer: one clock for every process on the GPU.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// splitmix64's finaliser.
__host__ __device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The MPI job every program starts with (NVSHMEM_BOOTSTRAP=MPI bootstraps NVSHMEM from it): this process's rank and
// the job's size, and its rank and the ranks on its node. g_pe is its rank until NVSHMEM is up.
struct Job {
  int rank = 0, size = 0, local_rank = 0, local_size = 1;
};
static Job start_job(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  Job job;
  MPI_Comm_rank(MPI_COMM_WORLD, &job.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job.size);
  g_pe = job.rank;
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, job.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &job.local_rank);
  MPI_Comm_size(local, &job.local_size);
  MPI_Comm_free(&local);
  return job;
}

// The GPUs this process sees (none ends the job). A node's ranks take them in turn by local rank; the program
// makes its own current before nvshmem_init, which binds the PE to the current GPU.
static int gpu_count() {
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  if (n == 0) fail("no GPU visible");
  return n;
}

// The median of a program's samples.
static double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One command-line argument as (key, value); anything but key=value ends the job.
static std::pair<std::string, std::string> key_value(const char* arg) {
  const std::string text = arg;
  const size_t eq = text.find('=');
  if (eq == std::string::npos) fail("argument %s is not key=value", arg);
  return {text.substr(0, eq), text.substr(eq + 1)};
}
