"""CIRCUS channels on GPUs: the same properties as tests/test_channels.py, with kernels.

Run on the device machine (ranks share its GPU under MPS). Kernels are compiled with
circuslink.compile and receive the channel ends by value (``end.device_handle()``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

VECTORS_PATH = Path(__file__).parent / "vectors" / "channel_rings.json"

# Kernels shared by the jobs below (templated on the element type).
KERNELS = r'''
KSRC = r"""
#include <circuslink/channel.cuh>
struct s12 { unsigned int a, b, c; };
using u4v = circuslink::vec<unsigned int, 4>;
using u16v = circuslink::vec<unsigned int, 16>;
template <typename T> __global__ void w_warp(circuslink::Sender<T> tx, const T* src, unsigned long long n, int* ok) {
  if (threadIdx.x < 32 && !tx.write_warp(src, n) && threadIdx.x == 0) *ok = 0;
}
template <typename T> __global__ void w_block(circuslink::Sender<T> tx, const T* src, unsigned long long n, int* ok) {
  if (!tx.write_block(src, n) && threadIdx.x == 0) *ok = 0;
}
template <typename T> __global__ void w_grid(circuslink::Sender<T> tx, const T* src, unsigned long long n, int* ok) {
  if (!tx.write_grid(src, n) && threadIdx.x == 0) *ok = 0;
}
template <typename T> __global__ void w_thread(circuslink::Sender<T> tx, const T* src, unsigned long long n, int* ok) {
  if (threadIdx.x == 0) for (unsigned long long i = 0; i < n; ++i) if (!tx.write(src[i])) { *ok = 0; break; }
}
template <typename T> __global__ void r_warp(circuslink::Receiver<T> rx, T* dst, unsigned long long n, int* ok) {
  if (threadIdx.x < 32 && !rx.read_warp(dst, n) && threadIdx.x == 0) *ok = 0;
}
template <typename T> __global__ void r_block(circuslink::Receiver<T> rx, T* dst, unsigned long long n, int* ok) {
  if (!rx.read_block(dst, n) && threadIdx.x == 0) *ok = 0;
}
template <typename T> __global__ void r_grid(circuslink::Receiver<T> rx, T* dst, unsigned long long n, int* ok) {
  if (!rx.read_grid(dst, n) && threadIdx.x == 0) *ok = 0;
}
template <typename T> __global__ void r_thread(circuslink::Receiver<T> rx, T* dst, unsigned long long n, int* ok) {
  if (threadIdx.x == 0) for (unsigned long long i = 0; i < n; ++i) if (!rx.read(dst + i)) { *ok = 0; break; }
}
"""
CTYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long", 12: "s12",
          16: "u4v", 64: "u16v"}
FORMS = ["w_warp", "w_block", "w_grid", "w_thread", "r_warp", "r_block", "r_grid", "r_thread"]
import cupy as cp, numpy as np, circuslink as cl
_mod = cl.compile(KSRC, name_expressions=[f"{f}<{t}>" for f in FORMS for t in CTYPES.values()])
def kern(form, nbytes):
    return _mod.get_function(f"{form}<{CTYPES[nbytes]}>")
def launch(form, end, arr, n, blocks=1, threads=256, handle=None):
    ok = cp.ones(1, dtype=cp.int32)
    h = end.device_handle() if handle is None else handle
    kern(form, end.element.nbytes)((blocks,), (threads,), (h, arr, np.uint64(n), ok))
    cp.cuda.runtime.deviceSynchronize()
    end.check()
    assert int(ok.get()[0]) == 1, f"{form} on {end.name} returned false"
'''


def test_vectors_gpu(spmd):
    """The device writer produces the exact ring bytes of every shared test vector (warp and block forms)."""
    job = spmd(1, KERNELS + f'''
import json
vectors = json.loads(open({str(VECTORS_PATH)!r}).read())["vectors"]
from circuslink import channels
from circuslink.channels import protocol as P
from circuslink.spec import Link, struct_type
w = cl.init()
for vec in vectors:
    for form in ("w_block", "w_warp"):
        t = struct_type(f"e{{vec['element_bytes']}}", nbytes=vec["element_bytes"])
        link = Link("tx", "rx", (vec["recv_id"] + 1) % 65536, vec["recv_id"], 0, 0, t, 1)
        # the vector's dst_rank is in the route; a loopback link has dst 0, so patch the handle's route
        opts = {{"tx": {{"nslots": vec["nslots"], "chunk": vec["chunk"], "ll_max": vec["ll_max"]}}}}
        ch = channels.open(w, [link], options=opts)
        tx = ch["tx"]
        lay = ch._plan.entries[0][2]
        # a loopback link routes to rank 0; the vector names another rank: patch the route word
        harr = np.array(tx.device_handle(), dtype=P.HANDLE_DTYPE)
        harr["route"] = P.route_of(vec["recv_id"], vec["dst_rank"])
        ch._buf.local[lay.ctrl:lay.ctrl + 8].view(cp.uint64)[0] = 1 << 40  # the reader keeps up
        state = ch._buf.local[lay.ctrl + P.CTRL_SEND_STATE:lay.ctrl + P.CTRL_SEND_STATE + 16].view(cp.uint64)
        state[:] = vec["first_seq"]  # SendState: seq and credit_cache
        for data in vec["writes"]:
            raw = np.frombuffer(bytes.fromhex(data), dtype=np.uint8)
            launch(form, tx, cp.asarray(raw), raw.size // vec["element_bytes"], handle=harr[()])
        ring = ch._buf.local[lay.ring:lay.ring + vec["nslots"] * vec["slot_bytes"]].get()
        assert ring.tobytes().hex() == vec["ring"], (vec["name"], form)
        ch.close()
w.close()
print("vectors ok")
''', backend="cuda").check()
    assert "vectors ok" in job.stdout


def test_vectors_file_present():
    assert json.loads(VECTORS_PATH.read_text())["vectors"]


STREAM = KERNELS + '''
import threading
from circuslink import channels
from circuslink.spec import Link, element_type, struct_type
w = cl.init()
types = [element_type("uchar"), element_type("ushort"), element_type("uint"), element_type("ulong"),
         struct_type("s12", nbytes=12, align=4), element_type("uint4"), element_type("uint16")]
LL_MAX = {"ll": 1 << 30, "bulk": 0, "mixed": 200}["{mode}"]
wforms, rforms = ["w_warp", "w_block", "w_thread"], ["r_warp", "r_block", "r_thread"]
links = [Link(f"c{k}_out", f"c{k}_in", 2 * k, 2 * k + 1, 0, 1, t, 64) for k, t in enumerate(types)]
opts = {l.name: {"nslots": 4, "chunk": 256, "ll_max": LL_MAX} for l in links}
ch = channels.open(w, links, options=opts, timeout=30)
rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
# the read splits come from a rank-local generator: drawing them from `rng` would advance rank 1's
# shared generator only, so from the second channel on the ranks would disagree on the stream
read_rng = np.random.default_rng()
for l in links:
    nb = l.element.nbytes
    calls = [int(x) for x in rng.integers(1, 200, 6)]
    data = rng.integers(0, 256, sum(calls) * nb, dtype=np.uint8)
    if w.rank == 0:
        pos = 0
        for i, n in enumerate(calls):   # rings hold 4 packets: most calls block until rank 1 reads
            form = wforms[i % 3] if n * nb < 4096 or wforms[i % 3] != "w_thread" else "w_warp"
            launch(form, ch[l.name], cp.asarray(data[pos * nb:(pos + n) * nb]), n)
            pos += n
    else:
        total = sum(calls)
        out = cp.zeros(total * nb, dtype=cp.uint8)
        pos, i = 0, 0
        while pos < total:
            n = min(total - pos, int(read_rng.integers(1, 150)))
            launch(rforms[i % 3], ch[l.receiver_name], out[pos * nb:], n)
            pos += n; i += 1
        assert out.get().tobytes() == data.tobytes(), l.name
    w.barrier()
ch.close()
w.close()
print("stream ok", w.rank)
'''


@pytest.mark.parametrize("mode", ["ll", "bulk", "mixed"])
def test_ordering_exactly_once_gpu(spmd, mode):
    """Every element type, warp / block / scalar forms mixed, rings of 4 packets, reads split at random.

    The writer's kernels block on credits while the reader (another process, another GPU) drains."""
    job = spmd(2, STREAM.replace("{mode}", mode), backend="cuda", env={"CIRCUSLINK_TIMEOUT": "60"}).check()
    assert job.stdout.count("stream ok") == 2


GRID = KERNELS + '''
from circuslink import channels
from circuslink.spec import Link, element_type
w = cl.init()
link = Link("g_out", "g_in", 1, 2, 0, 1, element_type("uint4"), 1)
ch = channels.open(w, [link], options={"g_out": {"nslots": 8, "chunk": 4096}}, timeout=30)
rng = np.random.default_rng()
for rep in range(3):                     # state carries over from call to call
    n = int(rng.integers(1000, 20000))   # up to 80 packets through 8 slots: per-slot credits at work
    n = w.broadcast_object(n)
    if w.rank == 0:
        data = rng.integers(0, 2**32, (n, 4), dtype=np.uint32)
        launch("w_grid", ch["g_out"], cp.asarray(data), n, blocks=16)
        w.allgather_object(data.tobytes())
    else:
        out = cp.zeros((n, 4), dtype=cp.uint32)
        launch("r_grid", ch["g_in"], out, n, blocks=12)
        sent = w.allgather_object(b"")[0]
        assert out.get().tobytes() == sent
    # a grid call followed by an in-order call on the same channel
    if w.rank == 0:
        tail = rng.integers(0, 2**32, (77, 4), dtype=np.uint32)
        ch["g_out"].write(tail)
        w.allgather_object(tail.tobytes())
    else:
        got = ch["g_in"].read(77)   # structured elements come back as numpy
        got = got.get() if hasattr(got, "get") else got
        assert got.tobytes() == w.allgather_object(b"")[0]
ch.close()
w.close()
print("grid ok", w.rank)
'''


def test_grid_forms_gpu(spmd):
    job = spmd(2, GRID, backend="cuda").check()
    assert job.stdout.count("grid ok") == 2


MANY = KERNELS + '''
import time
from circuslink import channels
from circuslink.spec import Link, element_type
w = cl.init()
N = 64
links = [Link(f"c{i}_out", f"c{i}_in", 2 * i, 2 * i + 1, 0, 1, element_type("uint"), 30) for i in range(N)]
ch = channels.open(w, links, timeout=30)
rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
data = [rng.integers(0, 2**32, 300, dtype=np.uint32) for _ in range(N)]
stalled = 5
cap = ch[links[0].name if w.rank == 0 else links[0].receiver_name].geometry.nslots * 30
if w.rank == 0:
    ch[f"c{stalled}_out"].write(data[stalled][:cap])        # fills its ring; nobody reads it yet
    for rnd in range(3):
        for i in range(N):
            if i != stalled:
                ch[f"c{i}_out"].write(data[i][rnd * 100:(rnd + 1) * 100])
    w.barrier()
    ch[f"c{stalled}_out"].write(data[stalled][cap:])
else:
    got = {i: [] for i in range(N)}
    for rnd in range(3):
        for i in range(N):
            if i != stalled:
                got[i].append(ch[f"c{i}_in"].read(100).get())
    w.barrier()
    got[stalled].append(ch[f"c{stalled}_in"].read(300).get())
    for i in range(N):
        assert np.concatenate(got[i]).tobytes() == data[i].tobytes(), i
ch.close()
w.close()
print("many ok", w.rank)
'''


@pytest.mark.slow
def test_64_channels_and_a_stalled_one_gpu(spmd):
    job = spmd(2, MANY, backend="cuda").check()
    assert job.stdout.count("many ok") == 2


SLOW = KERNELS + '''
import time
from circuslink import channels
from circuslink.spec import Link, element_type
w = cl.init()
link = Link("tx", "rx", 1, 2, 0, 1, element_type("ulong"), 1)
ch = channels.open(w, [link], options={"tx": {"nslots": 4, "chunk": 256,
                   "ll_max": {"ll": 1 << 30, "bulk": 0}["{mode}"]}}, timeout=30)
rng = np.random.default_rng(w.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32))))
data = rng.integers(0, 2**63, 3000, dtype=np.uint64)
if w.rank == 0:
    launch("w_block", ch["tx"], cp.asarray(data), data.size)   # one kernel; blocks on credits throughout
else:
    out = cp.zeros(3000, dtype=cp.uint64)
    for k in range(0, 3000, 100):
        time.sleep(0.01)
        launch("r_warp", ch["rx"], out[k:], 100)
    assert out.get().tobytes() == data.tobytes()
ch.close()
w.close()
print("slow ok", w.rank)
'''


@pytest.mark.parametrize("mode", ["ll", "bulk"])
def test_slow_reader_tiny_ring_gpu(spmd, mode):
    job = spmd(2, SLOW.replace("{mode}", mode), backend="cuda").check()
    assert job.stdout.count("slow ok") == 2


TIMEOUT = KERNELS + '''
from circuslink import channels, ChannelError
from circuslink.spec import Link, element_type
w = cl.init()
links = [Link("quiet_out", "quiet_in", 5, 6, 0, 1, element_type("uint"), 8),
         Link("full_out", "full_in", 7, 8, 0, 1, element_type("uint"), 8)]
ch = channels.open(w, links, timeout=1.0)
if w.rank == 1:
    try:
        launch("r_warp", ch["quiet_in"], cp.zeros(4, dtype=cp.uint32), 4)
    except ChannelError as e:
        print("ERR", e)
else:
    launch("w_warp", ch["full_out"], cp.arange(120, dtype=cp.uint32), 120)   # 4 packets fill its 4 slots
    try:
        ch["full_out"].write(np.arange(1, dtype=np.uint32))
    except ChannelError as e:
        print("ERR", e)
w.barrier()
ch.close()
w.close()
'''


def test_device_timeouts_name_the_channel(spmd):
    job = spmd(2, TIMEOUT, backend="cuda").check()
    assert "channel quiet_in (id 6, rank 1, receiver from rank 0): timed out after 1 s: waited for data" \
        in job.stdout
    assert "channel full_out (id 7, rank 0, sender to rank 1): timed out after 1 s: waited for credits" \
        in job.stdout


BLOCK2D = KERNELS + '''
from circuslink import channels
from circuslink.spec import Link, element_type
K2 = r"""
#include <circuslink/channel.cuh>
// 16 x 16 threads: warp 0 is threads (0..15, 0) and (0..15, 1), whose threadIdx.x repeat; the warp
// forms must take their lane from %laneid, not from threadIdx.x & 31.
extern "C" __global__ void w2d(circuslink::Sender<unsigned int> tx, const unsigned int* src,
                               unsigned long long n, int* ok) {
  const unsigned int t = threadIdx.x + blockDim.x * threadIdx.y;
  if (t < 32 && !tx.write_warp(src, n)) *ok = 0;
  __syncthreads();
  if (!tx.write_block(src + n, n)) *ok = 0;
}
extern "C" __global__ void r2d(circuslink::Receiver<unsigned int> rx, unsigned int* dst,
                               unsigned long long n, int* ok) {
  const unsigned int t = threadIdx.x + blockDim.x * threadIdx.y;
  if (t < 32 && !rx.read_warp(dst, n)) *ok = 0;
  __syncthreads();
  if (!rx.read_block(dst + n, n)) *ok = 0;
}
"""
mod = cl.compile(K2)
w = cl.init()
rng = np.random.default_rng(int(__import__("os").environ["CIRCUSLINK_TEST_SEED"]))
for mode, ll_max in (("ll", 1 << 30), ("bulk", 0)):
    link = Link("t2", "r2", 3, 4, 0, 1, element_type("uint"), 256)
    opts = {"t2": {"nslots": 4, "chunk": 256, "ll_max": ll_max}}
    ch = channels.open(w, [link], options=opts, timeout=20)
    n = 1000
    data = rng.integers(0, 2**32, 2 * n, dtype=np.uint32)
    ok = cp.ones(1, dtype=cp.int32)
    if w.rank == 0:
        mod.get_function("w2d")((1,), (16, 16), (ch["t2"].device_handle(), cp.asarray(data), np.uint64(n), ok))
    else:
        out = cp.zeros(2 * n, dtype=cp.uint32)
        mod.get_function("r2d")((1,), (16, 16), (ch["r2"].device_handle(), out, np.uint64(n), ok))
    cp.cuda.runtime.deviceSynchronize()
    for end in ch.ends():
        end.check()
    assert int(ok.get()[0]) == 1, mode
    if w.rank == 1:
        assert out.get().tobytes() == data.tobytes(), mode
    w.barrier()
    ch.close()
w.close()
print("2d ok", w.rank)
'''


def test_warp_and_block_forms_in_a_16x16_block(spmd):
    job = spmd(2, BLOCK2D, backend="cuda").check()
    assert job.stdout.count("2d ok") == 2


WRAP = KERNELS + '''
import time
from circuslink import channels
from circuslink.channels import protocol as P
from circuslink.spec import Link, element_type
w = cl.init()
rng = np.random.default_rng(int(__import__("os").environ["CIRCUSLINK_TEST_SEED"]))
for mode, ll_max in (("ll", 1 << 30), ("bulk", 0)):
    link = Link("wt", "wr", 9, 10, 0, 1, element_type("uint"), 64)
    opts = {"wt": {"nslots": 4, "chunk": 256, "ll_max": ll_max}}
    ch = channels.open(w, [link], options=opts, timeout=20)
    lay = ch._plan.entries[0][2]
    first = (1 << 32) - 1   # the packet whose flag used to be (seq + 1) mod 2^32 = 0, as a zeroed ring holds
    ctrl = ch._buf.local[lay.ctrl:lay.ctrl + P.CTRL_BYTES]
    if w.rank == 0:
        ctrl[:8].view(cp.uint64)[0] = first  # credits: packets consumed so far
        ctrl[P.CTRL_SEND_STATE:P.CTRL_SEND_STATE + 16].view(cp.uint64)[:] = first
    else:
        ctrl[P.CTRL_RECV_STATE:P.CTRL_RECV_STATE + 8].view(cp.uint64)[0] = first
        ctrl[P.CTRL_RECV_STATE + 16:P.CTRL_RECV_STATE + 24].view(cp.uint64)[0] = first
    cp.cuda.runtime.deviceSynchronize()
    w.barrier()
    data = rng.integers(0, 2**32, 200, dtype=np.uint32)
    if w.rank == 0:
        time.sleep(0.3)     # the reader is polling the zeroed ring already
        ch["wt"].write(data)
    else:
        got = ch["wr"].read(200).get()
        assert got.tobytes() == data.tobytes(), mode
    w.barrier()
    ch.close()
w.close()
print("wrap ok", w.rank)
'''


def test_reader_ahead_of_the_writer_at_flag_wrap_gpu(spmd):
    job = spmd(2, WRAP, backend="cuda").check()
    assert job.stdout.count("wrap ok") == 2


DEAD_PEER = KERNELS + '''
import os, time
from circuslink import channels
from circuslink.spec import Link, element_type
w = cl.init()
link = Link("dt", "dr", 11, 12, 0, 1, element_type("uint"), 64)
ch = channels.open(w, [link], timeout=0)   # device waits never give up on their own
if w.rank == 0:
    os._exit(0)                            # the writer dies without writing
t0 = time.monotonic()
try:
    ch["dr"].read(16)
except cl.TimeoutError as exc:
    print("HOST GAVE UP", round(time.monotonic() - t0), exc, flush=True)
try:
    ch["dr"].check()
except cl.ChannelError as exc:
    print("DEVICE SAW", exc, flush=True)
os._exit(0)
'''


def test_device_timeout_zero_and_a_dead_peer_do_not_hang_the_host(spmd):
    """With device waits that never time out, the host's own bounded wait aborts them (the abort word)."""
    job = spmd(2, DEAD_PEER, backend="cuda", env={"CIRCUSLINK_TIMEOUT": "3"}, timeout=120).check()
    assert "HOST GAVE UP" in job.stdout and "channel dr (id 12, rank 1, receiver from rank 0): its read kernel " \
        "did not finish: timed out after 3 s" in job.stdout, job.output
    assert "when the host gave up on the kernel" in job.stdout, job.output
