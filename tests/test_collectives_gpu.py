"""Collectives on GPUs: the host API (one kernel per call) and the device API in a user's kernel.

Run on the device machine (2 x H200); ranks beyond 2 share a GPU (time-sliced kernels of two
processes: correct, slow).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

_HOST_BODY = """
    import numpy as np, cupy as cp
    import circuslink as cl
    from circuslink import collectives
    from circuslink.collectives._device import C_TYPES

    w = cl.init()
    n, r = w.size, w.rank
    comm = collectives.Comm(w, rings=8)
    rng = np.random.default_rng()
    for count in COUNTS:
        for name in C_TYPES:
            dtype = np.dtype(name)
            for op in ("sum", "max", "min"):
                seed = int(w.broadcast_object(int(rng.integers(1 << 60))))
                negative = op != "sum" and dtype.kind in "if"
                xs = []
                for k in range(n):
                    g = np.random.default_rng(seed + k)
                    if dtype.kind == "f":
                        x = g.standard_normal(count) * 100
                        x = -np.abs(x) - 1 if negative else x
                    else:
                        info = np.iinfo(dtype)
                        x = g.integers(info.min, 0 if negative else info.max, size=count, dtype=dtype)
                    xs.append(x.astype(dtype))
                got = comm.allreduce(cp.asarray(xs[r]), op).get()
                fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
                want = xs[0].copy()
                for x in xs[1:]:
                    want = fn(want, x)
                if dtype.kind == "f" and op == "sum":
                    bound = (n - 1) * np.finfo(dtype).eps * np.sum(np.abs(np.array(xs, np.float64)), axis=0)
                    assert np.all(np.abs(got.astype(np.float64) - want) <= 2 * bound), (name, count)
                else:
                    assert np.array_equal(got, want), (name, op, count)
                same = w.allgather_object(got.tobytes())
                assert all(s == same[0] for s in same), (name, op, count, "ranks disagree")
    src = np.random.default_rng().integers(0, 1 << 62, size=100_003, dtype=np.int64)
    root = n - 1
    got = comm.broadcast(cp.asarray(src if r == root else np.zeros_like(src)), root=root).get()
    assert got.tobytes() == w.broadcast_object(src.tobytes(), root=root)
    for _ in range(3):
        comm.barrier()
    comm.close()
    print("ok", r)
    w.close()
"""


@pytest.mark.parametrize("n", [2])
def test_host_api_two_gpus(spmd, n):
    body = _HOST_BODY.replace("COUNTS", "[1, 2, 7, 1000, 16_385, 300_001]")
    job = spmd(n, body, backend="cuda", job_timeout=600).check()
    assert job.stdout.count("ok") == n


@pytest.mark.parametrize("n", [3, 4])
def test_host_api_ranks_sharing_gpus(spmd, n):
    body = _HOST_BODY.replace("COUNTS", "[3, 1000]")
    job = spmd(n, body, backend="cuda", job_timeout=600).check()
    assert job.stdout.count("ok") == n


USER_KERNEL = r"""
#include <circuslink/collectives.cuh>
namespace cc = circuslink::collectives;
// Compute, all-reduce inside the kernel, keep computing: the fused pattern the device API is for.
// Block b owns slice b and reduces it over its own ring (rings[b]) with the block form.
extern "C" __global__ void fused(const cc::Ring* rings, unsigned int nrings, int rank, float* x,
                                 unsigned long long n, int* status) {
  unsigned long long b = blockIdx.x, base = n / nrings, extra = n % nrings;
  if (b >= nrings) return;
  unsigned long long lo = b * base + (b < extra ? b : extra), hi = lo + base + (b < extra ? 1 : 0);
  for (unsigned long long i = lo + threadIdx.x; i < hi; i += blockDim.x) x[i] = (float)(rank + 1) * (float)(i % 1000);
  __syncthreads();
  if (!cc::allreduce_block(rings[b], x + lo, hi - lo, cc::Sum())) { if (threadIdx.x == 0) *status = 1; return; }
  __syncthreads();
  for (unsigned long long i = lo + threadIdx.x; i < hi; i += blockDim.x) x[i] *= 2.0f;
}
"""


def test_device_api_in_a_users_kernel(spmd):
    job = spmd(2, f"""
        import numpy as np, cupy as cp
        import circuslink as cl
        from circuslink import collectives
        w = cl.init()
        comm = collectives.Comm(w, rings=4)
        mod = cl.compile({USER_KERNEL!r})
        n = 50_000
        x = cp.zeros(n, dtype=cp.float32)
        status = cp.zeros(1, dtype=cp.int32)
        ptr, count = comm.device_rings()
        mod.get_function("fused")((count,), (256,), (np.uint64(ptr), np.uint32(count), np.int32(w.rank), x,
                                  np.uint64(n), status), stream=w.backend.stream)
        w.backend.synchronize()
        assert int(status.get()[0]) == 0
        i = np.arange(n)
        want = 2 * sum(r + 1 for r in range(w.size)) * (i % 1000).astype(np.float32)
        assert np.array_equal(x.get(), want)
        comm.close()
        print("ok", w.rank)
        w.close()
    """, backend="cuda").check()
    assert job.stdout.count("ok") == 2
