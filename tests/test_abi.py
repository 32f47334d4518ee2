"""The host/device ABI: every host table (circuslink._abi.Struct) against its C++ struct, compiled by nvcc.

The host packs handles and descriptors from these tables; nvcc checks ``sizeof``, ``alignof`` and
every ``offsetof`` against the headers, so a field added on one side only fails here, in CI.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from circuslink import _abi as abi

INCLUDE = Path(__file__).resolve().parents[1] / "src" / "circuslink" / "include"
NVCC = shutil.which("nvcc")
# Every module that declares tables (importing it registers them).
TABLE_MODULES = ["circuslink.channels.protocol", "circuslink.transport._base", "circuslink.transport.nvshmem",
                 "circuslink.rma._layout", "circuslink.trace._layout", "circuslink.collectives._layout",
                 "circuslink.rma._transpose._cuda", "circuslink.topology._routing", "circuslink.apps.qcd._cuda"]


def _registered() -> list[abi.Struct]:
    for name in TABLE_MODULES:
        importlib.import_module(name)
    return abi.registered()


def _compile(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "abi_check.cu"
    path.write_text(source)
    return subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(path), "-o",
                           str(tmp_path / "abi_check.o")], capture_output=True, text=True)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_every_table_matches_its_header(tmp_path):
    structs = _registered()
    names = {s.cxx for s in structs}
    assert {"circuslink::detail::ChannelHandle", "circuslink::RmaQueue", "circuslink::RmaDescriptor",
            "circuslink::trace::Handle", "circuslink::collectives::Ring", "circuslink::transport::Handle"} <= names
    proc = _compile(abi.static_asserts(structs), tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_a_drifted_table_fails_to_compile(tmp_path):
    """The check can fail: a table with a field the header lacks is caught by nvcc."""
    handle = next(s for s in _registered() if s.cxx == "circuslink::detail::ChannelHandle")
    fields = [(n, t, c) for n, t, c in handle.fields]
    fields.insert(3, ("extra", abi.U64, 1))
    drifted = abi.Struct.__new__(abi.Struct)
    abi.Struct.__init__(drifted, handle.cxx, handle.header, fields, register=False)
    proc = _compile(abi.static_asserts([drifted]), tmp_path)
    assert proc.returncode != 0 and "differs from the host table" in proc.stderr


def test_c_layout_rules():
    """Offsets, padding and size follow C: natural alignment, tail padding to the largest member."""
    s = abi.Struct("T", "t.h", [("a", abi.U8), ("b", abi.U32), ("c", abi.U8), ("d", abi.U64), ("e", abi.U16)],
                   register=False)
    assert s.offsets == {"a": 0, "b": 4, "c": 8, "d": 16, "e": 24}
    assert (s.size, s.align) == (32, 8)
    inner = abi.Struct("I", "t.h", [("x", abi.U32), ("y", abi.U8)], register=False)
    outer = abi.Struct("O", "t.h", [("p", abi.U8), ("i", inner, 3), ("q", abi.U64)], register=False)
    assert inner.size == 8 and outer.offsets == {"p": 0, "i": 4, "q": 32} and outer.size == 40
    v = s.pack(a=1, d=2**63 + 5, e=7)
    raw = np.frombuffer(v.tobytes(), dtype=np.uint8)
    assert raw[0] == 1 and int.from_bytes(raw[16:24].tobytes(), "little") == 2**63 + 5 and raw[24] == 7
    assert s.dtype.isalignedstruct  # how CuPy passes it to kernels by value
