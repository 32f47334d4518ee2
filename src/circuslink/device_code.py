"""Compile user CUDA C++ against circuslink's device headers.

:func:`compile` hands the source to NVRTC (through CuPy) with ``include/`` on the
include path and the current GPU's architecture (``sm_90a`` on Hopper). CuPy caches
the compiled module on disk keyed by source and options; since the source only
``#include``s our headers, a hash of every header is folded into the source so that
changing a header invalidates the cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import BackendError, CompileError, ConfigError

_SLOW_COMPILE_S = 15.0  # a compile still running after this long says so (compile)

INCLUDE_DIR = Path(__file__).parent / "include"


def include_dir() -> str:
    """The folder to put on a compiler's include path (holds ``circuslink/*.cuh``)."""
    return str(INCLUDE_DIR)


@functools.lru_cache(maxsize=1)
def headers_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(INCLUDE_DIR.rglob("*.cuh")):
        h.update(path.relative_to(INCLUDE_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


DEFINES_VAR = "CIRCUSLINK_DEVICE_DEFINES"
_DEFINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=[^\s,]+)?")


def defines_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The ``-D`` options that ``CIRCUSLINK_DEVICE_DEFINES`` asks for: comma-separated ``NAME`` or ``NAME=VALUE``,
    defined in every device compile of the process. It reaches the device code's experiment switches (for
    example ``CIRCUSLINK_RDV_TEAM=8``) from any benchmark or application, so that an A/B run needs no script of
    its own. Raises :class:`~circuslink.ConfigError` naming the variable and the item it cannot read."""
    text = (os.environ if env is None else env).get(DEFINES_VAR, "")
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if not _DEFINE.fullmatch(item):
            raise ConfigError(f"{DEFINES_VAR}: {item!r} is not NAME or NAME=VALUE (a C identifier, a value without "
                              f"spaces or commas)")
        out.append(f"-D{item}")
    return out


def arch_flag(device: int | None = None) -> str:
    """``-arch=sm_XY`` for the current GPU, with the ``a`` suffix on Hopper (sm_90a)."""
    import cupy

    dev = cupy.cuda.Device(device) if device is not None else cupy.cuda.Device()
    major, minor = dev.compute_capability[:-1], dev.compute_capability[-1]
    suffix = "a" if (major, minor) == ("9", "0") else ""
    return f"-arch=sm_{major}{minor}{suffix}"


def compile(  # noqa: A001 - the public name mirrors what it does
    source: str,
    name_expressions: Sequence[str] | None = None,
    options: Sequence[str] = (),
    backend: str = "nvrtc",
):
    """Compile ``source`` and return a ``cupy.RawModule``; ``module.get_function(name)`` gives kernels.

    ``CIRCUSLINK_DEVICE_DEFINES`` (comma-separated ``NAME`` or ``NAME=VALUE``) adds macros to every compile
    (:func:`defines_from_env`). Raises :class:`~circuslink.CompileError` with the compiler's log when the source
    is wrong, and :class:`~circuslink.BackendError` when CuPy or a GPU is missing.
    """
    try:
        import cupy
    except ImportError:
        raise BackendError("circuslink.compile needs CuPy and a GPU (the cuda back-end)") from None
    from .backends import cuda_device_count

    if cuda_device_count() == 0:
        raise BackendError("circuslink.compile needs a visible GPU; none was found (CuPy is installed)")
    opts = ["-std=c++17", f"-I{include_dir()}", "-DCIRCUSLINK_NVRTC=1"]
    if not any(o.startswith(("-arch", "--gpu-architecture")) for o in options):
        opts.append(arch_flag())
    opts += defines_from_env() + list(options)
    tagged = f"// circuslink headers {headers_digest()}\n{source}"
    # A first compile on a machine can take minutes (the QCD solver's double-precision modules took over 60 s on
    # one H100, 2026-12-07): say so once instead of sitting silent; CuPy's cache makes later processes quick.
    note = threading.Timer(_SLOW_COMPILE_S, lambda: print(
        f"circuslink: still compiling device code after {_SLOW_COMPILE_S:g} s (NVRTC, {len(source) >> 10} KiB of "
        "source; the first run on a machine, CuPy caches it for later ones)", file=sys.stderr, flush=True))
    note.daemon = True
    note.start()
    try:
        module = cupy.RawModule(
            code=tagged, options=tuple(opts), backend=backend,
            name_expressions=tuple(name_expressions) if name_expressions else None,
        )
        module.compile()
    except cupy.cuda.compiler.CompileException as exc:
        log = exc.get_message() if hasattr(exc, "get_message") else str(exc)
        raise CompileError(f"device code failed to compile:\n{log}") from None
    finally:
        note.cancel()
    return module
