"""One resource lifecycle for everything that holds memory, handles or peers' attention.

World, symmetric buffers, channels, RMA windows and queues, communicators, plans: each is a
:class:`Resource`. The rules, written once:

* ``close(timeout=None)`` releases it; idempotent. For collective resources it waits for
  peers (bounded by ``timeout``); subclasses implement :meth:`_close`.
* ``with resource:`` closes on a normal exit. On an exception it only *releases locally*
  (:meth:`_release_local`): a failing rank must not wait in a collective close for peers that
  will never arrive; the launcher ends the job and the error names the rank.
* If :meth:`_close` itself fails, what this rank holds is still released locally, then the
  error propagates: nothing leaks on the error path.
* Every resource belongs to a world and registers there (``world._own``); ``world.close()``
  closes what is still open, newest first (a queue before its window, a window before its
  buffers), so state that used to live in module globals keyed by ``id(world)`` lives on
  the World and dies with it.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError


class Resource:
    """Base class of circuslink's closable objects (see the module docstring for the rules)."""

    _closed: bool = False
    _kind: str = "resource"  # how messages name it ("channels", "rma window 2", ...)

    def _register(self, world: Any) -> None:
        """Hand this resource to ``world``, which closes it (newest first) if the user does not."""
        own = getattr(world, "_own", None)
        if own is not None:
            own(self)

    # -- what subclasses provide ------------------------------------------------------------
    def _close(self, timeout: float | None) -> None:
        """Release everything, waiting for peers where the resource is collective."""
        self._release_local()

    def _release_local(self) -> None:
        """Release what this rank holds without waiting for anyone (the error path)."""

    # -- the rules ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, op: str = "use") -> None:
        if self._closed:
            raise ConfigError(f"{op}: this {self._kind} is closed")

    def close(self, timeout: float | None = None) -> None:
        """Release this resource (collective where it is shared). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._close(timeout)
        except BaseException:
            try:
                self._release_local()
            finally:
                self._forget()
            raise
        self._forget()

    def release_local(self) -> None:
        """Drop what this rank holds now, without waiting for peers (after an error)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._release_local()
        finally:
            self._forget()

    def _forget(self) -> None:
        world = getattr(self, "world", None) or getattr(self, "_world", None)
        forget = getattr(world, "_disown", None)
        if forget is not None:
            forget(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.release_local()
