"""The channel soak (tests/soak/channels_soak.py): short runs here; the 10^6-message run is a
gpu-check stage whose result is committed under benchmarks/results/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SOAK = Path(__file__).parent / "soak" / "channels_soak.py"
sys.path.insert(0, str(SOAK.parent))
import channels_soak  # noqa: E402


def test_sizes_and_bytes_are_pure_functions_of_seed_channel_and_message(seed):
    sizes = [channels_soak.message_bytes(seed, c, m) for c in range(4) for m in range(500)]
    assert min(sizes) >= 8 and max(sizes) <= 1 << 20
    logs = np.log2(sizes)
    assert 3 <= logs.min() < 4 and 19 < logs.max() <= 20 and 10.5 < logs.mean() < 12.5  # log-uniform 2^3..2^20
    assert channels_soak.message_data(seed, 3, 7, 1000) == channels_soak.message_data(seed, 3, 7, 1000)
    assert channels_soak.message_data(seed, 3, 7, 1000) != channels_soak.message_data(seed, 3, 8, 1000)
    assert channels_soak.message_data(seed, 3, 7, 1001)[:1000] == channels_soak.message_data(seed, 3, 7, 1000)


def test_channels_cover_every_pair_and_both_modes():
    links, options = channels_soak.plan_links(4, 72, ["ll", "bulk", "mixed"])
    assert len(links) == 72 and {(lk.src_rank, lk.dst_rank) for lk in links} == {
        (a, b) for a in range(4) for b in range(4) if a != b}
    assert {o.get("ll_max") for o in options.values()} == {1 << 20, 0, None}
    assert sum(channels_soak.split_messages(1_000_001, 72)) == 1_000_001


def _soak(tmp_path, backend, n, messages, channels, timeout, seed):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "circuslink", "run", "-n", str(n), "--backend", backend, "--",
                           sys.executable, str(SOAK), "--messages", str(messages), "--channels", str(channels),
                           "--seed", str(seed), "--json", str(out)],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, CIRCUSLINK_TIMEOUT="60"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["lost"] == 0 and doc["meta"]["wrong_bytes"] == 0
    assert sum(r["received"] for r in doc["rows"]) == messages and len(doc["rows"]) == channels
    return doc


def test_soak_cpu_4_ranks(tmp_path, seed):
    _soak(tmp_path, "cpu", 4, 240, 12, 240, seed)


@pytest.mark.slow
@pytest.mark.gpu
def test_soak_gpu_4_ranks(tmp_path, seed):
    _soak(tmp_path, "cuda", 4, 20000, 64, 600, seed)
