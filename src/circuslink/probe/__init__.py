"""Measure the physical floor between every pair of ranks: ``circuslink probe``.

For each ordered pair (a, b) of ranks, rank a measures, while every other rank waits:

* ``ce_GBps``: copy-engine bandwidth, a's buffer into b's (cudaMemcpyAsync over NVLink;
  ``numpy.copyto`` into b's shared memory on the cpu back-end);
* ``sm_store_GBps`` / ``sm_load_GBps``: SM stores into, and loads from, b's memory with
  16-byte vectors (the best over a sweep of CTA counts); ``sm_store_bidir_GBps``: both
  directions at once;
* ``lat_relaxed_us``, ``lat_acqrel_us``, ``lat_pull_us``: one-way latency of a one-thread
  flag pingpong (relaxed stores polled locally; release/acquire; the peer's memory polled).

Every benchmark calls :func:`measure` in its own run and reports these figures next to
its own, so ratios are taken side by side. On the reference machine the figures must
match the reference machine's (:data:`REFERENCE_H200_NV18`: two H200s joined by 18 NVLinks).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .._config import default_timeout
from ..errors import TimeoutError
from ..results import progress

_PROGRESS_EVERY_S = 3.0  # a probe of many ranks says which pair it measures, this often

# The reference machine: 2 x H200 joined by 18 NVLinks, measured 2026-11-22 (BENCHMARKS.md).
REFERENCE_H200_NV18 = {
    "ce_GBps": 395.0,
    "sm_store_GBps": 366.5,  # 364-369
    "sm_load_GBps": 373.0,
    "sm_store_bidir_GBps": 362.0,
    "lat_relaxed_us": 0.61,
    "lat_acqrel_us": 1.20,
    "lat_pull_us": 0.96,
}
METRICS = list(REFERENCE_H200_NV18)


def buffer_bytes(runs_kernels: bool, quick: bool) -> int:
    """The bytes each rank's probe buffer holds (its bandwidths copy this much): 1 GiB on a GPU (256 MiB with
    --quick), 64 MiB on the cpu (8 MiB). Each rank also holds one more buffer as large (its data, or its local
    copy), which the command counts in its memory check before any rank starts."""
    if runs_kernels:
        return (256 << 20) if quick else (1 << 30)
    return (8 << 20) if quick else (64 << 20)
_BANDWIDTH_TOLERANCE = 0.05
_LATENCY_TOLERANCE = 0.10


def measure(world: Any, quick: bool = False, pairs: list[tuple[int, int]] | None = None) -> dict:
    """Collective: the floor between every ordered pair of ranks (or ``pairs``)."""
    Impl = world.backend_module("circuslink.probe").Probe
    if pairs is None:
        pairs = [(a, b) for a in range(world.size) for b in range(world.size) if a != b]
    from ..backends import SHARED_GPU_NOTE, describe_shared_gpus, shared_gpus

    impl = Impl(world, quick)
    sharing = shared_gpus(world)
    mps_active = bool(sharing) and _mps_active(world)
    if sharing and not mps_active:
        # Each round trip between contexts on one GPU waits for a time slice: a short run says
        # as much as a long one, and a long one would outlast any sensible time-out.
        impl.iters, impl.launches = min(impl.iters, 20), 1
        if world.rank == 0:
            import sys

            print(f"circuslink probe: warning: {describe_shared_gpus(sharing)}; {SHARED_GPU_NOTE}", file=sys.stderr)
    try:
        results = []
        last_note = time.monotonic()
        for i, (a, b) in enumerate(pairs):
            if world.rank == 0 and len(pairs) > 2 and time.monotonic() - last_note > _PROGRESS_EVERY_S:
                last_note = time.monotonic()
                progress(f"probe: pair {a} -> {b} ({i + 1} of {len(pairs)})")
            row = {"a": a, "b": b, "bytes": impl.nbytes}
            row.update(impl.measure_pair(a, b))
            results.append(row)
        local = world.allgather_object(impl.local_copy_GBps())
    finally:
        impl.close()
    floor = {
        "backend": world.backend.name,
        "device": impl.device_name(),
        "quick": quick,
        "pairs": results,
        "local_copy_GBps": local,
    }
    if sharing:
        floor["shared_gpus"] = describe_shared_gpus(sharing) + ("" if mps_active else f"; {SHARED_GPU_NOTE}")
        floor["mps"] = mps_active
    if results:
        first = next((r for r in results if (r["a"], r["b"]) == (0, 1)), results[0])
        floor["summary"] = {k: first[k] for k in METRICS}
    from .. import transport

    transport.record_floor(world, floor)  # the mapped transports' figures, for choices made from measurements
    return floor


def _mps_active(world: Any) -> bool:
    """Collective: whether every rank runs under MPS (rank 0 asks the daemon, everyone learns)."""
    from .. import mps

    return bool(world.broadcast_object(mps.status().active if world.rank == 0 else None))


def _is_reference_machine(floor: dict) -> bool:
    from ..backends import BACKENDS, runs_kernels

    gpu = floor.get("backend") in BACKENDS and runs_kernels(floor["backend"])
    return gpu and "H200" in floor.get("device", "") and not floor.get("shared_gpus")


def check_against_reference(floor: dict) -> list[str]:
    """Where the floor misses the reference machine's (5% on bandwidth, 10% on latency)."""
    misses = []
    summary = floor.get("summary") or {}
    for key, ref in REFERENCE_H200_NV18.items():
        got = summary.get(key)
        if got is None:
            continue
        tol = _LATENCY_TOLERANCE if key.startswith("lat") else _BANDWIDTH_TOLERANCE
        if abs(got - ref) > tol * ref:
            misses.append(f"{key}: {got:.3g} vs {ref:.3g} (off by {100 * (got - ref) / ref:+.1f}%, allowed {tol:.0%})")
    return misses


def _table(floor: dict) -> str:
    cols = [("pair", 7)] + [(k, len(k) + 2) for k in METRICS]
    lines = ["".join(name.rjust(w) for name, w in cols)]
    for r in floor["pairs"]:
        cells = [f"{r['a']}->{r['b']}".rjust(7)] + [f"{r[k]:.3f}".rjust(w) for k, w in cols[1:]]
        lines.append("".join(cells))
    if _is_reference_machine(floor) and floor.get("summary"):
        lines.append("".join(["ref".rjust(7)] + [f"{REFERENCE_H200_NV18[k]:.3f}".rjust(w) for k, w in cols[1:]]))
        lines.append("".join(["ratio".rjust(7)] + [
            f"{floor['summary'][k] / REFERENCE_H200_NV18[k]:.3f}".rjust(w) for k, w in cols[1:]
        ]))
    lines.append("local copy (read+write) GB/s per rank: " + ", ".join(f"{v:.0f}" for v in floor["local_copy_GBps"]))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .._argtypes import output_file_or_stdout
    from ..backends import BACKENDS

    p.add_argument("-n", "--nranks", type=_ranks, default=None,
                   help="ranks to probe, at least 2 (default: one per GPU on cuda, at least 2; 2 on cpu)")
    p.add_argument("--backend", choices=BACKENDS, help="back-end (default: cuda if a GPU is there, else cpu)")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-", default=None, type=output_file_or_stdout,
                   help="write the figures as JSON (the results format of every benchmark) to FILE; '-' or no FILE: "
                        "to standard output, the table going to standard error (default: no file)")
    p.add_argument("--quick", action="store_true", help="smaller buffers and fewer repetitions")
    p.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                   help="ranks that share a GPU run under CUDA MPS: auto (default), on, off")
    p.add_argument("--check", action="store_true",
                   help="exit non-zero when the figures miss the reference machine's (two H200s joined by 18 "
                        "NVLinks, one rank per GPU) by more than 5%% on bandwidth or 10%% on latency")


def _ranks(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: the probe measures pairs of ranks, so it needs at least 2")
    return value


def run(args: argparse.Namespace) -> int:
    import sys

    from ..launcher import inside_job, relaunch_self

    if not inside_job():
        from ..backends import cuda_device_count, default_backend_name, runs_kernels

        backend = args.backend or default_backend_name()
        gpu = runs_kernels(backend)
        n = args.nranks or (max(2, cuda_device_count()) if gpu else 2)
        need = 2 * buffer_bytes(gpu, args.quick)  # the buffer, and the data or the local copy beside it
        return relaunch_self(n, backend, mps_mode=args.mps, rank_bytes=0 if gpu else need, gpu_bytes=need if gpu else 0)
    from .. import init

    world = init(args.backend)
    t0 = time.monotonic()
    floor = measure(world, quick=args.quick)
    status = 0
    if world.rank == 0:
        print(f"circuslink probe: {world.size} ranks, back-end {world.backend.name}, {floor['device']} "
              f"({time.monotonic() - t0:.1f} s)")
        print("bandwidths in GB/s (1e9 B/s), latencies one-way in us")
        print(_table(floor))
        if args.json:
            from ..results import Results

            res = Results("probe", world)
            res.floor = floor
            for r in floor["pairs"]:
                res.add(impl="floor", **r)
            path = res.write_json(args.json)
            if path != "-":
                print(f"wrote {path}")
        if args.check and not _is_reference_machine(floor):
            print(f"circuslink probe: --check: no reference figures for {floor['device']} on the "
                  f"{floor['backend']} back-end{' with ranks sharing a GPU' if floor.get('shared_gpus') else ''}; "
                  "the reference is two H200s joined by 18 NVLinks, one rank per GPU", file=sys.stderr)
            status = 2
        elif args.check:
            misses = check_against_reference(floor)
            for m in misses:
                print(f"circuslink probe: misses the reference machine's figure: {m}", file=sys.stderr)
            status = 1 if misses else 0
    world.close()
    return status


def _stall(what: str, a: int, b: int, detail: str = "") -> TimeoutError:
    return TimeoutError(
        f"probe: {what} between rank {a} and rank {b} stalled{(' ' + detail) if detail else ''} "
        f"(limit {default_timeout():g} s, CIRCUSLINK_TIMEOUT)"
    )
