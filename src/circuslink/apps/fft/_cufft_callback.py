"""cuFFT plans with a JIT-linked load or store callback, called through ctypes: what the FFT's pull scheme reads
through (a load callback) and what its dev probes of a push (a store callback) write through.

Why not CuPy's ``set_cufft_callbacks(cb_ver="jit")``: on the GPU image of 2026-12-07 (CuPy 14.2.0 on CUDA 13,
cuFFT 12.0) every plan CuPy made with a JIT callback failed with CUFFT_INTERNAL_ERROR, its own one-line example
included, and ``cupyx.scipy.fft.get_fft_plan`` raised AttributeError for 1-D transforms. cuFFT 12 (CUDA 13) added
the callback's symbol name to ``cufftXtSetJITCallback``; cuFFT 11.x takes the older form without it. This module
calls the library CuPy itself loaded, in the form its version declares.

The callback is compiled by NVRTC to LTO IR (``-dlto``); cuFFT links it into its kernels when the plan is made
(``cufftMakePlanMany64``), which takes a while once per plan.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

# cufftXtCallbackType: CUFFT_CB_LD_COMPLEX(_DOUBLE), CUFFT_CB_ST_COMPLEX(_DOUBLE); cufftType: CUFFT_C2C, CUFFT_Z2Z
LOAD_COMPLEX = {8: 0x0, 16: 0x1}
STORE_COMPLEX = {8: 0x4, 16: 0x5}
C2C = {8: 0x29, 16: 0x69}
ELEMENT = {8: "float2", 16: "double2"}
SYMBOL_NAME_SINCE = 12000  # cufftGetVersion() from which cufftXtSetJITCallback takes the symbol's name

_lib: Any = None


class CufftError(RuntimeError):
    pass


def library_path(maps: str) -> str | None:
    """The libcufft CuPy loaded, from the text of /proc/self/maps (not libcufftw)."""
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if os.path.basename(path).startswith("libcufft.so"):
            return path
    return None


def _library() -> Any:
    global _lib
    if _lib is None:
        import cupy.cuda.cufft  # noqa: F401 - loads the library CuPy uses, so that both share one

        try:
            with open("/proc/self/maps") as f:
                path = library_path(f.read())
        except OSError:
            path = None
        names = [path] if path else ["libcufft.so.12", "libcufft.so.11", "libcufft.so"]
        for name in names:
            try:
                _lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise CufftError(f"no libcufft could be loaded (tried {', '.join(names)})")
    return _lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise CufftError(f"{what} returned cufftResult {result}")


def version() -> int:
    v = ctypes.c_int(0)
    _check(_library().cufftGetVersion(ctypes.byref(v)), "cufftGetVersion")
    return v.value


_ir: dict = {}  # (source, name, arch): LTO IR; each plan of a pull links the same callback


def lto_ir(source: str, name: str) -> bytes:
    """``source`` compiled by NVRTC to LTO IR for this GPU (once per process); one line with NVRTC's log where it
    fails."""
    import cupy

    arch = cupy.cuda.Device().compute_capability
    key = (source, name, arch)
    if key not in _ir:
        _ir[key] = _compile(source, name, arch)
    return _ir[key]


def _compile(source: str, name: str, arch: str) -> bytes:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CufftError(f"nvrtcCreateProgram: {err}")
    try:
        opts = [b"-dlto", b"-rdc=true", f"--gpu-architecture=compute_{arch}".encode()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            first = log.decode(errors="replace").strip().splitlines()
            raise CufftError(f"NVRTC could not compile {name}: {first[0] if first else err}")
        err, size = nvrtc.nvrtcGetLTOIRSize(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CufftError(f"nvrtcGetLTOIRSize: {err}")
        ir = b" " * size
        (err,) = nvrtc.nvrtcGetLTOIR(prog, ir)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CufftError(f"nvrtcGetLTOIR: {err}")
        return ir
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class CallbackPlan:
    """``batch`` complex transforms of shape ``dims`` (C order, element size ``itemsize``: 8 or 16) whose
    every input element comes from (``store=False``) or every output element goes through (``store=True``) the
    device function ``symbol`` in ``ir`` (LTO IR; a C++ function, named plainly: cuFFT 12 would not plan with
    an ``extern "C"`` one), called with ``caller_info`` (a device address) as its caller-info argument. Packed,
    or with ``strides`` = (istride, idist, ostride, odist) in elements (cuFFT's advanced layout, the embeddings
    being ``dims``)."""

    def __init__(self, dims: tuple[int, ...], batch: int, itemsize: int, ir: bytes, symbol: str,
                 caller_info: int, strides: tuple[int, int, int, int] | None = None, store: bool = False) -> None:
        lib = _library()
        self._lib = lib
        self.handle = ctypes.c_int(0)
        _check(lib.cufftCreate(ctypes.byref(self.handle)), "cufftCreate")
        try:
            self._ir = ctypes.create_string_buffer(ir, len(ir))
            self._info = (ctypes.c_void_p * 1)(caller_info)  # cuFFT keeps the pointer: held for the plan's life
            kind = (STORE_COMPLEX if store else LOAD_COMPLEX)[itemsize]
            if version() >= SYMBOL_NAME_SINCE:
                self._symbol = ctypes.c_char_p(symbol.encode())
                rc = lib.cufftXtSetJITCallback(self.handle, self._symbol, self._ir, ctypes.c_size_t(len(ir)),
                                               kind, self._info)
            else:
                rc = lib.cufftXtSetJITCallback(self.handle, self._ir, ctypes.c_size_t(len(ir)),
                                               kind, self._info)
            _check(rc, "cufftXtSetJITCallback")
            n = (ctypes.c_longlong * len(dims))(*dims)
            embed = n if strides else None
            istride, idist, ostride, odist = (ctypes.c_longlong(v) for v in (strides or (1, 0, 1, 0)))
            work = ctypes.c_size_t(0)
            _check(lib.cufftMakePlanMany64(self.handle, len(dims), n, embed, istride, idist, embed, ostride, odist,
                                           C2C[itemsize], ctypes.c_longlong(batch), ctypes.byref(work)),
                   "cufftMakePlanMany64")
        except BaseException:
            lib.cufftDestroy(self.handle)
            raise

    def execute(self, data: int, direction: int, stream: int, out: int | None = None) -> None:
        """Into device address ``out`` (default ``data``: in place; the callback supplies the input), on
        ``stream``."""
        _check(self._lib.cufftSetStream(self.handle, ctypes.c_void_p(stream)), "cufftSetStream")
        _check(self._lib.cufftXtExec(self.handle, ctypes.c_void_p(data), ctypes.c_void_p(data if out is None else out),
                                     direction), "cufftXtExec")

    def close(self) -> None:
        if self.handle is not None:
            self._lib.cufftDestroy(self.handle)
            self.handle = None

    def __del__(self) -> None:  # plans live as long as the FFT plan that made them
        try:
            self.close()
        except Exception:
            pass
