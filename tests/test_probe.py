"""The probe runs on every back-end and reports every figure for every ordered pair."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from circuslink.probe import METRICS, REFERENCE_H200_NV18, check_against_reference


def _probe(tmp_path, backend: str, n: int) -> dict:
    out = tmp_path / "floor.json"
    proc = subprocess.run(
        [sys.executable, "-m", "circuslink", "probe", "--quick", "--backend", backend, "-n", str(n),
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lat_relaxed_us" in proc.stdout
    return json.loads(out.read_text())


def _check(doc: dict, n: int) -> None:
    floor = doc["floor"]
    pairs = {(p["a"], p["b"]) for p in floor["pairs"]}
    assert pairs == {(a, b) for a in range(n) for b in range(n) if a != b}
    for p in floor["pairs"]:
        for key in METRICS:
            assert p[key] > 0, (key, p)
    assert doc["benchmark"] == "probe" and doc["commit"] and doc["date"] and doc["device"]


@pytest.mark.parametrize("n", [2, 3])
def test_probe_cpu(tmp_path, n):
    _check(_probe(tmp_path, "cpu", n), n)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_probe_cuda(tmp_path, n):
    """Ranks beyond the GPU count share GPUs under MPS: the probe runs its full loops, without the
    time-slice warning, and records that MPS was active."""
    floor = _probe(tmp_path, "cuda", n)
    _check(floor, n)
    if floor["floor"].get("shared_gpus"):
        assert floor["floor"]["mps"] is True, floor["floor"]


def test_reference_check_names_misses():
    good = {"summary": dict(REFERENCE_H200_NV18)}
    assert check_against_reference(good) == []
    bad = {"summary": dict(REFERENCE_H200_NV18, lat_relaxed_us=0.75, ce_GBps=300.0)}
    misses = check_against_reference(bad)
    assert len(misses) == 2 and any(m.startswith("lat_relaxed_us") for m in misses)


def test_probe_figures_come_from_the_timed_operations(spmd):
    """A copy made 40 ms slower must show in the copy-engine figure and only there: the probe reports
    what it timed, not constants (the other figures stay far above the slowed one)."""
    job = spmd(2, """
        import time, numpy as np, circuslink as cl
        from circuslink import probe
        from circuslink.probe import _cpu
        real = np.copyto
        def slow_copy(dst, src, *a, **k):
            time.sleep(0.04)
            return real(dst, src, *a, **k)
        _cpu.np = type("np_with_a_slow_copy", (), {"__getattr__": lambda self, n: getattr(np, n),
                                                    "copyto": staticmethod(slow_copy)})()
        w = cl.init()
        floor = probe.measure(w, quick=True, pairs=[(0, 1)])
        if w.rank == 0:
            p = floor["pairs"][0]
            ceiling = (8 << 20) / 0.04 / 1e9   # 8 MiB in at least 40 ms
            assert p["ce_GBps"] <= ceiling, p
            assert p["sm_store_GBps"] > 2 * ceiling and p["sm_load_GBps"] > 2 * ceiling, p
            print("probe follows its timings")
        w.close()
    """)
    job.check()
    assert "probe follows its timings" in job.stdout
