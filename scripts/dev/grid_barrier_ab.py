"""Dev experiment: what one grid barrier costs, by form and grid size (one process, one GPU).

Forms: `lib` (circuslink::grid_sync as shipped), `acqrel` (the same counter and generation, with
fence.acq_rel.gpu instead of the sequentially consistent __threadfence), `atom` (a release atomic arrival and
an acquire poll of the generation, no separate fence). Each kernel runs `iters` barriers back to back; the time
is the launch's over iters, the median of 10 launches. Prints a table and writes --json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp
import numpy as np

import circuslink

INC = str(Path(circuslink.__file__).resolve().parent / "include")
SRC = r'''
#include <circuslink/grid.cuh>
using u32 = unsigned int;
__device__ __forceinline__ void fence_acqrel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ u32 ld_acq(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_rel(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 atom_add_rel(u32* p, u32 v) {
  u32 o;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(o) : "l"(p), "r"(v) : "memory");
  return o;
}
__device__ __forceinline__ u32 ld_vol(const u32* p) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void bar_acqrel(u32* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 blocks = gridDim.x;
    const u32 gen = ld_vol(bar + 1);
    fence_acqrel();
    if (atomicAdd(bar, 1u) == blocks - 1) { bar[0] = 0u; fence_acqrel(); st_rel(bar + 1, gen + 1u); }
    else { while (ld_vol(bar + 1) == gen) {} }
    fence_acqrel();
  }
  __syncthreads();
}
__device__ __forceinline__ void bar_atom(u32* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 blocks = gridDim.x;
    const u32 gen = ld_vol(bar + 1);
    if (atom_add_rel(bar, 1u) == blocks - 1) { bar[0] = 0u; st_rel(bar + 1, gen + 1u); }
    else { while (ld_acq(bar + 1) == gen) {} }
  }
  __syncthreads();
}
extern "C" __global__ void k_lib(u32* bar, int iters, float* sink) {
  float x = threadIdx.x;
  for (int i = 0; i < iters; ++i) { x += 1.f; if (!circuslink::grid_sync(bar, 0ull, nullptr)) break; }
  if (x < 0) *sink = x;
}
extern "C" __global__ void k_acqrel(u32* bar, int iters, float* sink) {
  float x = threadIdx.x;
  for (int i = 0; i < iters; ++i) { x += 1.f; bar_acqrel(bar); }
  if (x < 0) *sink = x;
}
extern "C" __global__ void k_atom(u32* bar, int iters, float* sink) {
  float x = threadIdx.x;
  for (int i = 0; i < iters; ++i) { x += 1.f; bar_atom(bar); }
  if (x < 0) *sink = x;
}
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", default="1,2,4,8,16,33,66")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    mod = cp.RawModule(code=SRC, options=("-std=c++17", f"-I{INC}"))
    bar = cp.zeros(2, dtype=cp.uint32)
    sink = cp.zeros(1, dtype=cp.float32)
    rows = []
    for form in ("lib", "acqrel", "atom"):
        fn = mod.get_function(f"k_{form}")
        for b in [int(x) for x in a.blocks.split(",")]:
            fn((b,), (a.threads,), (bar, np.int32(50), sink))
            cp.cuda.runtime.deviceSynchronize()
            ts = []
            for _ in range(10):
                s, e = cp.cuda.Event(), cp.cuda.Event()
                s.record()
                fn((b,), (a.threads,), (bar, np.int32(a.iters), sink))
                e.record()
                e.synchronize()
                ts.append(cp.cuda.get_elapsed_time(s, e) * 1e3 / a.iters)
            rows.append({"form": form, "blocks": b, "threads": a.threads, "us_per_barrier": float(np.median(ts)),
                         "min_us": float(np.min(ts))})
            print(f"{form:7s} blocks {b:3d}: {np.median(ts):.3f} us a barrier (min {np.min(ts):.3f})", flush=True)
    if a.json:
        import datetime
        import os

        doc = {"benchmark": "grid-barrier-ab", "device": os.environ.get("CIRCUSLINK_DEVICE_NAME")
               or cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
               "date": datetime.date.today().isoformat(), "commit": os.environ.get("CIRCUSLINK_COMMIT", "unknown"),
               "meta": {"threads": a.threads, "iters": a.iters, "samples": 10}, "rows": rows}
        Path(a.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
