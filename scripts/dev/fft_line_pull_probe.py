"""Dev experiment (one process, one GPU): the FFT pull's own kernels (apps/fft/_line_pull.py) alone, against
what bounds them.

For one rank's second stage of a slab FFT of --size^3 (--dims 3; runs = size^2 / ranks of the untransformed axes,
size points each: one kernel up to 1024 points) or --size^2 (--dims 2; size / ranks runs: the cluster kernel up
to 128 KiB of points, timed against the four-step's two kernels, and the four-step above) on --ranks ranks,
times: (own) the kernel reading every point's run from the slabs where the first stage left them (a table of
addresses into --ranks arrays, as the pull reads the peers); (callback) the library's other route, cuFFT with a
load callback, the same table; (cufft) cuFFT's packed transforms of the gathered input, no pull (what a stage
costs when the reshape has been paid); (rows) where the cluster kernel fits, the same on the gathered rows in memory
(a local stage's transform: ours against cuFFT's); (copy) a device copy of the same bytes (one read and one write:
the floor of any pass). Each checked against numpy. Prints ms (best and median of --reps event-timed runs) and the
bandwidth of one read and one write.
"""
from __future__ import annotations

import argparse
import statistics

import cupy as cp
import numpy as np

from circuslink.apps.fft import _cuda, _line_pull

ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, default=512)
ap.add_argument("--ranks", type=int, default=4)
ap.add_argument("--dtype", default="complex64")
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("--dims", type=int, default=3, choices=(2, 3))
args = ap.parse_args()
N, P = args.size, args.ranks
dt = np.dtype(args.dtype)
S = N // P  # each slab's planes (rows); this rank's runs: its S rows of axis 1, every point of axis 2 (3-D)
plane = N * N if args.dims == 3 else N  # elements of one plane (row) of a slab
runs = S * N if args.dims == 3 else S  # the runs a rank's stage 2 transforms, N points each (axis 0)


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


nbytes = runs * N * dt.itemsize


def show(name, fn):
    best, med = timed(fn)
    print(f"{name:9s} best {best:.3f} median {med:.3f} ms  {2 * nbytes / best / 1e6:7.0f} GB/s (one read, one write)",
          flush=True)


rng = cp.random.default_rng(1)
# slab r: planes x in [r S, (r+1) S), all y and z; this rank (0) reads y in [0, S) of every plane
dims = (S, N, N) if args.dims == 3 else (S, N)
slabs = [(rng.standard_normal(dims, dtype=np.float32) + 1j * rng.standard_normal(dims, dtype=np.float32)
          ).astype(dt) for _ in range(P)]
print(f"{N}^{args.dims} {dt} on {P} ranks: stage 2 of one rank, {runs} runs of {N} points ({nbytes / 2**30:.2f} GiB)",
      flush=True)
table = cp.asarray(np.array([slabs[x // S].data.ptr + (x % S) * plane * dt.itemsize for x in range(N)],
                            dtype=np.uint64))
out = cp.empty(runs * N, dtype=dt)
own = _line_pull.make(out, N, table, inverse=False, cache={}, cluster=True)
gathered = cp.concatenate([s[:, :S].reshape(S, runs) for s in slabs], axis=0).T.copy()  # (runs, N)
ref = cp.fft.fft(gathered, axis=1)
own()
err = float(cp.abs(out.reshape(runs, N) - ref).max() / cp.abs(ref).max())
big = _line_pull.cluster_fits(N, dt.itemsize)
print(f"own kernel ({'cluster' if big else 'line' if N <= _line_pull.MAX_POINTS else 'four-step'}) max relative "
      f"error {err:.2e}", flush=True)
show("own", own)
if big:  # the four-step too, where the cluster kernel takes its place
    four = _line_pull.make(out, N, table, inverse=False, cache={}, cluster=False)
    out.fill(0)
    four()
    err = float(cp.abs(out.reshape(runs, N) - ref).max() / cp.abs(ref).max())
    print(f"four-step max relative error {err:.2e}", flush=True)
    show("four-step", four)
info = cp.asarray(np.array([N, table.data.ptr], dtype=np.uint64))
try:
    plan = _cuda._callback_plan((N,), runs, dt.itemsize, _cuda._PULL_CALLBACK, "circuslink_fft_pull", info.data.ptr)
    flat = cp.empty(runs * N, dtype=dt)
    plan.execute(flat.data.ptr, -1, cp.cuda.get_current_stream().ptr)
    err = float(cp.abs(flat.reshape(runs, N) - ref).max() / cp.abs(ref).max())
    print(f"callback max relative error {err:.2e}", flush=True)
    show("callback", lambda: plan.execute(flat.data.ptr, -1, cp.cuda.get_current_stream().ptr))
except Exception as exc:  # noqa: BLE001 - a dev probe: say why and go on
    print(f"callback: {type(exc).__name__}: {exc}", flush=True)
packed = gathered.copy()
show("cufft", lambda: cp.fft.fft(packed, axis=1))
if big:  # a local stage's transform too: the cluster kernel on rows in memory, against cuFFT's just above
    rows = cp.empty_like(packed)
    local = _line_pull.make_rows(rows, packed, N, inverse=False)
    local()
    err = float(cp.abs(rows - ref).max() / cp.abs(ref).max())
    print(f"rows (own, local) max relative error {err:.2e}", flush=True)
    show("rows", local)
dst = cp.empty_like(gathered)
show("copy", lambda: cp.copyto(dst, gathered))
