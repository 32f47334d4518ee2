"""Where the ranks' blocks land under MPS: which SMs, how many a rank's grid shares with the others', and
whether every block of every rank was resident at once. Run: circuslink run -n K -- python sm_placement.py

Each rank launches, right after a host barrier, a grid of B blocks of 256 threads, each holding ~100 KB of
dynamic shared memory (2 blocks an SM on Hopper) and spinning --spin-ms from its own start, recording its
%smid and start time. A block that started more than half the spin after the earliest block of any rank
waited for a slot: the grids were not resident at once. Prints one line a configuration from rank 0 and
appends it to --json.
"""

import argparse
import json
import os

import circuslink as cl

SRC = r"""
extern "C" __global__ void place(unsigned long long* out, unsigned long long spin_ns) {
  extern __shared__ volatile char hold[];
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  if (threadIdx.x == 0) { hold[0] = 1; out[2 * blockIdx.x] = smid; out[2 * blockIdx.x + 1] = t0; }
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);
}
// Compute-bound: 8 independent FMA chains a thread, `rounds` times; a block sharing its SM with another
// block of the same kind takes about twice as long as one alone.
extern "C" __global__ void work(unsigned long long* out, int rounds, float* sink) {
  extern __shared__ volatile char hold[];
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = threadIdx.x + i;
  for (int r = 0; r < rounds; ++r)
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = fmaf(a[i], 0.999f, 0.5f);
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += a[i];
  if (s == 12345.f) sink[0] = s;
  __syncthreads();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    hold[0] = 1;
    out[3 * blockIdx.x] = smid; out[3 * blockIdx.x + 1] = t0; out[3 * blockIdx.x + 2] = t1 - t0;
  }
}
"""

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", default="33,66,132")
ap.add_argument("--spin-ms", type=float, default=50.0)
ap.add_argument("--smem", type=int, default=100 * 1024)
ap.add_argument("--label", default="")
ap.add_argument("--json", default="")
ap.add_argument("--work", type=int, default=0, help="compute-bound blocks of 1024 threads, this many rounds")
a = ap.parse_args()

w = cl.init()
cp = w.xp
fn = cp.RawKernel(SRC, "place")
fn.max_dynamic_shared_size_bytes = a.smem
if a.work:
    wk = cp.RawKernel(SRC, "work")
    wk.max_dynamic_shared_size_bytes = a.smem
    sink = cp.zeros(1, dtype=cp.float32)
    for blocks in [int(x) for x in a.blocks.split(",")]:
        out = cp.zeros(3 * blocks, dtype=cp.uint64)
        wk((blocks,), (1024,), (out, cp.int32(a.work // 10), sink), shared_mem=a.smem)
        cp.cuda.Device().synchronize()
        w.barrier()
        wk((blocks,), (1024,), (out, cp.int32(a.work), sink), shared_mem=a.smem)
        cp.cuda.Device().synchronize()
        host = out.get().reshape(blocks, 3)
        every = w.allgather_object([(int(s), int(t), int(d)) for s, t, d in host])
        if w.rank == 0:
            import statistics
            row = {"label": a.label, "mode": "work", "ranks": w.size, "blocks_per_rank": blocks,
                   "share_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                   "block_us_median_per_rank": [round(statistics.median(d for _, _, d in r) / 1e3, 1) for r in every],
                   "block_us_max_per_rank": [round(max(d for _, _, d in r) / 1e3, 1) for r in every],
                   "span_us": round((max(t + d for r in every for _, t, d in r)
                                     - min(t for r in every for _, t, _ in r)) / 1e3, 1)}
            print(json.dumps(row), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    w.close()
    raise SystemExit(0)
for blocks in [int(x) for x in a.blocks.split(",")]:
    out = cp.zeros(2 * blocks, dtype=cp.uint64)
    fn((1,), (32,), (out, cp.uint64(1000)), shared_mem=a.smem)  # warm: module loaded, context up
    cp.cuda.Device().synchronize()
    w.barrier()
    fn((blocks,), (256,), (out, cp.uint64(int(a.spin_ms * 1e6))), shared_mem=a.smem)
    cp.cuda.Device().synchronize()
    host = out.get().reshape(blocks, 2)
    every = w.allgather_object([(int(s), int(t)) for s, t in host])
    if w.rank == 0:
        first = min(t for rank in every for _, t in rank)
        late_ns = a.spin_ms * 1e6 / 2
        sms = [set(s for s, _ in rank) for rank in every]
        per_sm = {}
        for rank in every:
            for s, _ in rank:
                per_sm[s] = per_sm.get(s, 0) + 1
        shared = set.intersection(*sms) if len(sms) > 1 else set()
        row = {
            "label": a.label, "ranks": w.size, "blocks_per_rank": blocks,
            "share_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            "sm_count_reported": w.backend.sm_count, "sm_budget": w.backend.sm_budget,
            "distinct_sms_per_rank": [len(s) for s in sms],
            "distinct_sms_all": len(set().union(*sms)),
            "sms_of_every_rank": len(shared),
            "max_blocks_on_one_sm": max(per_sm.values()),
            "late_blocks_per_rank": [sum(1 for _, t in rank if t - first > late_ns) for rank in every],
            "sm_ranges": [f"{min(s)}-{max(s)}" for s in sms],
        }
        print(json.dumps(row), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")
w.close()
