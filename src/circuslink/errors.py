"""One exception hierarchy for every circuslink failure.

The CLI turns any :class:`Error` into one line on stderr and a non-zero exit;
library users catch :class:`Error` (or a subclass) to handle circuslink's
failures apart from their own.
"""

from __future__ import annotations

import builtins


class Error(Exception):
    """Base class of every error circuslink raises on purpose."""


class ConfigError(Error):
    """Bad input: an argument, environment variable or option out of range."""


class BackendError(Error):
    """A back-end cannot do what was asked (no GPU, no peer access, no compiler...)."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - shadows the builtin inside circuslink
    """A wait ran past its time-out. The message names what stalled.

    It is also a builtin :class:`TimeoutError`, so ``except TimeoutError`` catches it either way."""


class PeerError(Error):
    """Another rank died, exited early or lost contact. The message names it."""


class CompileError(Error):
    """Device code failed to compile; the message carries the compiler's log."""


class SpecError(Error):
    """A channel-definition file is invalid; the message names file, line and field."""


class ChannelError(Error):
    """A channel operation failed (device-side time-out, misuse)."""


class RmaError(Error):
    """An RMA queue was declared or used wrongly."""


class TransportError(Error):
    """A transport (circuslink.transport: a connection, or a relay between nodes' gateways) failed or timed out.
    The message names the link, both ranks and the transport."""
