"""Every shipped device header and kernel compiles with nvcc for Hopper (sm_90a).

CI has nvcc but no GPU, so a device-code error fails CI here rather than on the device.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "circuslink"
INCLUDE = PKG / "include"
HEADERS = sorted(p.relative_to(INCLUDE).as_posix() for p in INCLUDE.rglob("*.cuh"))
# Kernels that need third-party headers (NVSHMEM, NCCL) are compiled by their own tests.
KERNELS = sorted(p for p in PKG.rglob("*.cu") if "baselines" not in p.parts)
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def _nvcc(source: Path, tmp_path: Path) -> None:
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(source), "-o", str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("header", HEADERS)
def test_header_compiles_alone(header, tmp_path):
    src = tmp_path / "use.cu"
    src.write_text(f"#include <{header}>\n#include <{header}>  // include guards hold\n")
    _nvcc(src, tmp_path)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda p: p.relative_to(PKG).as_posix())
def test_kernel_compiles(kernel, tmp_path):
    _nvcc(kernel, tmp_path)
