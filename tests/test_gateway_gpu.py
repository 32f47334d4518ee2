"""Gateway-routed channels on GPUs: user kernels at the ends of routed channels that cross declared nodes; the
router kernels forward into and out of the gateways' relays, over each transport between nodes: mpi (rings in
pinned host memory, the compiled progress thread, host-staged MPI) and nvshmem (rings in the symmetric heap, the
proxy kernel's puts).

Run on the device machine: 2 declared nodes x 2 ranks started by mpirun, every rank sharing the one GPU under
MPS (``scripts/gpu-check.sh tests``). The kernels are tests/kernels/routed_user.cu (public device API only).
The cpu reference of the same properties is tests/test_gateway_jobs.py (jobs) and tests/test_gateway.py.
"""

from __future__ import annotations

import pytest
from test_routed_gpu import KERNELS, _all_pairs, _exchange

NODES_2 = {"CIRCUSLINK_RANKS_PER_NODE": "2"}
MAPPED = "assert ch._buf.mapped == sorted(set(ch.topology.neighbours(w.rank)) | {w.rank})"
MAPPED_IN_NODE = "assert ch._buf.mapped == w.nodes[w.node], (ch._buf.mapped, w.nodes)"


TRANSPORTS = ["mpi", "nvshmem"]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("topo", ["nodes:2x2", "nodes:2x2,gw=1"])
def test_all_to_all_across_nodes_gpu(spmd, topo, transport):
    """Every rank to every other, 6 messages of random sizes each (low-latency and bulk packets), from one
    kernel per rank serving all its ends; link rings of 4 slots, relay rings of the default 64: completes,
    every byte checked on the receiving device; no memory mapped across nodes."""
    code = _exchange(topo, _all_pairs(4))
    assert MAPPED in code
    code = code.replace(MAPPED, MAPPED_IN_NODE)
    env = dict(NODES_2, CIRCUSLINK_TRANSPORT=transport)
    job = spmd(4, code, backend="cuda", launcher="mpirun", env=env, timeout=240, tag=True).check()
    assert "CHANNEL-ERROR" not in job.output
    for r in range(4):  # each rank's own lines, by its tag: two ranks' output may interleave on a shared stdout
        assert f"exchange ok {r} 2" in job.rank_lines(r), job.output  # the 2 channels to the other node are routed


GRID_AND_HOST = f"""
import numpy as np, cupy as cp, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
w = cl.init()
u4 = element_type("uint4")
links = [Link("far", "far_in", 0, 1, 1, 3, u4, 2048), Link("back", "back_in", 2, 3, 3, 1, u4, 2048),
         Link("gw", "gw_in", 4, 5, 0, 2, u4, 2048)]
opts = {{name: {{"nslots": 8, "chunk": 4096}} for name in ("far", "back", "gw")}}
ch = channels.open(w, links, topology="nodes:2x2", options=opts, timeout=30, relay={{"nslots": 4}})
import os
assert set(ch.relays.transports().values()) <= {{os.environ["CIRCUSLINK_TRANSPORT"]}}
assert ch.route("far") == [1, 0, 2, 3] and ch.route("back") == [3, 2, 0, 1] and ch.route("gw") == [0, 2]
mod = cl.compile(open({str(KERNELS)!r}).read())
rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
stream = cp.cuda.Stream(non_blocking=True)
for name, a, b in (("far", 1, 3), ("gw", 0, 2)):
    for rep in range(2):
        n = int(rng.integers(1000, 20000))
        data = rng.integers(0, 2**32, (n, 4), dtype=np.uint32)
        if w.rank in (a, b):
            kern = mod.get_function("grid_write" if w.rank == a else "grid_read")
            blocks = min(8, ch.max_blocks(kern, 256))
            with stream:
                arr = cp.asarray(data) if w.rank == a else cp.zeros((n, 4), cp.uint32)
                ok = cp.ones(1, cp.int32)
                end = ch[name] if w.rank == a else ch[name + "_in"]
                kern((blocks,), (256,), (end.device_handle(), arr, np.uint64(n), ok))
            w.backend.wait_stream(stream, 90, f"grid {{name}} rep {{rep}} on rank {{w.rank}}")
            end.check()
            assert int(ok.get()[0]) == 1, (name, rep)
            if w.rank == b:
                assert arr.get().tobytes() == data.tobytes(), (name, rep)
        w.barrier()
x = rng.integers(0, 2**32, (3000, 4), dtype=np.uint32)
if w.rank == 1:
    ch["far"].write(x)
    assert ch["back_in"].read(3000).tobytes() == (x + 1).tobytes()
if w.rank == 3:
    got = ch["far_in"].read(3000)  # uint4 elements: a structured array, as plain words to add to
    ch["back"].write(np.ascontiguousarray(got).view(np.uint32).reshape(-1, 4) + np.uint32(1))
ch.close()
print("grid and host ok", w.rank, flush=True)
w.close()
"""


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_grid_and_host_forms_through_the_gateways_gpu(spmd, transport):
    """nodes:2x2: 1 -> 3 (through gateway 0, the relay, gateway 2) and 0 -> 2 (gateway to gateway): a
    co-resident grid writes and another reads up to 20000 uint4 through 8-slot rings and 4-slot relay rings
    (per-slot credits through the agents), then host write/read both ways; every byte checked."""
    env = dict(NODES_2, CIRCUSLINK_TRANSPORT=transport)
    job = spmd(4, GRID_AND_HOST, backend="cuda", launcher="mpirun", env=env, timeout=300, tag=True).check()
    for r in range(4):
        assert f"grid and host ok {r}" in job.rank_lines(r), job.output
