"""The manual's generated pages: the command line, the module index, and the writer that keeps them current.

    python -m dlc.cli.reference            # rewrite the generated part of every generated page

A page is prose a person wrote, then MARKER, then the generated text, up to END_MARKER where the
page goes on in prose (or to its end); the writer replaces only what lies between, and
tests/test_docs.py fails when a page differs from what it would write. The module index reads each
module's docstring as text, importing nothing: its first line, a line of its own, says the module's
one concern.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import typer
from typer.core import TyperArgument, TyperOption

MARKER = "<!-- Generated from the code below this line; regenerate with: python -m dlc.cli.reference -->"
END_MARKER = "<!-- End of the generated text -->"
REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INDEXED = ("chaos", "dlc")  # the packages whose modules the module index lists


def _cell(text: str) -> str:
    """Text that stays inside one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def _default(option: TyperOption) -> str:
    if option.is_flag:
        return "on" if option.default else "off"
    if isinstance(option.show_default, str):  # the command chose how its default reads (2/3, not 0.666...)
        return option.show_default
    return "-" if option.default is None else str(option.default)


def _usage(name: str, command: typer.core.TyperCommand) -> str:
    pieces = [f"dlc {name}"]
    if any(isinstance(p, TyperOption) for p in command.params):
        pieces.append("[OPTIONS]")
    for param in command.params:
        if not isinstance(param, TyperArgument):
            continue
        shown = param.metavar or (param.name or "").upper()
        repeated = "..." if param.nargs == -1 else ""
        pieces.append(f"{shown}{repeated}" if param.required else f"[{shown}]{repeated}")
    return " ".join(pieces)


def _command_section(name: str, command: typer.core.TyperCommand) -> list[str]:
    lines = [f"## `dlc {name}`", "", _cell(command.help or ""), "", "```text", _usage(name, command), "```", ""]
    arguments = [p for p in command.params if isinstance(p, TyperArgument)]
    options = [p for p in command.params if isinstance(p, TyperOption)]
    if arguments:
        lines += ["| argument | meaning |", "|---|---|"]
        for arg in arguments:
            shown = arg.metavar or (arg.name or "").upper()
            need = "Required. " if arg.required else ""
            lines.append(f"| `{shown}` | {need}{_cell(getattr(arg, 'help', None) or '')} |")
        lines.append("")
    if options:
        lines += ["| option | default | meaning |", "|---|---|---|"]
        for opt in options:
            names = ", ".join(f"`{flag}`" for flag in [*opt.opts, *opt.secondary_opts])
            lines.append(f"| {names} | `{_default(opt)}` | {_cell(opt.help or '')} |")
        lines.append("")
    return lines


def cli_markdown() -> str:
    """Every `dlc` command with its usage, arguments, options, defaults and help, as Markdown."""
    from dlc.cli.app import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup), "the dlc app has several commands, so Typer makes it a group"
    lines = [_cell(group.help or ""), "", "```text", "dlc COMMAND --help", "```", ""]
    for name, command in group.commands.items():  # in the order the app registers them
        # Typer makes each of the app's commands a TyperCommand; a group's `commands` are typed as click's
        lines += _command_section(name, cast(typer.core.TyperCommand, command))
    return "\n".join(lines).rstrip() + "\n"


def purpose(path: Path) -> str | None:
    """The first line of a module's docstring, or None when it has none or its first sentence runs on."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        return None
    first, *rest = doc.splitlines()
    return None if rest and rest[0].strip() else first.strip()


def _modules(repo: Path) -> list[Path]:
    return sorted(path for package in INDEXED for path in (repo / package).rglob("*.py"))


def undocumented_modules(repo: Path = REPO) -> list[str]:
    """The modules whose docstring does not open with one line of its own saying what they are."""
    return [str(path.relative_to(repo)) for path in _modules(repo) if purpose(path) is None]


def modules_markdown(repo: Path = REPO) -> str:
    """Every module of dlc/ and chaos/ with the first line of its docstring, a table per package."""
    missing = undocumented_modules(repo)
    if missing:
        raise ValueError(f"open these modules' docstrings with one line saying their concern: {', '.join(missing)}")
    packages: dict[Path, list[Path]] = {}
    for path in _modules(repo):
        packages.setdefault(path.parent.relative_to(repo), []).append(path)
    lines = []
    for package in sorted(packages, key=lambda p: p.parts):  # a package just before its subpackages
        lines += [f"## `{package.as_posix()}/`", "", _cell(purpose(repo / package / "__init__.py") or ""), ""]
        modules = [path for path in packages[package] if path.name != "__init__.py"]
        if modules:
            lines += ["| module | concern |", "|---|---|"]
            lines += [f"| `{path.name}` | {_cell(purpose(path) or '')} |" for path in modules]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def generators() -> dict[str, Callable[[], str]]:
    """Each generated page's path under docs/, and the function that writes its text."""
    from chaos.plan import reference_markdown as plan_reference
    from dlc.cli.layers import layout_markdown
    from dlc.config.reference import reference_markdown as recipe_reference
    from dlc.run.events import catalog_markdown

    return {
        "reference/recipe.md": recipe_reference,
        "reference/chaos-plans.md": plan_reference,
        "reference/events.md": catalog_markdown,
        "reference/cli.md": cli_markdown,
        "internals/modules.md": modules_markdown,
        "internals/layout.md": layout_markdown,
    }


def page_with(page: str, generated: str) -> str:
    """The page with what follows its marker, up to its end marker or its end, replaced by `generated`."""
    if MARKER not in page:
        raise ValueError(f"the page has no line {MARKER!r}: add it where the generated text begins")
    before, after = page.split(MARKER, 1)
    rest = f"\n{END_MARKER}{after.split(END_MARKER, 1)[1]}" if END_MARKER in after else ""
    return f"{before}{MARKER}\n\n{generated.strip()}\n{rest}"


def write_pages(docs: Path = DOCS) -> list[Path]:
    """Rewrite the generated part of every generated page under `docs`; returns the pages that changed."""
    changed = []
    for name, generate in generators().items():
        path = docs / name
        old = path.read_text()
        new = page_with(old, generate())
        if new != old:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS
    for page in write_pages(where):
        print(f"rewrote {page}")
