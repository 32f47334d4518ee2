// NVSHMEM's float32 sum reductions on n PEs: the NVSHMEM baseline of `circuslink bench allreduce`.
//
// Built and run by circuslink.bench.baselines.nvshmem_allreduce (the same nvcc and mpirun lines as
// nvshmem_pingpong.cu, _nvshmem.py; -np n). Two forms per size (bytes per PE):
//   stream: nvshmemx_float_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, ...) `iters` times back to back on a
//           stream, after nvshmemx_barrier_all_on_stream; timed with CUDA events around the calls;
//   device: one block (launched with nvshmemx_collective_launch) runs nvshmemx_barrier_all_block, reads
//           %globaltimer, calls nvshmemx_float_sum_reduce_block(NVSHMEM_TEAM_WORLD, ...) `iters` times, and
//           reads %globaltimer again.
// Each form x size runs `samples` such samples; time per operation = sample time / iters on each PE, the
// slowest PE's (MPI_MAX) per sample; the row has the median and the fastest sample. Large sizes run fewer
// operations per sample (at most `bytes_per_sample` bytes, at least one). The result is checked exactly
// once per size before timing (small integers: exact float sums).
//
// Output: one JSON object per line on PE 0's stdout ({"info": ...} first, then one row per form x size);
// errors go to stderr as "nvshmem_allreduce: PE n: ..." and the job aborts.
//
// Under MPS NVSHMEM runs collectives only when every PE's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE <= 100 / n (the
// launcher sets it). Arguments (key=value): sizes=8,64,... iters=N warmup=N samples=N bytes_per_sample=BYTES
// forms=stream,device

#include <cuda_runtime.h>
#include <mpi.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define BASELINE_PROGRAM "nvshmem_allreduce"
#include "nvshmem_common.cuh"

// Element i of PE p: (i % 61) + p, an integer: every float sum over the PEs is exact.
__global__ void fill(float* x, size_t n, int pe) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (float)((i % 61) + pe);
}

__global__ void count_wrong(const float* x, size_t n, int npes, unsigned long long* bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float want = (float)(npes * (i % 61) + npes * (npes - 1) / 2);
        if (x[i] != want) atomicAdd(bad, 1ull);
    }
}

// The device form: one block; times[0], times[1] = after the barrier, after the last reduction.
__global__ void reduce_device(float* dst, const float* src, size_t n, long long iters, unsigned long long* times) {
    nvshmemx_barrier_all_block();
    if (threadIdx.x == 0) times[0] = global_timer_ns();
    for (long long i = 0; i < iters; ++i) nvshmemx_float_sum_reduce_block(NVSHMEM_TEAM_WORLD, dst, src, n);
    __syncthreads();
    if (threadIdx.x == 0) times[1] = global_timer_ns();
}

struct Options {
    std::vector<size_t> sizes;
    long long iters = 100, warmup = 5, samples = 10;
    size_t bytes_per_sample = (size_t)1 << 30;
    bool stream_form = true, device_form = true;
};

static Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const auto [key, value] = key_value(argv[i]);
        char* end = nullptr;
        if (key == "sizes") {
            size_t at = 0;
            while (at <= value.size()) {
                size_t comma = value.find(',', at);
                std::string token = value.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
                unsigned long long v = std::strtoull(token.c_str(), &end, 10);
                if (token.empty() || *end != '\0' || v == 0) fail("sizes: %s is not a positive number", token.c_str());
                o.sizes.push_back((size_t)v);
                if (comma == std::string::npos) break;
                at = comma + 1;
            }
        } else if (key == "forms") {
            o.stream_form = value.find("stream") != std::string::npos;
            o.device_form = value.find("device") != std::string::npos;
        } else {
            unsigned long long v = std::strtoull(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0') fail("argument %s=%s is not a number", key.c_str(), value.c_str());
            if (key == "iters") o.iters = (long long)v;
            else if (key == "warmup") o.warmup = (long long)v;
            else if (key == "samples") o.samples = (long long)v;
            else if (key == "bytes_per_sample") o.bytes_per_sample = (size_t)v;
            else fail("unknown argument %s", key.c_str());
        }
    }
    if (o.sizes.empty()) fail("no sizes");
    if (o.iters < 1 || o.samples < 1) fail("iters and samples must be at least 1");
    return o;
}

int main(int argc, char** argv) {
    const Job job = start_job(&argc, &argv);
    Options o = parse(argc, argv);

    CHECK_CUDA(cudaSetDevice(job.local_rank % gpu_count()));
    nvshmem_init();
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();

    size_t max_size = 8;
    for (size_t s : o.sizes) max_size = std::max(max_size, s);
    float* src = (float*)nvshmem_malloc(max_size);
    float* dst = (float*)nvshmem_malloc(max_size);
    if (!src || !dst) fail("nvshmem_malloc of 2 x %zu B failed (raise NVSHMEM_SYMMETRIC_SIZE)", max_size);
    unsigned long long *times = nullptr, *bad = nullptr;
    CHECK_CUDA(cudaMalloc(&times, 2 * sizeof(unsigned long long)));
    CHECK_CUDA(cudaMalloc(&bad, sizeof(unsigned long long)));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));

    if (me == 0) {
        std::printf("{\"info\": {\"nvshmem_header_version\": \"%d.%d.%d\", \"npes\": %d, \"iters\": %lld, "
                    "\"samples\": %lld}}\n", NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
                    NVSHMEM_VENDOR_PATCH_VERSION, npes, o.iters, o.samples);
        std::fflush(stdout);
    }
    for (int form = 0; form < 2; ++form) {
        if ((form == 0 && !o.stream_form) || (form == 1 && !o.device_form)) continue;
        const char* impl = form == 0 ? "nvshmem-reduce-stream" : "nvshmem-reduce-device";
        for (size_t bytes : o.sizes) {
            const size_t n = std::max<size_t>(1, bytes / sizeof(float));
            const long long iters = std::max<long long>(1, std::min<long long>(
                o.iters, (long long)(o.bytes_per_sample / (n * sizeof(float)))));
            fill<<<64, 256, 0, stream>>>(src, n, me);
            CHECK_CUDA(cudaMemsetAsync(bad, 0, sizeof(unsigned long long), stream));
            nvshmemx_barrier_all_on_stream(stream);
            auto run = [&](long long k) -> double {  // seconds per operation on this PE
                if (form == 0) {
                    nvshmemx_barrier_all_on_stream(stream);
                    CHECK_CUDA(cudaEventRecord(start, stream));
                    for (long long i = 0; i < k; ++i)
                        nvshmemx_float_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, dst, src, n, stream);
                    CHECK_CUDA(cudaEventRecord(stop, stream));
                    CHECK_CUDA(cudaStreamSynchronize(stream));
                    float ms = 0;
                    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
                    return ms * 1e-3 / (double)k;
                }
                void* args[] = {&dst, &src, (void*)&n, &k, &times};
                if (nvshmemx_collective_launch((const void*)reduce_device, dim3(1), dim3(256), args, 0, stream) != 0)
                    fail("nvshmemx_collective_launch failed");
                CHECK_CUDA(cudaStreamSynchronize(stream));
                unsigned long long t[2];
                CHECK_CUDA(cudaMemcpy(t, times, sizeof(t), cudaMemcpyDeviceToHost));
                return (double)(t[1] - t[0]) * 1e-9 / (double)k;
            };
            run(1);  // the check
            count_wrong<<<64, 256, 0, stream>>>(dst, n, npes, bad);
            unsigned long long wrong = 0;
            CHECK_CUDA(cudaMemcpyAsync(&wrong, bad, sizeof(wrong), cudaMemcpyDeviceToHost, stream));
            CHECK_CUDA(cudaStreamSynchronize(stream));
            if (wrong) fail("%s of %zu B: %llu elements wrong", impl, n * sizeof(float), wrong);
            if (o.warmup) run(std::min(o.warmup, iters));
            std::vector<double> per;
            for (long long s = 0; s < o.samples; ++s) {
                double mine = run(iters), slowest = 0;
                MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                per.push_back(slowest);
            }
            std::sort(per.begin(), per.end());
            const double median = per.size() % 2 ? per[per.size() / 2] : 0.5 * (per[per.size() / 2 - 1] + per[per.size() / 2]);
            if (me == 0) {
                const double algbw = (double)(n * sizeof(float)) / median / 1e9;
                std::printf("{\"impl\": \"%s\", \"bytes\": %zu, \"count\": %zu, \"nranks\": %d, \"time_us\": %.4f, "
                            "\"min_time_us\": %.4f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"iters\": %lld, "
                            "\"samples\": %lld, \"verified\": true}\n", impl, n * sizeof(float), n, npes,
                            median * 1e6, per[0] * 1e6, algbw, algbw * 2.0 * (npes - 1) / npes, iters, o.samples);
                std::fflush(stdout);
            }
        }
    }
    nvshmem_free(src);
    nvshmem_free(dst);
    nvshmem_finalize();
    MPI_Finalize();
    return 0;
}
