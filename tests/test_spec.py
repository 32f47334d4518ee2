"""Channel specs (app.xml): parsing, every validation error (file:line:field), types, and `circuslink gen`.

CPU only and fast. The generated CUDA header is compiled with nvcc when nvcc is present: once
against a minimal stand-in for circuslink/channel.cuh (so the generator's own C++ is always
checked, with struct offsets asserted against the numpy dtypes), and once against the real
channel.cuh when it exists.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import circuslink
from circuslink import spec as cspec
from circuslink.spec import Link, Spec, codegen, element_type, struct_type
from circuslink.spec.model import MAX_CHANNEL_ID, MAX_DEPTH, MAX_RING_BYTES, builtin_type_names

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "tests" / "specs"
INCLUDE = REPO / "src" / "circuslink" / "include"
NVCC = shutil.which("nvcc")

# A stand-in for channel.cuh with the two handle templates and the vector template the generated
# header names; its vec follows the documented convention (sizeof = the OpenCL size, 3 -> 4 slots;
# alignment = min(size, 16)).
MOCK_CHANNEL_CUH = """
#pragma once
namespace circuslink {
template <class T, int N> struct alignas((sizeof(T) * (N == 3 ? 4 : N)) < 16 ? (sizeof(T) * (N == 3 ? 4 : N)) : 16)
vec { T s[N]; };
template <class T> struct Sender { void* ring; unsigned long long capacity; unsigned int id; };
template <class T> struct Receiver { void* ring; unsigned long long capacity; unsigned int id; };
}
"""


def write(tmp_path: Path, text: str, name: str = "app.xml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def problems(path: str, nranks: int | None = None) -> list[str]:
    with pytest.raises(circuslink.SpecError) as info:
        cspec.load(path, nranks=nranks)
    lines = str(info.value).splitlines()
    assert lines == info.value.problems
    return lines


def sender(name="a_out", id=0, to=1, rank=0, type="uint", extra=""):  # noqa: A002 - mirrors the XML field
    return f'<channel name="{name}" type="{type}" id="{id}" write-to="{to}" rank="{rank}"{extra}/>'


def receiver(name="a_in", id=1, frm=0, rank=1, type="uint", extra=""):  # noqa: A002
    return f'<channel name="{name}" type="{type}" id="{id}" read-from="{frm}" rank="{rank}"{extra}/>'


def doc(*channels: str, structs: str = "") -> str:
    """A document whose line 2 + i holds channels[i] (line 1 is <circus>, structs come after)."""
    return "<circus>\n" + "".join(c + "\n" for c in channels) + structs + "</circus>\n"


# ---- valid specs ---------------------------------------------------------------------------------

def test_fig6_spec_parses_with_child_element_fields():
    s = cspec.load(SPECS / "fig6.xml", nranks=2)
    assert s.path == str(SPECS / "fig6.xml")
    (link,) = s.links
    assert (link.name, link.receiver_name) == ("simple_out", "simple_in")
    assert (link.send_id, link.recv_id, link.src_rank, link.dst_rank, link.depth) == (0, 1, 0, 1, 1024)
    assert link.element == element_type("float") and link.element.width_bits == 32
    assert s.link("simple_in") is link and s.link("simple_out") is link
    assert s.lines == {"simple_out": 5, "simple_in": 13}


def test_fig2_pipeline_spec_parses_with_endpoint_groups():
    s = cspec.load(SPECS / "fig2.xml", nranks=2)
    assert [(k.name, k.receiver_name, k.src_rank, k.dst_rank, k.element.c_type, k.depth) for k in s.links] == [
        ("c_out", "c_in", 0, 1, "int", 256), ("result_out", "result_in", 1, 0, "int", 256)]
    assert [e for e, _, _ in s.ends_on(0)] == ["c_out", "result_in"]
    assert [kind for _, kind, _ in s.ends_on(1)] == ["recv", "send"]


def test_attribute_and_child_element_forms_give_the_same_spec(tmp_path):
    as_attrs = write(tmp_path, doc(sender(extra=' depth="7" width="32"'), receiver()), "a.xml")
    as_children = write(tmp_path, """
        <app>
          <channel name="a_out"><type>uint</type><id>0</id><write-to>1</write-to><rank>0</rank>
            <depth>7</depth><width>32</width></channel>
          <channel name="a_in" type="uint"><id>1</id><read-from> 0 </read-from><rank>1</rank></channel>
        </app>""", "b.xml")
    assert cspec.load(as_attrs).links == cspec.load(as_children).links


def test_random_valid_spec_round_trips(tmp_path):
    """A random spec written out as XML parses back to exactly the links it was made from."""
    rng = random.Random()
    types = ["uchar", "short", "uint", "ulong", "half", "float", "double", "uint16", "float4", "char3",
             "int64_t", "uint8_t", "double8", "ushort2"]
    ids = rng.sample(range(MAX_CHANNEL_ID + 1), 2 * 20)
    want, rows = [], []
    for k in range(20):
        t = rng.choice(types)
        depth = rng.randint(1, min(MAX_DEPTH, MAX_RING_BYTES // element_type(t).nbytes))
        src, dst = rng.randrange(8), rng.randrange(8)
        want.append(Link(f"s{k}", f"r{k}", ids[2 * k], ids[2 * k + 1], src, dst, element_type(t), depth))
        rows.append(sender(f"s{k}", ids[2 * k], ids[2 * k + 1], src, t, f' depth="{depth}"'))
        rows.append(receiver(f"r{k}", ids[2 * k + 1], ids[2 * k], dst, t, f' depth="{rng.randint(1, depth)}"'))
    rng.shuffle(rows)  # declaration order of ends does not matter; links follow their senders
    s = cspec.load(write(tmp_path, doc(*rows)), nranks=8)
    order = [int(r.split('"')[1][1:]) for r in rows if "write-to" in r]
    assert s.links == [want[k] for k in order]


def test_link_depth_is_the_larger_of_the_two_ends_and_defaults(tmp_path):
    s = cspec.load(write(tmp_path, doc(sender(extra=' depth="3"'), receiver(extra=' depth="9"'),
                                        sender("b_out", 2, 3), receiver("b_in", 3, 2))))
    assert [k.depth for k in s.links] == [9, cspec.parser.DEFAULT_DEPTH]


def test_width_is_inferred_and_checked_against_the_type():
    for name, bits in [("uchar", 8), ("half", 16), ("uint", 32), ("ulong", 64), ("uint16", 512),
                       ("uint3", 128), ("char3", 32), ("double8", 512), ("uint32_t", 32), ("float4", 128)]:
        assert element_type(name).width_bits == bits, name


def test_every_builtin_type_has_a_consistent_dtype():
    for name in builtin_type_names():
        t = element_type(name)
        assert 1 <= t.nbytes <= 64 and t.numpy_dtype.itemsize == t.nbytes, name
        assert t.align & (t.align - 1) == 0 and t.nbytes % t.align == 0, name
        # one element is one array item, so host arrays have the shape the user asked for
        assert np.zeros(5, t.numpy_dtype).shape == (5,), name
    assert element_type("uint32_t").same_layout(element_type("uint"))
    assert element_type("unsigned   int").c_type == "unsigned int"
    assert not element_type("int").same_layout(element_type("float"))
    assert element_type("uint16").c_type == "circuslink::vec<unsigned int, 16>"


def test_vector_dtype_holds_the_bytes_of_its_lanes():
    rng = np.random.default_rng()
    lanes = rng.integers(1, 2**32, size=(6, 3), dtype=np.uint32)
    arr = np.zeros(6, element_type("uint3").numpy_dtype)
    arr["s"] = lanes
    raw = arr.view(np.uint32).reshape(6, 4)  # OpenCL layout: 3 lanes then one pad lane
    assert np.array_equal(raw[:, :3], lanes)


def test_struct_layout_follows_c_rules():
    f, u8, d = element_type("float"), element_type("uchar"), element_type("double")
    st = struct_type("p", [("tag", u8), ("x", d), ("v", f, 3)])
    assert st.nbytes == 32 and st.align == 8
    assert [st.numpy_dtype.fields[n][1] for n in ("tag", "x", "v")] == [0, 8, 16]
    assert st.definition == "struct alignas(8) p {\n    unsigned char tag;\n    double x;\n    float v[3];\n};\n"
    opaque = struct_type("blob", nbytes=24)
    assert (opaque.nbytes, opaque.align, opaque.numpy_dtype) == (24, 8, np.dtype("V24"))
    with pytest.raises(circuslink.SpecError, match=r"bytes=20 but its fields take 32 bytes"):
        struct_type("p", [("tag", u8), ("x", d), ("v", f, 3)], nbytes=20)
    with pytest.raises(circuslink.SpecError, match=r"outside 1\.\.64"):
        struct_type("big", nbytes=65)


def test_programmatic_links_without_xml():
    link = Link("tx", "rx", 5, 6, 0, 1, element_type("uint"), 64)
    s = Spec([link])
    assert s.link("rx") is link and s.names() == ["tx", "rx"] and s.ranks() == [0, 1]
    s.check_nranks(2)
    with pytest.raises(circuslink.SpecError, match=r"channel end 'rx': field 'rank': rank 1 is outside 0\.\.0"):
        s.check_nranks(1)
    with pytest.raises(circuslink.SpecError, match=r"no channel end called 'nope' \(known: rx, tx\)"):
        s.link("nope")
    with pytest.raises(circuslink.SpecError, match="name 'tx' is used twice"):
        Spec([link, Link("tx", "rx2", 7, 8, 0, 1, element_type("uint"), 64)])
    with pytest.raises(circuslink.SpecError, match="channel ID 6 is used by both 'rx' and 'tx2'"):
        Spec([link, Link("tx2", "rx2", 6, 8, 0, 1, element_type("uint"), 64)])
    with pytest.raises(circuslink.SpecError, match=r"depth 0 is outside 1\.\.1073741824"):
        Link("tx", "rx", 5, 6, 0, 1, element_type("uint"), 0)
    with pytest.raises(circuslink.SpecError, match=r"depth 268435457 x 4 bytes is more than 1 GiB of ring"):
        Link("tx", "rx", 5, 6, 0, 1, element_type("uint"), (1 << 28) + 1)


# ---- validation: each case names file:line and the field ----------------------------------------

CASES = [
    # (id, document, nranks, the one expected problem as "LINE: rest")
    ("unknown type", doc(sender(type="uint5"), receiver()), None,
     "2: channel 'a_out': field 'type': unknown type 'uint5'"),
    ("too big a vector", doc(sender(type="double16"), receiver()), None,
     "2: channel 'a_out': field 'type': type double16 is 128 bytes; elements may be at most 64 bytes"),
    ("duplicate id", doc(sender(), receiver(), sender("b_out", 1, 9)), None,
     "4: channel 'b_out': field 'id': duplicate ID 1: also used by channel 'a_in' on line 3"),
    ("duplicate name", doc(sender(), receiver(), receiver("a_out", 5, 0)), None,
     "4: channel 'a_out': field 'name': duplicate name: also used by the channel end on line 2"),
    ("dangling write-to", doc(sender(to=7)), None,
     "2: channel 'a_out': field 'write-to': dangling: no channel end has ID 7"),
    ("dangling read-from", doc(receiver(frm=4)), None,
     "2: channel 'a_in': field 'read-from': dangling: no channel end has ID 4"),
    ("both directions", doc('<channel name="x" type="uint" id="0" write-to="1" read-from="1" rank="0"/>'), None,
     "2: channel 'x': field 'read-from': an end has either write-to (sender) or read-from (receiver), not both"),
    ("no direction", doc('<channel name="x" type="uint" id="0" rank="0"/>'), None,
     "2: channel 'x': field 'write-to': missing: a sender end needs write-to"),
    ("two senders into one receiver", doc(sender(), receiver(), sender("b_out", 2, 1)), None,
     "4: channel 'b_out': field 'write-to': receiver 'a_in' (line 3) already has sender 'a_out' (line 2); "
     "a receiver takes exactly one sender"),
    ("type mismatch", doc(sender(type="uint16"), receiver(type="float")), None,
     "3: channel 'a_in': field 'type': float (32 bits) does not match sender 'a_out' (line 2): uint16 (512 bits)"),
    ("same width, other type", doc(sender(type="int"), receiver(type="float")), None,
     "3: channel 'a_in': field 'type': float (32 bits) does not match sender 'a_out' (line 2): int (32 bits)"),
    ("width mismatch", doc(sender(type="uint16", extra=' width="256"'), receiver(type="uint16")), None,
     "2: channel 'a_out': field 'width': 256 bits does not match type uint16 (512 bits)"),
    ("depth zero", doc(sender(extra=' depth="0"'), receiver()), None,
     "2: channel 'a_out': field 'depth': 0 is outside 1..1073741824 (2**30) elements"),
    ("depth too big", doc(sender(), receiver(extra=f' depth="{MAX_DEPTH + 1}"')), None,
     "3: channel 'a_in': field 'depth': 1073741825 is outside 1..1073741824 (2**30) elements"),
    ("ring too big", doc(sender(type="uint2"), receiver(type="uint2", extra=' depth="134217729"')), None,
     "3: channel 'a_in': field 'depth': 134217729 x 8 bytes is more than 1 GiB of ring"),
    ("rank out of range", doc(sender(), receiver(rank=2)), 2,
     "3: channel 'a_in': field 'rank': 2 is outside 0..1 (2 ranks)"),
    ("negative rank", doc(sender(rank=-1), receiver()), None,
     "2: channel 'a_out': field 'rank': -1 is outside 0.. (ranks count from 0)"),
    ("id out of range", doc(sender(to=70000), receiver()), None,
     "2: channel 'a_out': field 'write-to': 70000 is outside 0..65535"),
    ("missing name", doc('<channel type="uint" id="0" write-to="1" rank="0"/>', receiver()), None,
     "2: <channel>: field 'name': missing (every channel end needs a name)"),
    ("missing type", doc('<channel name="a_out" id="0" write-to="1" rank="0"/>', receiver()), None,
     "2: channel 'a_out': field 'type': missing"),
    ("missing id", doc('<channel name="a_out" type="uint" write-to="1" rank="0"/>', receiver()), None,
     "2: channel 'a_out': field 'id': missing"),
    ("missing rank", doc('<channel name="a_out" type="uint" id="0" write-to="1"/>', receiver()), None,
     "2: channel 'a_out': field 'rank': missing"),
    ("non-integer depth", doc(sender(extra=' depth="lots"'), receiver()), None,
     "2: channel 'a_out': field 'depth': 'lots' is not an integer"),
    ("non-integer id", doc(sender(), receiver(id="1.5")), None,
     "3: channel 'a_in': field 'id': '1.5' is not an integer"),
    ("non-integer width", doc(sender(extra=' width="32bits"'), receiver()), None,
     "2: channel 'a_out': field 'width': '32bits' is not an integer"),
    ("write-to names a sender", doc(sender(), sender("b_out", 1, 0)), None,
     "2: channel 'a_out': field 'write-to': ID 1 is sender end 'b_out' (line 3); write-to must name a receiver"),
    ("read-from names a receiver", doc(receiver("a_in", 0, 1), receiver("b_in", 1, 0)), None,
     "2: channel 'a_in': field 'read-from': ID 1 is receiver end 'b_in' (line 3); read-from must name a sender"),
    ("ids that do not point back", doc(sender(), receiver(frm=5), sender("c_out", 5, 9)), None,
     "2: channel 'a_out': field 'write-to': receiver 'a_in' (line 3) reads from ID 5, not from this end's ID 0"),
    ("unknown attribute", doc(sender(extra=' dept="4"'), receiver()), None,
     "2: channel 'a_out': field 'dept': unknown field (known: name, type, id, rank, read-from, write-to, depth, "
     "width)"),
    ("unknown element", "<circus>\n<chanel name='x'/>\n" + sender() + "\n" + receiver() + "\n</circus>", None,
     "2: <circus>: field 'chanel': unknown element <chanel> (expected channel, endpoint, struct or topology)"),
    ("field twice",  # the type both as an attribute (line 2) and as a child element (line 3)
     '<circus>\n<channel name="a_out" type="uint" id="0" write-to="1" rank="0">\n<type>int</type>\n</channel>\n'
     + receiver() + "\n</circus>", None,
     "3: channel 'a_out': field 'type': given twice (also on line 2); keep one"),
    ("bad identifier", doc(sender(name="a-out"), receiver()), None,
     "2: channel 'a-out': field 'name': 'a-out' is not a C identifier (letters, digits, _)"),
    ("keyword name", doc(sender(name="class"), receiver()), None,
     "2: channel 'class': field 'name': 'class' is a C++ or Python keyword"),
    ("endpoint and channel both set rank", "<circus>\n<endpoint rank='0'>\n" + sender() + "\n</endpoint>\n"
     + receiver() + "\n</circus>", None,
     "3: channel 'a_out': field 'rank': given inside <endpoint> (line 2), which already sets the rank"),
    ("endpoint rank out of range", "<circus>\n<endpoint rank='5'>\n" + sender().replace(' rank="0"', "")
     + "\n</endpoint>\n" + receiver() + "\n</circus>", 2,
     "2: channel 'a_out': field 'rank': 5 (from <endpoint>) is outside 0..1 (2 ranks)"),
    ("no channels", "<circus>\n</circus>", None, "1: <circus>: declares no <channel> elements"),
]

@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_validation_error_names_file_line_and_field(tmp_path, case):
    _, text, nranks, expected = case
    path = write(tmp_path, text)
    got = problems(path, nranks)
    assert got[0].startswith(f"{path}:{expected}"), "\n".join(got)


def test_struct_errors_name_file_line_and_field(tmp_path):
    path = write(tmp_path, """
        <circus>
          <struct name="ok"><field name="x" type="float"/></struct>
          <struct name="ok" bytes="4"/>
          <struct name="uint" bytes="4"/>
          <struct name="bad_member"><field name="x" type="flaot"/></struct>
          <struct name="wrong_size" bytes="8"><field name="x" type="double"/><field name="y" type="char"/></struct>
          <struct name="huge" bytes="128"/>
          <struct name="empty"/>
          <struct name="odd_align" bytes="8" align="3"/>
          <channel name="a_out" type="ok" id="0" write-to="1" rank="0"/>
          <channel name="a_in" type="ok" id="1" read-from="0" rank="1"/>
        </circus>""")
    got = problems(path)
    expected = [
        "3: struct 'ok': field 'name': struct 'ok' is already declared on line 2",
        "4: struct 'uint': field 'name': 'uint' is a built-in type name",
        "5: struct 'bad_member' member 'x': field 'type': unknown type 'flaot'",
        "6: struct 'wrong_size': field 'bytes': bytes=8 but its fields take 16 bytes",
        "7: struct 'huge': field 'bytes': 128 is outside 1..64 bytes",
        "8: struct 'empty': field 'bytes': missing: give the struct's size in bytes or its <field>s",
        "9: struct 'odd_align': field 'align': 3 is not a power of two",
    ]
    assert len(got) == len(expected), "\n".join(got)
    for line, want in zip(got, expected, strict=True):
        assert line.startswith(f"{path}:{want}"), line


def test_every_problem_is_reported_one_per_line(tmp_path):
    path = write(tmp_path, doc(sender(type="uint5"), receiver(extra=' depth="0"'), sender("b_out", 2, 99)))
    got = problems(path)
    assert [g.split(": ", 1)[0] for g in got] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "field 'type'" in got[0] and "field 'depth'" in got[1] and "field 'write-to'" in got[2]


def test_malformed_xml_names_line_and_column(tmp_path):
    path = write(tmp_path, "<circus>\n  <channel name='a' type='uint'>\n</circus>\n")
    with pytest.raises(circuslink.SpecError) as info:
        cspec.load(path)
    assert str(info.value) == f"{path}:3:3: malformed XML: mismatched tag"
    with pytest.raises(circuslink.SpecError, match=r"^<string>:1:\d+: malformed XML: "):
        cspec.load("<circus")


def test_missing_file_and_xml_text_sources(tmp_path):
    with pytest.raises(circuslink.SpecError, match="nope.xml: no such spec file"):
        cspec.load(tmp_path / "nope.xml")
    s = cspec.load(doc(sender(), receiver()), name="inline.xml")
    assert s.path == "inline.xml" and s.lines == {"a_out": 2, "a_in": 3}
    with pytest.raises(circuslink.SpecError, match=r"^inline\.xml:3: channel 'a_in': field 'type'"):
        cspec.load(doc(sender(), receiver(type="x")), name="inline.xml")


def test_hex_ids_and_loopback_links(tmp_path):
    s = cspec.load(write(tmp_path, doc(sender(id="0x10", to="0X11"), receiver(id="17", frm="16", rank=0))), 1)
    (link,) = s.links
    assert (link.send_id, link.recv_id, link.src_rank, link.dst_rank) == (16, 17, 0, 0)


def test_cli_reports_spec_errors_in_one_line_per_problem(tmp_path):
    path = write(tmp_path, doc(sender(), receiver(rank=3)))
    proc = run_cli("gen", path, "-o", str(tmp_path / "out"), "--nranks", "2")
    assert proc.returncode == 1
    assert proc.stderr == f"circuslink: error: {path}:3: channel 'a_in': field 'rank': 3 is outside 0..1 (2 ranks)\n"
    assert not (tmp_path / "out").exists()


# ---- circuslink gen --------------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, "-m", "circuslink", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def import_file(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """`circuslink gen` run on every fixture spec; {stem: (cuh path, py path)}."""
    out = tmp_path_factory.mktemp("gen")
    result = {}
    for name in ("fig6", "fig2", "all_types"):
        proc = run_cli("gen", str(SPECS / f"{name}.xml"), "-o", str(out), "--nranks", "3")
        assert proc.returncode == 0, proc.stderr
        cuh, py = out / f"{name}_channels.cuh", out / f"{name}_channels.py"
        assert proc.stdout.split() == [str(cuh), str(py)]
        result[name] = (cuh, py)
    return result


def test_gen_output_is_deterministic_and_bannered(generated, tmp_path):
    cuh, py = generated["all_types"]
    assert cuh.read_text().startswith("// generated by circuslink gen from all_types.xml; do not edit\n")
    assert py.read_text().startswith('"""generated by circuslink gen from all_types.xml; do not edit.')
    paths = codegen.generate(str(SPECS / "all_types.xml"), str(tmp_path))
    assert Path(paths[0]).read_bytes() == cuh.read_bytes() and Path(paths[1]).read_bytes() == py.read_bytes()


def test_gen_header_declares_handles_ids_and_bundles(generated):
    text = generated["fig6"][0].read_text()
    for line in ["#include <circuslink/channel.cuh>", "namespace fig6 {",
                 "using simple_out_t = circuslink::Sender<float>;",
                 "using simple_in_t = circuslink::Receiver<float>;",
                 "constexpr unsigned int simple_out_id = 0;", "constexpr unsigned int simple_in_peer_id = 0;",
                 "constexpr int simple_out_rank = 0;", "constexpr int simple_in_rank = 1;",
                 "constexpr unsigned int simple_in_depth = 1024;", "constexpr unsigned int simple_out_width = 32;",
                 "constexpr int min_ranks = 2;",
                 "struct rank0_channels {\n    circuslink::Sender<float> simple_out;\n};",
                 "struct rank1_channels {\n    circuslink::Receiver<float> simple_in;\n};"]:
        assert line in text, line
    assert "cuda_fp16" not in text
    all_types = generated["all_types"][0].read_text()
    assert "#include <cuda_fp16.h>" in all_types
    assert "using u16_out_t = circuslink::Sender<circuslink::vec<unsigned int, 16>>;" in all_types
    assert 'static_assert(sizeof(particle) == 32, "sizeof(particle) must be 32");' in all_types


def test_gen_python_binding_imports_and_matches_the_spec(generated):
    mod = import_file(generated["all_types"][1])
    want = cspec.load(SPECS / "all_types.xml")
    assert mod.SPEC.links == want.links and mod.SPEC.path == "all_types.xml"
    assert mod.SPEC.lines == want.lines
    assert (mod.U16_OUT, mod.U16_OUT_ID, mod.U16_OUT_RANK) == ("u16_out", 0, 0)
    assert (mod.W_OUT, mod.W_OUT_ID, mod.W_OUT_RANK) == ("w_out", 12, 2)
    assert mod.MIN_RANKS == 3
    assert mod.ENDS_ON_RANK[0] == ("u16_out", "byte_out", "h_out", "v3_out", "p_out", "tv_out", "w_in", "blob_in")

    class FakeWorld:
        size = 2

    with pytest.raises(circuslink.SpecError, match="ranks up to 2, but the job has 2 rank"):
        mod.open(FakeWorld())

    class End:
        def __init__(self, name):
            self.name = name

        def device_handle(self):
            return ("handle", self.name)

    chans = {name: End(name) for name in want.names()}
    assert mod.handles(chans, 1) == [("handle", n) for n in mod.ENDS_ON_RANK[1]]
    with pytest.raises(circuslink.SpecError, match="no channel end on rank 7"):
        mod.handles(chans, 7)


def test_gen_python_binding_opens_through_circuslink_channels(generated, monkeypatch):
    """open(world) hands the embedded spec to circuslink.channels.open (stubbed here: the channels are
    another module's business; this checks only the binding's wiring)."""
    import types

    calls = []
    fake = types.ModuleType("circuslink.channels")
    fake.open = lambda world, spec, **kw: calls.append((world, spec, kw)) or "opened"
    monkeypatch.setitem(sys.modules, "circuslink.channels", fake)
    monkeypatch.setattr(circuslink, "channels", fake, raising=False)
    mod = import_file(generated["fig6"][1])

    class World:
        size = 2

    w = World()
    assert mod.open(w) == "opened" and mod.open(w, timeout=5.0) == "opened"
    assert calls[0][0] is w and calls[0][1] is mod.SPEC and calls[0][2] == {}
    assert calls[1][2] == {"timeout": 5.0}


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff not installed")
def test_gen_python_binding_is_ruff_clean(generated):
    files = [str(generated[n][1]) for n in generated]
    proc = subprocess.run(["ruff", "check", "--config", str(REPO / "pyproject.toml"), *files],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gen_refuses_names_that_would_clash(tmp_path):
    path = write(tmp_path, doc(sender("x"), receiver("x_peer")))
    with pytest.raises(circuslink.SpecError, match=rf"^{path}:3: channel 'x_peer': field 'name': the CUDA header "
                                                   r"name 'x_peer_id' would clash with channel 'x'"):
        codegen.generate(path, str(tmp_path / "out"))
    path = write(tmp_path, doc(sender("spec"), receiver()), "b.xml")
    with pytest.raises(circuslink.SpecError, match="Python binding name 'SPEC' would clash with the binding"):
        codegen.generate(path, str(tmp_path / "out"))


def test_gen_makes_its_folder_but_never_a_missing_parent(tmp_path):
    """-o build/ is made where it is missing (the docs' example), but a folder whose parent is missing is refused
    before anything is written, as --json and --plot refuse theirs: no tree of folders made from a typo."""
    proc = run_cli("gen", str(SPECS / "fig6.xml"), "-o", str(tmp_path / "absent" / "build"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"folder {str(tmp_path / 'absent')!r} does not exist (it is not created)" in proc.stderr
    assert os.listdir(tmp_path) == []
    proc = run_cli("gen", str(SPECS / "fig6.xml"), "-o", str(tmp_path / "build"))
    assert proc.returncode == 0 and sorted(os.listdir(tmp_path / "build")) == ["fig6_channels.cuh",
                                                                               "fig6_channels.py"]


def test_gen_stem_becomes_an_identifier(tmp_path):
    src = tmp_path / "2-stage pipeline.xml"
    src.write_text(doc(sender(), receiver()))
    paths = codegen.generate(str(src), str(tmp_path / "o"))
    assert [Path(p).name for p in paths] == ["spec_2_stage_pipeline_channels.cuh", "spec_2_stage_pipeline_channels.py"]
    assert "namespace spec_2_stage_pipeline {" in Path(paths[0]).read_text()


# ---- the generated header compiles -----------------------------------------------------------------

def _layout_asserts(t, expr: str, out: list[str]) -> None:
    """static_asserts that every member of struct ``t`` sits at its numpy dtype offset (recursively)."""
    for name, member, _count in t.members:
        offset = t.numpy_dtype.fields[name][1]
        out.append(f"static_assert(__builtin_offsetof({expr}, {name}) == {offset}, \"{t.name}.{name}\");")
        if member.members:
            _layout_asserts(member, f"{expr.rsplit('::', 1)[0]}::{member.c_type}", out)


def _compile(cu: Path, include_dirs: list[Path]) -> subprocess.CompletedProcess:
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", *[f"-I{d}" for d in include_dirs], "-c", str(cu), "-o",
           str(cu.with_suffix(".o"))]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _kernel_source(stem: str, s: Spec, extra: list[str]) -> str:
    ranks = ", ".join(f"{stem}::rank{r}_channels r{r}" for r in s.ranks())
    aliases = "".join(f"{stem}::{e}_t* h_{e};\n" for e in s.names())
    return (f'#include "{stem}_channels.cuh"\n' + "\n".join(extra) + "\n" + aliases
            + f"__global__ void uses_every_bundle({ranks}) {{}}\n")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_gen_header_compiles_with_nvcc_against_a_stand_in_channel_header(generated, tmp_path):
    (tmp_path / "mock" / "circuslink").mkdir(parents=True)
    (tmp_path / "mock" / "circuslink" / "channel.cuh").write_text(MOCK_CHANNEL_CUH)
    s = cspec.load(SPECS / "all_types.xml")
    asserts: list[str] = []
    for st in s.structs:
        _layout_asserts(st, f"all_types::{st.c_type}", asserts)
    assert len(asserts) >= 8
    cu = tmp_path / "all_types_test.cu"
    cu.write_text(_kernel_source("all_types", s, asserts))
    proc = _compile(cu, [tmp_path / "mock", generated["all_types"][0].parent])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_gen_header_static_asserts_catch_a_layout_mismatch(generated, tmp_path):
    """A vec template laid out differently (3-vectors packed to 12 bytes) must fail to compile."""
    (tmp_path / "mock" / "circuslink").mkdir(parents=True)
    (tmp_path / "mock" / "circuslink" / "channel.cuh").write_text(
        MOCK_CHANNEL_CUH.replace("(N == 3 ? 4 : N)", "N"))
    cu = tmp_path / "t.cu"
    cu.write_text(_kernel_source("all_types", cspec.load(SPECS / "all_types.xml"), []))
    proc = _compile(cu, [tmp_path / "mock", generated["all_types"][0].parent])
    assert proc.returncode != 0 and "sizeof(int3) must be 16" in proc.stdout + proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("stem", ["fig6", "fig2", "all_types"])
def test_gen_header_compiles_with_nvcc_against_channel_cuh(generated, tmp_path, stem):
    cu = tmp_path / f"{stem}_real.cu"
    cu.write_text(_kernel_source(stem, cspec.load(SPECS / f"{stem}.xml"), []))
    proc = _compile(cu, [INCLUDE, generated[stem][0].parent])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cli_missing_spec_file_is_one_line(tmp_path):
    proc = run_cli("gen", str(tmp_path / "absent.xml"), "-o", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr == f"circuslink: error: {tmp_path / 'absent.xml'}: no such spec file\n"
