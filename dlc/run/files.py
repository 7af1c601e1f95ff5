"""The run-directory contract: the files a run directory holds, how to find one, how to read them.

The driver writes these files, `dlc status`, `dlc report` and `dlc chaos` read them (chaos also
appends requests), possibly from another process or machine. Everything any of them needs to
agree on is here: names, learner states, the latest run, atomic JSON, tailing JSON lines.
Nothing here imports JAX, Ray or the recipe.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dlc.errors import UserError

RUNS_DIR = Path("runs")

RECIPE_FILE = "recipe.yaml"  # the resolved recipe the run was started with
EVENTS_FILE = "events.jsonl"  # one JSON object per event: deaths, rounds, checkpoints, ...
METRICS_FILE = "metrics.jsonl"  # train, eval and goodput samples
STATUS_FILE = "status.json"  # the driver's live snapshot, replaced about once a second
SUMMARY_FILE = "summary.json"  # written when the run ends
CHAOS_FILE = "chaos.jsonl"  # faults injected (by dlc chaos) and their observed outcomes
CONTROL_FILE = "control.jsonl"  # requests to the driver (slow, join, leave, links, ...)
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"  # TensorBoard event files (track: [tensorboard])
WANDB_DIR = "wandb"  # W&B's files for each start of the run (track: [wandb])
MLFLOW_DIR = "mlflow"  # the default MLflow store (track: [mlflow]): an SQLite database and the artifacts
MLFLOW_DB = "mlflow.db"  # ... the database, in MLFLOW_DIR
MLFLOW_ARTIFACTS = "artifacts"  # ... the artifacts, in MLFLOW_DIR
PROFILE_DIR = "profile"  # JAX profiler traces, one directory per learner (the recipe's profile section)
TRACKERS_FILE = "trackers.json"  # the tracker runs this run logs to, so that a resume goes on in them

# Learner states as status.json reports them.
HEALTHY_STATES = frozenset({"training", "slow"})  # stepping, so rounds wait for it
GONE_STATES = frozenset({"left", "finished", "failed"})  # will not step again in this run


def syncer_journal_path(run_dir: Path) -> Path:
    """Rounds closed since the syncer's last checkpoint (`.prev` beside it while one is written).

    Always in the run directory on the driver's machine, where the syncer runs (appended once per
    round: not something to do on an object store), also when the checkpoints are under a URL.
    """
    return run_dir / CHECKPOINT_DIR / "syncer-journal.pkl"


# -- finding a run -----------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in (RECIPE_FILE, STATUS_FILE, EVENTS_FILE))


def resolve_run(run: Path | None, runs_dir: Path = RUNS_DIR, live: bool = False) -> Path:
    """The run directory a command acts on: `run` as given, or the latest run under `runs_dir`.

    A reader (`live=False`: dlc status, dlc report) takes any run directory, and by default the
    one touched last. `live=True` (dlc chaos) acts on a run through its status.json: it needs
    one, accepts a bare run name under `runs_dir`, and by default takes the newest status.json.
    """
    if live:
        return _resolve_live(run, runs_dir)
    if run is None:
        candidates = [p for p in runs_dir.iterdir() if is_run_dir(p)] if runs_dir.is_dir() else []
        if not candidates:
            raise UserError(f"no run directory under {str(runs_dir)!r}: pass one, e.g. dlc status runs/tiny-<time>")
        return max(candidates, key=_touched)
    if not run.exists():
        raise UserError(f"run directory {str(run)!r} does not exist: pass a directory made by dlc train")
    if not is_run_dir(run):
        raise UserError(
            f"{str(run)!r} is not a run directory (no {RECIPE_FILE}, {STATUS_FILE} or {EVENTS_FILE}): "
            "pass a directory made by dlc train"
        )
    return run


def _resolve_live(run: Path | None, runs_dir: Path) -> Path:
    if run is None:
        candidates = sorted(runs_dir.glob(f"*/{STATUS_FILE}"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise UserError(
                f"no run directory with a {STATUS_FILE} under {str(runs_dir)!r}: start one with dlc train, "
                "or name the run directory: dlc chaos runs/NAME"
            )
        return candidates[-1].parent
    for candidate in (run, runs_dir / run):
        if (candidate / STATUS_FILE).is_file():
            return candidate
    raise UserError(
        f"{str(run)!r} is not a run directory (no {STATUS_FILE} there or under {str(runs_dir)!r}): "
        "give the directory dlc train printed, or leave RUN out to pick the latest run"
    )


def _touched(path: Path) -> float:
    # status.json is replaced about once a second while a run lives, which also bumps the directory.
    return max(p.stat().st_mtime for p in (path, path / STATUS_FILE, path / RECIPE_FILE) if p.exists())


def summary_superseded(run_dir: Path) -> bool:
    """Whether summary.json describes an earlier start of the run than status.json does: a resumed run
    keeps the previous summary until it ends (and keeps it after a hard stop, which writes none), so
    only a summary at least as new as status.json (within a second) describes the current state."""

    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    return mtime(run_dir / SUMMARY_FILE) < mtime(run_dir / STATUS_FILE) - 1.0


# -- JSON files --------------------------------------------------------------------------------


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=jsonable))
    os.replace(tmp, path)


def jsonable(obj: Any) -> Any:
    """`json.dumps(default=...)` for NumPy scalars and arrays."""
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_json(path: Path, attempts: int = 3) -> dict[str, Any] | None:
    """A JSON object file, or None when missing or unreadable (retried: a writer may be mid-way)."""
    for attempt in range(attempts):
        try:
            obj = json.loads(path.read_bytes())
            return obj if isinstance(obj, dict) else None
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            if attempt + 1 < attempts:
                time.sleep(0.05)
    return None


# -- JSON lines --------------------------------------------------------------------------------


def append_jsonl(path: Path, entry: dict[str, Any]) -> None:
    """Append one JSON line with a single write, so lines from several writers never interleave."""
    line = (json.dumps(entry) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class JsonlTail:
    """Yields the complete JSON-object lines appended to a file since the previous read."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.skipped = 0  # complete lines that were not a JSON object
        self.partial = False  # the file ends in a line still being written (or cut short)

    def read(self) -> list[dict[str, Any]] | None:
        """New records; None when the file shrank (a fresh run replaced it): start over."""
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    return None
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # an unterminated last line waits for the next read
        self.partial = end < len(data)
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                records.append(obj)
            else:
                self.skipped += 1
        return records


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """All JSON-object lines of a file and how many lines were skipped (a cut last line counts)."""
    tail = JsonlTail(path)
    records = tail.read() or []
    return records, tail.skipped + int(tail.partial)


def read_lines_after(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete JSON-object lines of `path` after byte `offset`, and the offset to read from next.

    For a reader that keeps only an offset between calls (the chaos controller, across restarts):
    a missing file is empty, and a file shorter than `offset` (replaced) is read from the start.
    """
    tail = JsonlTail(path, offset)
    records = tail.read()
    if records is None:
        tail = JsonlTail(path)
        records = tail.read() or []
    return records, tail.offset
