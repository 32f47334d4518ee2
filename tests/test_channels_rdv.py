"""Rendezvous messages in the cpu reference (docs/protocol.md, Rendezvous), and the options that turn them on.

* the descriptor packet's slot, byte for byte, built here from the layout the protocol page gives (on the first
  lap, whose packets rewrite every unit of their slot, and later), and the sender's rendezvous words after it;
* the rendezvous words over several messages, across the 32-bit wrap of seq;
* a channel opened with a window: host writes of at least rendezvous_min bytes from the window go by
  rendezvous, writes from elsewhere and smaller ones through the ring; the reader gets every byte back in order;
* a rendezvous message read in pieces fails naming the misuse and the channel;
* the options: a window that is not a symmetric buffer, rendezvous_min without a window or out of range, and a
  window on a routed channel are refused in one line naming the channel.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from circuslink import ConfigError
from circuslink.channels import protocol as P
from circuslink.channels._cpu import CpuReceiver, CpuSender
from circuslink.channels._plan import Plan
from circuslink.spec import Link, element_type


@pytest.mark.parametrize("first_seq", [0, 12345678901])
def test_the_descriptor_packet_byte_for_byte(rng, first_seq):
    geo = P.geometry(1, 1, nslots=4, chunk=4096)
    ring = np.zeros(geo.ring_bytes, dtype=np.uint8)
    credit, rdv, slots = np.zeros(1, "<u8"), np.zeros(2, "<u8"), np.zeros(geo.nslots, "<u4")
    window = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    route = P.route_of(9, 3)
    ends = [cls(name, name, 7, geo, ring, credit, slots, np.zeros(4, "<u4"), 5.0, route)
            for cls, name in ((CpuSender, "tx"), (CpuReceiver, "rx"))]
    for end in ends:
        end.seq = first_seq
        end.window, end.rdv_min, end.rdv = window, 4096, rdv
    ends[0].credit_cache = credit[0] = first_seq
    offset, n = int(rng.integers(0, 1 << 19)), int(rng.integers(4096, 1 << 19))
    writer = threading.Thread(target=ends[0].write_rendezvous, args=(offset, n))
    writer.start()
    got = ends[1].read_bytes(n)
    writer.join()
    assert got == window[offset:offset + n].tobytes()
    # done: one finished message; posted: (seq + 1) << 32 | its number among the rendezvous messages
    assert int(rdv[0]) == P.RDV_DONE and int(credit[0]) == first_seq + 1
    assert int(rdv[1]) == ((first_seq + 1) & 0xFFFFFFFF) << 32 | 1
    flag = (first_seq & 0xFFFFFFFF) | 1
    words = [route, 16 | 0x80000000 | 0x40000000, offset & 0xFFFFFFFF, offset >> 32, n & 0xFFFFFFFF, n >> 32]
    if first_seq % (1 << 31) < geo.nslots:  # the first lap after 2^31 k: every unit of the slot is rewritten
        words += [0] * (32 - len(words))
    want = np.zeros(256, dtype=np.uint8)
    for u, word in enumerate(words):
        want[8 * u:8 * u + 8] = np.frombuffer(np.array([word, flag], dtype="<u4").tobytes(), np.uint8)
    slot = (first_seq % geo.nslots) * geo.slot_bytes
    assert ring[slot:slot + 256].tobytes() == want.tobytes()
    assert int(slots[first_seq % geo.nslots]) == flag  # the slot handed back

def test_the_rendezvous_words_count_messages_across_the_32_bit_wrap(rng):
    """done counts finished messages in units of RDV_DONE; posted carries (seq + 1) mod 2^32 and the message's
    number, which goes on from what done held (a channel whose earlier messages finished), across seq 2^32."""
    geo = P.geometry(1, 1, nslots=4, chunk=4096)
    ring = np.zeros(geo.ring_bytes, dtype=np.uint8)
    credit, rdv, slots = np.zeros(1, "<u8"), np.zeros(2, "<u8"), np.zeros(geo.nslots, "<u4")
    window = rng.integers(0, 256, 1 << 18, dtype=np.uint8)
    ends = [cls(name, name, 7, geo, ring, credit, slots, np.zeros(4, "<u4"), 5.0, P.route_of(1, 1))
            for cls, name in ((CpuSender, "tx"), (CpuReceiver, "rx"))]
    first_seq, before = (1 << 32) - 3, int(rng.integers(0, 1000))
    rdv[0] = before * P.RDV_DONE
    for end in ends:
        end.seq = first_seq
        end.window, end.rdv_min, end.rdv = window, 4096, rdv
    ends[0].credit_cache = credit[0] = first_seq
    for k in range(1, 7):
        seq = first_seq + k - 1
        offset, n = int(rng.integers(0, 1 << 17)), int(rng.integers(4096, 1 << 17))
        writer = threading.Thread(target=ends[0].write_rendezvous, args=(offset, n))
        writer.start()
        got = ends[1].read_bytes(n)
        writer.join()
        assert got == window[offset:offset + n].tobytes(), f"message {k}"
        assert int(rdv[0]) == (before + k) * P.RDV_DONE, f"message {k}: done"
        assert int(rdv[1]) == ((seq + 1) & 0xFFFFFFFF) << 32 | (before + k), f"message {k}: posted"
        assert int(slots[seq % geo.nslots]) == P.flag_of(seq), f"message {k}: the slot handed back"


MIXED = r"""
import os
import numpy as np, circuslink as cl
from circuslink import channels
from circuslink.channels import protocol as P
from circuslink.spec import Link, element_type
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
rng = np.random.default_rng(seed)
byte = element_type("uchar")
sizes = rng.integers(1, 200_000, 40)
from_window = rng.random(40) < 0.6
data = rng.integers(0, 256, int(sizes.sum()) + 64, dtype=np.uint8)
offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) + rng.integers(0, 64)  # any alignment
win = w.alloc(data.size)  # every message's bytes at its offset (a fixed 4 MiB held the sum only half the time)
ch = channels.open(w, [Link("a", "a_in", 1, 2, 0, 1, byte, 1 << 16)],
                   options={"a": {"nslots": 4, "chunk": 4096, "window": win, "rendezvous_min": 5000}}, timeout=30)
if w.rank == 0:
    win.local[:data.size] = data
    for n, o, fw in zip(sizes, offsets, from_window):
        src = win.local[o:o + n] if fw else data[o:o + n].copy()
        ch["a"].write(src)
else:
    for m, (n, o, fw) in enumerate(zip(sizes, offsets, from_window)):
        got = ch["a_in"].read(int(n))
        assert got.tobytes() == data[o:o + n].tobytes(), f"message {m} ({n} B): wrong bytes (seed {seed})"
w.barrier()
ch.close()
win.close()
w.close()
print("rendezvous ok", w.rank)
"""

PIECES = r"""
import numpy as np, circuslink as cl
from circuslink import channels, ChannelError
from circuslink.spec import Link, element_type
w = cl.init()
win = w.alloc(1 << 20)
ch = channels.open(w, [Link("a", "a_in", 1, 2, 0, 1, element_type("uchar"), 1 << 16)],
                   options={"a": {"window": win, "rendezvous_min": 4096}}, timeout=3)
if w.rank == 0:
    try:
        ch["a"].write(win.local[:100_000])
    except ChannelError as exc:
        print("writer:", exc)
else:
    try:
        ch["a_in"].read(1000)
    except ChannelError as exc:
        print("reader:", exc)
w.barrier(timeout=30)
print("done", w.rank)
"""


def test_rendezvous_and_ring_messages_mixed_cpu(spmd):
    job = spmd(2, MIXED).check()
    assert job.stdout.count("rendezvous ok") == 2


def test_a_rendezvous_message_read_in_pieces_fails_naming_the_misuse(spmd):
    job = spmd(2, PIECES).check()
    assert job.stdout.count("done") == 2
    assert "reader: channel a_in" in job.stdout and "is read whole, by one read of 100000 bytes" in job.stdout
    assert "writer: channel a" in job.stdout and "timed out" in job.stdout


class _Window:
    def __init__(self, nbytes: int = 1 << 20) -> None:
        self.nbytes = nbytes
        self.mapped = [0, 1]

    def ptr(self, rank: int) -> int:
        return 0


def _link() -> Link:
    return Link("a", "a_in", 1, 2, 0, 1, element_type("uchar"), 1024)


@pytest.mark.parametrize("opts, text", [
    ({"window": object()}, "channel a: window must be a symmetric buffer (world.alloc), got object"),
    ({"rendezvous_min": 4096}, "channel a: rendezvous_min needs a window"),
    ({"window": _Window(), "rendezvous_min": 0}, "channel a: rendezvous_min 0 must be a number of bytes in 1..2^32-1"),
    ({"window": _Window(), "rendezvous_min": 1 << 32}, "rendezvous_min 4294967296 must be"),
])
def test_rendezvous_options_are_checked(opts, text):
    with pytest.raises(ConfigError, match=text.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
                       .replace("^", r"\^")):
        Plan([_link()], {"a": opts})


def test_a_window_on_a_routed_channel_is_refused():
    from circuslink import topology

    link = Link("a", "a_in", 1, 2, 0, 2, element_type("uchar"), 1024)
    with pytest.raises(ConfigError, match="channel a: a window needs the reader to map the writer's memory; ranks 0 "
                                          "and 2 are not neighbours"):
        Plan([link], {"a": {"window": _Window()}}, topology=topology.parse("line:3"))


def test_windows_enter_the_plan_digest():
    a = Plan([_link()], {"a": {"window": _Window(1 << 20)}})
    b = Plan([_link()], {"a": {"window": _Window(2 << 20)}})
    c = Plan([_link()], {})
    assert len({a.digest(), b.digest(), c.digest()}) == 3
    assert a.window_of(_link())[1] == 512 << 10
