// NVSHMEM put-with-signal pingpong between 2 PEs: the NVSHMEM baseline of `circuslink bench pingpong`.
//
// Built and run by circuslink.bench.baselines.nvshmem_pingpong (see _nvshmem.py for the exact
// nvcc and mpirun command lines). Two modes per message size:
//   thread: one thread per PE, nvshmem_putmem_signal_nbi + nvshmem_signal_wait_until (latency);
//   block:  B blocks per PE, each puts its chunk with nvshmemx_putmem_signal_block and adds 1 to
//           the peer's signal; the receiver waits for B per round (bandwidth).
// PE 0 sends, PE 1 waits and sends the same bytes back. Rounds run back to back inside one kernel
// and PE 0 times them with %globaltimer on the device; one-way time = total / (2 * iters).
// The data is fresh pseudo-random bytes per size (seeded from the command line), checked
// byte for byte on both PEs after one verification round, before timing.
//
// Output: one JSON object per line on PE 0's stdout ({"info": ...} first, then one row per
// mode x size); errors go to stderr as "nvshmem_pingpong: PE n: ..." and the job aborts.
//
// Arguments (key=value): sizes=8,64,... iters=N warmup=N seed=N thread_max=BYTES blocks=N
// threads=N min_chunk=BYTES modes=thread,block

#include <cuda_runtime.h>
#include <mpi.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int g_pe = -1;

[[noreturn]] static void fail(const char* fmt, ...) {
    // One write per message, so the two PEs' errors do not interleave mid-line.
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "nvshmem_pingpong: PE %d: %s\n", g_pe, message);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    std::exit(2);
}

#define CHECK_CUDA(call)                                                                     \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) fail("%s failed: %s", #call, cudaGetErrorString(err_));     \
    } while (0)

__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// splitmix64: the byte at offset i is byte (i % 8) of mix(seed + i / 8).
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

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
    unsigned long long seed = 1;
    size_t thread_max = 1 << 16;
    int blocks = 0;  // 0: one per SM
    int threads = 512;
    size_t min_chunk = 1 << 16;
    bool thread_mode = true;
    bool block_mode = true;
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
        std::string arg = argv[i];
        size_t eq = arg.find('=');
        if (eq == std::string::npos) fail("argument %s is not key=value", argv[i]);
        std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
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
            o.block_mode = value.find("block") != std::string::npos;
        } else {
            fail("unknown argument %s", key.c_str());
        }
    }
    if (o.sizes.empty()) fail("no sizes given (sizes=8,64,...)");
    if (o.iters <= 0) fail("iters must be positive");
    if (o.threads <= 0 || o.threads > 1024) fail("threads must be in 1..1024");
    if (o.min_chunk == 0) fail("min_chunk must be positive");
    return o;
}

struct Buffers {
    unsigned char* send;
    unsigned char* recv;
    uint64_t* sig;
    unsigned long long* times;   // device: [start, end]
    unsigned long long* check;   // device: [mismatches, first mismatch]
};

// One mode x size: verify once, then time warmup + iters rounds. Returns the one-way time in ns (PE 0).
static double run_case(const Options& o, const Buffers& b, bool block_mode, size_t nbytes, int blocks, size_t chunk,
                       int me, int peer, unsigned long long seed) {
    const int fill_blocks = 1024, fill_threads = 256;
    if (me == 0) fill_pattern<<<fill_blocks, fill_threads>>>(b.send, nbytes, seed, 0);
    fill_pattern<<<fill_blocks, fill_threads>>>(b.recv, nbytes, seed, 0xFF);  // poisoned: every byte wrong
    CHECK_CUDA(cudaMemset(b.sig, 0, sizeof(uint64_t)));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    nvshmem_barrier_all();

    auto launch = [&](long long first_round, long long rounds, long long timed_from) {
        if (block_mode) {
            pingpong_block<<<blocks, o.threads>>>(b.send, b.recv, nbytes, chunk, b.sig, me, peer, first_round, rounds,
                                                  timed_from, b.times);
        } else {
            pingpong_thread<<<1, 1>>>(b.send, b.recv, nbytes, b.sig, me, peer, first_round, rounds, timed_from,
                                      b.times);
        }
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaDeviceSynchronize());
    };

    // Verification round: afterwards PE 1 holds PE 0's bytes and PE 0 holds them echoed back.
    launch(0, 1, -1);
    unsigned long long init[2] = {0ull, ~0ull};
    CHECK_CUDA(cudaMemcpy(b.check, init, sizeof(init), cudaMemcpyHostToDevice));
    count_mismatches<<<fill_blocks, fill_threads>>>(b.recv, nbytes, seed, b.check, b.check + 1);
    CHECK_CUDA(cudaGetLastError());
    unsigned long long result[2];
    CHECK_CUDA(cudaMemcpy(result, b.check, sizeof(result), cudaMemcpyDeviceToHost));
    unsigned long long all_bad = 0;
    MPI_Allreduce(&result[0], &all_bad, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (result[0]) {
        fail("%s mode, %zu B: %llu byte(s) wrong after one round trip, first at offset %llu",
             block_mode ? "block" : "thread", nbytes, result[0], result[1]);
    }
    if (all_bad) fail("%s mode, %zu B: the peer's data check failed", block_mode ? "block" : "thread", nbytes);
    nvshmem_barrier_all();

    launch(1, o.warmup + o.iters, 1 + o.warmup);
    unsigned long long times[2] = {0, 0};
    CHECK_CUDA(cudaMemcpy(times, b.times, sizeof(times), cudaMemcpyDeviceToHost));
    nvshmem_barrier_all();
    return me == 0 ? (double)(times[1] - times[0]) / (2.0 * (double)o.iters) : 0.0;
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int world_rank = 0, world_size = 0, local_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    g_pe = world_rank;
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
    if (world_size != 2) fail("needs exactly 2 processes (mpirun -np 2), got %d", world_size);
    Options o = parse(argc, argv);

    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    if (ndev == 0) fail("no GPU visible");
    const int device = local_rank % ndev;
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
    if (!b.send || !b.recv || !b.sig)
        fail("nvshmem_malloc of 2 x %zu B failed (raise NVSHMEM_SYMMETRIC_SIZE)", max_size);
    CHECK_CUDA(cudaMalloc(&b.times, 2 * sizeof(unsigned long long)));
    CHECK_CUDA(cudaMalloc(&b.check, 2 * sizeof(unsigned long long)));

    if (me == 0) {
        std::printf("{\"info\": {\"nvshmem_header_version\": \"%d.%d.%d\", \"gpu\": \"%s\", \"sms\": %d, "
                    "\"npes\": %d, \"iters\": %lld, \"warmup\": %lld, \"threads\": %d}}\n",
                    NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION,
                    prop.name, prop.multiProcessorCount, npes, o.iters, o.warmup, o.threads);
        std::fflush(stdout);
    }

    unsigned long long case_index = 0;
    for (int mode = 0; mode < 2; ++mode) {
        const bool block_mode = mode == 1;
        if ((block_mode && !o.block_mode) || (!block_mode && !o.thread_mode)) continue;
        for (size_t nbytes : o.sizes) {
            if (!block_mode && nbytes > o.thread_max) continue;  // one thread moving MiBs measures nothing useful
            int blocks = 1;
            size_t chunk = nbytes;
            if (block_mode) {
                size_t wanted = (nbytes + o.min_chunk - 1) / o.min_chunk;
                blocks = (int)(wanted < (size_t)max_blocks ? wanted : (size_t)max_blocks);
                if (blocks < 1) blocks = 1;
                chunk = (nbytes + blocks - 1) / blocks;
                chunk = (chunk + 15) & ~(size_t)15;  // 16-byte aligned chunks keep the copies vectorised
            }
            const unsigned long long seed = o.seed + 0x1000003ull * (++case_index);
            const double one_way_ns = run_case(o, b, block_mode, nbytes, blocks, chunk, me, peer, seed);
            if (me == 0) {
                const double us = one_way_ns / 1e3;
                std::printf("{\"impl\": \"%s\", \"mode\": \"%s\", \"bytes\": %zu, \"latency_us\": %.4f, "
                            "\"time_us\": %.4f, \"throughput_GBps\": %.4f, \"iters\": %lld, \"blocks\": %d, "
                            "\"threads\": %d, \"verified\": true}\n",
                            block_mode ? "nvshmem-put-signal-block" : "nvshmem-put-signal",
                            block_mode ? "block" : "thread", nbytes, us, us,
                            one_way_ns > 0 ? (double)nbytes / one_way_ns : 0.0, o.iters, blocks,
                            block_mode ? o.threads : 1);
                std::fflush(stdout);
            }
        }
    }

    nvshmem_barrier_all();
    nvshmem_free(b.send);
    nvshmem_free(b.recv);
    nvshmem_free(b.sig);
    CHECK_CUDA(cudaFree(b.times));
    CHECK_CUDA(cudaFree(b.check));
    nvshmem_finalize();
    MPI_Finalize();
    return 0;
}
