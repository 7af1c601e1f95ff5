"""The run directory: resolved recipe, event and metric logs, live status, final summary.

Everything a later reader (`dlc status`, `dlc report`, a person with `jq`) needs is a file here;
nothing requires a connection to the running job. The checkpoints live in the run's storage
(`dlc.run.storage`): the run directory itself, or a URL when `run.dir` is one.

A start is checked first (`RunDir.check`: it reads, and at most creates a directory that did not
exist), then created once the cluster has started (`RunDir.create`). Nothing in a directory that
holds an earlier run changes until this run has started: events and metrics recorded while the
engine starts are held in memory, and `begin` writes them with the recipe once every learner has
restored its checkpoint, so a refused start or resume leaves the directory as it was (`abandon`
puts back the storage's marker). A new (or emptied) directory is written at once, so `dlc status`
sees the run while the engine starts. An `observer` (the experiment trackers of `dlc.observe.trackers`)
is told of each event, metric and status as it is written, and of those written before it came.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import yaml

from dlc.config.budget import Budget
from dlc.config.load import dump_recipe
from dlc.config.schema import Recipe
from dlc.errors import UserError
from dlc.run import events
from dlc.run.files import (
    CHAOS_FILE,
    CHECKPOINT_DIR,
    CONTROL_FILE,
    EVENTS_FILE,
    METRICS_FILE,
    MLFLOW_DIR,
    PROFILE_DIR,
    RECIPE_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    TRACKERS_FILE,
    WANDB_DIR,
    jsonable,
    read_json,
    summary_superseded,
    syncer_journal_path,
    write_json_atomic,
)
from dlc.run.storage import MARKER_FILE, RunStorage, is_url, local_dir_of

# Recipe sections a resumed run must share with the checkpoint it resumes from.
_STATE_SHAPING = ("model", "data", "learners")
# Settings of other sections that shape what the checkpoints and the journal hold.
_STATE_SHAPING_KEYS = {"syncer": ("fragments",)}
# Learner settings that say where a learner runs, not what it holds: free to change on resume.
_PLACEMENT_KEYS = frozenset({"placement", "resources", "label_selector", "num_cpus", "num_gpus", "accelerator_type"})
# Model settings that say how the step is computed, not what the state holds: free to change on resume.
_COMPUTE_KEYS = frozenset({"remat"})
_FILES = (RECIPE_FILE, EVENTS_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE, TRACKERS_FILE)  # what the driver writes
_DIRS = (CHECKPOINT_DIR, TENSORBOARD_DIR, WANDB_DIR, MLFLOW_DIR, PROFILE_DIR)  # and the directories it keeps
_STEP = re.compile(r"^\d+$")  # orbax names a checkpoint by its step
_EARLY_MAX = 10_000  # records kept for an observer that has not come yet (the start's are a few dozen)


class Observer(Protocol):
    """Told of every record the run directory writes, as it writes it (the experiment trackers)."""

    def event(self, event: events.Event) -> None: ...

    def metric(self, record: dict[str, Any]) -> None: ...

    def status(self, snapshot: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Layout:
    """Where a run's files go, decided before anything is written."""

    path: Path  # the run directory on the driver's machine
    storage: RunStorage  # where the checkpoints are
    resume: bool
    fresh: bool


def completed_summary(path: Path, recipe: Recipe) -> dict[str, Any] | None:
    """The summary of the run in `path` when it ended completed and `recipe`'s budget asks for no
    more of it, else None. Resuming such a run would start the cluster and every learner only for
    each to find its budget spent (and would add that time to the run's wall clock)."""
    summary = read_json(path / SUMMARY_FILE)
    if not summary or summary.get("status") != "completed":
        return None
    if summary_superseded(path):
        return None  # a later resume wrote status.json and ended without a summary (a hard stop)
    try:
        spent = Budget(recipe).progress(float(summary["steps"]), int(summary["tokens_total"]), float(summary["wall_s"]))
    except (KeyError, TypeError, ValueError):  # a summary without these figures: resume as usual
        return None
    return summary if spent >= 1.0 else None


class Claim:
    """One `dlc train` at a time in a run directory: an exclusive lock on the directory itself.

    Two runs writing one directory would interleave their logs and checkpoints and overwrite each
    other's summary. The lock (`flock`) is the kernel's: it needs no file in the directory, and it
    goes with the process however that ends, SIGKILL included. It guards one machine's processes
    (and a shared filesystem's where it supports `flock`), not a URL's storage.
    """

    def __init__(self) -> None:
        self._fd: int | None = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def take(self, path: Path, what: str = "run.dir") -> None:
        """Hold `path` (an existing directory, the recipe's `what`) from now on, or UserError when
        another process does."""
        if self._fd is not None:
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # not readable: whatever the run cannot do there is refused where it tries
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _lock_holder(path)
            by = f" (pid {holder})" if holder else ""
            raise UserError(
                f"{what} {str(path)!r} is in use by another dlc train{by}: wait for it to end or stop it "
                f"(Ctrl-C), or choose another {what}"
            ) from None
        except OSError:  # a filesystem without flock: nothing to guard with
            os.close(fd)
            return
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock_holder(path: Path) -> int | None:
    """The pid holding an flock on `path`, from /proc/locks (Linux); None when it cannot be told."""
    with contextlib.suppress(OSError, ValueError):
        st = path.stat()
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
                return int(fields[4])
    return None


class RunDir:
    """An open run directory: `RunDir.check`, then `RunDir.create`; nothing of an earlier run's
    directory is written before `begin`."""

    def __init__(self, path: Path, recipe_text: str, storage: RunStorage | None = None, token: str = "") -> None:
        self.path = path
        self.storage = storage or RunStorage(str(path))
        self.storage_token = token  # what every learner must read in the storage's marker
        self._recipe_text = recipe_text
        self._held: list[tuple[str, str]] = []  # (file, line) recorded before `begin`
        self._files: dict[str, TextIO] = {}
        self.observer: Observer | None = None  # see `observe`
        self._early: list[events.Event | dict[str, Any]] | None = []  # records written before an observer came

    @classmethod
    def prepare(cls, recipe: Recipe, fresh: bool) -> tuple[RunDir, bool]:
        """Check, then create the recipe's run directory (no cluster in between: tests, tools)."""
        layout = cls.check(recipe, fresh)
        return cls.create(layout, recipe), layout.resume

    @staticmethod
    def check(recipe: Recipe, fresh: bool, claim: Claim | None = None) -> Layout:
        """Where the run goes and whether it resumes, or UserError with the fix.

        Resuming needs a checkpoint and a recipe whose model, data and learners match the saved
        one; otherwise the user is told to pass --fresh or pick another directory. A directory the
        run could not write, or whose names the run needs are taken, is refused here too.
        """
        location = recipe.run.dir or str(recipe.default_run_dir())
        what = "run.local_dir" if is_url(location) else "run.dir"
        path = local_dir_of(location, recipe.run.local_dir)
        if "\0" in str(path):
            raise UserError(f"{what} {str(path)!r} holds a NUL byte: choose another {what}")
        try:
            path.exists()
        except OSError as exc:  # a name too long, a loop of links
            raise UserError(f"{what} {str(path)!r} cannot be used ({exc.strerror}): choose another {what}") from None
        if path.exists() and not path.is_dir():
            raise UserError(f"{what} {str(path)!r} exists and is not a directory: choose another {what}")
        if path.is_dir():
            if claim is not None:  # before anything of it is read: another run may be writing it
                claim.take(path, what)
            _check_layout(path)
        storage = RunStorage(location if is_url(location) else str(path))
        try:
            has_checkpoint = storage.has_checkpoint()
        except OSError as exc:
            raise UserError(
                f"cannot read run.dir={location!r} ({type(exc).__name__}: {exc}): fix it or its access"
            ) from None
        if has_checkpoint and not fresh:
            _check_same_run(path, recipe, storage.read_recipe() if storage.is_url else None)
            if not storage.is_url:
                _check_checkpoints(path / CHECKPOINT_DIR)
        check_writable_dir(path, what)
        return Layout(path, storage, has_checkpoint and not fresh, fresh)

    @classmethod
    def create(cls, layout: Layout, recipe: Recipe, claim: Claim | None = None) -> RunDir:
        """The run directory of a start the cluster can hold: emptied with --fresh, the storage marked.

        A directory with no earlier run is written at once; one with an earlier run waits for `begin`.
        `claim`: taken by `check` when the directory existed, here when this start created it.
        """
        path, storage = layout.path, layout.storage
        what = "run.local_dir" if storage.is_url else "run.dir"
        ensure_writable_dir(path, what)
        if claim is not None:
            claim.take(path, what)
        if layout.fresh:  # everything an earlier run wrote: a fresh run's records are its own
            storage.clear_checkpoints()
            for name in (*_FILES, *_DIRS, CHAOS_FILE, CONTROL_FILE, MARKER_FILE):
                target = path / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        run_dir = storage.location if storage.is_url else str(path)
        text = dump_recipe(recipe.model_copy(update={"run": recipe.run.model_copy(update={"dir": run_dir})}))
        try:
            if storage.is_url and not layout.resume:
                storage.write_recipe(text)
            token = storage.mark()
        except OSError as exc:
            raise UserError(f"cannot write run.dir={storage.location!r} ({type(exc).__name__}: {exc})") from None
        rundir = cls(path, text, storage, token)
        if not any((path / name).exists() for name in (*_FILES, *_DIRS)):
            # No earlier run here to protect: show this one to dlc status while the engine starts.
            rundir.begin()
        return rundir

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def begun(self) -> bool:
        return bool(self._files)

    def begin(self) -> None:
        """The run has started: write the recipe, open the logs, write what was recorded so far."""
        if self.begun:
            return
        (self.path / RECIPE_FILE).write_text(self._recipe_text)
        if self.storage.is_url:  # beside the checkpoints too: a resume from the URL checks it
            self.storage.write_recipe(self._recipe_text)
        for name in (EVENTS_FILE, METRICS_FILE):
            self._files[name] = open(self.path / name, "a", buffering=1)  # noqa: SIM115 (closed by close)
        for name, line in self._held:
            self._files[name].write(line)
        self._held = []

    def abandon(self) -> None:
        """The start was refused before `begin`: put the storage's marker back as it was."""
        if not self.begun:
            self.storage.unmark()

    def _write(self, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        record = {"t": round(time.time(), 3), **fields}
        line = json.dumps(record, default=jsonable) + "\n"
        if name in self._files:
            self._files[name].write(line)
        else:
            self._held.append((name, line))
        return record

    def observe(self, observer: Observer | None) -> None:
        """Tell `observer` of every event, metric and status from now on (None: of nothing more), and first of
        the events and metrics written before it came (the run's start, its first evaluation)."""
        self.observer = observer
        early, self._early = self._early or [], None
        for record in early:
            self._tell(record)

    def event(self, event: events.Event) -> None:
        """Append one event (a record declared in `dlc.run.events`) to events.jsonl and tell the observer."""
        if events.checking() and (wrong := events.wrong(event)) is not None:
            raise ValueError(wrong)
        written = self._write(EVENTS_FILE, event.record())
        self._tell(event if event.t is not None else dataclasses.replace(event, t=written["t"]))

    def metric(self, **fields: Any) -> None:
        self._tell(self._write(METRICS_FILE, fields))

    def _tell(self, record: events.Event | dict[str, Any]) -> None:
        """The observer hears of a record written; one that has not come yet, of the first ones, when it comes."""
        if self.observer is not None:
            if isinstance(record, events.Event):
                self.observer.event(record)
            else:
                self.observer.metric(record)
        elif self._early is not None and len(self._early) < _EARLY_MAX:
            self._early.append(record)

    def write_status(self, status: dict[str, Any]) -> None:
        write_json_atomic(self.path / STATUS_FILE, status)
        if self.observer is not None:
            self.observer.status(status)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.path / SUMMARY_FILE, summary)

    def close(self) -> None:
        """Close the logs; what was held for a run that never started is dropped."""
        for f in self._files.values():
            f.close()
        self._held = []
        self._early = None


def check_writable_dir(path: Path, what: str) -> None:
    """UserError naming `what` unless files can be created in `path`, or `path` can be created: tried in
    its nearest existing ancestor, so nothing is left behind."""
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise UserError(
            f"{what} {str(path)!r} cannot be written (Not a directory: {str(existing)!r} is a file): "
            f"choose a writable {what}"
        )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"{what} {str(path)!r} cannot be written ({reason}): choose a writable {what}") from None


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
    for name in _DIRS:
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


def _check_same_run(path: Path, recipe: Recipe, saved_text: str | None = None) -> None:
    """Refuse a resume whose recipe differs from the saved one in what shapes the state."""
    saved_file = path / RECIPE_FILE
    unreadable = f"{saved_file} is not a recipe saved by dlc train: repair it, or pass --fresh to start over"
    if saved_text is None:
        if not saved_file.is_file():
            return
        try:
            saved_text = saved_file.read_text()
        except (UnicodeDecodeError, OSError):
            raise UserError(unreadable) from None
    try:
        saved = yaml.safe_load(saved_text) or {}
    except yaml.YAMLError:
        raise UserError(unreadable) from None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(s) or {}, dict) for s in _STATE_SHAPING):
        raise UserError(unreadable)
    current = _without_placement(recipe.model_dump(mode="json"))
    saved = _without_placement(saved)
    changed = [
        f"{section}.{k}"
        for section in _STATE_SHAPING
        for k in sorted(set(current[section]) | set(saved.get(section) or {}))
        if (saved.get(section) or {}).get(k) != current[section].get(k)
    ]
    for section, keys in _STATE_SHAPING_KEYS.items():
        was = saved.get(section)
        changed += [
            f"{section}.{k} from {was[k]!r} to {current[section][k]!r}"
            for k in keys
            if isinstance(was, dict) and k in was and was[k] != current[section][k]
        ]
    if changed:
        raise UserError(
            f"run directory {str(path)!r} holds a checkpoint of a different run (changed: {', '.join(changed)}): "
            "pass --fresh to start over there, or choose another run.dir"
        )


def _without_placement(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe without the learner settings that only say where learners run, nor the model
    settings that only say how its step is computed."""
    model = recipe.get("model")
    if isinstance(model, dict):
        recipe = {**recipe, "model": {k: v for k, v in model.items() if k not in _COMPUTE_KEYS}}
    learners = recipe.get("learners")
    if not isinstance(learners, dict):
        return recipe
    kept = {k: v for k, v in learners.items() if k not in _PLACEMENT_KEYS}
    if isinstance(kept.get("overrides"), list):
        overrides = []
        for o in kept["overrides"]:
            if isinstance(o, dict):  # what is left of a learner's override once placement is set aside
                o = {k: v for k, v in o.items() if k not in _PLACEMENT_KEYS and v is not None}
                if set(o) <= {"index"}:
                    continue
            overrides.append(o)
        kept["overrides"] = overrides
    return {**recipe, "learners": kept}
