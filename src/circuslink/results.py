"""One results format for every measurement: who ran what, where, when, on which commit.

``Results`` is what ``circuslink probe`` and every ``circuslink bench X`` write: benchmark, device,
commit, date, back-end, ranks, the floor measured in the same run (the probe's figures), free-form
meta, and one row per measurement. It sits below the probe and the benchmarks (both import it; it
imports neither), and nothing here is collective. ``progress`` is the one line long runs print to show they live.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import ConfigError


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_label(world: Any) -> str:
    """``cpu-<host>`` on the cpu back-end; ``<gpu-name>-x<count>`` (e.g. ``nvidia-h200-x2``) on cuda:
    the back-end names its device (the count is the GPUs the job can use, min(ranks, visible GPUs))."""
    return world.backend.device_label(world.size)


def git_commit() -> str:
    """The commit this code runs from (short hash, ``+dirty`` when the tree has changes).

    ``CIRCUSLINK_COMMIT`` overrides it: a copy of the tree without ``.git`` (as on the device
    machine) has no other way to know. ``unknown`` when neither is available.
    """
    override = os.environ.get("CIRCUSLINK_COMMIT")
    if override:
        return override
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        commit = head.stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                capture_output=True, text=True, timeout=10)
        if status.returncode == 0 and status.stdout.strip():
            commit += "+dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def today() -> str:
    """The local date, YYYY-MM-DD."""
    return time.strftime("%Y-%m-%d")


def _jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars become numbers, NaN/inf become null, tuples become lists."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and callable(value.item):  # numpy / cupy scalar
        return _jsonable(value.item())
    if isinstance(value, Path):
        return str(value)
    raise ConfigError(f"results: value {value!r} of type {type(value).__name__} cannot be written as JSON")


class Results:
    """The results of one benchmark run: identity, the floor, and one row per measurement.

    Not collective. Rows carry at least ``impl`` and ``bytes``, plus the measured figures
    (``latency_us``, ``time_us``, ``throughput_GBps``, ...); a baseline that could not run
    adds a row with ``"skipped": "<reason>"``.
    """

    def __init__(self, benchmark: str, world: Any) -> None:
        if not benchmark or not re.fullmatch(r"[A-Za-z0-9_.-]+", benchmark):
            raise ConfigError(
                f"Results: benchmark name {benchmark!r} must be letters, digits, '-', '_' or '.'"
            )
        self.benchmark = benchmark
        self.device = device_label(world)
        self.commit = git_commit()
        self.date = today()
        self.backend = world.backend.name
        self.nranks = world.size
        self.floor: dict | None = None
        self.rows: list[dict] = []
        self.meta: dict = {
            "host": socket.gethostname(),
            "argv": list(sys.argv),
            "python": sys.version.split()[0],
        }
        if world.device is not None:
            from .backends import _partition
            from .mps import status

            self.meta["mps"] = status().active  # ranks sharing a GPU ran concurrently (MPS) or time-sliced
            # how ranks sharing a GPU split its SMs: MPS's cap ("off") or a green context each ("auto", "green")
            self.meta["sm_partition"] = _partition.mode()
        self._rank = world.rank

    def add(self, **row: Any) -> dict:
        """Append one row (``impl`` and ``bytes`` required) and return it."""
        for key in ("impl", "bytes"):
            if key not in row:
                raise ConfigError(
                    f"Results.add for {self.benchmark!r}: the row has no {key!r} field: {row!r}"
                )
        clean = _jsonable(row)
        self.rows.append(clean)
        return clean

    def extend(self, rows: Iterable[dict]) -> None:
        """Append rows made elsewhere (e.g. by a baseline function)."""
        for row in rows:
            self.add(**row)

    def to_dict(self) -> dict:
        return {
            "benchmark": self.benchmark,
            "device": self.device,
            "commit": self.commit,
            "date": self.date,
            "backend": self.backend,
            "nranks": self.nranks,
            "floor": _jsonable(self.floor),
            "meta": _jsonable(self.meta),
            "rows": list(self.rows),
        }

    def write_json(self, path: str | os.PathLike) -> str:
        """Write the results to ``path`` exactly (``-``: standard output); return it. Nothing is written
        anywhere else: a run writes a file only when asked for one (``--json FILE``).

        A file is written through a temporary file beside it and a rename, so a reader never sees half a
        file; its folder must exist (it is never created).
        """
        text = json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"
        if str(path) == "-":
            # The process's own standard output: under --json - the command sends everything else to stderr.
            out = sys.__stdout__ or sys.stdout
            out.write(text)
            out.flush()
            return "-"
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ConfigError(f"cannot write results to {str(target)!r}: {exc.strerror or exc}") from None
        return str(target)


_START = time.monotonic()


def _env_rank() -> int:
    for name in ("CIRCUSLINK_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        raw = os.environ.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                return 0
    return 0


def progress(msg: str) -> None:
    """One line on stderr, from rank 0 only, with the seconds since start (long runs show they live)."""
    if _env_rank() != 0:
        return
    print(f"[{time.monotonic() - _START:7.1f} s] {msg}", file=sys.stderr, flush=True)
