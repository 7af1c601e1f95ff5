"""mypy over dlc/ and chaos/, as pyproject.toml's [tool.mypy] configures it, finds no error.

Its cache is the repository's .mypy_cache (git-ignored): about 35 s from cold, a few seconds once warm.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.timeout(660)
def test_mypy_finds_no_error() -> None:
    pytest.importorskip("mypy")
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"mypy failed (python -m mypy):\n{done.stdout}{done.stderr}"
