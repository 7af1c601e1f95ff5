"""Experiment trackers on the real CLI: a short run logged to TensorBoard, W&B (offline) and MLflow (the file
store in the run directory), then resumed for a few more steps into the same tracker runs.

The run is also the suite's mixed-device run (end-to-end runs are its main cost on 2 cores): learner 0
trains on 2 host devices with twice the batch, beside learner 1 on one device."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from dlc.observe.trackers.mlflow import store_uri
from tests.helpers import TINY, read_jsonl, run_cli
from tests.tracker_files import (
    mlflow_series,
    tensorboard_scalars,
    tensorboard_texts,
    wandb_env,
    wandb_run_id,
    wandb_runs,
    wandb_series,
)

pytestmark = [pytest.mark.slow, pytest.mark.untimed, pytest.mark.timeout(600)]


def wandb_services() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] and "wandb-core" in p.info["name"]}


def test_a_mixed_run_and_its_resume_log_to_the_same_tracker_runs(tmp_path, monkeypatch):
    run = tmp_path / "run"
    env = wandb_env(tmp_path / "wandb-home")
    args = [
        "train",
        str(TINY),
        f"run.dir={run}",
        "learners.count=2",
        "learners.join_streams=0",
        "learners.overrides=[{index: 0, devices: 2, batch_size: 32}]",
        "run.log_every_steps=5",
        "eval.every_steps=5",
        "track=[tensorboard,wandb,mlflow]",
        "tracking.wandb_mode=offline",
    ]
    services = wandb_services()
    first = run_cli(*args, "run.max_steps=10", env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    ids = json.loads((run / "trackers.json").read_text())
    # The learner on 2 devices and the one on 1 trained side by side, and merged into the same rounds.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tokens_total"] == (32 + 16) * 64 * 10
    closed = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "round_closed"]
    assert any(set(e["contributors"]) == {0, 1} for e in closed)
    resumed = run_cli(*args, "run.max_steps=20", env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "tracker" not in resumed.stderr  # no tracker failed or closed badly
    assert json.loads((run / "trackers.json").read_text()) == ids  # the resume went on in the same runs
    deadline = time.monotonic() + 10
    while wandb_services() - services and time.monotonic() < deadline:
        time.sleep(0.2)
    assert wandb_services() - services == set()  # W&B's service ended with each driver

    # TensorBoard: one event file per start, one series across both, from the first evaluation on.
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    tb = tensorboard_scalars(run / "tensorboard")
    assert [step for step, _ in tb["train/loss/learner_0"]] == [5, 10, 15, 20]
    (first_step, first_loss), (last_step, last_loss) = tb["eval/loss"][0], tb["eval/loss"][-1]
    assert (first_step, last_step) == (0, 20) and last_loss < first_loss
    assert {"goodput/goodput", "sync/bytes_up", "sync/contributors", "run/tokens_per_s"} <= set(tb)
    notes = tensorboard_texts(run / "tensorboard", "events")
    assert [step for step, text in notes if text.startswith("run_finished")] == [10, 20]

    # W&B offline: a run directory per start, both of the run trackers.json names, each with its own steps.
    before, after = wandb_runs(run)
    assert wandb_run_id(before) == wandb_run_id(after) == ids["wandb"]["id"]
    assert [step for step, _ in wandb_series(before, "train/loss/learner_0", "step/learner_0")] == [5, 10]
    assert [step for step, _ in wandb_series(after, "train/loss/learner_0", "step/learner_0")] == [15, 20]

    # MLflow: the one run gained the resumed steps, and the run ended finished.
    from mlflow.tracking import MlflowClient

    uri = store_uri(run)
    run_id = ids["mlflow"]["run_id"]
    assert [step for step, _ in mlflow_series(uri, run_id, "train/loss/learner_0")] == [5, 10, 15, 20]
    assert mlflow_series(uri, run_id, "eval/loss")[0][0] == 0
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FINISHED"
