"""Process-wide settings read from the environment, in one place.

Every time-out in circuslink defaults to :func:`default_timeout`, so one
variable (``CIRCUSLINK_TIMEOUT``, seconds) makes a whole job fail fast in CI or
wait longer on a loaded machine.
"""

from __future__ import annotations

import os

from .errors import ConfigError

_DEFAULT_TIMEOUT_S = 120.0


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"environment variable {name}={raw!r} must be positive")
    return value


def default_timeout() -> float:
    """Seconds any wait may last before it raises, from CIRCUSLINK_TIMEOUT (default 120)."""
    return env_float("CIRCUSLINK_TIMEOUT", _DEFAULT_TIMEOUT_S)


def resolve_timeout(timeout: float | None) -> float:
    if timeout is None:
        return default_timeout()
    if timeout <= 0:
        raise ConfigError(f"timeout must be positive, got {timeout}")
    return float(timeout)
