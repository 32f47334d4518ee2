"""docs/api.md against the code: every entry resolves, every signature it shows is the code's, every public name of
the documented modules (and the public members of the central classes) has an entry, and every environment
variable a rank sees is in its table."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "api.md"
# The modules whose every public name (their __all__; the root's user-facing names) must have an entry.
MODULES = {
    "circuslink": ["init", "World", "SymmetricBuffer", "compile", "include_dir"],
    "circuslink.channels": None,
    "circuslink.transport": None,
    "circuslink.rma": None,
    "circuslink.collectives": None,
    "circuslink.trace": None,
    "circuslink.apps.fft": None,
    "circuslink.apps.qcd": None,
}
# Classes whose own public methods and properties must each have an entry too.
CLASSES = ["circuslink.World", "circuslink.SymmetricBuffer", "circuslink.channels.Sender",
           "circuslink.channels.Receiver", "circuslink.channels.Channels", "circuslink.transport.Connection",
           "circuslink.rma.Window", "circuslink.rma.Queue", "circuslink.collectives.Comm", "circuslink.trace.Tracer",
           "circuslink.trace.Trace", "circuslink.apps.fft.Plan"]
ENTRY = re.compile(r"^#### `([\w.]+)(\(.*\))?`\s*$", re.M)


def parse_entries(text: str) -> dict[str, str | None]:
    """``dotted name -> the parameter list it shows`` (None for a name shown without one)."""
    out = {}
    for m in ENTRY.finditer(text):
        assert m.group(1) not in out, f"{m.group(1)} has two entries"
        out[m.group(1)] = m.group(2)
    return out


def resolve(dotted: str):
    """The object a dotted name reaches: the longest importable module, then attributes (class members raw,
    so that a property is a property)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = inspect.getattr_static(obj, name) if inspect.isclass(obj) else getattr(obj, name)
        return obj
    raise ImportError(dotted)


def shown_parameters(shown: str) -> list[tuple[str, str | None]]:
    """``(a, b=1, *, c=None)`` -> [("a", None), ("b", "1"), ("*", None), ("c", "None")]."""
    tree = ast.parse(f"def f{shown}: pass").body[0].args
    out = [(a.arg, None) for a in tree.posonlyargs + tree.args]
    for (name, _), default in zip(out[len(out) - len(tree.defaults):], tree.defaults, strict=True):
        out[[n for n, _ in out].index(name)] = (name, ast.unparse(default))
    if tree.vararg:
        out.append(("*" + tree.vararg.arg, None))
    elif tree.kwonlyargs:
        out.append(("*", None))
    for a, default in zip(tree.kwonlyargs, tree.kw_defaults, strict=True):
        out.append((a.arg, None if default is None else ast.unparse(default)))
    if tree.kwarg:
        out.append(("**" + tree.kwarg.arg, None))
    return out


def code_parameters(obj) -> list[tuple[str, str | None]]:
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    sig = inspect.signature(obj)
    out, star = [], False
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append(("*", None))
            star = True
        name = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        star = star or p.kind is p.VAR_POSITIONAL
        default = None if p.default is p.empty else ("..." if "<" in repr(p.default) else repr(p.default))
        out.append((name, default))
    return out


def drift(text: str) -> list[str]:
    """Every way ``text`` (the page) and the code disagree."""
    entries = parse_entries(text)
    problems = []
    for name, shown in entries.items():
        try:
            obj = resolve(name)
        except (ImportError, AttributeError):
            problems.append(f"{name}: documented, but the code has no such name")
            continue
        if shown is None:
            continue
        if isinstance(obj, property) or not callable(getattr(obj, "__func__", obj)):
            problems.append(f"{name}: documented with parameters, but it is not callable")
            continue
        have = code_parameters(obj)
        want = shown_parameters(shown)
        same_names = [n for n, _ in want] == [n for n, _ in have]
        if not same_names or not all(_same_default(w, h) for (_, w), (_, h) in zip(want, have, strict=False)):
            shown_code = "(" + ", ".join(n if d is None else f"{n}={d}" for n, d in have) + ")"
            problems.append(f"{name}: the page shows {shown}, the code is {shown_code}")
    for module, names in MODULES.items():
        mod = importlib.import_module(module)
        for n in names or mod.__all__:
            if f"{module}.{n}" not in entries:
                problems.append(f"{module}.{n}: public, but not on the page")
    for cls_name in CLASSES:
        cls = resolve(cls_name)
        for n in vars(cls):
            if not n.startswith("_") and f"{cls_name}.{n}" not in entries:
                problems.append(f"{cls_name}.{n}: public, but not on the page")
    return problems


def _same_default(shown: str | None, code: str | None) -> bool:
    """Both without a default, or equal defaults; a default the code cannot spell as a literal (a class, a
    factory: "...") matches any default the page shows."""
    if shown is None or code is None:
        return shown is None and code is None
    if code == "...":
        return True
    try:
        return ast.literal_eval(shown) == ast.literal_eval(code)
    except (ValueError, SyntaxError):
        return shown == code


def test_api_doc_matches_the_code():
    problems = drift(DOC.read_text())
    assert not problems, "docs/api.md and the code disagree:\n" + "\n".join(problems)


def test_the_drift_check_can_fail():
    text = DOC.read_text()
    renamed = text.replace("#### `circuslink.World.alloc(nbytes, timeout=None, peers=None)`",
                           "#### `circuslink.World.alloc(nbytes, timeout=None)`")
    assert any("circuslink.World.alloc: the page shows (nbytes, timeout=None)" in p for p in drift(renamed))
    default = text.replace("#### `circuslink.World.alloc(nbytes, timeout=None, peers=None)`",
                           "#### `circuslink.World.alloc(nbytes, timeout=5, peers=None)`")
    assert any(p.startswith("circuslink.World.alloc: the page shows") for p in drift(default))
    gone = re.sub(r"#### `circuslink\.channels\.Receiver\.read\(n\)`", "#### `circuslink.channels.Receiver.readd(n)`",
                  text)
    found = drift(gone)
    assert "circuslink.channels.Receiver.readd: documented, but the code has no such name" in found
    assert "circuslink.channels.Receiver.read: public, but not on the page" in found


def test_the_semantics_a_user_needs_are_on_the_page():
    text = DOC.read_text()
    for phrase in ("**Blocking, copying**", "The links form", "**Blocking and copies.**", "## Environment variables",
                   "close(timeout=None)", "Collective"):
        assert phrase in text, phrase


def _documented_variables() -> set[str]:
    env = DOC.read_text().split("## Environment variables", 1)[1]
    return set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", env))


def test_every_variable_a_rank_sees_is_documented(spmd):
    job = spmd(2, """
        import os
        print("VARS", " ".join(sorted(k for k in os.environ if k.startswith(("CIRCUSLINK_", "CUDA_MPS_"))
                                      or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))))
    """).check()
    seen = set()
    for line in job.stdout.splitlines():
        if "VARS" in line:
            seen |= set(line.split("VARS", 1)[1].split())
    assert {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CIRCUSLINK_RANK"} <= seen
    missing = seen - _documented_variables()
    assert not missing, f"variables the ranks see that docs/api.md does not describe: {sorted(missing)}"


def test_every_documented_circuslink_variable_exists_in_the_code():
    sources = "\n".join(p.read_text() for p in (REPO / "src" / "circuslink").rglob("*.py"))
    sources += (REPO / "tests" / "conftest.py").read_text()
    gone = sorted(v for v in _documented_variables() if v.startswith("CIRCUSLINK_") and v not in sources)
    assert not gone, f"docs/api.md describes variables the code never reads or sets: {gone}"


@pytest.mark.parametrize("shown,expected", [
    ("(a, b=1, *, c=None)", [("a", None), ("b", "1"), ("*", None), ("c", "None")]),
    ("(*args, **kw)", [("*args", None), ("**kw", None)]),
])
def test_parameter_lists_are_read_as_python_reads_them(shown, expected):
    assert shown_parameters(shown) == expected
