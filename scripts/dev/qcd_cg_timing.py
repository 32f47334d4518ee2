"""The device-resident CG on one GPU, one rank: its time per iteration, and where the rest of a solve's time goes.

One process, in this order, each step timed on the host clock:

1. A mixed-precision solve (``qcd invert --prec double --prec-sloppy single --tol 1e-10 --cg device`` on 8^4)
   three times in the same process: cold (the first solve of a process, as ``qcd invert`` timed it before it
   had a warm-up: the 57.6 ms an iteration of 2026-11-25), then warm with the reliable updates made inside
   the resident kernel, then warm with the host making them; each with the solve's stage split (setup,
   iterations, updates by the host, finish) and the true residual against the one-rank reference.
2. For each ``--lattices`` L (L^4): ``bench qcd``'s measurement of one CG iteration (``measure_cg``: the
   resident kernel in single precision, medians and minima over 10 samples, the split from block 0's clock,
   and the row's compile, setup and warm-up seconds), at ``--check-every`` 10 and 100 (what the host's look
   between batches costs).

    python scripts/dev/qcd_cg_timing.py [--lattices 8,16] [--json FILE]

Meant for the cuda back-end (one GPU); ``--backend cpu --lattices 4 --solve-lattice 4`` runs the same steps
on the cpu back-end (no resident kernel there: the batched loop with the host collectives).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lattices", default="8,16", help="L of the L^4 lattices to time (default 8,16)")
    parser.add_argument("--solve-lattice", type=int, default=8,
                        help="L of the mixed-precision solves (default 8; 0: none, which spares compiling the double "
                             "and mixed modules)")
    parser.add_argument("--json", default=None, help="write the rows as a results file")
    parser.add_argument("--backend", default="cuda", help="back-end (default cuda)")
    args = parser.parse_args()

    import circuslink
    from circuslink.apps import qcd
    from circuslink.bench.qcd import measure_cg
    from circuslink.results import Results

    clock = time.perf_counter
    t0 = clock()
    world = circuslink.init(args.backend)
    print(f"init: {clock() - t0:.2f} s")
    results = Results("qcd-cg-timing", world)
    if args.solve_lattice:
        solves(world, args.solve_lattice, results)
    for size in (int(v) for v in args.lattices.split(",")):
        lat = qcd.Lattice((size,) * 4, (1, 1, 1, 1), 0)
        for every in (10, 100):
            row = measure_cg(world, lat, "rma", "single", "device", iters=100, warmup=10, samples=10,
                             check_every=every)
            results.add(**row, check=f"per iteration, check every {every}")
            split = ", ".join(f"{n} {row[f'{n}_us']:.1f}" for n in ("dslash", "halo", "reduction", "vector"))
            print(f"{size}^4 1 rank single, {row['cg']}, check every {every}: {row['time_per_iter_us']:.1f} us per "
                  f"iteration (min {row['min_us']:.1f}, {row['iters']} a sample x {row['samples']}); split us: "
                  f"{split} (marked loops {row['timed_iter_us']:.1f}); compile {row['compile_s']:.2f} s, setup "
                  f"{row['setup_s']:.2f} s, warm-up {row['warmup_s']:.2f} s, measuring {row['measure_s']:.2f} s")

    if args.json:
        print(f"results: {results.write_json(args.json)}")
    world.close()
    return 0


def solves(world, size: int, results) -> None:
    """Step 1: the cold and warm mixed-precision solves."""
    from circuslink.apps import qcd

    clock = time.perf_counter
    dims = (size,) * 4
    lat = qcd.Lattice(dims, (1, 1, 1, 1), 0)
    U, b = qcd.random_gauge(dims, 1), qcd.random_spinor(dims, 2)
    t0 = clock()
    precise = qcd.WilsonOperator(world, lat, U, 0.12, "double")
    sloppy = qcd.WilsonOperator(world, lat, U, 0.12, "single")
    print(f"mixed-precision operators (and the double-precision module): {clock() - t0:.2f} s")
    source = world.xp.asarray(b)
    for name, updates in (("cold", True), ("warm, updates in the kernel", True), ("warm, updates by the host", False)):
        t0 = clock()
        res = qcd.solve(precise, source, 1e-10, 1000, sloppy=sloppy, check_every=10, device_updates=updates,
                        phases=precise.new_phases())
        wall = clock() - t0
        x = res.x.get() if hasattr(res.x, "get") else res.x
        true = float(np.linalg.norm(b - qcd.wilson(U, x, 0.12)) / np.linalg.norm(b))
        stages = ", ".join(f"{n} {v * 1e3:.3f} ms" for n, v in res.stage_seconds.items())
        each = res.stage_seconds["iterations"] / max(1, res.iterations) * 1e6
        print(f"{size}^4 solve ({name}): {res.iterations} iterations, {res.reliable_updates} reliable updates "
              f"({'in the kernel' if res.device_updates else 'by the host'}), true residual {true:.2e}; "
              f"{res.seconds / max(1, res.iterations) * 1e6:.1f} us per iteration over the solve, "
              f"{each:.1f} us in the iterations stage; stages: {stages}; call {wall:.2f} s")
        results.add(impl="solve", bytes=0, lattice="x".join(map(str, dims)), run=name, iterations=res.iterations,
                    reliable_updates=res.reliable_updates, device_updates=res.device_updates, true_residual=true,
                    seconds=res.seconds, time_per_iter_us=res.seconds / max(1, res.iterations) * 1e6,
                    iteration_us=each, **{f"{n}_s": v for n, v in res.stage_seconds.items()},
                    **{f"{n}_us": v / max(1, res.iterations) * 1e6 for n, v in res.phase_seconds.items()})
        assert res.converged and true <= 1e-10, (name, true)
    precise.close()
    sloppy.close()


if __name__ == "__main__":
    raise SystemExit(main())
