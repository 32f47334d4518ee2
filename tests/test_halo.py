"""Halo channels in one call (channels/_halo.py, circuslink/halo.cuh): the neighbours of ring, line, mesh and
torus grids of 1..3 dimensions, uneven splits, and the exchange itself at 1..5 ranks on the cpu back-end,
byte-exact: every halo a rank receives equals the cells of a seeded global array just past its block (wrapped
on periodic grids), for float32, float64 and a 3-component vector type."""

from __future__ import annotations

import pytest

from circuslink.channels import element_type
from circuslink.channels._halo import DIRECTIONS, direction, halo_links, neighbours, open_halo, split_extent
from circuslink.errors import ConfigError


def test_neighbours_by_direction():
    # mesh:2x3, rank 3 at (1, 1): +x none, -x 2, +y 5, -y 1
    assert neighbours((2, 3), False, 3)[:4] == [None, 2, 5, 1]
    assert neighbours((2, 3), True, 3)[:4] == [2, 2, 5, 1]  # a dimension of 2 wraps onto the same neighbour
    assert neighbours((1,), True, 0)[:2] == [0, 0]  # a ring of 1 wraps onto the rank itself
    assert neighbours((3,), False, 0)[:2] == [1, None]
    assert neighbours((2, 2, 2), True, 0) == [1, 1, 2, 2, 4, 4]
    assert neighbours((4,), False, 2) == [3, 1, None, None, None, None]


def test_links_pair_each_sender_with_the_opposite_receiver():
    links = halo_links((3, 2), True, element_type("float"), 64)
    assert len(links) == 6 * 4
    ids = [i for link in links for i in (link.send_id, link.recv_id)]
    assert len(set(ids)) == len(ids)
    first = next(link for link in links if link.src_rank == 4 and link.name.endswith("to-x"))
    assert (first.name, first.receiver_name, first.dst_rank) == ("halo.4.to-x", "halo.3.from+x", 3)
    assert all(link.depth == 64 for link in links)


@pytest.mark.parametrize("n,parts", [(10, 3), (7, 7), (1000, 6), (5, 1)])
def test_uneven_splits_cover_every_cell_once(n, parts):
    spans = [split_extent(n, parts, i) for i in range(parts)]
    assert [s for s, _ in spans] == [sum(c for _, c in spans[:i]) for i in range(parts)]
    assert sum(c for _, c in spans) == n and max(c for _, c in spans) - min(c for _, c in spans) <= 1


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match=r"'\+w' is not a direction"):
        direction("+w")
    with pytest.raises(ConfigError, match="3 cells cannot be split among 4 ranks"):
        split_extent(3, 4, 0)


class _World:
    size, rank = 4, 0


@pytest.mark.parametrize("topology,why", [
    ("full:4", "is not a process grid"),
    ("mesh:2x3", "has 6 ranks, but the job has 4"),
])
def test_open_halo_refuses_what_is_not_a_grid_of_the_job(topology, why):
    with pytest.raises(ConfigError, match=why):
        open_halo(_World(), topology, "float", 8)


EXCHANGE = """
import os, numpy as np, circuslink as cl
from circuslink.channels._halo import DIRECTIONS
w = cl.init()
seed = int(os.environ["CIRCUSLINK_TEST_SEED"])
checked = 0
for topo, shape in {cases}:
    for type_name, dtype in (("float", np.float32), ("double", np.float64), ("float3", np.float32)):
        rng = np.random.default_rng(seed + len(shape))
        cells = shape + ((4,) if type_name == "float3" else ())   # a float3 takes the room of 4 floats
        g = rng.standard_normal(cells).astype(dtype)
        g_elems = g.view([("v", dtype, (4,))]).reshape(shape) if type_name == "float3" else g
        depth = 2 * max(shape)
        with cl.channels.open_halo(w, topo, type_name, depth) as halo:
            box = halo.block(shape)
            mine = g_elems[box]
            edges = {{}}
            for d in halo.directions:
                k, last = d // 2, d % 2 == 0
                index = [slice(None)] * len(shape)
                index[k] = -1 if last else 0
                edges[d] = np.ascontiguousarray(mine[tuple(index)])
            got = halo.exchange(edges)
            for d in halo.directions:
                k, plus = d // 2, d % 2 == 0
                index = list(box)
                beyond = (box[k].stop if plus else box[k].start - 1) % shape[k]
                index[k] = beyond
                want = g_elems[tuple(index)]
                where = (topo, type_name, w.rank, DIRECTIONS[d])
                lanes = 3 if type_name == "float3" else 1   # a float3's fourth lane is padding: not carried
                a = np.frombuffer(got[d].tobytes(), dtype).reshape(-1, 4 if lanes == 3 else 1)[:, :lanes]
                b = np.frombuffer(np.ascontiguousarray(want).tobytes(), dtype).reshape(a.shape[0], -1)[:, :lanes]
                assert a.tobytes() == b.tobytes(), where
                checked += 1
print("halo ok", w.rank, checked)
w.close()
"""

CASES = {
    1: [("ring:1", (5, 3)), ("line:1", (4, 4)), ("torus:1x1", (3, 2))],
    2: [("ring:2", (9, 4)), ("line:2", (7, 5)), ("mesh:1x2", (6, 7)), ("torus:2x1x1", (5, 3, 2))],
    3: [("ring:3", (10, 3)), ("mesh:3x1", (8, 5)), ("torus:1x3", (4, 11))],
    4: [("mesh:2x2", (9, 7)), ("torus:2x2", (7, 9)), ("line:4", (13, 2)), ("torus:2x1x2", (5, 3, 7))],
    5: [("ring:5", (17, 3)), ("mesh:5x1", (11, 6)), ("torus:1x5", (3, 12))],
}


@pytest.mark.parametrize("ranks", sorted(CASES))
def test_halo_exchange_is_byte_exact(spmd, ranks):
    job = spmd(ranks, EXCHANGE.format(cases=CASES[ranks]), timeout=240)
    job.check()
    assert job.output.count("halo ok") == ranks, job.output


def test_device_handle_on_the_cpu_back_end_is_refused(spmd):
    job = spmd(2, """
import circuslink as cl
w = cl.init()
with cl.channels.open_halo(w, "line:2", "float", 16) as halo:
    try:
        halo.device_handle()
    except cl.ChannelError as exc:
        assert "\\n" not in str(exc) and "back-end runs none" in str(exc), exc
        print("refused", w.rank)
w.close()
""")
    job.check()
    assert job.output.count("refused") == 2


def test_directions_are_the_topologies_ports():
    from circuslink import topology

    t = topology.parse("mesh:3x3")
    for link in t.out_links(4):
        assert neighbours((3, 3), False, 4)[link.port] == link.dst, DIRECTIONS[link.port]
