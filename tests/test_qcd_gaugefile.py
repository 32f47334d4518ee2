"""Gauge configuration files: ILDG / SciDAC LIME and NERSC, read, checked, written.

The files are written here by writers of the test's own (site by site, link by link, in the order the formats
publish: x fastest, t slowest, mu = x, y, z, t, rows then columns, re then im), so the reader's layout is
checked against the specification rather than against its own writer; the checksums are recomputed here the
same way. Fields are Haar-random SU(3) from the test's seed. Every corruption must be refused with one line
naming the file and the record, field or checksum.
"""

from __future__ import annotations

import itertools
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import circuslink as cl
from circuslink.apps import qcd

DIMS = (4, 2, 6, 4)  # X, Y, Z, T: every extent different where it can be, so an axis mix-up shows


# -- the test's own writers ---------------------------------------------------------------------------------
def site_values(U: np.ndarray, rows: int = 3):
    """The reals of each site in file order: (x fastest) sites, mu, row, column, (re, im)."""
    X, Y, Z, T = U.shape[4], U.shape[3], U.shape[2], U.shape[1]
    for t, z, y, x in itertools.product(range(T), range(Z), range(Y), range(X)):
        out = []
        for mu in range(4):
            for a in range(rows):
                for b in range(3):
                    v = U[mu, t, z, y, x, a, b]
                    out += [v.real, v.imag]
        yield out


def rotl(v: int, k: int) -> int:
    return ((v << k) | (v >> (32 - k))) & 0xFFFFFFFF if k else v


def lime(rtype: str, data: bytes, mb: bool, me: bool) -> bytes:
    flags = (0x8000 if mb else 0) | (0x4000 if me else 0)
    head = struct.pack(">IHHQ", 0x456789AB, 1, flags, len(data)) + rtype.encode().ljust(128, b"\0")
    return head + data + b"\0" * ((8 - len(data) % 8) % 8)


def write_ildg(path, U, bits, checksum=True, fmt=True, dims=None):
    code = ">d" if bits == 64 else ">f"
    sites = [b"".join(struct.pack(code, v) for v in vals) for vals in site_values(U)]
    suma = sumb = 0
    for rank, site in enumerate(sites):
        crc = zlib.crc32(site)
        suma ^= rotl(crc, rank % 29)
        sumb ^= rotl(crc, rank % 31)
    X, Y, Z, T = dims or (U.shape[4], U.shape[3], U.shape[2], U.shape[1])
    records = [lime("scidac-private-file-xml", b"<scidacFile><version>1.1</version></scidacFile>", True, False),
               lime("scidac-file-xml", b"<info>test</info>", False, True)]
    body = [lime("ildg-binary-data", b"".join(sites), False, not checksum)]
    if fmt:
        xml = (f'<?xml version="1.0"?><ildgFormat xmlns="http://www.lqcd.org/ildg"><version>1.0</version>'
               f"<field>su3gauge</field><precision>{bits}</precision><lx>{X}</lx><ly>{Y}</ly><lz>{Z}</lz>"
               f"<lt>{T}</lt></ildgFormat>")
        body.insert(0, lime("ildg-format", xml.encode(), False, False))
    if checksum:
        xml = f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma><sumb>{sumb:x}</sumb></scidacChecksum>"
        body.append(lime("scidac-checksum", xml.encode(), False, True))
    body[0] = body[0][:6] + struct.pack(">H", struct.unpack(">H", body[0][6:8])[0] | 0x8000) + body[0][8:]
    path.write_bytes(b"".join(records + body))
    return suma, sumb


def nersc_file(path, U, bits=64, rows=2, order=">", floating=None, edit=None):
    letter = "d" if bits == 64 else "f"
    data = b"".join(struct.pack(f"{order}{letter}", v) for vals in site_values(U, rows) for v in vals)
    count = len(data) // (bits // 8)
    native = struct.pack(f"={count}{letter}", *struct.unpack(f"{order}{count}{letter}", data))
    words = struct.unpack(f"={len(native) // 4}I", native)  # the words of each stored value
    checksum = sum(words) % (1 << 32)
    X, Y, Z, T = U.shape[4], U.shape[3], U.shape[2], U.shape[1]
    kept = U.astype(np.complex64).astype(np.complex128) if bits == 32 else U
    header = {
        "HDR_VERSION": "1.0", "DATATYPE": "4D_SU3_GAUGE" if rows == 2 else "4D_SU3_GAUGE_3x3",
        "STORAGE_FORMAT": "1.0", "DIMENSION_1": X, "DIMENSION_2": Y, "DIMENSION_3": Z, "DIMENSION_4": T,
        "LINK_TRACE": f"{np.trace(kept, axis1=-2, axis2=-1).real.mean() / 3:.10g}",
        "PLAQUETTE": f"{slow_plaquette(kept):.10g}", "BOUNDARY_1": "PERIODIC", "BOUNDARY_4": "PERIODIC",
        "CHECKSUM": f"{checksum:>10x}", "ENSEMBLE_ID": "test", "SEQUENCE_NUMBER": 1,
        "FLOATING_POINT": floating or f"IEEE{bits}{'BIG' if order == '>' else 'LITTLE'}",
    }
    if edit:
        edit(header)
    text = "BEGIN_HEADER\n" + "".join(f"{k} = {v}\n" for k, v in header.items()) + "END_HEADER\n"
    path.write_bytes(text.encode() + data)
    return header


def slow_plaquette(U: np.ndarray) -> float:
    """The plaquette site by site (an independent check of the vectorised one)."""
    T, Z, Y, X = U.shape[1:5]
    L = (X, Y, Z, T)
    total = 0.0
    for t, z, y, x in itertools.product(range(T), range(Z), range(Y), range(X)):
        here = (x, y, z, t)

        def link(mu, c):
            return U[mu, c[3] % T, c[2] % Z, c[1] % Y, c[0] % X]

        for mu, nu in itertools.combinations(range(4), 2):
            up_mu = tuple(here[i] + (i == mu) for i in range(4))
            up_nu = tuple(here[i] + (i == nu) for i in range(4))
            p = link(mu, here) @ link(nu, up_mu) @ link(mu, up_nu).conj().T @ link(nu, here).conj().T
            total += np.trace(p).real / 3
    return total / (6 * np.prod(L))


@pytest.fixture
def U(seed):
    return qcd.random_gauge(DIMS, seed)


def as_stored(U, bits):
    return U.astype(np.complex64).astype(np.complex128) if bits == 32 else U


# -- the plaquette ----------------------------------------------------------------------------------------------
def test_plaquette_of_unit_field_is_one_and_matches_site_by_site(U):
    assert qcd.plaquette(qcd.unit_gauge(DIMS)) == pytest.approx(1.0, abs=1e-15)
    assert qcd.plaquette(U) == pytest.approx(slow_plaquette(U), abs=1e-13)


def test_plaquette_is_gauge_invariant(U, seed):
    rng = np.random.default_rng(seed + 7)
    G = qcd.random_su3(rng, int(np.prod(DIMS))).reshape(DIMS[::-1] + (3, 3))
    UG = np.stack([G @ U[mu] @ qcd.shift(G, mu, +1, antiperiodic_t=False).conj().swapaxes(-1, -2)
                   for mu in range(4)])
    assert qcd.plaquette(UG) == pytest.approx(qcd.plaquette(U), abs=1e-13)
    assert abs(qcd.plaquette(U)) < 0.2  # Haar-random links: the plaquette averages to 0


# -- ILDG ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [64, 32])
def test_ildg_file_is_read_in_the_published_layout(tmp_path, U, bits):
    write_ildg(tmp_path / "cfg.lime", U, bits)
    got = qcd.read_gauge(str(tmp_path / "cfg.lime"))
    assert got.format == "ildg" and got.precision == bits and got.dims == DIMS
    assert got.checked == ["scidac-checksum"]
    np.testing.assert_array_equal(got.U, as_stored(U, bits))
    assert got.plaquette == pytest.approx(slow_plaquette(as_stored(U, bits)), abs=1e-13)
    assert qcd.peek_gauge(str(tmp_path / "cfg.lime")) == DIMS


@pytest.mark.parametrize("bits", [64, 32])
def test_ildg_round_trip_and_the_written_file_follows_the_format(tmp_path, U, bits):
    path = tmp_path / "out.ildg"
    qcd.write_ildg(str(path), U, precision=bits)
    got = qcd.read_gauge(str(path))
    np.testing.assert_array_equal(got.U, as_stored(U, bits))
    # Parse the written file here: records, message bits, and the checksum recomputed independently.
    raw = path.read_bytes()
    pos, records = 0, []
    while pos < len(raw):
        magic, version, flags, length = struct.unpack(">IHHQ", raw[pos:pos + 16])
        rtype = raw[pos + 16:pos + 144].rstrip(b"\0").decode()
        assert magic == 0x456789AB and version == 1
        records.append((rtype, bool(flags & 0x8000), bool(flags & 0x4000), raw[pos + 144:pos + 144 + length]))
        pos += 144 + length + (-length % 8)
    assert [r[0] for r in records] == ["scidac-private-file-xml", "scidac-file-xml", "scidac-private-record-xml",
                                       "scidac-record-xml", "ildg-format", "ildg-binary-data", "scidac-checksum"]
    assert [(r[1], r[2]) for r in records] == [(True, False), (False, True), (True, False), (False, False),
                                                (False, False), (False, False), (False, True)]
    fmt = records[4][3].decode()
    X, Y, Z, T = DIMS
    for tag, value in (("precision", bits), ("lx", X), ("ly", Y), ("lz", Z), ("lt", T), ("field", "su3gauge")):
        assert f"<{tag}>{value}</{tag}>" in fmt
    code = ">d" if bits == 64 else ">f"
    want = b"".join(struct.pack(code, v) for vals in site_values(as_stored(U, bits)) for v in vals)
    assert records[5][3] == want
    site = 4 * 18 * bits // 8
    suma = sumb = 0
    for rank in range(len(want) // site):
        crc = zlib.crc32(want[rank * site:(rank + 1) * site])
        suma ^= rotl(crc, rank % 29)
        sumb ^= rotl(crc, rank % 31)
    assert f"<suma>{suma:x}</suma><sumb>{sumb:x}</sumb>" in records[6][3].decode()


def test_ildg_without_a_checksum_record_is_read_and_says_so(tmp_path, U):
    write_ildg(tmp_path / "c.lime", U, 64, checksum=False)
    got = qcd.read_gauge(str(tmp_path / "c.lime"))
    assert got.checked == [] and "nothing to check against" in got.describe()
    np.testing.assert_array_equal(got.U, U)


# -- NERSC ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits, rows, order", [(64, 2, ">"), (32, 2, ">"), (64, 3, ">"), (32, 3, ">"),
                                               (64, 2, "<"), (32, 3, "<")])
def test_nersc_file_is_read_and_checked(tmp_path, U, bits, rows, order):
    nersc_file(tmp_path / "cfg.nersc", U, bits, rows, order)
    got = qcd.read_gauge(str(tmp_path / "cfg.nersc"))
    assert got.format == "nersc" and got.precision == bits and got.dims == DIMS
    assert got.checked == ["CHECKSUM", "LINK_TRACE", "PLAQUETTE"]
    want = as_stored(U, bits)
    if rows == 2:  # the third row is reconstructed in double from the stored two
        np.testing.assert_array_equal(got.U[..., :2, :], want[..., :2, :])
        np.testing.assert_allclose(got.U[..., 2, :], want[..., 2, :], atol=1e-14 if bits == 64 else 1e-6)
    else:
        np.testing.assert_array_equal(got.U, want)
    assert qcd.peek_gauge(str(tmp_path / "cfg.nersc")) == DIMS


@pytest.mark.parametrize("floating, order", [("IEEE64", ">"), ("IEEE64", "<"), ("IEEE32", "<")])
def test_nersc_without_byte_order_takes_the_one_whose_checksum_matches(tmp_path, U, floating, order):
    nersc_file(tmp_path / "c", U, int(floating[4:]), 3, order, floating=floating)
    np.testing.assert_array_equal(qcd.read_gauge(str(tmp_path / "c")).U, as_stored(U, int(floating[4:])))


def test_npy_goes_through_the_same_reader(tmp_path, U):
    np.save(tmp_path / "U.npy", U)
    got = qcd.read_gauge(str(tmp_path / "U.npy"))
    assert got.format == "npy" and got.dims == DIMS
    np.testing.assert_array_equal(got.U, U)


# -- corrupt files: one line each ------------------------------------------------------------------------------------
def _ildg(tmp_path, U):
    path = tmp_path / "c.lime"
    write_ildg(path, U, 64)
    return path, path.read_bytes()


def _record_at(raw: bytes, n: int) -> int:
    """Byte offset of the header of record ``n`` (1-based)."""
    pos = 0
    for _ in range(n - 1):
        length = struct.unpack(">Q", raw[pos + 8:pos + 16])[0]
        pos += 144 + length + (-length % 8)
    return pos


def _binary_offset(raw: bytes) -> int:
    return _record_at(raw, 4) + 144


ILDG_CORRUPTIONS = {
    "flipped data byte": (lambda raw: raw[:_binary_offset(raw) + 100] + bytes([raw[_binary_offset(raw) + 100] ^ 1])
                          + raw[_binary_offset(raw) + 101:], r"record 5 \(scidac-checksum\): SciDAC checksum mismatch"),
    "bad magic": (lambda raw: raw[:_record_at(raw, 2)] + b"\0\0\0\0" + raw[_record_at(raw, 2) + 4:],
                  r"record 2 at byte \d+: bad LIME magic 0x00000000"),
    "truncated data": (lambda raw: raw[:_binary_offset(raw) + 1000],
                       r"record 4 \(ildg-binary-data\): announces \d+ data bytes, the file has 1000 after its header"),
    "truncated header": (lambda raw: raw[:-200], r"record 5 at byte \d+: header truncated"),
    "cut after the data": (lambda raw: raw[:_binary_offset(raw) + 4 * 18 * 8 * int(np.prod(DIMS))],
                           r"record 4 \(ildg-binary-data\): the last record has no message-end bit"),
    "bad precision": (lambda raw: raw.replace(b"<precision>64<", b"<precision>48<"),
                      r"record 3 \(ildg-format\): precision 48 \(expected 32 or 64\)"),
    "wrong lattice": (lambda raw: raw.replace(b"<lz>6</lz>", b"<lz>8</lz>"),
                      r"record 4 \(ildg-binary-data\): \d+ bytes, expected \d+ for 4x2x8x4 sites"),
    "no lt": (lambda raw: raw.replace(b"<lt>4</lt>", b"<xx>4</xx>"), r"record 3 \(ildg-format\): no <lt> element"),
    "bad suma": (lambda raw: re.sub(rb"<suma>..", b"<suma>zz", raw), r"record 5 \(scidac-checksum\): suma 'zz"),
    "two message begins": (lambda raw: raw[:_record_at(raw, 2) + 6] + b"\xc0" + raw[_record_at(raw, 2) + 7:],
                           r"record 2 \(scidac-file-xml\): message-begin bit set inside a message"),
}


@pytest.mark.parametrize("case", ILDG_CORRUPTIONS)
def test_corrupt_ildg_is_refused_in_one_line(tmp_path, U, case):
    path, raw = _ildg(tmp_path, U)
    corrupt, message = ILDG_CORRUPTIONS[case]
    path.write_bytes(corrupt(raw))
    with pytest.raises(cl.ConfigError) as info:
        qcd.peek_gauge(str(path))  # the structure is checked before any data is read ...
        qcd.read_gauge(str(path))  # ... the checksum when the data is
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"--load-gauge {path}: ") and re.search(message, text), text


def _nersc_bad(tmp_path, U, edit=None, mangle=None, **kw):
    path = tmp_path / "c.nersc"
    nersc_file(path, U, edit=edit, **kw)
    if mangle:
        path.write_bytes(mangle(path.read_bytes()))
    return path


NERSC_CORRUPTIONS = {
    "flipped data byte": (dict(mangle=lambda raw: raw[:-50] + bytes([raw[-50] ^ 4]) + raw[-49:]),
                          r"NERSC CHECKSUM mismatch: the header says [0-9a-f]+, the data give [0-9a-f]+"),
    "plaquette": (dict(edit=lambda h: h.update(PLAQUETTE=f"{float(h['PLAQUETTE']) + 1e-4:.10g}")),
                  r"NERSC header: PLAQUETTE = .*, the data give .* \(tolerance 1e-06 for 64-bit data\)"),
    "link trace": (dict(edit=lambda h: h.update(LINK_TRACE="0.5")), r"NERSC header: LINK_TRACE = 0.5, the data give"),
    "truncated": (dict(mangle=lambda raw: raw[:-8]),
                  r"NERSC data: \d+ bytes after the header, expected \d+ .*truncated"),
    "datatype": (dict(edit=lambda h: h.update(DATATYPE="4D_SU2_GAUGE")), r"NERSC header: DATATYPE = '4D_SU2_GAUGE'"),
    "dimension": (dict(edit=lambda h: h.pop("DIMENSION_3")), r"NERSC header: no DIMENSION_3"),
    "floating point": (dict(edit=lambda h: h.update(FLOATING_POINT="IEEE16")), r"FLOATING_POINT = 'IEEE16'"),
    "checksum text": (dict(edit=lambda h: h.update(CHECKSUM="xyz")), r"CHECKSUM = 'xyz' is not a hexadecimal"),
    "no end": (dict(mangle=lambda raw: raw.replace(b"END_HEADER", b"END_HEADEX")), r"no END_HEADER line"),
}


@pytest.mark.parametrize("case", NERSC_CORRUPTIONS)
def test_corrupt_nersc_is_refused_in_one_line(tmp_path, U, case):
    kw, message = NERSC_CORRUPTIONS[case]
    path = _nersc_bad(tmp_path, U, **kw)
    with pytest.raises(cl.ConfigError) as info:
        qcd.read_gauge(str(path))
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"--load-gauge {path}: ") and re.search(message, text), text


def test_unknown_bytes_are_refused(tmp_path):
    (tmp_path / "x.cfg").write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(cl.ConfigError, match=r"x.cfg: not a gauge file this reader knows"):
        qcd.read_gauge(str(tmp_path / "x.cfg"))
    with pytest.raises(cl.ConfigError, match=r"missing.lime: no such file"):
        qcd.read_gauge(str(tmp_path / "missing.lime"))


# -- the command line --------------------------------------------------------------------------------------------
def qcd_cli(*args, cwd):
    import os

    env = dict(os.environ, CIRCUSLINK_BACKEND="cpu", CIRCUSLINK_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "circuslink", "qcd", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_plaquette_command_prints_the_plaquette(tmp_path, U):
    nersc_file(tmp_path / "a.nersc", U, 64, 2)
    write_ildg(tmp_path / "b.lime", U, 32)
    for name, bits in (("a.nersc", 64), ("b.lime", 32)):
        proc = qcd_cli("plaquette", name, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        value = float(proc.stdout.split("plaquette ")[1].split()[0])
        assert value == pytest.approx(slow_plaquette(as_stored(U, bits)), abs=1e-11)
        assert name in proc.stdout
    (tmp_path / "bad.lime").write_bytes((tmp_path / "b.lime").read_bytes()[:-300])
    proc = qcd_cli("plaquette", "bad.lime", cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("circuslink: error: bad.lime: ")
