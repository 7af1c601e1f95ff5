"""MLflow: one MLflow run per dlc run, in a tracking server, a database, or an SQLite database in RUN/mlflow.

The run directory's database is the default, where MLflow 3 refuses its old file store unless the
reader sets MLFLOW_ALLOW_FILE_STORE (`mlflow ui` as a user types it would fail on one).

Metrics are sent in batches, at most one a second (a server is not asked once per round); the recipe
is logged as the run's parameters when it is created. MLflow has no annotations: `events/<kind>`
counts faults, recoveries and chaos, and their text is an artifact, `events/<start>.txt`, written
when the run ends.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from dlc.config.schema import Recipe
from dlc.errors import UserError
from dlc.observe.trackers.points import Note, Point
from dlc.run.files import MLFLOW_ARTIFACTS, MLFLOW_DB, MLFLOW_DIR

if TYPE_CHECKING:
    from dlc.observe.trackers.fanout import Opening

SEND_EVERY_S = 1.0
BATCH = 500  # metrics per request (MLflow takes up to 1000)
PARAMS_PER_BATCH = 100  # MLflow's limit
PARAM_CHARS = 500  # the shortest limit of a parameter value among MLflow versions
STATES = {"completed": "FINISHED", "interrupted": "KILLED"}  # anything else: FAILED


def _configured(recipe: Recipe) -> tuple[str | None, str]:
    """The tracking URI the user chose (None: the run directory's database), and where it was set."""
    if recipe.tracking.mlflow_uri:
        return recipe.tracking.mlflow_uri, "tracking.mlflow_uri"
    return os.environ.get("MLFLOW_TRACKING_URI") or None, "$MLFLOW_TRACKING_URI"


def store_uri(run_dir: Path) -> str:
    """The tracking URI of the run directory's own store: `mlflow ui --backend-store-uri` takes it."""
    return f"sqlite:///{(run_dir / MLFLOW_DIR / MLFLOW_DB).resolve()}"


def tracking_uri(recipe: Recipe, run_dir: Path) -> str:
    """The tracking URI the run logs to."""
    uri, _ = _configured(recipe)
    return uri or store_uri(run_dir)


def _sqlalchemy_missing() -> bool:
    """MLflow reaches a database through SQLAlchemy and creates its tables with Alembic, which
    mlflow-skinny does not bring."""
    try:
        import alembic  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        return True
    return False


def check(recipe: Recipe) -> None:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise UserError(
            "track lists mlflow but the mlflow package is missing: pip install 'dlc[track]' (or pip install "
            "mlflow-skinny), or remove mlflow from track"
        ) from None
    uri, where = _configured(recipe)
    if uri is None:  # the run directory's database (RunDir.check finds the directory writable)
        if _sqlalchemy_missing():
            raise UserError(
                "track lists mlflow, which logs to an SQLite database in the run directory through SQLAlchemy "
                "and Alembic, and they are missing: pip install 'dlc[track]' (or pip install sqlalchemy "
                "alembic), or set tracking.mlflow_uri to a tracking server"
            )
        return
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5):
                pass
        except urllib.error.HTTPError:
            pass  # a server answered (behind a login, say): reachable
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(
                f"{where}={uri!r} is unreachable ({reason}): start the MLflow server, correct the URI, "
                "or remove mlflow from track"
            ) from None
    elif scheme in ("", "file"):
        from dlc.run.rundir import check_writable_dir

        check_writable_dir(Path(urlparse(uri).path if scheme else uri), where)
    elif scheme.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql") and _sqlalchemy_missing():
        raise UserError(
            f"{where}={uri!r} is a database, which MLflow reaches through SQLAlchemy and Alembic: "
            "pip install 'dlc[track]' (or pip install sqlalchemy alembic), or use a tracking server"
        )


def _params(recipe: Recipe) -> dict[str, str]:
    """The recipe as MLflow parameters: dotted keys, values as text."""
    out: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            text = node if isinstance(node, str) else json.dumps(node)
            out[prefix] = text[:PARAM_CHARS]

    walk("", recipe.model_dump(mode="json"))
    return out


class MlflowTracker:
    name = "mlflow"

    def __init__(self, opening: Opening) -> None:
        uri = tracking_uri(opening.recipe, opening.run_dir)
        own = opening.run_dir / MLFLOW_DIR
        if uri == store_uri(opening.run_dir):
            own.mkdir(exist_ok=True)
        # Creating a database's tables, MLflow and Alembic say so at INFO on the console, once per table change.
        for name in ("mlflow.store.db.utils", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        if urlparse(uri).scheme in ("", "file"):
            # MLflow 3 keeps the file store in maintenance and refuses it unless asked for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # Its calls run in the driver's loop: a server that stops answering must fail them in seconds
        # (the tracker is then switched off), not after MLflow's default 7 retries of 120 s. Set by hand, they win.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        # The run directory's own store is kept as None: it moves with the directory.
        chosen, _ = _configured(opening.recipe)
        run_id = opening.kept.get("run_id") if opening.kept.get("tracking_uri") == chosen else None
        if run_id is not None:
            try:
                self.client.update_run(run_id, status="RUNNING")
            except MlflowException:  # deleted since: a new run
                run_id = None
        if run_id is None:
            project = opening.recipe.tracking.project
            experiment = self.client.get_experiment_by_name(project)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:  # a database's artifacts would go to ./mlruns, wherever dlc was started: into the run directory
                artifacts = (own / MLFLOW_ARTIFACTS).resolve().as_uri() if uri == store_uri(opening.run_dir) else None
                experiment_id = self.client.create_experiment(project, artifact_location=artifacts)
            run = self.client.create_run(
                experiment_id, run_name=opening.name, tags={"dlc.run_dir": str(opening.run_dir)}
            )
            run_id = run.info.run_id
            params = [Param(k, v) for k, v in _params(opening.recipe).items()]
            for at in range(0, len(params), PARAMS_PER_BATCH):
                self.client.log_batch(run_id, params=params[at : at + PARAMS_PER_BATCH])
        self.run_id: str = run_id
        self.kept: dict[str, Any] = {"run_id": run_id, "tracking_uri": chosen}
        self.notes: list[str] = []
        self.started = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self._pending: list[Any] = []
        self._sent = time.monotonic()

    def log(self, points: list[Point], t: float) -> None:
        from mlflow.entities import Metric

        ms = int(t * 1000)
        self._pending += [Metric(p.name, p.value, ms, p.step) for p in points]
        if time.monotonic() - self._sent >= SEND_EVERY_S or len(self._pending) >= BATCH:
            self._send()

    def _send(self) -> None:
        pending, self._pending = self._pending, []
        self._sent = time.monotonic()
        for at in range(0, len(pending), BATCH):
            self.client.log_batch(self.run_id, metrics=pending[at : at + BATCH])

    def note(self, note: Note) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(note.t))
        self.notes.append(f"{stamp} step {note.step}: {note.text}")

    def close(self, state: str) -> None:
        self._send()
        if self.notes:
            self.client.log_text(self.run_id, "\n".join(self.notes) + "\n", f"events/{self.started}.txt")
        self.client.set_terminated(self.run_id, STATES.get(state, "FAILED"))


def open_tracker(opening: Opening) -> MlflowTracker:
    return MlflowTracker(opening)
