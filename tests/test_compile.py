"""circuslink.compile: user CUDA C++ with our headers on the include path."""

from __future__ import annotations

import pytest

import circuslink as cl


def test_include_dir_holds_the_headers():
    from pathlib import Path

    assert (Path(cl.include_dir()) / "circuslink" / "detail" / "sync.cuh").is_file()


# The GPU tests run in a child process: a CUDA context in pytest's own process would make it a client
# of the run's MPS server for the rest of the session, so a fault in any later job would leave the
# server refusing every job after it (it recovers only once all its clients have exited).
@pytest.mark.gpu
def test_compile_and_run_with_our_headers(spmd):
    job = spmd(1, r"""
        import cupy as cp, numpy as np, circuslink as cl
        module = cl.compile('''
            #include <circuslink/detail/sync.cuh>
            extern "C" __global__ void stamp(unsigned int* out, unsigned int v) {
              circuslink::detail::st_release_sys(out + threadIdx.x, v + threadIdx.x);
            }
        ''')
        out = cp.zeros(32, dtype=cp.uint32)
        v = int(np.random.default_rng().integers(1, 1 << 30))
        module.get_function("stamp")((1,), (32,), (out, np.uint32(v)))
        assert out.get().tolist() == [v + i for i in range(32)], out.get().tolist()
        print("stamped")
    """, backend="cuda", job_timeout=120).check()
    assert "stamped" in job.stdout


@pytest.mark.gpu
def test_compile_error_shows_the_log(spmd):
    job = spmd(1, r"""
        import circuslink as cl
        try:
            cl.compile('extern "C" __global__ void k() { undefined_symbol_xyz(); }')
        except cl.CompileError as exc:
            assert "undefined_symbol_xyz" in str(exc), exc
            print("refused")
    """, backend="cuda", job_timeout=120).check()
    assert "refused" in job.stdout


def test_compile_without_cupy_or_gpu_is_a_clear_error():
    from circuslink.backends import cuda_device_count

    if cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(cl.Error):
        cl.compile('extern "C" __global__ void k() {}')


def test_device_defines_from_the_environment():
    from circuslink.device_code import defines_from_env

    assert defines_from_env({}) == []
    env = {"CIRCUSLINK_DEVICE_DEFINES": "CIRCUSLINK_RDV_TEAM=8, FLAG ,X_1=-3,"}
    assert defines_from_env(env) == ["-DCIRCUSLINK_RDV_TEAM=8", "-DFLAG", "-DX_1=-3"]


@pytest.mark.parametrize("bad", ["1ABC", "A B", "A=", "A=1 2", "A;B", "=3"])
def test_device_defines_that_cannot_be_read_fail_in_one_line_naming_the_variable(bad):
    from circuslink.device_code import defines_from_env

    with pytest.raises(cl.ConfigError) as err:
        defines_from_env({"CIRCUSLINK_DEVICE_DEFINES": f"GOOD=1,{bad}"})
    text = str(err.value)
    assert "CIRCUSLINK_DEVICE_DEFINES" in text and repr(bad.strip()) in text and "\n" not in text


def test_a_slow_compile_says_so_once_and_a_quick_one_says_nothing(monkeypatch, capsys):
    """A first compile on a machine can take minutes; the user is told once that it is still compiling, not left
    with a silent process. A stand-in for CuPy (no GPU needed) whose compile takes as long as the test says."""
    import sys
    import threading
    import types

    from circuslink import backends, device_code

    done = threading.Event()

    class Module:
        delay = 0.0

        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def compile(self):
            done.wait(self.delay)

    class CompileException(Exception):
        pass

    fake = types.ModuleType("cupy")
    fake.RawModule = Module
    fake.cuda = types.SimpleNamespace(compiler=types.SimpleNamespace(CompileException=CompileException))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(backends, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(device_code, "arch_flag", lambda device=None: "-arch=sm_90a")
    monkeypatch.setattr(device_code, "_SLOW_COMPILE_S", 0.05)

    Module.delay = 0.3
    device_code.compile("// slow\n" * 2048)
    err = capsys.readouterr().err
    assert err.count("still compiling device code after 0.05 s") == 1 and "16 KiB of source" in err, err

    Module.delay = 0.0
    device_code.compile("// quick")
    import time

    time.sleep(0.15)  # past the note's time: a cancelled note never prints
    assert capsys.readouterr().err == ""
