"""2-D FFT of a .npy file over R ranks, with transposing puts: ``circuslink fft2``.

    circuslink fft2 --input X.npy --output Y.npy -n R [--backend cpu|cuda] [--inverse]
                    [--layout natural|transposed] [--scheme transpose-put|local-transpose]

X must be a 2-D complex64 or complex128 array whose two dimensions R divides. Rank 0 reads it
and hands every rank its rows (through symmetric memory), the ranks transform, and rank 0
gathers and writes Y (same dtype): numpy.fft.fft2(X) (ifft2 with --inverse); with
``--layout transposed`` Y is the transpose, fft2(X).T, as the ranks hold it without the last
global transpose. Bad input (missing file, not .npy, not 2-D, not complex, a size R does not
divide, a problem too large for memory) is refused with one line before any rank starts where
possible. ``circuslink bench fft`` times the transform on random data against its baselines.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from ..._argtypes import positive_int
from ...errors import ConfigError
from . import LAYOUTS, SCHEMES, Plan, bytes_per_rank, check_dtype, check_shape


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", metavar="X.npy", help="the 2-D complex64/complex128 array to transform (.npy)")
    p.add_argument("--output", metavar="Y.npy", help="where rank 0 writes the result (.npy, same dtype as X)")
    p.add_argument("-n", "--nranks", type=positive_int, default=2,
                   help="ranks to split the rows over (default 2); both dimensions must be divisible by it")
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                   help="back-end (default: cuda when a GPU is present, else cpu)")
    p.add_argument("--inverse", action="store_true", help="inverse transform, numpy's ifft2 (divided by n1*n2)")
    p.add_argument("--layout", choices=LAYOUTS, default="natural",
                   help="natural (default): Y = fft2(X); transposed: Y = fft2(X).T, one global transpose less")
    p.add_argument("--scheme", choices=SCHEMES, default="transpose-put",
                   help="global transpose by transposing puts (default) or local transpose + contiguous puts")


def _argv(args: argparse.Namespace) -> list[str]:
    """This command line again, for the ranks it starts."""
    argv = ["fft2", "-n", str(args.nranks), "--layout", args.layout, "--scheme", args.scheme]
    if args.inverse:
        argv.append("--inverse")
    return argv + ["--input", args.input, "--output", args.output]


def read_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the .npy file ``path`` (the data is not read), or one line saying what is wrong."""
    if not os.path.exists(path):
        raise ConfigError(f"fft2: input file {path!r} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"fft2: input {path!r} is a directory, not a .npy file")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise ConfigError(f"fft2: cannot read {path!r}: {exc.strerror or exc}") from None
    if magic[:2] == b"PK":
        raise ConfigError(f"fft2: {path!r} is an .npz archive: pass one array in a .npy file")
    if magic != b"\x93NUMPY":
        raise ConfigError(f"fft2: {path!r} is not a .npy file (it does not start with numpy's magic string)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"fft2: cannot read {path!r} as a .npy array: {reason}") from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"fft2: {path!r} is an .npz archive: pass one array in a .npy file")
    return tuple(int(d) for d in arr.shape), arr.dtype


def check_input(path: str, nranks: int) -> tuple[tuple[int, int], str]:
    """((n1, n2), dtype name) of a file fft2 can transform on ``nranks`` ranks, or one line saying why not."""
    shape, dtype = read_header(path)
    where = f"fft2: {path}"
    if len(shape) != 2:
        raise ConfigError(f"{where} is {len(shape)}-D (shape {shape}): fft2 takes a 2-D array")
    name = check_dtype(dtype, where)
    return check_shape(shape, nranks, where), name


def _check_output(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"fft2: cannot write --output {path!r}: directory {parent!r} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"fft2: --output {path!r} is a directory")


def run(args: argparse.Namespace) -> int:
    from ... import launcher
    from ...backends import default_backend_name

    backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
    if not args.input or not args.output:
        raise ConfigError("fft2: give --input X.npy and --output Y.npy (circuslink bench fft times random data)")
    if not launcher.inside_job():
        (n1, n2), dtype = check_input(args.input, args.nranks)
        _check_output(args.output)
        from ...backends import uses_gpus

        if not uses_gpus(backend):  # the host's memory is known here; a GPU's is checked by the ranks
            from . import _cpu

            need = args.nranks * bytes_per_rank(n1, n2, dtype, args.nranks, args.scheme, _cpu.EXTRA_SLABS, True)
            free, what = _cpu.free_bytes(None)
            if need > free:
                raise ConfigError(f"fft2: a {n1} x {n2} {dtype} problem over {args.nranks} ranks needs about "
                                  f"{need / (1 << 30):.1f} GiB of {what}, but only {free / (1 << 30):.1f} GiB is "
                                  "free: use complex64 or a smaller size")
        return launcher.relaunch_self(args.nranks, argv=_argv(args), backend=backend)
    import circuslink

    world = circuslink.init(args.backend)
    try:
        transform_file(world, args.input, args.output, args.inverse, args.layout, args.scheme)
    finally:
        world.close()
    return 0


def transform_file(world: Any, src: str, dst: str, inverse: bool = False, layout: str = "natural",
                   scheme: str = "transpose-put") -> None:
    """Collective: read ``src`` on rank 0, transform over the world, write ``dst`` on rank 0."""
    header = None
    if world.rank == 0:
        try:
            header = check_input(src, world.size)
        except ConfigError as exc:
            header = str(exc)
    header = world.broadcast_object(header)
    if isinstance(header, str):
        raise ConfigError(header)
    (n1, n2), dtype = header
    eng = world.backend_module("circuslink.apps.fft")
    t0 = time.perf_counter()
    with Plan(world, (n1, n2), dtype, inverse, layout, scheme, staging=True) as plan:
        nbytes = plan.a.nbytes
        staging = world.alloc(nbytes)
        try:
            if world.rank == 0:  # hand every rank its rows, straight into its memory
                x = np.load(src, mmap_mode="r", allow_pickle=False)
                native = np.dtype(dtype)
                for r in range(world.size):
                    rows = np.ascontiguousarray(x[r * plan.b1: (r + 1) * plan.b1], dtype=native)
                    _put(staging.peer(r)[:nbytes], rows.view(np.uint8).reshape(-1))
                del x
            world.barrier()
            xp = world.xp
            plan.input[...] = staging.local[:nbytes].view(xp.dtype(dtype)).reshape(plan.input.shape)
            t1 = time.perf_counter()
            out = plan.execute()
            t2 = time.perf_counter()
            staging.local[:nbytes] = out.reshape(-1).view(xp.uint8)
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            world.barrier()
            if world.rank == 0:
                shape = (n1, n2) if layout == "natural" else (n2, n1)
                b = shape[0] // world.size
                tmp = f"{dst}.{os.getpid()}.tmp.npy"
                y = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
                for r in range(world.size):
                    y[r * b: (r + 1) * b] = eng.to_host(staging.peer(r)[:nbytes]).view(dtype).reshape(b, shape[1])
                y.flush()
                del y
                os.replace(tmp, dst)
            world.barrier()
        finally:
            staging.close()
    if world.rank == 0:
        what = "ifft2" if inverse else "fft2"
        print(f"circuslink fft2: {what} of {src} ({n1} x {n2} {dtype}) on {world.size} rank(s) "
              f"({world.backend.name}, {scheme}, {layout} layout): transform {1e3 * (t2 - t1):.2f} ms, "
              f"with I/O {time.perf_counter() - t0:.2f} s; wrote {dst}"
              + (" (the transpose of the result)" if layout == "transposed" else ""))


def _put(dst: Any, host: np.ndarray) -> None:
    """Copy host bytes into a (possibly device, possibly peer) byte array."""
    if hasattr(dst, "set"):
        dst.set(host)
    else:
        dst[...] = host
