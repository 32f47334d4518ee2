"""The host/device ABI: every host table (circuslink._abi.Struct) against its C++ struct, compiled by nvcc.

The host packs handles and descriptors from these tables; nvcc checks ``sizeof``, ``alignof`` and
every ``offsetof`` against the headers, so a field added on one side only fails here, in CI.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import NVCC_TIMEOUT_S

from circuslink import _abi as abi

INCLUDE = Path(__file__).resolve().parents[1] / "src" / "circuslink" / "include"
NVCC = shutil.which("nvcc")
# Every module that declares tables (importing it registers them).
TABLE_MODULES = ["circuslink.channels.protocol", "circuslink.transport._base", "circuslink.transport.nvshmem",
                 "circuslink.rma._layout", "circuslink.trace._layout", "circuslink.collectives._layout",
                 "circuslink.rma._transpose._cuda", "circuslink.topology._routing", "circuslink.apps.qcd._cuda",
                 "circuslink.backends._grid", "circuslink.channels._halo"]


def _registered() -> list[abi.Struct]:
    for name in TABLE_MODULES:
        importlib.import_module(name)
    return abi.registered()


def _compile(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "abi_check.cu"
    path.write_text(source)
    return subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-c", str(path), "-o",
                           str(tmp_path / "abi_check.o")], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_every_table_matches_its_header(tmp_path):
    structs = _registered()
    names = {s.cxx for s in structs}
    assert {"circuslink::detail::ChannelHandle", "circuslink::RmaQueue", "circuslink::RmaDescriptor",
            "circuslink::trace::Handle", "circuslink::collectives::Ring", "circuslink::transport::Handle",
            "circuslink::GridBarrier"} <= names
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


# -- constants the host copies from the headers ----------------------------------------------------------------
DETAIL = INCLUDE / "circuslink" / "detail"
# (header, its constant, the host's module, the host's name, how the host's value maps to the header's)
CONSTANTS = [
    *[("channel_types.cuh", c, "circuslink.channels.protocol", py, None) for c, py in [
        ("kUnitBytes", "UNIT_BYTES"), ("kLLUnits", "LL_UNITS"), ("kLLAreaBytes", "LL_AREA_BYTES"),
        ("kLLPayload", "LL_PAYLOAD"), ("kKindBulk", "KIND_BULK"), ("kNbytesMask", "NBYTES_MASK"),
        ("kErrNone", "ERR_NONE"), ("kErrDataTimeout", "ERR_DATA_TIMEOUT"), ("kErrCreditTimeout", "ERR_CREDIT_TIMEOUT"),
        ("kErrMisuse", "ERR_MISUSE"), ("kErrAborted", "ERR_ABORTED")]],
    *[("collectives_types.cuh", c, "circuslink.collectives._layout", py, None) for c, py in [
        ("kTeamErrorBarrier", "ERROR_BARRIER"), ("kTeamErrorSlot", "ERROR_SLOT"), ("kTeamErrorGrid", "ERROR_GRID"),
        ("kTeamErrorStage", "ERROR_STAGE"), ("kTeamErrorClaimed", "ERROR_CLAIMED")]],
    ("router_types.cuh", "kHopMapped", "circuslink.channels.protocol", "ROUTER_HOP_MAPPED", None),
    ("router_types.cuh", "kHopRelay", "circuslink.channels.protocol", "ROUTER_HOP_RELAY", None),
    *[("router_types.cuh", c, "circuslink.channels._routed", py, None) for c, py in [
        ("kVcShift", "VC_SHIFT"), ("kVcMask", "VC_MASK"), ("kCtrl", "KIND_CTRL"), ("kNbytesMask", "ROUTED_NBYTES_MASK"),
        ("kCreditBytes", "CREDIT_PACKET_BYTES"), ("kChainHead", "CHAIN_HEAD"), ("kChainEntries", "CHAIN_ENTRIES"),
        ("kChainBlocked", "CHAIN_BLOCKED"), ("kChainGate", "CHAIN_GATE"), ("kChainDelivery", "CHAIN_DELIVERY"),
        ("kEntryChannel", "ENTRY_CHANNEL"), ("kInLink", "IN_LINK"), ("kInInject", "IN_INJECT"),
        ("kRoleFirst", "ROLE_FIRST"), ("kRoleLast", "ROLE_LAST"), ("kNoChannel", "NO_CHANNEL"),
        ("kNoInput", "NO_INPUT")]],
    ("router_types.cuh", "kAgentGpuScope", "circuslink.channels.protocol", "ROUTER_GPU_SCOPE", None),
    *[("rma_types.cuh", c, "circuslink.rma._layout", py, None) for c, py in [
        ("kRmaChunkBytes", "CHUNK_BYTES"), ("kRmaGpuScope", "GPU_SCOPE"), ("kRmaLowLatency", "LOW_LATENCY"),
        ("kRmaSignalOnly", "SIGNAL_ONLY"), ("kRmaLLDepth", "LL_DEPTH"), ("kRmaSmallChainBytes", "SMALL_CHAIN_BYTES"),
        ("kRmaErrSession", "ERR_SESSION")]],
    *[("router_types.cuh", c, "circuslink.channels.protocol", py, None) for c, py in [
        ("kSharedPerInput", "ROUTER_SHARED_PER_INPUT"), ("kSharedPerOutput", "ROUTER_SHARED_PER_OUTPUT"),
        ("kSharedPerRank", "ROUTER_SHARED_PER_RANK")]],
    ("router_types.cuh", "kChainWords", "circuslink.channels._routed", "CHAIN_BYTES", lambda v: v // 4),
    *[("route_types.cuh", c, "circuslink.topology._routing", c, None)
      for c in ("NO_RANK", "NO_LINK", "PORT_LOCAL", "PORT_NONE", "MAX_VCS")],
    ("route_types.cuh", "LINK_MAPPED", "circuslink.topology._model", "LINK_MAPPED", None),
    ("route_types.cuh", "LINK_NETWORK", "circuslink.topology._model", "LINK_NETWORK", None),
    ("transport_types.cuh", "kModeStore", "circuslink.transport._base", "MODE_STORE", None),
    ("transport_types.cuh", "kModeProxy", "circuslink.transport._base", "MODE_PROXY", None),
    *[("transport_types.cuh", c, "circuslink.transport.nvshmem", py, None) for c, py in [
        ("kProxyStop", "_STOP"), ("kProxyClosing", "_CLOSING"), ("kProxyDiscard", "_DISCARD"),
        ("kProxyError", "_ERROR"), ("kProxyErrRelay", "_ERR_RELAY"), ("kProxyErrSeqLo", "_ERR_SEQ_LO"),
        ("kProxyErrSeqHi", "_ERR_SEQ_HI"), ("kProxyControlWords", "_CONTROL_WORDS")]],
]
_CONSTANT = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*[,;}\n]")


def header_constants(text: str) -> dict[str, int]:
    """Every ``NAME = integer`` of a header's enums and constexprs (comments removed); a name twice is an error."""
    text = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)
    found: dict[str, int] = {}
    for name, value in _CONSTANT.findall(text):
        assert name not in found, f"{name} is defined twice"
        found[name] = int(value, 0)
    return found


def drifted(table=CONSTANTS, headers: dict[str, str] | None = None) -> list[str]:
    """Where a host copy differs from its header (or the header lacks the constant)."""
    parsed = {h: header_constants((headers or {}).get(h) or (DETAIL / h).read_text()) for h in {t[0] for t in table}}
    out = []
    for header, name, module, py, to_header in table:
        host = getattr(importlib.import_module(module), py)
        host = to_header(host) if to_header else host
        if name not in parsed[header]:
            out.append(f"{header}: no constant {name} (the host's {module}.{py} copies it)")
        elif parsed[header][name] != host:
            out.append(f"{header}: {name} = {parsed[header][name]:#x}, but {module}.{py} gives {host:#x}")
    return out


def test_host_copies_of_header_constants_match_the_headers():
    """protocol.py, _routed.py and the routing tables copy constants from the device headers: they cannot drift."""
    assert drifted() == []


def test_a_drifted_constant_is_caught():
    text = (DETAIL / "channel_types.cuh").read_text().replace("kLLPayload = 120", "kLLPayload = 124")
    assert drifted(headers={"channel_types.cuh": text}) == [
        "channel_types.cuh: kLLPayload = 0x7c, but circuslink.channels.protocol.LL_PAYLOAD gives 0x78"]
    gone = (DETAIL / "router_types.cuh").read_text().replace("kCtrl = ", "kControl = ")
    assert "router_types.cuh: no constant kCtrl" in drifted(headers={"router_types.cuh": gone})[0]


def test_the_session_defaults_are_the_headers():
    """What a session's thread holds (its words ahead and lines in flight) is what the host counts in
    Queue.describe()["session_threads"] and in rma_session's refusal."""
    from circuslink.rma import _layout

    text = (DETAIL / "rma_impl.cuh").read_text()
    defaults = dict(re.findall(r"#define (CIRCUSLINK_RMA_\w+) (\d+)", text))
    assert int(defaults["CIRCUSLINK_RMA_WORDS_AHEAD"]) == _layout.SESSION_WORDS_AHEAD, defaults
    assert int(defaults["CIRCUSLINK_RMA_LINES_IN_FLIGHT"]) == _layout.SESSION_LINES_IN_FLIGHT, defaults
    # A block holds the queue when every thread's share fits: 2 words, 4 lines, one target and one origin a thread.
    assert _layout.session_threads(8, 8, 1, 1) == 4 and _layout.session_threads(9, 0, 1, 1) == 5
    assert _layout.session_threads(0, 33, 1, 1) == 9 and _layout.session_threads(0, 0, 3, 7) == 7
    assert _layout.session_threads(0, 0, 0, 0) == 1
