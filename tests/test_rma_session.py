"""The RMA queues' device code on the cpu: rma_start / rma_wait and rma_session (<circuslink/rma.cuh>) compiled
as host C++ with g++ (tests/data/rma_session_emulation.cpp), every rank's block a set of host threads, the queues
laid out as the cuda module commits a low-latency queue. Every cycle's received bytes are checked; ranks may drive
the same queue each in its own way (the protocol is one); a rank that never runs, a session refused and a target
that never consumes end in the errors the host reports. What the GPU adds (its memory model, MPS) is in
tests/test_rma_cuda.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from circuslink.rma import _layout

CXX = shutil.which("g++") or shutil.which("c++")
DATA = Path(__file__).parent / "data"
INCLUDE = Path(__file__).parents[1] / "src" / "circuslink" / "include" / "circuslink"
_LINE = re.compile(r"rank (\d+) done (\d+) bad (\d+) taken (\d+) error (\d+) (\d+) (\d+) epoch (\d+) words (\d+) "
                   r"lines (\d+) to ([\d,-]+) from ([\d,-]+)")
KEYS = ("rank", "done", "bad", "taken", "code", "who", "at", "epoch", "words", "lines")

pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++20 compiler (.ci/run installs g++)")


@pytest.fixture(scope="module")
def emulation(tmp_path_factory) -> Path:
    """The harness built against a copy of the public headers whose detail/sync.cuh is the host stand-in."""
    root = tmp_path_factory.mktemp("rma-emulation")
    shutil.copytree(INCLUDE, root / "include" / "circuslink")
    shutil.copy(DATA / "rma_sync_host.cuh", root / "include" / "circuslink" / "detail" / "sync.cuh")
    exe = root / "rma_session_emulation"
    build = subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", "-I", str(root / "include"),
                            "-x", "c++", str(DATA / "rma_session_emulation.cpp"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-3000:]
    return exe


def run(exe: Path, ranks: int, threads: int, cycles: int, seed: int, modes: str, silent: int = -1,
        stopped: int = -1, timeout_ms: int = 20000) -> list[dict]:
    got = subprocess.run([str(exe), str(ranks), str(threads), str(cycles), str(seed), modes, str(silent), str(stopped),
                          str(timeout_ms)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    ranks_of = lambda text: [int(x) for x in text.split(",") if x != "-"]  # noqa: E731
    rows = [dict(zip(KEYS, map(int, m.groups()[:-2]), strict=True), targets=ranks_of(m.group(11)),
                 sources=ranks_of(m.group(12))) for m in _LINE.finditer(got.stdout)]
    assert [r["rank"] for r in rows] == list(range(ranks)), got.stdout
    return rows


def _taken(r: dict, threads: int) -> bool:
    return _layout.session_threads(r["words"], r["lines"], len(r["targets"]), len(r["sources"])) <= threads


@pytest.mark.parametrize("ranks, modes", [(2, "cc"), (2, "ss"), (2, "cs"), (3, "sms"), (4, "mscs"), (4, "ssss")])
def test_every_byte_arrives_however_each_rank_drives_the_queue(emulation, seed, ranks, modes):
    """40 cycles (ten times the staging's depth), random chains to random targets; c: rma_start / rma_wait, s: a
    session, m: a session, then rma_start / rma_wait from its epoch, then a session again."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        s = int(rng.integers(1 << 31))
        for r in run(emulation, ranks, 32, 40, s, modes):
            assert (r["done"], r["bad"], r["code"], r["epoch"]) == (40, 0, 0, 40), (s, r)
            opened = modes[r["rank"]] != "c"
            assert r["taken"] == (int(_taken(r, 32)) if opened else 2), (s, r)


@pytest.mark.parametrize("modes", ["sss", "ccc", "mmm"])
def test_origins_wait_for_a_slow_target_to_free_its_staging(emulation, seed, modes):
    """Rank 2 writes nothing and dawdles at every cycle: ranks 0 and 1, which wait for each other only, run ahead of
    it until its credits hold them (an origin that stored into a slot its target had not consumed would overwrite
    an epoch the target still waits for: its wait would time out)."""
    rng = np.random.default_rng(seed)
    for _ in range(4):
        s = int(rng.integers(1 << 31))
        for r in run(emulation, 3, 16, 40, s, modes, silent=2, timeout_ms=5000):
            assert (r["done"], r["bad"], r["code"], r["epoch"]) == (40, 0, 0, 40), (s, r)


def _named_as_it_stopped(r: dict) -> bool:
    """Whether a rank's recorded error fits where it stopped: an origin's writes missing at the epoch after its last
    (code 2), or a target's credit missing at the staging's depth (code 1: the epoch the target had to consume)."""
    if r["code"] == 2:
        return r["who"] in r["sources"] and r["at"] == r["done"] + 1
    return r["code"] == 1 and r["who"] in r["targets"] and r["at"] == r["done"] + 1 - _layout.LL_DEPTH


def _held_by(rows: list[dict], stopped: int) -> set[int]:
    """The ranks a rank that never runs holds, directly or through others: a rank waits for its origins' lines and
    for its targets' credits."""
    held, grew = {stopped}, True
    while grew:
        grew = False
        for r in rows:
            if r["rank"] not in held and held & set(r["sources"] + r["targets"]):
                held.add(r["rank"])
                grew = True
    return held - {stopped}


@pytest.mark.parametrize("modes", ["ssss", "cccc", "scsm"])
def test_a_rank_that_never_runs_is_named_by_the_waits(emulation, seed, modes):
    """Rank 1 never starts: every rank that receives from it records, at epoch 1, its origin 1 (code 2: an origin's
    writes did not arrive), whether it waited by rma_wait or in a session; the others stop where the ranks they
    need stopped, and record those."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        s = int(rng.integers(1 << 31))
        rows = run(emulation, 4, 16, 10, s, modes, stopped=1, timeout_ms=1000)
        held = _held_by(rows, 1)
        for r in rows:
            if r["rank"] == 1:
                assert (r["done"], r["epoch"], r["code"]) == (0, 0, 0), (s, r)
            elif 1 in r["sources"]:
                assert (r["done"], r["code"], r["who"], r["at"]) == (0, 2, 1, 1), (s, r)
            elif r["rank"] in held:
                assert _named_as_it_stopped(r), (s, r)
            else:  # waits for no rank that stopped, directly or through others
                assert (r["done"], r["code"]) == (10, 0), (s, r)


@pytest.mark.parametrize("modes", ["sss", "ccc"])
def test_a_target_that_never_consumes_holds_its_origins_at_the_staging_depth(emulation, seed, modes):
    """Rank 2 writes nothing and never runs: its origins store kRmaLLDepth epochs into its staging, then their start
    waits for its credit and records it (code 1: a target did not post), naming the epoch it had to consume."""
    depth = _layout.LL_DEPTH
    rng = np.random.default_rng(seed)
    for _ in range(3):
        s = int(rng.integers(1 << 31))
        rows = run(emulation, 3, 16, 20, s, modes, silent=2, stopped=2, timeout_ms=1000)[:2]
        if not any(2 in r["targets"] for r in rows):  # nobody writes to rank 2: nothing holds anyone
            assert all((r["done"], r["code"]) == (20, 0) for r in rows), (s, rows)
        for r in rows:
            if 2 in r["targets"]:
                assert r["done"] <= depth and _named_as_it_stopped(r), (s, r)
                if r["code"] == 1:
                    assert (r["who"], r["at"], r["done"]) == (2, 1, depth), (s, r)
            elif 2 in rows[1 - r["rank"]]["targets"]:  # held by its peer (it writes there), held at the depth
                assert r["done"] <= 2 * depth and r["who"] == 1 - r["rank"] and _named_as_it_stopped(r), (s, r)


def test_a_session_that_cannot_hold_the_queue_is_refused_and_named(emulation, seed):
    """Blocks of 4 threads hold 8 words and 16 lines: a rank whose queue needs more refuses its session (code 4,
    the block's threads), returns false at once, and the ranks that wait for it record it."""
    rng = np.random.default_rng(seed)
    refused = 0
    for _ in range(6):
        s = int(rng.integers(1 << 31))
        rows = run(emulation, 4, 4, 10, s, "ssss", timeout_ms=1000)
        for r in rows:
            assert r["taken"] == int(_taken(r, 4)), (s, r)
            if not r["taken"]:
                refused += 1
                assert (r["done"], r["code"], r["who"], r["at"], r["epoch"]) == (0, _layout.ERR_SESSION, 4, 0, 0), r
        if all(r["taken"] for r in rows):
            assert all((r["done"], r["bad"], r["code"]) == (10, 0, 0) for r in rows), (s, rows)
    assert refused, "no plan needed more than 4 threads: the refusal was not exercised"
