"""The shape of the code, checked: layers only point down, no subsystem tests the back-end's name,
device code lives in .cu/.cuh files only. docs/architecture.md draws the layers this test enforces.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "circuslink"

# docs/architecture.md, "Layers": a module may import its own layer and the layers below it, never above
# (function-local imports included: a lower layer that imports a higher one lazily still depends on it).
LAYERS = [
    ("base", ["errors", "_config", "_sysinfo", "_abi", "_wait", "_lifecycle", "_store", "_bootstrap", "_guard",
              "_argtypes"]),
    ("backends", ["backends", "memory", "device_code"]),
    ("world", ["world", "launcher", "_run_command", "mps"]),
    ("topology", ["topology"]),
    ("primitives", ["channels", "rma", "collectives", "trace", "links"]),
    ("front ends", ["spec", "results"]),
    ("measurement of the floor", ["probe"]),
    ("applications", ["apps"]),
    ("benchmarks", ["bench"]),
    ("command line", ["cli", "info", "__main__", "__init__"]),
]
LEVEL = {name: level for level, (_, names) in enumerate(LAYERS) for name in names}


def _area(module: str, importing: bool = False) -> str:
    """``circuslink.rma._cuda`` -> ``rma``. The package root is the command-line layer as a file, but
    importing it gives ``init``, ``World`` and the errors only (its areas load lazily, as attributes the
    importer chooses), so as an import it counts as the world layer."""
    parts = module.split(".")
    if len(parts) > 1:
        return parts[1]
    return "world" if importing else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def _imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) for every circuslink import in the file (``module``: its dotted name)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module or _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "circuslink"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
                out += [(node.lineno, n) for n in names]
            elif node.module and node.module.split(".")[0] == "circuslink":
                out.append((node.lineno, node.module))
    return out


def _sources() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_area_has_a_layer():
    areas = {_area(_module_name(p)) for p in _sources()}
    assert areas <= set(LEVEL), f"areas without a layer (add them to LAYERS and docs/architecture.md): " \
                                f"{sorted(areas - set(LEVEL))}"


def test_layers_only_point_down():
    wrong = []
    for path in _sources():
        me = _area(_module_name(path))
        for line, target in _imports(path):
            them = _area(target, importing=True)
            if them in LEVEL and LEVEL[them] > LEVEL[me]:
                wrong.append(f"{path.relative_to(PKG)}:{line}: {me} ({LAYERS[LEVEL[me]][0]}) imports {target} "
                             f"({LAYERS[LEVEL[them]][0]})")
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_the_check_can_fail(tmp_path):
    """The import parser sees relative, absolute and function-local imports."""
    fake = tmp_path / "_probe.py"
    fake.write_text("def f():\n    from ..bench import _driver\n    import circuslink.apps.qcd\n"
                    "from . import _plan\n")
    targets = [t for _, t in _imports(fake, "circuslink.channels._probe")]
    assert sorted(targets) == ["circuslink.apps.qcd", "circuslink.bench", "circuslink.channels._plan"]
    assert [_area(t, importing=True) for t in sorted(targets)] == ["apps", "bench", "channels"]


BACKEND_NAMES = {"cpu", "cuda"}
BACKEND_NAME_TEST = re.compile(r"backend\.name\s*(==|!=|in\b|not\s+in\b)")


def _names_a_backend(node: ast.AST) -> bool:
    """A back-end's name as a literal, or a tuple / list / set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in BACKEND_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_backend(e) for e in node.elts)
    return False


def backend_name_tests(source: str) -> list[int]:
    """Lines that compare anything with a back-end's name (``x == "cuda"``, ``name in ("cpu", ...)``), whatever
    holds the name (``world.backend.name``, a local variable, an argument), or compare ``backend.name`` itself."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_a_backend(n) for n in [node.left, *node.comparators]):
            lines.add(node.lineno)
    lines |= {i for i, line in enumerate(source.splitlines(), 1) if BACKEND_NAME_TEST.search(line)}
    return sorted(lines)


@pytest.mark.parametrize("path", [p for p in _sources() if "backends" not in p.parts],
                         ids=lambda p: str(p.relative_to(PKG)))
def test_no_subsystem_tests_the_backend_by_name(path):
    text = path.read_text()
    rows = text.splitlines()
    hits = [f"{i}: {rows[i - 1].strip()}" for i in backend_name_tests(text)]
    assert not hits, f"{path.relative_to(PKG)} tests the back-end's name (use its capabilities, " \
                     f"backends.runs_kernels(name) or world.engine(...)): {hits}"


def test_the_backend_name_check_can_fail():
    """Caught through a local variable, an argument, a membership test and the attribute itself; labels pass."""
    code = (
        "def f(world, backend):\n"
        "    name = world.backend.name\n"
        "    if name == 'cuda':\n"                       # 3: through a local variable
        "        pass\n"
        "    if backend != \"cpu\":\n"                     # 5: through an argument
        "        pass\n"
        "    if backend in ('cpu', 'mps'):\n"             # 7: a membership test
        "        pass\n"
        "    ok = world.backend.name == other\n"          # 9: the attribute itself
        "    label = f'{name} ({world.backend.name})'\n"  # a label: fine
        "    return ok, label, ['cpu', 'cuda']\n"         # a list of choices: fine
    )
    assert backend_name_tests(code) == [3, 5, 7, 9]


def test_no_device_code_in_python_files():
    hits = [str(p.relative_to(PKG)) for p in _sources() if "__global__" in p.read_text()]
    assert not hits, f"device code belongs in .cu / .cuh files: {hits}"


# docs/architecture.md, "Resources": a World's state lives on the World; what a process keeps beside it is this,
# and a test keeps the list whole. (module, name) -> why it is process-wide.
PROCESS_STATE = {
    ("world.py", "_current"): "the World init() returns again in this process",
    ("world.py", "_failing"): "this process is exiting on an error (its World must not wait in close)",
    ("launcher.py", "_invocation"): "the command line a command relaunches itself with",
    ("_wait.py", "_alone"): "a constant of the process: its ranks have cores of their own",
    ("device_code.py", "headers_digest"): "a constant of the installation: the headers' digest",
    ("channels/_cuda.py", "_kernels"): "compiled device code, the same for every World",
    ("channels/_router_cuda.py", "_kernel"): "compiled device code, the same for every World",
    ("rma/_cuda.py", "_module"): "compiled device code, the same for every World",
    ("rma/_transpose/_cuda.py", "_module"): "compiled device code, the same for every World",
    ("apps/qcd/_cuda.py", "_module"): "compiled device code, the same for every World",
    ("apps/qcd/_halo_cuda.py", "_lib"): "a loaded shared library (NVSHMEM), once per process",
    ("rma/_transpose/_cuda.py", "pick_pitch"): "a pure function, memoized",
    ("rma/_transpose/_cuda.py", "tile_candidates"): "a pure function, memoized",
    ("rma/_tile_model.py", "_cache"): "the tile chosen per (back-end, dtype, shape), for the process",
}


def process_state(path: Path, rel: str) -> set[tuple[str, str]]:
    """Names a module keeps for the whole process: ``global`` statements, memoized module functions, and
    module-level mutable containers with a private lower-case name."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= {(rel, name) for name in node.names}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("cache" in ast.unparse(d) for d in node.decorator_list):
            found.add((rel, node.name))
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id.startswith("_") and not t.id.startswith("__") \
                        and t.id.lstrip("_").islower() and isinstance(node.value, ast.Dict | ast.List | ast.Set):
                    found.add((rel, t.id))
    return found


def test_process_wide_state_is_the_documented_kind():
    found = set().union(*(process_state(p, str(p.relative_to(PKG))) for p in _sources()))
    assert found - set(PROCESS_STATE) == set(), "state kept for the whole process (put it on the World, " \
        "world.registry(...), or list it here and in docs/architecture.md with why)"
    assert set(PROCESS_STATE) - found == set(), "listed but gone: remove from PROCESS_STATE"


def test_the_state_check_can_fail(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("import functools\n_seen = {}\n_N = {}\n@functools.lru_cache\ndef f(x):\n    return x\n"
                   "def g():\n    global _world\n    _world = 1\n")
    assert process_state(mod, "m.py") == {("m.py", "_seen"), ("m.py", "f"), ("m.py", "_world")}
