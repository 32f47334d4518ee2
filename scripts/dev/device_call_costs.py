"""The register and stack cost of each device call, for docs/user-kernels.md ("What each call costs").

Compiles device_call_costs.cu (one small kernel per call) with ``nvcc -Xptxas -v`` for Hopper, with the
flags circuslink.compile gives NVRTC (-std=c++17, the include folder), and prints the table; ``--write``
puts it into the doc between its markers. tests/test_user_kernels_doc.py recompiles and fails when the
doc's table is stale (a header change that moves a figure):

    python scripts/dev/device_call_costs.py --write
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = HERE / "device_call_costs.cu"
DOC = REPO / "docs" / "user-kernels.md"
BEGIN, END = "<!-- device-call-costs:begin -->", "<!-- device-call-costs:end -->"
ARCH = "sm_90a"
THREADS = 256

# kernel in device_call_costs.cu -> (the call as a user writes it, who calls it)
CALLS = {
    "baseline": ("(no circuslink call)", "-"),
    "write_warp": ("`tx.write_warp(src, n)`", "a full warp"),
    "read_warp": ("`rx.read_warp(dst, n)`", "a full warp"),
    "write_block": ("`tx.write_block(src, n)`", "the whole block"),
    "read_block": ("`rx.read_block(dst, n)`", "the whole block"),
    "write_grid": ("`tx.write_grid(src, n)`", "the whole (resident) grid"),
    "read_grid": ("`rx.read_grid(dst, n)`", "the whole (resident) grid"),
    "write_one": ("`tx.write(v)`", "one thread"),
    "read_one": ("`rx.read(&v)`", "one thread"),
    "session_write_warp": ("`s = tx.session(); s.write_warp(src, n); s.close()`", "a full warp"),
    "session_read_warp": ("`s = rx.session(); s.read_warp(dst, n); s.close()`", "a full warp"),
    "try_write_warp": ("`tx.try_write_warp(src, n)`", "a full warp"),
    "try_read_warp": ("`rx.try_read_warp(dst, n)`", "a full warp"),
    "test_one": ("`rx.test(n)`", "one thread"),
    "test_warp": ("`rx.test_warp(n)`", "a full warp"),
    "grid_sync": ("`circuslink::grid_sync(bar)`", "every thread of the grid"),
    "halo_write_read_warp": ("`halo.to[d].write_warp(...) && halo.from[d].read_warp(...)`", "a full warp"),
    "halo_copied_ends": ("`tx = halo.to[d]; rx = halo.from[d]; tx.write_warp(...) && rx.read_warp(...)`",
                         "a full warp"),
}

_FUNCTION = re.compile(r"Function properties for (\w+)")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes cumulative stack size)?")


def _parse(log: str) -> dict[str, tuple[int, int]]:
    """ptxas -v: a kernel's "Used N registers" line follows its own "Function properties" block."""
    found, current = {}, None
    for line in log.splitlines():
        if m := _FUNCTION.search(line):
            current = m.group(1)
        elif (m := _USED.search(line)) and current is not None:
            found[current] = (int(m.group(1)), int(m.group(2) or 0))
            current = None
    return found


def measure(nvcc: str | None = None) -> dict[str, tuple[int, int]]:
    """``{kernel: (registers, stack bytes)}`` as ptxas reports them."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("device_call_costs: nvcc not found")
    include = REPO / "src" / "circuslink" / "include"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([nvcc, "-std=c++17", f"-arch={ARCH}", f"-I{include}", "-Xptxas", "-v", "-c",
                               str(SOURCE), "-o", str(Path(tmp) / "costs.o")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"device_call_costs: nvcc failed:\n{proc.stderr}")
    found = _parse(proc.stderr)
    missing = sorted(set(CALLS) - set(found))
    if missing:
        raise SystemExit(f"device_call_costs: ptxas reported nothing for {', '.join(missing)}")
    return {k: found[k] for k in CALLS}


def table(costs: dict[str, tuple[int, int]]) -> str:
    """The doc's markdown table."""
    sys.path.insert(0, str(REPO / "src"))
    from circuslink.backends._occupancy import DeviceLimits, KernelAttributes, blocks_per_sm

    lines = [f"| call | called by | registers a thread | stack a thread (B) | blocks an SM at {THREADS} threads |",
             "| --- | --- | ---: | ---: | ---: |"]
    for kernel, (call, who) in CALLS.items():
        regs, stack = costs[kernel]
        fits = blocks_per_sm(KernelAttributes(kernel, regs), DeviceLimits(), THREADS)
        lines.append(f"| {call} | {who} | {regs} | {stack} | {fits} |")
    return "\n".join(lines)


def doc_table(text: str) -> str:
    """The table between the doc's markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"put the table into {DOC.relative_to(REPO)}")
    args = parser.parse_args()
    text = table(measure())
    if args.write:
        doc = DOC.read_text()
        start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
