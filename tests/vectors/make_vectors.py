"""Regenerate the channel test vectors: python tests/vectors/make_vectors.py

Each vector gives a channel's ring geometry, the first packet's sequence number, the writer's calls
(the bytes of each call) and the exact bytes of the ring after those calls, starting from a zeroed
ring with the reader keeping up. The cpu reference (tests/test_channels.py) and the device code
(tests/test_channels_gpu.py) must write these bytes exactly.

The encoder below is written from docs/protocol.md alone and imports nothing of circuslink, so the
cpu reference is not checked against itself: it is a third writing of the format, kept small.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent

# docs/protocol.md, "The slot" and "Flags"
UNIT, LL_AREA, LL_PAYLOAD, BULK = 8, 256, 120, 0x80000000


def flag(seq: int) -> int:
    return (seq & 0xFFFFFFFF) | 1


def rewrite_lap(seq: int, nslots: int) -> bool:
    return seq % (1 << 31) < nslots


def put_u32(ring: np.ndarray, at: int, value: int) -> None:
    ring[at:at + 4] = np.frombuffer(int(value).to_bytes(4, "little"), dtype=np.uint8)


def encode(ring: np.ndarray, nslots: int, chunk: int, ll_max: int, route: int, seq: int, data: bytes) -> int:
    """Store one write call's packets from packet ``seq``; return the next seq."""
    slot_bytes = LL_AREA + chunk
    bulk = len(data) > ll_max
    size = chunk if bulk else LL_PAYLOAD
    for pos in range(0, len(data), size):
        piece = data[pos:pos + size]
        base = (seq % nslots) * slot_bytes
        f = flag(seq)
        if bulk:
            padded = piece + bytes(-len(piece) % 16)
            ring[base + LL_AREA:base + LL_AREA + len(padded)] = np.frombuffer(padded, dtype=np.uint8)
            if rewrite_lap(seq, nslots):
                for u in range(2, 32):
                    put_u32(ring, base + u * UNIT, 0)
                    put_u32(ring, base + u * UNIT + 4, f)
            word = len(piece) | BULK
        else:
            units = 30 if rewrite_lap(seq, nslots) else -(-len(piece) // 4)
            padded = piece + bytes(4 * units - len(piece))
            for u in range(units):
                put_u32(ring, base + (2 + u) * UNIT, int.from_bytes(padded[4 * u:4 * u + 4], "little"))
                put_u32(ring, base + (2 + u) * UNIT + 4, f)
            word = len(piece)
        put_u32(ring, base, route)
        put_u32(ring, base + 4, f)
        put_u32(ring, base + 8, word)
        put_u32(ring, base + 12, f)
        seq += 1
    return seq


CASES = [
    # name, nslots, chunk, ll_max, element bytes, elements per write call, first packet's seq
    ("ll_u64", 4, 256, 1024, 8, [40], 5),
    ("ll_struct12_wrap", 2, 256, 1024, 12, [7, 25, 1], 2),
    ("ll_vec16_straddle", 4, 256, 1024, 16, [16], 8),
    ("ll_u8_tail", 4, 256, 1024, 1, [5, 119, 121], 5),
    ("ll_first_lap_rewrites", 8, 256, 1024, 64, [3, 1, 10], 0),
    # across a multiple of 2^31: the first lap after it rewrites every unit of its slots
    ("ll_u8_rewrite_lap", 4, 256, 1024, 1, [3, 9, 1, 17, 2, 5], (1 << 31) - 2),
    # across 2^32: the 32-bit flags come round, and never take the value 0
    ("ll_u32_flag_wrap", 4, 256, 1024, 4, [1, 30, 2, 7], (1 << 32) - 3),
    ("bulk_vec64_wrap", 4, 256, 0, 64, [5, 9], 3),
    ("bulk_u32", 2, 1024, 0, 4, [1000], 7),
    ("bulk_u8_pad", 4, 512, 0, 1, [3, 77, 700], 9),
    ("bulk_rewrite_lap", 4, 256, 0, 2, [130, 1, 64], (1 << 31) - 1),
    # one channel, both kinds: writes up to ll_max bytes are low-latency packets, larger ones bulk
    ("mixed_u16", 8, 512, 64, 2, [1, 64, 200, 32, 33, 3], 6),
    ("mixed_flag_wrap", 4, 256, 120, 8, [15, 16, 1, 40], (1 << 32) - 2),
]


def make(name, nslots, chunk, ll_max, elem, calls, first_seq, rng):
    recv_id, dst_rank = int(rng.integers(0, 1 << 16)), int(rng.integers(0, 4))
    route = recv_id | dst_rank << 16
    ring = np.zeros(nslots * (LL_AREA + chunk), dtype=np.uint8)
    seq = first_seq
    writes = []
    for n in calls:
        data = rng.integers(0, 256, n * elem, dtype=np.uint8).tobytes()
        writes.append(data.hex())
        seq = encode(ring, nslots, chunk, ll_max, route, seq, data)
    return {"name": name, "nslots": nslots, "chunk": chunk, "ll_max": ll_max, "slot_bytes": LL_AREA + chunk,
            "recv_id": recv_id, "dst_rank": dst_rank, "element_bytes": elem, "first_seq": first_seq,
            "packets": seq - first_seq, "writes": writes, "ring": ring.tobytes().hex()}


def main() -> None:
    rng = np.random.default_rng(20261123)
    vectors = [make(*case, rng) for case in CASES]
    (HERE / "channel_rings.json").write_text(json.dumps({"version": 3, "vectors": vectors}, indent=1) + "\n")
    print(f"wrote {len(vectors)} vectors")


if __name__ == "__main__":
    main()
