"""The CLI as a user meets it: help is fast, bad input is one clear line and exit code 2.

Bad input runs in-process (typer's CliRunner, from the repository root as `run_cli` does): each
case fails while loading the recipe or the corpus, before `dlc train` starts Ray or writes a run
directory. Only the import-speed check needs a fresh interpreter.
"""

import subprocess
import sys

import pytest

from tests.helpers import REPO, TINY, assert_user_error, invoke, run_cli


def test_help_does_not_import_jax_or_ray():
    code = "import sys, dlc.cli.app; bad = {'jax', 'ray', 'flax', 'optax'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
    for args in (["--help"], ["train", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and "Usage" in result.stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["train", "recipes/nope.yaml"], ["recipe file 'recipes/nope.yaml' not found", "tiny.yaml"]),
        (["train", str(TINY), "learners.batchsze=4"], ["did you mean learners.batch_size?"]),
        (["train", str(TINY), "model.width=abc"], ["model.width='abc'"]),
        (["train", str(TINY), "oops"], ["'oops' is not key=value"]),
        (["train", str(TINY), "data.source=text", "data.paths=[/nonexistent/*.txt]"], ["matches no file"]),
    ],
)
def test_bad_input_exits_2_without_traceback(args, fragments, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert_user_error(invoke(*args, f"run.dir={tmp_path / 'r'}" if len(args) > 2 else "run.dir=x"), *fragments)


def test_empty_corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = invoke("train", str(TINY), "data.source=text", f"data.paths=[{empty}]", f"run.dir={tmp_path / 'r'}")
    assert_user_error(result, "corpus is empty")
    assert not (tmp_path / "r").exists()
