"""The syncer's journal: every round closed since the last checkpoint, appended as it closes.

A killed process loses nothing it has written (the page cache outlives it), so the last
checkpoint plus the journal is the syncer's state at the moment of death. Each journal after a
checkpoint starts with a snapshot of what the checkpoint does not hold (the merge history). While a checkpoint is
being written the journal before it stays beside the new one as `.prev`, so a death mid-save
still replays from the previous checkpoint.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.previous = path.with_suffix(".prev")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 (lives as long as the syncer)

    def write(self, record: dict[str, Any]) -> None:
        pickle.dump(record, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._file.flush()

    def records(self) -> list[dict[str, Any]]:
        """Every record, oldest first: the previous journal's, then the current one's."""
        return read_records(self.previous) + read_records(self.path)

    def rotate(self, snapshot: dict[str, Any]) -> None:
        """The state is about to be checkpointed: later rounds go to a fresh journal, which starts
        with `snapshot`, the part of that state the checkpoint does not hold."""
        self._file.close()
        os.replace(self.path, self.previous)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self.write(snapshot)

    def close(self) -> None:
        self._file.close()

    def drop_previous(self) -> None:
        """The checkpoint is complete: the rounds before it are in it."""
        self.previous.unlink(missing_ok=True)


def read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    try:
        with open(path, "rb") as f:
            while True:
                try:
                    records.append(pickle.load(f))
                except EOFError:
                    break
                except (pickle.UnpicklingError, ValueError, AttributeError):
                    break  # a record cut short by the death: everything before it stands
    except FileNotFoundError:
        pass
    return records
