"""The transport interface: the registry and its choice by capability and measurement, the capabilities, the
device handle's table, and the packet rings every relay moves (in the channel format, byte for byte as the
channel reference writes them).

Each transport has its own file pair: ipc (tests/test_transport_ipc.py), mpi (tests/test_transport_mpi.py),
nvshmem (tests/test_transport_nvshmem.py); a fake third one, registered from outside the package, carries routed
channels end to end in tests/test_transport_fake.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from circuslink import ConfigError
from circuslink.channels import _cpu as ref
from circuslink.channels import protocol as P
from circuslink.transport import HANDLE, Capabilities, Context, Scope, Transport, _registry
from circuslink.transport._rings import PacketReader, PacketWriter, Ring

CPU_MPIRUN = Context(runs_kernels=False, under_mpi=True)
CPU_OWN = Context(runs_kernels=False, under_mpi=False)
GPU_MPIRUN = Context(runs_kernels=True, under_mpi=True)


def _ring(geo: P.RingGeometry) -> tuple[np.ndarray, Ring]:
    lay = P.layout(0, geo)
    mem = np.zeros(lay.end, dtype=np.uint8)
    return mem, Ring(mem, lay, geo)


def test_packets_and_channel_ends_write_the_same_bytes(rng):
    """A packet writer given the packets a channel write call makes leaves the ring byte-identical to the
    channel reference's; the channel reader reads the packet writer's ring, the packet reader the channel's."""
    geo = P.geometry(1, 1, nslots=4, chunk=256, ll_max=300)
    mem_ch, ring_ch = _ring(geo)
    mem_pk, ring_pk = _ring(geo)
    route = P.route_of(7, 3)
    tx = ref.CpuSender("t", "test sender", 1, geo, ring_ch.ring, ring_ch.credit, ring_ch.slot_credits,
                       ring_ch.send_error, 5.0, route)
    rx_pk = PacketReader(ring_ch)
    writer = PacketWriter(ring_pk)
    rx_ch = ref.CpuReceiver("r", "test receiver", 1, geo, ring_pk.ring, ring_pk.credit, ring_pk.slot_credits,
                            ring_pk.recv_error, 5.0, 0)
    for size in [1, 5, 120, 121, 300, 301, 1000, 4, 256, 257, 99]:
        data = rng.bytes(size)
        bulk, sizes = P.split_write(size, geo)
        tx.write_bytes(data)
        at = 0
        for n in sizes:
            writer.put(route, data[at:at + n], bulk, 5.0, "packet writer")
            at += n
        assert np.array_equal(mem_ch, mem_pk)  # the same stores: identical rings, credits untouched
        got = b""
        for n in sizes:
            r, word, payload = rx_pk.get(5.0, "packet reader")
            assert r == route and (word & P.KIND_BULK != 0) == bulk and word & 0xFFFFFF == n
            got += payload
        assert got == data
        assert rx_ch.read_bytes(size) == data
        ring_ch.credit[0] = rx_pk.seq  # the packet reader gave the slots back; mirror the channel's credits
    assert writer.seq == tx.seq == rx_pk.seq


def test_packet_reader_waits_for_every_unit_of_a_low_latency_packet():
    geo = P.geometry(1, 1, nslots=2, chunk=256)
    _, ring = _ring(geo)
    writer, reader = PacketWriter(ring), PacketReader(ring)
    writer.put(5, bytes(range(100)), False, 5.0, "w")
    head = ring.head(0)
    ring.words[head + 5 + 2 * 20] = 0  # unit 22's flag not there yet: the packet is not complete
    assert not reader.poll()
    ring.words[head + 5 + 2 * 20] = P.flag_of(0)
    assert reader.poll() and reader.get(5.0, "r")[2] == bytes(range(100))


def test_a_writer_counts_the_slot_credits_a_grid_reader_gives_back(rng):
    """Room in a ring, as a relay's transport counts it (consumed_from): the reader's in-order counter and, past
    it, every packet whose slot credit is back. A grid reader (its warps take the packets of a call in any order,
    each storing its slot credit; the counter only when the call or session ends) and a warp reader (the counter
    too, when it waits) take turns over many laps; the writer's free slots always equal a model's: the first
    packet not yet taken. A hole stops the count, and an earlier lap's slot credit never counts."""
    nslots = 8
    geo = P.geometry(1, 1, nslots=nslots, chunk=256)
    _, ring = _ring(geo)
    writer = PacketWriter(ring)
    taken: set[int] = set()

    def model() -> int:
        first = 0
        while first in taken:
            first += 1
        return first

    for turn in range(200):  # some sixty laps of the ring
        while writer.free() > 0 and rng.integers(4):
            writer.put(1, b"x" * int(rng.integers(1, 121)), False, 1.0, "w")
        start = model()
        batch = list(range(start, writer.seq))[:int(rng.integers(0, nslots + 1))]
        for seq in rng.permutation(batch).tolist():  # the warps of a grid call, in any order
            ring.slot_credits[seq % nslots] = P.flag_of(seq)
            taken.add(seq)
            assert writer.free() == model() + nslots - writer.seq, (turn, seq)
        if turn % 3 == 0:
            ring.credit[0] = model()  # a warp reader's counter (or a grid call's end)
        assert writer.consumed() == model()
    assert writer.seq > 20 * nslots
    # a hole: packet s is not taken, s + 1 is; the count stops at s until s is taken
    while writer.free() > 0:
        writer.put(1, b"y", False, 1.0, "w")
    s = model()
    assert writer.seq == s + nslots and not writer.free()
    ring.slot_credits[(s + 1) % nslots] = P.flag_of(s + 1)
    assert writer.consumed() == s
    ring.slot_credits[s % nslots] = P.flag_of(s - nslots)  # an earlier lap's credit in that slot: still a hole
    assert writer.consumed() == s
    ring.slot_credits[s % nslots] = P.flag_of(s)
    assert writer.consumed() == s + 2


# ---- the registry -------------------------------------------------------------------------------------------
def test_the_registry_names_the_transports_and_refuses_unknown_ones():
    assert _registry.names()[:3] == ["ipc", "mpi", "nvshmem"]
    for name in _registry.names()[:3]:
        assert _registry.get(name).name == name and isinstance(_registry.get(name).capabilities, Capabilities)
    with pytest.raises(ConfigError, match=r"^unknown transport 'ucx': choose one of ipc, mpi, nvshmem"):
        _registry.get("ucx")
    with pytest.raises(ConfigError, match=r"^CIRCUSLINK_TRANSPORT='ucx' is not a transport: choose one of"):
        _registry.forced({"CIRCUSLINK_TRANSPORT": "ucx"})
    assert _registry.forced({"CIRCUSLINK_TRANSPORT": " mpi "}) == "mpi" and _registry.forced({}) is None


def _fake(caps: Capabilities, why: str | None = None) -> type[Transport]:
    class Fake(Transport):
        capabilities = caps

        @classmethod
        def unavailable(cls, context):
            return why

        @classmethod
        def connect(cls, world, peers, nbytes, nsignals, timeout):
            raise AssertionError("not connected in this test")

    return Fake


def test_choice_by_capability_and_measurement(monkeypatch):
    """Inside a node the mapped one; between nodes device-initiated before proxied (nvshmem when it can run,
    else mpi); measured latency orders transports of equal capability; a forced one that cannot run is one line
    saying why; nothing that can run is one line listing every candidate's reason."""
    monkeypatch.setattr(_registry.get("nvshmem"), "unavailable", classmethod(lambda cls, c: None))
    assert _registry.choose(CPU_MPIRUN, Scope.SAME_NODE).name == "ipc"
    assert _registry.choose(GPU_MPIRUN, Scope.SAME_GPU, mapped=True).name == "ipc"
    assert _registry.choose(GPU_MPIRUN, Scope.NETWORK).name == "nvshmem"
    monkeypatch.setattr(_registry.get("nvshmem"), "unavailable", classmethod(lambda cls, c: "not installed"))
    assert _registry.choose(GPU_MPIRUN, Scope.NETWORK).name == "mpi"
    with pytest.raises(ConfigError, match=r"^x: transport nvshmem cannot be used: not installed$"):
        _registry.choose(GPU_MPIRUN, Scope.NETWORK, name="nvshmem", what="x")
    with pytest.raises(ConfigError, match=r"^x: no transport joins ranks across the network in this job \(mpi: it "
                                          r"needs a job started by mpirun \(MPI between the ranks\); nvshmem: not "
                                          r"installed\)$"):
        _registry.choose(CPU_OWN, Scope.NETWORK, what="x")
    _registry.register("slowpoke", _fake(Capabilities(device_initiated=False, scope=Scope.NETWORK)))
    try:
        assert _registry.choose(CPU_MPIRUN, Scope.NETWORK).name == "mpi"  # registration order breaks the tie
        figures = {"mpi": (30.0, 5.0), "slowpoke": (12.0, 1.0)}
        assert _registry.choose(CPU_MPIRUN, Scope.NETWORK, figures=figures).name == "slowpoke"  # measured
        assert _registry.choose(CPU_MPIRUN, Scope.SAME_NODE, figures=figures).name == "ipc"  # narrowest scope
        name, line = _registry.network_choice(CPU_MPIRUN, {"CIRCUSLINK_TRANSPORT": "slowpoke"})
        assert name == "slowpoke" and line.startswith("between nodes: transport slowpoke (forced by "
                                                      "CIRCUSLINK_TRANSPORT: proxied, up to the network")
    finally:
        _registry.unregister("slowpoke")
    assert "slowpoke" not in _registry.names()
    with pytest.raises(ConfigError, match="built in"):
        _registry.unregister("mpi")
    name, line = _registry.network_choice(CPU_OWN, {})
    assert name is None and "no transport joins ranks across the network" in line


def test_capabilities_and_measured_figures():
    caps = _registry.get("mpi").capabilities
    assert caps.proxied and not caps.device_initiated and caps.scope == Scope.NETWORK and caps.compiled_relay
    assert _registry.get("ipc").capabilities.mapped and _registry.get("ipc").capabilities.device_initiated
    measured = caps.measured(31.5, 5.25)
    assert (measured.latency_us, measured.bandwidth_GBps) == (31.5, 5.25) and caps.latency_us is None
    assert measured.describe() == "proxied, up to the network, 31.50 us, 5.25 GB/s"

    class World:
        def __init__(self):
            self.store = {}

        def registry(self, key, factory):
            return self.store.setdefault(key, factory())

    w = World()
    _registry.record_figures(w, "mpi", 31.5, 5.25)
    assert _registry.get("mpi").capabilities_in(w) == measured
    assert _registry.get("ipc").capabilities_in(w) == _registry.get("ipc").capabilities


def test_device_handle_table():
    """The by-value device handle (circuslink::transport::Handle, tests/test_abi.py checks it against the
    header): 72 bytes, packed by name."""
    h = HANDLE.pack(remote=1, remote_signals=2, local=3, local_signals=4, abort=5, timeout_ns=6, nbytes=7,
                    nsignals=8, mode=1, rank=9, peer=10)
    assert HANDLE.size == 72 and h["peer"] == 10 and h["mode"] == 1


def test_the_probe_figures_go_to_the_mapped_transports():
    """``record_floor``: the probe's mapped-memory floor (rank 0's, for every rank) becomes the measured figures of
    every transport whose peers' memory is mapped, and only of those."""

    class World:
        rank = 0

        def __init__(self):
            self.store = {}

        def registry(self, key, factory):
            return self.store.setdefault(key, factory())

        def broadcast_object(self, obj, root=0):
            return obj

    w = World()
    _registry.record_floor(w, {"summary": {"lat_relaxed_us": 0.61, "ce_GBps": 120.0, "sm_store_GBps": 366.5}})
    assert _registry.get("ipc").capabilities_in(w).latency_us == 0.61
    assert _registry.get("ipc").capabilities_in(w).bandwidth_GBps == 366.5
    assert _registry.get("mpi").capabilities_in(w).latency_us is None
    assert _registry.baseline_rows("mpi")[0] == ("mpi", "mpi-host-staged")
