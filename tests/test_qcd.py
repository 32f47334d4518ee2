"""The Wilson-Dirac operator on one rank (numpy): algebra, invariants and an independent site-by-site loop.

Every test draws a fresh gauge field and sources from the test's seed (reported on failure).
Lattices are 4^4 (4x4x4x8 where antiperiodic t momenta need a longer t), the slow loop 2x2x2x4.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from circuslink.apps import qcd

DIMS = (4, 4, 4, 4)  # X, Y, Z, T
KAPPA = 0.12


def inner(a: np.ndarray, b: np.ndarray) -> complex:
    return complex(np.vdot(a, b))


@pytest.fixture
def fields(seed):
    U = qcd.random_gauge(DIMS, seed)
    a = qcd.random_spinor(DIMS, seed + 1)
    b = qcd.random_spinor(DIMS, seed + 2)
    return U, a, b


def test_gammas_satisfy_the_clifford_algebra():
    g = qcd.GAMMA
    for mu, nu in itertools.product(range(4), repeat=2):
        anti = g[mu] @ g[nu] + g[nu] @ g[mu]
        np.testing.assert_allclose(anti, 2 * np.eye(4) * (mu == nu), atol=1e-15)
    for mu in range(4):
        np.testing.assert_allclose(g[mu], g[mu].conj().T, atol=1e-15)  # hermitian
        np.testing.assert_allclose(qcd.GAMMA5 @ g[mu], -g[mu] @ qcd.GAMMA5, atol=1e-15)
    np.testing.assert_allclose(qcd.GAMMA5, np.diag([-1, -1, 1, 1]), atol=1e-15)  # DeGrand-Rossi
    np.testing.assert_allclose(qcd.GAMMA[3], np.block([[np.zeros((2, 2)), np.eye(2)], [np.eye(2), np.zeros((2, 2))]]))


def test_random_gauge_is_special_unitary(seed):
    U = qcd.random_gauge(DIMS, seed).reshape(-1, 3, 3)
    np.testing.assert_allclose(U @ U.conj().transpose(0, 2, 1), np.broadcast_to(np.eye(3), U.shape), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(U), 1.0, atol=1e-12)
    # Haar: the trace averages to 0 with variance 1 (|tr U|^2 has mean 1 on SU(3)).
    tr = np.trace(U, axis1=1, axis2=2)
    assert abs(tr.mean()) < 0.15 and abs(np.mean(np.abs(tr) ** 2) - 1) < 0.25


def test_same_seed_same_fields_other_seed_other_fields(seed):
    np.testing.assert_array_equal(qcd.random_gauge(DIMS, seed), qcd.random_gauge(DIMS, seed))
    assert not np.allclose(qcd.random_spinor(DIMS, seed), qcd.random_spinor(DIMS, seed + 1))


def test_kappa_zero_is_identity(fields):
    U, a, _ = fields
    np.testing.assert_array_equal(qcd.wilson(U, a, 0.0), a)


def test_gamma5_hermiticity(fields):
    U, a, _ = fields
    left = qcd.gamma5(qcd.wilson(U, qcd.gamma5(a), KAPPA))
    np.testing.assert_allclose(left, qcd.wilson(U, a, KAPPA, dagger=True), rtol=0, atol=1e-13)


def test_dagger_is_the_adjoint(fields):
    U, a, b = fields
    lhs = inner(a, qcd.wilson(U, b, KAPPA))
    rhs = inner(qcd.wilson(U, a, KAPPA, dagger=True), b)
    assert abs(lhs - rhs) < 1e-11 * abs(lhs)


def test_gauge_covariance(fields, seed):
    U, a, _ = fields
    rng = np.random.default_rng(seed + 3)
    G = qcd.random_su3(rng, int(np.prod(DIMS))).reshape(DIMS[::-1] + (3, 3))  # G[t, z, y, x, a, b]
    UG = np.empty_like(U)
    for mu in range(4):
        G_next = qcd.shift(G, mu, +1, antiperiodic_t=False)  # gauge transformations are periodic
        UG[mu] = G @ U[mu] @ G_next.conj().swapaxes(-1, -2)
    rotate = lambda psi: np.matmul(psi, G.swapaxes(-1, -2))  # noqa: E731 - (G psi)[s, a] = G[a, b] psi[s, b]
    np.testing.assert_allclose(qcd.wilson(UG, rotate(a), KAPPA), rotate(qcd.wilson(U, a, KAPPA)), atol=1e-13)


@pytest.mark.parametrize("dagger", [False, True])
def test_free_field_plane_wave(dagger, seed):
    dims = (4, 4, 4, 8)
    rng = np.random.default_rng(seed)
    n = rng.integers(0, 4, size=3)
    nt = rng.integers(0, 8)
    # Periodic in x, y, z: p = 2 pi n / L; antiperiodic in t: p = pi (2 n + 1) / T.
    p = np.array([2 * np.pi * n[0] / dims[0], 2 * np.pi * n[1] / dims[1], 2 * np.pi * n[2] / dims[2],
                  np.pi * (2 * nt + 1) / dims[3]])
    chi = rng.standard_normal((4, 3)) + 1j * rng.standard_normal((4, 3))
    t, z, y, x = np.meshgrid(*(np.arange(d) for d in dims[::-1]), indexing="ij")
    phase = np.exp(1j * (p[0] * x + p[1] * y + p[2] * z + p[3] * t))
    psi = phase[..., None, None] * chi
    # D e^{ipx} chi = sum_mu [(1 -+ g) e^{ip} + (1 +- g) e^{-ip}] chi = sum_mu (2 cos p_mu -+ 2i sin p_mu g_mu) chi
    sign = 1 if dagger else -1
    momentum = sum(2 * np.cos(p[mu]) * np.eye(4) + sign * 2j * np.sin(p[mu]) * qcd.GAMMA[mu] for mu in range(4))
    want = phase[..., None, None] * ((np.eye(4) - KAPPA * momentum) @ chi)
    got = qcd.wilson(qcd.unit_gauge(dims), psi, KAPPA, dagger=dagger)
    np.testing.assert_allclose(got, want, atol=1e-12)


def _wilson_site_by_site(U: np.ndarray, psi: np.ndarray, kappa: float) -> np.ndarray:
    """The operator as written in the issue, one site and one direction at a time."""
    T, Z, Y, X = psi.shape[:4]
    L = (X, Y, Z, T)
    out = np.empty_like(psi)
    one = np.eye(4)
    for t, z, y, x in itertools.product(range(T), range(Z), range(Y), range(X)):
        here = [x, y, z, t]
        acc = np.zeros((4, 3), dtype=complex)
        for mu in range(4):
            up, down = list(here), list(here)
            up[mu] = (here[mu] + 1) % L[mu]
            down[mu] = (here[mu] - 1) % L[mu]
            sign_up = -1.0 if (mu == 3 and here[mu] == T - 1) else 1.0
            sign_down = -1.0 if (mu == 3 and here[mu] == 0) else 1.0
            psi_up = sign_up * psi[up[3], up[2], up[1], up[0]]
            psi_down = sign_down * psi[down[3], down[2], down[1], down[0]]
            link = U[mu, t, z, y, x]
            link_down = U[mu, down[3], down[2], down[1], down[0]]
            for s in range(4):
                for a in range(3):
                    for s2 in range(4):
                        for b in range(3):
                            acc[s, a] += (one - qcd.GAMMA[mu])[s, s2] * link[a, b] * psi_up[s2, b]
                            acc[s, a] += (one + qcd.GAMMA[mu])[s, s2] * np.conj(link_down[b, a]) * psi_down[s2, b]
        out[t, z, y, x] = psi[t, z, y, x] - kappa * acc
    return out


def test_vectorized_operator_matches_site_by_site_loop(seed):
    dims = (2, 2, 2, 4)
    U = qcd.random_gauge(dims, seed)
    psi = qcd.random_spinor(dims, seed + 1)
    np.testing.assert_allclose(qcd.wilson(U, psi, KAPPA), _wilson_site_by_site(U, psi, KAPPA), atol=1e-13)


def test_single_precision_follows_double(fields):
    U, a, _ = fields
    single = qcd.wilson(U.astype(np.complex64), a.astype(np.complex64), KAPPA)
    assert single.dtype == np.complex64
    np.testing.assert_allclose(single, qcd.wilson(U, a, KAPPA), atol=2e-5)


def test_wrong_shapes_are_refused(fields):
    U, a, _ = fields
    with pytest.raises(qcd_errors(), match=r"psi must have shape \(T, Z, Y, X, 4, 3\)"):
        qcd.wilson(U, a[..., :2, :], KAPPA)
    with pytest.raises(qcd_errors(), match="U must have shape"):
        qcd.wilson(U[:, :2], a, KAPPA)


def qcd_errors():
    import circuslink

    return circuslink.ConfigError


def test_resident_hop_split_follows_the_lattice(monkeypatch):
    """The resident CG's lanes a site: 8 where a small lattice leaves most lanes of one block an SM idle, 1 where
    the sites fill them; the environment variable fixes it and a bad value is refused naming it."""
    from circuslink.apps.qcd._cuda import hop_split
    from circuslink.errors import ConfigError

    monkeypatch.delenv("CIRCUSLINK_QCD_HOP_SPLIT", raising=False)
    assert hop_split(2048, 132) == 8  # 8^4 on one H200: 64 blocks of 8 lanes a site
    assert hop_split(32768, 132) == 1  # 16^4: one site a thread already takes 128 of the 132 SMs
    assert hop_split(8192, 66) == 2  # 8 x 16^3 a rank, 4 ranks
    assert hop_split(1, 1) == 8
    assert hop_split(10**6, 1) == 1
    monkeypatch.setenv("CIRCUSLINK_QCD_HOP_SPLIT", "4")
    assert hop_split(2048, 132) == 4
    monkeypatch.setenv("CIRCUSLINK_QCD_HOP_SPLIT", "3")
    with pytest.raises(ConfigError, match="CIRCUSLINK_QCD_HOP_SPLIT='3'"):
        hop_split(2048, 132)


class _FakeDirect:
    """DirectFaces' two questions, with addresses that say what they are: ghost half h at 1000 h + 1000, half h of
    slot k's neighbour at 100000 (h + 1) + k."""

    def ghost(self, half):
        return 1000 * (half + 1)

    def face_to(self, half):
        return [100000 * (half + 1) + k for k in range(8)]


def test_resident_direct_faces_alternate_two_ghost_halves(monkeypatch):
    """With direct faces hop h of the resident CG reads ghost half h & 1 and writes the next hop's faces into the
    neighbours' half (h + 1) & 1, p's (the last entry) into half 0; interiors keep what they had; without,
    nothing changes. The switch is CIRCUSLINK_QCD_DIRECT_FACES, 1 by default, refused naming itself otherwise."""
    from circuslink.apps.qcd._cuda import DSLASH_ARGS, _hop_table, direct_faces_wanted, one_pass
    from circuslink.errors import ConfigError

    rng = np.random.default_rng()
    args = [DSLASH_ARGS.pack(ghost=int(g), send=int(g) + 1, face_to=[int(g) + 1] * 8)
            for g in rng.integers(1, 1 << 40, 9)]
    hops = list(zip(args[:4], args[4:8], strict=True))
    plain = _hop_table(np, hops, args[8]).view(DSLASH_ARGS.dtype)
    assert [int(e["ghost"]) for e in plain] == [int(a["ghost"]) for a in args]
    table = _hop_table(np, hops, args[8], _FakeDirect()).view(DSLASH_ARGS.dtype)
    for h in range(4):
        assert int(table[h]["ghost"]) == int(args[h]["ghost"])  # interiors: untouched
        assert int(table[4 + h]["ghost"]) == 1000 * ((h & 1) + 1)
        assert list(table[4 + h]["face_to"]) == [100000 * (((h + 1) & 1) + 1) + k for k in range(8)]
        assert int(table[4 + h]["send"]) == int(args[4 + h]["send"])
    assert list(table[8]["face_to"]) == [100000 + k for k in range(8)]
    monkeypatch.delenv("CIRCUSLINK_QCD_DIRECT_FACES", raising=False)
    assert direct_faces_wanted()
    monkeypatch.setenv("CIRCUSLINK_QCD_DIRECT_FACES", "0")
    assert not direct_faces_wanted()
    monkeypatch.setenv("CIRCUSLINK_QCD_DIRECT_FACES", "yes")
    with pytest.raises(ConfigError, match="CIRCUSLINK_QCD_DIRECT_FACES='yes'"):
        direct_faces_wanted()
    # auto: one pass where the sites fit the rank's threads (16^4 on 2 ranks of 66 SMs), two where not (32^4)
    monkeypatch.delenv("CIRCUSLINK_QCD_ONE_PASS", raising=False)
    assert one_pass(16384, 66 * 256) and not one_pass(262144, 66 * 256) and one_pass(5, 5) and not one_pass(6, 5)
    monkeypatch.setenv("CIRCUSLINK_QCD_ONE_PASS", "1")
    assert one_pass(16384, 66 * 256) and one_pass(262144, 66 * 256)
    monkeypatch.setenv("CIRCUSLINK_QCD_ONE_PASS", "0")
    assert not one_pass(16384, 66 * 256) and not one_pass(262144, 66 * 256)
    monkeypatch.setenv("CIRCUSLINK_QCD_ONE_PASS", "2")
    with pytest.raises(ConfigError, match="CIRCUSLINK_QCD_ONE_PASS='2'"):
        one_pass(1, 1)


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_resident_face_blocks_follow_the_faces(monkeypatch, bad):
    """The blocks that copy a hop's faces together: one by default; with auto one per 32 KiB of faces, at least
    one, at most an eighth of the grid; a number fixes it and a bad value is refused naming it."""
    from circuslink.apps.qcd._cuda import face_blocks
    from circuslink.errors import ConfigError

    monkeypatch.delenv("CIRCUSLINK_QCD_FACE_BLOCKS", raising=False)
    assert face_blocks(1572864, 132) == 1
    monkeypatch.setenv("CIRCUSLINK_QCD_FACE_BLOCKS", "auto")
    assert face_blocks(0, 132) == 1
    assert face_blocks(196608, 132) == 6  # 16^4 on 2x1x1x1, single precision: 192 KiB of faces
    assert face_blocks(1572864, 132) == 16  # 32^4 on 2x1x1x1: 1.5 MiB, capped at 132 // 8
    assert face_blocks(1572864, 4) == 1
    monkeypatch.setenv("CIRCUSLINK_QCD_FACE_BLOCKS", "3")
    assert face_blocks(1572864, 132) == 3
    monkeypatch.setenv("CIRCUSLINK_QCD_FACE_BLOCKS", bad)
    with pytest.raises(ConfigError, match=f"CIRCUSLINK_QCD_FACE_BLOCKS='{bad}'"):
        face_blocks(196608, 132)


def test_dev_trace_is_written_and_summarised(tmp_path, monkeypatch, seed):
    """The resident CG's dev trace (CIRCUSLINK_QCD_DEV_TRACE): the stamps of the traced hops, read back after the
    phases, become one file a rank with each event's time since the first hop began, and scripts/dev/qcd_trace.py
    turns two ranks' files into medians and the ranks' skew."""
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from circuslink.apps.qcd._cuda import _TRACE_EVENTS, _TRACE_HOPS, _write_trace
    from circuslink.apps.qcd._lattice import Lattice

    rng = np.random.default_rng(seed)
    monkeypatch.setenv("CIRCUSLINK_QCD_DEV_TRACE_DIR", str(tmp_path))
    for rank in (0, 1):
        stamps = np.zeros(_TRACE_HOPS * len(_TRACE_EVENTS), dtype=np.uint64)
        t0 = 10**12 + rank * int(rng.integers(1000, 5000))
        hops = stamps.reshape(_TRACE_HOPS, len(_TRACE_EVENTS))
        # started < arrived < ... (ns); after an iteration's last hop (here hop 2) its sums' and vector's events
        offsets = np.array([0, 3000, 9000, 20000, 25000, 7000, 26000, 29000, 31000, 33000, 36000], dtype=np.uint64)
        for h in range(3):
            hops[h] = t0 + 30000 * h + offsets
            if h < 2:
                hops[h][6:] = 0
        d = SimpleNamespace(world=SimpleNamespace(rank=rank), lat=Lattice((4, 4, 4, 4), (2, 1, 1, 1), rank))
        _write_trace(d, stamps)
    got = json.loads((tmp_path / "trace-8x4x4x4-2x1x1x1-rank1.json").read_text())
    assert got["rank"] == 1 and got["unit"] == "us" and len(got["hops"]) == 3
    assert got["hops"][2] == {"begin": 60.0, "started": 63.0, "arrived": 69.0, "interior": 80.0, "end": 85.0,
                              "last_interior": 67.0, "dot": 86.0, "sum0": 89.0, "axpy": 91.0, "sum1": 93.0,
                              "vector": 96.0}, f"seed {seed}"
    assert got["hops"][0]["dot"] is None
    script = Path(__file__).resolve().parents[1] / "scripts" / "dev" / "qcd_trace.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "rank" in out and "    3.0" in out and "30.0" in out and "ranks' hop beginnings apart" in out, out
    # the iteration's line: dot, sum0, axpy, sum1, vector after its last hop ended (85 us)
    assert "  1.0       4.0       6.0       8.0      11.0" in out, out
    _write_trace(d, np.zeros_like(stamps))  # no trace compiled in: nothing written, nothing fails
    # the host's layout is the kernel's (dslash.cu: kTraceHops, TraceEvent)
    src = (Path(__file__).resolve().parents[1] / "src/circuslink/apps/qcd/dslash.cu").read_text()
    assert f"constexpr int kTraceHops = {_TRACE_HOPS};" in src
    enum = src[src.index("enum TraceEvent"):src.index("kTraceEvents };")]
    names = [w.strip().removeprefix("kTrace") for w in enum.split("{", 1)[1].split(",") if w.strip()]
    assert [n.lower() for n in names] == [e.replace("_", "") for e in _TRACE_EVENTS], names


def test_bench_halo_engine_verdicts_take_each_engines_fastest_loop(capsys):
    """The halo engines' targets at 16^4 on 2 ranks: circuslink's RMA in its fastest loop (here the resident CG on
    rma-device) against MPI-3 RMA's and NVSHMEM's fastest; other lattices, grids and precisions are not mixed in."""
    from circuslink.bench.qcd import _halo_engine_verdicts

    rng = np.random.default_rng()
    ours, mpi, nvs = (float(v) for v in rng.uniform(50, 500, 3))
    base = {"lattice": "16x16x16x16", "grid": "2x1x1x1", "prec": "single"}
    rows = [dict(base, impl="rma", cg="host", time_per_iter_us=ours * 3),
            dict(base, impl="rma-device", cg="device resident", time_per_iter_us=ours),
            dict(base, impl="mpi-rma", cg="host", time_per_iter_us=mpi),
            dict(base, impl="mpi-rma", cg="device", time_per_iter_us=mpi * 2),
            dict(base, impl="nvshmem", cg="host", time_per_iter_us=nvs),
            dict(base, impl="rma-device", prec="double", time_per_iter_us=1.0),
            dict(base, impl="rma-device", grid="2x2x1x1", time_per_iter_us=1.0),
            dict(base, impl="mpi-rma", lattice="32x32x32x32", time_per_iter_us=1e9)]
    _halo_engine_verdicts(rows)
    out = capsys.readouterr().out
    verdict = lambda r, t: "met" if r <= t else "MISSED"  # noqa: E731
    assert (f"16^4 on 2x1x1x1: circuslink RMA / MPI-3 RMA per iteration = {ours / mpi:.3f} (target <= 0.45): "
            f"{verdict(ours / mpi, 0.45)}") in out, out
    assert (f"16^4 on 2x1x1x1: circuslink RMA / NVSHMEM per iteration = {ours / nvs:.3f} (target <= 1): "
            f"{verdict(ours / nvs, 1.0)}") in out, out
    _halo_engine_verdicts([r for r in rows if r["impl"] != "nvshmem"])
    assert "NVSHMEM" not in capsys.readouterr().out  # no row, no verdict
