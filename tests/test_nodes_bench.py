"""`circuslink bench nodes` (issue 13): the engine alone (MPI point-to-point between the gateways), the engine
link's pipe, a channel inside a node and a routed channel through both gateways (source -> gateway -> engine ->
gateway -> destination), on 2 and 3 declared nodes, with the floor and the targets as ratios, in the one results
format.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _bench(tmp_path, *argv: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "nodes.json"
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "nodes", "--quick", "--json", str(out), *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def _check(data: dict, gateways: list[int], nodes: list[list[int]], engine: str, link_forms: set[str]) -> None:
    assert data["benchmark"] == "nodes" and data["nranks"] == sum(map(len, nodes))
    assert data["meta"]["gateways"] == gateways and data["meta"]["nodes"] == nodes
    pairs = {(p["a"], p["b"]) for p in data["floor"]["pairs"]}
    assert {(0, 1), (1, 0), tuple(gateways)} <= pairs
    rows = data["rows"]
    sizes = sorted({r["bytes"] for r in rows if r["impl"] == engine})
    assert sizes and all(r["verified"] for r in rows if "verified" in r)
    for n in sizes:
        got = {r["impl"] for r in rows if r["bytes"] == n}
        assert {engine, "engine-link", "intra-node", "gateway-routed"} <= got, (n, got)
        assert got & {f"engine-link-{f}" for f in link_forms}
        link = next(r for r in rows if r["impl"] == "engine-link" and r["bytes"] == n)
        mpi = next(r for r in rows if r["impl"] == engine and r["bytes"] == n)
        assert link["added_us"] == pytest.approx(link["one_way_us"] - mpi["one_way_us"])
        assert link["min_one_way_us"] <= link["one_way_us"] and link["throughput_GBps"] > 0
        routed = next(r for r in rows if r["impl"] == "gateway-routed" and r["bytes"] == n)
        assert routed["verified"] and routed["route"] == [1, 0, 2, 3] and routed["ranks"] == [1, 3]
        assert routed["route_back"] == [3, 2, 0, 1]
        intra = next(r for r in rows if r["impl"] == "intra-node" and r["bytes"] == n)
        assert routed["added_us"] == pytest.approx(routed["one_way_us"] - mpi["one_way_us"] - intra["one_way_us"])
        assert routed["vs_engine_plus_hop_latency"] == pytest.approx(
            routed["one_way_us"] / (mpi["one_way_us"] + intra["one_way_us"]))
    targets = data["meta"]["targets"]
    line = next(x for x in targets["lines"] if x.startswith("gateway-routed at"))
    assert f"= {targets['routed_latency_ratio']:.2f} x ({engine} " in line and "target <= 1.3 x: " in line


@pytest.mark.mpi
def test_bench_nodes_cpu(tmp_path):
    proc, data = _bench(tmp_path, "--backend", "cpu")
    _check(data, [0, 2], [[0, 1], [2, 3]], "mpi", {"host"})
    assert "gateway-routed at 8 B: one-way" in proc.stdout
    assert "engine link at 8 B: one-way" in proc.stdout


@pytest.mark.mpi
def test_bench_nodes_three_nodes_cpu(tmp_path):
    proc, data = _bench(tmp_path, "--backend", "cpu", "-n", "6", "--ranks-per-node", "2", "--sizes", "64",
                        "--no-baselines")
    assert data["meta"]["gateways"] == [0, 2] and len(data["meta"]["nodes"]) == 3
    assert not [r for r in data["rows"] if r["impl"] == "mpi"]  # --no-baselines: no MPI rows
    assert [r["bytes"] for r in data["rows"] if r["impl"] == "engine-link"] == [64]
    routed = [r for r in data["rows"] if r["impl"] == "gateway-routed"]
    assert [(r["bytes"], r["route"], r["verified"]) for r in routed] == [(64, [1, 0, 2, 3], True)]
    assert data["meta"]["gateway_routed"]["ranks"] == [1, 3]


@pytest.mark.mpi
def test_bench_nodes_refuses_a_job_of_one_node(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "nodes", "--backend", "cpu", "-n", "3",
                           "--ranks-per-node", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == "circuslink: error: bench nodes needs at least 2 whole nodes: -n 3 with --ranks-per-node 2\n"


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.mpi
def test_bench_nodes_gpu(tmp_path):
    """2 declared nodes x 2 ranks on the one GPU under MPS: device agents on pinned rings against host-staged MPI;
    the gateway-routed channel through the router kernels (one warp, two warps and the grid)."""
    _, data = _bench(tmp_path, "--backend", "cuda", "--sizes", "8,4K,1M,16M", timeout=900)
    _check(data, [0, 2], [[0, 1], [2, 3]], "mpi-host-staged", {"warp", "warp2", "grid"})
    forms = {r["form"] for r in data["rows"] if str(r["impl"]).startswith("gateway-routed-")}
    assert {"warp", "grid"} <= forms, forms
