"""Gauge configuration files as other QCD codes write them: ILDG / SciDAC LIME and NERSC, plus .npy.

Every format is mapped to the array the solver uses, ``U[mu, t, z, y, x, a, b]`` (mu = 0:x, 1:y, 2:z, 3:t;
``U_mu(x)`` the link from x to x + mu, row a, column b), and read back from the file's own bytes:

* **ILDG / SciDAC LIME** (the ILDG file format; the USQCD SciDAC I/O conventions). A LIME file is records,
  each a 144-byte big-endian header (magic ``0x456789ab``, version 1, flags with message-begin ``0x8000`` and
  message-end ``0x4000``, data length, a 128-byte NUL-padded type) and its data padded to 8 bytes. The
  ``ildg-format`` record (XML) gives ``field`` (su3gauge), ``precision`` (32 or 64) and ``lx ly lz lt``;
  ``ildg-binary-data`` holds the links big-endian, sites x fastest and t slowest, at each site mu = x, y, z, t,
  each a 3x3 complex matrix row-major (re, im). ``scidac-checksum`` (XML ``suma``, ``sumb``, hex) is
  checked: per site ``c = crc32`` of the site's bytes as stored, ``r`` its lexicographic index,
  ``suma ^= rotl(c, r % 29)``, ``sumb ^= rotl(c, r % 31)``. Files without an ``ildg-format`` record
  (SciDAC files of QIO) take the lattice from ``scidac-private-file-xml`` and the precision from
  ``scidac-private-record-xml``.
* **NERSC** (the NERSC archive format): ``BEGIN_HEADER``, lines ``KEY = VALUE``, ``END_HEADER``, then the
  data with the same site and link order. ``DATATYPE`` 4D_SU3_GAUGE stores the first two rows of each link
  (the third is ``conj(row0 x row1)``), 4D_SU3_GAUGE_3x3 all three; ``FLOATING_POINT`` IEEE32BIG,
  IEEE64BIG, IEEE32LITTLE, IEEE64LITTLE (IEEE32 / IEEE64 alone: the byte order whose checksum matches).
  Checked: ``CHECKSUM`` (the sum mod 2^32 of the 32-bit words of the stored numbers: for 2-row files only the
  two stored rows; the words of each value, whatever the byte order on disk, as Grid and MILC sum them),
  ``LINK_TRACE`` (mean of Re tr U / 3) and ``PLAQUETTE``, within 1e-6 (64-bit) or 1e-5 (32-bit).

A file that fails any check is refused in one line naming the file and the record, field or checksum.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ._reference import shift

LIME_MAGIC = 0x456789AB
LIME_VERSION = 1
_LIME_HEADER = struct.Struct(">IHHQ128s")  # magic, version, flags, data length, type: 144 bytes
_MB, _ME = 0x8000, 0x4000
_NPY_MAGIC = b"\x93NUMPY"
_NERSC_DATATYPES = {"4D_SU3_GAUGE": 2, "4D_SU3_GAUGE_3x3": 3}  # rows stored
_NERSC_FLOATS = {  # name -> (bytes per real, byte orders to try)
    "IEEE32BIG": (4, (">",)), "IEEE64BIG": (8, (">",)), "IEEE32LITTLE": (4, ("<",)), "IEEE64LITTLE": (8, ("<",)),
    "IEEE32": (4, (">", "<")), "IEEE64": (8, (">", "<")),
}
_NERSC_TOLERANCE = {4: 1e-5, 8: 1e-6}
FORMATS = ("ildg", "nersc", "npy")


# -- what every code checks a configuration by ------------------------------------------------------------
def plaquette(U: Any) -> float:
    """The average plaquette: (1/3) Re tr of the 6 plaquettes ``U_mu(x) U_nu(x+mu) U_mu(x+nu)^+ U_nu(x)^+``
    averaged over planes and sites (1.0 for the unit field). ``U[mu, t, z, y, x, a, b]``, periodic."""
    U = np.asarray(U)
    total = 0.0
    for mu in range(4):
        for nu in range(mu + 1, 4):
            forward = np.matmul(U[mu], shift(U[nu], mu, +1, antiperiodic_t=False))
            other = np.matmul(U[nu], shift(U[mu], nu, +1, antiperiodic_t=False))
            # tr(A B^dagger) = sum_ab A_ab conj(B_ab)
            total += float(np.sum((forward * other.conj()).real))
    return total / (3.0 * 6.0 * np.prod(U.shape[1:5]))


def link_trace(U: Any) -> float:
    """The mean over every link of Re tr U / 3 (NERSC's LINK_TRACE)."""
    U = np.asarray(U)
    return float(np.trace(U, axis1=-2, axis2=-1).real.mean() / 3.0)


def unitarity_deviation(U: Any) -> float:
    """max over links of |U U^dagger - 1| (element-wise): 1e-15 for a double-precision SU(3) field."""
    U = np.asarray(U).reshape(-1, 3, 3)
    return float(np.abs(np.matmul(U, U.conj().swapaxes(-1, -2)) - np.eye(3)).max()) if U.size else 0.0


def third_row(rows: np.ndarray) -> np.ndarray:
    """The third row of SU(3) matrices from their first two, ``conj(row0 x row1)``: (..., 2, 3) -> (..., 3)."""
    return np.cross(rows[..., 0, :], rows[..., 1, :]).conj()


def scidac_checksum(data: bytes | memoryview | np.ndarray, site_bytes: int) -> tuple[int, int]:
    """(suma, sumb) of a field's bytes as stored, ``site_bytes`` per site in lexicographic order."""
    raw = memoryview(np.ascontiguousarray(data).view(np.uint8).reshape(-1) if isinstance(data, np.ndarray)
                     else data).cast("B")
    sites = len(raw) // site_bytes
    crc = np.fromiter((zlib.crc32(raw[i * site_bytes:(i + 1) * site_bytes]) for i in range(sites)),
                      dtype=np.uint64, count=sites)
    rank = np.arange(sites, dtype=np.uint64)

    def rotl(k: np.ndarray) -> np.ndarray:
        return ((crc << k) | (crc >> (np.uint64(32) - k))) & np.uint64(0xFFFFFFFF)

    suma = int(np.bitwise_xor.reduce(rotl(rank % np.uint64(29)))) if sites else 0
    sumb = int(np.bitwise_xor.reduce(rotl(rank % np.uint64(31)))) if sites else 0
    return suma, sumb


def nersc_checksum(values: np.ndarray) -> int:
    """NERSC's CHECKSUM of stored numbers: the sum of their 32-bit words mod 2^32 (the byte order of the file
    does not matter: a value's words are summed, not its bytes)."""
    native = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    return int(native.view(np.uint32).sum(dtype=np.uint64) & 0xFFFFFFFF)


def _label(option: str, path: str) -> str:
    """How messages name the file: ``--load-gauge cfg.lime``, or the path alone where no option gave it."""
    return f"{option} {path}" if option else str(path)


# -- reading ------------------------------------------------------------------------------------------------
@dataclass
class GaugeFile:
    """A configuration read from a file, with what was checked."""

    U: np.ndarray                 # U[mu, t, z, y, x, a, b], complex128
    path: str
    format: str                   # "ildg", "nersc" or "npy"
    precision: int                # bits per real in the file: 32 or 64
    dims: tuple[int, int, int, int]  # X, Y, Z, T
    plaquette: float
    link_trace: float
    checked: list[str] = field(default_factory=list)  # what was verified against the file ("scidac-checksum", ...)

    def describe(self) -> str:
        checks = ", ".join(self.checked) if self.checked else "nothing to check against"
        return (f"{self.format.upper()} {'x'.join(map(str, self.dims))} {self.precision}-bit ({checks}): "
                f"plaquette {self.plaquette:.12f}")


@dataclass
class _Record:
    index: int      # 1-based, as a person counts them
    type: str
    begin: bool
    end: bool
    offset: int     # of the data
    length: int

    def name(self) -> str:
        return f"record {self.index} ({self.type or 'no type'})"


def detect(path: str, option: str = "--load-gauge") -> str:
    """The format of a gauge file from its first bytes: "ildg", "nersc" or "npy"."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{_label(option, path)}: no such file")
    with open(p, "rb") as f:
        head = f.read(16)
    if len(head) >= 4 and struct.unpack(">I", head[:4])[0] == LIME_MAGIC:
        return "ildg"
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if head.lstrip().startswith(b"BEGIN_HEADER"):
        return "nersc"
    if p.suffix == ".npy":
        return "npy"  # the .npy reader names what is wrong with it
    raise ConfigError(f"{_label(option, path)}: not a gauge file this reader knows (no ILDG/SciDAC LIME magic "
                      f"0x456789ab, no NERSC BEGIN_HEADER, no .npy header; first bytes {head[:8]!r})")


def peek(path: str, option: str = "--load-gauge") -> tuple[int, int, int, int]:
    """The lattice (X, Y, Z, T) of a gauge file, from its header and structure alone (sizes checked, data not
    read): what the command checks before any rank starts."""
    kind = detect(path, option)
    if kind == "ildg":
        return _ildg_layout(path, option)[0]
    if kind == "nersc":
        return _nersc_layout(path, option)[0]
    from ._io import peek as peek_npy

    return peek_npy(path, option, "gauge")


def read(path: str, option: str = "--load-gauge") -> GaugeFile:
    """Read and check a gauge file of any known format (detected from its bytes)."""
    kind = detect(path, option)
    if kind == "ildg":
        return _read_ildg(path, option)
    if kind == "nersc":
        return _read_nersc(path, option)
    from ._io import peek as peek_npy

    dims = peek_npy(path, option, "gauge")
    U = np.load(path, allow_pickle=False)
    bits = 32 if U.dtype == np.complex64 else 64
    U = U.astype(np.complex128)
    return GaugeFile(U, path, "npy", bits, dims, plaquette(U), link_trace(U))


def _lime_records(path: str, option: str) -> list[_Record]:
    size = Path(path).stat().st_size
    records: list[_Record] = []
    pos = 0
    in_message = False
    with open(path, "rb") as f:
        while pos < size:
            index = len(records) + 1
            f.seek(pos)
            raw = f.read(_LIME_HEADER.size)
            if len(raw) < _LIME_HEADER.size:
                raise ConfigError(f"{_label(option, path)}: record {index} at byte {pos}: header truncated "
                                  f"({len(raw)} of {_LIME_HEADER.size} bytes)")
            magic, version, flags, length, rtype = _LIME_HEADER.unpack(raw)
            if magic != LIME_MAGIC:
                raise ConfigError(f"{_label(option, path)}: record {index} at byte {pos}: bad LIME magic 0x{magic:08x} "
                                  f"(expected 0x{LIME_MAGIC:08x})")
            name = rtype.split(b"\0", 1)[0].decode("ascii", "replace")
            rec = _Record(index, name, bool(flags & _MB), bool(flags & _ME), pos + _LIME_HEADER.size, length)
            if version != LIME_VERSION:
                raise ConfigError(f"{_label(option, path)}: {rec.name()}: LIME version {version} (this reader knows "
                                  f"version {LIME_VERSION})")
            if rec.offset + length > size:
                raise ConfigError(f"{_label(option, path)}: {rec.name()}: announces {length} data bytes, the file has "
                                  f"{size - rec.offset} after its header (truncated)")
            if rec.begin == in_message:
                what = ("message-begin bit set inside a message (the previous record has no message-end bit)"
                        if rec.begin else "no message-begin bit after a message ended")
                raise ConfigError(f"{_label(option, path)}: {rec.name()}: {what}")
            in_message = not rec.end
            records.append(rec)
            pos = rec.offset + length + (-length % 8)
    if not records:
        raise ConfigError(f"{_label(option, path)}: an empty file")
    if in_message:
        raise ConfigError(f"{_label(option, path)}: {records[-1].name()}: the last record has no message-end bit "
                          "(the file is truncated after it)")
    return records


def _xml(path: str, option: str, rec: _Record) -> str:
    with open(path, "rb") as f:
        f.seek(rec.offset)
        return f.read(rec.length).split(b"\0", 1)[0].decode("utf-8", "replace")


def _tag(text: str, tag: str) -> str | None:
    m = re.search(rf"<(?:\w+:)?{tag}\b[^>]*>(.*?)</(?:\w+:)?{tag}\s*>", text, re.S)
    return m.group(1).strip() if m else None


def _ildg_layout(path: str, option: str) -> tuple[tuple[int, int, int, int], int, _Record, _Record | None]:
    """(dims, bytes per real, binary record, checksum record or None), every size checked."""
    records = _lime_records(path, option)
    by_type: dict[str, list[_Record]] = {}
    for r in records:
        by_type.setdefault(r.type, []).append(r)
    binary = (by_type.get("ildg-binary-data") or by_type.get("scidac-binary-data") or [None])[0]
    if binary is None:
        found = ", ".join(dict.fromkeys(r.type for r in records))
        raise ConfigError(f"{_label(option, path)}: no ildg-binary-data record (records: {found})")
    fmt = (by_type.get("ildg-format") or [None])[0]
    if fmt is not None:
        text = _xml(path, option, fmt)
        where = f"{_label(option, path)}: {fmt.name()}"
        field_name = _tag(text, "field")
        if field_name is not None and field_name.lower() != "su3gauge":
            raise ConfigError(f"{where}: field {field_name!r} (this reader knows su3gauge)")
        dims = tuple(_int_tag(text, tag, where) for tag in ("lx", "ly", "lz", "lt"))
        precision = _int_tag(text, "precision", where)
        if precision not in (32, 64):
            raise ConfigError(f"{where}: precision {precision} (expected 32 or 64)")
    else:
        file_rec = (by_type.get("scidac-private-file-xml") or [None])[0]
        record_rec = (by_type.get("scidac-private-record-xml") or [None])[0]
        if file_rec is None or record_rec is None:
            raise ConfigError(f"{_label(option, path)}: no ildg-format record (nor the scidac-private-file-xml and "
                              "scidac-private-record-xml records that could stand in for it)")
        text = _xml(path, option, file_rec)
        where = f"{_label(option, path)}: {file_rec.name()}"
        raw_dims = (_tag(text, "dims") or "").split()
        if len(raw_dims) != 4 or not all(d.isdigit() and int(d) > 0 for d in raw_dims):
            raise ConfigError(f"{where}: dims {' '.join(raw_dims)!r} (expected 4 positive integers)")
        dims = tuple(int(d) for d in raw_dims)
        text = _xml(path, option, record_rec)
        where = f"{_label(option, path)}: {record_rec.name()}"
        letter = (_tag(text, "precision") or "").upper()
        if letter not in ("F", "D"):
            raise ConfigError(f"{where}: precision {letter!r} (expected F or D)")
        precision = 32 if letter == "F" else 64
        datatype = _tag(text, "datatype") or ""
        if "ColorMatrix" not in datatype and "ColourMatrix" not in datatype:
            raise ConfigError(f"{where}: datatype {datatype!r} is not a colour matrix field")
    real = precision // 8
    want = int(np.prod(dims)) * 4 * 18 * real
    if binary.length != want:
        raise ConfigError(f"{_label(option, path)}: {binary.name()}: {binary.length} bytes, expected {want} for "
                          f"{'x'.join(map(str, dims))} sites x 4 links x 18 reals x {real} bytes")
    # The checksum record follows its binary record (QIO, Grid); one written before it is taken if none follows.
    checksums = by_type.get("scidac-checksum", [])
    later = [r for r in checksums if r.index > binary.index] or checksums
    return dims, real, binary, (later[0] if later else None)  # type: ignore[return-value]


def _int_tag(text: str, tag: str, where: str) -> int:
    value = _tag(text, tag)
    if value is None or not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{where}: {tag} {value!r} (expected a positive integer)" if value is not None
                          else f"{where}: no <{tag}> element")
    return int(value)


def _read_ildg(path: str, option: str) -> GaugeFile:
    dims, real, binary, checksum = _ildg_layout(path, option)
    with open(path, "rb") as f:
        f.seek(binary.offset)
        raw = f.read(binary.length)
    checked = []
    if checksum is not None:
        text = _xml(path, option, checksum)
        where = f"{_label(option, path)}: {checksum.name()}"
        stored = []
        for tag in ("suma", "sumb"):
            value = _tag(text, tag)
            try:
                stored.append(int(value, 16))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: {tag} {value!r} is not a hexadecimal number") from None
        got = scidac_checksum(raw, 4 * 18 * real)
        if tuple(stored) != got:
            raise ConfigError(f"{where}: SciDAC checksum mismatch: the file says suma {stored[0]:x} sumb "
                              f"{stored[1]:x}, its data give suma {got[0]:x} sumb {got[1]:x}")
        checked.append("scidac-checksum")
    X, Y, Z, T = dims
    values = np.frombuffer(raw, dtype=">f4" if real == 4 else ">f8").astype(np.float64)
    links = values.reshape(T, Z, Y, X, 4, 3, 3, 2)
    U = np.ascontiguousarray(np.moveaxis(links[..., 0] + 1j * links[..., 1], 4, 0))
    return GaugeFile(U, path, "ildg", 8 * real, dims, plaquette(U), link_trace(U), checked)


def _nersc_header(path: str, option: str) -> tuple[dict[str, str], int]:
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    end = head.find(b"END_HEADER")
    if end < 0:
        raise ConfigError(f"{_label(option, path)}: NERSC header has no END_HEADER line in its first {len(head)} bytes")
    newline = head.find(b"\n", end)
    start = len(head) if newline < 0 else newline + 1
    lines = head[:end].decode("ascii", "replace").splitlines()
    if not lines or lines[0].strip() != "BEGIN_HEADER":
        raise ConfigError(f"{_label(option, path)}: NERSC header does not start with BEGIN_HEADER")
    header = {}
    for line in lines[1:]:
        if "=" in line:
            key, value = line.split("=", 1)
            header[key.strip()] = value.strip()
    return header, start


def _nersc_layout(path: str, option: str) -> tuple[tuple[int, int, int, int], dict[str, str], int, int, int]:
    """(dims, header, data offset, rows stored, bytes per real), sizes checked."""
    header, start = _nersc_header(path, option)
    where = f"{_label(option, path)}: NERSC header"

    def need(key: str) -> str:
        if key not in header:
            raise ConfigError(f"{where}: no {key}")
        return header[key]

    dims = []
    for i in range(1, 5):
        value = need(f"DIMENSION_{i}")
        if not value.isdigit() or int(value) <= 0:
            raise ConfigError(f"{where}: DIMENSION_{i} = {value!r} (expected a positive integer)")
        dims.append(int(value))
    datatype = need("DATATYPE")
    if datatype not in _NERSC_DATATYPES:
        raise ConfigError(f"{where}: DATATYPE = {datatype!r} (this reader knows {', '.join(_NERSC_DATATYPES)})")
    floating = need("FLOATING_POINT").upper()
    if floating not in _NERSC_FLOATS:
        raise ConfigError(f"{where}: FLOATING_POINT = {header['FLOATING_POINT']!r} (expected one of "
                          f"{', '.join(_NERSC_FLOATS)})")
    rows = _NERSC_DATATYPES[datatype]
    real = _NERSC_FLOATS[floating][0]
    want = int(np.prod(dims)) * 4 * rows * 6 * real
    have = Path(path).stat().st_size - start
    if have != want:
        why = "truncated" if have < want else "bytes after the data"
        raise ConfigError(f"{_label(option, path)}: NERSC data: {have} bytes after the header, expected {want} for "
                          f"{'x'.join(map(str, dims))} sites x 4 links x {rows} rows x 6 reals x {real} bytes "
                          f"({why})")
    return tuple(dims), header, start, rows, real  # type: ignore[return-value]


def _read_nersc(path: str, option: str) -> GaugeFile:
    dims, header, start, rows, real = _nersc_layout(path, option)
    where = f"{_label(option, path)}: NERSC header"
    floating = header["FLOATING_POINT"].upper()
    values = {key: header.get(key) for key in ("CHECKSUM", "LINK_TRACE", "PLAQUETTE")}
    for key, value in values.items():
        if value is None:
            raise ConfigError(f"{where}: no {key}")
    try:
        stored_sum = int(values["CHECKSUM"], 16)  # type: ignore[arg-type]
    except ValueError:
        raise ConfigError(f"{where}: CHECKSUM = {values['CHECKSUM']!r} is not a hexadecimal number") from None
    stated = {}
    for key in ("LINK_TRACE", "PLAQUETTE"):
        try:
            stated[key] = float(values[key])  # type: ignore[arg-type]
        except ValueError:
            raise ConfigError(f"{where}: {key} = {values[key]!r} is not a number") from None
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read()
    sums = {}
    for order in _NERSC_FLOATS[floating][1]:
        stored = np.frombuffer(raw, dtype=f"{order}f{real}")
        sums[order] = nersc_checksum(stored)
        if sums[order] == stored_sum:
            break
    else:
        got = " or ".join(f"{s:x}" for s in sums.values())
        raise ConfigError(f"{_label(option, path)}: NERSC CHECKSUM mismatch: the header says {stored_sum:x}, the data "
                          f"give {got}")
    X, Y, Z, T = dims
    reals = stored.astype(np.float64).reshape(T, Z, Y, X, 4, rows, 3, 2)
    stored_rows = reals[..., 0] + 1j * reals[..., 1]
    if rows == 2:
        links = np.concatenate([stored_rows, third_row(stored_rows)[..., None, :]], axis=-2)
    else:
        links = stored_rows
    U = np.ascontiguousarray(np.moveaxis(links, 4, 0))
    result = GaugeFile(U, path, "nersc", 8 * real, dims, plaquette(U), link_trace(U), ["CHECKSUM"])
    tolerance = _NERSC_TOLERANCE[real]
    for key, got in (("LINK_TRACE", result.link_trace), ("PLAQUETTE", result.plaquette)):
        if abs(got - stated[key]) > tolerance:
            raise ConfigError(f"{where}: {key} = {stated[key]!r}, the data give {got:.10f} (tolerance "
                              f"{tolerance:g} for {8 * real}-bit data)")
        result.checked.append(key)
    return result


# -- writing ------------------------------------------------------------------------------------------------
def _lime_record(rtype: str, data: bytes, begin: bool, end: bool) -> bytes:
    flags = (_MB if begin else 0) | (_ME if end else 0)
    head = _LIME_HEADER.pack(LIME_MAGIC, LIME_VERSION, flags, len(data), rtype.encode("ascii"))
    return head + data + b"\0" * (-len(data) % 8)


def ildg_bytes(U: np.ndarray, precision: int = 64) -> bytes:
    """The ``ildg-binary-data`` payload of ``U[mu, t, z, y, x, a, b]``: big-endian, x fastest, mu = x, y, z, t,
    row-major complex 3x3."""
    if precision not in (32, 64):
        raise ConfigError(f"ILDG precision {precision}: choose 32 or 64")
    links = np.moveaxis(np.asarray(U), 0, 4)  # (T, Z, Y, X, mu, a, b)
    pairs = np.stack([links.real, links.imag], axis=-1)
    return np.ascontiguousarray(pairs, dtype=">f4" if precision == 32 else ">f8").tobytes()


def write_ildg(path: str, U: np.ndarray, precision: int = 64, option: str = "--save-gauge") -> None:
    """Write ``U[mu, t, z, y, x, a, b]`` as an ILDG file that QIO (Chroma, QUDA's tests), Grid and this reader
    accept: a SciDAC file message (scidac-private-file-xml, scidac-file-xml), then a record message
    (scidac-private-record-xml, scidac-record-xml, ildg-format, ildg-binary-data, scidac-checksum)."""
    U = np.asarray(U)
    if U.ndim != 7 or U.shape[0] != 4 or U.shape[5:] != (3, 3):
        raise ConfigError(f"{_label(option, path)}: U must have shape (4, T, Z, Y, X, 3, 3), got {U.shape}")
    T, Z, Y, X = U.shape[1:5]
    data = ildg_bytes(U, precision)
    suma, sumb = scidac_checksum(data, 4 * 18 * precision // 8)
    letter = "F" if precision == 32 else "D"
    xml = '<?xml version="1.0" encoding="UTF-8"?>'
    private_file = (f"{xml}<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                    f"<dims>{X} {Y} {Z} {T} </dims><volfmt>0</volfmt></scidacFile>")
    user_file = f"{xml}<info><creator>circuslink</creator><plaq>{plaquette(U):.15g}</plaq></info>"
    private_record = (f"{xml}<scidacRecord><version>1.1</version><date>unknown</date><recordtype>0</recordtype>"
                      f"<datatype>QDP_{letter}3_ColorMatrix</datatype><precision>{letter}</precision>"
                      f"<colors>3</colors><spins>4</spins><typesize>{18 * precision // 8}</typesize>"
                      f"<datacount>4</datacount></scidacRecord>")
    ildg_format = (f'{xml}<ildgFormat xmlns="http://www.lqcd.org/ildg" '
                   'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
                   'xsi:schemaLocation="http://www.lqcd.org/ildg http://www.lqcd.org/ildg/filefmt.xsd">'
                   f"<version>1.0</version><field>su3gauge</field><precision>{precision}</precision>"
                   f"<lx>{X}</lx><ly>{Y}</ly><lz>{Z}</lz><lt>{T}</lt></ildgFormat>")
    checksum = (f"{xml}<scidacChecksum><version>1.0</version><suma>{suma:x}</suma><sumb>{sumb:x}</sumb>"
                "</scidacChecksum>")
    records = [
        ("scidac-private-file-xml", private_file.encode(), True, False),
        ("scidac-file-xml", user_file.encode(), False, True),
        ("scidac-private-record-xml", private_record.encode(), True, False),
        ("scidac-record-xml", user_file.encode(), False, False),
        ("ildg-format", ildg_format.encode(), False, False),
        ("ildg-binary-data", data, False, False),
        ("scidac-checksum", checksum.encode(), False, True),
    ]
    try:
        with open(path, "wb") as f:
            for rtype, payload, begin, end in records:
                f.write(_lime_record(rtype, payload, begin, end))
    except OSError as exc:
        raise ConfigError(f"{_label(option, path)}: cannot write ({exc.strerror or exc})") from None
