"""Process-wide settings read from the environment, in one place.

Every time-out in circuslink defaults to :func:`default_timeout`, so one
variable (``CIRCUSLINK_TIMEOUT``, seconds) makes a whole job fail fast in CI or
wait longer on a loaded machine.
"""

from __future__ import annotations

import math
import os

from .errors import ConfigError

_DEFAULT_TIMEOUT_S = 120.0


def env_float(name: str, default: float, env: dict[str, str] | None = None) -> float:
    """The positive, finite number in environment variable ``name`` (``env``: default this process's), or
    ``default`` when it is unset or empty; anything else is refused in one line naming the variable."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not a number of seconds") from None
    # nan and inf parse as floats, but no deadline can be made of them: a wait would never end (inf) or
    # end at once with a time-out that names no time (nan).
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"environment variable {name}={raw!r} must be a positive, finite number of seconds")
    return value


def default_timeout(env: dict[str, str] | None = None) -> float:
    """Seconds any wait may last before it raises, from CIRCUSLINK_TIMEOUT (default 120). ``env``: the
    environment to read (default this process's), so a launcher checks its ranks' before starting them."""
    return env_float("CIRCUSLINK_TIMEOUT", _DEFAULT_TIMEOUT_S, env)


def resolve_timeout(timeout: float | None) -> float:
    """``timeout`` seconds checked (positive and finite), or CIRCUSLINK_TIMEOUT's when None."""
    if timeout is None:
        return default_timeout()
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(timeout, bool | str | bytes) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    return value
