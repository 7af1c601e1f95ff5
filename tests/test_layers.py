"""The import rule: a package imports only packages below it, and only the engine imports Ray."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Lowest first. A module may import its own package and any package listed before it.
LAYERS = (
    "dlc.errors",
    "dlc.units",  # byte sizes and their formatter
    "dlc.config",  # the recipe
    "dlc.data",  # corpora, tokenizers, prepared token shards: NumPy, no JAX
    "dlc.core",  # model, steps, learner, codec, fragments: JAX and NumPy only
    "dlc.net",  # transport and emulated links
    "dlc.run",  # the run-directory contract, checkpoints
    "dlc.algo",  # decoupled, blocking, none
    "dlc.observe",  # status, dashboard, report, goodput, snapshots
    "dlc.plan",  # simulate, bandwidth
    "dlc.use",  # a trained model read back from a run: sample, eval
    "chaos",
    "dlc.engine",  # Ray
    "dlc.train",
    "dlc.cli",
)


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
