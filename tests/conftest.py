"""Shared test set-up: one XLA thread per process, helpers to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Before any test imports JAX: several processes share 2 cores in CI.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny.yaml"


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `dlc ARGS` in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "dlc.cli", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.fixture
def tiny_recipe() -> Path:
    return TINY


# End-to-end runs of the 4-learner tiny recipe use this many steps per learner.
STEPS = "run.max_steps=300"


@pytest.fixture(scope="session")
def calm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fault-free 4-learner run of tiny, shared by the engine checks and as the chaos baseline."""
    run_dir = tmp_path_factory.mktemp("calm") / "run"
    result = run_cli("train", str(TINY), f"run.dir={run_dir}", STEPS, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir
