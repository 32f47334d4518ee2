"""Rules for the tests themselves, checked: every subprocess a test starts has a time-out (a stalled nvcc or job
fails its test, not the whole run), every job script is Python (also the GPU tests' ones, which CI never runs),
the cpu/cuda parametrisation comes from conftest, and no test turns a failure into a skip."""

from __future__ import annotations

import ast
import string
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
RUNNERS = {"run", "check_output", "check_call", "call"}  # subprocess functions that wait for the child


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def subprocesses_without_timeout(source: str) -> list[int]:
    """Lines of ``subprocess.run/check_output/check_call/call`` calls without ``timeout=``, and of ``Popen`` in a
    function that never waits on it with a time-out (``communicate(timeout=...)`` or ``wait(timeout=...)``)."""
    tree = ast.parse(source)
    hits = []
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.Module)]:
        body_calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
        bounded_wait = any(isinstance(c.func, ast.Attribute) and c.func.attr in ("communicate", "wait")
                           and any(k.arg == "timeout" for k in c.keywords) for c in body_calls)
        # a helper that starts a process and returns it: its caller waits on it (and is checked in turn)
        started = {t.id for a in ast.walk(func) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                   and isinstance(a.value.func, ast.Attribute) and a.value.func.attr == "Popen"
                   for t in a.targets if isinstance(t, ast.Name)}
        returned = {n.id for r in ast.walk(func) if isinstance(r, ast.Return) and r.value is not None
                    for n in ast.walk(r.value) if isinstance(n, ast.Name)}
        bounded_wait = bounded_wait or bool(started & returned)
        for call in body_calls:
            f = call.func
            if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "subprocess"):
                continue
            has_timeout = any(k.arg == "timeout" for k in call.keywords) or any(k.arg is None for k in call.keywords)
            if f.attr in RUNNERS and not has_timeout:
                hits.append(call.lineno)
            elif f.attr == "Popen" and not bounded_wait and isinstance(func, ast.FunctionDef):
                hits.append(call.lineno)
    return sorted(set(hits))


def test_every_subprocess_in_the_tests_has_a_timeout():
    hits = [f"{p.relative_to(TESTS)}:{line}" for p in _test_files()
            for line in subprocesses_without_timeout(p.read_text())]
    assert not hits, "subprocesses without a time-out (pass timeout=, e.g. conftest.NVCC_TIMEOUT_S):\n" + \
        "\n".join(hits)


def test_the_timeout_rule_can_fail():
    code = ("import subprocess\n"
            "def a():\n    subprocess.run(['nvcc', 'x.cu'])\n"                        # 3: no time-out
            "def b():\n    subprocess.run(['nvcc'], timeout=60)\n"
            "def c():\n    p = subprocess.Popen(['x'])\n    p.wait()\n"                # 7: waits for ever
            "def d():\n    p = subprocess.Popen(['x'])\n    p.communicate(timeout=5)\n"
            "def e():\n    p = subprocess.Popen(['x'])\n    return p, 1\n")
    assert subprocesses_without_timeout(code) == [3, 7]


def pasted_backend_lists(source: str) -> list[int]:
    """Lines that build the cpu/cuda parameter list by hand (``pytest.param("cuda", ..., marks=...gpu)``)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "param" \
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cuda":
            hits.append(node.lineno)
    return hits


class _AnyField(string.Formatter):
    """Fills every replacement field of a ``str.format`` template with 0."""

    def get_value(self, key, args, kwargs):
        return 0


def scripts_that_do_not_parse(source: str) -> list[str]:
    """The module-level job scripts of a test file (string constants that start a world) that are not Python:
    as written, dedented, or with every ``str.format`` field filled. The GPU tests' scripts run only on the
    device machine, so a syntax error there would first show in its time."""
    bad = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue
        text = textwrap.dedent(node.value.value)
        if "cl.init(" not in text and "import circuslink" not in text:
            continue
        for form in (lambda t: t, lambda t: _AnyField().format(t)):
            try:
                ast.parse(form(text))
                break
            except (SyntaxError, ValueError, IndexError, KeyError):
                continue
        else:
            bad.append(f"{getattr(node.targets[0], 'id', '?')} (line {node.lineno})")
    return bad


def test_every_job_script_in_the_tests_is_python():
    bad = {p.name: b for p in _test_files() if (b := scripts_that_do_not_parse(p.read_text()))}
    assert not bad, f"job scripts that are not Python: {bad}"


def test_the_script_rule_can_fail():
    broken = 'JOB = """\nimport circuslink as cl\nworld = cl.init()\ndef f(:\n    pass\n"""\n'
    assert scripts_that_do_not_parse(broken) == ["JOB (line 1)"]
    template = 'JOB = """\nimport circuslink as cl\nn = {n}\nprint(f"rank {{n}}")\n"""\n'
    assert scripts_that_do_not_parse(template) == []


def test_the_cpu_cuda_parametrisation_comes_from_conftest():
    """One list in conftest (``BACKENDS`` and ``backend_params``), not one pasted into every file."""
    hits = [f"{p.relative_to(TESTS)}:{line}" for p in _test_files() if p.name != "conftest.py"
            for line in pasted_backend_lists(p.read_text())]
    assert not hits, "use conftest.BACKENDS / conftest.backend_params(...):\n" + "\n".join(hits)


def failures_turned_into_skips(source: str) -> list[int]:
    """Lines of ``pytest.skip(...)`` inside an ``if`` that looks at a job's or process's outcome (``returncode``,
    ``output``, ``stderr``, ``stdout``): a failure reported as a skip."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.If):
            continue
        names = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
        if not names & {"returncode", "output", "stderr", "stdout"}:
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "skip":
                hits.append(inner.lineno)
    return hits


def test_no_test_turns_a_failure_into_a_skip():
    hits = [f"{p.relative_to(TESTS)}:{line}" for p in _test_files() if p.name != Path(__file__).name
            for line in failures_turned_into_skips(p.read_text())]
    assert not hits, "a failing job reported as a skip:\n" + "\n".join(hits)


def test_the_skip_rule_can_fail():
    code = ("import pytest\n"
            "def t(job):\n"
            "    if job.returncode != 0 and 'unavailable' in job.output:\n"
            "        pytest.skip('x')\n")
    assert failures_turned_into_skips(code) == [4]


def test_no_skip_waits_for_code_that_already_exists():
    """Guards such as 'channels are not there yet' outlive their reason and hide failures."""
    hits = [f"{p.relative_to(TESTS)}:{i}" for p in _test_files() if p.name != Path(__file__).name
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if ("skip" in line or "reason=" in line) and (" yet" in line or "not there" in line)]
    assert not hits, "skips that wait for code to be written:\n" + "\n".join(hits)


RANK_LINES = """
import sys, circuslink as cl
w = cl.init()
for i in range(50):  # partial writes: a line in three pieces, flushed apart, while the other ranks write theirs
    sys.stdout.write(f"rank {w.rank} "); sys.stdout.flush()
    sys.stdout.write(f"line {i} "); sys.stdout.flush()
    sys.stdout.write("end\\n"); sys.stdout.flush()
w.close()
"""


@pytest.mark.parametrize("launcher", ["circuslink", pytest.param("mpirun", marks=pytest.mark.mpi)])
def test_rank_lines_reads_each_ranks_output_by_its_tag(spmd, launcher):
    job = spmd(3, RANK_LINES, launcher=launcher, tag=True).check()
    for r in range(3):
        assert job.rank_lines(r) == [f"rank {r} line {i} end" for i in range(50)], job.output


def test_a_job_that_times_out_is_stopped_with_its_ranks(tmp_path):
    """conftest.run_job: a job past its time-out fails its test with the output so far, and neither the launcher
    nor any rank outlives it (a rank left running mid-kernel would disturb the jobs after it on a shared GPU)."""
    import sys

    from conftest import pid_alive, run_job

    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(120)\n")
    cmd = [sys.executable, "-m", "circuslink", "run", "-n", "2", "--backend", "cpu", "--", sys.executable, str(script)]
    with pytest.raises(pytest.fail.Exception, match="timed out after 4 s and was stopped") as info:
        run_job(cmd, env=dict(__import__("os").environ), cwd=str(tmp_path), timeout=4)
    pids = [int(line.split()[-1]) for line in str(info.value).splitlines() if " pid " in f" {line}"]
    assert len(pids) == 2, str(info.value)
    import time
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids), f"ranks {pids} outlived their stopped job"
