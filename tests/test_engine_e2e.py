"""Decoupled DiLoCo on the real CLI and a real local Ray cluster: 4 learners and a syncer."""

import json
import signal
from collections import Counter

import pytest

from dlc.codec import get_codec
from dlc.fragments import FragmentPlan, shapes_of
from dlc.model import build_model, flatten_params
from dlc.recipe import load_recipe
from tests.conftest import TINY, run_cli
from tests.test_train_e2e import kill_tree, read_jsonl, start_train, wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_four_learners_merge_and_learn(tmp_path):
    run_dir = tmp_path / "m4"
    args = [f"run.dir={run_dir}", "learners.count=4", "run.max_steps=150", "eval.every_steps=100"]
    result = run_cli("train", str(TINY), *args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tokens_total"] == 4 * 150 * 16 * 64
    # Every learner contributed to rounds, and rounds merged several learners.
    assert all(learner["contributed"] > 0 for learner in summary["learners"])
    events = read_jsonl(run_dir / "events.jsonl")
    closed = [e for e in events if e["kind"] == "round_closed"]
    assert len(closed) == summary["rounds"] and max(len(e["contributors"]) for e in closed) > 1
    assert summary["mean_contributors"] > 1.0
    # Bytes per push are exactly the int4 codec's size for that fragment.
    recipe = load_recipe(TINY)
    plan = FragmentPlan.build(shapes_of(flatten_params(build_model(recipe.model, 0)[1])), recipe.syncer.fragments)
    codec = get_codec("int4", recipe.syncer.codec_block_values)
    accepted = [e for e in events if e["kind"] == "push_accepted"]
    assert accepted and all(e["bytes"] == codec.encoded_nbytes(plan.size(e["fragment"])) for e in accepted)
    assert summary["bytes_up"] == sum(learner["bytes_sent"] for learner in summary["learners"])
    # The global model learned: bytes start near ln 256 = 5.55 nats.
    assert summary["eval_loss_final"] < 0.65 * summary["eval_loss_initial"]
    # Processes of the embedded cluster are on loopback only.
    cluster = next(e for e in events if e["kind"] == "cluster_started")
    assert cluster["nodes"] == ["127.0.0.1"]
    kinds = Counter(e["kind"] for e in events)
    assert kinds["learner_started"] == 4 and kinds["learner_stopped"] == 4
    status = json.loads((run_dir / "status.json").read_text())
    assert [row["id"] for row in status["learners"]] == [0, 1, 2, 3]
    assert {"versions", "quorum", "grace_window_s", "rejections", "bytes_up", "bytes_down"} <= set(status["syncer"])
    train_lines = [m for m in read_jsonl(run_dir / "metrics.jsonl") if m["kind"] == "train"]
    assert {m["learner"] for m in train_lines} == {0, 1, 2, 3}


def test_multi_learner_run_resumes(tmp_path):
    run_dir = tmp_path / "m2"
    args = (str(TINY), f"run.dir={run_dir}", "learners.count=2", "run.max_steps=200", "checkpoint.every_steps=40")
    proc = start_train(*args)
    try:
        wait_for_step(run_dir, 60, proc, timeout_s=400)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=180)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, stderr[-3000:]
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["status"] == "interrupted"
    stopped_at = {learner["id"]: learner["step"] for learner in first["learners"]}

    result = run_cli("train", *args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    resumed = {e["learner"]: e for e in events if e["kind"] == "run_resumed"}
    # Each learner continues from the checkpoint it wrote when interrupted: same step, same data.
    assert {i: e["step"] for i, e in resumed.items()} == stopped_at
    assert all(e["data_position"] == e["step"] for e in resumed.values())
    restored = next(e for e in events if e["kind"] == "syncer_restored")
    assert sum(restored["versions"]) > 0
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["status"] == "completed" and [learner["step"] for learner in final["learners"]] == [200, 200]
    assert final["rounds"] > restored["rounds_closed"]
