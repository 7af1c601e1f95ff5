"""Run storage: where a run's checkpoints live, and the check that a node can write there.

On one machine the storage is the run directory. On several, every learner writes its checkpoints
on whatever node it runs, so `run.dir` must be a path every node mounts at the same place (NFS, a
parallel filesystem) or a URL etils can write (gs://, s3://, az://; file:///abs/path is a URL for a
local or mounted path). With a URL, the checkpoints and a copy of the recipe go there and the
driver keeps its own files (status, events, metrics, summary, chaos) in a local directory, where
`dlc status` and `dlc report` read them.

A node that cannot see the storage must not silently write its checkpoints to a local directory of
the same name, where a resume would never find them: the driver writes a marker with a fresh token
at every start, and every learner and the syncer check that they read that token and can write a
file before they start.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from etils import epath

from dlc.errors import UserError
from dlc.run.files import CHECKPOINT_DIR, RECIPE_FILE

MARKER_FILE = "storage.json"  # at the storage's root: the token of the current start
FILE_SCHEME = "file://"


def is_url(location: str) -> bool:
    return "://" in location


def storage_path(location: str) -> epath.Path:
    """An etils path for a local path (made absolute: other nodes do not share our working directory) or a URL."""
    if location.startswith(FILE_SCHEME):
        location = location.removeprefix(FILE_SCHEME)
        if not location.startswith("/"):
            raise UserError(f"run.dir=file://{location}: a file URL needs an absolute path, file:///abs/path")
    if not is_url(location):
        return epath.Path(os.path.abspath(os.path.expanduser(location)))
    try:
        return epath.Path(location)
    except (KeyError, NotImplementedError):
        scheme = location.split("://", 1)[0]
        raise UserError(
            f"run.dir={location!r}: etils cannot write {scheme}:// URLs; use gs://, s3://, az://, file:///abs/path "
            "or a path every node mounts"
        ) from None


def url_basename(location: str) -> str:
    """The last part of a URL: the default name of the run's local directory."""
    return location.rstrip("/").rsplit("/", 1)[-1] or "run"


class RunStorage:
    """The run's checkpoints: `<root>/checkpoints/learner-<i>/`, `<root>/checkpoints/syncer/`."""

    def __init__(self, location: str) -> None:
        self._previous_marker: str | None = None  # what `mark` replaced
        self.location = location  # as the user gave it (a URL), or the absolute path
        self.root = storage_path(location)
        if not is_url(location):
            self.location = str(self.root)

    @property
    def is_url(self) -> bool:
        return is_url(self.location)

    @property
    def checkpoints(self) -> epath.Path:
        return self.root / CHECKPOINT_DIR

    def learner_dir(self, index: int) -> epath.Path:
        return self.checkpoints / f"learner-{index}"

    def syncer_dir(self) -> epath.Path:
        return self.checkpoints / "syncer"

    def has_checkpoint(self) -> bool:
        return self.checkpoints.is_dir() and any(self.checkpoints.iterdir())

    def clear_checkpoints(self) -> None:
        if self.checkpoints.is_dir():
            self.checkpoints.rmtree()

    def read_recipe(self) -> str | None:
        """The recipe saved with the checkpoints (URL storage), or None."""
        path = self.root / RECIPE_FILE
        return path.read_text() if path.is_file() else None

    def write_recipe(self, text: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / RECIPE_FILE).write_text(text)

    def mark(self) -> str:
        """Write the marker of this start; returns its token (the learners check they read the same)."""
        token = uuid.uuid4().hex
        self.root.mkdir(parents=True, exist_ok=True)
        marker = self.root / MARKER_FILE
        self._previous_marker = marker.read_text() if marker.is_file() else None
        marker.write_text(json.dumps({"token": token, "driver": socket.gethostname(), "t": round(time.time(), 3)}))
        return token

    def unmark(self) -> None:
        """Put back the marker as it was before `mark` (a start that was refused)."""
        marker = self.root / MARKER_FILE
        if self._previous_marker is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(self._previous_marker)

    def check(self, token: str, node: str) -> str | None:
        """None if this process sees the driver's marker and can write a file; else one line naming `node`."""
        where = f"run.dir={self.location!r}"
        try:
            seen = json.loads((self.root / MARKER_FILE).read_text()).get("token")
        except FileNotFoundError:
            seen = None
        except (OSError, ValueError) as exc:
            return f"node {node} cannot read {where} ({type(exc).__name__}: {exc}): make it readable from every node"
        if seen != token:
            return (
                f"node {node} cannot see {where}: the driver's {MARKER_FILE} is not there (a directory of that "
                "name local to the node?); give run.dir a path every node mounts at the same place, or a URL"
            )
        probe = self.checkpoints / f".probe-{uuid.uuid4().hex[:12]}"
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            return f"node {node} cannot write {where} ({type(exc).__name__}: {exc}): make it writable from every node"
        return None


def local_dir_of(location: str, local_dir: str | None) -> Path:
    """Where the driver keeps its files: run.dir itself for a path, run.local_dir (or runs/<name>) for a URL."""
    if not is_url(location):
        return Path(location)
    return Path(local_dir) if local_dir else Path("runs") / url_basename(location)


def describe(info: dict[str, Any]) -> str:
    """A node as error messages name it: its address, host name and the start of its Ray id."""
    node_id = str(info.get("node_id") or "")[:8]
    return f"{info.get('ip', '?')} ({info.get('host', '?')}, id {node_id})"
