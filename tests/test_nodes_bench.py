"""`circuslink bench nodes`: every transport between nodes side by side with its own point-to-point (MPI; NVSHMEM's
put-with-signal on the GPU), the "+ one intra-node hop" references, a channel inside a node, and per transport
its relay's pipe and a routed channel through both gateways (source -> gateway -> transport -> gateway ->
destination), on 2 and 3 declared nodes, with the floor and the targets' verdicts, in the one results format.
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


def _check(data: dict, gateways: list[int], nodes: list[list[int]], baselines: dict[str, str],
           link_forms: set[str]) -> None:
    """``baselines``: transport -> the impl of its own one-way row."""
    assert data["benchmark"] == "nodes" and data["nranks"] == sum(map(len, nodes))
    assert data["meta"]["gateways"] == gateways and data["meta"]["nodes"] == nodes
    assert data["meta"]["transports"] == list(baselines)
    pairs = {(p["a"], p["b"]) for p in data["floor"]["pairs"]}
    assert {(0, 1), (1, 0), tuple(gateways)} <= pairs
    rows = data["rows"]
    assert all(r["verified"] for r in rows if "verified" in r)
    intra = {r["bytes"]: r for r in rows if r["impl"] == "intra-node"}
    for name, base in baselines.items():
        sizes = sorted({r["bytes"] for r in rows if r["impl"] == base})
        assert sizes, (name, base)
        assert data["meta"]["measured_figures"][name][0] == min(
            (r for r in rows if r["impl"] == base), key=lambda r: r["bytes"])["one_way_us"]
        for n in sizes:
            got = {r["impl"] for r in rows if r["bytes"] == n}
            assert {base, f"{base}+hop", f"relay-{name}", "intra-node", f"gateway-routed-{name}"} <= got, (n, got)
            assert got & {f"relay-{name}-{f}" for f in link_forms}
            own = next(r for r in rows if r["impl"] == base and r["bytes"] == n)
            hop = next(r for r in rows if r["impl"] == f"{base}+hop" and r["bytes"] == n)
            assert hop["one_way_us"] == pytest.approx(own["one_way_us"] + intra[n]["one_way_us"]) and hop["reference"]
            link = next(r for r in rows if r["impl"] == f"relay-{name}" and r["bytes"] == n)
            assert link["added_us"] == pytest.approx(link["one_way_us"] - own["one_way_us"])
            assert link["min_one_way_us"] <= link["one_way_us"] and link["throughput_GBps"] > 0
            routed = next(r for r in rows if r["impl"] == f"gateway-routed-{name}" and r["bytes"] == n)
            assert routed["verified"] and routed["route"] == [1, 0, 2, 3] and routed["ranks"] == [1, 3]
            assert routed["route_back"] == [3, 2, 0, 1] and routed["transport"] == name
            assert routed["added_us"] == pytest.approx(routed["one_way_us"] - hop["one_way_us"])
            assert routed["vs_transport_plus_hop_latency"] == pytest.approx(routed["one_way_us"] / hop["one_way_us"])
        verdicts = data["meta"]["targets"]["transports"][name]
        line = next(x for x in data["meta"]["targets"]["lines"] if x.startswith(f"gateway-routed over {name} at"))
        assert f"= {verdicts['latency_ratio']:.2f} x ({base} " in line and "target <= 1.3 x: " in line
        assert ("met" if verdicts["latency_met"] else "missed") in line


@pytest.mark.mpi
def test_bench_nodes_cpu(tmp_path):
    proc, data = _bench(tmp_path, "--backend", "cpu")
    _check(data, [0, 2], [[0, 1], [2, 3]], {"mpi": "mpi"}, {"host"})
    assert "gateway-routed over mpi at 8 B: one-way" in proc.stdout
    assert "relay over mpi at 8 B: one-way" in proc.stdout


@pytest.mark.mpi
def test_bench_nodes_three_nodes_cpu(tmp_path):
    proc, data = _bench(tmp_path, "--backend", "cpu", "-n", "6", "--ranks-per-node", "2", "--sizes", "64",
                        "--no-baselines")
    assert data["meta"]["gateways"] == [0, 2] and len(data["meta"]["nodes"]) == 3
    assert not [r for r in data["rows"] if r["impl"] == "mpi"]  # --no-baselines: no MPI rows
    assert [r["bytes"] for r in data["rows"] if r["impl"] == "relay-mpi"] == [64]
    routed = [r for r in data["rows"] if r["impl"] == "gateway-routed-mpi"]
    assert [(r["bytes"], r["route"], r["verified"]) for r in routed] == [(64, [1, 0, 2, 3], True)]
    assert data["meta"]["gateway_routed"]["mpi"]["ranks"] == [1, 3]
    assert "gateway-routed over mpi: no latency verdict" in proc.stdout


@pytest.mark.mpi
def test_bench_nodes_refuses_a_transport_that_cannot_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "circuslink", "bench", "nodes", "--backend", "cpu", "--quick",
                           "--transports", "nvshmem"], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 1
    assert "circuslink: error: bench nodes --transports: transport nvshmem cannot be used: it needs a back-end that " \
           "runs kernels (GPUs)" in proc.stderr, proc.stderr


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
    """2 declared nodes x 2 ranks on the one GPU under MPS: nvshmem (proxy kernel, symmetric heap) and mpi (pinned
    rings, host-staged MPI) side by side against NVSHMEM's put-with-signal and MPI; device agents on the relays'
    rings; the gateway-routed channel through the router kernels (one warp, two warps and the grid)."""
    _, data = _bench(tmp_path, "--backend", "cuda", "--sizes", "8,4K,1M,16M", timeout=900)
    _check(data, [0, 2], [[0, 1], [2, 3]], {"mpi": "mpi-host-staged", "nvshmem": "nvshmem-put-signal"},
           {"warp", "warp2", "grid"})
    for name in ("mpi", "nvshmem"):
        forms = {r["form"] for r in data["rows"] if str(r["impl"]).startswith(f"gateway-routed-{name}-")}
        assert {"warp", "grid"} <= forms, (name, forms)
