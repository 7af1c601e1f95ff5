"""The run's trackers as one: started once, told of every record, kept apart from training when one fails.

`check_trackers` runs before anything is written (a missing package, an unreachable MLflow server or
no W&B login is one line, exit code 2); `default_trackers` first leaves TensorBoard out of a recipe
that did not ask for it when tensorboardX is missing. `Trackers.open` starts them once the run has
begun and keeps their run ids in trackers.json, so a resume goes on in the same tracker runs; one
that fails to start then is left out with one line. The driver makes the result the run
directory's observer: each event, metric and status written reaches every tracker.
A tracker that raises later is switched off with one line; training goes on.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlc.config.schema import Recipe
from dlc.observe.trackers.points import EventCounts, Note, Point, metric_points, status_points
from dlc.run import events
from dlc.run.files import TRACKERS_FILE, read_json, write_json_atomic

STATUS_EVERY_S = 5.0  # status.json is rewritten every second; the trackers get a point every few seconds


@dataclass(frozen=True)
class Opening:
    """What a tracker starts from."""

    recipe: Recipe
    run_dir: Path
    kept: dict[str, Any]  # what it kept in trackers.json at an earlier start of this run ({} for none)

    @property
    def name(self) -> str:
        """The tracker run's name: the run directory's."""
        return self.run_dir.name


class Tracker(Protocol):
    name: str
    kept: dict[str, Any]  # written to trackers.json: what a resume needs to go on in the same tracker run

    def log(self, points: list[Point], t: float) -> None: ...

    def note(self, note: Note) -> None: ...

    def close(self, state: str) -> None: ...


def _module(name: str) -> Any:
    """The tracker `track` names: the module dlc.observe.trackers.<name> (the names: dlc.config.job.TRACKERS)."""
    return importlib.import_module(f"dlc.observe.trackers.{name}")


def default_trackers(recipe: Recipe) -> tuple[Recipe, str | None]:
    """`recipe`, without TensorBoard where the recipe left `track` at its default and tensorboardX is
    not installed (dlc installed with --no-deps, as on a machine that has its own JAX), and the line
    that says so; a recipe that names tensorboard is refused by `check_trackers` instead."""
    if "track" in recipe.model_fields_set or "tensorboard" not in recipe.track:
        return recipe, None
    if _module("tensorboard").installed():
        return recipe, None
    track = [name for name in recipe.track if name != "tensorboard"]
    return recipe.model_copy(update={"track": track}), (
        "no TensorBoard files for this run: tensorboardX is not installed (pip install tensorboardX, "
        "or set track=[] to silence this)"
    )


def check_trackers(recipe: Recipe) -> None:
    """UserError, with the fix, when a tracker of `recipe.track` could not start; writes nothing."""
    for name in recipe.track:
        _module(name).check(recipe)


class Trackers:
    """Every tracker of the run behind the run directory's observer interface (`dlc.run.rundir.Observer`)."""

    def __init__(
        self, trackers: list[Tracker], say: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.live = list(trackers)
        self.say = say
        self.clock = clock
        self.step = 0.0  # the learners' mean step, as the last status said
        self.state = "running"
        self._counts = EventCounts()
        self._last_status: float | None = None
        self._lock = threading.Lock()  # a tracker is told of one record at a time, whichever thread wrote it

    @classmethod
    def open(cls, recipe: Recipe, run_dir: Path, say: Callable[[str], None], extra: Sequence[Tracker] = ()) -> Trackers:
        """Start the trackers of `recipe.track` for `run_dir`, going on in the tracker runs trackers.json names;
        `extra`: trackers already started, beside them (the engine's Ray metrics)."""
        kept = read_json(run_dir / TRACKERS_FILE) or {}
        opened: list[Tracker] = list(extra)
        for name in recipe.track:
            # `check_trackers` refused what could be foreseen; the run directory has begun by now, so a
            # tracker that fails here is left out, like one that fails later, and training goes on.
            try:
                opened.append(_module(name).open_tracker(Opening(recipe, run_dir, kept.get(name) or {})))
            except Exception as exc:
                say(f"tracker {name} did not start ({_reason(exc)}): this run goes on without it")
        ids = {tracker.name: tracker.kept for tracker in opened if tracker.kept}
        if ids:
            write_json_atomic(run_dir / TRACKERS_FILE, {**kept, **ids})
        return cls(opened, say)

    # -- the run directory's observer ----------------------------------------------------------

    def metric(self, record: dict[str, Any]) -> None:
        points = metric_points(record)
        if points:
            self._each(lambda tracker: tracker.log(points, record["t"]))

    def event(self, event: events.Event) -> None:
        with self._lock:
            points = self._counts.points(event, self.step)
            note = self._counts.note(event, self.step)
        if points:
            t = event.t or time.time()
            self._each(lambda tracker: tracker.log(points, t))
        if note is not None:
            self._each(lambda tracker: tracker.note(note))

    def status(self, snapshot: dict[str, Any]) -> None:
        self.step = float(snapshot.get("step") or self.step)
        self.state = str(snapshot.get("state") or self.state)
        now = self.clock()
        if self.state == "running" and self._last_status is not None and now - self._last_status < STATUS_EVERY_S:
            return
        self._last_status = now
        points = status_points(snapshot)
        if points:
            t = float(snapshot.get("updated_at") or time.time())
            self._each(lambda tracker: tracker.log(points, t))

    def close(self) -> None:
        """End every tracker run, as the run ended (the last status's state)."""
        with self._lock:
            trackers, self.live = self.live, []
        for tracker in trackers:
            try:
                tracker.close(self.state)
            except Exception as exc:
                self.say(f"tracker {tracker.name} did not close cleanly ({_reason(exc)})")

    # -- one tracker failing ---------------------------------------------------------------------

    def _each(self, call: Callable[[Tracker], None]) -> None:
        with self._lock:
            for tracker in list(self.live):
                try:
                    call(tracker)
                except Exception as exc:
                    self.live.remove(tracker)
                    self.say(
                        f"tracker {tracker.name} failed ({_reason(exc)}): it is off for the rest of this run; "
                        "training goes on"
                    )
                    with contextlib.suppress(Exception):
                        tracker.close("failed")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
