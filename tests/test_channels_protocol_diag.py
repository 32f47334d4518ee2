"""The time-out message's account of a ring slot (channels/_cuda.describe_slot): which packet's header
or credit the slot holds relative to the one a wait needed, across the 32-bit wrap of the flags."""

import pytest

from circuslink.channels._cuda import describe_slot
from circuslink.channels.protocol import flag_of


@pytest.mark.parametrize("base", [0, 4671677, (1 << 32) - 3, (5 << 32) + 17])
def test_describe_slot_names_the_lap_the_slot_holds(rng, base):
    nslots = int(2 ** rng.integers(2, 12))
    seq = base + int(rng.integers(2 * nslots, 4 * nslots)) | 1  # odd: flag_of(seq) == low bits of seq
    slot = seq & (nslots - 1)
    want = flag_of(seq)
    assert describe_slot(seq, slot, 0, want, nslots, "header") == f"; its ring slot {slot} has no header yet"
    for laps in (-2, -1, 0, 1, 3):
        held = seq + laps * nslots
        text = describe_slot(seq, slot, flag_of(held), want, nslots, "header")
        assert f"holds the header of packet ~{held} " in text, text
        assert f"({laps:+g} laps from the one awaited, {nslots} slots)" in text, text
