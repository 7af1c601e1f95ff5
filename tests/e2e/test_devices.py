"""A learner on two devices beside a learner on one, on the real CLI: CPU host devices, a real Ray cluster."""

import json

import pytest

from tests.helpers import TINY, read_jsonl, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_two_device_learner_trains_beside_a_one_device_learner(tmp_path):
    # Learner 0: 2 host devices (fsdp), twice the batch; learner 1: one device. Both push into every
    # round they can; learner 0's pushes stand for twice the tokens.
    run_dir = tmp_path / "mixed"
    result = run_cli(
        "train",
        str(TINY),
        f"run.dir={run_dir}",
        "learners.count=2",
        "learners.join_streams=0",
        "learners.overrides=[{index: 0, devices: 2, batch_size: 32}]",
        "run.max_steps=80",
        "eval.every_steps=40",
        timeout=500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tokens_total"] == (32 + 16) * 64 * 80
    assert summary["eval_loss_final"] < 0.75 * summary["eval_loss_initial"]
    events = read_jsonl(run_dir / "events.jsonl")
    closed = [e for e in events if e["kind"] == "round_closed"]
    assert sum(1 for e in closed if set(e["contributors"]) == {0, 1}) > len(closed) / 2
    assert {e["learner"] for e in events if e["kind"] == "learner_training"} == {0, 1}
