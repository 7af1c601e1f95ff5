"""The import rule: a package imports only packages below it, no modules import each other round a circle,
and only the engine imports Ray."""

from __future__ import annotations

import ast
from pathlib import Path

from dlc.cli.layers import LAYERS as PACKAGES

REPO = Path(__file__).resolve().parents[1]

# Lowest first (dlc/cli/layers.py, which the layout page's table is generated from). A module may
# import its own package and any package listed before it.
LAYERS = tuple(package.name for package in PACKAGES)


def layer_of(module: str) -> int | None:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module imported anywhere in the file (also inside functions), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted([*(REPO / "dlc").rglob("*.py"), *(REPO / "chaos").rglob("*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if name != "dlc":  # the package's own __init__ holds only its version
            out.append((name, path))
    return out


def test_every_module_has_a_layer():
    assert [name for name, _ in modules() if layer_of(name) is None] == []


def test_no_module_imports_a_higher_layer():
    upward = []
    for name, path in modules():
        own = layer_of(name)
        for line, imported in imports(path):
            target = layer_of(imported)
            if target is not None and own is not None and target > own:
                upward.append(f"{path.relative_to(REPO)}:{line} imports {imported}")
    assert upward == []


def test_only_the_engine_imports_ray():
    outside = [
        f"{path.relative_to(REPO)}:{line}"
        for name, path in modules()
        if not name.startswith("dlc.engine")
        for line, imported in imports(path)
        if imported == "ray" or imported.startswith("ray.")
    ]
    assert outside == []


def test_the_engine_asks_an_algorithm_only_through_its_protocol():
    # Which algorithm runs is the recipe's business: the engine reaches them through dlc.algo's
    # registry (get_algorithm) and protocol, never into one algorithm's own modules.
    allowed = {"dlc.algo", "dlc.algo.protocol", "dlc.algo.counters"}
    reaching = [
        f"{path.relative_to(REPO)}:{line} imports {imported}"
        for name, path in modules()
        if name.startswith(("dlc.engine", "dlc.train", "dlc.cli"))
        for line, imported in imports(path)
        if imported.startswith("dlc.algo") and imported not in allowed
    ]
    assert reaching == []


def module_graph() -> dict[str, set[str]]:
    """Each module -> the modules of dlc and chaos it imports, anywhere in it (type-checking imports too:
    a circle of types is a circle of meaning); `from PACKAGE import MODULE` counts as the module."""
    names = {name for name, _ in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        found = {imported for _, imported in imports(path) if imported in names}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{alias.name}" for alias in node.names} & names
        graph[name] = found - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_round_a_circle():
    # Between packages the layers forbid it; inside a package this finds it.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles(module_graph()) == []
