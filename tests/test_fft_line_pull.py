"""The FFT pull's own kernels (apps/fft/_line_pull.py, line_pull.cu): their CUDA source run on the cpu by an
emulation that makes each block's threads host threads (CI checks the index maths without a GPU), and the kernels
themselves on a GPU; both against a reference transform, every power of two of the one-pass kernels and
four-step splits, both precisions and directions, partial tiles and clusters, sources scattered in a random order."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from circuslink.apps.fft import _line_pull

HARNESS = Path(__file__).parent / "data" / "fft_line_pull_emulation.cpp"
CXX = shutil.which("g++") or shutil.which("c++")


def test_fits_takes_one_axis_of_a_power_of_two():
    assert [n for n in range(0, 5000) if _line_pull.fits(n, 1)] == [1 << k for k in range(1, 13)]
    assert _line_pull.fits(1 << 20, 1) and not _line_pull.fits(1 << 21, 1) and not _line_pull.fits(64, 2)
    for n in [1 << k for k in range(11, 21)]:
        m1, m2 = _line_pull.halves(n)
        assert m1 * m2 == n and m2 <= m1 <= 2 * m2 and m1 <= _line_pull.MAX_POINTS
    # by default: one pass at either precision, the four-step at complex64 (measured: _line_pull.faster)
    assert _line_pull.faster(1024, 16) and _line_pull.faster(16384, 8) and not _line_pull.faster(16384, 16)
    for n in (2, 8, 512, 1024):
        for itemsize in (8, 16):
            tile, each, threads = _line_pull.shape(n, itemsize)
            assert tile * itemsize == _line_pull.TILE_BYTES and each >= 8 and threads * each == tile * n
            assert threads <= _line_pull.THREADS
    # the cluster kernel: a run of up to 128 KiB a block, up to 256 KiB two, a cluster of 64 bytes of runs
    sizes = [1 << k for k in range(1, 17)]
    assert [n for n in sizes if _line_pull.cluster_fits(n, 8)] == [2048, 4096, 8192, 16384]
    assert [n for n in sizes if _line_pull.cluster_fits(n, 16)] == [2048, 4096, 8192, 16384]
    assert _line_pull.cluster_blocks(8192, 16) == 1 and _line_pull.cluster_blocks(16384, 16) == 2
    for n, itemsize in ((2048, 16), (8192, 16), (16384, 16), (8192, 8), (16384, 8)):
        tile, each, threads = _line_pull.shape(n, itemsize, cluster=True)
        blocks = _line_pull.cluster_blocks(n, itemsize)
        assert tile * itemsize == _line_pull.TILE_BYTES and tile * blocks <= 8
        assert each >= 8 and threads * each * blocks == n and threads <= _line_pull.CLUSTER_THREADS


@pytest.mark.skipif(CXX is None, reason="needs a C++20 compiler (.ci/run installs g++)")
def test_the_kernel_source_transforms_every_size_on_the_cpu(tmp_path, seed):
    def emulate(name: str, *args: str, defines: tuple = ()) -> str:
        """Build the harness around the kernel source (with ``defines``), run it, return what it printed."""
        exe = tmp_path / name
        build = subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", f'-DKERNEL_SOURCE="{_line_pull._SOURCE}"',
                                *defines, str(HARNESS), "-o", str(exe)], capture_output=True, text=True, timeout=240)
        assert build.returncode == 0, build.stderr[-3000:]
        got = subprocess.run([str(exe), str(seed), *args], capture_output=True, text=True, timeout=240)
        assert got.returncode == 0 and "FAILED" not in got.stdout, got.stdout + got.stderr
        return got.stdout

    out = emulate("emulation")
    assert out.count("forward") == 44 and out.count("cluster") == 8, out
    assert out.count("rows") == 4, out
    # the cluster kernel's A/B switch: lanes loading 16 bytes of runs a point (its stores then reach fewer blocks)
    out = emulate("emulation-group16", "cluster", defines=("-DCIRCUSLINK_FFT_CLUSTER_GROUP=16",))
    assert out.count("forward") == 12, out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_the_kernel_matches_numpy_on_gpu(rng, dtype, capsys):
    cp = pytest.importorskip("cupy")
    tol = {"complex64": 1e-5, "complex128": 1e-12}[dtype]
    cache: dict = {}
    # one kernel, then the cluster kernel (two blocks a run at 16384 complex128) and the four-step
    for n, cluster in [(1 << k, True) for k in range(1, 15)] + [(2048, False), (8192, False), (16384, False)]:
        runs = int(rng.integers(1, 40 if n <= 1024 else 20))
        gap = int(rng.integers(0, 5))
        order = rng.permutation(n)  # point b's run is row order[b] of the pool
        x = (rng.standard_normal((n, runs)) + 1j * rng.standard_normal((n, runs))).astype(dtype)
        pool = cp.zeros((n, runs + gap), dtype=dtype)
        pool[cp.asarray(order), :runs] = cp.asarray(x)
        e = pool.itemsize
        table = cp.asarray(np.uint64(pool.data.ptr) + order.astype(np.uint64) * np.uint64((runs + gap) * e))
        for inverse in (False, True):
            dst = cp.full(runs * n, np.nan, dtype=dtype)
            _line_pull.make(dst, n, table, inverse, cache, cluster)()
            cp.cuda.get_current_stream().synchronize()
            want = (np.fft.ifft(x.T.astype(np.complex128), axis=1) * n if inverse
                    else np.fft.fft(x.T.astype(np.complex128), axis=1))
            err = float(np.abs(dst.get().reshape(runs, n) - want).max() / np.abs(want).max())
            assert err < tol, (dtype, n, cluster, runs, inverse, err)
    # the cluster kernel on rows in memory (a local stage's transform)
    for n in (2048, 8192, 16384):
        runs = int(rng.integers(1, 20))
        x = (rng.standard_normal((runs, n)) + 1j * rng.standard_normal((runs, n))).astype(dtype)
        for inverse in (False, True):
            dst = cp.full(runs * n, np.nan, dtype=dtype)
            _line_pull.make_rows(dst, cp.asarray(x), n, inverse)()
            wide = x.astype(np.complex128)
            want = np.fft.ifft(wide, axis=1) * n if inverse else np.fft.fft(wide, axis=1)
            err = float(np.abs(dst.get().reshape(runs, n) - want).max() / np.abs(want).max())
            assert err < tol, (dtype, n, "rows", runs, inverse, err)
    assert "did not launch" not in capsys.readouterr().err  # the cluster kernel ran, not the four-step instead


def test_the_four_steps_scratch_is_counted_where_it_runs(monkeypatch):
    """A plan's memory check counts what the pulled transforms allocate: the four-step's scratch array (the size
    of the stage), and nothing for the one-pass, cluster or callback kernels."""
    from circuslink.apps.fft import _cuda

    shape = (3, 5, 4096)  # 15 runs of 4096 points
    cases = {  # kind: {itemsize: scratch bytes}
        "auto": {8: 15 * 4096 * 8, 16: 0},  # auto: the four-step at complex64, the callback at complex128
        "four-step": {8: 15 * 4096 * 8, 16: 15 * 4096 * 16},
        "own": {8: 0, 16: 0},  # the cluster kernel takes 4096 points at either precision
        "callback": {8: 0, 16: 0},
    }
    for kind, want in cases.items():
        monkeypatch.setenv("CIRCUSLINK_FFT_PULL_KERNEL", kind)
        for e, nbytes in want.items():
            assert _cuda.pull_scratch_bytes(shape, 1, e) == nbytes, (kind, e)
            assert _cuda.pull_scratch_bytes((15, 1024), 1, e) == 0, (kind, e)  # one pass
            assert _cuda.pull_scratch_bytes((3, 64, 64), 2, e) == 0, (kind, e)  # two axes: the callback
    monkeypatch.setenv("CIRCUSLINK_FFT_PULL_KERNEL", "own")
    assert _cuda.pull_scratch_bytes((2, 32768), 1, 16) == 2 * 32768 * 16  # beyond the cluster: the four-step


def test_the_kernel_choice_is_read_from_the_environment(monkeypatch):
    from circuslink.apps.fft import _cuda
    from circuslink.errors import ConfigError

    for kind in ("auto", "own", "four-step", "callback"):
        monkeypatch.setenv("CIRCUSLINK_FFT_PULL_KERNEL", kind)
        assert _cuda.pull_kernel() == kind
    monkeypatch.delenv("CIRCUSLINK_FFT_PULL_KERNEL")
    assert _cuda.pull_kernel() == "auto"
    monkeypatch.setenv("CIRCUSLINK_FFT_PULL_KERNEL", "cluster")
    with pytest.raises(ConfigError, match="CIRCUSLINK_FFT_PULL_KERNEL='cluster'"):
        _cuda.pull_kernel()
