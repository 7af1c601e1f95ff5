"""The run directory: resolved recipe, event and metric logs, live status, final summary.

Everything a later reader (`dlc status`, `dlc report`, a person with `jq`) needs is a file here;
nothing requires a connection to the running job.

Nothing in a directory that holds an earlier run changes until this run has started:
`RunDir.prepare` only checks, events and metrics recorded while the engine starts are held in
memory, and `open` writes them with the recipe once every learner has restored its checkpoint. A
refused start or resume leaves the directory as it was. A new (or emptied) directory is opened at
once, so `dlc status` sees the run while the engine starts.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from dlc.config.load import dump_recipe
from dlc.config.schema import Recipe
from dlc.errors import UserError
from dlc.run.files import (
    CHAOS_FILE,
    CHECKPOINT_DIR,
    CONTROL_FILE,
    EVENTS_FILE,
    METRICS_FILE,
    RECIPE_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    jsonable,
    syncer_journal_path,
    write_json_atomic,
)

# Recipe sections a resumed run must share with the checkpoint it resumes from.
_STATE_SHAPING = ("model", "data", "learners")
_FILES = (RECIPE_FILE, EVENTS_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE)  # what the driver writes
_STEP = re.compile(r"^\d+$")  # orbax names a checkpoint by its step


class RunDir:
    """An open run directory. Create with `RunDir.prepare`; nothing is written before `open`."""

    def __init__(self, path: Path, recipe_text: str) -> None:
        self.path = path
        self._recipe_text = recipe_text
        self._held: list[tuple[str, str]] = []  # (file, line) recorded before `open`
        self._files: dict[str, TextIO] = {}

    @classmethod
    def prepare(cls, recipe: Recipe, fresh: bool) -> tuple[RunDir, bool]:
        """Check (creating if needed) the recipe's run directory; returns it and whether to resume.

        Resuming needs a checkpoint and a recipe whose model, data and learners match the saved
        one; otherwise the user is told to pass --fresh or pick another directory, and nothing
        in the directory is touched.
        """
        path = Path(recipe.run.dir) if recipe.run.dir else recipe.default_run_dir()
        if "\0" in str(path):
            raise UserError(f"run.dir {str(path)!r} holds a NUL byte: choose another run.dir")
        try:
            path.exists()
        except OSError as exc:  # a name too long, a loop of links
            raise UserError(f"run.dir {str(path)!r} cannot be used ({exc.strerror}): choose another run.dir") from None
        if path.exists() and not path.is_dir():
            raise UserError(f"run.dir {str(path)!r} exists and is not a directory: choose another run.dir")
        if path.is_dir():
            _check_layout(path)
        checkpoints = path / CHECKPOINT_DIR
        has_checkpoint = checkpoints.is_dir() and any(checkpoints.iterdir())
        if has_checkpoint and not fresh:
            _check_same_run(path, recipe)
            _check_checkpoints(checkpoints)
        ensure_writable_dir(path, "run.dir")
        if fresh and path.is_dir():  # everything an earlier run wrote: a fresh run's records are its own
            for name in (*_FILES, CHECKPOINT_DIR, TENSORBOARD_DIR, CHAOS_FILE, CONTROL_FILE):
                target = path / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        text = dump_recipe(recipe.model_copy(update={"run": recipe.run.model_copy(update={"dir": str(path)})}))
        rundir = cls(path, text)
        if not any((path / name).exists() for name in (*_FILES, CHECKPOINT_DIR, TENSORBOARD_DIR)):
            # No earlier run here to protect: show this one to dlc status while the engine starts.
            rundir.open()
        return rundir, has_checkpoint and not fresh

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def opened(self) -> bool:
        return bool(self._files)

    def open(self) -> None:
        """The run has started: write the recipe, open the logs, write what was recorded so far."""
        if self.opened:
            return
        (self.path / RECIPE_FILE).write_text(self._recipe_text)
        for name in (EVENTS_FILE, METRICS_FILE):
            self._files[name] = open(self.path / name, "a", buffering=1)  # noqa: SIM115 (closed by close)
        for name, line in self._held:
            self._files[name].write(line)
        self._held = []

    def _write(self, name: str, fields: dict[str, Any]) -> None:
        line = json.dumps({"t": round(time.time(), 3), **fields}, default=jsonable) + "\n"
        if name in self._files:
            self._files[name].write(line)
        else:
            self._held.append((name, line))

    def event(self, kind: str, **fields: Any) -> None:
        self._write(EVENTS_FILE, {"kind": kind, **fields})

    def metric(self, **fields: Any) -> None:
        self._write(METRICS_FILE, fields)

    def write_status(self, status: dict[str, Any]) -> None:
        write_json_atomic(self.path / STATUS_FILE, status)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.path / SUMMARY_FILE, summary)

    def close(self) -> None:
        """Close the logs; what was held for a run that never started is dropped."""
        for f in self._files.values():
            f.close()
        self._held = []


def ensure_writable_dir(path: Path, what: str) -> None:
    """Create `path` if needed and make sure files can be created in it; UserError naming `what` if not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Creating a file is the only reliable test: permissions say nothing about a read-only mount,
        # a virtual filesystem such as /proc, or root.
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"{what} {str(path)!r} cannot be written ({reason}): choose a writable {what}") from None


def _check_layout(path: Path) -> None:
    """The names the run writes must be free for it: a file where a directory goes, or the reverse, is refused."""
    for name in _FILES:
        if (path / name).is_dir():
            raise UserError(
                f"{path / name} is a directory, but the run writes a file there: move it out of the run "
                "directory, or choose another run.dir"
            )
    for name in (CHECKPOINT_DIR, TENSORBOARD_DIR):
        if (path / name).exists() and not (path / name).is_dir():
            raise UserError(
                f"{path / name} is a file, but the run keeps a directory there: move it out of the run "
                "directory, or choose another run.dir"
            )


def _check_checkpoints(checkpoints: Path) -> None:
    """Each checkpoint folder, and each checkpoint in it, must be a directory.

    orbax skips a step that is not a directory and a learner with no folder starts from step 0,
    so damage here would otherwise resume a learner from an older step, or from nothing, silently.
    """
    journal = syncer_journal_path(checkpoints.parent)
    for folder in sorted(checkpoints.iterdir()):
        if folder.name in (journal.name, journal.with_suffix(".prev").name):
            if folder.is_dir():
                raise UserError(
                    f"the syncer journal {folder} is a directory: move it aside to resume from the last syncer "
                    "checkpoint (losing the rounds closed since), or pass --fresh to start over"
                )
            continue
        if folder.name != "syncer" and not folder.name.startswith("learner-"):
            continue  # not ours
        if not folder.is_dir():
            raise UserError(
                f"checkpoint folder {folder} is not a directory: restore it from a backup, or pass --fresh "
                "to start over"
            )
        for step in sorted(folder.iterdir()):
            if _STEP.match(step.name) and not step.is_dir():
                raise UserError(
                    f"checkpoint {step} is not a directory (orbax would resume from an older step without "
                    "saying so): restore it, delete it to resume from the one before, or pass --fresh"
                )


def _check_same_run(path: Path, recipe: Recipe) -> None:
    saved_file = path / RECIPE_FILE
    if not saved_file.is_file():
        return
    unreadable = f"{saved_file} is not a recipe saved by dlc train: repair it, or pass --fresh to start over"
    try:
        saved = yaml.safe_load(saved_file.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        raise UserError(unreadable) from None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(s) or {}, dict) for s in _STATE_SHAPING):
        raise UserError(unreadable)
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
