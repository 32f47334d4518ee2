"""One rule for outputs, the same in info, route, probe and every bench: ``--json FILE`` and ``--plot FILE``
write exactly FILE (``-``, or ``--json`` alone, is standard output), the folder is checked before any work and
never created, and nothing is written unless asked for. Tables print plain byte counts with ``--bytes`` and CSV
with ``--csv``."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from circuslink.bench import _driver as drv


def _cli(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, CIRCUSLINK_TIMEOUT="60", CIRCUSLINK_BACKEND="cpu")
    return subprocess.run([sys.executable, "-m", "circuslink", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


PINGPONG = ("bench", "pingpong", "--quick", "--sizes", "8,64", "--no-baselines")
# a bench whose report comes from jobs of its own (one rank, then two)
STENCIL = ("bench", "stencil", "--quick", "--domains", "12x10", "--impls", "host,channel-persistent",
           "--dtypes", "float32")
COMMANDS = {
    "info": ("info",),
    "route": ("route", "show", "ring:4"),
    "probe": ("probe", "--quick"),
    "bench": PINGPONG,
    "stencil": STENCIL,
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_json_to_a_missing_folder_is_refused_before_any_work(tmp_path, name):
    target = tmp_path / "absent" / "x.json"
    proc = _cli(tmp_path, *COMMANDS[name], "--json", str(target), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # refused when the command line was read: not a table printed first
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and f"folder {str(target.parent)!r} does not exist (it is not created)" in errors[0]
    assert not target.parent.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.parametrize("form", [("--json", "-"), ("--json",)])
def test_json_to_stdout_is_the_only_thing_on_stdout(tmp_path, name, form):
    args = COMMANDS[name]
    # --json alone before a positional argument would take it as the file: put it last
    proc = _cli(tmp_path, *args, *form)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict) and doc
    assert os.listdir(tmp_path) == []  # no file named '-', no default results file


@pytest.mark.parametrize("bench", [PINGPONG, STENCIL], ids=["pingpong", "stencil"])
def test_bench_writes_nothing_unless_asked(tmp_path, bench):
    proc = _cli(tmp_path, *bench)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert bench[1] in proc.stdout and "wrote" not in proc.stdout and "results:" not in proc.stdout
    assert "MISSED" not in proc.stdout  # no verdict on GPU targets for rows a cpu run skips
    assert os.listdir(tmp_path) == []


def test_json_and_plot_write_exactly_their_files(tmp_path):
    pytest.importorskip("matplotlib")
    out, plot = tmp_path / "r", tmp_path / "p.png"
    proc = _cli(tmp_path, *PINGPONG, "--json", str(out), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["p.png", "r"]
    assert json.loads(out.read_text())["benchmark"] == "pingpong"
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {plot}" in proc.stdout and f"wrote {out}" in proc.stdout


def test_plot_to_a_folder_is_refused(tmp_path):
    proc = _cli(tmp_path, *PINGPONG, "--plot", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "is a folder, not a file" in proc.stderr and proc.stdout == ""


def test_route_json_file_and_text(tmp_path):
    proc = _cli(tmp_path, "route", "show", "ring:4", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0 and "ring:4" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())


def test_csv_and_plain_bytes_tables(tmp_path):
    proc = _cli(tmp_path, *PINGPONG, "--csv", "--bytes")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("impl,bytes,"))
    assert lines[start - 1].startswith("# pingpong")
    end = lines.index("", start)
    table = list(csv.DictReader(io.StringIO("\n".join(lines[start:end]))))
    rows = [r for r in table if r["bytes"].isdigit()]
    assert {int(r["bytes"]) for r in rows} >= {8, 64}
    assert all(float(r["one_way_us"]) > 0 for r in rows if r["one_way_us"])


def test_stencil_tables_take_csv(tmp_path):
    proc = _cli(tmp_path, *STENCIL, "--csv")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("impl,dtype,domain,"))
    table = list(csv.DictReader(io.StringIO("\n".join(lines[start:lines.index("", start)]))))
    assert {(r["impl"], r["nranks"]) for r in table if r["time_per_iter_us"]} == {("host", "1"), ("host", "2")}


def test_format_table_options():
    rows = [{"impl": "a", "bytes": 65536, "t": 1.5}, {"impl": "b", "bytes": 8, "skipped": "no GPU"}]
    opts = type("O", (), {"plain_bytes": True, "csv": False})()
    text = drv.format_table(rows, ["impl", "bytes", "t"], "title", opts)
    assert "65536" in text and "64 KiB" not in text and "skipped b: no GPU" in text
    assert "64 KiB" in drv.format_table(rows, ["impl", "bytes", "t"], "title")
    opts.csv = True
    got = list(csv.reader(io.StringIO(drv.format_table(rows, ["impl", "bytes", "t"], "title", opts))))
    assert got == [["# title"], ["impl", "bytes", "t", "skipped"], ["a", "65536", "1.5"], ["b", "8", "", "no GPU"]]


def test_a_headline_row_that_repeats_a_form_row_is_printed_once():
    """On the cpu the one form measured is also the headline row: one measurement, one line."""
    rows = [{"impl": "circuslink", "bytes": 8, "one_way_us": 12.5}, {"impl": "circuslink-host", "bytes": 8,
                                                                     "one_way_us": 12.5},
            {"impl": "circuslink", "bytes": 64, "one_way_us": 13.0}, {"impl": "circuslink-warp", "bytes": 64,
                                                                      "one_way_us": 14.0},
            {"impl": "circuslink-grid", "bytes": 64, "one_way_us": 13.0}]
    text = drv.format_table(rows, ["impl", "bytes", "one_way_us"], "t")
    body = [ln.split() for ln in text.splitlines()[4:-1]]
    assert [b[0:2] for b in body] == [["circuslink", "(circuslink-host)"], ["circuslink", "(circuslink-grid)"],
                                      ["circuslink-warp", "64"]]


def test_a_benchmark_too_large_for_the_machine_is_refused_up_front(tmp_path):
    """The memory need (sizes x buffers a rank holds) is checked before any rank starts, as fft2 does."""
    proc = _cli(tmp_path, "bench", "allreduce", "--sizes", "64G", "--iters", "1", timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "2 ranks need about" in proc.stderr and "of host memory" in proc.stderr and "ask for less" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("bench", ["pingpong", "stream", "nodes"])
def test_sizes_all_beyond_what_the_cpu_runs_are_refused_up_front(tmp_path, bench):
    """These benches trim sizes the cpu reference does not run; when none is left they refuse in one line before
    any rank starts (pingpong's ranks died on max() of nothing, stream's and nodes' ran the size anyway: a 64 GiB
    buffer, a ring deeper than a channel takes)."""
    proc = _cli(tmp_path, "bench", bench, "--sizes", "64G", "--quick", timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"circuslink: error: bench {bench} --sizes 64G: the cpu back-end runs sizes up to")
    assert proc.stdout == ""
