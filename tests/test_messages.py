"""Messages a new user reads: whole sentences in --help, advice that fits the command it is given by, a name for
every channel a spec error mentions, examples whose options cannot be mistaken for the launcher's."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from circuslink import cli

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "tests" / "specs"


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 120):
    full = dict(os.environ, CIRCUSLINK_TIMEOUT="60")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "circuslink", *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("name,module", [(n, m) for n, m, _ in cli.COMMANDS + cli.BENCHMARKS])
def test_help_descriptions_are_whole_sentences(name, module):
    """`run --help` was cut mid-sentence: the first line of a docstring whose paragraph wraps."""
    doc = importlib.import_module(module).__doc__
    described = cli.describe(doc)
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    assert " ".join(described.split()) == paragraph
    assert described.rstrip().endswith((".", ")", ":")), described


def test_run_help_ends_its_sentence():
    proc = _cli("run", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "(by mpirun when declared nodes need a transport between them that MPI starts)." in text


def test_bench_resources_without_a_gpu_gives_advice_it_can_take():
    """--backend accepts only cuda there: the message must not send the user to --backend cpu."""
    proc = _cli("bench", "resources", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no GPU is visible" in proc.stderr and "--backend cpu" not in proc.stderr


def test_bench_fft_says_which_sizes_it_runs_on_the_cpu(capsys, monkeypatch):
    from circuslink.bench import fft

    for name in ("CIRCUSLINK_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    parser = cli.build_parser()
    from circuslink import launcher

    monkeypatch.setattr(launcher, "relaunch_self", lambda *a, **k: 0)  # the ranks' run is not this test's
    args = parser.parse_args(["bench", "fft", "--backend", "cpu"])
    cfg = fft.config_from_args(args)
    sizes2, sizes3 = fft.CPU_DEFAULT_SIZES, fft.CPU_DEFAULT_SIZES3
    assert sorted({s for s, _ in cfg.cases}) == sorted([(n, n) for n in sizes2] + [(n, n, n) for n in sizes3])
    assert capsys.readouterr().err == ""  # said once the run starts, after every refusal it could meet
    assert fft.run(args) == 0
    said = capsys.readouterr().err
    both = f"{','.join(map(str, sizes2))} (2-D) and {','.join(map(str, sizes3))} (3-D) by default"
    assert both in said and said.count("\n") == 1, said
    given = parser.parse_args(["bench", "fft", "--backend", "cpu", "--size", "64", "--dims", "2"])
    assert {s for s, _ in fft.config_from_args(given).cases} == {(64, 64)}
    assert fft.run(given) == 0 and capsys.readouterr().err == ""  # nothing defaulted: nothing to say
    proc = _cli("bench", "fft", "--help")
    assert f"the default sizes are {','.join(map(str, sizes2))} (2-D)" in " ".join(proc.stdout.split())


@pytest.mark.parametrize("edit", [
    # the first end loses its name, the second takes its ID: "also used by channel 'None'"
    lambda t: t.replace('<channel name="simple_out">', "<channel>", 1).replace("<id>1</id>", "<id>0</id>", 1),
    # the sender loses its name and the receiver's type differs: "does not match sender 'None'"
    lambda t: t.replace('<channel name="simple_out">', "<channel>", 1).replace("<type>float</type>", "<type>int</type>")
               .replace("<type>int</type>", "<type>float</type>", 1),
])
def test_spec_errors_never_name_a_channel_none(tmp_path, edit):
    spec = tmp_path / "app.xml"
    spec.write_text(edit((SPECS / "fig6.xml").read_text()))
    proc = _cli("gen", str(spec), "-o", str(tmp_path))
    assert proc.returncode == 1 and "field 'name': missing" in proc.stderr
    assert "None" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("example", ["fig6_sender_receiver", "fig2_pipeline"])
@pytest.mark.parametrize("bad", [["--elements", "0"], ["--elements", "-5"], ["--elements", "x"], ["-n", "5"]])
def test_examples_refuse_a_bad_element_count_in_one_line(example, bad):
    """-n in an example meant elements while `circuslink run -n` means ranks: examples take --elements only."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / example / "main.py"), *bad], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, CIRCUSLINK_BACKEND="cpu"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if "error:" in ln], proc.stderr


@pytest.mark.parametrize("bad", [["--iters", "0"], ["--iters", "-5"], ["--iters", "x"]])
def test_stencil_example_refuses_a_bad_step_count(bad):
    """--iters -5 ran, and reported "-5 steps ... bit-exact against numpy"."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "stencil" / "main.py"), *bad], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, CIRCUSLINK_BACKEND="cpu"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if "argument --iters" in ln], proc.stderr


@pytest.mark.parametrize("example, args, env, message", [
    ("stencil", ["--form", "launch"], {}, "--form launch runs device kernels, which the cpu back-end does not run"),
    ("stencil", ["--grid", "mesh:3x3"], {}, "open_halo: topology mesh:3x3 has 9 ranks, but the job has 1"),
    ("stencil", [], {"CIRCUSLINK_TIMEOUT": "abc"}, "CIRCUSLINK_TIMEOUT='abc' is not a number"),
    ("fig2_pipeline", [], {"CIRCUSLINK_TIMEOUT": "nan"}, "CIRCUSLINK_TIMEOUT='nan' must be a positive, finite"),
    ("fig6_sender_receiver", [], {"CIRCUSLINK_TIMEOUT": "inf"}, "CIRCUSLINK_TIMEOUT='inf' must be a positive"),
])
def test_examples_report_a_circuslink_error_in_one_line(example, args, env, message):
    """An error circuslink raises in an example (a bad option found once the world is up, a bad environment)
    ends it with one line naming the example, exit 1, as the circuslink command does: never a traceback."""
    proc = subprocess.run([sys.executable, str(REPO / "examples" / example / "main.py"), *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, CIRCUSLINK_BACKEND="cpu", **env))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{example.split('_')[0]}: error: ") and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, named", [
    (["bench", "rma", "--max-chain-bytes", "1Q"], "--max-chain-bytes '1Q': bad size '1Q'"),
    (["bench", "transpose", "--model-bytes", "1Q"], "--model-bytes '1Q': bad size '1Q'"),
    (["bench", "hops", "--load-bytes", "1Q"], "--load-bytes '1Q': bad size '1Q'"),
    (["bench", "fft", "--size", "1Q"], "bench fft: --size '1Q': bad size '1Q'"),
    (["bench", "pingpong", "--sizes", "1Q"], "--sizes '1Q': bad size '1Q'"),
])
def test_a_bad_size_names_its_own_option_in_one_line(tmp_path, args, named):
    """Every option read as a size names itself (they all said --sizes), before any rank starts (transpose's was
    read in every rank), and never as a traceback (hops' was raised from inside argparse)."""
    proc = _cli(*args, cwd=tmp_path, env=dict(os.environ, CIRCUSLINK_BACKEND="cpu"), timeout=60)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and named in errors[0], proc.stderr
