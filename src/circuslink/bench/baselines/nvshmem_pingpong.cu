// NVSHMEM put-with-signal pingpong between 2 PEs: the NVSHMEM baseline of `circuslink bench pingpong`
// and `bench stream`.
//
// Built and run by circuslink.bench.baselines.nvshmem_pingpong (see _nvshmem.py for the exact
// nvcc and mpirun command lines). Modes per message size:
//   thread: one thread per PE, nvshmem_putmem_signal_nbi + nvshmem_signal_wait_until (latency);
//   warp:   one warp per PE, nvshmemx_putmem_signal_warp;
//   block:  B blocks per PE, each puts its chunk with nvshmemx_putmem_signal_block and adds 1 to
//           the peer's signal; the receiver waits for B per round (bandwidth);
//   stream: PE 0's B blocks put `messages` messages back to back (block puts, a signal add each), PE 1
//           answers once it counted them all; throughput = messages x bytes / (start .. answer).
// PE 0 sends, PE 1 waits and sends the same bytes back. Rounds run back to back inside one kernel
// and PE 0 times them with %globaltimer on the device; one-way time = total / (2 * iters). Each mode x
// size runs `samples` such launches; the row gives the median and the fastest (one_way_us, min_one_way_us).
// Large messages run fewer rounds per launch (at most `bytes_per_sample` bytes one way, at least one).
// The data is fresh pseudo-random bytes per size (seeded from the command line), checked
// byte for byte on both PEs after one verification round, before timing.
//
// Output: one JSON object per line on PE 0's stdout ({"info": ...} first, then one row per
// mode x size); errors go to stderr as "nvshmem_pingpong: PE n: ..." and the job aborts.
//
// Arguments (key=value): sizes=8,64,... iters=N warmup=N samples=N messages=N bytes_per_sample=BYTES seed=N
// thread_max=BYTES blocks=N threads=N min_chunk=BYTES modes=thread,warp,block,stream

#include <cuda_runtime.h>
#include <mpi.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#define BASELINE_PROGRAM "nvshmem_pingpong"
#include "nvshmem_common.cuh"

// splitmix64: the byte at offset i is byte (i % 8) of mix(seed + i / 8).

__device__ __forceinline__ unsigned char pattern_byte(unsigned long long seed, size_t i) {
    return (unsigned char)(mix64(seed + (i >> 3)) >> (8 * (i & 7)));
}

__global__ void fill_pattern(unsigned char* buf, size_t n, unsigned long long seed, unsigned char xor_mask) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        buf[i] = pattern_byte(seed, i) ^ xor_mask;
}

__global__ void count_mismatches(const unsigned char* buf, size_t n, unsigned long long seed,
                                 unsigned long long* bad, unsigned long long* first_bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (buf[i] != pattern_byte(seed, i)) {
            atomicAdd(bad, 1ull);
            atomicMin(first_bad, (unsigned long long)i);
        }
    }
}

// Rounds [first_round, first_round + rounds). PE 0 records the device time at the start of round
// timed_from and after the last round into times[0], times[1].
__global__ void pingpong_thread(unsigned char* sendbuf, unsigned char* recvbuf, size_t nbytes, uint64_t* sig,
                                int me, int peer, long long first_round, long long rounds, long long timed_from,
                                unsigned long long* times) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (long long r = first_round; r < first_round + rounds; ++r) {
        if (me == 0 && r == timed_from) times[0] = global_timer_ns();
        const uint64_t target = (uint64_t)(r + 1);
        if (me == 0) {
            nvshmem_putmem_signal_nbi(recvbuf, sendbuf, nbytes, sig, target, NVSHMEM_SIGNAL_SET, peer);
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, target);
        } else {
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, target);
            // Echo what arrived; the peer writes here again only after this put's signal reached it.
            nvshmem_putmem_signal_nbi(recvbuf, recvbuf, nbytes, sig, target, NVSHMEM_SIGNAL_SET, peer);
        }
    }
    if (me == 0) times[1] = global_timer_ns();
}

// One warp per PE: the warp-collective put (lane 0 waits for the signal).
__global__ void pingpong_warp(unsigned char* sendbuf, unsigned char* recvbuf, size_t nbytes, uint64_t* sig,
                              int me, int peer, long long first_round, long long rounds, long long timed_from,
                              unsigned long long* times) {
    if (threadIdx.x >= 32 || blockIdx.x != 0) return;
    for (long long r = first_round; r < first_round + rounds; ++r) {
        if (me == 0 && r == timed_from && threadIdx.x == 0) times[0] = global_timer_ns();
        const uint64_t target = (uint64_t)(r + 1);
        if (me == 0) {
            nvshmemx_putmem_signal_warp(recvbuf, sendbuf, nbytes, sig, target, NVSHMEM_SIGNAL_SET, peer);
            if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, target);
            __syncwarp();
        } else {
            if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, target);
            __syncwarp();
            nvshmemx_putmem_signal_warp(recvbuf, recvbuf, nbytes, sig, target, NVSHMEM_SIGNAL_SET, peer);
        }
    }
    if (me == 0 && threadIdx.x == 0) times[1] = global_timer_ns();
}

// Streaming: in round r PE 0's blocks put `messages` messages (each block its chunk of each, a signal add
// per put); PE 1's block 0 waits until it counted them all, then sets PE 0's answer to r + 1. PE 0's block 0
// waits for the answer before the next round (so rounds never overlap).
__global__ void stream_block(unsigned char* sendbuf, unsigned char* recvbuf, size_t nbytes, size_t chunk,
                             long long messages, uint64_t* sig, uint64_t* answer, int me, int peer,
                             long long first_round, long long rounds, long long timed_from, unsigned long long* times) {
    const size_t offset = (size_t)blockIdx.x * chunk;
    const size_t len = offset < nbytes ? (nbytes - offset < chunk ? nbytes - offset : chunk) : 0;
    const bool leader = blockIdx.x == 0 && threadIdx.x == 0;
    for (long long r = first_round; r < first_round + rounds; ++r) {
        if (me == 0) {
            if (leader && r == timed_from) times[0] = global_timer_ns();
            for (long long m = 0; m < messages; ++m) {
                if (len) {
                    nvshmemx_putmem_signal_block(recvbuf + offset, sendbuf + offset, len, sig, 1, NVSHMEM_SIGNAL_ADD,
                                                 peer);
                } else if (threadIdx.x == 0) {
                    nvshmemx_signal_op(sig, 1, NVSHMEM_SIGNAL_ADD, peer);
                }
            }
            if (threadIdx.x == 0) nvshmem_signal_wait_until(answer, NVSHMEM_CMP_GE, (uint64_t)(r + 1));
            __syncthreads();
        } else if (leader) {
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, (uint64_t)gridDim.x * (uint64_t)messages * (uint64_t)(r + 1));
            nvshmemx_signal_op(answer, (uint64_t)(r + 1), NVSHMEM_SIGNAL_SET, peer);
        }
    }
    if (me == 0 && leader) times[1] = global_timer_ns();
}

// Every block moves one chunk; the signal counts chunks, so a round is complete at gridDim.x * (r + 1).
// All blocks must be resident at once (the host launches at most one block per SM).
__global__ void pingpong_block(unsigned char* sendbuf, unsigned char* recvbuf, size_t nbytes, size_t chunk,
                               uint64_t* sig, int me, int peer, long long first_round, long long rounds,
                               long long timed_from, unsigned long long* times) {
    const size_t offset = (size_t)blockIdx.x * chunk;
    const size_t len = offset < nbytes ? (nbytes - offset < chunk ? nbytes - offset : chunk) : 0;
    const bool timer = me == 0 && blockIdx.x == 0 && threadIdx.x == 0;
    for (long long r = first_round; r < first_round + rounds; ++r) {
        if (timer && r == timed_from) times[0] = global_timer_ns();
        const uint64_t target = (uint64_t)gridDim.x * (uint64_t)(r + 1);
        if (me == 0) {
            if (len) {
                nvshmemx_putmem_signal_block(recvbuf + offset, sendbuf + offset, len, sig, 1, NVSHMEM_SIGNAL_ADD, peer);
            } else if (threadIdx.x == 0) {
                nvshmemx_signal_op(sig, 1, NVSHMEM_SIGNAL_ADD, peer);
            }
            if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, target);
            __syncthreads();
        } else {
            if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, target);
            __syncthreads();
            if (len) {
                nvshmemx_putmem_signal_block(recvbuf + offset, recvbuf + offset, len, sig, 1, NVSHMEM_SIGNAL_ADD, peer);
            } else if (threadIdx.x == 0) {
                nvshmemx_signal_op(sig, 1, NVSHMEM_SIGNAL_ADD, peer);
            }
        }
    }
    if (timer) times[1] = global_timer_ns();
}

struct Options {
    std::vector<size_t> sizes;
    long long iters = 1000;
    long long warmup = 100;
    long long samples = 10;
    long long messages = 16;                     // stream mode: messages per round
    size_t bytes_per_sample = (size_t)1 << 30;   // one-way bytes a launch moves at most (>= one round)
    unsigned long long seed = 1;
    size_t thread_max = 1 << 16;
    int blocks = 0;  // 0: one per SM
    int threads = 512;
    size_t min_chunk = 1 << 16;
    bool thread_mode = true;
    bool warp_mode = false;
    bool block_mode = true;
    bool stream_mode = false;
};

static unsigned long long parse_number(const std::string& key, const std::string& value) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0') fail("argument %s=%s is not a number", key.c_str(), value.c_str());
    return v;
}

static Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const auto [key, value] = key_value(argv[i]);
        if (key == "sizes") {
            size_t start = 0;
            while (start <= value.size()) {
                size_t comma = value.find(',', start);
                std::string token = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                unsigned long long n = parse_number("sizes", token);
                if (n == 0) fail("sizes: 0 is not a message size");
                o.sizes.push_back((size_t)n);
                if (comma == std::string::npos) break;
                start = comma + 1;
            }
        } else if (key == "iters") {
            o.iters = (long long)parse_number(key, value);
        } else if (key == "warmup") {
            o.warmup = (long long)parse_number(key, value);
        } else if (key == "samples") {
            o.samples = (long long)parse_number(key, value);
        } else if (key == "messages") {
            o.messages = (long long)parse_number(key, value);
        } else if (key == "bytes_per_sample") {
            o.bytes_per_sample = (size_t)parse_number(key, value);
        } else if (key == "seed") {
            o.seed = parse_number(key, value);
        } else if (key == "thread_max") {
            o.thread_max = (size_t)parse_number(key, value);
        } else if (key == "blocks") {
            o.blocks = (int)parse_number(key, value);
        } else if (key == "threads") {
            o.threads = (int)parse_number(key, value);
        } else if (key == "min_chunk") {
            o.min_chunk = (size_t)parse_number(key, value);
        } else if (key == "modes") {
            o.thread_mode = value.find("thread") != std::string::npos;
            o.warp_mode = value.find("warp") != std::string::npos;
            o.block_mode = value.find("block") != std::string::npos;
            o.stream_mode = value.find("stream") != std::string::npos;
        } else {
            fail("unknown argument %s", key.c_str());
        }
    }
    if (o.sizes.empty()) fail("no sizes given (sizes=8,64,...)");
    if (o.iters <= 0) fail("iters must be positive");
    if (o.samples <= 0) fail("samples must be positive");
    if (o.messages <= 0) fail("messages must be positive");
    if (o.threads <= 0 || o.threads > 1024) fail("threads must be in 1..1024");
    if (o.min_chunk == 0) fail("min_chunk must be positive");
    return o;
}

struct Buffers {
    unsigned char* send;
    unsigned char* recv;
    uint64_t* sig;
    uint64_t* answer;
    unsigned long long* times;   // device: [start, end]
    unsigned long long* check;   // device: [mismatches, first mismatch]
};

enum Mode { kThread = 0, kWarp = 1, kBlock = 2, kStream = 3 };
static const char* const kModeNames[] = {"thread", "warp", "block", "stream"};
static const char* const kImplNames[] = {"nvshmem-put-signal", "nvshmem-put-signal-warp", "nvshmem-put-signal-block",
                                         "nvshmem-put-block-stream"};

struct Timing {
    std::vector<double> one_way_ns;  // one per sample (PE 0)
    long long rounds = 0;             // timed rounds per sample
};

// One mode x size: verify once, then `samples` launches of warmup + rounds rounds each. On PE 0 the
// per-sample one-way time (stream: the time per message) in ns.
static Timing run_case(const Options& o, const Buffers& b, Mode mode, size_t nbytes, int blocks, size_t chunk,
                       int me, int peer, unsigned long long seed) {
    const int fill_blocks = 1024, fill_threads = 256;
    if (me == 0) fill_pattern<<<fill_blocks, fill_threads>>>(b.send, nbytes, seed, 0);
    fill_pattern<<<fill_blocks, fill_threads>>>(b.recv, nbytes, seed, 0xFF);  // poisoned: every byte wrong
    CHECK_CUDA(cudaMemset(b.sig, 0, sizeof(uint64_t)));
    CHECK_CUDA(cudaMemset(b.answer, 0, sizeof(uint64_t)));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();

    const long long messages = mode == kStream ? o.messages : 1;
    long long rounds = o.iters;
    const size_t per_round = nbytes * (size_t)messages;
    // One thread or one warp moves bytes far slower than blocks do (a thread's put of 512 KiB took about 1 ms
    // on an H200): they get a smaller budget, so every size still runs in seconds.
    const size_t budget = mode == kThread ? o.bytes_per_sample / 256 : mode == kWarp ? o.bytes_per_sample / 16
                                                                                     : o.bytes_per_sample;
    if ((size_t)rounds * per_round > budget) rounds = (long long)(budget / per_round);
    if (rounds < 1) rounds = 1;
    const long long warmup = o.warmup < rounds ? o.warmup : rounds;

    auto launch = [&](long long first_round, long long count, long long timed_from) {
        switch (mode) {
            case kBlock:
                pingpong_block<<<blocks, o.threads>>>(b.send, b.recv, nbytes, chunk, b.sig, me, peer, first_round,
                                                      count, timed_from, b.times);
                break;
            case kStream:
                stream_block<<<blocks, o.threads>>>(b.send, b.recv, nbytes, chunk, messages, b.sig, b.answer, me, peer,
                                                    first_round, count, timed_from, b.times);
                break;
            case kWarp:
                pingpong_warp<<<1, 32>>>(b.send, b.recv, nbytes, b.sig, me, peer, first_round, count, timed_from,
                                         b.times);
                break;
            default:
                pingpong_thread<<<1, 1>>>(b.send, b.recv, nbytes, b.sig, me, peer, first_round, count, timed_from,
                                          b.times);
        }
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaDeviceSynchronize());
    };

    // Verification round: afterwards PE 1 holds PE 0's bytes (and, pingpong, PE 0 holds them echoed back).
    launch(0, 1, -1);
    unsigned long long init[2] = {0ull, ~0ull};
    CHECK_CUDA(cudaMemcpy(b.check, init, sizeof(init), cudaMemcpyHostToDevice));
    if (mode != kStream || me == 1) {
        count_mismatches<<<fill_blocks, fill_threads>>>(b.recv, nbytes, seed, b.check, b.check + 1);
        CHECK_CUDA(cudaGetLastError());
    }
    unsigned long long result[2];
    CHECK_CUDA(cudaMemcpy(result, b.check, sizeof(result), cudaMemcpyDeviceToHost));
    unsigned long long all_bad = 0;
    MPI_Allreduce(&result[0], &all_bad, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (result[0]) {
        fail("%s mode, %zu B: %llu byte(s) wrong after one round, first at offset %llu", kModeNames[mode], nbytes,
             result[0], result[1]);
    }
    if (all_bad) fail("%s mode, %zu B: the peer's data check failed", kModeNames[mode], nbytes);
    nvshmem_barrier_all();

    Timing t;
    t.rounds = rounds;
    long long next = 1;
    for (long long s = 0; s < o.samples; ++s) {
        launch(next, warmup + rounds, next + warmup);
        next += warmup + rounds;
        unsigned long long times[2] = {0, 0};
        CHECK_CUDA(cudaMemcpy(times, b.times, sizeof(times), cudaMemcpyDeviceToHost));
        nvshmem_barrier_all();
        if (me == 0) {
            const double per = mode == kStream ? (double)rounds * (double)messages : 2.0 * (double)rounds;
            t.one_way_ns.push_back((double)(times[1] - times[0]) / per);
        }
    }
    return t;
}

int main(int argc, char** argv) {
    const Job job = start_job(&argc, &argv);
    if (job.size != 2) fail("needs exactly 2 processes (mpirun -np 2), got %d", job.size);
    Options o = parse(argc, argv);

    const int device = job.local_rank % gpu_count();
    CHECK_CUDA(cudaSetDevice(device));  // before nvshmem_init, which binds this PE to the current GPU

    nvshmem_init();  // NVSHMEM_BOOTSTRAP=MPI: reuses the MPI job started above
    const int me = nvshmem_my_pe();
    const int npes = nvshmem_n_pes();
    if (npes != 2) fail("NVSHMEM sees %d PEs, expected 2", npes);
    const int peer = 1 - me;

    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    const int max_blocks = o.blocks > 0 ? (o.blocks < prop.multiProcessorCount ? o.blocks : prop.multiProcessorCount)
                                        : prop.multiProcessorCount;

    size_t max_size = 0;
    for (size_t s : o.sizes) max_size = s > max_size ? s : max_size;
    Buffers b;
    b.send = (unsigned char*)nvshmem_malloc(max_size);
    b.recv = (unsigned char*)nvshmem_malloc(max_size);
    b.sig = (uint64_t*)nvshmem_calloc(1, sizeof(uint64_t));
    b.answer = (uint64_t*)nvshmem_calloc(1, sizeof(uint64_t));
    if (!b.send || !b.recv || !b.sig || !b.answer)
        fail("nvshmem_malloc of 2 x %zu B failed (raise NVSHMEM_SYMMETRIC_SIZE)", max_size);
    CHECK_CUDA(cudaMalloc(&b.times, 2 * sizeof(unsigned long long)));
    CHECK_CUDA(cudaMalloc(&b.check, 2 * sizeof(unsigned long long)));

    if (me == 0) {
        std::printf("{\"info\": {\"nvshmem_header_version\": \"%d.%d.%d\", \"gpu\": \"%s\", \"sms\": %d, "
                    "\"npes\": %d, \"iters\": %lld, \"warmup\": %lld, \"threads\": %d, \"samples\": %lld}}\n",
                    NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION,
                    prop.name, prop.multiProcessorCount, npes, o.iters, o.warmup, o.threads, o.samples);
        std::fflush(stdout);
    }

    unsigned long long case_index = 0;
    const bool wanted[4] = {o.thread_mode, o.warp_mode, o.block_mode, o.stream_mode};
    for (int m = 0; m < 4; ++m) {
        if (!wanted[m]) continue;
        const Mode mode = (Mode)m;
        const bool many_blocks = mode == kBlock || mode == kStream;
        for (size_t nbytes : o.sizes) {
            if (mode == kThread && nbytes > o.thread_max) continue;
            int blocks = 1;
            size_t chunk = nbytes;
            if (many_blocks) {
                size_t wanted_blocks = (nbytes + o.min_chunk - 1) / o.min_chunk;
                blocks = (int)(wanted_blocks < (size_t)max_blocks ? wanted_blocks : (size_t)max_blocks);
                if (blocks < 1) blocks = 1;
                chunk = (nbytes + blocks - 1) / blocks;
                chunk = (chunk + 15) & ~(size_t)15;  // 16-byte aligned chunks keep the copies vectorised
            }
            const unsigned long long seed = o.seed + 0x1000003ull * (++case_index);
            const Timing t = run_case(o, b, mode, nbytes, blocks, chunk, me, peer, seed);
            if (me == 0) {
                const double med = median_of(t.one_way_ns);
                const double best = *std::min_element(t.one_way_ns.begin(), t.one_way_ns.end());
                const int threads = mode == kThread ? 1 : (mode == kWarp ? 32 : o.threads);
                std::printf("{\"impl\": \"%s\", \"mode\": \"%s\", \"bytes\": %zu, \"one_way_us\": %.4f, "
                            "\"min_one_way_us\": %.4f, \"latency_us\": %.4f, \"time_us\": %.4f, "
                            "\"throughput_GBps\": %.4f, \"max_throughput_GBps\": %.4f, \"iters\": %lld, "
                            "\"samples\": %lld, \"messages\": %lld, \"blocks\": %d, \"threads\": %d, "
                            "\"verified\": true}\n",
                            kImplNames[mode], kModeNames[mode], nbytes, med / 1e3, best / 1e3, med / 1e3, med / 1e3,
                            med > 0 ? (double)nbytes / med : 0.0, best > 0 ? (double)nbytes / best : 0.0, t.rounds,
                            o.samples, mode == kStream ? o.messages : 1, blocks, threads);
                std::fflush(stdout);
            }
        }
    }

    nvshmem_barrier_all();
    nvshmem_free(b.send);
    nvshmem_free(b.recv);
    nvshmem_free(b.sig);
    nvshmem_free(b.answer);
    CHECK_CUDA(cudaFree(b.times));
    CHECK_CUDA(cudaFree(b.check));
    nvshmem_finalize();
    MPI_Finalize();
    return 0;
}
