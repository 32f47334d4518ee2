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


def _nvcc(source: Path, out: Path) -> str:
    """Compile `source` (host and device) into `out`; the command and compiler output on failure, else ""."""
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    return "" if proc.returncode == 0 else f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"


# Test kernels on the public API whose GPU tests CI cannot run: a compile error shows here first.
TEST_KERNELS = [Path(__file__).with_name("kernels") / "nonblocking.cu"]


def background_builds(root: Path) -> list:
    """Every header (included alone, twice) and every kernel of the plain compile checks below, as compile jobs
    (conftest.Builds): each nvcc uses one core, and these checks were most of the suite's time on a 2-core CI
    machine, so they start on one core as soon as the session is collected and take every core once this module
    runs. The longest first."""
    if NVCC is None:
        return []
    jobs = []
    for i, header in enumerate(HEADERS):
        src = root / f"header{i}.cu"
        src.write_text(f"#include <{header}>\n#include <{header}>  // include guards hold\n")
        jobs.append((header, src))
    jobs += [(str(kernel), kernel) for kernel in [*KERNELS, *TEST_KERNELS]]
    jobs.sort(key=lambda job: -job[1].stat().st_size)  # the large sources are the slow compiles
    return [(name, _nvcc, (src, root / f"{i}.o")) for i, (name, src) in enumerate(jobs)]


@pytest.fixture(scope="module")
def compiled():
    """Name -> a Future of the failure text ("" when it compiled); each test waits for its own."""
    return builds_for(sys.modules[__name__])


@pytest.mark.parametrize("header", HEADERS)
def test_header_compiles_alone(header, compiled):
    assert not (failure := compiled[header].result()), failure


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda p: p.relative_to(PKG).as_posix())
def test_kernel_compiles(kernel, compiled):
    assert not (failure := compiled[str(kernel)].result()), failure


@pytest.mark.parametrize("kernel", TEST_KERNELS, ids=lambda p: p.name)
def test_test_kernel_compiles(kernel, compiled):
    assert not (failure := compiled[str(kernel)].result()), failure


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


@pytest.mark.parametrize("source, instantiate", WIDE_KERNELS, ids=[k for k, _ in WIDE_KERNELS])
def test_512_thread_kernels_fit_an_sm(source, instantiate, tmp_path):
    import re

    src = tmp_path / "inst.cu"
    src.write_text(f'#include "{PKG / source}"\n{instantiate}\n')
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-Xptxas", "-v", "-c", str(src), "-o",
           str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", proc.stderr)]
    assert regs, proc.stderr
    assert max(regs) * 512 <= 65536, f"{source}: {max(regs)} registers a thread x 512 threads > 65536\n{proc.stderr}"


@pytest.mark.parametrize("elem", [None, 0, 4, 8, 16])
def test_rma_kernels_compile_in_parts(elem, tmp_path):
    """rma/_cuda.py compiles rma_kernels.cu in parts, only those its queues need (CIRCUSLINK_RMA_TRANSPOSE_ELEM:
    the element size of a queue's transposing puts, 0 when mixed; none: the plain kernels). Each part holds
    exactly the kernels the host asks it for, and those of one element size keep 3 blocks of 256 threads on an
    SM (__launch_bounds__(256, 3): at most 85 registers)."""
    import re

    define = [] if elem is None else [f"-DCIRCUSLINK_RMA_TRANSPOSE_ELEM={elem}"]
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", *define, "-Xptxas", "-v", "-c",
           str(PKG / "rma" / "rma_kernels.cu"), "-o", str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    names = set(re.findall(r"Compiling entry function '(\w+)'", proc.stderr))
    if elem is None:
        want = {f"circuslink_rma_{k}" for k in ("start", "cycle", "wait", "prologue", "epilogue")}
    else:
        want = {f"circuslink_rma_start_transpose{elem}", f"circuslink_rma_cycle_transpose{elem}"}
    assert names == want, proc.stderr
    if elem:
        regs = [int(m) for m in re.findall(r"Used (\d+) registers", proc.stderr)]
        assert regs and max(regs) <= 85, proc.stderr


_COLL_INSTANTIATE = {
    2: "template __global__ void cl_team_allreduce<float, circuslink::collectives::Max>(circuslink::collectives::Team, "
       "const float*, float*, unsigned long long, int); template __global__ void cl_team_reduce_scatter<float, "
       "circuslink::collectives::Min>(circuslink::collectives::Team, const float*, float*, unsigned long long);",
    3: "template __global__ void cl_allreduce<float, circuslink::collectives::Sum>(circuslink::collectives::Rings, "
       "float*, unsigned long long, int*);",
}


@pytest.mark.parametrize("part", [1, 2, 3])
def test_collectives_kernels_compile_in_parts(part, tmp_path):
    """collectives/_cuda.py compiles collectives_kernels.cu in parts (CL_COLLECTIVES_PART), each when a call first
    needs it: the untyped extern "C" kernels, the team's templates, the ring's. Each part holds only its own
    kernels, and part_of() sends every kernel the host launches to the part that holds it."""
    import re

    from circuslink.collectives import _cuda as cc

    src = tmp_path / "part.cu"
    src.write_text(f'#include "{PKG / "collectives" / "collectives_kernels.cu"}"\n{_COLL_INSTANTIATE.get(part, "")}\n')
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", f"-DCL_COLLECTIVES_PART={part}", "-Xptxas", "-v",
           "-c", str(src), "-o", str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    names = set(re.findall(r"Compiling entry function '(\w+)'", proc.stderr))
    untyped = {"cl_broadcast", "cl_barrier", "cl_team_all_gather", "cl_team_broadcast", "cl_team_barrier"}
    if part == cc.PART_UNTYPED:
        assert names == untyped, proc.stderr
        assert all(cc.part_of(k) == cc.PART_UNTYPED for k in untyped)
    else:
        assert names and not names & untyped, proc.stderr
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
