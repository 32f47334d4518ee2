"""Routed channels on GPUs: the forwarding agent kernels with user kernels at the channel ends.

Run on the device machine, every rank sharing its GPU under MPS (16 ranks get about 8 SMs each; the
agent takes one block, user grids are sized with ``channels.max_blocks``: a handful of warps, fewer than a
rank's channel ends at all-to-all, so the exchange kernel's warps each serve several ends with the
non-blocking calls). The kernels are in
tests/kernels/routed_user.cu, on the public device API only: a routed channel's ends are the same
``Sender<T>`` / ``Receiver<T>`` as a direct one's. Every byte is checked (on the device, against a hash
both sides compute). The cpu reference of the same properties is tests/test_routed.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import NVCC_TIMEOUT_S

KERNELS = Path(__file__).parent / "kernels" / "routed_user.cu"
INCLUDE = Path(__file__).resolve().parents[1] / "src" / "circuslink" / "include"

EXCHANGE = """
import os, numpy as np, cupy as cp, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type, protocol as P
w = cl.init()
pairs = {pairs}
byte = element_type("uchar")
links = [Link(f"c{{a}}_{{b}}", f"c{{a}}_{{b}}_in", 2 * k, 2 * k + 1, a, b, byte, 4096)
         for k, (a, b) in enumerate(pairs)]
ch = channels.open(w, links, topology="{topo}", vcs={vcs}, allow_cycles={allow}, link_slots={link_slots},
                   timeout={timeout})
assert ch._buf.mapped == sorted(set(ch.topology.neighbours(w.rank)) | {{w.rank}})
fn = cl.compile(open({kernels!r}).read()).get_function("exchange")
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
nmsgs = {nmsgs}
sizes = np.random.default_rng(seed).integers(1, {most}, (2 * len(links), nmsgs)).astype(np.uint32)  # every rank
sends = [l for l in links if l.src_rank == w.rank]
recvs = [l for l in links if l.dst_rank == w.rank]
names = [l.name for l in sends] + [l.receiver_name for l in recvs]
for name in names:  # each message is one try call, which goes only whole: never more packets than the ring holds
    geo = ch[name].geometry
    most_packets = max(len(P.split_write(int(n), geo)[1]) for n in sizes.reshape(-1))
    assert most_packets <= geo.nslots, (name, most_packets, geo)
def handles(names):
    arr = np.zeros(max(1, len(names)), P.HANDLE_DTYPE)
    for i, name in enumerate(names):
        arr[i] = ch[name].device_handle()
    return cp.asarray(arr.view(np.uint8))
ends = len(names)
blocks = max(1, min(ends, ch.max_blocks(fn, 32)))  # a warp each, serving ends b, b + blocks, ...
stream = cp.cuda.Stream(non_blocking=True)
with stream:  # inputs made on the launch's stream: nothing races the kernel
    hs, hr = handles([l.name for l in sends]), handles([l.receiver_name for l in recvs])
    sid = cp.asarray(np.array([l.send_id for l in sends] or [0], np.uint32))
    rid = cp.asarray(np.array([l.send_id for l in recvs] or [0], np.uint32))
    sz = cp.asarray(sizes.reshape(-1))
    scratch = cp.zeros(max(1, ends) * 4096, cp.uint8)
    progress = cp.zeros(max(1, ends), cp.uint32)
    since = cp.zeros(max(1, ends), cp.uint64)
    bad = cp.zeros(1, cp.uint32)
    w.backend.launch_resident(fn, (blocks,), (32,), (hs, sid, np.uint32(len(sends)), hr, rid, np.uint32(len(recvs)),
                              sz, np.uint32(nmsgs), np.uint32(seed & 0xFFFFFFFF), scratch, np.uint32(4096),
                              np.uint64(ch.device_timeout_ns), progress, since, bad),
                              stream=stream, limit=ch.max_blocks(fn, 32))
# an end gives up after a time-out without progress and its blocking call's time-out; its warp's other stalled
# ends one time-out later
w.backend.wait_stream(stream, 3 * {timeout} + 30, f"the exchange kernel of rank {{w.rank}}")
try:
    ch.check()
    done = progress.get()[:ends]
    stopped = [f"{{names[e]}} at message {{int(m) & 0x7FFFFFFF}}" for e, m in enumerate(done) if m != nmsgs]
    assert not stopped, f"rank {{w.rank}}: ends stopped without an error record: {{stopped}}"
    assert int(bad.get()[0]) == 0, f"rank {{w.rank}}: {{int(bad.get()[0])}} wrong bytes"
    print("exchange ok", w.rank, blocks, ends, sum(1 for l in sends if ch.route(l.name)))
    ch.close()
    w.close()
except cl.ChannelError as exc:
    print("CHANNEL-ERROR", exc)
"""


def _exchange(topo: str, pairs, vcs=None, allow=False, link_slots=4, nmsgs=6, most=3000, timeout=20) -> str:
    return EXCHANGE.format(topo=topo, pairs=pairs, vcs=vcs, allow=allow, link_slots=link_slots, nmsgs=nmsgs,
                           most=most, timeout=timeout, kernels=str(KERNELS))


def _all_pairs(n: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(n) if a != b]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("topo,n", [("torus:4x4", 16), ("line:8", 8)])
def test_all_to_all_gpu(spmd, topo, n):
    """Every rank sends to every other 6 messages of random sizes (low-latency and bulk packets) from a kernel
    whose warps (as many as ``max_blocks`` lets the rank have resident) take turns over all its channel ends
    with try calls; link rings of 4 slots; default (dateline) virtual channels: completes, every byte checked
    on the receiving device."""
    job = spmd(n, _exchange(topo, _all_pairs(n)), backend="cuda", timeout=170).check()
    assert job.stdout.count("exchange ok") == n, job.output
    assert "CHANNEL-ERROR" not in job.output


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("topo,pairs", [
    ("torus:4x4", _all_pairs(16)),                                   # acyclic in the buffers routed channels use
    ("torus:8x2", [(r, (r + 4) % 8 + 8 * (r // 8)) for r in range(16)]),  # 4 hops forward on each x ring of 8
])
def test_unsafe_one_virtual_channel_gpu(spmd, topo, pairs):
    """1 virtual channel and allow_cycles=True: the job completes (every byte checked) or its ends time out
    with errors naming the (link, vc) buffers of the cycle; it never hangs. The kernel's try calls record
    nothing, so an end stalled for the channel's time-out makes the blocking call, which times out with the
    same error as before; a warp that already reported one stops its other stalled ends unrecorded (the
    rank's error is the one the check raises)."""
    job = spmd(16, _exchange(topo, pairs, vcs=1, allow=True, link_slots=2, nmsgs=40, timeout=8), backend="cuda",
               timeout=170)
    errors = [line for line in job.output.splitlines() if "CHANNEL-ERROR" in line]
    if errors:  # every end that gave up timed out; the senders behind the cycle name it
        assert all("timed out after" in e for e in errors), errors
        assert any("wait on each other in a cycle: " in e and "(back to " in e for e in errors), errors
    else:
        assert job.returncode == 0 and job.stdout.count("exchange ok") == 16, job.output


@pytest.mark.slow
@pytest.mark.gpu
def test_grid_and_host_forms_over_seven_hops_gpu(spmd):
    """line:8, rank 0 to rank 7 (7 hops, 6 agents): grid writes and reads of up to 80 packets through 8-slot
    rings (per-slot credits through the agents), then host write/read both ways; every byte checked."""
    job = spmd(8, f"""
import numpy as np, cupy as cp, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
w = cl.init()
u4 = element_type("uint4")
links = [Link("far", "far_in", 0, 1, 0, 7, u4, 2048), Link("back", "back_in", 2, 3, 7, 0, u4, 2048)]
opts = {{"far": {{"nslots": 8, "chunk": 4096}}, "back": {{"nslots": 8, "chunk": 4096}}}}
ch = channels.open(w, links, topology="line:8", options=opts, timeout=30)
assert ch.route("far") == list(range(8)) and ch.route("back") == list(range(7, -1, -1))
mod = cl.compile(open({str(KERNELS)!r}).read())
rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
stream = cp.cuda.Stream(non_blocking=True)
for rep in range(3):
    n = int(rng.integers(1000, 20000))
    data = rng.integers(0, 2**32, (n, 4), dtype=np.uint32)
    if w.rank in (0, 7):
        kern = mod.get_function("grid_write" if w.rank == 0 else "grid_read")
        blocks = min(16 if w.rank == 0 else 12, ch.max_blocks(kern, 256))
        with stream:
            arr = cp.asarray(data) if w.rank == 0 else cp.zeros((n, 4), cp.uint32)
            ok = cp.ones(1, cp.int32)
            end = ch["far"] if w.rank == 0 else ch["far_in"]
            kern((blocks,), (256,), (end.device_handle(), arr, np.uint64(n), ok))
        w.backend.wait_stream(stream, 90, f"grid rep {{rep}} on rank {{w.rank}}")
        end.check()
        assert int(ok.get()[0]) == 1
        if w.rank == 7:
            assert arr.get().tobytes() == data.tobytes(), rep
    w.barrier()
tail = rng.integers(0, 2**32, (777, 4), dtype=np.uint32)
if w.rank == 0:
    ch["far"].write(tail)
    got = ch["back_in"].read(777)
    got = got.get() if hasattr(got, "get") else got
    assert got.tobytes() == (tail + 1).astype(np.uint32).tobytes()
if w.rank == 7:
    got = ch["far_in"].read(777)
    got = got.get() if hasattr(got, "get") else got
    assert got.tobytes() == tail.tobytes()
    ch["back"].write((tail + 1).astype(np.uint32))
ch.close()
w.close()
print("seven hops ok", w.rank)
""", backend="cuda", timeout=170).check()
    assert job.stdout.count("seven hops ok") == 8


@pytest.mark.gpu
def test_a_stalled_receiver_times_out_naming_it_gpu(spmd):
    """line:3, 0 -> 2 through rank 1's agent; rank 2 never reads: rank 0's write kernel times out and the error
    says the packets wait at rank 1 for the receiver on rank 2 (end-to-end credits), and close still works."""
    job = spmd(3, """
import numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import Link, element_type
w = cl.init()
ch = channels.open(w, [Link("a", "a_in", 0, 1, 0, 2, element_type("uchar"), 256)], topology="line:3", timeout=3)
if w.rank == 0:
    try:
        for _ in range(64):
            ch["a"].write(np.arange(200, dtype=np.uint8))
    except cl.ChannelError as exc:
        print("ERR", exc)
w.barrier(timeout=60)
ch.close()
w.close()
print("closed", w.rank)
""", backend="cuda", env={"CIRCUSLINK_TIMEOUT": "60"}, timeout=170).check()
    err = next(line for line in job.stdout.splitlines() if "ERR" in line)
    assert "channel a (id 0, rank 0, sender to rank 2, routed 0->1->2): timed out after 3 s" in err
    assert "its packets wait at rank 1 for its receiver on rank 2 to read (end-to-end credits" in err
    assert job.stdout.count("closed") == 3


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_user_kernels_compile(tmp_path):
    # unoptimised (-O0), as tests/test_device_headers.py's plain checks: that the users' kernels compile for
    # Hopper, not what they cost
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}", "-Xcicc", "-O0", "-Xptxas", "-O0",
                           "-c", str(KERNELS), "-o", str(tmp_path / "k.o")], capture_output=True, text=True,
                          timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
