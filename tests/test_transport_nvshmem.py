"""The nvshmem transport: its library (nvcc -rdc against NVSHMEM: bootstrap, on-stream puts, the proxy kernel) and,
on the GPU, connections and relays between declared nodes.

Without a GPU: why it cannot run, in one line (no kernels; no NVSHMEM; no nvcc); the library builds against the
nvidia-nvshmem-cu13 package wherever NVSHMEM's headers and nvcc are found (CI without NVSHMEM compiles the
source without them: tests/test_device_headers.py), and its structs match the tables (tests/test_abi.py). On the
GPU (scripts/gpu-check.sh, 2 declared nodes of 2 ranks sharing the GPU under MPS): put-with-signal byte-exact
between nodes; device agents pingpong through a relay's rings with the proxy kernel carrying them; routed
channels between nodes cross it (tests/test_gateway_gpu.py runs them over every transport).
"""

from __future__ import annotations

import pytest

from circuslink import BackendError
from circuslink.transport import Context, _build
from circuslink.transport import nvshmem as tnv

NODES_2X2 = {"CIRCUSLINK_RANKS_PER_NODE": "2", "CIRCUSLINK_TRANSPORT": "nvshmem"}


def _buildable() -> str | None:
    try:
        _build.find_nvshmem()
        _build.find_nvcc()
    except BackendError as exc:
        return str(exc)
    return None


def test_why_it_cannot_run_is_one_line(monkeypatch, tmp_path):
    assert tnv.NvshmemTransport.unavailable(Context(runs_kernels=False, under_mpi=True)) == \
        "it needs a back-end that runs kernels (GPUs)"
    monkeypatch.setattr(_build, "nvidia_dirs", lambda: [])
    monkeypatch.setenv("NVSHMEM_HOME", str(tmp_path / "nowhere"))
    why = tnv.NvshmemTransport.unavailable(Context(runs_kernels=True, under_mpi=True))
    assert why.startswith("NVSHMEM not found (looked in ") and why.endswith(
        "pip install nvidia-nvshmem-cu13 or set NVSHMEM_HOME") and "\n" not in why


@pytest.mark.skipif(_buildable() is not None, reason=f"NVSHMEM or nvcc not here: {_buildable()}")
def test_the_library_builds_against_nvshmem(tmp_path, monkeypatch):
    """nvcc -rdc against the package's headers and device library; the exported entry points are there (the
    library is not loaded: that needs a GPU)."""
    import subprocess

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = _build.build_cached("transport", "libcircuslink_nvshmem", tnv.SOURCE, tnv._command)
    symbols = subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True, timeout=60).stdout
    for name in ("circuslink_nvshmem_init", "circuslink_nvshmem_put_signal", "circuslink_nvshmem_proxy_launch",
                 "circuslink_nvshmem_malloc", "circuslink_nvshmem_quiet"):
        assert f" T {name}" in symbols, name


# ---- on the GPU ------------------------------------------------------------------------------------------------

CONNECT = """
import os, numpy as np, cupy as cp, circuslink as cl
from circuslink import transport
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
w = cl.init()
peer = (w.rank + 2) % 4                                   # the same local rank in the other node
conn = transport.connect(w, peer, nbytes=1 << 22, nsignals=2, timeout=60)
assert conn.transport.name == "nvshmem" and conn.capabilities.device_initiated
for k in range(1, 6):
    g = np.random.default_rng([seed, w.rank, k])
    d = cp.asarray(g.integers(0, 256, int(g.integers(1, 1 << 22)), dtype=np.uint8))
    conn.put_with_signal(0, d, 0, k)
    conn.wait(0, k)
    want = np.random.default_rng([seed, peer, k])
    want = want.integers(0, 256, int(want.integers(1, 1 << 22)), dtype=np.uint8)
    assert conn.inbox()[:want.size].get().tobytes() == want.tobytes(), k
    conn.flush()
    conn.signal(1, k)                                     # read: the peer may put round k + 1
    conn.wait(1, k)
conn.close()
print("nvshmem connections ok", w.rank, flush=True)
w.close()
"""


@pytest.mark.gpu
@pytest.mark.mpi
def test_connections_between_nodes_gpu(spmd):
    job = spmd(4, CONNECT, backend="cuda", launcher="mpirun", env=NODES_2X2, timeout=300).check()
    assert job.stdout.count("nvshmem connections ok") == 4, job.output


RELAY_PINGPONG = """
import os, numpy as np, cupy as cp, circuslink as cl
from circuslink import transport
from circuslink.bench.pingpong import GRID_THREADS, KERNELS
from circuslink.channels import protocol as P
w = cl.init()
rel = transport.open_relays(w, [(0, 2)], nslots=16, chunk=64 << 10, timeout=30)
if w.rank in (0, 2):
    assert rel.transports() == {2 - w.rank: "nvshmem"}, rel.transports()
    role, link = (0, rel[2]) if w.rank == 0 else (1, rel[0])
    mod = cl.compile(KERNELS.read_text())
    tx, rx = link.sender_handle(P.route_of(0, 2 - w.rank)), link.receiver_handle()
    stream = w.backend.stream
    for n, form in [(8, "warp"), (120, "warp"), (4096, "warp"), (1 << 20, "warp"), (3 << 20, "warp2")]:
        with stream:
            status = cp.ones(1, dtype=cp.int32)
            times = cp.zeros(2, dtype=cp.uint64)
            src = cp.random.RandomState(n).randint(0, 256, n, dtype=cp.uint8)
            dst = cp.zeros(n, dtype=cp.uint8)
            args = (tx, rx, src, dst, np.uint64(n), np.int32(role), np.int32(2), np.int32(20))
            mod.get_function("pingpong_" + form)((1,), (64 if form == "warp2" else 32,), args + (times, status))
        w.backend.wait_stream(stream, 90, f"relay pingpong {form} {n} on rank {w.rank}")
        link.device_error()
        assert int(status.get()[0]) == 1, (form, n)
        if role == 0:
            assert bool(cp.array_equal(src, dst).get()), (form, n)
            t0, t1 = (int(v) for v in times.get())
            print("OK", form, n, f"{(t1 - t0) / 40 / 1e3:.2f} us one-way", flush=True)
w.barrier()
rel.close()
w.close()
"""


@pytest.mark.gpu
@pytest.mark.mpi
def test_device_agents_pingpong_through_an_nvshmem_relay_gpu(spmd):
    """The gateways' kernels use the relay's rings (symmetric heap) as channel ends; the proxy kernels carry the
    packets both ways (low-latency and bulk, a message larger than a ring); every byte checked."""
    job = spmd(4, RELAY_PINGPONG, backend="cuda", launcher="mpirun", env=NODES_2X2, timeout=300).check()
    for form, n in [("warp", 8), ("warp", 120), ("warp", 4096), ("warp", 1 << 20), ("warp2", 3 << 20)]:
        assert f"OK {form} {n} " in job.stdout, job.output
