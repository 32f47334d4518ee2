"""CIRCUS Fig. 2: a read, +1, write pipeline stage on rank 1, fed and drained by rank 0.

    circuslink run -n 2 -- python examples/fig2_pipeline/main.py [--backend cpu|cuda] [--elements N]

The channels come from app.xml (kernels.cu includes the header `circuslink gen` makes from it).
Rank 0 checks that every element came back exactly once, in order, plus one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

import circuslink as cl
from circuslink import channels, spec
from circuslink._argtypes import positive_int

HERE = Path(__file__).resolve().parent
TILE = 960


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default=None)
    # --elements only: on the same command line `circuslink run -n` counts ranks, so -n here would mislead.
    parser.add_argument("--elements", type=positive_int, default=200_000, metavar="N",
                        help="elements to send (default 200,000)")
    args = parser.parse_args()
    world = cl.init(args.backend)
    app = spec.load(HERE / "app.xml", nranks=world.size)
    ch = channels.open(world, app)
    data = np.random.default_rng().integers(-2**31, 2**31 - 1, args.elements, dtype=np.int32)
    # kernels where the back-end runs them; the cpu reference runs host-API programs only (docs/user-kernels.md)
    run = _run_cuda if world.backend.runs_kernels else _run_cpu
    got = run(world, ch, data)
    if world.rank == 0:
        want = data + np.int32(1)
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            print(f"fig2: element {bad}: got {got[bad]}, expected {want[bad]}", file=sys.stderr)
            return 1
        print(f"fig2: {data.size} elements went through read, +1, write on rank 1 and came back exact "
              f"({world.backend.name})")
    world.barrier()
    ch.close()
    world.close()
    return 0


def _run_cpu(world, ch, data):
    n = world.broadcast_object(data.size)
    if world.rank == 1:
        for i in range(0, n, TILE):
            tile = ch["feed_in"].read(min(TILE, n - i))
            ch["result_out"].write(tile + np.int32(1))
        return None
    if world.rank == 0:
        feeder = threading.Thread(target=lambda: [ch["feed_out"].write(data[i:i + TILE])
                                                  for i in range(0, data.size, TILE)])
        feeder.start()
        out = np.concatenate([ch["result_in"].read(min(TILE, data.size - i)) for i in range(0, data.size, TILE)])
        feeder.join()
        return out
    return None


def _run_cuda(world, ch, data):
    import cupy as cp

    from circuslink.spec.codegen import generate

    with tempfile.TemporaryDirectory() as gen_dir:
        generate(str(HERE / "app.xml"), gen_dir, stem="pipeline")
        source = (HERE / "kernels.cu").read_text()
        module = cl.compile(source, options=[f"-I{gen_dir}"])
    n = world.broadcast_object(data.size)
    ok = cp.ones(1, dtype=cp.int32)
    out = None
    if world.rank == 1:
        module.get_function("plus_one")((1,), (32,), (ch["feed_in"].device_handle(), ch["result_out"].device_handle(),
                                                       np.uint64(n), ok))
    elif world.rank == 0:
        out = cp.zeros(n, dtype=cp.int32)
        module.get_function("feed_and_collect")((1,), (64,), (ch["feed_out"].device_handle(),
                                                              ch["result_in"].device_handle(), cp.asarray(data), out,
                                                              np.uint64(n), ok))
    ch.wait_kernel(what=f"fig2's kernel on rank {world.rank}")  # bounded; raises a channel's recorded error
    if int(ok.get()[0]) != 1:
        raise cl.ChannelError(f"fig2: a channel call failed on rank {world.rank}")
    return out.get() if out is not None else None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cl.Error as exc:  # one line, as the circuslink command prints it (CIRCUSLINK_DEBUG=1: the traceback)
        if os.environ.get("CIRCUSLINK_DEBUG"):
            raise
        sys.exit(f"fig2: error: {exc}")
