"""The `<topology>` element of a channel spec: its three forms, routed channels, and every error with
file, line and field. CPU only and fast."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import circuslink
from circuslink import spec as cspec
from circuslink import topology as T
from circuslink.spec import Link, Spec, element_type


def write(tmp_path: Path, text: str, name: str = "app.xml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def doc(topology: str, src: int = 0, dst: int = 10) -> str:
    """Line 2: the topology; lines 3 and 4: one channel from rank src to rank dst."""
    return (f"<circus>\n{topology}\n"
            f'<channel name="a_out" type="uint" id="0" write-to="1" rank="{src}"/>\n'
            f'<channel name="a_in" type="uint" id="1" read-from="0" rank="{dst}"/>\n</circus>\n')


def problems(path: str, nranks: int | None = None) -> list[str]:
    with pytest.raises(circuslink.SpecError) as info:
        cspec.load(path, nranks=nranks)
    return str(info.value).splitlines()


@pytest.mark.parametrize("form", [
    '<topology kind="torus" dims="4x4"/>',
    "<topology>torus:4x4</topology>",
    "<topology><kind>torus</kind><dims>4x4</dims></topology>",
    '<topology file="net.json"/>',
    "<topology>net.json</topology>",
])
def test_topology_forms_give_the_same_network(tmp_path, form):
    torus = T.parse("torus:4x4")
    (tmp_path / "net.json").write_text(json.dumps(
        {"nodes": 16, "links": sorted({tuple(sorted((k.src, k.dst))) for k in torus.links})}))
    s = cspec.load(write(tmp_path, doc(form)))
    assert s.topology is not None and s.topology.size == 16 and s.vcs is None
    assert {(k.src, k.dst) for k in s.topology.links} == {(k.src, k.dst) for k in torus.links}
    (link,) = s.links
    assert (link.src_rank, link.dst_rank) == (0, 10)  # not neighbours: the channel is routed
    s.check_nranks(16)


def test_file_is_found_beside_the_spec_and_vcs_is_kept(tmp_path):
    sub = tmp_path / "nets"
    sub.mkdir()
    (sub / "ring.txt").write_text("0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n")
    s = cspec.load(write(sub, doc('<topology file="ring.txt" vcs="3"/>', 1, 4)))
    assert s.topology.kind == "graph" and s.vcs == 3 and s.topology.routing(s.vcs).scheme == "hop classes"
    s = cspec.load(write(tmp_path, doc('<topology kind="ring" dims="8" vcs="1"/>', 1, 4)))
    assert s.topology.name == "ring:8" and s.vcs == 1


def test_spec_without_topology_is_unchanged(tmp_path):
    s = cspec.load(write(tmp_path, "<circus>\n" + doc("").split("\n", 2)[2]))
    assert s.topology is None and s.vcs is None


def test_check_nranks_checks_the_topology_size(tmp_path):
    s = cspec.load(write(tmp_path, doc("<topology>torus:4x4</topology>")))
    with pytest.raises(circuslink.SpecError, match=r"app\.xml: topology torus:4x4 has 16 ranks, but the job has 11"):
        s.check_nranks(11)


CASES = [
    # (id, topology line, (src, dst), nranks, expected problems as "LINE: rest")
    ("outside", "<topology>torus:2x2</topology>", (0, 10), None,
     ["4: channel 'a_in': field 'rank': 10 is outside the topology torus:2x2 (ranks 0..3)"]),
    ("nranks", "<topology>torus:4x4</topology>", (0, 3), 8,
     ["2: <topology>: topology torus:4x4 has 16 ranks, but nranks is 8"]),
    ("unreachable", '<topology file="two.txt"/>', (0, 3), None,
     ["4: channel 'a_in': field 'rank': rank 3 (d) is unreachable from sender 'a_out' (rank 0 (a), line 3) on "
      "topology {dir}/two.txt"]),
    ("malformed", '<topology kind="torus" dims="4y4"/>', (0, 1), None,
     ["2: <topology>: field 'dims': malformed topology 'torus:4y4': expected torus:XxY with positive integers, "
      "e.g. torus:4x4"]),
    ("ring0", '<topology kind="ring" dims="0"/>', (0, 1), None,
     ["2: <topology>: field 'dims': ring:0: a ring needs at least 1 rank, got 0"]),
    ("mesh1x0", "<topology>mesh:1x0</topology>", (0, 1), None,
     ["2: <topology>: mesh:1x0: every dimension needs at least 1 rank, got 0"]),
    ("kind", '<topology kind="tree" dims="4"/>', (0, 1), None,
     ["2: <topology>: field 'kind': unknown kind 'tree' (known: ring, line, mesh, torus; a custom graph is "
      "file=\"net.json\")"]),
    ("no dims", '<topology kind="torus"/>', (0, 1), None,
     ["2: <topology>: field 'dims': missing (kind and dims go together, e.g. kind=\"torus\" dims=\"4x4\")"]),
    ("both", '<topology kind="torus" dims="4x4" file="net.json"/>', (0, 1), None,
     ["2: <topology>: field 'file': give kind and dims, or file, not both"]),
    ("text and field", '<topology vcs="2" kind="torus">torus:4x4</topology>', (0, 1), None,
     ["2: <topology>: field 'kind': the topology is given as text ('torus:4x4'); drop 'kind' or the text"]),
    ("empty", "<topology/>", (0, 1), None,
     ["2: <topology>: empty: give kind and dims (kind=\"torus\" dims=\"4x4\"), file (file=\"net.json\") or the "
      "topology as text (<topology>torus:4x4</topology>)"]),
    ("missing file", '<topology file="nope.json"/>', (0, 1), None,
     ["2: <topology>: field 'file': no such topology file '{dir}/nope.json' (nor a topology string such as "
      "torus:4x4)"]),
    ("bad file", '<topology file="self.txt"/>', (0, 1), None,
     ["2: <topology>: field 'file': {dir}/self.txt:2: self-loop: node 'b' linked to itself"]),
    ("vcs too many", '<topology kind="torus" dims="4x4" vcs="3"/>', (0, 1), None,
     ["2: <topology>: field 'vcs': torus:4x4: 3 virtual channels is more than it can use: it uses 1 (unsafe where "
      "a ring has 4 or more ranks) or 2 (dateline)"]),
    ("vcs on a mesh", '<topology kind="mesh" dims="4x4" vcs="2"/>', (0, 1), None,
     ["2: <topology>: field 'vcs': mesh:4x4: 2 virtual channels is more than it can use: it has no dateline (no "
      "ring of 3 or more ranks wraps around), so it uses exactly 1"]),
    ("vcs zero", '<topology kind="torus" dims="4x4" vcs="0"/>', (0, 1), None,
     ["2: <topology>: field 'vcs': 0 is outside 1..16"]),
    ("unknown field", '<topology kind="torus" dims="4x4" size="16"/>', (0, 1), None,
     ["2: <topology>: field 'size': unknown field (known: kind, dims, file, vcs)"]),
    ("twice", "<topology>ring:16</topology><topology>torus:4x4</topology>", (0, 1), None,
     ["2: <topology>: given twice (also on line 2); keep one"]),
]


@pytest.mark.parametrize("case,topology,ranks,nranks,expected", CASES, ids=[c[0] for c in CASES])
def test_topology_errors_name_file_line_and_field(tmp_path, case, topology, ranks, nranks, expected):
    (tmp_path / "two.txt").write_text("a b\nc d\n")
    (tmp_path / "self.txt").write_text("a b\nb b\n")
    path = write(tmp_path, doc(topology, *ranks))
    assert problems(path, nranks) == [f"{path}:" + e.format(dir=tmp_path) for e in expected]


def test_programmatic_spec_with_a_topology():
    ring = T.parse("ring:4")
    link = Link("tx", "rx", 0, 1, 0, 2, element_type("uint"), 64)
    s = Spec([link], topology=ring, vcs=2)
    assert s.topology is ring and s.vcs == 2
    with pytest.raises(circuslink.SpecError, match=r"channel end 'rx': field 'rank': 5 is outside the topology "
                                                   r"ring:4 \(ranks 0\.\.3\)"):
        Spec([Link("tx", "rx", 0, 1, 0, 5, element_type("uint"), 64)], topology=ring)
    with pytest.raises(circuslink.SpecError, match=r"<links>: ring:4: 3 virtual channels is more than it can use"):
        Spec([link], topology=ring, vcs=3)
    two = T.from_edge_list("a b\nc d\n", "two")
    with pytest.raises(circuslink.SpecError, match=r"channel end 'rx': field 'rank': rank 2 is unreachable from "
                                                   r"rank 0 on topology two"):
        Spec([link], topology=two)
