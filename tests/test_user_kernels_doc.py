"""docs/user-kernels.md stays true: its table of registers and stack by device call is what nvcc reports for the
headers as they are now (scripts/dev/device_call_costs.py --write refreshes it), its grid-sizing table is what
the rule computes, and the API it names exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import builds_for

import circuslink as cl
from circuslink.backends._base import Backend
from circuslink.backends._occupancy import DeviceLimits, KernelAttributes, blocks_per_sm, resident_blocks

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "user-kernels.md"


def _tool():
    path = REPO / "scripts" / "dev" / "device_call_costs.py"
    spec = importlib.util.spec_from_file_location("device_call_costs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def background_builds(root: Path) -> list:
    """The cost table's compiles (conftest.Builds: started early on a spare core)."""
    if shutil.which("nvcc") is None:
        return []
    tool = _tool()
    return [("cost table", lambda: tool.table(tool.measure()), ())]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_cost_table_is_what_nvcc_reports_now():
    fresh = builds_for(sys.modules[__name__])["cost table"].result()
    assert _tool().doc_table(DOC.read_text()) == fresh, (
        "docs/user-kernels.md's cost table is stale: run python scripts/dev/device_call_costs.py --write\n" + fresh)


def test_the_sizing_table_is_what_the_rule_gives():
    text = DOC.read_text()
    section = text[text.index("| registers a thread | blocks an SM | 1 rank"):]
    rows = [line for line in section.splitlines()[2:] if line.startswith("|")][:4]
    budgets = (132, 66, 33, 16)
    for line in rows:
        cells = [int(c) for c in line.strip("| ").split("|")]
        regs, per_sm, *blocks = cells
        assert blocks_per_sm(KernelAttributes("k", regs), DeviceLimits(), 256) == per_sm, line
        assert blocks == [resident_blocks(per_sm, b, k) for k, b in zip((1, 2, 4, 8), budgets, strict=True)], line


def test_the_api_the_page_names_exists():
    text = DOC.read_text()
    for name in ("launch_resident", "grid_barrier", "max_blocks", "wait_stream"):
        assert f"world.backend.{name}(" in text and hasattr(Backend, name), name
    assert "ch.wait_kernel(" in text and "stream" in cl.channels.Channels.wait_kernel.__code__.co_varnames
    assert "cl.channels.open_halo(" in text and callable(cl.channels.open_halo)
    for header in re.findall(r"`(\w+\.cuh)`", text):
        assert (REPO / "src" / "circuslink" / "include" / "circuslink" / header).is_file(), header
