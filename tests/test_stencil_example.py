"""examples/stencil: the 2-D Jacobi stencil over a process grid with uneven splits, halos through channels.

On the cpu back-end (the host form: numpy and the host channel API) at 1..5 ranks, float32 and float64, bit
for bit against the whole domain stepped by one numpy process. The device kernels compile with nvcc (with
the update traced from the example's Python); on a GPU both device forms run at 1, 2, 4 and 8 ranks against the
same reference. The examples ask the back-end what it can do, never its name.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import builds_for

import circuslink as cl

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "stencil"
INCLUDE = REPO / "src" / "circuslink" / "include"
NVCC = shutil.which("nvcc")

sys.path.insert(0, str(EXAMPLE))
import stencil  # noqa: E402


def test_the_update_is_traced_into_cxx_in_its_order():
    assert stencil.cell_update_cxx() == "#define CELL_UPDATE(xm, xp, ym, yp) (T(0.25) * ((xm + xp) + (ym + yp)))\n"


def test_reference_steps_the_interior_and_keeps_the_frame(rng):
    u0 = rng.random((6, 5))
    got = stencil.reference(u0, 1)
    want = u0.copy()
    for i in range(1, 5):
        for j in range(1, 4):
            want[i, j] = 0.25 * ((u0[i - 1, j] + u0[i + 1, j]) + (u0[i, j - 1] + u0[i, j + 1]))
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("n,shape,want", [(4, (100, 100), "mesh:2x2"), (2, (10, 100), "mesh:1x2"),
                                          (6, (300, 200), "mesh:3x2"), (5, (8, 8), "mesh:1x5")])
def test_process_grid_keeps_blocks_near_square(n, shape, want):
    assert stencil.process_grid(n, shape) == want


CPU_CASES = [  # ranks, size, grid (None: the example's choice), iterations
    (1, "31x17", None, 9),
    (2, "19x29", "mesh:1x2", 8),
    (3, "40x11", "mesh:3x1", 12),
    (4, "23x21", "mesh:2x2", 10),
    (5, "17x33", "mesh:1x5", 6),
]


@pytest.mark.parametrize("ranks,size,grid,iters", CPU_CASES)
def test_host_form_is_bit_exact_on_the_cpu_back_end(spmd, ranks, size, grid, iters):
    argv = ["--size", size, "--iters", str(iters)] + (["--grid", grid] if grid else [])
    job = spmd(ranks, f"import runpy, sys\nsys.argv = ['main.py', *{argv!r}]\n"
                      f"runpy.run_path({str(EXAMPLE / 'main.py')!r}, run_name='__main__')\n", timeout=240)
    job.check()
    assert job.output.count("bit-exact against numpy (cpu)") == 2, job.output  # float32 and float64


def test_a_device_form_on_the_cpu_back_end_is_refused_in_one_line(spmd):
    job = spmd(1, f"import runpy, sys\nsys.argv = ['main.py', '--form', 'persistent']\n"
                  f"runpy.run_path({str(EXAMPLE / 'main.py')!r}, run_name='__main__')\n")
    assert job.returncode != 0
    assert "--form persistent runs device kernels, which the cpu back-end does not run; use --form host" in job.output


def _compile_kernels(root: Path) -> subprocess.CompletedProcess:
    src = root / "stencil_kernels.cu"
    src.write_text(stencil.cell_update_cxx() + (EXAMPLE / "kernels.cu").read_text())
    # unoptimised, as tests/test_device_headers.py's plain checks: that the kernels compile, not what they cost
    return subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-Xcicc", "-O0", "-Xptxas", "-O0",
                           "-c", str(src), "-o", str(root / "k.o")], capture_output=True, text=True, timeout=300)


def background_builds(root: Path) -> list:
    """The example's kernels with its traced update (conftest.Builds: started early on a spare core)."""
    return [] if NVCC is None else [("kernels", _compile_kernels, (root,))]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_kernels_compile():
    proc = builds_for(sys.modules[__name__])["kernels"].result()
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_kernels_refuse_to_compile_without_the_traced_update(tmp_path):
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(EXAMPLE / "kernels.cu"),
                           "-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "CELL_UPDATE(xm, xp, ym, yp) comes from stencil.py" in proc.stderr


def test_examples_ask_capabilities_not_backend_names():
    """docs/architecture.md: no code outside the back-end registry tests a back-end's name; examples included."""
    pattern = re.compile(r"backend\.name\s*(==|!=)|name\s*(==|!=)\s*[\"'](cuda|cpu)[\"']")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "examples").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


# 8 ranks go to the GPU's slow stage (scripts/gpu-check.sh tests-slow), as every 8- and 16-rank case does, so
# that the default stage fits its 7 minutes.
GPU_CASES = [(1, "64x48", None), (2, "301x77", "mesh:2x1"), (4, "257x129", "mesh:2x2"),
             pytest.param(8, "259x131", "mesh:4x2", marks=pytest.mark.slow)]


@pytest.mark.gpu
@pytest.mark.parametrize("ranks,size,grid", GPU_CASES)
@pytest.mark.parametrize("form", ["launch", "persistent-grid", "persistent-onchip", "host"])
def test_device_forms_are_bit_exact_on_a_gpu(spmd, ranks, size, grid, form):
    """Every form of the example against numpy, bit for bit, float32 and float64 (every block of these cases fits one
    SM's shared memory: the on-chip kernel runs them as the grid kernel does)."""
    argv = ["--size", size, "--iters", "20", "--form", form] + (["--grid", grid] if grid else [])
    job = spmd(ranks, f"import runpy, sys\nsys.argv = ['main.py', *{argv!r}]\n"
                      f"runpy.run_path({str(EXAMPLE / 'main.py')!r}, run_name='__main__')\n", backend="cuda",
               timeout=300)
    job.check()
    assert job.output.count("bit-exact against numpy (cuda)") == 2, job.output
    if form.startswith("persistent"):
        assert job.output.count(f"({form.split('-')[1]} kernel on rank 0)") == 2, job.output


# H200: 227 KB a block (sharedMemPerBlockOptin); the on-chip kernel's static shared memory (its edges' staging)
LIMIT, STATIC = 232448, 8208


@pytest.mark.parametrize("form,block,itemsize,want", [
    ("persistent", (64, 64), 8, "onchip"),           # 2 x 66 x 66 x 8 = 69,696 B
    ("persistent", (116, 116), 8, "onchip"),         # 2 x 118 x 118 x 8 = 222,784 B: the largest square that fits
    ("persistent", (117, 117), 8, "grid"),           # 227,376 B + the static 8,208: past the limit
    ("persistent", (165, 165), 4, "onchip"),
    ("persistent", (1024, 1024), 4, "grid"),
    ("persistent-grid", (8, 8), 8, "grid"),
    ("persistent-onchip", (8, 8), 4, "onchip"),
])
def test_the_persistent_form_runs_on_chip_where_the_block_fits(form, block, itemsize, want):
    assert stencil.persistent_kernel(form, block, itemsize, STATIC, LIMIT) == want


def test_an_on_chip_form_past_shared_memory_is_refused_in_one_line():
    with pytest.raises(cl.ConfigError) as info:
        stencil.persistent_kernel("persistent-onchip", (1000, 700), 8, STATIC, LIMIT)
    text = str(info.value)
    assert "\n" not in text and "1000x700" in text and "232448 B" in text and "--form persistent" in text, text

