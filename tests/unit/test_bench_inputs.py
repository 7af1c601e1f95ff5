"""The bench scripts refuse a comma-separated option that is not numbers (`runner.numbers`) with one
`error:` line and exit status 2, as dlc's own commands do, where it was a Python traceback.
No training here: each script runs in a subprocess with a bad option, which it must refuse before any
work, and with options that would stop any work it started anyway (a recipe that does not exist, a
--keep that is a file), in a process group of its own that is killed if it outlives its timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
NO_RECIPE = "no-such-recipe.yaml"


def _refused(script: str, args: list[str], tmp_path: Path) -> tuple[int, str, str]:
    """`python bench/SCRIPT ARGS` in tmp_path: its exit status, stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, so whatever it started goes with it on a timeout
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"bench/{script} {' '.join(args)} went on past its bad option")
    return proc.returncode, out, err


@pytest.mark.parametrize(
    ("script", "flag", "value", "others"),
    [
        ("ablate.py", "--seeds", "0,a", ["--recipe", NO_RECIPE, "default"]),
        ("ablate.py", "--paces", "1,0", ["--recipe", NO_RECIPE, "default"]),
        ("ablate.py", "--batches", "16,x", ["--recipe", NO_RECIPE, "default"]),
        ("phase.py", "--apart", "0,a", ["--recipe", NO_RECIPE]),
        ("phase.py", "--quorums", "0", ["--recipe", NO_RECIPE]),
        ("phase.py", "--seeds", "x", ["--recipe", NO_RECIPE]),
        ("preemption.py", "--seeds", "0,a", ["--recipe", NO_RECIPE, "--results", "RESULTS.md"]),
        ("kill_rates.py", "--rates", "x,0.1", ["--recipe", NO_RECIPE, "--results", "RESULTS.md"]),
        ("scaling.py", "--seeds", "0,a", ["--keep", "a-file", "--out", "RESULTS.md"]),
        ("scaling.py", "--sizes", "w32", ["--keep", "a-file", "--out", "RESULTS.md"]),
        ("data.py", "--seeds", "0,a", ["--only", "quality", "--keep", "a-file", "--results", "RESULTS.md"]),
        ("learner_loop.py", "--widths", "32,a", ["--recipe", NO_RECIPE, "--results", "RESULTS.md"]),
    ],
)
def test_a_bench_refuses_a_list_option_that_is_not_numbers(script, flag, value, others, tmp_path):
    (tmp_path / "a-file").write_text("")  # as --keep, a directory nothing can be made under
    code, out, err = _refused(script, [flag, value, *others], tmp_path)
    assert "Traceback" not in err, err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [err.strip().splitlines()[-1]], err  # one error line, the last
    assert errors[0].startswith(f"error: {flag} {value!r}: "), err
    assert out == "", out  # refused before it printed a table's first line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # and before it wrote anything


def test_ablate_refuses_a_setting_that_is_not_key_value(tmp_path):
    code, out, err = _refused("ablate.py", ["--recipe", NO_RECIPE, "tau:overlap_steps"], tmp_path)
    assert "Traceback" not in err, err
    assert code == 2, err
    assert err.strip().splitlines() == ["error: setting 'tau:overlap_steps': 'overlap_steps' is not KEY=VALUE"], err
    assert out == "" and list(tmp_path.iterdir()) == []
