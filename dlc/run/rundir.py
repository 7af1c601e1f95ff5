"""The run directory: resolved recipe, event and metric logs, live status, final summary.

Everything a later reader (`dlc status`, `dlc report`, a person with `jq`) needs is a file here;
nothing requires a connection to the running job. The checkpoints live in the run's storage
(`dlc.run.storage`): the run directory itself, or a URL when `run.dir` is one.

A start is checked first (`RunDir.check`: read only, so a refused start changes nothing) and the
directory is written after the cluster has started (`RunDir.open`).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
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
from dlc.run.storage import RunStorage, is_url, local_dir_of

# Recipe sections a resumed run must share with the checkpoint it resumes from.
_STATE_SHAPING = ("model", "data", "learners")
# Learner settings that say where a learner runs, not what it holds: free to change on resume.
_PLACEMENT_KEYS = frozenset({"placement", "resources", "label_selector", "num_cpus", "num_gpus"})


@dataclass(frozen=True)
class Layout:
    """Where a run's files go, decided before anything is written."""

    path: Path  # the run directory on the driver's machine
    storage: RunStorage  # where the checkpoints are
    resume: bool
    fresh: bool


class RunDir:
    """An open run directory. Create with `RunDir.prepare`, or `RunDir.check` then `RunDir.open`."""

    def __init__(self, path: Path, storage: RunStorage | None = None, storage_token: str = "") -> None:
        self.path = path
        self.storage = storage or RunStorage(str(path))
        self.storage_token = storage_token  # what every learner must read in the storage's marker
        self._events: TextIO = open(path / EVENTS_FILE, "a", buffering=1)
        self._metrics: TextIO = open(path / METRICS_FILE, "a", buffering=1)

    @classmethod
    def prepare(cls, recipe: Recipe, fresh: bool) -> tuple[RunDir, bool]:
        """Check, then open (creating if needed) the recipe's run directory; returns it and whether to resume."""
        layout = cls.check(recipe, fresh)
        return cls.open(layout, recipe), layout.resume

    @staticmethod
    def check(recipe: Recipe, fresh: bool) -> Layout:
        """Where the run goes and whether it resumes; reads only.

        Resuming needs a checkpoint and a recipe whose model, data and learners match the saved
        one; otherwise the user is told to pass --fresh or pick another directory.
        """
        location = recipe.run.dir or str(recipe.default_run_dir())
        path = local_dir_of(location, recipe.run.local_dir)
        if path.exists() and not path.is_dir():
            what = "run.local_dir" if is_url(location) else "run.dir"
            raise UserError(f"{what} {str(path)!r} exists and is not a directory: choose another {what}")
        storage = RunStorage(location if is_url(location) else str(path))
        try:
            has_checkpoint = storage.has_checkpoint()
        except OSError as exc:
            raise UserError(
                f"cannot read run.dir={location!r} ({type(exc).__name__}: {exc}): fix it or its access"
            ) from None
        if has_checkpoint and not fresh:
            saved = storage.read_recipe() if storage.is_url else None
            _check_same_run(path, recipe, saved)
        return Layout(path, storage, has_checkpoint and not fresh, fresh)

    @classmethod
    def open(cls, layout: Layout, recipe: Recipe) -> RunDir:
        """Create or reuse the run directory (emptied with --fresh), save the recipe, mark the storage."""
        path, storage = layout.path, layout.storage
        if layout.fresh:
            storage.clear_checkpoints()
            if path.is_dir():
                for name in (CHECKPOINT_DIR, EVENTS_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE):
                    target = path / name
                    if target.is_dir():
                        shutil.rmtree(target)
                    elif target.exists():
                        target.unlink()
        path.mkdir(parents=True, exist_ok=True)
        run_dir = storage.location if storage.is_url else str(path)
        text = dump_recipe(recipe.model_copy(update={"run": recipe.run.model_copy(update={"dir": run_dir})}))
        (path / RECIPE_FILE).write_text(text)
        try:
            if storage.is_url:
                storage.write_recipe(text)
            token = storage.mark()
        except OSError as exc:
            raise UserError(f"cannot write run.dir={storage.location!r} ({type(exc).__name__}: {exc})") from None
        return cls(path, storage, token)

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


def _check_same_run(path: Path, recipe: Recipe, saved_text: str | None = None) -> None:
    saved_file = path / RECIPE_FILE
    if saved_text is None:
        if not saved_file.is_file():
            return
        saved_text = saved_file.read_text()
    try:
        saved = yaml.safe_load(saved_text) or {}
    except yaml.YAMLError:
        raise UserError(f"{saved_file} is not valid YAML: repair it, or pass --fresh to start over") from None
    current = _without_placement(recipe.model_dump(mode="json"))
    saved = _without_placement(saved)
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


def _without_placement(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe without the learner settings that only say where learners run."""
    learners = recipe.get("learners")
    if not isinstance(learners, dict):
        return recipe
    kept = {k: v for k, v in learners.items() if k not in _PLACEMENT_KEYS}
    if isinstance(kept.get("overrides"), list):
        kept["overrides"] = [
            {k: v for k, v in o.items() if k not in _PLACEMENT_KEYS} if isinstance(o, dict) else o
            for o in kept["overrides"]
        ]
    return {**recipe, "learners": kept}
