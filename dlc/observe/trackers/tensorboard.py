"""TensorBoard: scalars and event notes in RUN/tensorboard, written by tensorboardX.

Each start of a run writes its own event file there (named for its time, host and process), and
TensorBoard reads the files of a directory as one run: a resumed run goes on in the same series.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

from dlc.config.schema import Recipe
from dlc.errors import UserError
from dlc.observe.trackers.points import Note, Point
from dlc.run.files import TENSORBOARD_DIR

if TYPE_CHECKING:
    from dlc.observe.trackers.fanout import Opening

FLUSH_S = 5  # tensorboard --logdir sees a live run this far behind
NOTES_TAG = "events"  # TensorBoard's text tab: faults, recoveries and chaos, one entry each
_WRITERS = itertools.count()  # tensorboardX names a file for its second and host, and overwrites one of that name


def installed() -> bool:
    """Whether tensorboardX imports here (dlc installed with --no-deps may lack it)."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return False
    return True


def check(recipe: Recipe) -> None:
    if not installed():
        raise UserError(
            "track lists tensorboard but the tensorboardX package is missing: pip install tensorboardX "
            "(dlc depends on it: reinstall dlc), or remove tensorboard from track"
        )


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, opening: Opening) -> None:
        from tensorboardX import SummaryWriter

        self.kept: dict[str, Any] = {}  # the directory is the TensorBoard run
        self.writer = SummaryWriter(
            logdir=str(opening.run_dir / TENSORBOARD_DIR),
            flush_secs=FLUSH_S,
            filename_suffix=f".{os.getpid()}.{next(_WRITERS)}",
        )

    def log(self, points: list[Point], t: float) -> None:
        for p in points:
            self.writer.add_scalar(p.name, p.value, p.step, walltime=t)

    def note(self, note: Note) -> None:
        self.writer.add_text(NOTES_TAG, note.text, note.step, walltime=note.t)

    def close(self, state: str) -> None:
        self.writer.close()


def open_tracker(opening: Opening) -> TensorBoardTracker:
    return TensorBoardTracker(opening)
