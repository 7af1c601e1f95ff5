"""The experiment trackers: what the run directory records reaches TensorBoard, W&B (offline) and MLflow
(a file store), read back with each tracker's own reader; a resume goes on in the same tracker runs;
a tracker that cannot start, or fails mid-run, is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlc.config.load import load_recipe
from dlc.errors import UserError
from dlc.observe.trackers import Trackers, check_trackers, default_trackers
from dlc.observe.trackers.fanout import STATUS_EVERY_S
from dlc.observe.trackers.mlflow import store_uri
from dlc.observe.trackers.points import MEAN_STEP, TOKENS, Note, Point, metric_points, status_points
from dlc.run import events
from dlc.run.rundir import RunDir
from tests.helpers import TINY
from tests.tracker_files import (
    mlflow_series,
    tensorboard_scalars,
    tensorboard_texts,
    wandb_env,
    wandb_history,
    wandb_run_id,
    wandb_runs,
    wandb_series,
)

pytestmark = pytest.mark.timeout(120)

T0 = 1_790_000_000.0


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline with nothing under ~, MLflow in the run directory's database: nothing leaves the machine."""
    for key, value in wandb_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def wandb_core_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "wandb" in p.name()]


def status(step: float, state: str = "running", **extra: Any) -> dict[str, Any]:
    return {
        "state": state,
        "updated_at": T0 + step,
        "step": step,
        "tokens": int(step) * 1024,
        "tokens_per_s": 2048.0,
        "train_loss": 3.0,
        "goodput": 0.75,
        "badput": {"startup": 2.0, "dead": 0.5},
        "syncer": {"bytes_up": 1000 * step, "bytes_down": 3000 * step, "rounds_closed": 3, "mean_contributors": 1.5},
        **extra,
    }


def train_a_little(rundir: RunDir, steps: tuple[int, ...], state: str) -> None:
    """What a driver records over a few steps: train lines of two learners, an evaluation, a round, a fault."""
    for step in steps:
        for learner in (0, 1):
            rundir.metric(
                kind="train", learner=learner, step=step, loss=4.0 - step / 100, grad_norm=1.0, tokens_per_s=1e3
            )
        rundir.write_status(status(step))
        accepted = events.PushAccepted(
            learner=0, fragment=1, seq=step, base_version=step - 1, version=step, bytes=100, steps=10
        )
        rundir.event(accepted)  # not for the trackers
        rundir.event(
            events.RoundClosed(
                fragment=1,
                version=step,
                contributors=[0, 1],
                weights=[0.5, 0.5],
                tokens=[5120, 5120],
                seqs=[step, step],
            )
        )
    rundir.metric(kind="eval", step=float(steps[-1]), tokens=steps[-1] * 2048, eval_loss=3.5, eval_bpb=5.0)
    rundir.event(events.Chaos.of({"fault": "kill", "target": "learner 1", "learner": 1, "phase": "injected"}))
    rundir.write_status(status(steps[-1], state))


def start(recipe_overrides: list[str], run_dir: Path, steps: tuple[int, ...], state: str = "completed") -> list[str]:
    """One start of a run in `run_dir`: open the trackers, record `steps`, close; what they said."""
    recipe = load_recipe(TINY, recipe_overrides)
    said: list[str] = []
    run_dir.mkdir(exist_ok=True)
    rundir = RunDir(run_dir, "")
    rundir.begin()
    rundir.metric(kind="eval", step=steps[0] - 10, tokens=0, eval_loss=5.5, eval_bpb=8.0)  # while the engine starts
    trackers = Trackers.open(recipe, run_dir, said.append)
    trackers.clock = lambda: 0.0  # no time passes: a running status after the first waits STATUS_EVERY_S
    rundir.observe(trackers)  # told of the evaluation before it came too
    train_a_little(rundir, steps, state)
    rundir.observe(None)
    trackers.close()
    rundir.close()
    return said


ALL = ["track=[tensorboard,wandb,mlflow]", "tracking.wandb_mode=offline"]


def test_every_tracker_reads_back_what_the_run_recorded(tmp_path, offline, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    assert start(ALL, run, (10, 20)) == []
    assert wandb_core_processes() == []  # W&B's service ended with the run

    tb = tensorboard_scalars(run / "tensorboard")  # TensorBoard keeps 32-bit floats
    assert tb["train/loss/learner_1"] == [(10, pytest.approx(3.9)), (20, pytest.approx(3.8))]  # at its own step
    assert tb["eval/loss"] == [(0, 5.5), (20, 3.5)] and tb["eval/bits_per_byte"] == [(0, 8.0), (20, 5.0)]
    assert tb["eval/loss_vs_tokens"] == [(0, 5.5), (40960, 3.5)]  # the same losses against tokens
    # Status every few seconds at most (the one of step 20 came at once: skipped), and the last one always.
    assert [s for s, _ in tb["goodput/goodput"]] == [10, 20] and tb["goodput/badput_s/dead"][0] == (10, 0.5)
    assert tb["sync/bytes_down"] == [(10, 30000.0), (20, 60000.0)]
    assert tb["sync/contributors"] == [(10, 2.0), (20, 2.0)]  # rounds at the mean step the last status gave
    assert tb["events/chaos"] == [(20, 1.0)] and "events/push_accepted" not in tb
    (note,) = tensorboard_texts(run / "tensorboard", "events")
    # The record's fields in their declared order (fault, phase, target, learner), then its line's others.
    assert note[0] == 20 and 'chaos fault="kill" target="learner 1" learner=1 phase="injected"' in note[1]

    ids = json.loads((run / "trackers.json").read_text())
    (offline_run,) = wandb_runs(run)
    assert wandb_run_id(offline_run) == ids["wandb"]["id"]
    assert wandb_series(offline_run, "train/loss/learner_0", "step/learner_0") == [(10, 4.0 - 0.1), (20, 4.0 - 0.2)]
    assert wandb_series(offline_run, "eval/loss", MEAN_STEP) == [(0, 5.5), (20, 3.5)]
    assert wandb_series(offline_run, "eval/loss_vs_tokens", TOKENS) == [(0, 5.5), (40960, 3.5)]
    (table,) = (offline_run / "files" / "media" / "table").glob("notes_*.table.json")  # the notes, one row each
    (row,) = json.loads(table.read_text())["data"]
    assert row[1:3] == [20, "chaos"] and 'target="learner 1"' in row[3]

    from mlflow.tracking import MlflowClient

    # MLflow's default: an SQLite database in the run directory, readable with no MLFLOW_ALLOW_FILE_STORE,
    # its artifacts beside it (not in ./mlruns, where MLflow puts a database's by default).
    assert (run / "mlflow" / "mlflow.db").is_file() and not (tmp_path / "mlruns").exists()
    uri = store_uri(run)
    assert uri == f"sqlite:///{run / 'mlflow' / 'mlflow.db'}"
    run_id = ids["mlflow"]["run_id"]
    assert mlflow_series(uri, run_id, "train/loss/learner_0") == [(10, 3.9), (20, 3.8)]
    assert mlflow_series(uri, run_id, "eval/loss_vs_tokens") == [(0, 5.5), (40960, 3.5)]
    assert mlflow_series(uri, run_id, "events/chaos") == [(20, 1.0)]
    client = MlflowClient(tracking_uri=uri)
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.data.params["learners.count"] == "4"
    assert logged.info.run_name == "run" and logged.data.tags["dlc.run_dir"] == str(run)
    (artifact,) = client.list_artifacts(run_id, "events")
    text = Path(client.download_artifacts(run_id, artifact.path, str(tmp_path))).read_text()
    assert "step 20: chaos" in text


def test_a_resume_goes_on_in_the_same_tracker_runs(tmp_path, offline):
    run = tmp_path / "run"
    start(ALL, run, (10,), state="interrupted")
    first = json.loads((run / "trackers.json").read_text())
    start(ALL, run, (20, 30))
    assert json.loads((run / "trackers.json").read_text()) == first  # the same W&B and MLflow runs

    # TensorBoard: a second event file beside the first, one series across both.
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert [s for s, _ in tensorboard_scalars(run / "tensorboard")["train/loss/learner_0"]] == [10, 20, 30]
    # W&B offline: a run directory per start, both of the same W&B run; W&B's step goes on from the first.
    before, after = wandb_runs(run)
    assert wandb_run_id(before) == wandb_run_id(after) == first["wandb"]["id"]
    assert wandb_series(after, "train/loss/learner_0", "step/learner_0") == [(20, 3.8), (30, 3.7)]
    assert max(r["_step"] for r in wandb_history(before)) < min(r["_step"] for r in wandb_history(after))
    # MLflow: the same run gained the points, and ended as the second start did.
    uri = store_uri(run)
    run_id = first["mlflow"]["run_id"]
    assert mlflow_series(uri, run_id, "train/loss/learner_0") == [(10, 3.9), (20, 3.8), (30, 3.7)]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.list_artifacts(run_id, "events")) in (1, 2)  # one notes file per start (same second: one)
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1


# -- the fan-out, with recording trackers ------------------------------------------------------------------


class Recorder:
    """A tracker that keeps what it is sent; `fail_on` makes `log` raise from that call on."""

    def __init__(self, name: str = "recorder", fail_on: int | None = None) -> None:
        self.name, self.kept, self.fail_on = name, {}, fail_on
        self.points: list[Point] = []
        self.notes: list[Note] = []
        self.closed: list[str] = []
        self.calls = 0

    def log(self, points: list[Point], t: float) -> None:
        self.calls += 1
        if self.fail_on is not None and self.calls >= self.fail_on:
            raise ConnectionError("server went away\nsecond line")
        self.points += points

    def note(self, note: Note) -> None:
        self.notes.append(note)

    def close(self, state: str) -> None:
        self.closed.append(state)


def test_status_reaches_the_trackers_every_few_seconds_and_at_the_end():
    clock = [0.0]
    recorder = Recorder()
    trackers = Trackers([recorder], print, clock=lambda: clock[0])
    for now in (0.0, 1.0, STATUS_EVERY_S - 0.5, STATUS_EVERY_S + 0.1, STATUS_EVERY_S + 0.2):
        clock[0] = now
        trackers.status(status(now))
    clock[0] += 0.1
    trackers.status(status(9.0, state="completed"))  # the last one is never skipped
    trackers.close()
    goodput = [p.step for p in recorder.points if p.name == "goodput/goodput"]
    assert goodput == [0, 5, 9] and recorder.closed == ["completed"]


def test_a_tracker_that_fails_mid_run_is_switched_off_with_one_line():
    said: list[str] = []
    healthy, failing = Recorder("tensorboard"), Recorder("mlflow", fail_on=2)
    trackers = Trackers([healthy, failing], said.append)
    for step in (1, 2, 3):
        trackers.metric({"t": T0, "kind": "train", "learner": 0, "step": step, "loss": 2.0})
    trackers.close()
    assert [p.step for p in healthy.points] == [1, 2, 3] and [p.step for p in failing.points] == [1]
    assert said == [
        "tracker mlflow failed (ConnectionError: server went away): it is off for the rest of this run; "
        "training goes on"
    ]
    assert failing.calls == 2 and failing.closed == ["failed"] and healthy.closed == ["running"]


def test_records_become_named_points():
    # Non-finite or missing values are not plottable; goodput lines are the status's.
    train = {"kind": "train", "learner": 3, "step": 7, "loss": float("nan"), "grad_norm": 0.5, "tokens_per_s": None}
    assert metric_points(train) == [Point("train/grad_norm/learner_3", 0.5, 7, "step/learner_3")]
    assert metric_points({"kind": "goodput", "step": 7, "goodput": 0.5}) == []
    evaluation = {"kind": "eval", "step": 12.6, "tokens": 4096, "eval_loss": 2.5, "eval_bpb": 3.6}
    assert [(p.name, p.step, p.axis) for p in metric_points(evaluation)] == [
        ("eval/loss", 13, MEAN_STEP),
        ("eval/bits_per_byte", 13, MEAN_STEP),
        ("eval/loss_vs_tokens", 4096, TOKENS),
    ]
    names = {p.name: p.value for p in status_points(status(4.0))}
    assert names["sync/bytes_up"] == 4000.0 and names["goodput/badput_s/startup"] == 2.0
    assert names["run/tokens_per_s"] == 2048.0 and names["sync/rounds"] == 3


def test_each_numbered_learners_status_row_is_its_own_series():
    # A hot spare's (named) row is not; an MFU the device's peak cannot give is left out.
    rows = [{"id": 0, "step": 5, "tokens": 640, "tokens_per_s": 99.0, "mfu": None}, {"id": "spare-0", "step": 0}]
    names = {p.name: p.value for p in status_points(status(4.0, learners=rows))}
    assert names["learner/tokens/learner_0"] == 640 and names["learner/step/learner_0"] == 5
    assert names["learner/tokens_per_s/learner_0"] == 99.0
    assert "learner/mfu/learner_0" not in names and not [n for n in names if "spare" in n]


# -- trackers that cannot start ------------------------------------------------------------------------------


def test_the_default_tensorboard_is_left_out_where_tensorboardx_is_missing_and_a_named_one_refused(monkeypatch):
    # Installed: the default stays.
    assert default_trackers(load_recipe(TINY)) == (load_recipe(TINY), None)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if it were not installed (pip install --no-deps)
    recipe, line = default_trackers(load_recipe(TINY))
    assert recipe.track == [] and "tensorboardX is not installed (pip install tensorboardX" in line
    check_trackers(recipe)
    # Asked for by name, it is refused instead, in one line with the fix.
    for named in (load_recipe(TINY, ["track=[tensorboard]"]), load_recipe(TINY, ["track=tensorboard"])):
        assert default_trackers(named) == (named, None)
        with pytest.raises(UserError, match="tensorboardX package is missing: pip install tensorboardX"):
            check_trackers(named)


def test_a_tracker_that_cannot_start_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(UserError, match=r"wandb package is missing: pip install 'dlc\[track\]'"):
        check_trackers(load_recipe(TINY, ["track=[tensorboard,wandb]"]))
    monkeypatch.delitem(sys.modules, "wandb")
    # Online with no API key anywhere: wandb login, or offline.
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in wandb_env(tmp_path).items():
        if key != "WANDB_MODE":
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with pytest.raises(UserError, match="W&B has no API key here: run wandb login .* tracking.wandb_mode=offline"):
        check_trackers(load_recipe(TINY, ["track=[wandb]"]))
    check_trackers(load_recipe(TINY, ["track=[wandb]", "tracking.wandb_mode=offline"]))
    # An MLflow server nobody listens at (a closed loopback port), from the recipe or the environment.
    with pytest.raises(UserError, match=r"tracking.mlflow_uri='http://127.0.0.1:9' is unreachable .* start the MLflow"):
        check_trackers(load_recipe(TINY, ["track=[mlflow]", "tracking.mlflow_uri=http://127.0.0.1:9"]))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    with pytest.raises(UserError, match=r"\$MLFLOW_TRACKING_URI='http://127.0.0.1:9' is unreachable"):
        check_trackers(load_recipe(TINY, ["track=[mlflow]"]))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'file' / 'mlruns'}")
    with pytest.raises(UserError, match="cannot be written"):
        check_trackers(load_recipe(TINY, ["track=[mlflow]"]))
    # MLflow's database needs SQLAlchemy and Alembic, which mlflow-skinny alone does not bring.
    monkeypatch.setattr("dlc.observe.trackers.mlflow._sqlalchemy_missing", lambda: True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(UserError, match=r"SQLite database in the run directory .* pip install 'dlc\[track\]'"):
        check_trackers(load_recipe(TINY, ["track=[mlflow]"]))
    with pytest.raises(UserError, match=r"'sqlite:///x.db' is a database, .* pip install 'dlc\[track\]'"):
        check_trackers(load_recipe(TINY, ["track=[mlflow]", "tracking.mlflow_uri=sqlite:///x.db"]))
