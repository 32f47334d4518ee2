"""Collectives: ring all-reduce / broadcast / barrier at 1..8 ranks with seeded random data.

The algorithms are checked in one process over bounded in-memory FIFOs (threads as ranks; the
buffers are tiny so the flow-control argument is exercised); the host API as real ranks over
circuslink channels, on every back-end (spmd; the cuda ones on the GPU machine); the device API
in users' kernels (tests/kernels/collectives_user.cu) on the GPU machine, and compiled with nvcc
here; and the Comm's lifecycle, handle and errors.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import NVCC_TIMEOUT_S, on_backend

import circuslink as cl
from circuslink import collectives
from circuslink.collectives import _algorithms as alg

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "circuslink"
USER_KERNELS = Path(__file__).with_name("kernels") / "collectives_user.cu"

INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]
# Floats: ring order differs from a serial sum only by rounding; per element the error is at most
# (n - 1) * eps * sum(|x_i|) (each of the n - 1 additions rounds once). We check that bound.


class _Fifo:
    """A bounded byte stream between two threads: write blocks while full, read until filled."""

    def __init__(self, capacity: int, name: str) -> None:
        self.buf = bytearray()
        self.capacity = capacity
        self.name = name
        self.cv = threading.Condition()

    def write(self, data: np.ndarray) -> None:
        data = np.asarray(data, dtype=np.uint8).tobytes()
        deadline = time.monotonic() + 20
        while data:
            with self.cv:
                while len(self.buf) >= self.capacity:
                    if not self.cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                        raise TimeoutError(f"{self.name}: writer stalled (deadlock?)")
                room = self.capacity - len(self.buf)
                self.buf += data[:room]
                data = data[room:]
                self.cv.notify_all()

    def flush(self) -> None:
        pass

    def read(self, nbytes: int) -> np.ndarray:
        out = bytearray()
        deadline = time.monotonic() + 20
        while len(out) < nbytes:
            with self.cv:
                while not self.buf:
                    if not self.cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                        raise TimeoutError(f"{self.name}: reader stalled (deadlock?)")
                take = min(nbytes - len(out), len(self.buf))
                out += self.buf[:take]
                del self.buf[:take]
                self.cv.notify_all()
        return np.frombuffer(bytes(out), dtype=np.uint8)


def _run_ranks(n: int, body, capacity: int = 64):
    """Run body(rank, right, left) on n threads joined in a ring of FIFOs; return results."""
    fifos = [_Fifo(capacity, f"ring {r}->{(r + 1) % n}") for r in range(n)]
    results: list = [None] * n
    errors: list = []

    def main(r: int) -> None:
        try:
            results[r] = body(r, fifos[r], fifos[(r - 1) % n])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((r, exc))

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def _random(rng, dtype, shape, negative=False):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        x = rng.standard_normal(shape) * 100
        if negative:
            x = -np.abs(x) - 1
        return x.astype(dtype)
    info = np.iinfo(dtype)
    if negative and dtype.kind == "i":
        return rng.integers(info.min, 0, size=shape, dtype=dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _expected(inputs, op):
    fn = alg.OPS[op]
    out = inputs[0].copy()
    for x in inputs[1:]:
        out = fn(out, x)  # integers wrap modulo 2**bits exactly as the ring does
    return out


def _check_float(got, inputs, op):
    if op != "sum":
        assert np.array_equal(got, _expected(inputs, op))
        return
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    bound = (len(inputs) - 1) * np.finfo(got.dtype).eps * np.sum([np.abs(x.astype(np.float64)) for x in inputs],
                                                                axis=0)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound + np.finfo(got.dtype).tiny)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_ring_allreduce_threads(n, rng):
    cases = [(dt, op) for dt in INT_TYPES + FLOAT_TYPES for op in ("sum", "max", "min")]
    for dtype, op in cases:
        count = int(rng.integers(0, 300))
        negative = op in ("max", "min") and rng.random() < 0.5
        inputs = [_random(rng, dtype, (count,), negative) for _ in range(n)]
        got = _run_ranks(n, lambda r, right, left, inputs=inputs, op=op: alg.ring_allreduce(
            r, n, right, left, inputs[r], op, piece=16), capacity=32)
        for r in range(1, n):
            assert got[r].tobytes() == got[0].tobytes(), (dtype, op, "ranks disagree")
        if np.dtype(dtype).kind == "f":
            _check_float(got[0], inputs, op)
        else:
            assert np.array_equal(got[0], _expected(inputs, op)), (dtype, op, n)
        assert got[0].dtype == np.dtype(dtype) and got[0].shape == (count,)


def test_segments_cover_everything_in_aligned_units(rng):
    for _ in range(300):
        n, item, parts = int(rng.integers(0, 5000)), int(rng.choice([1, 2, 4, 8])), int(rng.integers(1, 9))
        seg = alg.segments(n, item, parts)
        assert seg[0][0] == 0 and seg[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(seg, seg[1:], strict=False))
        assert all((lo * item) % 16 == 0 for lo, _ in seg)  # 16-byte aligned starts
        sizes = [hi - lo for lo, hi in seg[:-1]]
        assert not sizes or max(sizes) - min(sizes) <= 16 // item


def test_all_negative_max_min_is_not_zero(rng):
    # A max that started from 0 instead of the first operand would return zeros here.
    for dtype in (np.int32, np.int64, np.float32, np.float64):
        inputs = [_random(rng, dtype, (97,), negative=True) for _ in range(3)]
        for op in ("max", "min"):
            got = _run_ranks(3, lambda r, right, left, inputs=inputs, op=op: alg.ring_allreduce(
                r, 3, right, left, inputs[r], op, piece=8), capacity=16)
            assert np.array_equal(got[0], _expected(inputs, op))
            assert np.all(got[0] < 0)


def test_shape_is_kept_and_input_untouched(rng):
    inputs = [_random(rng, np.int32, (5, 7)) for _ in range(4)]
    before = [x.copy() for x in inputs]
    got = _run_ranks(4, lambda r, right, left: alg.ring_allreduce(r, 4, right, left, inputs[r], "sum", 12), 24)
    assert got[2].shape == (5, 7)
    assert np.array_equal(got[2], _expected(inputs, "sum"))
    assert all(np.array_equal(a, b) for a, b in zip(inputs, before, strict=True))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_ring_broadcast_and_barrier_threads(n, rng):
    for root in {0, n - 1, int(rng.integers(0, n))}:
        src = _random(rng, np.float64, (int(rng.integers(1, 200)),))
        got = _run_ranks(n, lambda r, right, left, src=src, root=root: alg.ring_broadcast(
            r, n, right, left, src if r == root else np.zeros_like(src), root, piece=40), capacity=80)
        for g in got:
            assert g.tobytes() == src.tobytes()
    arrived = []

    def body(r, right, left):
        time.sleep(0.01 * r)  # the last rank arrives late: nobody may leave before it
        arrived.append(r)
        alg.ring_barrier(r, n, right, left)
        return len(arrived)

    counts = _run_ranks(n, body)
    assert counts == [n] * n


def test_disagreeing_ranks_are_named():
    x32 = np.arange(10, dtype=np.int32)
    x64 = np.arange(10, dtype=np.int64)

    def body(r, right, left):
        try:
            alg.check_agreement(r, 2, right, left, "allreduce", x32 if r == 0 else x64, op="sum")
        except cl.ConfigError as exc:
            return str(exc)
        return None

    msgs = _run_ranks(2, body)
    assert msgs[0] == ("allreduce on rank 0 does not match rank 1's call: rank 0 has allreduce(10 x int32, "
                       "op=sum, root=0), rank 1 has allreduce(10 x int64, op=sum, root=0)")
    assert msgs[1] is not None and msgs[1].startswith("allreduce on rank 1 does not match rank 0's call")
    with pytest.raises(cl.ConfigError, match="op='avg' is not one of sum, max, min"):
        alg.check_op("avg")
    with pytest.raises(cl.ConfigError, match="not an integer or floating type"):
        alg.check_array(np.array([True]), "allreduce")


# -- the code's shape: back-end modules by capability, kernels in .cu files ----------------------------------
_KERNEL_KEYWORD = "__" + "global__"  # spelt in two so that this file does not match its own check
_AREA = ["collectives", "trace", "bench/allreduce.py", "bench/baselines"]
_AREA_TESTS = ["test_collectives.py", "test_trace.py", "test_baselines.py"]


def test_no_backend_name_tests_and_no_kernels_in_python_files():
    files = [p for a in _AREA for p in ([SRC / a] if a.endswith(".py") else sorted((SRC / a).rglob("*.py")))]
    files += [Path(__file__).with_name(t) for t in _AREA_TESTS]
    assert len(files) > 15
    name_test = re.compile(r"backend\.name\s*[!=]=|[!=]=\s*[\w.]*backend\.name|backend\s*==\s*[\"']")
    for path in files:
        text = path.read_text()
        assert not name_test.search(text), f"{path}: tests the back-end by name"
        assert _KERNEL_KEYWORD not in text, f"{path}: device code in a Python file"


# -- the host API as real ranks, on every back-end ------------------------------------------------
_HOST_BODY = """
    import os
    import numpy as np
    import circuslink as cl
    from circuslink import collectives

    w = cl.init()
    xp, n, r = w.xp, w.size, w.rank
    rng = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))  # every rank draws the same inputs
    host = lambda a: a.get() if hasattr(a, "get") else a
    # Small channels where the host drives the ring (many pieces: flow control exercised); 8 rings where
    # kernels drive them (several slices per call).
    comm = collectives.Comm(w, depth_bytes=256, rings=8)
    for count in COUNTS or [int(rng.integers(1, 700)) for _ in range(2)]:
        for dtype in map(np.dtype, DTYPES):
            for op in ("sum", "max", "min"):
                negative = op != "sum" and dtype.kind in "if"
                xs = []
                for k in range(n):
                    if dtype.kind == "f":
                        x = rng.standard_normal(count) * 100
                        x = -np.abs(x) - 1 if negative else x
                    else:
                        info = np.iinfo(dtype)
                        x = rng.integers(info.min, 0 if negative else info.max, size=count, dtype=dtype)
                    xs.append(x.astype(dtype))
                mine = xp.asarray(xs[r])
                got = host(comm.allreduce(mine, op))
                fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
                want = xs[0].copy()
                for x in xs[1:]:
                    want = fn(want, x)  # integers wrap modulo 2**bits exactly as the ring does
                assert got.dtype == dtype and got.shape == (count,), (got.dtype, got.shape)
                if dtype.kind == "f" and op == "sum":
                    # ring order differs from a serial sum only by rounding: (n - 1) eps sum|x_i| per element
                    bound = (n - 1) * np.finfo(dtype).eps * np.sum(np.abs(np.array(xs, np.float64)), axis=0)
                    assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= 2 * bound
                                  + np.finfo(dtype).tiny), (dtype, op, count)
                else:
                    assert np.array_equal(got, want), (dtype, op, count)
                assert np.array_equal(host(mine), xs[r]), "the input was modified"
                same = w.allgather_object(got.tobytes())
                assert all(s == same[0] for s in same), (dtype, op, count, "ranks disagree")
    root = n - 1
    src = rng.integers(0, 1 << 62, size=BCAST, dtype=np.int64).reshape(-1, 1)
    got = host(comm.broadcast(xp.asarray(src if r == root else np.zeros_like(src)), root=root))
    assert got.shape == src.shape and got.tobytes() == src.tobytes()
    for _ in range(3):
        comm.barrier()
    collectives.barrier(w)                                    # the module API on the world's default Comm
    total = host(collectives.allreduce(w, xp.asarray(np.array([r + 1], dtype=np.int64))))
    assert int(total[0]) == n * (n + 1) // 2
    if w.backend.runs_kernels:
        try:
            comm.allreduce(xp.zeros(4, dtype=xp.float16))
        except cl.ConfigError as exc:
            assert "dtype float16 is not supported" in str(exc), exc
        else:
            raise AssertionError("float16 was accepted by the device collectives")
    comm.close()
    print("ok", r)
    w.close()
"""
_CPU_DTYPES = ("int8", "uint16", "int32", "uint64", "float16", "float32", "float64")
_CUDA_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64")
_HOST_CASES = [pytest.param("cpu", n, None, _CPU_DTYPES, 333, id=f"cpu-{n}") for n in range(1, 9)] + [
    # one GPU shared under MPS; 1..7 elements take the LL ring, 16385+ every slice of the 8 BW rings (the GPU
    # stage's 540 s: no count between 1 and 7 beyond those two ends)
    on_backend("cuda", 2, [1, 7, 1000, 16_385, 300_001], _CUDA_DTYPES, 100_003, id="cuda-2"),
    on_backend("cuda", 4, [3, 1000, 70_001], _CUDA_DTYPES, 100_003, marks=pytest.mark.slow, id="cuda-4"),
]


@pytest.mark.parametrize("backend, n, counts, dtypes, bcast", _HOST_CASES)
def test_host_api(spmd, backend, n, counts, dtypes, bcast):
    body = (_HOST_BODY.replace("COUNTS", repr(counts)).replace("DTYPES", repr(dtypes))
            .replace("BCAST", str(bcast)))
    job = spmd(n, body, backend=backend, job_timeout=170 if counts is None else 600).check()
    assert job.stdout.count("ok") == n


def test_mismatched_call_fails_with_names(spmd):
    job = spmd(2, """
        import numpy as np, circuslink as cl
        from circuslink import collectives
        w = cl.init()
        try:
            collectives.allreduce(w, np.zeros(8, dtype=np.int32 if w.rank == 0 else np.float32))
        except cl.ConfigError as exc:
            print("error:", exc)
        w.close()
    """).check()
    assert ("error: allreduce on rank 0 does not match rank 1's call: rank 0 has allreduce(8 x int32, op=sum, "
            "root=0), rank 1 has allreduce(8 x float32, op=sum, root=0)") in job.stdout
    assert "error: allreduce on rank 1 does not match rank 0's call" in job.stdout


# -- the Comm: a Resource of its World, its back-end module, its errors -------------------------------------
def test_comm_lifecycle(spmd, seed):
    job = spmd(2, """
        import os
        import numpy as np, circuslink as cl
        from circuslink import collectives
        w = cl.init()
        rng = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))
        xs = [rng.integers(-1000, 1000, size=37, dtype=np.int32) for _ in range(w.size)]
        comm = collectives.Comm(w, depth_bytes=64)
        assert w.resources(collectives.Comm) == [comm]
        assert np.array_equal(comm.allreduce(xs[w.rank]), xs[0] + xs[1])
        comm.close()
        comm.close()  # idempotent
        assert comm.closed and w.resources(collectives.Comm) == []
        try:
            comm.allreduce(xs[w.rank])
        except cl.ConfigError as exc:
            assert str(exc) == "allreduce: this collectives communicator is closed", exc
        else:
            raise AssertionError("a closed Comm reduced")
        with collectives.Comm(w) as scoped:
            scoped.barrier()
        assert scoped.closed
        # The default communicator lives on the World (its registry) and is reopened after a close.
        first = collectives.default_comm(w)
        assert collectives.default_comm(w) is first
        assert collectives.broadcast(w, xs[w.rank], root=1).tolist() == xs[1].tolist()
        first.close()
        second = collectives.default_comm(w)
        assert second is not first and not second.closed
        left_open = collectives.Comm(w)
        w.close()  # closes what the program left open, newest first
        assert left_open.closed and second.closed
        print("ok", w.rank)
    """).check()
    assert job.stdout.count("ok") == 2


def test_module_handle_and_bad_calls_on_one_rank():
    from circuslink.collectives import _cpu

    w = cl.init(backend="cpu")
    try:
        assert w.backend_module("circuslink.collectives") is _cpu
        for kwargs, message in [({"rings": 0}, "collectives: rings=0 must be an integer in 1..128"),
                                ({"rings": True}, "collectives: rings=True must be an integer in 1..128"),
                                ({"depth_bytes": 8}, "collectives: depth_bytes must be an integer >= 32, got 8")]:
            with pytest.raises(cl.ConfigError) as info:
                collectives.Comm(w, **kwargs)
            assert str(info.value) == message
        assert w.resources(collectives.Comm) == []  # refused before anything was opened
        comm = collectives.Comm(w)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        assert comm.allreduce(x, "max").tolist() == x.tolist()  # one rank: a copy
        for call, message in [
            (lambda: comm.allreduce(x, "avg"), "op='avg' is not one of sum, max, min"),
            (lambda: comm.allreduce(np.array([True]), "sum"),
             "allreduce: dtype bool is not an integer or floating type"),
            (lambda: comm.allreduce([1, 2], "sum"), "allreduce: expected a numpy or cupy array, got list"),
            (lambda: comm.broadcast(x, root=1), "broadcast root=1 is out of range for a world of 1 ranks"),
            (lambda: comm.broadcast(x, root=True), "broadcast root=True is out of range for a world of 1 ranks"),
            (lambda: comm.device_handle(-1), "device_handle: nbytes=-1 must be a non-negative integer or None"),
            (lambda: comm.device_handle(), "device_handle() is for kernels, and the cpu back-end runs none: "
                                           "call comm.allreduce / broadcast / barrier"),
            (lambda: comm.wait(None), "wait() is for kernels, and the cpu back-end runs none"),
        ]:
            with pytest.raises(cl.ConfigError) as info:
                call()
            assert str(info.value) == message
        comm.check()  # no channel failed
    finally:
        w.close()
    assert comm.closed


def test_rings_handle_layout():
    """The by-value handle: {const Ring* rings; u32 count; u32 pad} (nvcc checks it in test_abi.py)."""
    from circuslink.collectives._layout import RING, RINGS

    assert (RINGS.size, RINGS.align, RINGS.offsets) == (16, 8, {"rings": 0, "count": 8, "pad": 12})
    h = RINGS.pack(rings=0x7F0012345600, count=8)
    raw = np.frombuffer(h.tobytes(), dtype=np.uint8)
    assert int.from_bytes(raw[:8].tobytes(), "little") == 0x7F0012345600 and raw[8] == 8 and h.dtype.isalignedstruct
    from circuslink.channels.protocol import HANDLE

    assert RING.size == 2 * HANDLE.size + 24  # right, left (channel handles), scratch, piece, rank, size


# -- the device API: compiled here, run on the GPU machine -----------------------------------------
def test_kernels_compile_with_the_host_names(tmp_path):
    """nvcc compiles the host API's kernels instantiated under the name expressions the cuda module hands
    NVRTC, the benchmark's timed loop and the users' kernels of the GPU tests below."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    from circuslink.bench.allreduce import _LOOP_TYPES
    from circuslink.collectives._cuda import C_TYPES, OP_TYPES, allreduce_kernel, team_kernel

    lines = [f'#include "{USER_KERNELS.with_name("instantiate.cu")}"']
    # Three of the eleven dtypes (the rest differ only in the C++ type name): nvcc takes ~5 s per dtype.
    for name in ("int8", "float64", "bfloat16"):
        t = C_TYPES[name]
        lines += [f"CL_INSTANTIATE_ALLREDUCE({t}, {allreduce_kernel(name, op)})" for op in OP_TYPES]
        lines += [f"CL_INSTANTIATE_TEAM_ALLREDUCE({t}, {team_kernel('allreduce', name, op)})" for op in OP_TYPES]
        lines += [f"CL_INSTANTIATE_TEAM_REDUCE_SCATTER({t}, {team_kernel('reduce_scatter', name, op)})"
                  for op in OP_TYPES]
    lines += [f"CL_INSTANTIATE_LOOP({t})" for t in _LOOP_TYPES.values()]
    src = tmp_path / "kernels.cu"
    src.write_text("\n".join(lines) + "\n")
    # To PTX, as NVRTC compiles them on the GPU: the names and instantiations are the front end's work. ptxas and
    # the host compiler (two thirds of the time: 87 s against 27 on a 2-core machine) see the same templates in
    # tests/test_device_headers.py (the collectives parts, and every kernel file).
    # Unoptimised (-Xcicc -O0): the names resolve and the templates instantiate all the same (20 -> 3 s).
    proc = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{cl.include_dir()}", "-Xcicc", "-O0", "-ptx",
                           str(src), "-o", str(tmp_path / "kernels.ptx")], capture_output=True, text=True,
                          timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.gpu
def test_device_api_in_users_kernels(spmd):
    """The block form in a fused kernel (one block per ring, a 2-D block), and the grid forms with a grid
    smaller than the rings, a 3-D block, a broadcast and a barrier: x sums, y is root's."""
    job = spmd(2, f"""
        import os
        import numpy as np, cupy as cp
        import circuslink as cl
        from circuslink import collectives
        w = cl.init()
        rng = np.random.default_rng(int(os.environ["CIRCUSLINK_TEST_SEED"]))
        comm = collectives.Comm(w, rings=8)
        mod = cl.compile(open({str(USER_KERNELS)!r}).read(),
                         name_expressions=["fused<float>", "grid_calls<unsigned int>"])
        stream = cp.cuda.Stream(non_blocking=True)
        status = cp.zeros(1, dtype=cp.int32)

        # block form: block b reduces its part over rings[b]
        n = 50_000
        x = cp.zeros(n, dtype=cp.float32)
        cp.cuda.get_current_stream().synchronize()
        handle = comm.device_handle()
        assert handle.dtype.itemsize == 16 and int(handle["count"]) == 8
        mod.get_function("fused<float>")((int(handle["count"]),), (32, 4), (handle, np.int32(w.rank), x,
                                         np.uint64(n), status), stream=stream)
        comm.wait(stream, "fused")
        assert int(status.get()[0]) == 0
        i = np.arange(n)
        assert np.array_equal(x.get(), 2 * sum(r + 1 for r in range(w.size)) * (i % 1000).astype(np.float32))

        # grid forms: 3 blocks of 16 x 4 x 2 over 8 bandwidth rings, then 2 blocks over the 1 LL ring
        fn = mod.get_function("grid_calls<unsigned int>")
        for count, m, grid in [(300_001, 70_003, 3), (40, 17, 2)]:
            xs = [rng.integers(0, 1 << 32, size=count, dtype=np.uint32) for _ in range(w.size)]
            ys = [rng.integers(0, 1 << 32, size=m, dtype=np.uint32) for _ in range(w.size)]
            root = w.size - 1
            x, y = cp.asarray(xs[w.rank]), cp.asarray(ys[w.rank])
            cp.cuda.get_current_stream().synchronize()
            handle = comm.device_handle(x.nbytes)
            assert grid <= w.backend.max_blocks(fn, 128)
            fn((grid,), (16, 4, 2), (handle, x, np.uint64(count), y, np.uint64(m), np.uint32(root), status),
               stream=stream)
            comm.wait(stream, "grid_calls")
            assert int(status.get()[0]) == 0
            assert np.array_equal(x.get(), sum(xs[1:], xs[0])), count
            assert np.array_equal(y.get(), ys[root]), m
        comm.close()
        print("ok", w.rank)
        w.close()
    """, backend="cuda", job_timeout=300).check()
    assert job.stdout.count("ok") == 2


@pytest.mark.gpu
def test_team_in_users_kernels(spmd):
    """comm.device_team() in a user's co-resident grid: an in-kernel all-reduce by size (one-shot, then two-shot
    over a stage smaller than the message), the symmetric form on the stage, a reduce-scatter and barriers."""
    job = spmd(2, f"""
        import numpy as np, cupy as cp
        import circuslink as cl
        from circuslink import collectives
        w = cl.init()
        comm = collectives.Comm(w, stage_bytes=1 << 16)
        assert comm.shares_memory
        mod = cl.compile(open({str(USER_KERNELS)!r}).read(), name_expressions=["team_fused<float>"])
        fn = mod.get_function("team_fused<float>")
        stream = cp.cuda.Stream(non_blocking=True)
        team = comm.device_team()
        for n, m, grid in [(1000, 100, 1), (200_000, 16_000, 4)]:
            x, y = cp.zeros(n, dtype=cp.float32), cp.zeros(m, dtype=cp.float32)
            part = cp.zeros(n // w.size, dtype=cp.float32)
            status = cp.zeros(1, dtype=cp.int32)
            cp.cuda.get_current_stream().synchronize()
            w.backend.launch_resident(fn, grid, (128, 2), (team, np.int32(w.rank), x, np.uint64(n), y, np.uint64(m),
                                                          part, status), stream=stream)
            comm.wait(stream, "team_fused")
            assert int(status.get()[0]) == 0
            i = np.arange(n)
            want = sum(r + 1 for r in range(w.size)) * (i % 1000).astype(np.float32)
            assert np.array_equal(x.get(), want), n
            assert np.array_equal(y.get(), np.full(m, w.size, np.float32)), m
            k = n // w.size
            assert np.array_equal(part.get(), want[w.rank * k:(w.rank + 1) * k]), n   # every rank's x is the same
        comm.close()
        print("ok", w.rank)
        w.close()
    """, backend="cuda", job_timeout=300).check()
    assert job.stdout.count("ok") == 2


# -- circuslink bench allreduce ---------------------------------------------------------------------
def test_bench_allreduce_cpu(tmp_path):
    import json
    import os
    import sys

    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "allreduce", "--backend", "cpu", "-n", "3",
                           "--sizes", "8,4K", "--iters", "2", "--warmup", "1", "--samples", "10",
                           "--json", str(tmp_path / "r.json"),
                           "--trace", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=170,
                          cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["nranks"] == 3 and res["backend"] == "cpu"
    assert sorted((r["bytes"], r["impl"]) for r in res["rows"]) == [
        (b, a) for b in (8, 4096) for a in ("oneshot", "ring", "twoshot")]
    assert all(r["verified"] and r["iters"] == 2 and r["samples"] == 10 for r in res["rows"])
    assert all(r["min_time_us"] <= r["time_us"] and r["busbw_GBps"] == r["algbw_GBps"] * 4 / 3 for r in res["rows"])
    assert [r["impl"] for r in res["rows"] if r["picked"]] == ["oneshot", "oneshot"]  # the switch table at 3 ranks
    assert [t["target"] for t in res["meta"]["targets"]][0] == "8 B <= 6x the relaxed floor"
    trace = json.loads((tmp_path / "t.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("name") == "allreduce" and e["ph"] == "X"]
    assert sorted({e["pid"] for e in spans}) == [0, 1, 2] and len(spans) == 3 * 5  # 5 traced operations per rank
    assert (tmp_path / "t.png").exists()


def test_bench_allreduce_refuses_a_wrong_result(monkeypatch, tmp_path):
    """The benchmark's exact check can fail: an all-reduce that is off by one in one element is reported."""
    import argparse

    from circuslink.bench import allreduce as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--backend", "cpu", "--sizes", "64", "--iters", "1", "--warmup", "0",
                              "--json", str(tmp_path / "r.json")])
    real = collectives.Comm.allreduce

    def off_by_one(self, array, op="sum", **kw):
        out = real(self, array, op, **kw)
        out[-1] += 1
        return out

    monkeypatch.setattr(collectives.Comm, "allreduce", off_by_one)
    w = cl.init(backend="cpu")
    try:
        with pytest.raises(cl.ChannelError, match=r"allreduce \(ring\) of 64 B: wrong result on rank\(s\) \[0\]"):
            bench._run(w, args)
    finally:
        w.close()


# -- the cuda module's ordering, on fake streams (runs here) ---------------------------------------
class _FakeStream:
    """Just enough of a cupy Stream to log which stream each operation was issued on."""

    def __init__(self, cp, ptr):
        self.cp, self.ptr = cp, ptr

    def __enter__(self):
        self.cp.current.append(self)
        return self

    def __exit__(self, *exc):
        self.cp.current.pop()

    def record(self):
        self.cp.log.append(("record", self.ptr))
        return ("event", self.ptr)

    def wait_event(self, ev):
        self.cp.log.append(("wait", self.ptr, ev[1]))

    def synchronize(self):
        self.cp.log.append(("sync", self.ptr))

    @property
    def done(self):  # the backend's bounded wait polls this: the host waits for this stream's work
        self.cp.log.append(("sync", self.ptr))
        return True


class _FakeEvent(list):
    """A cupy Event that remembers the stream it was last recorded on (an ("event", ptr) pair)."""

    def __init__(self, cp):
        super().__init__(("event", None))
        self.cp = cp

    def record(self, stream):
        self.cp.log.append(("record", stream.ptr))
        self[1] = stream.ptr


class _FakeCupy:
    def __init__(self):
        import types

        self.log: list = []
        self.null = _FakeStream(self, 0)
        self.current = [self.null]
        self.cuda = types.SimpleNamespace(get_current_stream=lambda: self.current[-1])
        self.uint64, self.uint8 = np.uint64, np.uint8

    def array(self, a, copy=True, order="C", dtype=None):
        self.log.append(("copy", self.current[-1].ptr))
        return np.array(a, copy=True, order=order, dtype=dtype)


class _FakeStatus:
    def __init__(self, cp):
        self.cp = cp

    def fill(self, v):
        self.cp.log.append(("fill", self.cp.current[-1].ptr))

    def get(self):
        return np.zeros(1, np.int32)


def test_cuda_collectives_order_their_stream_after_the_callers(rng):
    """uint64 max came out wrong at 4 ranks on 2 GPUs: the input copy and the status reset ran on
    CuPy's null stream, the kernel on the world's non-blocking stream, with nothing ordering them,
    so a kernel could reduce a buffer that had not been written yet. Every operation of a call must
    run on the collective stream, after the caller's stream."""
    import types

    from circuslink.collectives._cuda import Collectives

    cp = _FakeCupy()
    coll = object.__new__(Collectives)
    coll.cp = cp
    coll.stream = _FakeStream(cp, 7)
    from circuslink.backends.cuda import CudaBackend

    backend = object.__new__(CudaBackend)  # the real after_caller() on the fake streams
    backend.xp, backend.stream, backend._caller_done = cp, coll.stream, _FakeEvent(cp)
    backend.max_blocks = lambda kernel, threads, shared=0: 1
    coll.host_limit = 5.0
    coll.world = types.SimpleNamespace(size=4, rank=0, backend=backend)
    coll.status = _FakeStatus(cp)
    coll.ll_ring = coll.bw_ring = types.SimpleNamespace(channels=None)
    coll.team = None  # the ring path (ranks that share no memory)
    rings = types.SimpleNamespace(handle=np.zeros((), np.uint64)[()], count=1)
    coll.ll = coll.bw = rings

    def launch(grid, block, args, stream):
        cp.log.append(("launch", stream.ptr))

    coll._function = lambda name, dtype_name: launch
    x = rng.integers(0, np.iinfo(np.uint64).max, size=1000, dtype=np.uint64, endpoint=True)
    for call in (lambda: coll.allreduce(x, "max"), lambda: coll.broadcast(x, 1), coll.barrier):
        cp.log.clear()
        call()
        launch_at = cp.log.index(("launch", 7))
        before = cp.log[:launch_at]
        assert ("wait", 7, 0) in before, cp.log  # the collective stream waits for the caller's
        assert all(op[1] == 7 for op in before if op[0] in ("copy", "fill")), cp.log
        assert ("sync", 7) in cp.log[launch_at:], cp.log


@pytest.mark.parametrize("record, message", [
    ([0, 0, 0, 0], None),
    ([2, 3, 5, 9], r"rank 1: the device wait for rank 3's one-shot slot \(chunk 5\), call 9, timed out"),
    ([3, 1, 7, 0], r"the device wait for rank 1's grid barrier \(block 7\), call 0, timed out"),
    ([4, 1, 0, 0], r"more than the stage's 4096 bytes"),
    # claimed, fields not yet published (read while a block still writes them): a failure all the same
    ([0xFFFFFFFF, 0, 0, 0], r"rank 1: a device wait failed \(its record was still being written\)"),
])
def test_the_teams_error_record_is_read_as_the_device_writes_it(record, message):
    """The device claims the record, fills peer, slot and call, then publishes what failed (team_fail): every
    state the host can see is one line naming the rank, or nothing."""
    import types

    from circuslink.collectives._cuda import DeviceTeam

    team = object.__new__(DeviceTeam)
    team.world = types.SimpleNamespace(rank=1)
    team.handle = {"stage_bytes": 4096}
    team.error = types.SimpleNamespace(get=lambda: np.array(record, dtype=np.uint32))
    if message is None:
        team.check("allreduce")
    else:
        with pytest.raises(cl.ChannelError, match=message):
            team.check("allreduce")
