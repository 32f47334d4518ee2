"""The shared benchmark driver: sizes, options, the results format, tables, plots, progress."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import types

import numpy as np
import pytest

import circuslink as cl
from circuslink.bench import _driver as drv

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def fake_world(backend: str = "cpu", rank: int = 0, size: int = 2, device=None):
    """A world whose back-end names its device with the real back-end's code (cupy faked by the test)."""
    from circuslink.backends.cpu import CpuBackend
    from circuslink.backends.cuda import CudaBackend

    cls = CpuBackend if backend == "cpu" else CudaBackend
    fake = types.SimpleNamespace(name=backend, device=device)
    fake.device_label = lambda n: cls.device_label(
        types.SimpleNamespace(device=device, xp=sys.modules.get("cupy")), n)
    return types.SimpleNamespace(backend=fake, rank=rank, size=size, device=device)


# -- sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", [8]),
        ("8,64,1K,4MiB", [8, 64, KiB, 4 * MiB]),
        ("1k,2m,1g", [KiB, 2 * MiB, GiB]),
        ("16B, 3KiB ,1KB", [16, 3 * KiB, KiB]),
        ("8:64", [8, 16, 32, 64]),
        ("8:100", [8, 16, 32, 64]),
        ("1K:1K", [KiB]),
        ("8:16,1M", [8, 16, MiB]),
        ("64,8:64", [64, 8, 16, 32]),  # order kept, duplicates dropped
        ("3:24", [3, 6, 12, 24]),
    ],
)
def test_parse_sizes(text, expected):
    assert drv.parse_sizes(text) == expected


def test_parse_sizes_full_range():
    sizes = drv.parse_sizes("8:256M")
    assert sizes[0] == 8 and sizes[-1] == 256 * MiB and len(sizes) == 26
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))


@pytest.mark.parametrize(
    "text, named",
    [
        ("8,abc", "'abc'"),
        ("1.5K", "'1.5K'"),
        ("8,-4", "'-4'"),
        ("0", "'0'"),
        ("4T", "'4T'"),
        ("8:", "''"),
        ("8:16:32", "'8:16:32'"),
        ("64:8", "'64:8'"),
        ("8,,16", "empty entry"),
        ("", "empty"),
    ],
)
def test_parse_sizes_errors_name_the_token(text, named):
    with pytest.raises(cl.ConfigError) as info:
        drv.parse_sizes(text)
    assert named in str(info.value)
    assert "\n" not in str(info.value)


def test_parse_sizes_accepts_a_parsed_list():
    assert drv.parse_sizes([8, 64, 8]) == [8, 64]
    with pytest.raises(cl.ConfigError, match="-3"):
        drv.parse_sizes([8, -3])


@pytest.mark.parametrize("n, text", [(8, "8 B"), (1023, "1023 B"), (KiB, "1 KiB"), (1536, "1.5 KiB"),
                                     (256 * MiB, "256 MiB"), (GiB, "1 GiB")])
def test_format_bytes(n, text):
    assert drv.format_bytes(n) == text


# -- options --------------------------------------------------------------------------------------
def test_common_arguments_defaults_and_values():
    parser = argparse.ArgumentParser()
    drv.add_common_arguments(parser, default_sizes="8:1M", default_nranks=4, trace=True)
    args = parser.parse_args([])
    assert args.sizes == "8:1M" and drv.parse_sizes(args.sizes)[-1] == MiB
    assert args.nranks == 4 and args.iters > 0 and args.warmup >= 0
    assert args.json is None and args.plot is None and args.trace is None and args.backend is None
    assert not args.quick and not args.no_baselines
    args = parser.parse_args(["--sizes", "8,64", "--iters", "7", "--warmup", "0", "--json", "r.json", "--plot",
                              "p.png", "--trace", "t.json", "--backend", "cuda", "-n", "2", "--quick",
                              "--no-baselines"])
    assert (args.sizes, args.iters, args.warmup, args.json, args.plot, args.trace, args.backend, args.nranks) == (
        "8,64", 7, 0, "r.json", "p.png", "t.json", "cuda", 2)
    assert args.quick and args.no_baselines


@pytest.mark.parametrize("argv", [["--iters", "0"], ["--iters", "x"], ["--warmup", "-1"], ["-n", "0"],
                                  ["--backend", "tpu"]])
def test_common_arguments_reject_bad_values(argv, capsys):
    parser = argparse.ArgumentParser()
    drv.add_common_arguments(parser, default_sizes="8")
    with pytest.raises(SystemExit):
        parser.parse_args(argv)


def test_sizes_and_counts_applies_quick():
    parser = argparse.ArgumentParser()
    drv.add_common_arguments(parser, default_sizes="8:256M", default_iters=1000, default_warmup=100)
    assert drv.sizes_and_counts(parser.parse_args([])) == (drv.parse_sizes("8:256M"), 1000, 100)
    assert drv.sizes_and_counts(parser.parse_args(["--quick"])) == ([8, 4 * KiB, 64 * KiB], 5, 1)
    assert drv.sizes_and_counts(parser.parse_args(["--quick", "--sizes", "1M"]), quick_iters=3) == ([MiB], 3, 1)
    assert drv.sizes_and_counts(parser.parse_args(["--quick", "--iters", "2", "--warmup", "0"]),
                                quick_sizes="16") == ([16], 2, 0)


def test_common_arguments_reject_bad_default():
    with pytest.raises(cl.ConfigError, match="'x'"):
        drv.add_common_arguments(argparse.ArgumentParser(), default_sizes="8,x")


# -- identity ------------------------------------------------------------------------------------
def test_device_label_cpu():
    label = drv.device_label(fake_world())
    assert re.fullmatch(r"cpu-[a-z0-9-]+", label)


def test_device_label_cuda_from_gpu_name_and_count(monkeypatch):
    runtime = types.SimpleNamespace(getDeviceProperties=lambda d: {"name": b"NVIDIA H200"},
                                    getDeviceCount=lambda: 2)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    assert drv.device_label(fake_world("cuda", size=2, device=0)) == "nvidia-h200-x2"
    assert drv.device_label(fake_world("cuda", size=1, device=0)) == "nvidia-h200-x1"
    runtime.getDeviceProperties = lambda d: {"name": "NVIDIA H100 80GB HBM3"}
    assert drv.device_label(fake_world("cuda", size=8, device=0)) == "nvidia-h100-80gb-hbm3-x2"


def test_git_commit_and_today(monkeypatch):
    monkeypatch.delenv("CIRCUSLINK_COMMIT", raising=False)
    commit = drv.git_commit()
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", commit)
    monkeypatch.setenv("CIRCUSLINK_COMMIT", "abc123")
    assert drv.git_commit() == "abc123"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", drv.today())


# -- results ----------------------------------------------------------------------------------------
def test_results_schema_and_json(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUSLINK_COMMIT", "deadbeef")
    rng = np.random.default_rng()
    res = drv.Results("pingpong", fake_world())
    res.floor = {"backend": "cpu", "pairs": [], "summary": {"lat_relaxed_us": float(rng.random())}}
    res.meta["channels"] = 64
    latencies = rng.random(3) * 10
    for nbytes, lat in zip([8, 64, 4096], latencies, strict=True):
        row = res.add(impl="channel", bytes=np.int64(nbytes), latency_us=np.float32(lat), hops=1)
        assert type(row["bytes"]) is int and type(row["latency_us"]) is float
    res.add(impl="nccl", bytes=8, latency_us=float("nan"), skipped="no NCCL")
    res.extend([{"impl": "mpi", "bytes": 8, "time_us": 3.5}])
    d = res.to_dict()
    assert list(d) == ["benchmark", "device", "commit", "date", "backend", "nranks", "floor", "meta", "rows"]
    assert d["benchmark"] == "pingpong" and d["commit"] == "deadbeef" and d["backend"] == "cpu"
    assert d["nranks"] == 2 and d["device"].startswith("cpu-") and d["date"] == drv.today()
    assert d["floor"]["summary"]["lat_relaxed_us"] == res.floor["summary"]["lat_relaxed_us"]
    assert d["meta"]["channels"] == 64 and "host" in d["meta"]
    assert len(d["rows"]) == 5 and d["rows"][3]["latency_us"] is None  # NaN is not JSON

    path = res.write_json(tmp_path / "out.json")
    loaded = json.loads(open(path).read())
    assert loaded == d
    assert [r["latency_us"] for r in loaded["rows"][:3]] == pytest.approx(latencies.astype(np.float32).tolist())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # written exactly there, nothing beside it


def test_results_go_exactly_where_asked(tmp_path, capfd):
    """No default file: write_json needs a path; '-' is standard output; a missing folder is never created."""
    res = drv.Results("rma", fake_world())
    with pytest.raises(TypeError):
        res.write_json()
    assert res.write_json("-") == "-"
    out = capfd.readouterr().out
    assert json.loads(out)["benchmark"] == "rma"
    with pytest.raises(cl.ConfigError, match="cannot write results"):
        res.write_json(tmp_path / "absent" / "r.json")
    assert not (tmp_path / "absent").exists()


def test_results_floor_defaults_to_none():
    assert drv.Results("x", fake_world()).to_dict()["floor"] is None


@pytest.mark.parametrize("row, field", [({"bytes": 8}, "'impl'"), ({"impl": "x"}, "'bytes'")])
def test_results_rows_need_impl_and_bytes(row, field):
    with pytest.raises(cl.ConfigError, match=field):
        drv.Results("x", fake_world()).add(**row)


def test_results_reject_unserialisable_values_and_bad_names():
    with pytest.raises(cl.ConfigError, match="object"):
        drv.Results("x", fake_world()).add(impl="a", bytes=1, extra=object())
    with pytest.raises(cl.ConfigError, match="benchmark name"):
        drv.Results("a/b", fake_world())


def test_results_write_error_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(cl.ConfigError, match="cannot write results"):
        drv.Results("x", fake_world()).write_json(blocker / "out.json")


def test_results_with_a_real_world(tmp_path):
    world = cl.init(backend="cpu")
    try:
        res = drv.Results("probe-check", world)
        res.add(impl="floor", bytes=8, latency_us=0.5)
        d = json.loads(open(res.write_json(tmp_path / "r.json")).read())
        assert d["backend"] == "cpu" and d["nranks"] == 1 and d["rows"][0]["impl"] == "floor"
    finally:
        world.close()


# -- table, plot, progress --------------------------------------------------------------------------
def test_print_table(capsys):
    rows = [
        {"impl": "channel", "bytes": 8, "latency_us": 0.6123, "throughput_GBps": 0.013},
        {"impl": "nccl", "bytes": 4 * MiB, "latency_us": 25.5, "throughput_GBps": 164.48},
        {"impl": "nvshmem-put-signal", "bytes": 64, "latency_us": 2.16},
        {"impl": "mpi", "bytes": 8, "skipped": "not started by mpirun"},
    ]
    drv.print_table(rows, ["impl", "bytes", "latency_us", "throughput_GBps"], "pingpong one-way")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pingpong one-way"
    body = [ln for ln in out if ln.startswith(("channel", "nccl", "nvshmem"))]
    assert len(body) == 3
    assert "4 MiB" in body[1] and "164.5" in body[1] and "0.612" in body[0]
    assert body[2].rstrip().endswith("-")  # a missing figure shows as '-'
    # Numbers are right-aligned: every latency ends in the same column.
    header = next(ln for ln in out if ln.startswith("impl"))
    end = header.index("latency_us") + len("latency_us")
    for line in body:
        assert line[end - 1] != " " and (len(line) == end or line[end] == " ")
    assert out[-1] == "skipped mpi: not started by mpirun"


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng()
    rows = [{"impl": impl, "bytes": 1 << k, "latency_us": float(rng.random() + k)}
            for impl in ("channel", "nccl") for k in range(3, 20)]
    rows.append({"impl": "nvshmem", "bytes": 8, "skipped": "no nvcc"})
    rows.append({"impl": "mpi", "bytes": 8, "latency_us": None})
    path = drv.plot(rows, "bytes", "latency_us", "impl", tmp_path / "lat.png", "pingpong",
                    "message size", "one-way latency (us)")
    assert path == str(tmp_path / "lat.png")
    with pytest.raises(cl.ConfigError, match="cannot write plot"):  # a folder that is not there is not made
        drv.plot(rows, "bytes", "latency_us", "impl", tmp_path / "plots" / "lat.png", "t", "x", "y")
    assert not (tmp_path / "plots").exists()
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    linear = drv.plot(rows, "bytes", "latency_us", "impl", tmp_path / "lin.png", "t", "x", "y",
                      logx=False, logy=False)
    assert open(linear, "rb").read()[:4] == b"\x89PNG"


def test_plot_without_data_is_an_error(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(cl.ConfigError, match="throughput_GBps"):
        drv.plot([{"impl": "a", "bytes": 8}], "bytes", "throughput_GBps", "impl", tmp_path / "x.png", "t", "x", "y")


def test_progress_only_on_rank_zero(monkeypatch, capsys):
    for name in ("CIRCUSLINK_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    drv.progress("sizes 8 B")
    err = capsys.readouterr().err
    assert err.endswith("sizes 8 B\n") and err.count("\n") == 1
    monkeypatch.setenv("CIRCUSLINK_RANK", "1")
    drv.progress("hidden")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("CIRCUSLINK_RANK", "0")
    drv.progress("shown")
    assert "shown" in capsys.readouterr().err


def test_results_json_has_no_nan(tmp_path):
    res = drv.Results("x", fake_world())
    res.add(impl="a", bytes=1, v=math.inf, nested={"w": [np.float64("nan"), 1]})
    text = open(res.write_json(tmp_path / "x.json")).read()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["rows"][0]["nested"]["w"] == [None, 1]


def test_trace_is_offered_only_where_a_trace_is_written(capsys):
    """--trace used to be accepted by every benchmark and ignored by pingpong and rma."""
    from circuslink.cli import build_parser

    parser = build_parser()
    for bench in ("pingpong", "rma"):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", bench, "--trace", "t.json"])
        assert "unrecognized arguments: --trace" in capsys.readouterr().err
    for bench in ("allreduce-like", "allreduce"):
        assert parser.parse_args(["bench", bench, "--trace", "t.json"]).trace == "t.json"
