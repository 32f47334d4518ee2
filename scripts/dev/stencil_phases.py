"""Dev experiment: where an iteration of the on-chip persistent stencil goes, phase by phase.

    circuslink run -n 2 -- python scripts/dev/stencil_phases.py [--per-rank 64x64] [--iters 2000]

Builds examples/stencil/kernels.cu with STENCIL_PHASES: lane 0 of warps 0..3 (the exchange warps, +x -x +y -y)
and of warp 4 (an interior worker) sum the clock64 cycles of each phase of every iteration: write (pack + send),
read (wait for the neighbour's halo), unpack, interior, the first __syncthreads, the frame, the second
__syncthreads. Prints each rank's means an iteration in ns (at the SM clock the device reports) beside the
device-clocked time an iteration. One JSON line a rank on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "stencil"))

import stencil  # noqa: E402

import circuslink as cl  # noqa: E402

PHASES = ("write", "read", "unpack", "interior", "sync1", "frame", "sync2")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-rank", default="64x64")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--depth-edges", type=int, default=2, help="the halo channels' depth in edges (bench: 2)")
    args = parser.parse_args()
    world = cl.init()
    import cupy as cp

    lx, ly = (int(v) for v in args.per_rank.split("x"))
    grid = stencil.process_grid(world.size, (lx * world.size, ly))
    dims = [int(v) for v in grid.split(":")[1].split("x")]
    shape = (lx * dims[0], ly * dims[1])
    u0 = stencil.initial(shape, stencil.DTYPES[args.dtype], 1234)
    module = stencil.compile_kernels("#define STENCIL_PHASES\n")
    clock_hz = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["clockRate"] * 1e3
    with cl.channels.open_halo(world, grid, stencil.C_TYPES[args.dtype], depth=args.depth_edges * max(shape)) as halo:
        run = stencil.KernelRun(world, halo, stencil.local_block(halo, u0), module)
        out = []
        for _ in range(3):
            world.barrier()
            run.steps(args.iters, "persistent-onchip", timed_from=min(world.size, args.iters - 1))
            run.wait(f"the phase run on rank {world.rank}")
            sums = run.clocks[2:].get().reshape(5, 8).astype(np.float64)
            per_iter = {f"warp{w}": {p: round(sums[w, k] / args.iters / clock_hz * 1e9, 1) for k, p in enumerate(PHASES)
                                     if sums[w, k]} for w in range(5)}
            out.append({"rank": world.rank, "grid": grid, "per_rank": args.per_rank, "iters": args.iters,
                        "depth_edges": args.depth_edges,
                        "us_per_iter": round(run.seconds_per_step() * 1e6, 3), "sm_clock_mhz": clock_hz / 1e6,
                        "phase_ns_per_iter": per_iter})
        print(json.dumps(out[-1]), flush=True)
    world.barrier()
    world.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
