"""2-D FFT of a .npy file over R ranks, with transposing puts: ``circuslink fft2`` (``fft3``: the 3-D one).

    circuslink fft2 --input X.npy --output Y.npy -n R [--backend cpu|cuda] [--inverse | --r2c | --c2r]
                    [--layout natural|transposed] [--scale none|full|symmetric] [--chunks K]
                    [--scheme transpose-put|local-transpose|pull]
    circuslink fft3 ... the same, and [--decomposition auto|slab|pencil] [--grid P0xP1]

X is the whole array, any dtype numpy's FFT takes (complex64 / complex128 kept; float32 and float16 become
complex64, other real or integer arrays complex128), in C or Fortran order, any byte order. Y (native byte
order, C order) is numpy.fft.fftn(X) (fft2 for 2-D); ``--inverse`` ifftn, ``--r2c`` rfftn of a real X,
``--c2r`` irfftn of a complex X (last axis ``--last-size``, default 2 (m - 1)). ``--layout transposed`` writes
Y in the order the ranks hold it after the last transform (one global transpose less): ``Y.T`` for 2-D;
``Y.transpose(1, 2, 0)`` for a 3-D slab decomposition, ``Y.transpose(2, 1, 0)`` for pencils. Rank 0 reads X
and hands every rank its box; rank 0 gathers and writes Y through a temporary file and a rename. Bad input
(missing file, not .npy, wrong number of axes, an empty axis, an unsupported dtype, a problem too large for
memory) is refused with one line before any rank starts where possible. ``circuslink bench fft`` times the
transform on random data against its baselines.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from ..._argtypes import output_file, positive_int
from ...errors import ConfigError
from . import _boxes as bx
from . import _plan
from ._plan import DECOMPOSITIONS, SCALES, SCHEMES

_LAYOUTS = ("natural", "transposed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_command_arguments(p, 2)


def run(args: argparse.Namespace) -> int:
    return run_command(args, 2)


def _grid(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        p0, p1 = (int(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a grid P0xP1 (e.g. 2x2)") from None
    if p0 < 1 or p1 < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: both grid sides must be positive")
    return p0, p1


def add_command_arguments(p: argparse.ArgumentParser, ndim: int) -> None:
    name = f"fft{ndim}"
    p.add_argument("--input", metavar="X.npy", help=f"the {ndim}-D array to transform (.npy)")
    p.add_argument("--output", metavar="Y.npy", type=output_file,
                   help="where rank 0 writes the result (.npy); its folder must exist (it is not created)")
    p.add_argument("-n", "--nranks", type=positive_int, default=2,
                   help="ranks to split the array over (default 2); any size works, uneven splits included")
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                   help="back-end (default: cuda when a GPU is present, else cpu)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--inverse", action="store_true", help=f"inverse transform, numpy's i{name[:-1]}n")
    kind.add_argument("--r2c", action="store_true", help="real-to-complex transform of a real X: numpy's rfftn")
    kind.add_argument("--c2r", action="store_true", help="complex-to-real inverse of a complex X: numpy's irfftn")
    p.add_argument("--last-size", type=positive_int, default=None,
                   help="with --c2r: the output's last axis (default 2 (m - 1) for m input points, as numpy's)")
    p.add_argument("--layout", choices=_LAYOUTS, default="natural",
                   help="natural (default): Y in C order; transposed: Y in the ranks' last storage order "
                        "(one global transpose less)")
    p.add_argument("--scale", choices=SCALES, default=None,
                   help="none, full (1/N) or symmetric (1/sqrt(N)); default numpy's: none forward, full inverse")
    p.add_argument("--scheme", choices=SCHEMES, default="transpose-put",
                   help="global transposes by transposing puts (default) or local transpose + block puts")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="pipeline chunks per reshape (default: the tile model's choice)")
    if ndim == 3:
        p.add_argument("--decomposition", choices=DECOMPOSITIONS, default="auto",
                       help="slab (one reshape), pencil (a 2-D process grid, two reshapes) or auto (default: slab "
                            "unless there are more ranks than indices along axis 0 or 1)")
        p.add_argument("--grid", type=_grid, default=None, help="the pencil grid P0xP1 (default: the most square)")


def _argv(args: argparse.Namespace, ndim: int) -> list[str]:
    """This command line again, for the ranks it starts."""
    argv = [f"fft{ndim}", "-n", str(args.nranks), "--layout", args.layout, "--scheme", args.scheme]
    for flag in ("inverse", "r2c", "c2r"):
        if getattr(args, flag):
            argv.append(f"--{flag}")
    for opt in ("last_size", "scale", "chunks"):
        if getattr(args, opt) is not None:
            argv += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    if ndim == 3:
        argv += ["--decomposition", args.decomposition]
        if args.grid is not None:
            argv += ["--grid", f"{args.grid[0]}x{args.grid[1]}"]
    return argv + ["--input", args.input, "--output", args.output]


def read_header(path: str, what: str = "fft2") -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the .npy file ``path`` (the data is not read), or one line saying what is wrong."""
    if not os.path.exists(path):
        raise ConfigError(f"{what}: input file {path!r} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"{what}: input {path!r} is a directory, not a .npy file")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None
    if magic[:2] == b"PK":
        raise ConfigError(f"{what}: {path!r} is an .npz archive: pass one array in a .npy file")
    if magic != b"\x93NUMPY":
        raise ConfigError(f"{what}: {path!r} is not a .npy file (it does not start with numpy's magic string)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{what}: cannot read {path!r} as a .npy array: {reason}") from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"{what}: {path!r} is an .npz archive: pass one array in a .npy file")
    return tuple(int(d) for d in arr.shape), arr.dtype


def working_dtype(dtype: np.dtype, real: bool, where: str) -> str:
    """The dtype the transform runs in for an input of ``dtype``: complex64/128 for c2c (reals promoted as
    numpy's FFT promotes them), float32/64 for a real-to-complex transform; or one line saying why not."""
    dt = np.dtype(dtype)
    if dt.kind == "c":
        if dt.itemsize > 16:
            raise ConfigError(f"{where} has dtype {dt.name}, which the FFT does not support: pass complex64 or "
                              "complex128")
        if real:
            raise ConfigError(f"{where} has dtype {dt.name}: --r2c transforms a real array (drop --r2c for a "
                              "complex one)")
        return dt.name
    if dt.kind in "fiub":
        if dt.kind == "f" and dt.itemsize > 8:
            raise ConfigError(f"{where} has dtype {dt.name}, which the FFT does not support: pass float32 or "
                              "float64")
        single = dt.kind == "f" and dt.itemsize <= 4
        if real:
            return "float32" if single else "float64"
        return "complex64" if single else "complex128"
    raise ConfigError(f"{where} has dtype {dt.name}, not a number: pass a complex or real array "
                      "(e.g. x.astype(numpy.complex64))")


class Job:
    """What a file transform does, decided once from the header and the options (same on every rank)."""

    def __init__(self, args: argparse.Namespace, ndim: int, shape: tuple[int, ...], dtype: np.dtype,
                 nranks: int) -> None:
        self.what = f"fft{ndim}"
        where = f"{self.what}: {args.input}"
        if len(shape) != ndim:
            raise ConfigError(f"{where} is {len(shape)}-D (shape {shape}): {self.what} takes a {ndim}-D array"
                              + (" (circuslink fft3 takes 3-D ones)" if ndim == 2 and len(shape) == 3 else "")
                              + (" (circuslink fft2 takes 2-D ones)" if ndim == 3 and len(shape) == 2 else ""))
        if any(n < 1 for n in shape):
            raise ConfigError(f"{where} has shape {shape}: every axis must have at least one point")
        if args.last_size is not None and not args.c2r:
            raise ConfigError(f"{self.what}: --last-size goes with --c2r only")
        if args.c2r and args.layout != "natural":
            raise ConfigError(f"{self.what}: --c2r writes the natural layout only (drop --layout transposed)")
        self.c2r, self.r2c = bool(args.c2r), bool(args.r2c)
        self.inverse = bool(args.inverse)
        self.layout, self.scheme, self.chunks = args.layout, args.scheme, args.chunks
        self.decomposition = getattr(args, "decomposition", "slab")
        self.grid = getattr(args, "grid", None)
        if self.c2r:
            cdt = working_dtype(dtype, False, where)
            if np.dtype(dtype).kind != "c":
                raise ConfigError(f"{where} has dtype {np.dtype(dtype).name}: --c2r transforms a complex array "
                                  "(the half spectrum rfftn gives)")
            last = args.last_size if args.last_size is not None else 2 * (shape[-1] - 1)
            if last < 1 or last // 2 + 1 != shape[-1]:
                raise ConfigError(f"{self.what}: a complex-to-real output with last axis {last} needs "
                                  f"{last // 2 + 1} input points along it, X has {shape[-1]} "
                                  "(give --last-size 2m-2 or 2m-1)")
            self.dtype = {"complex64": "float32", "complex128": "float64"}[cdt]  # the plan's spatial dtype
            self.spatial = shape[:-1] + (last,)
            self.freq = shape
            self.in_dtype, self.out_dtype = cdt, self.dtype
        else:
            self.dtype = working_dtype(dtype, self.r2c, where)
            self.spatial = shape
            self.freq = shape[:-1] + (shape[-1] // 2 + 1,) if self.r2c else shape
            self.in_dtype = self.dtype
            self.out_dtype = _plan.COMPLEX[self.dtype]
        if self.grid is not None:
            if self.grid[0] * self.grid[1] != nranks:
                raise ConfigError(f"{self.what}: --grid {self.grid[0]}x{self.grid[1]} has {self.grid[0] * self.grid[1]}"
                                  f" places for {nranks} ranks")
            if self.decomposition == "slab":
                raise ConfigError(f"{self.what}: --grid goes with the pencil decomposition")
            self.decomposition = "pencil"
        self.scale = args.scale or ("full" if (self.inverse or self.c2r) else "none")
        if self.decomposition == "auto":
            n1 = self.freq[1]
            self.decomposition = "pencil" if nranks > 1 and nranks > min(self.freq[0], n1) else "slab"
        ins, outs = _boxes_for(self, nranks)
        self.inboxes, self.outboxes = ins, outs

    def bytes_per_rank(self) -> int:
        """The largest box (input or output) a rank stages, in bytes."""
        isz, osz = np.dtype(self.in_dtype).itemsize, np.dtype(self.out_dtype).itemsize
        reads = self.outboxes if self.c2r else self.inboxes
        writes = self.inboxes if self.c2r else self.outboxes
        return max(max(b.size for b in reads) * isz, max(b.size for b in writes) * osz, 16)


def _boxes_for(job: Job, nranks: int) -> tuple[list[bx.Box], list[bx.Box]]:
    from . import boxes

    real = job.r2c or job.c2r
    return boxes(job.spatial, nranks, job.decomposition, job.grid, job.layout, real=real)


def run_command(args: argparse.Namespace, ndim: int) -> int:
    from ... import launcher
    from ...backends import default_backend_name, runs_kernels

    what = f"fft{ndim}"
    backend = args.backend or os.environ.get("CIRCUSLINK_BACKEND") or default_backend_name()
    if not args.input or not args.output:
        raise ConfigError(f"{what}: give --input X.npy and --output Y.npy (circuslink bench fft times random data)")
    if not launcher.inside_job():
        shape, dtype = read_header(args.input, what)
        job = Job(args, ndim, shape, dtype, args.nranks)
        problem = f"{what}: a {' x '.join(map(str, shape))} {job.dtype} problem over {args.nranks} ranks"
        if runs_kernels(backend):  # the plan's window and cuFFT's work areas, and the staging buffer, a rank
            from . import _cuda

            regions = (3 if job.scheme == "local-transpose" else 2) + _cuda.EXTRA_REGIONS + 1
            _plan.require_gpu_memory(args.nranks, regions * job.bytes_per_rank() + _plan._MARGIN, problem,
                                     "use single precision, more GPUs or a smaller size")
        else:
            from . import _cpu

            need = args.nranks * (4 + _cpu.EXTRA_REGIONS) * job.bytes_per_rank() + (256 << 20)
            free, where = _cpu.free_bytes(None)
            if need > free:
                raise ConfigError(f"{problem} needs about {need / (1 << 30):.1f} GiB of {where}, but only "
                                  f"{free / (1 << 30):.1f} GiB is free: use single precision or a smaller size")
        return launcher.relaunch_self(args.nranks, argv=_argv(args, ndim), backend=backend,
                                     sm_partition=_plan.SM_PARTITION)
    import circuslink

    world = circuslink.init(args.backend)
    try:
        transform_file(world, args, ndim)
    finally:
        world.close()
    return 0


def _slices(box: bx.Box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in zip(box.low, box.high, strict=True))


def transform_file(world: Any, args: argparse.Namespace, ndim: int) -> None:
    """Collective: read ``args.input`` on rank 0, transform over the world, write ``args.output`` on rank 0."""
    what = f"fft{ndim}"
    header: Any = None
    if world.rank == 0:
        try:
            shape, dtype = read_header(args.input, what)
            header = Job(args, ndim, shape, dtype, world.size)
        except ConfigError as exc:
            header = str(exc)
    job = world.broadcast_object(header)
    if isinstance(job, str):
        raise ConfigError(job)
    me, xp = world.rank, world.xp
    eng = world.backend_module("circuslink.apps.fft")
    t0 = time.perf_counter()
    nbytes = job.bytes_per_rank()
    plan = _plan.Plan(world, job.inboxes[me], job.outboxes[me], job.dtype, decomposition=job.decomposition,
                      grid=job.grid, scheme=job.scheme, chunks=job.chunks, reserve_bytes=nbytes)
    with plan:
        staging = world.alloc(nbytes)
        try:
            # what each rank reads from the file, and into which of the plan's arrays: the frequency side for
            # a backward transform (c2r, or the inverse into the natural layout), else the spatial side
            backward = job.c2r or (job.inverse and job.layout == "natural")
            sources = job.outboxes if backward else job.inboxes
            if me == 0:  # hand every rank its box, in its storage order, straight into its memory
                x = np.load(args.input, mmap_mode="r", allow_pickle=False)
                native = np.dtype(job.in_dtype)
                for r, box in enumerate(sources):
                    if box.empty:
                        continue
                    part = np.ascontiguousarray(np.asarray(x[_slices(box)]).transpose(box.order), dtype=native)
                    _put(staging.peer(r)[: part.nbytes], part.view(np.uint8).reshape(-1))
                del x
            world.barrier()
            mine = sources[me]
            target = plan.output if backward else plan.input
            nb = mine.size * np.dtype(job.in_dtype).itemsize
            target[...] = staging.local[:nb].view(xp.dtype(job.in_dtype)).reshape(mine.storage_shape)
            eng.sync(world, "taking the input from the staging buffer")
            world.barrier()  # every rank has taken its input before the staging buffers are reused
            t1 = time.perf_counter()
            if backward:
                out = plan.backward(scale=job.scale)
            elif job.inverse:  # ifftn(x) = conj(fftn(conj(x))): the forward plan writes the transposed layout
                target[...] = xp.conj(target)
                out = plan.forward(scale=job.scale)
                out[...] = xp.conj(out)
            else:
                out = plan.forward(scale=job.scale)
            t2 = time.perf_counter()
            ob = out.size * out.itemsize
            staging.local[:ob] = out.reshape(-1).view(xp.uint8)
            eng.sync(world, "copying the output to the staging buffer")
            world.barrier()
            if me == 0:
                _write(eng, staging, job, args.output)
            world.barrier()
        finally:
            staging.close()
    if me == 0:
        kind = ("irfft" if job.c2r else "rfft" if job.r2c else "ifft" if job.inverse else "fft") + (
            "2" if ndim == 2 else "n")
        print(f"circuslink {what}: {kind} of {args.input} ({' x '.join(map(str, job.freq if job.c2r else job.spatial))}"
              f" {job.in_dtype}) on {world.size} rank(s) ({world.backend.name}, {job.decomposition}, {job.scheme}, "
              f"{job.layout} layout, chunks {plan.chunks}): transform {1e3 * (t2 - t1):.2f} ms, with I/O "
              f"{time.perf_counter() - t0:.2f} s; wrote {args.output}"
              + (f" (the result transposed to {job.outboxes[0].order})" if job.layout == "transposed" else ""))


def _write(eng: Any, staging: Any, job: Job, path: str) -> None:
    """Rank 0: every rank's box from its staging buffer into Y (in the boxes' storage order), then rename."""
    results = job.inboxes if (job.c2r or (job.inverse and job.layout == "natural")) else job.outboxes
    full = job.spatial if job.c2r else job.freq
    order = results[0].order
    dt = np.dtype(job.out_dtype)
    shape = tuple(full[a] for a in order)
    tmp = f"{path}.{os.getpid()}.tmp.npy"
    y = np.lib.format.open_memmap(tmp, mode="w+", dtype=dt, shape=shape)
    try:
        for r, box in enumerate(results):
            if box.empty:
                continue
            part = eng.to_host(staging.peer(r)[: box.size * dt.itemsize]).view(dt).reshape(box.storage_shape)
            y[tuple(slice(box.low[a], box.high[a]) for a in order)] = part
        y.flush()
        del y
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _put(dst: Any, host: np.ndarray) -> None:
    """Copy host bytes into a (possibly device, possibly peer) byte array."""
    if hasattr(dst, "set"):
        dst.set(host)
    else:
        dst[...] = host
