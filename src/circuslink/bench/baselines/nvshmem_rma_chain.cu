// NVSHMEM put-with-signal chains in a ring of n PEs: the NVSHMEM baseline of `circuslink bench rma`.
//
// Built and run by circuslink.bench.baselines.nvshmem_rma_chains (_nvshmem.py has the nvcc and mpirun
// command lines; NVSHMEM_DISABLE_NVLS=1 always). Every PE writes a chain of k puts of s bytes to its right
// neighbour and, with more than 2 PEs, to its left one, the way `bench rma` declares its queues:
//   contiguous: put i from my source region j at i * 2s to the target's slot at i * 3s;
//   strided:    the same bytes as blocks of 512 B (s > 512), source stride 1024, destination stride 1536,
//               one put per block (NVSHMEM has no block-stride put of whole blocks), no packing.
// One cycle (epoch e) is the protocol of our queues posting at start, so the two do the same work:
//   post:   block 0 sets ready[me] = e on each origin (I may be written into);
//   wait for every target's ready >= e, then put the chain (nbi puts), nvshmem_fence, and signal the
//   target's arrival[me] (+1 per block of the grid: the target waits for blocks x e);
//   wait:   block 0 waits until arrival[o] >= blocks x e for every origin o.
// Forms: "thread" (one thread puts the whole chain: nvshmem_putmem_nbi, then a signal op) for chains of at
// most thread_max bytes, and "grid" (`blocks` blocks share every put: nvshmemx_putmem_nbi_block for
// contiguous pieces, nvshmemx_putmem_nbi_warp per 512-byte block for strided), each block fencing and
// signalling its own share. Launch: one kernel per sample runs a handshake cycle, then `ops` timed cycles
// (%globaltimer on block 0); a row's sample time is the slowest PE's, time_us their median per cycle,
// time_min_us the fastest. After the timed cycles every PE checks every byte it received (fresh
// pseudo-random sources per row) and the program fails if one is wrong.
//
// Output: one JSON object per line on PE 0's stdout ({"info": ...} first, then one row per
// form x layout x chain x size); errors go to stderr as "nvshmem_rma_chain: PE n: ..." and the job aborts.
//
// Arguments (key=value): pairs=K:S,K:S,... layouts=contiguous,strided forms=thread,grid iters=N warmup=N
// samples=N seed=N thread_max=BYTES blocks=N threads=N sample_bytes=BYTES

#include <cuda_runtime.h>
#include <mpi.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define BASELINE_PROGRAM "nvshmem_rma_chain"
#include "nvshmem_common.cuh"

constexpr size_t kStridedBlock = 512;  // bench rma's strided layout: blocks of 512 B, strides 2 and 3 blocks

__device__ __forceinline__ unsigned char pattern_byte(unsigned long long seed, size_t i) {
    return (unsigned char)(mix64(seed + (i >> 3)) >> (8 * (i & 7)));
}

__global__ void fill_pattern(unsigned char* buf, size_t n, unsigned long long seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        buf[i] = pattern_byte(seed, i);
}

// One chain's geometry, the same on every PE.
struct Chain {
    size_t chain;        // puts per target
    size_t nbytes;       // bytes per put
    size_t rows;         // blocks per put (1: contiguous)
    size_t row_bytes;
    size_t src_stride;   // between blocks of one put
    size_t dst_stride;
    size_t region;       // one target's source region: 2 x chain x nbytes
    size_t slot;         // one origin's destination slot: 3 x chain x nbytes
};

__host__ __device__ __forceinline__ size_t src_offset(const Chain& c, int j, size_t i) {
    return (size_t)j * c.region + i * 2 * c.nbytes;
}
__host__ __device__ __forceinline__ size_t dst_offset(const Chain& c, int slot, size_t i) {
    return (size_t)slot * c.slot + i * 3 * c.nbytes;
}

// Every received block equals the origin's source block (the pattern of the origin's seed).
__global__ void count_mismatches(const unsigned char* recv, Chain c, int slot, unsigned long long origin_seed,
                                 int origin_region, unsigned long long* bad) {
    const size_t per_put = c.rows * c.row_bytes, total = c.chain * per_put;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        const size_t i = x / per_put, r = (x % per_put) / c.row_bytes, k = x % c.row_bytes;
        const size_t s = src_offset(c, origin_region, i) + r * c.src_stride + k;
        const size_t d = dst_offset(c, slot, i) + r * c.dst_stride + k;
        if (recv[d] != pattern_byte(origin_seed, s)) atomicAdd(bad, 1ull);
    }
}

struct Ring {
    int me, n_targets, n_origins;
    int targets[2];        // right, then left (n > 2)
    int target_slot[2];    // my slot in the target: 0 from its left, 1 from its right
    int origins[2];
};

// The cycles. form 0: one thread of block 0 puts the chain; form 1: every block takes its share.
// ready[t] (set by target t): I may write epoch e into t; arrival[o] (added to by origin o's blocks).
__global__ void chain_cycles(const unsigned char* src, unsigned char* dst, Chain c, Ring ring, uint64_t* ready,
                             uint64_t* arrival, int form, long long first_epoch, long long ops, long long timed_from,
                             unsigned long long* times) {
    const bool leader = blockIdx.x == 0 && threadIdx.x == 0;
    const uint64_t blocks = form == 0 ? 1 : gridDim.x;
    for (long long e = first_epoch; e < first_epoch + ops; ++e) {
        if (leader && e == timed_from) times[0] = global_timer_ns();
        if (leader) {
            for (int o = 0; o < ring.n_origins; ++o)
                nvshmemx_signal_op(ready + ring.me, (uint64_t)e, NVSHMEM_SIGNAL_SET, ring.origins[o]);
        }
        if (threadIdx.x == 0 && (form == 1 || blockIdx.x == 0)) {
            for (int t = 0; t < ring.n_targets; ++t)
                nvshmem_signal_wait_until(ready + ring.targets[t], NVSHMEM_CMP_GE, (uint64_t)e);
        }
        __syncthreads();
        for (int t = 0; t < ring.n_targets; ++t) {
            const int pe = ring.targets[t];
            if (form == 0) {
                if (leader) {
                    for (size_t i = 0; i < c.chain; ++i) {
                        for (size_t r = 0; r < c.rows; ++r)
                            nvshmem_putmem_nbi(dst + dst_offset(c, ring.target_slot[t], i) + r * c.dst_stride,
                                               src + src_offset(c, t, i) + r * c.src_stride, c.row_bytes, pe);
                    }
                }
            } else if (c.rows == 1) {
                // Each put split in gridDim.x pieces (16-byte aligned), one per block.
                const size_t piece = ((c.nbytes + gridDim.x - 1) / gridDim.x + 15) & ~(size_t)15;
                const size_t off = blockIdx.x * piece;
                if (off < c.nbytes) {
                    const size_t len = c.nbytes - off < piece ? c.nbytes - off : piece;
                    for (size_t i = 0; i < c.chain; ++i)
                        nvshmemx_putmem_nbi_block(dst + dst_offset(c, ring.target_slot[t], i) + off,
                                                  src + src_offset(c, t, i) + off, len, pe);
                }
            } else {
                // Strided: every warp of the grid takes whole 512-byte blocks.
                const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
                const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
                for (size_t x = warp; x < c.chain * c.rows; x += warps) {
                    const size_t i = x / c.rows, r = x % c.rows;
                    nvshmemx_putmem_nbi_warp(dst + dst_offset(c, ring.target_slot[t], i) + r * c.dst_stride,
                                             src + src_offset(c, t, i) + r * c.src_stride, c.row_bytes, pe);
                }
            }
        }
        __syncthreads();
        if (threadIdx.x == 0 && (form == 1 || blockIdx.x == 0)) {
            nvshmem_fence();  // the block's puts before its signal, to every target
            for (int t = 0; t < ring.n_targets; ++t)
                nvshmemx_signal_op(arrival + ring.me, 1, NVSHMEM_SIGNAL_ADD, ring.targets[t]);
        }
        if (leader) {
            for (int o = 0; o < ring.n_origins; ++o)
                nvshmem_signal_wait_until(arrival + ring.origins[o], NVSHMEM_CMP_GE, blocks * (uint64_t)e);
        }
        __syncthreads();
    }
    if (leader) times[1] = global_timer_ns();
}

struct Options {
    std::vector<std::pair<size_t, size_t>> pairs;  // (chain, bytes)
    bool contiguous = true, strided = true, thread_form = true, grid_form = true;
    long long iters = 200, warmup = 20, samples = 10;
    unsigned long long seed = 1;
    size_t thread_max = 1 << 16;     // the thread form's largest chain (bytes per target)
    size_t sample_bytes = 256u << 20;  // a sample moves at most this much per PE (>= one cycle)
    int blocks = 0;                  // grid form: 0 = the SMs / (2 x PEs), at least 1
    int threads = 256;
};

static unsigned long long parse_number(const std::string& key, const std::string& value) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0') fail("argument %s=%s is not a number", key.c_str(), value.c_str());
    return v;
}

static std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        size_t at = s.find(sep, start);
        out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
        if (at == std::string::npos) return out;
        start = at + 1;
    }
}

static Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const auto [key, value] = key_value(argv[i]);
        if (key == "pairs") {
            for (const std::string& tok : split(value, ',')) {
                std::vector<std::string> ks = split(tok, ':');
                if (ks.size() != 2) fail("pairs: %s is not CHAIN:BYTES", tok.c_str());
                size_t k = parse_number("pairs", ks[0]), s = parse_number("pairs", ks[1]);
                if (k == 0 || s == 0) fail("pairs: %s has a zero", tok.c_str());
                o.pairs.emplace_back(k, s);
            }
        } else if (key == "layouts") {
            o.contiguous = value.find("contiguous") != std::string::npos;
            o.strided = value.find("strided") != std::string::npos;
        } else if (key == "forms") {
            o.thread_form = value.find("thread") != std::string::npos;
            o.grid_form = value.find("grid") != std::string::npos;
        } else if (key == "iters") {
            o.iters = (long long)parse_number(key, value);
        } else if (key == "warmup") {
            o.warmup = (long long)parse_number(key, value);
        } else if (key == "samples") {
            o.samples = (long long)parse_number(key, value);
        } else if (key == "seed") {
            o.seed = parse_number(key, value);
        } else if (key == "thread_max") {
            o.thread_max = (size_t)parse_number(key, value);
        } else if (key == "sample_bytes") {
            o.sample_bytes = (size_t)parse_number(key, value);
        } else if (key == "blocks") {
            o.blocks = (int)parse_number(key, value);
        } else if (key == "threads") {
            o.threads = (int)parse_number(key, value);
        } else {
            fail("unknown argument %s", key.c_str());
        }
    }
    if (o.pairs.empty()) fail("no chains given (pairs=1:8,8:8,...)");
    if (o.iters <= 0 || o.samples <= 0) fail("iters and samples must be positive");
    if (o.threads < 32 || o.threads > 1024 || o.threads % 32) fail("threads must be a multiple of 32 in 32..1024");
    return o;
}

static Chain make_chain(size_t chain, size_t nbytes, bool strided) {
    Chain c;
    c.chain = chain;
    c.nbytes = nbytes;
    if (strided && nbytes > kStridedBlock) {
        c.rows = nbytes / kStridedBlock;
        c.row_bytes = kStridedBlock;
        c.src_stride = 2 * kStridedBlock;
        c.dst_stride = 3 * kStridedBlock;
    } else {
        c.rows = 1;
        c.row_bytes = nbytes;
        c.src_stride = c.dst_stride = nbytes;
    }
    c.region = 2 * chain * nbytes;
    c.slot = 3 * chain * nbytes;
    return c;
}

int main(int argc, char** argv) {
    const Job job = start_job(&argc, &argv);
    Options o = parse(argc, argv);  // before anything else: its checks need no GPU
    if (job.size < 2) fail("needs at least 2 processes (a ring), got %d", job.size);

    const int device = job.local_rank % gpu_count();
    CHECK_CUDA(cudaSetDevice(device));
    nvshmem_init();
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    if (n != job.size) fail("NVSHMEM sees %d PEs, MPI %d", n, job.size);

    Ring ring;
    ring.me = me;
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    ring.targets[0] = right;
    ring.target_slot[0] = 0;  // the right neighbour receives me (its left) in slot 0
    ring.targets[1] = left;
    ring.target_slot[1] = 1;
    ring.n_targets = n > 2 ? 2 : 1;
    ring.origins[0] = left;
    ring.origins[1] = right;
    ring.n_origins = n > 2 ? 2 : 1;

    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    // The PEs share the GPU (MPS) or have one each; every block of every PE spins on signals, so all must be
    // resident at once: at most half of a 1/n share of the SMs, one block each (our start kernels' rule).
    int grid_blocks = o.blocks > 0 ? o.blocks : prop.multiProcessorCount / (2 * n);
    if (grid_blocks < 1) grid_blocks = 1;

    size_t biggest = 0;
    for (auto& p : o.pairs) biggest = std::max(biggest, p.first * p.second);
    const size_t src_bytes = 2 * (size_t)ring.n_targets * biggest, dst_bytes = 3 * 2 * biggest;
    unsigned char* src = (unsigned char*)nvshmem_malloc(src_bytes);
    unsigned char* dst = (unsigned char*)nvshmem_malloc(dst_bytes);
    uint64_t* ready = (uint64_t*)nvshmem_calloc(n, sizeof(uint64_t));
    uint64_t* arrival = (uint64_t*)nvshmem_calloc(n, sizeof(uint64_t));
    if (!src || !dst || !ready || !arrival) fail("nvshmem_malloc of %zu B failed (raise NVSHMEM_SYMMETRIC_SIZE)",
                                                 src_bytes + dst_bytes);
    unsigned long long *times = nullptr, *bad = nullptr;
    CHECK_CUDA(cudaMalloc(&times, 2 * sizeof(unsigned long long)));
    CHECK_CUDA(cudaMalloc(&bad, sizeof(unsigned long long)));

    if (me == 0) {
        std::printf("{\"info\": {\"nvshmem_header_version\": \"%d.%d.%d\", \"gpu\": \"%s\", \"sms\": %d, "
                    "\"npes\": %d, \"grid_blocks\": %d, \"threads\": %d, \"samples\": %lld}}\n",
                    NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION,
                    prop.name, prop.multiProcessorCount, n, grid_blocks, o.threads, o.samples);
        std::fflush(stdout);
    }

    unsigned long long case_index = 0;
    const char* layouts[2] = {"contiguous", "strided"};
    const bool want_layout[2] = {o.contiguous, o.strided};
    for (int form = 0; form < 2; ++form) {
        if ((form == 0 && !o.thread_form) || (form == 1 && !o.grid_form)) continue;
        for (int l = 0; l < 2; ++l) {
            if (!want_layout[l]) continue;
            for (auto& p : o.pairs) {
                const size_t chain = p.first, nbytes = p.second;
                if (form == 0 && chain * nbytes > o.thread_max) continue;
                const Chain c = make_chain(chain, nbytes, l == 1);
                const unsigned long long seed = o.seed + 0x1000003ull * (++case_index);
                // Every PE's kernels of the last row have finished: the counters start again at 0 (a row's
                // arrivals count blocks x epochs, and the blocks differ between forms).
                MPI_Barrier(MPI_COMM_WORLD);
                fill_pattern<<<256, 256>>>(src, src_bytes, seed + (unsigned long long)me);
                CHECK_CUDA(cudaMemset(dst, 0, dst_bytes));
                CHECK_CUDA(cudaMemset(ready, 0, n * sizeof(uint64_t)));
                CHECK_CUDA(cudaMemset(arrival, 0, n * sizeof(uint64_t)));
                CHECK_CUDA(cudaGetLastError());
                CHECK_CUDA(cudaDeviceSynchronize());
                MPI_Barrier(MPI_COMM_WORLD);
                long long epoch = 1;
                const int blocks = form == 0 ? 1 : grid_blocks;
                const size_t per_cycle = chain * nbytes * (size_t)ring.n_targets;
                long long ops = std::max(1LL, o.iters / o.samples);
                if ((size_t)ops * per_cycle > o.sample_bytes) ops = std::max<long long>(1, o.sample_bytes / per_cycle);
                auto launch = [&](long long count, long long timed_from) {
                    chain_cycles<<<blocks, o.threads>>>(src, dst, c, ring, ready, arrival, form, epoch, count,
                                                        timed_from, times);
                    CHECK_CUDA(cudaGetLastError());
                    CHECK_CUDA(cudaDeviceSynchronize());
                    epoch += count;
                };
                launch(std::min(o.warmup, ops) + 1, -1);  // warm-up and the handshake
                std::vector<double> mine;
                for (long long s = 0; s < o.samples; ++s) {
                    MPI_Barrier(MPI_COMM_WORLD);  // kernels are done: no NVSHMEM collective needed
                    launch(ops + 1, epoch + 1);  // cycle `epoch` is the handshake, untimed
                    unsigned long long t[2];
                    CHECK_CUDA(cudaMemcpy(t, times, sizeof(t), cudaMemcpyDeviceToHost));
                    mine.push_back((double)(t[1] - t[0]) / (double)ops);
                }
                // The slowest PE's time of each sample.
                std::vector<double> slowest(mine.size());
                MPI_Allreduce(mine.data(), slowest.data(), (int)mine.size(), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                // What I received from each origin equals its sources.
                CHECK_CUDA(cudaMemset(bad, 0, sizeof(unsigned long long)));
                for (int k = 0; k < ring.n_origins; ++k) {
                    const int origin = ring.origins[k];
                    const int region = k;  // origin left wrote me from its region 0 (its right), right from 1
                    count_mismatches<<<256, 256>>>(dst, c, k, seed + (unsigned long long)origin, region, bad);
                }
                CHECK_CUDA(cudaGetLastError());
                unsigned long long wrong = 0, all_wrong = 0;
                CHECK_CUDA(cudaMemcpy(&wrong, bad, sizeof(wrong), cudaMemcpyDeviceToHost));
                MPI_Allreduce(&wrong, &all_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
                if (wrong) fail("%s %s chain %zu x %zu B: %llu byte(s) received wrong", form == 0 ? "thread" : "grid",
                                layouts[l], chain, nbytes, wrong);
                if (all_wrong) fail("a peer's data check failed");
                if (me == 0) {
                    const double med = median_of(slowest);
                    const double best = *std::min_element(slowest.begin(), slowest.end());
                    const double total = (double)per_cycle;
                    std::printf("{\"impl\": \"%s\", \"layout\": \"%s\", \"chain\": %zu, \"bytes\": %zu, "
                                "\"total_bytes\": %zu, \"neighbours\": %d, \"time_us\": %.4f, \"time_min_us\": %.4f, "
                                "\"latency_us\": %.4f, \"throughput_GBps\": %.4f, \"samples\": %lld, "
                                "\"cycles_per_sample\": %lld, \"blocks\": %d, \"threads\": %d, \"verified\": true}\n",
                                form == 0 ? "nvshmem-put-signal-chain" : "nvshmem-put-signal-chain-grid", layouts[l],
                                chain, nbytes, per_cycle, ring.n_targets, med / 1e3, best / 1e3, med / 1e3,
                                med > 0 ? total / med : 0.0, o.samples, ops, blocks,
                                form == 0 ? 1 : o.threads);
                    std::fflush(stdout);
                }
            }
        }
    }

    MPI_Barrier(MPI_COMM_WORLD);
    nvshmem_free(src);
    nvshmem_free(dst);
    nvshmem_free(ready);
    nvshmem_free(arrival);
    CHECK_CUDA(cudaFree(times));
    CHECK_CUDA(cudaFree(bad));
    nvshmem_finalize();
    MPI_Finalize();
    return 0;
}
