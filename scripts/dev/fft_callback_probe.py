"""Dev experiment (one process, one GPU): can the reshape of a 2-D slab FFT ride in cuFFT's own loads?

The slab pipeline is memory-bound on one GPU: at 16384^2 complex128 each rank's stage of transforms reads and
writes its slab twice (cuFFT takes two passes for 16384 double points) and the transposing put moves it once more.
This times, for a 4-rank split of --size^2 --dtype in one process: (rows) the first stage's batched row
transforms of one slab; (strided) the second stage on one rank's columns as a strided transform (istride = the
batch, idist 1) of a gathered array; (pull) the same with a cuFFT JIT-LTO load callback that reads every element
from the four slabs where the first stage left them (no reshape pass); and checks pull against strided.
Prints ms per transform (best and median of --reps event-timed runs) and the callback plan's creation time.
"""
from __future__ import annotations

import argparse
import statistics
import time

import cupy as cp
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, default=16384)
ap.add_argument("--dtype", default="complex128")
ap.add_argument("--reps", type=int, default=10)
args = ap.parse_args()
N, R = args.size, 4
S = N // R
dt = np.dtype(args.dtype)


def timed(fn):
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(args.reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return min(ts), statistics.median(ts)


def show(name, fn):
    best, med = timed(fn)
    print(f"{name:8s} best {best:.3f} median {med:.3f} ms", flush=True)


rng = cp.random.default_rng(1)
slabs = [(rng.standard_normal((S, N)) + 1j * rng.standard_normal((S, N))).astype(dt) for _ in range(R)]
print(f"{N}^2 {dt}, {R} slabs of {S}x{N} ({slabs[0].nbytes / 2**30:.2f} GiB each)", flush=True)

rows = slabs[0].copy()
show("rows", lambda: cp.fft.fft(rows, axis=-1))

t = 1  # rank t's columns t*S..(t+1)*S of every slab, stacked: (N, S), transformed along axis 0
gathered = cp.concatenate([s[:, t * S:(t + 1) * S] for s in slabs], axis=0)
ref = cp.fft.fftn(gathered, axes=(0,))
show("strided", lambda: cp.fft.fftn(gathered, axes=(0,)))

code = r"""
#include <cufftXt.h>

__device__ VEC pull_slabs(void* dataIn, size_t offset, void* callerInfo, void* sharedPtr) {
  const unsigned long long* info = (const unsigned long long*)callerInfo;  // S, N, column offset, slab pointers
  unsigned long long S = info[0], N = info[1], col = info[2];
  unsigned long long b = offset / S, j = offset - b * S;
  unsigned long long s = b / S, r = b - s * S;
  const VEC* src = (const VEC*)info[3 + s];
  return src[r * N + col + j];
}
""".replace("VEC", "cufftDoubleComplex" if dt == np.complex128 else "cufftComplex")
info = cp.asarray(np.array([S, N, t * S] + [s.data.ptr for s in slabs], dtype=np.uint64))
dummy = cp.empty((N, S), dtype=dt)
try:
    t0 = time.perf_counter()
    with cp.fft.config.set_cufft_callbacks(cb_load=code, cb_load_name="pull_slabs", cb_load_data=info.data,
                                           cb_ver="jit"):
        out = cp.fft.fftn(dummy, axes=(0,))
        cp.cuda.Device().synchronize()
        print(f"pull plan + first run {time.perf_counter() - t0:.2f} s", flush=True)
        err = float(cp.abs(out - ref).max() / cp.abs(ref).max())
        print(f"pull max rel err {err:.2e}", flush=True)
        show("pull", lambda: cp.fft.fftn(dummy, axes=(0,)))
except Exception as exc:  # what the device's CuPy / cuFFT say: the finding
    print(f"pull FAILED: {type(exc).__name__}: {exc}", flush=True)

# the transposed output layout: rank t's (S, N) rows, each a whole transform (loads strided by N in the slabs)
code_rows = code.replace("pull_slabs", "pull_rows").replace(
    "unsigned long long b = offset / S, j = offset - b * S;", "unsigned long long j = offset / N, b = offset - j * N;")
ref_rows = cp.fft.fft(cp.ascontiguousarray(gathered.T), axis=-1)
dummy_rows = cp.empty((S, N), dtype=dt)
try:
    with cp.fft.config.set_cufft_callbacks(cb_load=code_rows, cb_load_name="pull_rows", cb_load_data=info.data,
                                           cb_ver="jit"):
        out = cp.fft.fft(dummy_rows, axis=-1)
        err = float(cp.abs(out - ref_rows).max() / cp.abs(ref_rows).max())
        print(f"pull-rows max rel err {err:.2e}", flush=True)
        show("pull-rows", lambda: cp.fft.fft(dummy_rows, axis=-1))
except Exception as exc:
    print(f"pull-rows FAILED: {type(exc).__name__}: {exc}", flush=True)

# the library's route (apps/fft/_cuda.make_pull_fft): a plan from cupyx's get_fft_plan made inside the context,
# executed later outside it
try:
    from cupyx.scipy.fft import get_fft_plan

    with cp.fft.config.set_cufft_callbacks(cb_load=code_rows, cb_load_name="pull_rows", cb_load_data=info.data,
                                           cb_ver="jit"):
        plan = get_fft_plan(dummy_rows, axes=(1,), value_type="C2C")
    out = cp.empty_like(dummy_rows)
    plan.fft(dummy_rows, out, -1)
    err = float(cp.abs(out - ref_rows).max() / cp.abs(ref_rows).max())
    print(f"plan-route {type(plan).__name__} max rel err {err:.2e}", flush=True)
    show("plan-route", lambda: plan.fft(dummy_rows, dummy_rows, -1))
except Exception as exc:
    print(f"plan-route FAILED: {type(exc).__name__}: {exc}", flush=True)
