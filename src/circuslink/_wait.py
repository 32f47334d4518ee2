"""The one host-side wait: poll until done, give up at a deadline, say what stalled.

Every host wait in circuslink (collectives over the store, channel ends on the cpu back-end,
RMA counters, MPI requests, baselines' child processes, device work seen from the host) goes
through :func:`wait_until`, so they share one back-off, one time-out rule and one error:

    deadline = Deadline.after(timeout)            # timeout: seconds, None = CIRCUSLINK_TIMEOUT
    wait_until(lambda: counter[0] >= epoch, deadline, lambda: f"rma queue 3 on rank 1: origin 0")

A :class:`Deadline` is passed down, not re-made: a time-out given to a call bounds every wait
under it, together. ``check`` (optional) runs between polls and may raise, e.g. a
:class:`~circuslink.PeerError` naming a rank that died.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from . import _sysinfo
from ._config import resolve_timeout
from .errors import TimeoutError

# Back-off: spin a little (a peer often answers within microseconds), then yield, then sleep
# up to _SLEEP_MAX_S: where ranks share cores a spinning rank starves the peer it waits for.
# Where every rank of the machine has a core of its own nobody is starved: a wait polls without
# sleeping for its first _ALONE_SPIN_S (a sleep costs tens of microseconds of timer slack, more than
# the cpu channel's whole one-way time), as MPI's own waits do, and backs off only after that.
_SPIN_POLLS = 50
_YIELD_POLLS = 200
_SLEEP_MIN_S = 20e-6
_SLEEP_MAX_S = 2e-3
_ALONE_SPIN_S = 1.0
_DEVICE_GRACE_S = 5.0  # Deadline.behind_device: the least the host outwaits a device-side time-out by
_ALONE_YIELD_EVERY = 1024  # polls between yields while spinning alone (lets a busy core's other work run)


def cores_of_their_own() -> bool:
    """Whether every rank of this job on this machine has a core of its own (ranks <= cores), so that waits
    may poll without sleeping. Read once per process: the launcher fixes both for the job's life."""
    return _alone()


@functools.lru_cache(maxsize=1)
def _alone() -> bool:
    return _sysinfo.local_ranks() <= _sysinfo.cores()


class Deadline:
    """An absolute point in time (monotonic clock) after which waits give up."""

    __slots__ = ("at", "limit")

    def __init__(self, at: float, limit: float) -> None:
        self.at = at
        self.limit = limit  # the seconds it was made with, for messages

    @classmethod
    def after(cls, timeout: float | Deadline | None) -> Deadline:
        """``timeout`` seconds from now (None: CIRCUSLINK_TIMEOUT); a Deadline passes through."""
        if isinstance(timeout, Deadline):
            return timeout
        limit = resolve_timeout(timeout)
        return cls(time.monotonic() + limit, limit)

    @classmethod
    def behind_device(cls, timeout: float | None = None) -> Deadline:
        """The host's deadline for device work whose own waits give up after ``timeout`` (None:
        CIRCUSLINK_TIMEOUT): that limit plus a grace of a quarter of it, at least ``_DEVICE_GRACE_S``. A device
        wait names what stalled (the peer, queue or barrier) and ends the kernel; the host's can only say that the
        work did not end. With equal limits the host's fired first, since it starts after the launch (a resident
        QCD CG that stalled on 4 ranks said only "its kernels did not finish")."""
        limit = resolve_timeout(timeout)
        limit += max(_DEVICE_GRACE_S, limit / 4)
        return cls(time.monotonic() + limit, limit)

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def __repr__(self) -> str:
        return f"Deadline(limit={self.limit:g} s, remaining={self.remaining():.3g} s)"


def timeout_error(what: str, deadline: Deadline) -> TimeoutError:
    """The one time-out error: what stalled, after how long, and how to change the limit."""
    return TimeoutError(f"{what}: timed out after {deadline.limit:g} s (CIRCUSLINK_TIMEOUT sets the limit)")


def wait_until(ready: Callable[[], bool], deadline: Deadline | float | None,
               what: str | Callable[[], str], check: Callable[[], None] | None = None,
               spin_s: float = 0.0) -> None:
    """Poll ``ready()`` with back-off until it is true; raise :class:`~circuslink.TimeoutError` naming
    ``what`` (a string, or a function called only on failure) once ``deadline`` passes.

    ``spin_s``: poll without yielding or sleeping for this long first. For a wait inside a timed loop
    (a host-timed MPI pingpong), where a sleep of the back-off would land in the figure; it holds a
    core meanwhile, as MPI's own Wait does."""
    if ready():
        return
    deadline = Deadline.after(deadline)
    if cores_of_their_own():
        spin_s = max(spin_s, _ALONE_SPIN_S)
    spin_until = time.monotonic() + spin_s if spin_s > 0 else 0.0
    polls, sleep = 0, _SLEEP_MIN_S
    while True:
        if check is not None:
            check()
        if ready():
            return
        if deadline.expired():
            if ready():  # one last look: the answer may have come while we slept
                return
            raise timeout_error(what() if callable(what) else what, deadline)
        polls += 1
        if polls <= _SPIN_POLLS:
            continue
        if spin_until and time.monotonic() < spin_until:
            if polls % _ALONE_YIELD_EVERY == 0:
                time.sleep(0)
            continue
        if polls <= _YIELD_POLLS:
            time.sleep(0)
            continue
        time.sleep(min(sleep, deadline.remaining()))
        sleep = min(2 * sleep, _SLEEP_MAX_S)
