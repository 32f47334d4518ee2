"""Collectives: ring all-reduce / broadcast / barrier at 1..8 ranks with fresh random data.

The algorithms are checked twice: in one process over bounded in-memory FIFOs (threads as
ranks; the buffers are tiny so the flow-control argument is exercised), and as real ranks
over circuslink channels (spmd).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import circuslink as cl
from circuslink.collectives import _algorithms as alg

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
def test_ring_allreduce_threads(n):
    rng = np.random.default_rng()
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


def test_segments_cover_everything_in_aligned_units():
    rng = np.random.default_rng()
    for _ in range(300):
        n, item, parts = int(rng.integers(0, 5000)), int(rng.choice([1, 2, 4, 8])), int(rng.integers(1, 9))
        seg = alg.segments(n, item, parts)
        assert seg[0][0] == 0 and seg[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(seg, seg[1:], strict=False))
        assert all((lo * item) % 16 == 0 for lo, _ in seg)  # 16-byte aligned starts
        sizes = [hi - lo for lo, hi in seg[:-1]]
        assert not sizes or max(sizes) - min(sizes) <= 16 // item


def test_all_negative_max_min_is_not_zero():
    # A max that started from 0 instead of the first operand would return zeros here.
    rng = np.random.default_rng()
    for dtype in (np.int32, np.int64, np.float32, np.float64):
        inputs = [_random(rng, dtype, (97,), negative=True) for _ in range(3)]
        for op in ("max", "min"):
            got = _run_ranks(3, lambda r, right, left, inputs=inputs, op=op: alg.ring_allreduce(
                r, 3, right, left, inputs[r], op, piece=8), capacity=16)
            assert np.array_equal(got[0], _expected(inputs, op))
            assert np.all(got[0] < 0)


def test_shape_is_kept_and_input_untouched():
    rng = np.random.default_rng()
    inputs = [_random(rng, np.int32, (5, 7)) for _ in range(4)]
    before = [x.copy() for x in inputs]
    got = _run_ranks(4, lambda r, right, left: alg.ring_allreduce(r, 4, right, left, inputs[r], "sum", 12), 24)
    assert got[2].shape == (5, 7)
    assert np.array_equal(got[2], _expected(inputs, "sum"))
    assert all(np.array_equal(a, b) for a, b in zip(inputs, before, strict=True))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_ring_broadcast_and_barrier_threads(n):
    rng = np.random.default_rng()
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


def _have_channels() -> bool:
    try:
        from circuslink.channels import open  # noqa: F401
    except ImportError:
        return False
    return True


needs_channels = pytest.mark.skipif(not _have_channels(), reason="circuslink.channels is not there yet")

_SPMD_BODY = """
    import numpy as np
    import circuslink as cl
    from circuslink import collectives

    w = cl.init()
    rng = np.random.default_rng()
    n, r = w.size, w.rank
    comm = collectives.Comm(w, depth_bytes=256)   # small: many pieces, flow control exercised
    for dtype in (np.int8, np.uint16, np.int32, np.uint64, np.float32, np.float64):
        for op in ("sum", "max", "min"):
            count = int(w.broadcast_object(int(rng.integers(1, 700))))
            negative = op != "sum" and dtype not in (np.uint16, np.uint64)
            seed = int(w.broadcast_object(int(rng.integers(1 << 62))))
            per_rank = []
            for k in range(n):   # every rank can rebuild every rank's input from the shared seed
                g = np.random.default_rng(seed + k)
                if np.dtype(dtype).kind == "f":
                    x = (g.standard_normal(count) * 100).astype(dtype)
                    x = -np.abs(x) - 1 if negative else x
                else:
                    info = np.iinfo(dtype)
                    hi = 0 if negative else info.max
                    x = g.integers(info.min, hi, size=count, dtype=dtype)
                per_rank.append(x)
            got = comm.allreduce(per_rank[r], op)
            fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
            want = per_rank[0].copy()
            for x in per_rank[1:]:
                want = fn(want, x)
            if np.dtype(dtype).kind == "f" and op == "sum":
                bound = (n - 1) * np.finfo(dtype).eps * np.sum(np.abs(np.array(per_rank, np.float64)), axis=0)
                assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= 2 * bound + 1e-30)
            else:
                assert np.array_equal(got, want), (dtype, op)
            same = w.allgather_object(got.tobytes())
            assert all(s == same[0] for s in same), "ranks disagree"
    root = n - 1
    src = rng.integers(0, 1 << 30, size=333, dtype=np.int64)
    got = comm.broadcast(src if r == root else np.zeros_like(src), root=root)
    assert w.allgather_object(got.tobytes()) == [w.broadcast_object(src.tobytes(), root=root)] * n
    collectives.barrier(comm)
    total = collectives.allreduce(w, np.array([r + 1], dtype=np.int64))   # module API on the world
    assert int(total[0]) == n * (n + 1) // 2
    comm.close()
    print("ok", r)
    w.close()
"""


@needs_channels
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_collectives_over_channels(spmd, n):
    job = spmd(n, _SPMD_BODY, job_timeout=170).check()
    assert job.stdout.count("ok") == n


@needs_channels
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
    assert "does not match rank" in job.stdout


def test_device_collectives_compile_and_match_the_ring_layout(tmp_path):
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    from circuslink.collectives._device import kernel_source, ring_dtype

    rd = ring_dtype()
    checks = "\n".join([
        "#include <cstddef>",
        f"static_assert(sizeof(cc::Ring) == {rd.itemsize}, \"Ring size\");",
        *(f"static_assert(offsetof(cc::Ring, {f}) == {rd.fields[f][1]}, \"{f}\");" for f in rd.names),
    ])
    src = tmp_path / "coll.cu"
    # Two of the ten dtypes (the rest differ only in the C++ type name): nvcc takes ~5 s per dtype.
    src.write_text(kernel_source(types=("int8", "float64")) + checks + "\n")
    proc = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{cl.include_dir()}", "-c", str(src), "-o",
                           str(tmp_path / "coll.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_bench_allreduce_cpu(tmp_path):
    import json
    import os
    import subprocess
    import sys

    if not _have_channels():
        pytest.skip("circuslink.channels is not there yet")
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "allreduce", "--backend", "cpu", "-n", "3",
                           "--sizes", "8,4K", "--iters", "2", "--warmup", "1", "--json", str(tmp_path / "r.json"),
                           "--trace", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=170,
                          cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["nranks"] == 3 and [r["bytes"] for r in res["rows"]] == [8, 4096]
    for r in res["rows"]:
        assert r["verified"] and r["time_us"] > 0
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 4 / 3)
    trace = json.loads((tmp_path / "t.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1, 2}
    assert (tmp_path / "t.png").exists()


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


def test_cuda_collectives_order_their_stream_after_the_callers():
    """uint64 max came out wrong at 4 ranks on 2 GPUs: the input copy and the status reset ran on
    CuPy's null stream, the kernel on the world's non-blocking stream, with nothing ordering them,
    so a kernel could reduce a buffer that had not been written yet. Every operation of a call must
    run on the collective stream, after the caller's stream."""
    import types

    from circuslink.collectives._device import CudaCollectives

    cp = _FakeCupy()
    coll = object.__new__(CudaCollectives)
    coll.cp = cp
    coll.stream = _FakeStream(cp, 7)
    from circuslink.backends.cuda import CudaBackend

    backend = object.__new__(CudaBackend)  # the real after_caller() on the fake streams
    backend.xp, backend.stream, backend._caller_done = cp, coll.stream, _FakeEvent(cp)
    backend.max_blocks = lambda kernel, threads, shared=0: 1
    coll._host_limit = 5.0
    coll.world = types.SimpleNamespace(size=4, rank=0, backend=backend)
    coll.status = _FakeStatus(cp)
    coll.ll_ring = coll.bw_ring = types.SimpleNamespace(channels=None)
    rings = types.SimpleNamespace(ptr=1, count=1)
    coll.ll = coll.bw = rings

    def launch(grid, block, args, stream):
        cp.log.append(("launch", stream.ptr))

    coll._module = lambda name: types.SimpleNamespace(get_function=lambda fn: launch)
    rng = np.random.default_rng()
    x = rng.integers(0, np.iinfo(np.uint64).max, size=1000, dtype=np.uint64, endpoint=True)
    for call in (lambda: coll.allreduce(x, "max"), lambda: coll.broadcast(x, 1), coll.barrier):
        cp.log.clear()
        call()
        launch_at = cp.log.index(("launch", 7))
        before = cp.log[:launch_at]
        assert ("wait", 7, 0) in before, cp.log  # the collective stream waits for the caller's
        assert all(op[1] == 7 for op in before if op[0] in ("copy", "fill")), cp.log
        assert ("sync", 7) in cp.log[launch_at:], cp.log
