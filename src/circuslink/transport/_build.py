"""One toolchain for circuslink's compiled companions: where nvcc, NVSHMEM, MPI's flags and a C++ compiler are,
and one cached build (by source and command, under the user's cache folder, a lock against concurrent ranks).

Used by the mpi transport (its progress thread, C++ against mpi.h), the nvshmem transport (its library and proxy
kernel, nvcc -rdc against the nvidia-nvshmem-cu13 package), the NVSHMEM baseline and the QCD NVSHMEM halo, so
every one of them finds the tools by the same rules:

* nvcc: ``NVCC``, else ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``;
* NVSHMEM: ``NVSHMEM_HOME``, else the ``nvidia/nvshmem`` folder of the pip package;
* MPI: ``mpicc --showme:compile`` / ``--showme:link`` (Open MPI), else ``MPI_HOME`` or a few usual prefixes;
* C++ with MPI: ``mpicxx`` / ``mpic++``, else ``g++`` / ``c++`` with MPI's flags.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import BackendError, CompileError

COMPILE_TIMEOUT_S = 600.0
MPI_GUESSES = ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/aarch64-linux-gnu/openmpi", "/usr/local",
               "/opt/openmpi", "/usr/lib64/openmpi", "/usr")


def cache_dir(kind: str) -> Path:
    """``$XDG_CACHE_HOME/circuslink/<kind>`` (default ``~/.cache/circuslink/<kind>``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "circuslink" / kind


def nvidia_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def find_nvshmem() -> Path:
    """NVSHMEM's folder (with ``include/nvshmem.h`` and ``lib``): ``NVSHMEM_HOME`` or the pip package."""
    candidates = []
    if os.environ.get("NVSHMEM_HOME"):
        candidates.append(Path(os.environ["NVSHMEM_HOME"]))
    candidates += [d / "nvshmem" for d in nvidia_dirs()]
    for c in candidates:
        if (c / "include" / "nvshmem.h").is_file() and (c / "lib").is_dir():
            return c
    looked = ", ".join(str(c) for c in candidates) or "no nvidia/ package folder found"
    raise BackendError(f"NVSHMEM not found (looked in {looked}): pip install nvidia-nvshmem-cu13 or set NVSHMEM_HOME")


def nvshmem_link_args(nv: Path) -> list[str]:
    """Link flags for NVSHMEM's host library (a versioned .so in the pip wheel) and its static device library."""
    lib = nv / "lib"
    if (lib / "libnvshmem_host.so").exists():
        host = ["-lnvshmem_host"]
    else:
        versioned = sorted(p.name for p in lib.glob("libnvshmem_host.so.*"))
        if not versioned:
            raise BackendError(f"NVSHMEM host library libnvshmem_host.so* not found in {lib}")
        host = [f"-l:{versioned[0]}"]
    if not (lib / "libnvshmem_device.a").exists():
        raise BackendError(f"NVSHMEM device library libnvshmem_device.a not found in {lib}")
    return ["-L", str(lib), *host, "-lnvshmem_device", "-Xlinker", f"-rpath={lib}"]


def find_nvcc() -> str:
    """nvcc: ``NVCC``, PATH, or ``/usr/local/cuda/bin/nvcc``."""
    explicit = os.environ.get("NVCC")
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise BackendError(f"NVCC={explicit!r} is not an executable file")
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise BackendError("nvcc not found (set NVCC, put it on PATH, or install the CUDA toolkit)")


def mpi_flags() -> tuple[list[str], list[str]]:
    """MPI's compile and link flags (-I / -L / -l only): ``mpicc --showme`` (Open MPI), else a prefix search."""
    mpicc = shutil.which("mpicc")
    if mpicc is None:
        return mpi_flags_from_prefix()
    flags = []
    for what in ("compile", "link"):
        try:
            out = subprocess.run([mpicc, f"--showme:{what}"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendError(f"mpicc --showme:{what} failed: {exc}") from None
        if out.returncode != 0:
            raise BackendError(f"mpicc --showme:{what} failed (is this Open MPI?): {out.stderr.strip()}")
        flags.append(out.stdout.split())
    compile_flags = [f for f in flags[0] if f.startswith("-I")]
    link_flags = [f for f in flags[1] if f.startswith(("-L", "-l"))]
    if not any(f.startswith("-lmpi") for f in link_flags):
        link_flags.append("-lmpi")
    return compile_flags, link_flags


def mpi_flags_from_prefix() -> tuple[list[str], list[str]]:
    prefixes = ([os.environ["MPI_HOME"]] if os.environ.get("MPI_HOME") else []) + list(MPI_GUESSES)
    for prefix in map(Path, prefixes):
        includes = [d for d in (prefix / "include", prefix / "include" / "openmpi") if d.is_dir()]
        libs = [d for d in (prefix / "lib", prefix / "lib64") if any(d.glob("libmpi.so*"))]
        if (prefix / "include" / "mpi.h").is_file() and libs:
            return [f"-I{d}" for d in includes], [f"-L{libs[0]}", "-lmpi"]
    raise BackendError("neither mpicc nor MPI's mpi.h + libmpi.so were found (set MPI_HOME)")


def find_mpi_cxx() -> list[str]:
    """A C++ compiler that builds against MPI: ``[mpicxx]``, or ``[g++, -I.., -L.., -lmpi]``. One line naming
    what was looked for when there is none."""
    for wrapper in ("mpicxx", "mpic++", "mpiCC"):
        path = shutil.which(wrapper)
        if path:
            return [path]
    for cxx in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        path = shutil.which(cxx) if cxx else None
        if path:
            compile_flags, link_flags = mpi_flags()
            return [path, *compile_flags, *link_flags]
    raise BackendError("no C++ compiler to build against MPI (looked for mpicxx, mpic++, $CXX, g++, c++, clang++ "
                       "on PATH): install one, e.g. apt-get install g++ libopenmpi-dev")


def build_cached(kind: str, name: str, source: Path, command: Callable[[Path], list[str]], suffix: str = ".so",
                 what: str | None = None, folder: Path | None = None, force: bool = False,
                 includes: Sequence[Path] = (), timeout: float = COMPILE_TIMEOUT_S) -> Path:
    """Build ``source`` with ``command(output)`` into ``cache_dir(kind)/<name>-<hash><suffix>`` (or ``folder``; the
    hash covers the source, the files it ``includes`` and the command) unless it is there (``force``: build
    anyway); return the path. Ranks that start together build it once: the first takes a lock, the others wait on
    it and find the file. A build that fails or outlasts ``timeout`` seconds is one line plus the log."""
    folder = folder or cache_dir(kind)
    text = source.read_bytes() + b"".join(p.read_bytes() for p in includes)
    digest = hashlib.sha256(text + "\0".join(command(Path("OUT"))).encode()).hexdigest()[:16]
    target = folder / f"{name}-{digest}{suffix}"
    if target.is_file() and not force:
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendError(f"cannot create the build folder {str(folder)!r}: {exc.strerror or exc}") from None
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file() and not force:
            return target
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}-", suffix=suffix, dir=folder)
        os.close(fd)
        tmp = Path(tmp_name)
        cmd = command(tmp)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            tmp.unlink(missing_ok=True)
            raise CompileError(f"{cmd[0]} did not finish building {source.name} within {timeout:g} s") from None
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            log = (proc.stderr or proc.stdout).strip()
            raise CompileError(f"{what or cmd[0]} failed to build {source.name} (command: {' '.join(cmd)}):\n{log}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return target
