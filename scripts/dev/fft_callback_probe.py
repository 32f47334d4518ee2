"""Dev experiment (one process, one GPU): can the reshape of a 2-D slab FFT ride in cuFFT's own loads?

The slab pipeline is memory-bound on one GPU: at 16384^2 complex128 each rank's stage of transforms reads and
writes its slab twice (cuFFT takes two passes for 16384 double points) and the transposing put moves it once more.
This times, for a 4-rank split of --size^2 --dtype in one process: (rows) the first stage's batched row
transforms of one slab; (strided) the second stage on one rank's columns as a strided transform (istride = the
batch, idist 1) of a gathered array; (pull-strided-*) the same with a JIT-linked load callback
(circuslink.apps.fft._cufft_callback) that reads every element from the four slabs where the first stage left
them (no reshape pass), into the natural or the transposed layout; (pull-rows) the library's form, packed rows in
place; each checked against cuFFT on the gathered array. Prints ms per transform (best and median of --reps
event-timed runs) and each callback plan's creation time.
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

from circuslink.apps.fft import _cufft_callback as cb  # noqa: E402

print(f"cupy {cp.__version__}, cuFFT {cb.version()}", flush=True)
E = cb.ELEMENT[dt.itemsize]
# (pull) rank t's columns as a strided transform: input (N, S) offset b * S + j -> row b, column t*S + j of the
# slab holding row b (consecutive j: consecutive addresses); output the transposed layout (S, N) (ostride 1,
# odist N) or the natural (N, S) (ostride S, odist 1): --out-layout both are timed
code = r"""
__device__ VEC pull_slabs(void* dataIn, unsigned long long offset, void* callerInfo, void* sharedPtr) {
  const unsigned long long* info = (const unsigned long long*)callerInfo;  // S, N, column offset, slab pointers
  unsigned long long S = info[0], N = info[1], col = info[2];
  unsigned long long b = offset / S, j = offset - b * S;
  unsigned long long s = b / S, r = b - s * S;
  const VEC* src = (const VEC*)info[3 + s];
  return src[r * N + col + j];
}
""".replace("VEC", E)
info = cp.asarray(np.array([S, N, t * S] + [s.data.ptr for s in slabs], dtype=np.uint64))
ref_rows = cp.ascontiguousarray(ref.T)  # (S, N): the transposed layout
dummy = cp.empty((N, S), dtype=dt)
out = cp.empty((N, S), dtype=dt)
stream = cp.cuda.get_current_stream()
for label, strides, want in (("pull-strided-natural", (S, 1, S, 1), ref), ("pull-strided-transposed", (S, 1, 1, N),
                                                                             ref_rows)):
    try:
        t0 = time.perf_counter()
        plan = cb.CallbackPlan((N,), S, dt.itemsize, cb.lto_ir(code, "pull_slabs"), "pull_slabs",
                                   info.data.ptr, strides)
        print(f"{label} plan {time.perf_counter() - t0:.2f} s", flush=True)
        run = lambda p=plan: p.execute(dummy.data.ptr, -1, stream.ptr, out.data.ptr)  # noqa: E731
        run()
        got = out.reshape(want.shape)
        err = float(cp.abs(got - want).max() / cp.abs(want).max())
        print(f"{label} max rel err {err:.2e}", flush=True)
        show(label, run)
    except Exception as exc:  # what the device's cuFFT says: the finding
        print(f"{label} FAILED: {type(exc).__name__}: {exc}", flush=True)

# (pull-rows) the library's route (apps/fft/_cuda.make_pull_fft): rank t's (S, N) rows, each a whole packed
# transform, in place (loads strided by N in the slabs)
code_rows = code.replace("pull_slabs", "pull_rows").replace(
    "unsigned long long b = offset / S, j = offset - b * S;", "unsigned long long j = offset / N, b = offset - j * N;")
rows_out = cp.empty((S, N), dtype=dt)
try:
    t0 = time.perf_counter()
    plan_rows = cb.CallbackPlan((N,), S, dt.itemsize, cb.lto_ir(code_rows, "pull_rows"), "pull_rows",
                                    info.data.ptr)
    print(f"pull-rows plan {time.perf_counter() - t0:.2f} s", flush=True)
    run_rows = lambda: plan_rows.execute(rows_out.data.ptr, -1, stream.ptr)  # noqa: E731
    run_rows()
    err = float(cp.abs(rows_out - ref_rows).max() / cp.abs(ref_rows).max())
    print(f"pull-rows max rel err {err:.2e}", flush=True)
    show("pull-rows", run_rows)
except Exception as exc:
    print(f"pull-rows FAILED: {type(exc).__name__}: {exc}", flush=True)
