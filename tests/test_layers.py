"""The framework's packages are layered: each module imports only its own layer and those
below it, no import circle exists, and no import of the project's own modules hides in a
function or under TYPE_CHECKING to dodge one (docs/tables.md, "Layers").

An AST walk of the source (nothing is imported): every `import` and `from ... import`
anywhere in a module, resolved to the project's own modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tables", "assignor")

# Lowest first. A module belongs to the first layer with a prefix that names it or its package.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("planner core", ("assignor.core",)),
    ("planner", ("assignor.wire", "assignor")),  # `assignor` itself: the package's __init__
    ("faust adapter", ("assignor.faust_adapter",)),
    ("assignor tools", ("assignor.cli", "assignor.whatif", "assignor.comparisons", "assignor.__main__")),
    ("base", ("tables.settings", "tables.compiled", "tables._version")),
    ("operators", ("tables.operators", "tables.records")),
    ("declaration", ("tables.spec",)),
    ("kafka", ("tables.kafka",)),
    ("state", ("tables.state",)),
    ("runtime", ("tables.runtime",)),
    ("web", ("tables.web",)),
    ("api", ("tables.api", "tables")),  # `tables` itself: the public names
    ("test kit", ("tables.testing", "tables.dev")),
    ("command line", ("tables.cli",)),  # `tandem`: runs the commands of every layer (and pipeline/)
]
# Pure layers: no I/O library may be imported there.
PURE = {"planner core", "operators", "declaration", "base"}
IO_LIBRARIES = ("aiokafka", "rocksdict", "aiohttp", "socket", "faust.web", "urllib", "subprocess")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
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


def imports(path: Path, module: str) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, hidden): hidden when inside a function or under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, hidden: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = hidden or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = True
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, inner
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + [base])
                for alias in child.names:
                    yield f"{base}.{alias.name}", child.lineno, inner  # a module, or a name in one
            yield from walk(child, inner)

    yield from walk(tree, False)


def own(name: str, known: dict[str, Path]) -> str | None:
    """The project module `name` names (itself, or the module holding the name), if any."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for name, _, _ in imports(path, module):
            target = own(name, known)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a higher layer (a package's __init__ may re-export its own modules)."""
    return [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in sorted(edges.items())
        for t in sorted(targets)
        if layer_of(t) > layer_of(m) and not (m in PACKAGES and t.startswith(m + "."))
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


def test_each_module_imports_only_its_layer_and_those_below() -> None:
    found = upward(graph())
    assert not found, "\n".join(found)


def test_no_import_circle() -> None:
    assert not circles(graph())


def test_the_checks_see_an_added_upward_import_and_circle() -> None:
    """Not vacuous: the real graph with one upward edge added, which also closes a circle."""
    edges = graph()
    assert "tables.state.store" in edges["tables.runtime.task"]
    edges["tables.state.store"].add("tables.runtime.task")
    assert upward(edges) == ["tables.state.store (state) imports tables.runtime.task (runtime)"]
    assert any({"tables.state.store", "tables.runtime.task"} <= set(c) for c in circles(edges))


def test_no_project_import_hidden_in_a_function_or_type_checking() -> None:
    known = modules()
    hidden = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in known.items()
        for name, line, inner in imports(path, module)
        if inner and own(name, known) is not None
    ]
    assert not hidden, "\n".join(hidden)


def test_pure_layers_do_no_io() -> None:
    known = modules()
    found = [
        f"{module} imports {name}"
        for module, path in known.items()
        if LAYERS[layer_of(module)][0] in PURE
        for name, _, _ in imports(path, module)
        if any(name == lib or name.startswith(lib + ".") for lib in IO_LIBRARIES)
    ]
    assert not found, "\n".join(found)


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
