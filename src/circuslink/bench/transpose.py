"""The transposing put against a plain put of the same bytes: ``circuslink bench transpose``.

Every rank puts a rows x cols block into its right neighbour (with 2 ranks, into each other),
for each element type (--dtypes) and block size (--sizes; rows = cols or 2 * cols), as

* ``transpose-put``: one transposing put (rma.declare_transpose_write), the tile the model picks;
* ``contiguous-put``: one contiguous put of the same bytes (rma.declare_write): the target;
* ``local-transpose+put``: a local transpose into a staging buffer (the same tile kernel,
  rma.plan_local_transpose) then the contiguous put: what FFT libraries do today.

``time_us`` is the median over samples of one start-to-wait cycle (each sample a loop of
--loop cycles, the slowest rank), ``time_min_us`` the fastest sample, ``throughput_GBps`` the
block's bytes over the median; ``vs_contiguous`` is the transposing put's bandwidth over the
contiguous put's. Every case checks the bytes that arrived.

Then the tile model (rma/_tile_model.py): for one large block per element type, the transposing
put is timed with every candidate tile (and a few at a block 4 times smaller); the model's
constants are fitted to a few of them (``in_fit``) with B_ideal from the probe's floor of this
run (the contiguous copy the pair allows: min of copy engine, SM stores and half the local
read+write bandwidth), and every tile's predicted bandwidth is printed beside its measured one
(rows ``impl=model``). The floor is in ``floor``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any

import numpy as np

from ..errors import ConfigError, RmaError

_DTYPES = ("float32", "float64", "complex64", "complex128")
_CPU_MAX = 4 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _driver as drv

    drv.add_common_arguments(parser, default_sizes="64K:256M", default_iters=200, default_warmup=10)
    parser.add_argument("--dtypes", default=",".join(_DTYPES),
                        help=f"element types, comma-separated (default {','.join(_DTYPES)})")
    parser.add_argument("--loop", type=int, default=10, help="cycles per timed sample (default 10)")
    parser.add_argument("--model-bytes", type=str, default="64M",
                        help="block size of the tile-model section (default 64M; 1M on cpu); 0 skips it")


def run(args: argparse.Namespace) -> int:
    from .. import launcher
    from . import _driver as drv

    if not launcher.inside_job():
        _model_bytes(args)  # a bad value fails here, once, not in every rank
        argv = ["bench", "transpose", *sys.argv[sys.argv.index("transpose") + 1:]] if "transpose" in sys.argv \
            else ["bench", "transpose"]
        return launcher.relaunch_self(args.nranks, argv=argv, backend=args.backend,
                                      **drv.memory_per_rank(args, 6, _CPU_MAX))
    import circuslink

    world = circuslink.init(args.backend)
    try:
        return _run_rank(world, args)
    finally:
        world.close()


def _model_bytes(args: argparse.Namespace) -> int:
    from . import _driver as drv

    return drv.parse_sizes(args.model_bytes, "--model-bytes")[0] if args.model_bytes not in ("0", "") else 0


def _parse_dtypes(text: str) -> list[str]:
    out = [t.strip() for t in text.split(",") if t.strip()]
    for t in out:
        if t not in _DTYPES:
            raise ConfigError(f"--dtypes: {t!r} is not supported (choose from {', '.join(_DTYPES)})")
    return out or list(_DTYPES)


def _floor_bandwidth(floor: dict, rank: int) -> float:
    """B_ideal for the model: the contiguous copy rank -> its neighbour allows, from the probe (bytes/s)."""
    cands = []
    for pair in floor.get("pairs", []):
        if pair.get("a") == rank:
            cands += [pair.get("ce_GBps"), pair.get("sm_store_GBps")]
            break
    local = floor.get("local_copy_GBps") or []
    if len(local) > rank and local[rank]:
        cands.append(local[rank] / 2)  # read + write counted: a copy moves half of it
    cands = [c for c in cands if c]
    if not cands:
        raise ConfigError("bench transpose: the probe gave no bandwidth to fit the tile model against")
    return min(cands) * 1e9


def _run_rank(world: Any, args: argparse.Namespace) -> int:
    from .. import probe
    from . import _driver as drv

    if world.size < 2:
        raise ConfigError(f"bench transpose needs at least 2 ranks, this job has {world.size} (-n 2 or more)")
    sizes, iters, warmup = drv.sizes_and_counts(args, quick_sizes="64K,1M", quick_iters=20, quick_warmup=2)
    cpu = not world.backend.runs_kernels  # host copies: smaller sizes keep the job short
    if cpu:
        sizes = [s for s in sizes if s <= _CPU_MAX] or [64 << 10]
    dtypes = _parse_dtypes(args.dtypes)
    loop = max(1, args.loop)
    model_bytes = _model_bytes(args)
    if cpu and model_bytes:
        model_bytes = min(model_bytes, 1 << 20)
    if args.quick and model_bytes:
        model_bytes = min(model_bytes, 1 << 20)
    results = drv.Results("transpose", world)
    drv.progress("transpose: measuring the floor (probe)")
    results.floor = probe.measure(world, quick=True, pairs=[(0, 1), (1, 0)])
    results.meta.update(dtypes=dtypes, iters=iters, warmup=warmup, loop=loop, model_bytes=model_bytes,
                        sm_budget=world.sm_budget, launched_by=world.launched_by)
    bench = _Bench(world, max([*sizes, model_bytes]), iters, warmup, loop, results)
    try:
        for dtype in dtypes:
            for nbytes in sizes:
                bench.case(dtype, nbytes)
            if model_bytes:
                bench.model(dtype, model_bytes, _floor_bandwidth(results.floor, world.rank))
    finally:
        bench.close()
    if world.rank == 0:
        model_rows = [r for r in results.rows if r["impl"] == "model"]

        def text() -> None:
            drv.print_table([r for r in results.rows if r["impl"] != "model"],
                            ["impl", "dtype", "bytes", "rows", "cols", "tile", "time_us", "time_min_us",
                             "throughput_GBps", "vs_contiguous", "predicted_GBps"],
                            "transpose: one put per rank per cycle (median)", args)
            if model_rows:
                drv.print_table(model_rows, ["dtype", "bytes", "tile", "predicted_GBps", "measured_GBps", "error_pct",
                                             "in_fit", "pick"],
                                "tile model: predicted against measured bandwidth per tile shape", args)
                for note in results.meta.get("models", {}).values():
                    print(f"model {note['dtype']}: {note['constants']}; picks {note['pick']}, measured best "
                          f"{note['best']}; worst error {note['worst_error_pct']:.1f}%")

        def draw(path: str) -> None:
            rows = [dict(r, series=f"{r['impl']} {r['dtype']}") for r in results.rows
                    if r["impl"] != "model" and r.get("throughput_GBps")]
            panels = [drv.panel(rows, "bytes", "throughput_GBps", "series",
                                f"transposing put vs contiguous put ({world.backend.name}, {world.size} ranks)",
                                "block bytes", "GB/s (median)")]
            if model_rows:
                panels.append(drv.panel(model_rows, "predicted_GBps", "measured_GBps", "dtype",
                                        "tile model: predicted vs measured per tile", "predicted GB/s",
                                        "measured GB/s", logx=False, logy=False))
            drv.figure(path, panels)

        drv.finish(results, args, text, draw)
    world.barrier()
    return 0


def _pattern(xp: Any, nbytes: int, rank: int, salt: int) -> Any:
    """Deterministic bytes (the same on every rank for a given rank and salt, numpy or cupy)."""
    words = (nbytes + 3) // 4
    i = xp.arange(words, dtype=xp.uint64)
    v = (i * np.uint64(2654435761) + np.uint64((rank + 1) * 40503 + salt * 97)) & np.uint64(0xFFFFFFFF)
    return v.astype(xp.uint32).view(xp.uint8)[:nbytes]


class _Bench:
    def __init__(self, world: Any, biggest: int, iters: int, warmup: int, loop: int, results: Any) -> None:
        from .. import rma

        self.world, self.iters, self.warmup, self.loop, self.results = world, iters, warmup, loop, results
        self.rma = rma
        self.right, self.left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
        self.region = -(-biggest // 4096) * 4096
        self.src, self.dst, self.stage = 0, self.region, 2 * self.region
        self.win = rma.window_alloc(world, 3 * self.region)
        self.salt = 0

    def close(self) -> None:
        self.win.free()

    def _shape(self, dtype: str, nbytes: int) -> tuple[int, int]:
        es = np.dtype(dtype).itemsize
        side = 1 << max(0, int(math.log2(max(1, nbytes // es))) // 2)
        return max(1, nbytes // es // side), side

    def _fill(self, nbytes: int) -> None:
        self.salt += 1
        self.win.local[self.src: self.src + nbytes] = _pattern(self.world.xp, nbytes, self.world.rank, self.salt)

    def _time(self, cycle) -> tuple[float, float]:
        """(median, min) seconds of one cycle: samples of `loop` cycles, the slowest rank of each."""
        for _ in range(self.warmup):
            cycle()
        samples = []
        for _ in range(max(1, self.iters // self.loop)):
            self.world.barrier()
            t0 = time.perf_counter()
            for _ in range(self.loop):
                cycle()
            samples.append((time.perf_counter() - t0) / self.loop)
        slowest = [max(c) for c in zip(*self.world.allgather_object(samples), strict=True)]
        return statistics.median(slowest), min(slowest)

    def _verify(self, dtype: str, rows: int, cols: int, transposed: bool, what: str) -> None:
        xp = self.world.xp
        es = np.dtype(dtype).itemsize
        nbytes = rows * cols * es
        word = {4: xp.uint32, 8: xp.uint64, 16: xp.uint64}[es]
        per = es // np.dtype(word).itemsize
        sent = _pattern(xp, nbytes, self.left, self.salt).view(word).reshape(rows, cols, per)
        got = self.win.local[self.dst: self.dst + nbytes].view(word)
        want = sent.transpose(1, 0, 2).reshape(-1) if transposed else sent.reshape(-1)
        if not bool((got == want).all()):
            raise RmaError(f"bench transpose: rank {self.world.rank} received wrong bytes from rank {self.left} "
                           f"({what}, {rows} x {cols} {dtype})")

    def _queue(self, handle: Any):
        q = self.rma.Queue.alloc(self.win)
        q.push(handle)
        q.add_origin(self.left)
        q.commit()
        return q

    def _transpose_queue(self, dtype: str, rows: int, cols: int, tile: tuple[int, int] | None = None):
        return self._queue(self.rma.declare_transpose_write(self.win, self.dst, rows, self.win, self.src, cols, rows,
                                                            cols, dtype, self.right, tile=tile))

    @staticmethod
    def _chosen_tile(q: Any) -> str:
        """The tile the window's module committed for the queue's one transposing put ("whole": one copy, no tiles)."""
        tile = q.describe()["transposes"][0]["tile"]
        return "whole" if tile is None else f"{tile[0]}x{tile[1]}"

    @staticmethod
    def _cycle(q: Any, before=None):
        def cycle() -> None:
            if before is not None:
                before()
            q.start()
            q.wait()
        return cycle

    def _row(self, impl: str, dtype: str, rows: int, cols: int, times: tuple[float, float], **extra: Any) -> dict:
        nbytes = rows * cols * np.dtype(dtype).itemsize
        med, best = times
        return self.results.add(impl=impl, dtype=dtype, bytes=nbytes, rows=rows, cols=cols, time_us=med * 1e6,
                                time_min_us=best * 1e6, throughput_GBps=nbytes / med / 1e9, **extra)

    def case(self, dtype: str, nbytes: int) -> None:
        from . import _driver as drv

        rows, cols = self._shape(dtype, nbytes)
        drv.progress(f"transpose: {dtype} {rows} x {cols} ({drv.format_bytes(rows * cols * np.dtype(dtype).itemsize)})")
        rma, win = self.rma, self.win
        nbytes = rows * cols * np.dtype(dtype).itemsize
        self._fill(nbytes)
        q = self._transpose_queue(dtype, rows, cols)
        t_put = self._time(self._cycle(q))
        self._verify(dtype, rows, cols, True, "transposing put")
        tile = self._chosen_tile(q)
        q.free()
        q = self._queue(rma.declare_write(win, self.dst, win, self.src, nbytes, self.right))
        t_plain = self._time(self._cycle(q))
        self._verify(dtype, rows, cols, False, "contiguous put")
        q.free()
        xp = self.world.xp
        src = win.local[self.src: self.src + nbytes].view(xp.dtype(dtype)).reshape(rows, cols)
        stage = win.local[self.stage: self.stage + nbytes].view(xp.dtype(dtype)).reshape(cols, rows)
        local = rma.plan_local_transpose(self.world, stage, src)
        q = self._queue(rma.declare_write(win, self.dst, win, self.stage, nbytes, self.right))
        t_local = self._time(self._cycle(q, before=local))
        self._verify(dtype, rows, cols, True, "local transpose + put")
        q.free()
        self._row("transpose-put", dtype, rows, cols, t_put, tile=tile, vs_contiguous=t_plain[0] / t_put[0])
        self._row("contiguous-put", dtype, rows, cols, t_plain)
        self._row("local-transpose+put", dtype, rows, cols, t_local, vs_contiguous=t_plain[0] / t_local[0])

    def model(self, dtype: str, nbytes: int, b_ideal: float) -> None:
        from ..rma import _tile_model as tm
        from . import _driver as drv

        es = np.dtype(dtype).itemsize
        tiles = self.rma.transpose_tiles(self.world, dtype)  # the module's candidates (cpu: larger, one copy each)
        fit_tiles = tm.calibration_tiles(tiles)
        samples: dict[tuple, tm.Sample] = {}
        for size in (nbytes, max(es * 64, nbytes // 4)):  # a second size pins t0; both with many tiles
            rows, cols = self._shape(dtype, size)
            for tile in tiles if size == nbytes else fit_tiles[:2]:
                drv.progress(f"transpose: model {dtype} {rows} x {cols} tile {tile[0]}x{tile[1]}")
                self._fill(rows * cols * es)
                q = self._transpose_queue(dtype, rows, cols, tile=tile)
                med, _ = self._time(self._cycle(q))
                self._verify(dtype, rows, cols, True, f"tile {tile}")
                q.free()
                samples[(size, tile)] = tm.Sample(tile, es, rows, cols, med)
        fit_set = [s for (size, tile), s in samples.items() if tile in fit_tiles]
        model = tm.fit(fit_set, b_ideal)
        rows, cols = self._shape(dtype, nbytes)
        pick = tm.rank_tiles(model, tiles, es, rows, cols)[0][0]
        measured = {tile: s for (size, tile), s in samples.items() if size == nbytes}
        best = min(measured, key=lambda t: measured[t].seconds)
        worst = 0.0
        for (size, tile), s in samples.items():
            meas = s.rows * s.cols * es / s.seconds
            pred = model.bandwidth(tile, es, s.rows, s.cols)
            err = 100.0 * (pred / meas - 1.0)
            worst = max(worst, abs(err))
            self.results.add(impl="model", dtype=dtype, bytes=s.rows * s.cols * es, rows=s.rows, cols=s.cols,
                             tile=f"{tile[0]}x{tile[1]}", predicted_GBps=pred / 1e9, measured_GBps=meas / 1e9,
                             error_pct=err, in_fit=s in fit_set, pick=tile == pick and size == nbytes)
        for r in self.results.rows:  # the model's prediction beside each measured transposing put
            if r["impl"] == "transpose-put" and r["dtype"] == dtype and "x" in str(r.get("tile")):
                m, n = (int(v) for v in r["tile"].split("x"))
                r["predicted_GBps"] = model.bandwidth((m, n), es, r["rows"], r["cols"]) / 1e9
        self.results.meta.setdefault("models", {})[dtype] = {
            "dtype": dtype, "constants": model.describe(), "fitted": model.as_dict(),
            "pick": f"{pick[0]}x{pick[1]}", "best": f"{best[0]}x{best[1]}", "worst_error_pct": worst,
            "b_ideal_from": "probe floor of this run"}


__all__ = ["add_arguments", "run"]
