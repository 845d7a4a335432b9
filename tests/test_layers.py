"""The project's packages are layered: each module imports only its own layer and those below
it, no import circle exists, and in the framework (`tables/`, `assignor/`) no import of the
project's own modules hides in a function or under TYPE_CHECKING to dodge one (docs/tables.md,
"Layers"). `tables/` imports from `assignor/` only its public face.

An AST walk of the source (nothing is imported). What counts as an import of a project module:
- every `import` and `from ... import`, anywhere in a module (a package's `__init__` too: it
  has no exemption, and re-exports only what lies at or below its own layer);
- `importlib.import_module("a.b")` and `__import__("a.b")` with a literal name;
- a string literal that is exactly a dotted project module's name (`"pipeline.twins.windowed"`,
  `"tables.operators._fastjoin"`), which a table of names hands to `import_module`: for layers,
  not circles (a module loaded by name on demand cannot close an import circle; a registry may
  name the modules that import it, as `pipeline/twins/__init__.py`'s KINDS does).
An import by a computed name is allowed only at the few sites listed in DYNAMIC, each loading
what its caller names (a user's app, a compiled part, a twin from a table of literals).

`app/` and `pipeline/` may import lazily (optional dependencies such as pyspark, and `faust -A
app` building the app on first access), but a lazy import still counts for layers and circles.

`test_each_kind_of_violation_is_caught` plants every kind of violation in a copy of the tree
and shows each check fails on it.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tables", "assignor", "pipeline", "app")
FRAMEWORK = ("tables", "assignor")  # no hidden import here

# Lowest first. A module belongs to the layer of the longest prefix that names it or its package.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("planner core", ("assignor.core",)),
    ("planner", ("assignor.wire", "assignor.group_scenario", "assignor")),  # `assignor`: its __init__
    ("shared base", ("assignor.clients", "assignor.internals")),  # Kafka clients, private-name registry
    ("faust adapter", ("assignor.faust_adapter",)),
    ("assignor tools", ("assignor.cli", "assignor.whatif", "assignor.comparisons", "assignor.__main__")),
    ("base", ("tables.settings", "tables.compiled", "tables._version")),
    # The operators and their event types; above them, what makes their events of input records.
    ("operators", ("tables.operators",)),
    ("records", ("tables.records",)),
    ("declaration", ("tables.spec",)),
    ("kafka", ("tables.kafka",)),
    ("state", ("tables.state",)),
    ("runtime", ("tables.runtime",)),
    ("web", ("tables.web",)),
    ("api", ("tables.api", "tables")),  # `tables` itself: the public names
    ("test kit", ("tables.testing", "tables.dev")),
    ("pipeline", ("pipeline",)),
    ("command line", ("tables.cli",)),  # `tandem`: runs the commands of every layer (and pipeline/)
    ("app", ("app",)),
]
# Pure layers: no I/O library may be imported there.
PURE = {"planner core", "records", "operators", "declaration", "base"}
IO_LIBRARIES = ("aiokafka", "rocksdict", "aiohttp", "socket", "faust.web", "urllib", "subprocess")
# What tables/ may import from assignor/: the shared base, and the public names of `assignor`
# and `assignor.faust_adapter` (their `__all__`).
ASSIGNOR_SHARED = ("assignor.clients", "assignor.internals")
ASSIGNOR_FACES = ("assignor", "assignor.faust_adapter")
# The `tandem` command runs assignor's own command line (`python -m assignor`) by its `main`.
ASSIGNOR_COMMANDS = {"tables.cli": ("assignor.cli",)}
# The only imports by a computed name: (file, function) -> why the name cannot be a literal.
DYNAMIC = {
    ("tables/compiled.py", "_import"): "a compiled part, named by its user (operators, records)",
    ("tables/testing/cluster.py", "app_of"): "the user's app module",
    ("pipeline/apps.py", "import_app_module"): "the user's app module",
    ("pipeline/simulate.py", "resolve"): "a user's own strategy, module:function",
    ("pipeline/twins/__init__.py", "kind_module"): "a twin, from KINDS (literals)",
    ("pipeline/__main__.py", "main"): "a job, from JOBS (literals)",
    ("tables/cli.py", "main"): "a command's module, from COMMANDS (literals)",
}
IMPORT_FUNCTIONS = ("import_module", "__import__")
MODULE_NAME = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?")  # a.b or a.b:attr


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def layer_of(module: str) -> int:
    """The layer of the longest prefix naming the module or its package."""
    named = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert named, f"{module} is in no layer: add it to LAYERS"
    return max(named)[1]


def _import_call(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in IMPORT_FUNCTIONS


def _names_module(text: str, known: set[str]) -> bool:
    return MODULE_NAME.fullmatch(text) is not None and text.partition(":")[0] in known


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def imports(path: Path, module: str, known: set[str] | None = None) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, hidden): hidden when inside a function or under TYPE_CHECKING.
    With `known`, a string literal naming a dotted module of `known` counts too."""
    for name, line, hidden, _ in named_imports(path, module, known):
        yield name, line, hidden


def named_imports(
    path: Path, module: str, known: set[str] | None = None
) -> Iterator[tuple[str, int, bool, bool]]:
    """`imports`, each with whether it is only a module's name in a string."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def resolve(name: str, level: int, within: str) -> str:
        if not level:
            return name
        base = within.split(".")[: len(within.split(".")) - level + 1]
        return ".".join([*base, name] if name else base)

    def walk(node: ast.AST, hidden: bool) -> Iterator[tuple[str, int, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.JoinedStr) and isinstance(child, ast.Constant):
                continue  # an f-string's text is a message, not a module's name (its {...} are walked)
            inner = hidden or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = True
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, inner, False
            elif isinstance(child, ast.ImportFrom):
                base = resolve(child.module or "", child.level, package)
                for alias in child.names:
                    yield f"{base}.{alias.name}", child.lineno, inner, False  # a module, or a name in one
            elif isinstance(child, ast.Call) and _import_call(child) and child.args:
                name = _literal(child.args[0])
                if name is not None:
                    within = _literal(child.args[1]) if len(child.args) > 1 else None
                    level = len(name) - len(name.lstrip("."))
                    yield resolve(name.lstrip("."), level, within or package), child.lineno, inner, False
                    continue  # its argument is not also a name in a string
            elif known is not None and (name := _literal(child)) and _names_module(name, known):
                yield name.partition(":")[0], child.lineno, inner, True
            yield from walk(child, inner)

    yield from walk(tree, False)


def dynamic_imports(root: Path = ROOT) -> dict[tuple[str, str], int]:
    """(file, enclosing function) -> count of import_module/__import__ calls by a computed name."""
    found: dict[tuple[str, str], int] = {}
    for path in modules(root).values():
        tree = ast.parse(path.read_text(), str(path))
        for function in ast.walk(tree):
            if not isinstance(function, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in _own_nodes(function):
                if (
                    isinstance(node, ast.Call)
                    and _import_call(node)
                    and node.args
                    and not _literal(node.args[0])
                ):
                    key = (path.relative_to(root).as_posix(), getattr(function, "name", "<module>"))
                    found[key] = found.get(key, 0) + 1
    return found


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a module or function, not those of the functions inside it."""
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield child
            yield from _own_nodes(child)


def own(name: str, known: dict[str, Path]) -> str | None:
    """The project module `name` names (itself, or the module holding the name), if any."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def graph(root: Path = ROOT, by_name: bool = True) -> dict[str, set[str]]:
    """module -> the project modules it imports (`by_name`: and those it names in a string)."""
    known = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for name, _, _, named in named_imports(path, module, set(known)):
            if named and not by_name:
                continue
            target = own(name, known)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a higher layer."""
    return [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in sorted(edges.items())
        for t in sorted(targets)
        if layer_of(t) > layer_of(m)
    ]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def hidden_imports(root: Path = ROOT) -> list[str]:
    known = modules(root)
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for module, path in known.items()
        if module.split(".")[0] in FRAMEWORK
        for name, line, inner in imports(path, module, set(known))
        if inner and own(name, known) is not None
    ]


def public_names(root: Path, face: str) -> set[str]:
    """The `__all__` of a package's __init__, read from its source."""
    init = root.joinpath(*face.split("."), "__init__.py")
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def private_assignor_imports(root: Path = ROOT) -> list[str]:
    """Imports by tables/ of assignor/ names outside its public face."""
    known = modules(root)
    allowed = {f"{face}.{name}" for face in ASSIGNOR_FACES for name in public_names(root, face)}
    found = []
    for module, path in known.items():
        if module.split(".")[0] != "tables":
            continue
        for name, line, _ in imports(path, module, set(known)):
            if name.split(".")[0] != "assignor" or name in ASSIGNOR_FACES or name in allowed:
                continue
            if any(name == s or name.startswith(s + ".") for s in ASSIGNOR_SHARED):
                continue
            if name in ASSIGNOR_COMMANDS.get(module, ()):
                continue
            found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def impure(root: Path = ROOT) -> list[str]:
    known = modules(root)
    return [
        f"{module} imports {name}"
        for module, path in known.items()
        if LAYERS[layer_of(module)][0] in PURE
        for name, _, _ in imports(path, module)
        if any(name == lib or name.startswith(lib + ".") for lib in IO_LIBRARIES)
    ]


def test_each_module_imports_only_its_layer_and_those_below() -> None:
    found = upward(graph())
    assert not found, "\n".join(found)


def test_no_import_circle() -> None:
    assert not circles(graph(by_name=False))


def test_no_project_import_hidden_in_a_function_or_type_checking() -> None:
    found = hidden_imports()
    assert not found, "\n".join(found)


def test_imports_by_a_computed_name_are_only_the_known_ones() -> None:
    """A new `import_module(name)` must be added to DYNAMIC, saying why its name is not a literal."""
    assert set(dynamic_imports()) == set(DYNAMIC)


def test_tables_imports_only_the_public_face_of_assignor() -> None:
    found = private_assignor_imports()
    assert not found, "\n".join(found)


def test_pure_layers_do_no_io() -> None:
    found = impure()
    assert not found, "\n".join(found)


def test_every_project_module_has_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_the_worker_loop_names_no_concrete_operator() -> None:
    """tables/runtime/ knows operators by their interface (tables/operators/base.py) only."""
    concrete = [
        name for name in modules() if name.startswith("tables.operators.") and name != "tables.operators.base"
    ]
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in modules().items()
        if module.startswith("tables.runtime")
        for name, line, _ in imports(path, module)
        if any(name == c or name.startswith(c + ".") for c in concrete if c != "tables.operators.kv")
    ]
    assert not found, "\n".join(found)
    text = "\n".join(p.read_text() for p in (ROOT / "tables" / "runtime").rglob("*.py"))
    for name in ("WindowedJoin", "WindowedKind", "JoinWindow"):
        assert name not in text, f"tables/runtime names {name}"


# -- the checks are not vacuous: each kind of violation, planted in a copy of the tree -----------

PLANTED = {
    "a package's __init__ importing a layer above": (
        "tables/__init__.py",
        "from tables.testing import EmbeddedBroker\n",
        ["tables (api) imports tables.testing (test kit)"],
    ),
    "importlib of a layer above": (
        "tables/state/store.py",
        'import importlib\n\nimportlib.import_module("tables.runtime.worker")\n',
        ["tables.state.store (state) imports tables.runtime.worker (runtime)"],
    ),
    "a module's name in a string, loaded by name": (
        "tables/records/alignment.py",
        'WORKER = "tables.runtime.worker"\n',
        ["tables.records.alignment (records) imports tables.runtime.worker (runtime)"],
    ),
    "importlib inside an f-string": (
        "tables/operators/kv.py",
        "import importlib\n\nNAME = f\"{importlib.import_module('tables.web.view').__name__}\"\n",
        ["tables.operators.kv (operators) imports tables.web.view (web)"],
    ),
    "operators importing records": (
        "tables/operators/keys.py",
        "from tables.records.codecs import MAX_TS_MS\n",
        ["tables.operators.keys (operators) imports tables.records.codecs (records)"],
    ),
    "tables importing the batch side": (
        "tables/spec.py",
        "from pipeline.apps import JoinRef\n",
        ["tables.spec (declaration) imports pipeline.apps (pipeline)"],
    ),
    "the batch side importing the reference app, lazily": (
        "pipeline/kafka.py",
        "def settings():\n    from app.settings import Settings\n\n    return Settings\n",
        ["pipeline.kafka (pipeline) imports app.settings (app)"],
    ),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages' Python source."""
    copy = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            copy / package,
            ignore=lambda _, names: [n for n in names if n.endswith((".so", ".c"))],
        )
    return copy


def plant(tree: Path, tmp_path: Path, file: str, code: str) -> Path:
    planted = tmp_path / "tree"
    shutil.copytree(tree, planted)
    with (planted / file).open("a") as out:
        out.write("\n" + code)
    return planted


def test_the_copy_is_clean(tree: Path) -> None:
    assert (
        upward(graph(tree)) == [] and circles(graph(tree, by_name=False)) == [] and hidden_imports(tree) == []
    )
    assert set(dynamic_imports(tree)) == set(DYNAMIC) and private_assignor_imports(tree) == []


@pytest.mark.parametrize("kind", list(PLANTED))
def test_each_kind_of_violation_is_caught(kind: str, tree: Path, tmp_path: Path) -> None:
    file, code, wanted = PLANTED[kind]
    planted = plant(tree, tmp_path, file, code)
    assert upward(graph(planted)) == wanted


def test_a_planted_circle_is_caught(tree: Path, tmp_path: Path) -> None:
    planted = plant(tree, tmp_path, "tables/state/store.py", "from tables.runtime.task import JoinTask\n")
    assert upward(graph(planted)) == ["tables.state.store (state) imports tables.runtime.task (runtime)"]
    assert any(
        {"tables.state.store", "tables.runtime.task"} <= set(c) for c in circles(graph(planted, False))
    )


def test_a_planted_hidden_import_is_caught(tree: Path, tmp_path: Path) -> None:
    code = 'def later():\n    import importlib\n\n    return importlib.import_module("tables.state.store")\n'
    planted = plant(tree, tmp_path, "tables/runtime/task.py", code)
    assert upward(graph(planted)) == []  # a lower layer: allowed, but not hidden
    assert [line.rpartition(" imports ")[2] for line in hidden_imports(planted)] == ["tables.state.store"]


def test_a_planted_import_by_a_computed_name_is_caught(tree: Path, tmp_path: Path) -> None:
    code = 'import importlib\n\nimportlib.import_module("tables." + "web.view")\n'
    planted = plant(tree, tmp_path, "tables/runtime/task.py", code)
    assert set(dynamic_imports(planted)) - set(DYNAMIC) == {("tables/runtime/task.py", "<module>")}


def test_a_planted_private_assignor_import_is_caught(tree: Path, tmp_path: Path) -> None:
    code = "from assignor.faust_adapter.partition_assignor import install as install_directly\n"
    planted = plant(tree, tmp_path, "tables/runtime/worker.py", code)
    assert [line.rpartition(" imports ")[2] for line in private_assignor_imports(planted)] == [
        "assignor.faust_adapter.partition_assignor.install"
    ]


def test_a_planted_io_import_in_a_pure_layer_is_caught(tree: Path, tmp_path: Path) -> None:
    planted = plant(tree, tmp_path, "tables/operators/keys.py", "import socket\n")
    assert impure(planted) == ["tables.operators.keys imports socket"]
