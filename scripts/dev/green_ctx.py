"""Dev experiment: can each rank sharing a GPU under MPS get SMs of its own through a CUDA green context?

Capped MPS clients all run on the same SMs (2026-11-29: two ranks at 50 % both on SMs 0-65), so every multi-rank
figure used half (2 ranks) or a quarter (4 ranks) of the GPU; uncapped clients spread over it but may take each
other's SMs, and the resident CG stalled that way. NVIDIA's answer for MPS with fixed SM sets is a green context
per client with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE unset or 100. This asks, per rank (run uncapped):
  * does a green context of SM group `rank` (an SM split into k groups) become current, and stay current after
    CuPy's Device.use() (cudaSetDevice)?
  * do CuPy's allocations, a module compiled after the switch, one loaded before it, the world's stream made
    before it, and a peer's IPC-mapped buffer work with it current?
  * where do the blocks run: %smid sets per rank, and compute-bound timing that tells confinement (a rank alone
    with 2 blocks a partition SM takes twice one block's time only when confined) and disjointness (all ranks at
    once with one block a partition SM take one block's time only when disjoint).
Run: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 circuslink run -n K -- python green_ctx.py --json FILE [--mode green|none]
"""

import argparse
import json
import os
import statistics
import time

import circuslink as cl

SRC = r"""
extern "C" __global__ void place(unsigned long long* out) {
  unsigned smid; asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  if (threadIdx.x == 0) out[blockIdx.x] = smid;
}
extern "C" __global__ void work(unsigned long long* out, int rounds, float* sink) {
  extern __shared__ volatile char hold[];
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned smid; asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
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
    hold[0] = 1; out[3 * blockIdx.x] = smid; out[3 * blockIdx.x + 1] = t0; out[3 * blockIdx.x + 2] = t1 - t0;
  }
}
extern "C" __global__ void poke(unsigned* peer, unsigned value) {
  if (threadIdx.x == 0) peer[blockIdx.x] = value + blockIdx.x;
}
"""

ap = argparse.ArgumentParser()
ap.add_argument("--mode", default="green", choices=["green", "none"])
ap.add_argument("--rounds", type=int, default=200000)
ap.add_argument("--smem", type=int, default=100 * 1024)
ap.add_argument("--json", default="")
a = ap.parse_args()

w = cl.init()
cp = w.xp
k, r = w.size, w.rank
row = {"mode": a.mode, "ranks": k, "rank": r, "share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
place0 = cp.RawKernel(SRC, "place")  # loaded in the primary context, before any switch
out0 = cp.zeros(8, dtype=cp.uint64)
place0((8,), (32,), (out0,))
cp.cuda.Device().synchronize()
part_sms = w.backend.sm_count // k

if a.mode == "green":
    import cuda.bindings.driver as d

    def ok(res, what):
        err = res[0]
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what}: {err}")
        return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)

    ok(d.cuInit(0), "cuInit")
    dev = ok(d.cuDeviceGet(w.backend.device), "cuDeviceGet")
    res = ok(d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM), "GetDevResource")
    row["sm_resource"] = {"count": res.sm.smCount, "min_partition": getattr(res.sm, "minSmPartitionSize", None),
                          "alignment": getattr(res.sm, "smCoscheduledAlignment", None)}
    want = part_sms // 8 * 8
    groups, n, rest = ok(d.cuDevSmResourceSplitByCount(k, res, 0, want), "SplitByCount")
    row["groups"] = [groups[i].sm.smCount for i in range(n)]
    desc = ok(d.cuDevResourceGenerateDesc([groups[r]], 1), "GenerateDesc")
    green = ok(d.cuGreenCtxCreate(desc, dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM), "GreenCtxCreate")
    ctx = ok(d.cuCtxFromGreenCtx(green), "CtxFromGreenCtx")
    ok(d.cuCtxSetCurrent(ctx), "CtxSetCurrent")
    def handle(x):
        return int(x.getPtr()) if hasattr(x, "getPtr") else int(x)

    row["current_is_green"] = handle(ok(d.cuCtxGetCurrent(), "get")) == handle(ctx)
    cp.cuda.Device(w.backend.device).use()
    row["after_device_use_is_green"] = handle(ok(d.cuCtxGetCurrent(), "get")) == handle(ctx)
    if not row["after_device_use_is_green"]:
        ok(d.cuCtxSetCurrent(ctx), "CtxSetCurrent again")
    part_sms = row["groups"][r]


def attempt(name, fn):
    try:
        row[name] = fn()
    except Exception as exc:  # an experiment: record what failed and go on
        row[name] = f"FAILED: {type(exc).__name__}: {exc}"[:300]


def smids(kernel, stream, blocks):
    out = cp.zeros(blocks, dtype=cp.uint64)
    with stream:
        kernel((blocks,), (32,), (out,))
    stream.synchronize()
    s = sorted(set(int(x) for x in out.get()))
    return {"distinct": len(s), "range": f"{s[0]}-{s[-1]}", "set": s}


fresh = cp.RawKernel(SRC.replace("place(", "place_new("), "place_new")
new_stream = cp.cuda.Stream(non_blocking=True)
attempt("alloc_copy", lambda: int((cp.arange(1000, dtype=cp.int64) * 2).sum().get()))
attempt("new_module_new_stream", lambda: smids(fresh, new_stream, 264))
attempt("old_module_new_stream", lambda: smids(place0, new_stream, 264))
attempt("world_stream", lambda: smids(fresh, w.backend.stream, 264))
attempt("null_stream", lambda: smids(fresh, cp.cuda.Stream.null, 264))


def ipc():
    buf = w.alloc(4 * 64)
    buf.local().fill(0)
    cp.cuda.Device().synchronize()
    w.barrier()
    poke = cp.RawKernel(SRC, "poke")
    peer = (r + 1) % k
    with new_stream:
        poke((64,), (32,), (cp.uint64(buf.ptr(peer)), cp.uint32(1000 * (r + 1))))
    new_stream.synchronize()
    w.barrier()
    got = buf.view(cp.uint32).get()[:64]
    src = (r - 1) % k
    return bool((got == 1000 * (src + 1) + cp.arange(64).get()).all())


attempt("ipc_peer_write", ipc)

wk = cp.RawKernel(SRC, "work")
wk.max_dynamic_shared_size_bytes = a.smem
sink = cp.zeros(1, dtype=cp.float32)


def timed(blocks, together):
    out = cp.zeros(3 * blocks, dtype=cp.uint64)
    with new_stream:
        wk((blocks,), (1024,), (out, cp.int32(a.rounds // 20), sink), shared_mem=a.smem)
    new_stream.synchronize()
    w.barrier()
    if together or r == 0:
        with new_stream:
            wk((blocks,), (1024,), (out, cp.int32(a.rounds), sink), shared_mem=a.smem)
        new_stream.synchronize()
    w.barrier()
    host = out.get().reshape(blocks, 3)
    if not (together or r == 0):
        return None
    t0 = min(int(t) for _, t, _ in host)
    return {"blocks": blocks, "block_us_median": round(statistics.median(int(x) for _, _, x in host) / 1e3, 1),
            "span_us": round((max(int(t) + int(x) for _, t, x in host) - t0) / 1e3, 1),
            "distinct_sms": len(set(int(s) for s, _, _ in host))}


attempt("alone_1_per_sm", lambda: timed(part_sms, together=False))
attempt("alone_2_per_sm", lambda: timed(2 * part_sms, together=False))
attempt("together_1_per_sm", lambda: timed(part_sms, together=True))
every = w.allgather_object(row)
if r == 0:
    sets = [set(x["new_module_new_stream"]["set"]) if isinstance(x.get("new_module_new_stream"), dict) else set()
            for x in every]
    summary = {"mode": a.mode, "ranks": k, "pairwise_shared_sms": [len(sets[i] & sets[j]) for i in range(k)
                                                                  for j in range(i + 1, k)],
               "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for x in every:
        for key in list(x):
            if isinstance(x[key], dict):
                x[key].pop("set", None)
    print(json.dumps(summary), flush=True)
    for x in every:
        print(json.dumps(x), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"summary": summary, "ranks": every}) + "\n")
w.close()
