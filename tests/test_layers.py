"""The shape of the code, checked: layers only point down and areas import each other in no cycle; no code
outside the registries tests a back-end's or a transport's name (directly or through a local variable); mpi4py
and NVSHMEM bindings are imported only by the world's bootstrap and the transports; device code lives in
.cu/.cuh files only. docs/architecture.md draws the layers this test enforces.
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
    ("wire format", ["channels.protocol"]),
    ("backends", ["backends", "memory", "device_code"]),
    ("transport", ["transport"]),
    ("world", ["world", "launcher", "_run_command", "mps"]),
    ("topology", ["topology"]),
    ("primitives", ["channels", "rma", "collectives", "trace"]),
    ("front ends", ["spec", "results"]),
    ("measurement of the floor", ["probe"]),
    ("applications", ["apps"]),
    ("benchmarks", ["bench"]),
    ("command line", ["cli", "info", "__main__", "__init__"]),
]
LEVEL = {name: level for level, (_, names) in enumerate(LAYERS) for name in names}


# Modules that are an area of their own inside another's package: the channel format is the wire format every
# carrier of packets reads (transports' relays, channels, the router), below all of them.
OWN_AREA = {"circuslink.channels.protocol": "channels.protocol"}


def _area(module: str, importing: bool = False) -> str:
    """``circuslink.rma._cuda`` -> ``rma``. The package root is the command-line layer as a file, but
    importing it gives ``init``, ``World`` and the errors only (its areas load lazily, as attributes the
    importer chooses), so as an import it counts as the world layer."""
    if module in OWN_AREA:
        return OWN_AREA[module]
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
            elif node.module and node.module.split(".")[0] == "circuslink":
                target = node.module
            else:
                continue
            names = [f"{target}.{a.name}" for a in node.names]
            if node.module:  # ``from pkg import name``: a module of its own area, or a name of pkg
                names = [n if n in OWN_AREA else target for n in names]
            out += [(node.lineno, n) for n in dict.fromkeys(names)]
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


def test_areas_import_each_other_in_no_cycle():
    """Beyond pointing down: no two areas of one layer import each other, directly or round a longer cycle (the
    channels once imported the links between nodes, which subclassed the channels' ends)."""
    graph: dict[str, set[str]] = {}
    for path in _sources():
        me = _area(_module_name(path))
        for _, target in _imports(path):
            them = _area(target, importing=True)
            if them != me and them in LEVEL:
                graph.setdefault(me, set()).add(them)
    cycle = _find_cycle(graph)
    assert not cycle, "areas that import each other in a cycle: " + " -> ".join(cycle)


def _find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_cycle_check_can_fail():
    assert _find_cycle({"channels": {"links"}, "links": {"channels.protocol", "channels"}}) == \
        ["channels", "links", "channels"]
    assert _find_cycle({"channels": {"transport", "channels.protocol"}, "transport": {"channels.protocol"}}) == []


# mpi4py and NVSHMEM's Python bindings: the world's bootstrap initialises MPI once; the transports call MPI and
# NVSHMEM; every other subsystem reaches them through those (world.mpi, circuslink.transport).
FOREIGN = ("mpi4py", "nvshmem", "nvshmem4py", "cuda.core.experimental._nvshmem")
MAY_IMPORT_FOREIGN = ("world", "transport")


def _foreign_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        out += [(node.lineno, n) for n in names if n.split(".")[0] in FOREIGN or n in FOREIGN]
    return out


def test_only_the_bootstrap_and_the_transports_import_mpi4py_or_nvshmem():
    hits = [f"{p.relative_to(PKG)}:{line}: imports {name}" for p in _sources()
            if _area(_module_name(p)) not in MAY_IMPORT_FOREIGN for line, name in _foreign_imports(p)]
    assert not hits, "subsystems that import MPI or NVSHMEM themselves (use world.mpi or a transport):\n" + \
        "\n".join(hits)


# -- no code outside a registry tests a back-end's or a transport's name ------------------------------------------
REGISTRIES = ("backends/__init__.py", "transport/_registry.py")


def _registered_names() -> set[str]:
    from circuslink.backends import BACKENDS
    from circuslink.transport import _registry

    return set(BACKENDS) | set(_registry.names())


TAINT_IDS = {"backend", "backend_name", "transport", "transport_name"}
TAINT_CALLS = {"resolve_backend", "default_backend_name", "resolve_name", "forced"}
TAINT_KEYS = {"backend", "transport", "CIRCUSLINK_BACKEND", "CIRCUSLINK_TRANSPORT"}


class _NameTests(ast.NodeVisitor):
    """Comparisons (and match cases) of a back-end's or transport's name with a literal name, where the name comes
    from ``...backend.name`` / ``...transport.name``, a variable or parameter called backend / transport, the
    functions that resolve one, an environment variable or record field that holds one, or a local variable
    assigned any of these; the literal may hide in a variable too."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.hits: list[int] = []
        self.scopes: list[tuple[set[str], set[str]]] = [(set(), set())]  # (tainted ids, ids holding a name literal)

    def _tainted(self, node: ast.AST) -> bool:
        tainted = self.scopes[-1][0] | self.scopes[0][0]
        if isinstance(node, ast.Name):
            return node.id in TAINT_IDS or node.id in tainted
        if isinstance(node, ast.Attribute):
            if node.attr == "name":
                text = ast.unparse(node.value).lower()
                return "backend" in text or "transport" in text
            return False
        if isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if fname in TAINT_CALLS:
                return True
            if fname in ("lower", "strip", "upper") and isinstance(fn, ast.Attribute):
                return self._tainted(fn.value)
            if fname == "get" and node.args and isinstance(node.args[0], ast.Constant):
                return node.args[0].value in TAINT_KEYS
            return False
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value in TAINT_KEYS
        if isinstance(node, ast.BoolOp):
            return any(self._tainted(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self._tainted(node.body) or self._tainted(node.orelse)
        return False

    def _literal(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in self.names
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(self._literal(e) for e in node.elts)
        if isinstance(node, ast.Name):
            return node.id in self.scopes[-1][1] | self.scopes[0][1]
        return False

    def _scope(self, node: ast.AST) -> None:
        params = set()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            params = {a.arg for a in node.args.args + node.args.kwonlyargs} & TAINT_IDS
        self.scopes.append((set(params), set()))
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scope

    def _assign(self, targets: list[ast.AST], value: ast.AST | None) -> None:
        if value is None:
            return
        for t in targets:
            if isinstance(t, ast.Name):
                if self._tainted(value):
                    self.scopes[-1][0].add(t.id)
                if self._literal(value):
                    self.scopes[-1][1].add(t.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assign(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assign([node.target], node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._assign([node.target], node.value)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        if any(self._tainted(o) for o in operands) and any(self._literal(o) for o in operands):
            self.hits.append(node.lineno)
        self.generic_visit(node)

    def visit_Match(self, node: ast.Match) -> None:
        if self._tainted(node.subject):
            for case in node.cases:
                if any(isinstance(p, ast.MatchValue) and self._literal(p.value) for p in ast.walk(case.pattern)):
                    self.hits.append(case.pattern.lineno)
        self.generic_visit(node)


def name_tests(source: str, names: set[str] | None = None) -> list[int]:
    """Lines of ``source`` that test a back-end's or transport's name (see :class:`_NameTests`)."""
    finder = _NameTests(names or _registered_names())
    finder.visit(ast.parse(source))
    return sorted(set(finder.hits))


# A stricter check for back-ends' names (outside backends/): a name compared with anything at all.
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


@pytest.mark.parametrize("path", [p for p in _sources() if p.relative_to(PKG).as_posix() not in REGISTRIES],
                         ids=lambda p: str(p.relative_to(PKG)))
def test_no_code_outside_the_registries_tests_a_backend_or_transport_name(path):
    text = path.read_text()
    rows = text.splitlines()
    found = set(name_tests(text))
    if "backends" not in path.relative_to(PKG).parts:
        found |= set(backend_name_tests(text))
    hits = [f"{i}: {rows[i - 1].strip()}" for i in sorted(found)]
    assert not hits, f"{path.relative_to(PKG)} tests a back-end's or transport's name (ask a capability: " \
                     f"backend.runs_kernels, backends.runs_kernels(name), a transport's capabilities, or " \
                     f"world.backend_module(...)): {hits}"


def test_the_name_check_can_fail():
    """Each form is caught: a direct comparison, a local variable on either side, a parameter, the environment, a
    record's field, a match statement; and comparisons of other words, or of two names, are not."""
    caught = {
        "if world.backend.name == 'cuda': pass": [1],
        "b = world.backend.name\nx = 1\nif b != 'cpu': pass": [3],
        "def f(transport):\n    return transport in ('mpi', 'nvshmem')": [2],
        "def f(conn):\n    want = 'nvshmem'\n    t = conn.transport.name.lower()\n    return t == want": [4],
        "import os\nif os.environ.get('CIRCUSLINK_BACKEND') == 'cuda': pass": [2],
        "if floor.get('backend') == 'cuda': pass": [1],
        "def f(w):\n    name = w.backend.name or 'cpu'\n    match name:\n        case 'cuda':\n            pass": [4],
        "def f(b):\n    n = resolve_backend(b)\n    return 'cuda' == n": [3],
    }
    for source, lines in caught.items():
        assert name_tests(source, {"cpu", "cuda", "ipc", "mpi", "nvshmem"}) == lines, source
    for source in ["if r.get('impl') in ('mpi', 'mpi-host-staged'): pass", "if a.backend.name == b.backend.name: pass",
                   "if name == 'nvshmem': pass", "x = {'cpu': True}"]:
        assert name_tests(source, {"cpu", "cuda", "ipc", "mpi", "nvshmem"}) == [], source


def test_the_backend_name_check_can_fail():
    """A back-end's name compared with anything: caught through a local variable, an argument, a membership test
    and the attribute itself; labels pass."""
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
    ("backends/_partition.py", "_available"): "a constant of the machine: whether its driver has green contexts",
    ("channels/_cuda.py", "_kernels"): "compiled device code, the same for every World",
    ("channels/_router_cuda.py", "_kernel"): "compiled device code, the same for every World",
    ("rma/_cuda.py", "_kernels"): "compiled device code, the same for every World",
    ("rma/_transpose/_cuda.py", "_module"): "compiled device code, the same for every World",
    ("apps/qcd/_cuda.py", "_modules"): "compiled device code (one module per precision), the same for every World",
    ("bench/fft_baseline.py", "_module"): "compiled device code, the same for every World",
    ("apps/qcd/_halo_cuda.py", "_lib"): "a loaded shared library (NVSHMEM), once per process",
    ("apps/fft/_cufft_callback.py", "_lib"): "a loaded shared library (the libcufft CuPy loaded), once per process",
    ("apps/fft/_cufft_callback.py", "_ir"): "compiled device code (the pull's callbacks), the same for every World",
    ("apps/fft/_line_pull.py", "_modules"): "compiled device code (the pull's line kernel), the same for every World",
    ("transport/mpi.py", "_library"): "the progress thread's compiled library, loaded once per process",
    ("transport/nvshmem.py", "_library"): "the NVSHMEM library (initialised once per process, as NVSHMEM is)",
    ("transport/_registry.py", "_registered"): "the transports this process knows (built in, and plug-ins)",
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
