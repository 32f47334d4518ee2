"""Dev experiment (one process, one GPU): can the reshape of a 2-D slab FFT ride in cuFFT's own stores?

The pull (a load callback in the second stage) leaves the put's pass out but reads strided, and lost to the
transposing put at every complex64 case (one H100, 2026-12-07). This times the mirror: the first stage's row
transforms with a JIT-linked *store* callback (circuslink.apps.fft._cufft_callback, store=True) that writes each
output element straight to its place in the owner's transposed slab, for an --ranks split of --size^2 in one
process (the owners' slabs are buffers of this process: on one GPU a peer's memory is the same HBM). Rows of one
slab: (rows) cuFFT's plain row transforms, in place; (push-rows) the same with the store callback writing the
transposed layout of every owner; (push-natural) a store callback that scatters to the owners without turning
(each owner's block kept row-major): what the callback costs apart from the turn; (turn) CuPy's copy of the plain
output into the owners' transposed slabs (a weak stand-in for the transposing put, beside it). Each checked
against numpy's layout; ms per stage (best and median of --reps event-timed runs); plan creation times.

    python scripts/dev/fft_push_probe.py [--size 16384] [--ranks 4] [--dtype complex128]
"""
from __future__ import annotations

import argparse
import statistics
import time

import cupy as cp
import numpy as np

from circuslink.apps.fft import _cufft_callback as cb

ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, default=16384)
ap.add_argument("--ranks", type=int, default=4)
ap.add_argument("--dtype", default="complex128")
ap.add_argument("--reps", type=int, default=10)
args = ap.parse_args()
N, R = args.size, args.ranks
S = N // R  # rows a rank holds in the first stage, columns it owns in the second
dt = np.dtype(args.dtype)
E = cb.ELEMENT[dt.itemsize]
me = 1  # the slab timed: rank 1's rows me*S..(me+1)*S


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
    print(f"{name:13s} best {best:.3f} median {med:.3f} ms", flush=True)


rng = cp.random.default_rng(1)
x = (rng.standard_normal((S, N)) + 1j * rng.standard_normal((S, N))).astype(dt)
print(f"{N}^2 {dt}, rank {me}'s slab of {R}: {S}x{N} ({x.nbytes / 2**30:.2f} GiB); cupy {cp.__version__}, "
      f"cuFFT {cb.version()}", flush=True)
ref = cp.fft.fft(x, axis=-1)
owners = [cp.zeros((S, N), dtype=dt) for _ in range(R)]  # owner t's slab, transposed: [column - t*S, row]
ptrs = [o.data.ptr for o in owners]
want = [ref[:, t * S:(t + 1) * S].T for t in range(R)]  # what lands at owner t's columns me*S..(me+1)*S

work = cp.empty_like(x)
stream = cp.cuda.get_current_stream()


show("rows", lambda: cp.fft.fft(x, axis=-1))
out = cp.empty_like(x)
show("turn", lambda: [owners[t].__setitem__((slice(None), slice(me * S, (me + 1) * S)),
                                            out[:, t * S:(t + 1) * S].T) for t in range(R)])

PUSH = r"""
__device__ void NAME(void* dataOut, unsigned long long offset, VEC element, void* callerInfo, void* sharedPtr) {
  const unsigned long long* info = (const unsigned long long*)callerInfo;  // N, S, first row, owners' slabs
  const unsigned long long N = info[0], S = info[1], row0 = info[2];
  const unsigned long long b = offset / N, j = offset - b * N;
  const unsigned long long t = j / S, c = j - t * S;
  VEC* dst = (VEC*)info[3 + t];
  dst[INDEX] = element;
}
"""
info = cp.asarray(np.array([N, S, me * S, *ptrs], dtype=np.uint64))
for label, index, check in (("push-rows", "c * N + row0 + b", True), ("push-natural", "b * S + c", False)):
    code = PUSH.replace("NAME", label.replace("-", "_")).replace("VEC", E).replace("INDEX", index)
    try:
        t0 = time.perf_counter()
        plan = cb.CallbackPlan((N,), S, dt.itemsize, cb.lto_ir(code, label.replace("-", "_")), label.replace("-", "_"),
                               info.data.ptr, store=True)
        print(f"{label} plan {time.perf_counter() - t0:.2f} s", flush=True)

        def run(p=plan):
            work[...] = x  # in place: the stage's own slab is the scratch cuFFT's passes use
            p.execute(work.data.ptr, -1, stream.ptr)

        for o in owners:
            o.fill(0)
        run()
        if check:
            err = max(float(cp.abs(owners[t][:, me * S:(me + 1) * S] - want[t]).max()) for t in range(R))
            print(f"{label} max rel err {err / float(cp.abs(ref).max()):.2e}", flush=True)
        show(label, run)
        copy_only = lambda: work.__setitem__(Ellipsis, x)  # noqa: E731
        show(f"{label}-copy", copy_only)  # the reset inside run(), to subtract
    except Exception as exc:  # what the device's cuFFT says: the finding
        print(f"{label} FAILED: {type(exc).__name__}: {exc}", flush=True)
