"""A 2-D 5-point Jacobi stencil over a process grid, halos through channels, checked against numpy.

    circuslink run -n 4 -- python examples/stencil/main.py [--size 1000x700] [--iters 50] [--dtype float32]
                                                            [--grid mesh:2x2] [--form host|launch|persistent]

Every rank owns a block of the domain (uneven splits where the ranks do not divide it); the halo channels
come from one call, ``cl.channels.open_halo``. ``--form``: ``host`` steps with numpy (cupy on a GPU) and the
host channel API, and runs on every back-end; ``launch`` (one launch pair an iteration) and ``persistent``
(one launch for every iteration) run the device kernels of kernels.cu, where the back-end runs kernels
(``world.backend.runs_kernels``). ``persistent`` runs the on-chip kernel where a rank's block fits one SM's
shared memory, else the grid kernel; ``persistent-grid`` and ``persistent-onchip`` ask for one. The default is
``launch`` where kernels run, else ``host``. Rank 0 checks the result, bit for bit, against the whole domain
stepped by one numpy process.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stencil  # noqa: E402  (this example's module, beside this file)

import circuslink as cl  # noqa: E402
from circuslink._argtypes import positive_int  # noqa: E402


def _shape(text: str) -> tuple[int, int]:
    try:
        nx, ny = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size {text!r}: expected NXxNY, e.g. 1000x700") from None
    if nx < 1 or ny < 1:
        raise argparse.ArgumentTypeError(f"--size {text!r}: both extents must be positive")
    return nx, ny


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=_shape, default=(1000, 700), help="global cells NXxNY (default 1000x700)")
    parser.add_argument("--iters", type=positive_int, default=50, help="Jacobi steps (default 50)")
    parser.add_argument("--dtype", choices=(*stencil.DTYPES, "both"), default="both")
    parser.add_argument("--grid", default=None, help="process grid mesh:PXxPY (default: blocks closest to square)")
    parser.add_argument("--form", choices=("host", *stencil.FORMS), default=None)
    parser.add_argument("--backend", choices=("cpu", "cuda"), default=None)
    args = parser.parse_args()
    world = cl.init(args.backend)
    form = args.form or ("launch" if world.backend.runs_kernels else "host")
    if form != "host" and not world.backend.runs_kernels:
        raise cl.ConfigError(f"--form {form} runs device kernels, which the {world.backend.name} back-end does not "
                             "run; use --form host (the same algorithm through the host API)")
    grid = args.grid or stencil.process_grid(world.size, args.size)
    seed = world.broadcast_object(int(os.environ.get("CIRCUSLINK_TEST_SEED") or np.random.SeedSequence().entropy
                                      % (1 << 31)))
    module = stencil.compile_kernels() if form != "host" else None
    status = 0
    kernel = None
    for name in (stencil.DTYPES if args.dtype == "both" else [args.dtype]):
        u0 = stencil.initial(args.size, stencil.DTYPES[name], seed)
        face = max(args.size)
        with cl.channels.open_halo(world, grid, stencil.C_TYPES[name], depth=2 * face) as halo:
            block = stencil.local_block(halo, u0)
            if form == "host":
                result = stencil.run_host(halo, block, args.iters)
            else:
                run = stencil.KernelRun(world, halo, block, module)
                kernel = run.persistent_kernel(form) if form.startswith("persistent") else None
                run.steps(args.iters, form)
                run.wait(f"the {form} stencil on rank {world.rank}")
                result = run.result
            got = stencil.gather(world, halo, result, args.size)
        if world.rank == 0:
            want = stencil.reference(u0, args.iters)[1:-1, 1:-1]
            if got.tobytes() != want.tobytes():
                bad = np.argwhere(got != want)[0]
                print(f"stencil: {name}: cell {tuple(bad)} is {got[tuple(bad)]!r}, numpy says {want[tuple(bad)]!r}",
                      file=sys.stderr)
                status = 1
            else:
                print(f"stencil: {name}, {args.size[0]}x{args.size[1]} cells on {grid} ({world.size} ranks), "
                      f"{args.iters} steps, {form} form{f' ({kernel} kernel on rank 0)' if kernel else ''}: "
                      f"bit-exact against numpy ({world.backend.name})")
    world.barrier()
    world.close()
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cl.Error as exc:  # one line, as the circuslink command prints it (CIRCUSLINK_DEBUG=1: the traceback)
        if os.environ.get("CIRCUSLINK_DEBUG"):
            raise
        sys.exit(f"stencil: error: {exc}")
