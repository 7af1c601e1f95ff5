"""The run directory: resolved recipe, event and metric logs, live status, final summary.

Everything a later reader (`dlc status`, `dlc report`, a person with `jq`) needs is a file here;
nothing requires a connection to the running job.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from dlc.config.load import dump_recipe
from dlc.config.schema import Recipe
from dlc.errors import UserError
from dlc.run.files import (
    CHECKPOINT_DIR,
    EVENTS_FILE,
    METRICS_FILE,
    RECIPE_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    jsonable,
    write_json_atomic,
)

# Recipe sections a resumed run must share with the checkpoint it resumes from.
_STATE_SHAPING = ("model", "data", "learners")


class RunDir:
    """An open run directory. Create with `RunDir.prepare`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._events: TextIO = open(path / EVENTS_FILE, "a", buffering=1)
        self._metrics: TextIO = open(path / METRICS_FILE, "a", buffering=1)

    @classmethod
    def prepare(cls, recipe: Recipe, fresh: bool) -> tuple[RunDir, bool]:
        """Open (creating if needed) the recipe's run directory; returns it and whether to resume.

        Resuming needs a checkpoint and a recipe whose model, data and learners match the saved
        one; otherwise the user is told to pass --fresh or pick another directory, and nothing
        in the directory is touched.
        """
        path = Path(recipe.run.dir) if recipe.run.dir else recipe.default_run_dir()
        if path.exists() and not path.is_dir():
            raise UserError(f"run.dir {str(path)!r} exists and is not a directory: choose another run.dir")
        has_checkpoint = (path / CHECKPOINT_DIR).is_dir() and any((path / CHECKPOINT_DIR).iterdir())
        if path.is_dir() and has_checkpoint and not fresh:
            _check_same_run(path, recipe)
        if fresh and path.is_dir():
            for name in (CHECKPOINT_DIR, EVENTS_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE):
                target = path / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        path.mkdir(parents=True, exist_ok=True)
        (path / RECIPE_FILE).write_text(
            dump_recipe(recipe.model_copy(update={"run": recipe.run.model_copy(update={"dir": str(path)})}))
        )
        return cls(path), has_checkpoint and not fresh

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def event(self, kind: str, **fields: Any) -> None:
        self._events.write(json.dumps({"t": round(time.time(), 3), "kind": kind, **fields}, default=jsonable) + "\n")

    def metric(self, **fields: Any) -> None:
        self._metrics.write(json.dumps({"t": round(time.time(), 3), **fields}, default=jsonable) + "\n")

    def write_status(self, status: dict[str, Any]) -> None:
        write_json_atomic(self.path / STATUS_FILE, status)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.path / SUMMARY_FILE, summary)

    def close(self) -> None:
        self._events.close()
        self._metrics.close()


def _check_same_run(path: Path, recipe: Recipe) -> None:
    saved_file = path / RECIPE_FILE
    if not saved_file.is_file():
        return
    try:
        saved = yaml.safe_load(saved_file.read_text()) or {}
    except yaml.YAMLError:
        raise UserError(f"{saved_file} is not valid YAML: repair it, or pass --fresh to start over") from None
    current = recipe.model_dump(mode="json")
    for section in _STATE_SHAPING:
        if saved.get(section) != current[section]:
            changed = sorted(
                k
                for k in set(current[section]) | set(saved.get(section) or {})
                if (saved.get(section) or {}).get(k) != current[section].get(k)
            )
            raise UserError(
                f"run directory {str(path)!r} holds a checkpoint of a different run "
                f"({', '.join(f'{section}.{k}' for k in changed)} changed): pass --fresh to start over "
                "there, or choose another run.dir"
            )
