"""The syncer's journal: the rounds it closed and the pushes it refused for good since its checkpoint.

Each is appended as it happens. A refused push is kept because its learner re-sends it to a
restarted syncer, which must not judge it again.

A killed process loses nothing it has written (the page cache outlives it), so the last
checkpoint plus the journal is the syncer's state at the moment of death. Each journal after a
checkpoint starts with a snapshot of what the checkpoint does not hold (the merge history). While a
checkpoint is being written the journal before it stays beside the new one as `.prev`, so a death
mid-save still replays from the previous checkpoint.

A last record cut short by a death mid-write is dropped; any other damage (garbage, a record of
the wrong shape, a damaged record followed by others) is refused at resume with one line naming
the file, never replayed in part.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlc.algo.protocol import Reject
from dlc.errors import UserError

# Every record starts with the pickle protocol header: a tail that does not is not a record cut short.
_HEADER = pickle.PROTO + bytes([pickle.HIGHEST_PROTOCOL])
# Why a push is refused for good (a duplicate is settled by its first copy): journaled at once.
REFUSALS = frozenset(Reject) - {Reject.DUPLICATE}


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.previous = path.with_suffix(".prev")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 (lives as long as the syncer)
        self._cut_at: int | None = None  # where a record cut short by the last syncer's death starts

    def write(self, record: dict[str, Any]) -> None:
        self._drop_cut_record()
        pickle.dump(record, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._file.flush()

    def _drop_cut_record(self) -> None:
        # Only once this syncer writes (the run has started): a record appended after the cut one
        # would leave it in the middle, where the next restart must refuse it as damage.
        if self._cut_at is not None:
            os.truncate(self.path, self._cut_at)
            self._cut_at = None

    def records(self, fragment_sizes: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """Every record, oldest first: the previous journal's, then the current one's.

        UserError for a damaged journal; with `fragment_sizes`, also for a record that does not fit them.
        """
        previous, _ = _read(self.previous, fragment_sizes)
        current, whole_bytes = _read(self.path, fragment_sizes)
        if whole_bytes < self.path.stat().st_size:
            self._cut_at = whole_bytes
        return previous + current

    def rotate(self, snapshot: dict[str, Any]) -> None:
        """The state is about to be checkpointed: later rounds go to a fresh journal, which starts
        with `snapshot`, the part of that state the checkpoint does not hold."""
        self._drop_cut_record()
        self._file.close()
        os.replace(self.path, self.previous)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self.write(snapshot)

    def close(self) -> None:
        self._file.close()

    def drop_previous(self) -> None:
        """The checkpoint is complete: the rounds before it are in it."""
        self.previous.unlink(missing_ok=True)


def read_records(path: Path, fragment_sizes: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The records of one journal file. The last one may be cut short by a death mid-write: it is
    dropped and everything before it stands. Anything else unreadable is damage: UserError."""
    return _read(path, fragment_sizes)[0]


def _read(path: Path, fragment_sizes: Sequence[int] | None) -> tuple[list[dict[str, Any]], int]:
    """The whole records of `path`, and how many bytes they take."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        raise UserError(damaged(path, f"it cannot be read: {exc.strerror}")) from None
    stream = io.BytesIO(data)
    records: list[dict[str, Any]] = []
    start = 0
    while stream.tell() < len(data):
        start = stream.tell()
        try:
            record = pickle.load(stream)
        except Exception as exc:  # unpickling garbage raises almost anything
            rest = data[start:]
            truncated = isinstance(exc, EOFError) or "truncated" in str(exc)
            if truncated and rest[: len(_HEADER)] == _HEADER[: len(rest)]:
                return records, start  # a record cut short by the death: everything before it stands
            raise UserError(damaged(path, f"record {len(records) + 1}, at byte {start}, is unreadable")) from None
        problem = record_problem(record, fragment_sizes)
        if problem is not None:
            raise UserError(damaged(path, f"record {len(records) + 1}, at byte {start}, {problem}"))
        records.append(record)
    return records, len(data)


def record_problem(record: Any, fragment_sizes: Sequence[int] | None = None) -> str | None:
    """What is wrong with a record's shape (a round of one fragment, or the snapshot that starts a
    journal after a checkpoint), or None."""
    if not isinstance(record, dict):
        return f"is a {type(record).__name__}, not a round"
    if "history" in record and not isinstance(record["history"], dict):
        return f"holds a merge history that is a {type(record['history']).__name__}"
    if "refused" in record:  # a push refused for good: (learner, seq) and why
        pair, reason = record["refused"], record.get("reason")
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(k, int) for k in pair)):
            return f"names a refused push {pair!r}, not (learner, seq)"
        return None if isinstance(reason, str) and reason in REFUSALS else f"refuses a push for {reason!r}"
    if "fragment" not in record and set(record) <= {"history"}:
        return _history_problem(record.get("history", {}), fragment_sizes)
    fragment, version = record.get("fragment"), record.get("version")
    if not isinstance(fragment, int) or not isinstance(version, int) or fragment < 0 or version < 1:
        return f"names fragment {fragment!r} at version {version!r}"
    if fragment_sizes is None:
        return None
    if fragment >= len(fragment_sizes):
        return f"is a round of fragment {fragment}, but this run has {_numbered(fragment_sizes)}"
    if "theta" in record and np.size(record["theta"]) != fragment_sizes[fragment]:
        return f"holds {np.size(record['theta'])} values of fragment {fragment}, which has {fragment_sizes[fragment]}"
    if "theta" in record and not isinstance(record.get("outer"), dict):  # the outer step's state, its keys its own
        if "momentum" in record:
            return "was written by an older dlc (a momentum, not the outer step's state)"
        return f"holds an outer step state that is a {type(record.get('outer')).__name__}"
    return None


def _numbered(fragment_sizes: Sequence[int]) -> str:
    """How many fragments this run has and how they are numbered, for a message."""
    return f"{len(fragment_sizes)} fragments, numbered 0 to {len(fragment_sizes) - 1}"


def _history_problem(history: dict[Any, Any], fragment_sizes: Sequence[int] | None) -> str | None:
    """A snapshot's merge history: (learner, fragment) -> (base version, incarnation, seq, payload)."""
    for key, merged in history.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, int) for k in key)):
            return f"holds a merge history keyed by {key!r}, not (learner, fragment)"
        if fragment_sizes is not None and not 0 <= key[1] < len(fragment_sizes):
            return f"holds a merge history of fragment {key[1]}, but this run has {_numbered(fragment_sizes)}"
        if not (isinstance(merged, tuple) and len(merged) == 4):
            return f"holds a merge history entry for {key!r} that is not a merged push"
    return None


def check_journal(path: Path, fragment_sizes: Sequence[int]) -> None:
    """UserError if the journal (or the one kept beside it while a checkpoint is written) is damaged."""
    _read(path.with_suffix(".prev"), fragment_sizes)
    _read(path, fragment_sizes)


def damaged(path: Path, detail: str) -> str:
    return (
        f"the syncer journal {path} is damaged ({detail}): move it aside (mv {path} {path}.damaged) to resume "
        "from the last syncer checkpoint, losing the rounds closed since it, or pass --fresh to start over"
    )
