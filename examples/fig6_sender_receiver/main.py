"""CIRCUS Fig. 6: a sender on rank 0 streams elements through a channel to a receiver on rank 1.

    circuslink run -n 2 -- python examples/fig6_sender_receiver/main.py [--backend cpu|cuda] [--elements N]

The channel comes from app.xml. On cuda, `circuslink gen` turns it into a header the kernels in
kernels.cu include; on cpu, the same channel is driven from Python (the reference back-end).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import circuslink as cl
from circuslink import channels, spec
from circuslink._argtypes import positive_int

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default=None)
    # --elements only: on the same command line `circuslink run -n` counts ranks, so -n here would mislead.
    parser.add_argument("--elements", type=positive_int, default=100_000, metavar="N",
                        help="elements to send (default 100,000)")
    args = parser.parse_args()
    world = cl.init(args.backend)
    app = spec.load(HERE / "app.xml", nranks=world.size)
    ch = channels.open(world, app)
    n = args.elements
    # fresh data each run; both ranks know it so the receiver can check every element
    seed = world.broadcast_object(int(np.random.SeedSequence().entropy % (1 << 32)))
    data = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32)

    if world.backend.runs_kernels:  # device kernels; the cpu back-end runs the host API only
        got = _run_cuda(world, ch, data)
    else:
        got = _run_cpu(world, ch, data)
    if world.rank == 1:
        if not np.array_equal(got, data):
            bad = int(np.flatnonzero(got != data)[0])
            print(f"fig6: element {bad} differs: got {got[bad]}, sent {data[bad]}", file=sys.stderr)
            return 1
        print(f"fig6: rank 1 received {n} elements from rank 0 through simple_out -> simple_in, in order, "
              f"all correct ({world.backend.name})")
    world.barrier()
    ch.close()
    world.close()
    return 0


def _run_cpu(world, ch, data):
    if world.rank == 0:
        for i in range(0, data.size, 1024):
            ch["simple_out"].write(data[i:i + 1024])
        return None
    if world.rank == 1:
        return np.concatenate([ch["simple_in"].read(min(1000, data.size - i)) for i in range(0, data.size, 1000)])
    return None


def _run_cuda(world, ch, data):
    import cupy as cp

    from circuslink.spec.codegen import generate

    with tempfile.TemporaryDirectory() as gen_dir:
        generate(str(HERE / "app.xml"), gen_dir, stem="app")
        module = cl.compile((HERE / "kernels.cu").read_text(), options=[f"-I{gen_dir}"])
    ok = cp.ones(1, dtype=cp.int32)
    n = np.uint64(data.size)
    if world.rank == 0:
        module.get_function("sender")((1,), (32,), (ch["simple_out"].device_handle(), cp.asarray(data), n, ok))
    elif world.rank == 1:
        out = cp.zeros(data.size, dtype=cp.uint32)
        module.get_function("receiver")((1,), (32,), (ch["simple_in"].device_handle(), out, n, ok))
    ch.wait_kernel(what=f"fig6's kernel on rank {world.rank}")  # bounded; raises ChannelError naming the channel
    if int(ok.get()[0]) != 1:
        raise cl.ChannelError(f"fig6: a channel call failed on rank {world.rank}")
    return out.get() if world.rank == 1 else None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cl.Error as exc:  # one line, as the circuslink command prints it (CIRCUSLINK_DEBUG=1: the traceback)
        if os.environ.get("CIRCUSLINK_DEBUG"):
            raise
        sys.exit(f"fig6: error: {exc}")
