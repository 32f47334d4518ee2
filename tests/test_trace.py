"""The tracer: record layout, merge on one time base, Chrome JSON, overlap, waveform, clock sync,
and the Tracer's lifecycle. Kernels of the GPU tests are in tests/kernels/trace_user.cu."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import NVCC_TIMEOUT_S

import circuslink as cl
from circuslink import trace as cl_trace
from circuslink.trace import (
    COMPUTE,
    CREDITS,
    KERNEL,
    RECV,
    SEND,
    USER,
    ClockSample,
    Trace,
    Tracer,
    interval_overlap_fraction,
    union_intervals,
)
from circuslink.trace import _layout as L

B, E, I = L.PHASE_BEGIN, L.PHASE_END, L.PHASE_INSTANT
USER_KERNELS = Path(__file__).with_name("kernels") / "trace_user.cu"


def _recs(rows):
    """(time_ns, event, phase, arg[, block]) tuples -> records as the device writes them."""
    out = np.zeros(len(rows), dtype=L.RECORD_DTYPE)
    for i, row in enumerate(rows):
        t, ev, ph, arg, *blk = row
        out[i] = (t, ev | (ph << L.PHASE_SHIFT), blk[0] if blk else 0, arg)
    return out


def _synthetic() -> Trace:
    rank0 = _recs([(1000, KERNEL, B, 0), (1500, SEND, B, 3), (2500, SEND, E, 3), (2600, CREDITS, I, 3),
                   (5000, KERNEL, E, 0)])
    # rank 1's clock runs 10 us ahead of rank 0's
    rank1 = _recs([(11_800, RECV, B, 4), (12_900, RECV, E, 4), (12_950, USER + 1, I, 42)])
    clock = {0: [ClockSample(0, 0, 0)], 1: [ClockSample(12_000, 10_000, 50)]}
    return Trace.from_records([rank0, rank1], clock, names={USER + 1: "halo"}, dropped={1: 7})


def test_synthetic_stream_gives_the_expected_chrome_json(tmp_path):
    trace = _synthetic()
    path = trace.export_chrome(tmp_path / "t.json")
    got = json.loads(open(path).read())

    def meta(name, pid, tid, args):
        return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}

    def ev(name, pid, tid, ts, dur=None, arg=0, block=0):
        e = {"name": name, "cat": "circuslink", "pid": pid, "tid": tid, "ts": ts}
        if dur is None:
            e.update(ph="i", s="t")
        else:
            e.update(ph="X", dur=dur)
        e["args"] = {"arg": arg, "block": block}
        return e

    expected = {
        "traceEvents": [
            meta("process_name", 0, 0, {"name": "rank 0"}),
            meta("process_sort_index", 0, 0, {"sort_index": 0}),
            meta("thread_name", 0, 1, {"name": "kernel"}),
            meta("thread_sort_index", 0, 1, {"sort_index": 1}),
            meta("thread_name", 0, 2, {"name": "send ch 3"}),
            meta("thread_sort_index", 0, 2, {"sort_index": 2}),
            meta("thread_name", 0, 3, {"name": "credits ch 3"}),
            meta("thread_sort_index", 0, 3, {"sort_index": 3}),
            meta("process_name", 1, 0, {"name": "rank 1"}),
            meta("process_sort_index", 1, 0, {"sort_index": 1}),
            meta("thread_name", 1, 1, {"name": "recv ch 4"}),
            meta("thread_sort_index", 1, 1, {"sort_index": 1}),
            meta("thread_name", 1, 2, {"name": "halo"}),
            meta("thread_sort_index", 1, 2, {"sort_index": 2}),
            ev("kernel", 0, 1, 0.0, dur=4.0),
            ev("send", 0, 2, 0.5, dur=1.0, arg=3),
            ev("recv", 1, 1, 0.8, dur=1.1, arg=4),
            ev("credits", 0, 3, 1.6, arg=3),
            ev("halo", 1, 2, 1.95, arg=42),
        ],
        "displayTimeUnit": "ns",
        "otherData": {
            "time_base": "rank 0's clock; ts 0 = the earliest event",
            "t0_ns": 1000,
            "clock_residual_ns": {"0": 0, "1": 50},
            "dropped": {"0": 0, "1": 7},
            "unmatched": 0,
            "timer_tick_ns": {"0": 100, "1": 50},  # gcd of each rank's raw timestamp steps
        },
    }
    assert got == expected


def test_merge_applies_known_offsets_and_drift(rng):
    true = np.sort(rng.integers(1_000_000, 9_000_000, size=(3, 40)), axis=1)  # reference-clock times
    # rank 1 a little behind or ahead (local times stay >= 0), rank 2 far ahead
    offsets = [0, int(rng.integers(-900_000, 5_000_000)), int(rng.integers(10**12, 2 * 10**12))]
    raw = [_recs([(int(t) + offsets[r], SEND, I, r) for t in true[r]]) for r in range(3)]
    clock = {r: [ClockSample(0, offsets[r], 0)] for r in range(3)}
    trace = Trace.from_records(raw, clock)
    t0 = int(true.min())
    for r in range(3):
        got = np.sort(trace.events["time_ns"][trace.events["rank"] == r])
        assert np.array_equal(got, true[r] - t0)
    assert np.all(np.diff(trace.events["time_ns"]) >= 0)
    assert trace.meta.t0_ns == t0

    # A clock that drifts linearly between two sync samples is straightened out.
    local = np.array([1_000, 500_000, 1_000_000], dtype=np.int64)
    drift = [ClockSample(0, 100, 5), ClockSample(1_000_000, 1100, 5)]  # 1 ns per us
    trace = Trace.from_records([_recs([]), _recs([(int(t), RECV, I, 0) for t in local])], {1: drift})
    aligned = trace.events["time_ns"] + trace.meta.t0_ns
    assert aligned.tolist() == [1_000 - 101, 500_000 - 600, 1_000_000 - 1100]


def test_overlap_on_known_intervals():
    assert union_intervals([(5, 9), (0, 2), (1, 3), (9, 10)]).tolist() == [[0, 3], [5, 10]]
    assert interval_overlap_fraction([(0, 10)], [(5, 15)]) == pytest.approx(5 / 15)
    assert interval_overlap_fraction([(0, 10)], [(0, 10)]) == 1.0
    assert interval_overlap_fraction([(0, 4)], [(6, 9)]) == 0.0
    assert interval_overlap_fraction([], []) == 0.0
    # several pieces on both sides: A = [0,4)+[6,10), B = [2,8) -> A&B = 4, A|B = 10
    assert interval_overlap_fraction([(0, 4), (6, 10)], [(2, 8)]) == pytest.approx(0.4)

    rank1 = _recs([(100, RECV, B, 1), (300, SEND, B, 2), (400, RECV, E, 1), (700, SEND, E, 2),
                   (900, RECV, B, 1), (1000, RECV, E, 1)])
    trace = Trace.from_records([_recs([(0, KERNEL, I, 0)]), rank1])
    assert trace.intervals(1, "recv").tolist() == [[100, 400], [900, 1000]]
    # recv = [100,400]+[900,1000], send = [300,700]: overlap 100 of union 700
    assert trace.overlap_fraction(1, "recv", "send") == pytest.approx(100 / 700)
    assert trace.overlap_fraction(1, [RECV], [SEND]) == pytest.approx(100 / 700)


def test_instants_form_bursts_and_pairs_nest():
    rows = [(t, SEND, I, 0) for t in (0, 10, 20, 30, 1000, 1010, 1020)]
    rows += [(5, COMPUTE, B, 0), (6, COMPUTE, B, 0), (8, COMPUTE, E, 0), (9, COMPUTE, E, 0)]
    rows += [(50, RECV, E, 9), (60, RECV, B, 8)]  # an end without begin, a begin without end
    trace = Trace.from_records([_recs(rows)])
    assert trace.intervals(0, SEND).tolist() == [[0, 30], [1000, 1020]]
    assert trace.intervals(0, SEND, gap_ns=1000).tolist() == [[0, 1020]]
    spans = [(s.start, s.end) for s in trace.spans(0) if s.event == COMPUTE]
    assert sorted(spans) == [(5, 9), (6, 8)]  # LIFO pairing
    assert trace.meta.unmatched == 2


def test_span_shorter_than_the_timer_tick_stays_a_span():
    trace = Trace.from_records([_recs([(100, RECV, B, 1), (100, RECV, E, 1)])])
    chrome = [e for e in trace.to_chrome()["traceEvents"] if e["ph"] != "M"]
    assert chrome == [{"name": "recv", "cat": "circuslink", "pid": 0, "tid": 1, "ts": 0.0, "ph": "X",
                       "dur": 0.0, "args": {"arg": 1, "block": 0}}]


def test_unknown_event_name_is_a_clear_error():
    trace = _synthetic()
    with pytest.raises(cl.ConfigError, match="unknown trace event 'bogus'"):
        trace.intervals(0, "bogus")
    with pytest.raises(cl.ConfigError, match="rank 5 is out of range"):
        trace.overlap_fraction(5, "send", "recv")
    assert trace.intervals(1, "halo").tolist() == []  # a lone instant is no activity


def test_waveform_png_is_written(tmp_path, rng):
    pytest.importorskip("matplotlib")
    rows0, rows1 = [], []
    t = 0
    for _ in range(20):
        d = int(rng.integers(100, 1000))
        rows0 += [(t, SEND, B, 0), (t + d, SEND, E, 0)]
        rows1 += [(t + 50, RECV, B, 0), (t + d + 80, RECV, E, 0), (t + 60, SEND, B, 1), (t + d + 90, SEND, E, 1)]
        t += d + int(rng.integers(10, 400))
    trace = Trace.from_records([_recs(rows0), _recs(rows1)])
    path = trace.plot_waveform(tmp_path / "w.png")
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert 0.5 < trace.overlap_fraction(1, "recv", "send") <= 1.0


def test_cpu_tracer_single_rank_drops_and_counts(tmp_path):
    world = cl.init(backend="cpu")
    try:
        assert world.backend_module("circuslink.trace") is cl_trace._cpu
        tr = Tracer(world, capacity=16, names={USER + 2: "fft"})
        assert world.resources(Tracer) == [tr]
        assert tr.dropped == 0
        with tr.span(USER + 2, 5):
            for k in range(20):
                tr.instant(SEND, k)
        trace = tr.collect()
        assert tr.dropped == 6  # 22 attempted, 16 kept
        assert trace.meta.dropped == {0: 6}
        # the ring keeps the first 16 in order: begin fft, then sends 0..14 (the end was dropped)
        args = [int(a) for a in trace.events["arg"]]
        assert args == [5] + list(range(15))
        assert trace.meta.unmatched == 1
        with pytest.raises(cl.ConfigError, match="device_handle"):
            tr.device_handle()
        with pytest.raises(cl.ConfigError, match="capacity"):
            Tracer(world, capacity=0)
        with pytest.raises(cl.ConfigError, match="out of range"):
            tr.record(0)
        tr.reset()
        assert tr.dropped == 0
        tr.export_chrome(str(tmp_path / "one.json"))
        tr.close()
        tr.close()  # idempotent
        assert tr.closed and world.resources(Tracer) == []
        for call, name in [(tr.collect, "collect"), (lambda: tr.instant(SEND), "record"), (tr.reset, "reset")]:
            with pytest.raises(cl.ConfigError) as info:
                call()
            assert str(info.value) == f"{name}: this tracer is closed"
        assert tr.export_chrome(str(tmp_path / "kept.json"))  # the last trace outlives the tracer
        with Tracer(world) as scoped:
            scoped.instant(USER, 1)
            assert scoped.collect().events["arg"].tolist() == [1]
        assert scoped.closed
        left_open = Tracer(world)
    finally:
        world.close()
    assert left_open.closed  # world.close() closes what the program left open


def test_event_ids_match_the_header_and_the_kernels_compile(tmp_path):
    """The event and phase numbers agree with trace_types.cuh (the layouts are checked in test_abi.py), and
    the GPU tests' kernels compile with nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    src = tmp_path / "ids.cu"
    src.write_text(f"""
        #include "{USER_KERNELS}"
        static_assert(tr::SEND == {SEND} && tr::RECV == {RECV} && tr::CREDITS == {CREDITS}, "ids");
        static_assert(tr::KERNEL == {KERNEL} && tr::COMPUTE == {COMPUTE} && tr::USER == {USER}, "ids");
        static_assert(tr::MAX_EVENT == {L.MAX_EVENT} && tr::PHASE_SHIFT == {L.PHASE_SHIFT}, "ids");
        static_assert(tr::PHASE_INSTANT == {I} && tr::PHASE_BEGIN == {B} && tr::PHASE_END == {E}, "phases");
    """)
    proc = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{cl.include_dir()}", "-c", str(src),
                           "-o", str(tmp_path / "ids.o")], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


def test_null_handle_is_the_handle_layout_zeroed():
    h = Tracer.null_handle()
    assert h.dtype == L.HANDLE.dtype and h.dtype.itemsize == 24 and h.tobytes() == bytes(24)


def test_clock_sync_times_out_naming_the_silent_rank(spmd):
    """One Deadline bounds the whole sync: a peer that never answers ends it with its name."""
    job = spmd(2, """
        import circuslink as cl
        from circuslink._wait import Deadline
        from circuslink.trace._cpu import ClockSync
        w = cl.init()
        sync = ClockSync(w, lambda: 0)
        if w.rank == 0:
            try:
                sync.sync(Deadline.after(0.5))
            except cl.TimeoutError as exc:
                print("error:", exc)
        else:
            w.barrier()  # the first pair's barrier, then silence: rank 0's ping is never answered
        w.barrier()
        sync.close(None)
        w.close()
    """).check()
    assert ("error: trace clock sync: rank 1 did not answer rank 0's ping 0: timed out after 0.5 s "
            "(CIRCUSLINK_TIMEOUT sets the limit)") in job.stdout


def test_clock_sync_and_merge_across_ranks(spmd, tmp_path):
    out = tmp_path / "trace"
    job = spmd(3, f"""
        import json, time
        import numpy as np
        import circuslink as cl
        from circuslink.trace import Tracer, SEND, RECV, USER

        w = cl.init()
        # Skew each rank's clock by a different, large amount: the sync must find it.
        skew = w.rank * 1_000_000_000 + w.rank * 7_777
        tr = Tracer(w, capacity=64, names={{USER: "work"}}, _clock_ns=lambda: time.perf_counter_ns() + skew)
        for step in range(3):
            if w.rank == step % w.size:
                tr.instant(SEND, step)
            w.barrier()  # causal order: step's SEND happens before anything after the barrier
            if w.rank == (step + 1) % w.size:
                tr.instant(RECV, step)
            w.barrier()
        with tr.span(USER, w.rank):
            time.sleep(0.002)
        trace = tr.collect()
        for r in range(w.size):
            s = trace.meta.clock[r][0]
            true = r * 1_000_000_000 + r * 7_777
            assert abs(s.offset_ns - true) <= s.residual_ns, (r, s, true)
            assert s.residual_ns < 50_000_000, s  # loose: 2 shared cores; printed below
        ev = trace.events
        for step in range(3):
            t_send = int(ev["time_ns"][(ev["event"] == SEND) & (ev["arg"] == step)][0])
            recv_rank = (step + 1) % w.size
            t_recv = int(ev["time_ns"][(ev["event"] == RECV) & (ev["arg"] == step)][0])
            assert t_recv >= t_send - trace.meta.residual_ns(recv_rank) - trace.meta.residual_ns(step % w.size)
        spans = [s for s in trace.spans() if s.event == USER]
        assert sorted(s.rank for s in spans) == [0, 1, 2]
        assert all(s.end - s.start >= 2_000_000 for s in spans)
        if w.rank == 0:
            trace.export_chrome("{out}.json")
            trace.plot_waveform("{out}.png")
            print("residuals", [trace.meta.residual_ns(r) for r in range(w.size)])
        tr.close()
        w.close()
    """).check()
    data = json.loads(open(f"{out}.json").read())
    pids = {e["pid"] for e in data["traceEvents"]}
    assert pids == {0, 1, 2}
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert {"send ch 0", "recv ch 0", "work"} <= names
    assert open(f"{out}.png", "rb").read(4) == b"\x89PNG"
    assert "residuals" in job.stdout


@pytest.mark.gpu
def test_gpu_kernel_records_and_ranks_merge(spmd, tmp_path):
    out = tmp_path / "gpu"
    spmd(2, f"""
        import numpy as np, cupy as cp
        import circuslink as cl
        from circuslink.trace import Tracer, COMPUTE, CREDITS, KERNEL, USER
        w = cl.init()
        mod = cl.compile(open({str(USER_KERNELS)!r}).read())
        k = mod.get_function("traced")
        x = cp.zeros(4 * 64, dtype=cp.float32)
        tr = Tracer(w, capacity=1000)
        assert w.resources(Tracer) == [tr]
        k((4,), (64,), (tr.device_handle(), np.uint32(10), x), stream=w.backend.stream)
        trace = tr.collect()
        ev = trace.events
        mine = ev[ev["rank"] == w.rank]
        # 4 blocks x 2 warps x 10 steps x 2 + 4 blocks x 2 kernel events
        assert len(mine) == 4 * 2 * 10 * 2 + 8, len(mine)
        assert trace.meta.unmatched == 0
        comp = [s for s in trace.spans(w.rank) if s.event == COMPUTE]
        assert len(comp) == 80 and all(s.end >= s.start for s in comp)
        kern = [s for s in trace.spans(w.rank) if s.event == KERNEL]
        assert sorted(s.block for s in kern) == [0, 1, 2, 3]
        print("residual", w.rank, trace.meta.residual_ns(1))
        # drop-and-count: a ring of 10 keeps 10 and counts the rest
        with Tracer(w, capacity=10) as small:
            k((4,), (64,), (small.device_handle(), np.uint32(10), x), stream=w.backend.stream)
            t2 = small.collect()
        assert t2.meta.dropped[w.rank] == 168 - 10 and int((t2.events["rank"] == w.rank).sum()) == 10
        k((1,), (32,), (Tracer.null_handle(), np.uint32(3), x), stream=w.backend.stream)  # untraced
        # 2-D blocks: record_block records once per block, begin / end / instant from one thread
        tr.reset()
        mod.get_function("every_call")((3,), (8, 4), (tr.device_handle(),), stream=w.backend.stream)
        t3 = tr.collect()
        e3 = t3.events[t3.events["rank"] == w.rank]
        assert sorted(e3["block"][e3["event"] == USER + 2].tolist()) == [0, 1, 2]
        assert sorted(e3["block"][e3["event"] == CREDITS].tolist()) == [0, 1, 2]
        assert len([s for s in t3.spans(w.rank) if s.event == USER + 3]) == 3 and t3.meta.unmatched == 0
        if w.rank == 0:
            trace.export_chrome("{out}.json")
        w.close()  # closes tr
        assert tr.closed
    """, backend="cuda").check()


def _quantised_b_stream(rng, pipelined: bool, tick: int = 128, blocks: int = 8, chunks: int = 8, reps: int = 5):
    """B's RECV / SEND instants (one per chunk, per block) as a coarse %globaltimer stamps them:
    every time rounded down to ``tick``, so most instants share their timestamp with others."""
    rows = []
    for rep in range(reps):
        t_rep = rep * 40_000 + int(rng.integers(0, 1000))
        for g in range(blocks):
            t = t_rep + int(rng.integers(0, 300))
            if pipelined:  # read chunk k, add, write chunk k, read chunk k + 1 ...
                for _ in range(chunks):
                    t += int(rng.integers(700, 1100))
                    rows.append((t, RECV, I, 2, g))
                    rows.append((t + int(rng.integers(300, 500)), SEND, I, 3, g))
            else:  # store and forward: every chunk in, then every chunk out
                for k in range(chunks):
                    rows.append((t + 150 * k, RECV, I, 2, g))
                for k in range(chunks):
                    rows.append((t + 150 * chunks + 1500 + 150 * k, SEND, I, 3, g))
    rows.sort(key=lambda r: r[0])
    return [(tm // tick * tick, *rest) for tm, *rest in rows]


def test_overlap_survives_a_coarse_timer(rng):
    """The GPU trace of the 32 KiB allreduce-like run gave B's overlap 0.0: with a 128 ns timer the
    median step between instants was 0, so the burst gap was 0 and every burst vanished."""
    a = _recs([(0, KERNEL, I, 0)])
    # 48 blocks (the bench's pairs) stamp ~400 instants per repetition into ~60 ticks
    piped = Trace.from_records([a, _recs(_quantised_b_stream(rng, pipelined=True, blocks=48))])
    assert piped.meta.tick(1) % 128 == 0
    assert piped.to_chrome()["otherData"]["timer_tick_ns"]["1"] == piped.meta.tick(1)
    recv = piped.intervals(1, "recv")
    assert len(recv) == 5  # one burst per repetition, none lost, none merged across repetitions
    assert 0.6 < piped.overlap_fraction(1, "recv", "send") <= 1.0
    stored = Trace.from_records([a, _recs(_quantised_b_stream(rng, pipelined=False))])
    assert stored.overlap_fraction(1, "recv", "send") < 0.15  # store-and-forward scores ~0


def test_instants_within_one_tick_are_one_tick_of_activity():
    # a 1024 ns timer: three sends in one tick, a lone compute instant, a span shorter than the tick
    rows = [(1024, SEND, I, 0)] * 3 + [(6144, COMPUTE, I, 0), (9216, RECV, B, 1), (9216, RECV, E, 1)]
    trace = Trace.from_records([_recs(rows)])  # times become relative to the first event (1024)
    assert trace.meta.tick(0) == 1024
    assert trace.intervals(0, SEND).tolist() == [[0, 1024]]
    assert trace.intervals(0, COMPUTE).tolist() == []  # a lone instant is no activity
    assert trace.intervals(0, RECV).tolist() == [[8192, 9216]]
