"""The pull scheme's cuFFT callback plumbing that runs without a GPU: which library it binds, and the form of its
device functions (the GPU tests run them: tests/test_fft.py::test_plans_match_numpy_on_gpu)."""

from __future__ import annotations

import re

import pytest

from circuslink.apps.fft import _cuda
from circuslink.apps.fft import _cufft_callback as cb

MAPS = """\
7f00-7f01 r-xp 00000000 08:01 11 /usr/lib/libc.so.6
7f10-7f11 r-xp 00000000 08:01 12 /opt/venv/lib/python3.12/site-packages/nvidia/cufft/lib/libcufftw.so.12
7f20-7f21 r-xp 00000000 08:01 13 /opt/venv/lib/python3.12/site-packages/nvidia/cufft/lib/libcufft.so.12
7f30-7f31 rw-p 00000000 00:00 0
"""


def test_the_library_is_the_one_already_loaded_not_cufftw():
    assert cb.library_path(MAPS).endswith("/nvidia/cufft/lib/libcufft.so.12")
    assert cb.library_path(MAPS.replace("libcufft.so.12", "libcublas.so.12")) is None
    assert cb.library_path("") is None


@pytest.mark.parametrize("source, name", [(_cuda._PULL_CALLBACK, "circuslink_fft_pull"),
                                          (_cuda._CANARY_CALLBACK, "circuslink_fft_canary")])
def test_callbacks_are_cpp_device_functions_of_the_load_signature(source, name):
    # cuFFT 12 (CUDA 13) failed to plan with an extern "C" callback (CUFFT_INTERNAL_ERROR) and linked the same
    # function compiled as C++, found by its plain name (one H100, 2026-12-07)
    assert 'extern "C"' not in source
    signature = re.search(r"__device__ ELEMENT (\w+)\(void\* dataIn, unsigned long long offset, void\* callerInfo,"
                          r"\s+void\* sharedPtr\)", source)
    assert signature and signature.group(1) == name, source
    for itemsize, element in cb.ELEMENT.items():
        assert cb.LOAD_COMPLEX[itemsize] in (0, 1) and element in ("float2", "double2")
