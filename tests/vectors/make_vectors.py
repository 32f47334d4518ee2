"""Regenerate the channel test vectors: python tests/vectors/make_vectors.py

Each vector gives a channel's ring geometry, the writer's calls (bytes of each call) and the
exact bytes of the ring after those calls, starting from a zeroed ring, with the reader assumed
to keep up (the credit counter is set high), so the vectors also cover wrap-around. The expected
ring comes from circuslink.channels.protocol.encode_packets (the reference encoder); the cpu
back-end (tests/test_channels.py) and the device code (tests/test_channels_gpu.py) must write
the same bytes. Data is seeded so the files are stable; the tests add fresh random cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from circuslink.channels import protocol as P

HERE = Path(__file__).parent

CASES = [
    # name, mode, nslots, chunk (bw), element bytes, elements per write call, first packet's seq
    ("ll_u64", "ll", 4, None, 8, [40], 0),
    ("ll_struct12_wrap", "ll", 2, None, 12, [7, 25, 1], 0),
    ("ll_vec16_straddle", "ll", 4, None, 16, [16], 8),
    ("ll_u8_tail", "ll", 4, None, 1, [5, 130], 5),
    ("ll_vec64", "ll", 8, None, 64, [3, 1, 10], 1000),
    # across a multiple of 2^31: the first lap after it rewrites every line of its slots
    ("ll_u8_rewrite_lap", "ll", 4, None, 1, [3, 9, 1, 17, 2, 5], (1 << 31) - 2),
    # across 2^32: the 32-bit flags come round, and never take the value 0
    ("ll_u32_flag_wrap", "ll", 4, None, 4, [1, 30, 2, 7], (1 << 32) - 3),
    ("bw_vec64_wrap", "bw", 4, 256, 64, [5, 9], 0),
    ("bw_u32_wrap", "bw", 2, 1024, 4, [1000], 3),
    ("bw_u8_pad", "bw", 4, 64, 1, [3, 77], 0),
    ("bw_u16_2", "bw", 8, 128, 2, [1, 64, 200], (1 << 32) - 5),
]


def make(name, mode, nslots, chunk, elem, calls, first_seq, rng):
    geo = P.geometry(1, elem, mode=mode, nslots=nslots, chunk=chunk)
    recv_id, dst_rank = int(rng.integers(0, 1 << 16)), int(rng.integers(0, 4))
    route = P.route_of(recv_id, dst_rank)
    ring = np.zeros(geo.ring_bytes, dtype=np.uint8)
    seq = first_seq
    writes = []
    for n in calls:
        data = rng.integers(0, 256, n * elem, dtype=np.uint8).tobytes()
        writes.append(data.hex())
        sizes = P.split_write(len(data), geo.payload)
        pieces, pos = [], 0
        for s in sizes:
            pieces.append(data[pos:pos + s])
            pos += s
        seq = P.encode_packets(geo, route, ring, seq, pieces)
    return {"name": name, "mode": mode, "nslots": nslots, "payload": geo.payload, "slot_bytes": geo.slot_bytes,
            "recv_id": recv_id, "dst_rank": dst_rank, "element_bytes": elem, "first_seq": first_seq,
            "packets": seq - first_seq,
            "writes": writes, "ring": ring.tobytes().hex()}


def main() -> None:
    rng = np.random.default_rng(20261122)
    vectors = [make(*case, rng) for case in CASES]
    (HERE / "channel_rings.json").write_text(json.dumps({"version": 2, "vectors": vectors}, indent=1) + "\n")
    print(f"wrote {len(vectors)} vectors")


if __name__ == "__main__":
    main()
