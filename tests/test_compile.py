"""circuslink.compile: user CUDA C++ with our headers on the include path."""

from __future__ import annotations

import pytest

import circuslink as cl


def test_include_dir_holds_the_headers():
    from pathlib import Path

    assert (Path(cl.include_dir()) / "circuslink" / "detail" / "sync.cuh").is_file()


@pytest.mark.gpu
def test_compile_and_run_with_our_headers():
    import cupy as cp
    import numpy as np

    module = cl.compile(r'''
        #include <circuslink/detail/sync.cuh>
        extern "C" __global__ void stamp(unsigned int* out, unsigned int v) {
          circuslink::detail::st_release_sys(out + threadIdx.x, v + threadIdx.x);
        }
    ''')
    out = cp.zeros(32, dtype=cp.uint32)
    v = int(np.random.default_rng().integers(1, 1 << 30))
    module.get_function("stamp")((1,), (32,), (out, np.uint32(v)))
    assert out.get().tolist() == [v + i for i in range(32)]


@pytest.mark.gpu
def test_compile_error_shows_the_log():
    with pytest.raises(cl.CompileError, match="undefined_symbol_xyz"):
        cl.compile('extern "C" __global__ void k() { undefined_symbol_xyz(); }')


def test_compile_without_cupy_or_gpu_is_a_clear_error():
    from circuslink.backends import cuda_device_count

    if cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(cl.Error):
        cl.compile('extern "C" __global__ void k() {}')
