"""The README and the manual under docs/: the front door's two commands, reference pages that match
the code, a strict mkdocs build, and guides whose commands run as written.

Which commands run. A fenced ```bash or ```console block whose line just above is exactly

    <!-- test: run -->

is run by `test_marked_commands_run`: each line of it is one command (a leading `$ ` and a trailing
`# comment` are dropped, a trailing backslash joins the next line), and each must start with `dlc`,
never `dlc train`, and exit 0 within seconds. They run in a scratch directory holding `recipes/`
(the repository's) and one finished run of tiny, `runs/tiny-20261121-101212` (written by
tests/fixtures_runs.py), so a guide may name either. The HTML comment does not show on the page.
Mark only what finishes in seconds; every other `dlc` line of the README and the manual is still
checked to name a real command and real options (`test_dlc_lines_name_real_commands_and_options`).
"""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from dlc.cli.app import app
from dlc.cli.reference import END_MARKER, MARKER, generators, page_with, undocumented_modules
from tests.fixtures_runs import finished_run
from tests.helpers import REPO, run_cli

README = REPO / "README.md"
DOCS = REPO / "docs"
REGENERATE = "python -m dlc.cli.reference"
RUN_MARK = "<!-- test: run -->"
FIXTURE_RUN = "runs/tiny-20261121-101212"
GENERATED = [
    "reference/recipe.md",
    "reference/chaos-plans.md",
    "reference/events.md",
    "reference/cli.md",
    "internals/modules.md",
    "internals/layout.md",
]

# A fenced shell block, with the marker line above it when there is one.
BLOCK = re.compile(r"^(?P<mark>[^\n]*)\n```(?:bash|console)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def commands(body: str) -> list[str]:
    """The commands of a shell block, one a line, continuations joined and prompts dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.removeprefix("$ ").strip() for line in joined.splitlines() if line.strip()]


def shell_blocks(path: Path) -> list[tuple[bool, str]]:
    """Every shell block of a Markdown file, and whether it is marked to run."""
    return [(m["mark"].strip() == RUN_MARK, m["body"]) for m in BLOCK.finditer("\n" + path.read_text())]


def marked_commands() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(REPO)), shlex.join(shlex.split(command, comments=True)))
        for path in markdown_files()
        for marked, body in shell_blocks(path)
        if marked
        for command in commands(body)
    ]


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block == ["pip install -e . && dlc train recipes/tiny.yaml", "pip install -e '.[test]' && pytest"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert block[1] in ci


@pytest.mark.parametrize("name", GENERATED)
def test_generated_page_is_current(name: str):
    page = (DOCS / name).read_text()
    assert page == page_with(page, generators()[name]()), f"docs/{name} drifted: run {REGENERATE}"


def test_every_generated_page_is_checked():
    assert sorted(generators()) == sorted(GENERATED)


def test_every_module_opens_its_docstring_with_its_concern():
    # the module index shows this line; a docstring whose first sentence runs on to a second line
    # would show cut short
    assert undocumented_modules() == [], "give each a docstring whose first line alone says its concern"


def test_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into the manual"
    assert [t for t in local if not (REPO / t).exists()] == []


def test_the_manual_builds_strictly(tmp_path: Path):
    # strict: a broken link or anchor, a page missing from the nav, or a missing snippet fails the build
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    # the benchmark figures are bench/RESULTS.md itself, included, not a copy
    heading = next(line for line in (REPO / "bench" / "RESULTS.md").read_text().splitlines() if line.startswith("#"))
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "benchmarks" / "results" / "index.html").read_text()))
    assert heading.lstrip("#").strip().replace("`", "") in page


def test_some_guides_mark_commands_to_run():
    pages = {page for page, _ in marked_commands()}
    assert {"docs/guides/planning.md", "docs/guides/watching.md", "docs/getting-started.md"} <= pages


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reader")
    (root / "recipes").symlink_to(REPO / "recipes")
    finished_run(root / FIXTURE_RUN)
    return root


@pytest.mark.parametrize(("page", "command"), marked_commands())
def test_marked_commands_run(page: str, command: str, scratch: Path):
    argv = shlex.split(command, comments=True)
    assert argv[0] == "dlc" and argv[1:2] != ["train"], f"{page}: only quick dlc commands are marked to run"
    result = run_cli(*argv[1:], cwd=scratch, timeout=120)
    assert result.returncode == 0, f"{page}: `{command}` exited {result.returncode}:\n{result.stderr}"
    assert result.stdout.strip(), f"{page}: `{command}` printed nothing"


def option_names() -> dict[str, set[str]]:
    """Every dlc command and the option names it takes."""
    group = typer.main.get_command(app)
    names = {}
    for name, command in group.commands.items():
        flags = [flag for param in command.params for flag in [*param.opts, *param.secondary_opts]]
        names[name] = {"--help", *(flag for flag in flags if flag.startswith("-"))}
    return names


def test_dlc_lines_name_real_commands_and_options():
    known = option_names()
    wrong = []
    for path in markdown_files():
        for _, body in shell_blocks(path):
            for line in commands(body):
                for part in line.split("&&"):
                    argv = shlex.split(part, comments=True)
                    if argv[:1] != ["dlc"] or len(argv) < 2:
                        continue
                    if argv[1].startswith("-"):
                        bad = [a for a in argv[1:] if a != "--help"]
                    elif argv[1] not in known:
                        bad = [argv[1]]
                    else:
                        bad = [a for a in argv[2:] if a.startswith("-") and a.split("=")[0] not in known[argv[1]]]
                    wrong += [f"{path.relative_to(REPO)}: {part.strip()}: {b}" for b in bad]
    assert wrong == []


def test_every_declared_event_is_built_by_the_code():
    """An event is written only as its declared record, so none goes undeclared; the other way round, a kind
    nothing builds any more is a stale line of the catalog."""
    from dlc.run.events import KINDS

    code = "\n".join(
        path.read_text()
        for path in sorted([*(REPO / "dlc").rglob("*.py"), *(REPO / "chaos").rglob("*.py")])
        if "dlc/run/events" not in path.as_posix()
    )
    built = set(re.findall(r"\bevents\.([A-Z]\w*)[(.]", code))
    assert len(built) > 40  # the scan still finds the code's events
    stale = sorted(kind for kind, record in KINDS.items() if record.__name__ not in built)
    assert stale == [], f"declared in dlc/run/events/ and built nowhere: {stale}"


def test_the_writer_keeps_the_prose_around_the_generated_text():
    page = f"intro\n{MARKER}\n\nold\n{END_MARKER}\n\nafter\n"
    assert page_with(page, "new") == f"intro\n{MARKER}\n\nnew\n\n{END_MARKER}\n\nafter\n"
    assert page_with(f"intro\n{MARKER}\n\nold\n", "new") == f"intro\n{MARKER}\n\nnew\n"
