"""Every shipped device header and kernel compiles with nvcc for Hopper (sm_90a).

CI has nvcc but no GPU, so a device-code error fails CI here rather than on the device.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NVCC_TIMEOUT_S, builds_for

PKG = Path(__file__).resolve().parents[1] / "src" / "circuslink"
INCLUDE = PKG / "include"
HEADERS = sorted(p.relative_to(INCLUDE).as_posix() for p in INCLUDE.rglob("*.cuh"))
# Kernels that need third-party headers (NVSHMEM, NCCL) are compiled by their own tests.
KERNELS = sorted(p for p in PKG.rglob("*.cu") if "baselines" not in p.parts)
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


# The plain checks ask only that the code compiles for Hopper: the front end parses and instantiates everything
# and ptxas assembles every kernel for sm_90a (the inline PTX included), but neither optimises (-O0), which cuts
# their time to a third (QCD's dslash.cu 115 -> 36 s, the pingpong kernels 40 -> 10 s on the 2-core CI machine).
# The checks that read register counts below compile at full optimisation, and a source they compile whole is not
# compiled a second time by the plain checks.
FAST = ("-Xcicc", "-O0", "-Xptxas", "-O0")
VERBOSE = ("-Xptxas", "-v")


def _nvcc(source: Path, out: Path, flags: tuple[str, ...] = FAST) -> tuple[int, str]:
    """Compile `source` (host and device) into `out`: nvcc's exit status, and the command with its output."""
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", *flags, "-c", str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    return proc.returncode, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"


# Test kernels on the public API whose GPU tests CI cannot run: a compile error shows here first.
TEST_KERNELS = [Path(__file__).with_name("kernels") / "nonblocking.cu"]
RMA_PARTS = [None, 0, 4, 8, 16]  # CIRCUSLINK_RMA_TRANSPOSE_ELEM of each part rma/_cuda.py compiles (None: unset)
COLLECTIVES_PARTS = [1, 2, 3]  # CL_COLLECTIVES_PART of each part collectives/_cuda.py compiles


def background_builds(root: Path) -> list:
    """Every compile of this module, as jobs (conftest.Builds): every header (included alone, twice), every kernel,
    and the full-optimisation compiles whose register counts the tests below read. Each nvcc uses one core, and
    these checks were most of the suite's time on a 2-core CI machine, so they start on one core as soon as the
    session is collected and take every core once this module runs. The longest first."""
    if NVCC is None:
        return []
    jobs = []  # (name, source compiled, flags, the source's own size: the large ones are the slow compiles)
    for i, header in enumerate(HEADERS):
        src = root / f"header{i}.cu"
        src.write_text(f"#include <{header}>\n#include <{header}>  // include guards hold\n")
        jobs.append((header, src, FAST, (INCLUDE / header).stat().st_size))
    jobs += [(str(kernel), kernel, FAST, kernel.stat().st_size)
             for kernel in [*KERNELS, *TEST_KERNELS] if str(kernel) not in COVERED]
    for i, (source, instantiate) in enumerate(WIDE_KERNELS):
        src = root / f"wide{i}.cu"
        src.write_text(f'#include "{PKG / source}"\n{instantiate}\n')
        jobs.append((f"wide:{source}", src, VERBOSE, (PKG / source).stat().st_size))
    rma = PKG / "rma" / "rma_kernels.cu"
    for elem in RMA_PARTS:
        define = () if elem is None else (f"-DCIRCUSLINK_RMA_TRANSPOSE_ELEM={elem}",)
        speed = FAST if not elem else ()  # the transposing parts' register counts are read: those optimise
        jobs.append((f"rma:{elem}", rma, (*define, *speed, *VERBOSE), rma.stat().st_size))
    collectives = PKG / "collectives" / "collectives_kernels.cu"
    for part in COLLECTIVES_PARTS:
        src = root / f"collectives{part}.cu"
        src.write_text(f'#include "{collectives}"\n{_COLL_INSTANTIATE.get(part, "")}\n')
        jobs.append((f"collectives:{part}", src, (f"-DCL_COLLECTIVES_PART={part}", *FAST, *VERBOSE),
                     collectives.stat().st_size // 2))
    jobs.sort(key=lambda job: -job[3])
    return [(name, _nvcc, (src, root / f"{i}.o", flags)) for i, (name, src, flags, _) in enumerate(jobs)]


@pytest.fixture(scope="module")
def compiled():
    """Job name -> a Future of (nvcc's exit status, the command and its output); each test waits for its own."""
    return builds_for(sys.modules[__name__])


@pytest.mark.parametrize("header", HEADERS)
def test_header_compiles_alone(header, compiled):
    rc, output = compiled[header].result()
    assert rc == 0, output


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda p: p.relative_to(PKG).as_posix())
def test_kernel_compiles(kernel, compiled):
    rc, output = compiled[COVERED.get(str(kernel), str(kernel))].result()
    assert rc == 0, output


@pytest.mark.parametrize("kernel", TEST_KERNELS, ids=lambda p: p.name)
def test_test_kernel_compiles(kernel, compiled):
    rc, output = compiled[str(kernel)].result()
    assert rc == 0, output


# Kernels the library launches with 512 threads a block: at 512 threads an SM's 65,536 registers
# allow 128 a thread, and a kernel over that fails at launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, seen
# on the H100 with allreduce_loop at 142). __launch_bounds__(512) makes the compiler keep under it.
WIDE_KERNELS = [
    ("bench/kernels/allreduce_loop.cu",
     "template __global__ void allreduce_loop<double>(cc::Rings, cc::Team, double*, unsigned long long, unsigned int, "
     "unsigned long long*, tr::Handle, int*); template __global__ void team_oneshot_loop<float>(cc::Team, float*, "
     "unsigned long long, unsigned int, unsigned long long*, int*); template __global__ void "
     "team_stage_loop<float>(cc::Team, float*, unsigned long long, unsigned int, unsigned long long*, int*);"),
    ("collectives/collectives_kernels.cu",
     "template __global__ void cl_allreduce<double, circuslink::collectives::Sum>(circuslink::collectives::Rings, "
     "double*, unsigned long long, int*); template __global__ void cl_team_allreduce<double, "
     "circuslink::collectives::Sum>(circuslink::collectives::Team, const double*, double*, unsigned long long, int);"),
    ("bench/kernels/allreduce_like.cu", ""),
]


# Sources that another job of this module builds whole (their plain check reads that job's result)
COVERED = {str(PKG / source): f"wide:{source}" for source, _ in WIDE_KERNELS} | {
    str(PKG / "rma" / "rma_kernels.cu"): "rma:None"}


@pytest.mark.parametrize("source", [k for k, _ in WIDE_KERNELS])
def test_512_thread_kernels_fit_an_sm(source, compiled):
    import re

    rc, output = compiled[f"wide:{source}"].result()
    assert rc == 0, output
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", output)]
    assert regs, output
    assert max(regs) * 512 <= 65536, f"{source}: {max(regs)} registers a thread x 512 threads > 65536\n{output}"


@pytest.mark.parametrize("elem", RMA_PARTS)
def test_rma_kernels_compile_in_parts(elem, compiled):
    """rma/_cuda.py compiles rma_kernels.cu in parts, only those its queues need (CIRCUSLINK_RMA_TRANSPOSE_ELEM:
    the element size of a queue's transposing puts, 0 when mixed; none: the plain kernels). Each part holds
    exactly the kernels the host asks it for, and those of one element size keep 3 blocks of 256 threads on an
    SM (__launch_bounds__(256, 3): at most 85 registers)."""
    import re

    rc, output = compiled[f"rma:{elem}"].result()
    assert rc == 0, output
    names = set(re.findall(r"Compiling entry function '(\w+)'", output))
    if elem is None:
        want = {f"circuslink_rma_{k}" for k in ("start", "cycle", "wait", "prologue", "epilogue")}
    else:
        want = {f"circuslink_rma_start_transpose{elem}", f"circuslink_rma_cycle_transpose{elem}"}
    assert names == want, output
    if elem:
        regs = [int(m) for m in re.findall(r"Used (\d+) registers", output)]
        assert regs and max(regs) <= 85, output


_COLL_INSTANTIATE = {
    2: "template __global__ void cl_team_allreduce<float, circuslink::collectives::Max>(circuslink::collectives::Team, "
       "const float*, float*, unsigned long long, int); template __global__ void cl_team_reduce_scatter<float, "
       "circuslink::collectives::Min>(circuslink::collectives::Team, const float*, float*, unsigned long long);",
    3: "template __global__ void cl_allreduce<float, circuslink::collectives::Sum>(circuslink::collectives::Rings, "
       "float*, unsigned long long, int*);",
}


@pytest.mark.parametrize("part", COLLECTIVES_PARTS)
def test_collectives_kernels_compile_in_parts(part, compiled):
    """collectives/_cuda.py compiles collectives_kernels.cu in parts (CL_COLLECTIVES_PART), each when a call first
    needs it: the untyped extern "C" kernels, the team's templates, the ring's. Each part holds only its own
    kernels, and part_of() sends every kernel the host launches to the part that holds it."""
    import re

    from circuslink.collectives import _cuda as cc

    rc, output = compiled[f"collectives:{part}"].result()
    assert rc == 0, output
    names = set(re.findall(r"Compiling entry function '(\w+)'", output))
    untyped = {"cl_broadcast", "cl_barrier", "cl_team_all_gather", "cl_team_broadcast", "cl_team_barrier"}
    if part == cc.PART_UNTYPED:
        assert names == untyped, output
        assert all(cc.part_of(k) == cc.PART_UNTYPED for k in untyped)
    else:
        assert names and not names & untyped, output
        family = ("cl_team_allreduce", "cl_team_reduce_scatter") if part == cc.PART_TEAM else ("cl_allreduce",)
        assert all(any(f"{len(f)}{f}" in n for f in family) for n in names), names
        assert all(cc.part_of(k) == part for k in cc.kernel_names("float32", part))
        assert cc.kernel_names("float32", part) and all(
            k.split("<")[0] in family for k in cc.kernel_names("float32", part))


def test_rma_kernels_refuse_an_unknown_element_size(tmp_path):
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-DCIRCUSLINK_RMA_TRANSPOSE_ELEM=3", "-c",
           str(PKG / "rma" / "rma_kernels.cu"), "-o", str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode != 0 and "must be 0, 4, 8 or 16" in proc.stderr, proc.stderr
