"""Plain helpers and constants shared by several test modules: the real CLI in a subprocess and
in-process, end-to-end run control, a fake clock, the dashboard's learner table.

Test modules import these from here, never from one another or from conftest. Nothing here may
import JAX or Ray at import time: conftest imports this module before any test limits XLA's threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny.yaml"

# End-to-end runs of the 4-learner tiny recipe use this many steps per learner.
STEPS = "run.max_steps=300"


# -- the CLI ---------------------------------------------------------------------------------------


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


def invoke(*args: str) -> Any:
    """Run `dlc ARGS` in this process with typer's CliRunner (stdout and stderr kept apart)."""
    from typer.testing import CliRunner

    from dlc.cli.app import app

    return CliRunner().invoke(app, list(args))


def assert_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in result.stderr


# -- end-to-end runs -------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_train(*args: str) -> subprocess.Popen[str]:
    """`dlc train ARGS` in its own session, so `kill_tree` can take Ray's processes with it."""
    return subprocess.Popen(
        [sys.executable, "-m", "dlc.cli", "train", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the driver's whole process group (Ray's helpers included), if anything is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if json.loads((run_dir / "status.json").read_text())["step"] >= step:
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"run did not reach step {step}")


# -- fakes -----------------------------------------------------------------------------------------


class FakeClock:
    """Seconds that move only when a test sets `now`; starts at 0."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the dashboard's learner table -----------------------------------------------------------------


def row(text: str, learner: int) -> list[str]:
    """The learner table's row for `learner`, split into cells."""
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [str(learner)])


def cells(text: str, learner: int) -> dict[str, str]:
    """The learner table's row for `learner` by column name."""
    header = next(line for line in text.splitlines() if line.split()[:2] == ["id", "state"])
    return dict(zip(header.replace("last push", "last_push").split(), row(text, learner), strict=True))
