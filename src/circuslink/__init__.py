"""circuslink: direct accelerator-to-accelerator communication fused with computation.

Start here::

    import circuslink as cl
    world = cl.init()                      # rank, size, back-end (cuda if a GPU is there, else cpu)
    buf = world.alloc(1 << 20)             # symmetric memory: buf.local, buf.peer(r), buf.ptr(r)
    world.barrier()
    world.close()

Run several ranks with ``circuslink run -n 4 -- python app.py`` (or mpirun).
"""

from __future__ import annotations

from .device_code import compile, include_dir
from .errors import (
    BackendError,
    ChannelError,
    CompileError,
    ConfigError,
    Error,
    PeerError,
    RmaError,
    SpecError,
    TimeoutError,
    TransportError,
)
from .memory import SymmetricBuffer
from .world import World, init

__version__ = "0.1.0"

# The areas, reachable as cl.channels, cl.rma, ... and imported on first use (cupy, mpi4py and the
# device compiler stay unloaded for programs that never touch them).
AREAS = ("channels", "rma", "collectives", "trace", "transport", "spec", "topology", "apps", "probe", "mps")


def __getattr__(name: str):
    if name in AREAS:
        import importlib

        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'circuslink' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(AREAS))

__all__ = [
    "AREAS",
    "BackendError",
    "ChannelError",
    "CompileError",
    "ConfigError",
    "Error",
    "PeerError",
    "RmaError",
    "SpecError",
    "SymmetricBuffer",
    "TimeoutError",
    "TransportError",
    "World",
    "__version__",
    "compile",
    "include_dir",
    "init",
]
