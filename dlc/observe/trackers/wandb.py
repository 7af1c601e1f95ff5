"""Weights & Biases: one W&B run per dlc run, online or offline (files in RUN/wandb, `wandb sync` later).

Every series is plotted against its own axis (a learner's steps, the mean step, tokens), logged
beside it. W&B's own step counts milliseconds since the W&B run began, so the part of a resumed
run comes after the part before it, online or synced later. W&B has no annotations: faults,
recoveries and chaos are rows of the `notes` table, and `events/<kind>` counts them.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import string
import time
from typing import TYPE_CHECKING, Any

from dlc.config.schema import Recipe
from dlc.errors import UserError
from dlc.observe.trackers.points import Note, Point

if TYPE_CHECKING:
    from dlc.observe.trackers.fanout import Opening

NOTES_KEY = "notes"


def _mode(recipe: Recipe) -> str:
    return recipe.tracking.wandb_mode or os.environ.get("WANDB_MODE") or "online"


def check(recipe: Recipe) -> None:
    try:
        import wandb
    except ImportError:
        raise UserError(
            "track lists wandb but the wandb package is missing: pip install 'dlc[track]' (or pip install wandb), "
            "or remove wandb from track"
        ) from None
    if _mode(recipe) == "online" and not _logged_in(wandb):
        raise UserError(
            "track lists wandb, online, but W&B has no API key here: run wandb login (or set WANDB_API_KEY), "
            "or log offline with tracking.wandb_mode=offline and upload later with wandb sync"
        )


def _logged_in(wandb: Any) -> bool:
    """Whether W&B finds an API key (environment, ~/.netrc), asking nobody and without the network."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return bool(wandb.login(verify=False, prompt=False))
    except TypeError:  # an older wandb, without prompt=: wandb.init says what is missing
        return True
    except Exception:
        return False


def _new_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


class WandbTracker:
    name = "wandb"

    def __init__(self, opening: Opening) -> None:
        import wandb

        recipe, settings = opening.recipe, opening.recipe.tracking
        mode = _mode(recipe)
        if mode == "offline":  # offline sends nothing: W&B's own error reports would go out
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        run_id = opening.kept.get("id") or _new_id()
        self.origin_t = float(opening.kept.get("origin_t") or time.time())
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            name=opening.name,
            id=run_id,
            resume="allow",
            dir=str(opening.run_dir),
            mode=mode,  # type: ignore[arg-type]  # WANDB_MODE may hold any string: wandb itself checks it
            job_type="train",
            config=recipe.model_dump(mode="json"),
            allow_val_change=True,  # a resume may change what does not shape the state (max_steps, ...)
            settings=wandb.Settings(
                console="off",  # the driver's console is its own
                silent=True,
                save_code=False,
                x_disable_stats=True,  # the driver does not train: its machine's load says nothing of the learners'
                x_disable_machine_info=True,
            ),
        )
        self.kept: dict[str, Any] = {"id": self.run.id, "origin_t": self.origin_t}
        self.table = wandb.Table(columns=["t", "step", "kind", "text"], log_mode="INCREMENTAL")
        self._defined: set[str] = set()
        self._step = -1

    def log(self, points: list[Point], t: float) -> None:
        row: dict[str, float] = {}
        for p in points:
            if p.axis not in self._defined:
                self.run.define_metric(p.axis)
                self._defined.add(p.axis)
            if p.name not in self._defined:
                self.run.define_metric(p.name, step_metric=p.axis)
                self._defined.add(p.name)
            row[p.name] = p.value
            row[p.axis] = p.step
        if row:
            self.run.log(row, step=self._next_step(t))

    def note(self, note: Note) -> None:
        self.table.add_data(note.t, note.step, note.kind, note.text)
        self.run.log({NOTES_KEY: self.table}, step=self._next_step(note.t))

    def _next_step(self, t: float) -> int:
        """Milliseconds since the W&B run began, always above the last (W&B drops a step that goes back)."""
        self._step = max(self._step + 1, int((t - self.origin_t) * 1000))
        return self._step

    def close(self, state: str) -> None:
        import wandb

        try:
            self.run.finish(exit_code=0 if state == "completed" else 1)
        finally:
            wandb.teardown()  # ends W&B's service process


def open_tracker(opening: Opening) -> WandbTracker:
    return WandbTracker(opening)
