"""The GPU dslash's per-site code (apps/qcd/dslash.cu) run on the host against the numpy back-end module.

The kernels' site functions are ``__host__ __device__``: ``qcd_dslash_host.cu`` (built here with nvcc) runs
them over a whole local lattice with the exact argument block the cuda back-end module packs (its ABI table; the
size is checked against ``sizeof(DslashArgs)``) and the kernels' field layouts. Interior and exterior hops,
the faces emitted for the next hop, the resident CG's one-pass hop (ghost terms inline, then the faces), the CG's
fused ``p = r + beta p`` + faces, and the plain pack are
compared with ``_cpu.Dslash`` on random fields, single and double, with and without dagger, for a rank whose
t faces cross the antiperiodic boundary and for a rank that wraps t locally.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import NVCC_TIMEOUT_S

from circuslink.apps import qcd
from circuslink.apps.qcd._cpu import Dslash as CpuDslash
from circuslink.apps.qcd._cuda import CG_RESIDENT_ARGS, DSLASH_ARGS

REPO = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qcd-host") / "qcd_dslash_host"
    # (no kernels: the harness runs the site functions on the host; tests/test_device_headers.py builds them)
    cmd = [NVCC, "-std=c++17", "-arch=sm_90a", "-O1", "-DCIRCUSLINK_QCD_KERNELS=-1",
           f"-I{REPO / 'src/circuslink/include'}", f"-I{REPO / 'src/circuslink/apps/qcd'}",
           str(REPO / "tests/qcd_dslash_host.cu"), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return out


def to_kernel(half: np.ndarray, width: int) -> np.ndarray:
    vh = half.shape[0]
    return np.ascontiguousarray(half.reshape(vh, 12 // width, width).transpose(1, 0, 2))


def from_kernel(field: np.ndarray) -> np.ndarray:
    return field.transpose(1, 0, 2).reshape(-1, 4, 3)


def gauge_layout(lat, U: np.ndarray, dtype) -> np.ndarray:
    halves = lat.split(np.ascontiguousarray(np.moveaxis(U, 0, 4)))
    return np.ascontiguousarray(np.stack([h.reshape(lat.half, 4, 9).transpose(1, 2, 0) for h in halves]), dtype=dtype)


def random_half(rng, lat, dtype) -> np.ndarray:
    return (rng.standard_normal((lat.half, 4, 3)) + 1j * rng.standard_normal((lat.half, 4, 3))).astype(dtype)


def run_harness(harness: Path, work: Path, mode: str, dtype, args, beta: float, arrays: dict) -> tuple:
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.txt").write_text(f"{mode} {'f' if dtype == np.complex64 else 'd'} {beta!r}\n")
    (work / "args.bin").write_bytes(args.tobytes())
    for name in ("in", "x", "out", "gauge", "ghost", "send", "sites"):
        (work / f"{name}.bin").write_bytes(np.ascontiguousarray(arrays[name]).tobytes())
    proc = subprocess.run([str(harness), str(work)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = np.frombuffer((work / "out.bin").read_bytes(), dtype=arrays["out"].dtype).reshape(arrays["out"].shape)
    send = np.frombuffer((work / "send.bin").read_bytes(), dtype=arrays["send"].dtype).reshape(arrays["send"].shape)
    return out, send


# (local lattice, grid, rank): rank 7 of 2x1x2x2 sits at the top of t (its forward t hop crosses the
# antiperiodic boundary through the ghosts); 2x2x1x1 wraps t locally (sign in the interior kernel).
GEOMETRIES = [((4, 2, 2, 4), (2, 1, 2, 2), 7), ((2, 4, 2, 4), (2, 2, 1, 1), 1)]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["t-split", "t-local"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["single", "double"])
@pytest.mark.parametrize("dagger", [False, True])
def test_kernel_site_code_matches_numpy(harness, tmp_path, seed, geometry, dtype, dagger):
    local, grid, rank = geometry
    lat = qcd.Lattice(local, grid, rank)
    rng = np.random.default_rng(seed)
    U = qcd.random_gauge(local, seed)
    width = 2 if dtype == np.complex64 else 1
    halo = SimpleNamespace(send=np.zeros((6, lat.face_total), dtype=dtype))
    cpu = CpuDslash(None, lat, U, dtype, halo)
    gauge = gauge_layout(lat, U, dtype)
    tol = 2e-5 if dtype == np.complex64 else 1e-12
    offsets = [0] * 8
    for (mu, d), off in lat.slot_offset.items():
        offsets[2 * mu + d] = off
    base = dict(fwd_sign=lat.forward_sign, bwd_sign=lat.backward_sign, dims=lat.local, face_offset=offsets,
                vh=lat.half, faces=lat.face_total,
                partitioned=sum(1 << mu for mu in range(4) if lat.partitioned[mu]))
    for parity in (0, 1):
        sites = lat.on_boundary(parity)
        inp, x, out0 = (random_half(rng, lat, dtype) for _ in range(3))
        ghost = (rng.standard_normal((6, lat.face_total)) + 1j * rng.standard_normal((6, lat.face_total))).astype(dtype)
        arrays = dict(**{"in": to_kernel(inp, width)}, x=to_kernel(x, width), out=to_kernel(out0, width),
                      gauge=gauge, ghost=ghost, send=np.zeros((6, lat.face_total), dtype=dtype), sites=sites)
        a, b = 0.7, -0.115
        common = dict(base, n_sites=int(sites.size), parity=parity, dagger=int(dagger), a=a, b=b)

        # interior, with and without x, per site; and split over 2, 4 and 8 lanes (the resident CG's hops on
        # small lattices: each lane's directions and share of the stores), with x on one parity, without on
        # the other
        for has_x in (0, 1):
            args = DSLASH_ARGS.pack(**common, has_x=has_x, emit=-1)
            want = np.zeros_like(out0)
            cpu._interior(want, inp, parity, dagger, a, x if has_x else None, b)
            modes = ("interior", "interior2", "interior4", "interior8") if has_x == parity else ("interior",)
            for mode in modes:
                got, _ = run_harness(harness, tmp_path / f"{mode}{parity}{has_x}", mode, dtype, args, 0.0, arrays)
                np.testing.assert_allclose(from_kernel(got), want, atol=tol,
                                           err_msg=f"{mode} parity {parity} has_x {has_x}")

        # exterior: ghost terms added to out, then the faces of the result for a next hop (dagger flipped)
        emit = not dagger
        args = DSLASH_ARGS.pack(**common, has_x=0, emit=int(emit))
        got, send = run_harness(harness, tmp_path / f"e{parity}", "exterior", dtype, args, 0.0, arrays)
        want = out0.copy()
        cpu._exterior(want, ghost, parity, dagger, b)
        np.testing.assert_allclose(from_kernel(got), want, atol=tol, err_msg=f"exterior parity {parity}")
        halo.send[...] = 0
        cpu.pack(want, parity, emit)
        np.testing.assert_allclose(send, halo.send, atol=tol, err_msg=f"emitted faces parity {parity}")

        # the resident CG's one-pass hop (direct faces): interior and ghost terms in one pass, then the faces of
        # the result, one lane a site and split over 2, 4 and 8 (x on one parity, none on the other)
        has_x = parity
        args = DSLASH_ARGS.pack(**common, has_x=has_x, emit=int(emit))
        want = np.zeros_like(out0)
        cpu._interior(want, inp, parity, dagger, a, x if has_x else None, b)
        cpu._exterior(want, ghost, parity, dagger, b)
        halo.send[...] = 0
        cpu.pack(want, parity, emit)
        for mode in ("whole", "whole2", "whole4", "whole8"):
            got, send = run_harness(harness, tmp_path / f"{mode}{parity}", mode, dtype, args, 0.0, arrays)
            np.testing.assert_allclose(from_kernel(got), want, atol=tol, err_msg=f"{mode} parity {parity}")
            np.testing.assert_allclose(send, halo.send, atol=tol, err_msg=f"{mode} faces parity {parity}")

        # the CG's p = r + beta p with the faces of p
        beta = 0.37
        args = DSLASH_ARGS.pack(**dict(common, n_sites=0), has_x=1, emit=-1)
        got, send = run_harness(harness, tmp_path / f"x{parity}", "xpay", dtype, args, beta, arrays)
        p = x + beta * out0
        np.testing.assert_allclose(from_kernel(got), p, atol=tol)
        halo.send[...] = 0
        cpu.pack(p, parity, dagger)
        np.testing.assert_allclose(send, halo.send, atol=tol, err_msg=f"xpay faces parity {parity}")

        # a plain pack of a field's faces
        args = DSLASH_ARGS.pack(**common, has_x=0, emit=-1)
        got, send = run_harness(harness, tmp_path / f"p{parity}", "pack", dtype, args, 0.0, arrays)
        np.testing.assert_array_equal(got, arrays["out"])  # untouched
        halo.send[...] = 0
        cpu.pack(out0, parity, dagger)
        np.testing.assert_allclose(send, halo.send, atol=tol, err_msg=f"pack parity {parity}")


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["t-split", "t-local"])
def test_reliable_update_site_code_matches_numpy(harness, tmp_path, seed, geometry):
    """The resident CG's own reliable update, per site (single iterations, double solution): y += x, x = 0 with
    y's faces for the double operator; p += r_new - r_s, r_s = r_new (r rounded to single) with p's faces. The
    same numbers as the solver's array operations on the host, bit for bit."""
    local, grid, rank = geometry
    lat = qcd.Lattice(local, grid, rank)
    rng = np.random.default_rng(seed)
    U = qcd.random_gauge(local, seed)
    offsets = [0] * 8
    for (mu, d), off in lat.slot_offset.items():
        offsets[2 * mu + d] = off
    base = dict(fwd_sign=lat.forward_sign, bwd_sign=lat.backward_sign, dims=lat.local, face_offset=offsets,
                vh=lat.half, faces=lat.face_total, n_sites=0, dagger=0, emit=-1,
                partitioned=sum(1 << mu for mu in range(4) if lat.partitioned[mu]))
    halos = {dt: SimpleNamespace(send=np.zeros((6, lat.face_total), dtype=dt)) for dt in (np.complex64, np.complex128)}
    cpus = {dt: CpuDslash(None, lat, U, dt, halos[dt]) for dt in halos}
    for parity in (0, 1):
        y0, r = random_half(rng, lat, np.complex128), random_half(rng, lat, np.complex128)
        x0, rs0, p0 = (random_half(rng, lat, np.complex64) for _ in range(3))
        common = dict(ghost=np.zeros(1, complex), sites=np.zeros(1, np.int32))

        args = DSLASH_ARGS.pack(**base, parity=parity, has_x=0)
        arrays = dict(common, gauge=gauge_layout(lat, U, np.complex128), **{"in": np.zeros(1, complex)},
                      x=to_kernel(x0, 2), out=to_kernel(y0, 1),
                      send=np.zeros((6, lat.face_total), np.complex128))
        got, send = run_harness(harness, tmp_path / f"f{parity}", "fold", np.complex128, args, 0.0, arrays)
        y = y0 + x0.astype(np.complex128)
        np.testing.assert_array_equal(from_kernel(got), y)
        np.testing.assert_array_equal(np.fromfile(tmp_path / f"f{parity}" / "x.bin", np.complex64), 0)
        halos[np.complex128].send[...] = 0
        cpus[np.complex128].pack(y, parity, False)
        np.testing.assert_allclose(send, halos[np.complex128].send, atol=1e-12, err_msg=f"y's faces parity {parity}")

        args = DSLASH_ARGS.pack(**base, parity=parity, has_x=1)
        arrays = dict(common, gauge=gauge_layout(lat, U, np.complex64), **{"in": to_kernel(r, 1)},
                      x=to_kernel(rs0, 2), out=to_kernel(p0, 2),
                      send=np.zeros((6, lat.face_total), np.complex64))
        got, send = run_harness(harness, tmp_path / f"n{parity}", "newres", np.complex64, args, 0.0, arrays)
        fresh = r.astype(np.complex64)
        p = p0 + (fresh - rs0)
        np.testing.assert_array_equal(from_kernel(got), p)
        rs = np.fromfile(tmp_path / f"n{parity}" / "x.bin", np.complex64).reshape(6, lat.half, 2)
        np.testing.assert_array_equal(from_kernel(rs), fresh)
        halos[np.complex64].send[...] = 0
        cpus[np.complex64].pack(p, parity, False)
        np.testing.assert_allclose(send, halos[np.complex64].send, atol=2e-5, err_msg=f"p's faces parity {parity}")


def test_single_rank_interior_is_the_whole_operator(harness, tmp_path, seed):
    """Nothing partitioned: the interior kernel alone is M on each parity (antiperiodic t wrapped locally)."""
    dims = (4, 2, 2, 4)
    lat = qcd.Lattice(dims, (1, 1, 1, 1), 0)
    U = qcd.random_gauge(dims, seed)
    psi = qcd.random_spinor(dims, seed + 1)
    kappa = 0.13
    even, odd = lat.split(psi)
    want_e, want_o = lat.split(qcd.wilson(U, psi, kappa))
    gauge = gauge_layout(lat, U, np.complex128)
    for parity, (x, inp, want) in enumerate(((even, odd, want_e), (odd, even, want_o))):
        args = DSLASH_ARGS.pack(fwd_sign=lat.forward_sign, bwd_sign=lat.backward_sign, dims=lat.local, vh=lat.half,
                                parity=parity, a=1.0, b=-kappa, has_x=1, emit=-1)
        arrays = dict(**{"in": to_kernel(inp, 1)}, x=to_kernel(x, 1), out=np.zeros((12, lat.half, 1), complex),
                      gauge=gauge, ghost=np.zeros(1, complex), send=np.zeros(1, complex), sites=np.zeros(1, np.int32))
        got, _ = run_harness(harness, tmp_path / f"m{parity}", "interior", np.complex128, args, 0.0, arrays)
        np.testing.assert_allclose(from_kernel(got), want, atol=1e-13)


def test_abi_table_matches_the_header(tmp_path):
    from circuslink._abi import static_asserts

    src = tmp_path / "abi.cu"
    src.write_text(static_asserts([DSLASH_ARGS, CG_RESIDENT_ARGS]))
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", f"-I{REPO / 'src/circuslink/include'}", "-c",
                           str(src), "-o", str(tmp_path / "abi.o")], capture_output=True, text=True,
                          timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


# -- the device-resident CG's scalar step ------------------------------------------------------------------------
SCALAR_HOST = r"""
#include <cstdio>
#include "dslash.cu"
// Reads lines "STEP DELTA2 s0 .. s15", applies circuslink::qcd::cg_scalar_step (step 2: cg_update_step, the
// resident kernel's step after its own reliable update), prints the 16 scalars.
int main() {
  int step;
  double delta2, s[circuslink::qcd::kCgSlots];
  while (std::scanf("%d %lf", &step, &delta2) == 2) {
    for (int i = 0; i < circuslink::qcd::kCgSlots; ++i) std::scanf("%lf", &s[i]);
    if (step == 2) {
      circuslink::qcd::cg_update_step(s);
    } else {
      circuslink::qcd::cg_scalar_step(s, step, delta2);
    }
    for (int i = 0; i < circuslink::qcd::kCgSlots; ++i) std::printf("%.17g ", s[i]);
    std::printf("\n");
  }
  return 0;
}
"""


def test_device_cg_scalar_step_matches_the_python_reference(tmp_path, rng):
    """The kernel's scalar step (qcd_cg_scalars runs it on thread 0 after the global sum) and its step after its
    own reliable update against _cgstate's, slot for slot: fresh, frozen, stalled, converging and due cases,
    true residuals that grow, fall, meet the target or grow too often; and the slot and flag numbers agree."""
    from circuslink.apps.qcd import _cgstate as cg

    header = (REPO / "src/circuslink/include/circuslink/qcd/dslash_types.cuh").read_text()
    for name, value in (("kCgLocal", cg.LOCAL), ("kCgRr", cg.RR), ("kCgAlpha", cg.ALPHA), ("kCgBeta", cg.BETA),
                        ("kCgStop", cg.STOP), ("kCgMaxRr", cg.MAX_RR), ("kCgIterations", cg.ITERATIONS),
                        ("kCgFlags", cg.FLAGS), ("kCgSlots", cg.SLOTS), ("kCgConverged", cg.CONVERGED),
                        ("kCgDue", cg.DUE), ("kCgStalled", cg.STALLED), ("kCgSkip", cg.SKIP),
                        ("kCgUpdated", cg.UPDATED), ("kCgUpdates", cg.UPDATES), ("kCgTrueRr", cg.TRUE_RR),
                        ("kCgIncreases", cg.INCREASES), ("kCgIncreasesTotal", cg.INCREASES_TOTAL)):
        assert f"{name} = {value}," in header, name
    assert f"kCgMaxIncreases = {cg.MAX_INCREASES}, kCgMaxIncreasesTotal = {cg.MAX_INCREASES_TOTAL} " in header
    src = tmp_path / "scalars.cu"
    src.write_text(SCALAR_HOST)
    exe = tmp_path / "scalars"
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90a", "-DCIRCUSLINK_QCD_KERNELS=-1",
                           f"-I{REPO / 'src/circuslink/include'}", f"-I{REPO / 'src/circuslink/apps/qcd'}", str(src),
                           "-o", str(exe)],
                          capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    cases = []
    for _ in range(200):
        s = np.zeros(cg.SLOTS)
        s[cg.LOCAL] = rng.choice([rng.uniform(1e-12, 10), 0.0, -rng.uniform(0, 1)])
        s[cg.RR] = rng.uniform(1e-10, 10)
        s[cg.STOP] = s[cg.RR] * rng.choice([1e-3, 0.5, 2.0])
        s[cg.MAX_RR] = s[cg.RR] * rng.uniform(1, 1e3)
        s[cg.ITERATIONS] = rng.integers(0, 100)
        s[cg.FLAGS] = rng.choice([0, cg.CONVERGED, cg.STALLED, cg.DUE, cg.CONVERGED | cg.SKIP])
        s[cg.UPDATES] = rng.integers(0, 20)
        s[cg.TRUE_RR] = s[cg.RR] * rng.choice([0.5, 1.0, 2.0])
        s[cg.INCREASES] = rng.integers(0, 3)
        s[cg.INCREASES_TOTAL] = rng.integers(0, 12)
        cases.append((int(rng.integers(0, 3)), float(rng.choice([0.0, 0.01])), s))
    text = "".join(f"{step} {delta2!r} " + " ".join(repr(float(v)) for v in s) + "\n" for step, delta2, s in cases)
    proc = subprocess.run([str(exe)], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = np.array([[float(v) for v in line.split()] for line in proc.stdout.splitlines()])
    for (step, delta2, s), row in zip(cases, got, strict=True):
        want = s.copy()
        if step == 2:
            cg.update_step(want)
        else:
            cg.scalar_step(want, step, delta2)
        np.testing.assert_array_equal(row, want, err_msg=f"step {step}, delta2 {delta2}, in {s}")
