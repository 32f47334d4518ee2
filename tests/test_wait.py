"""The one host-side wait (_wait.py): its deadlines."""

from __future__ import annotations

import pytest

from circuslink._wait import Deadline


def test_a_host_wait_on_device_work_outlasts_the_devices_own_time_out(monkeypatch):
    """A device wait names what stalled and ends the kernel; the host waits longer, so that named error is the one
    raised (with equal limits the host's fired first and said only that the kernels did not finish)."""
    monkeypatch.setenv("CIRCUSLINK_TIMEOUT", "8")
    assert Deadline.behind_device().limit == pytest.approx(8 + 5)  # at least 5 s of grace
    assert Deadline.behind_device(100).limit == pytest.approx(125)  # a quarter of a longer limit
    assert Deadline.behind_device().remaining() > Deadline.after(None).remaining()
