"""End to end on the real CLI: a run directory resumes after SIGTERM or Ctrl-C, damage is reported.

That tiny trains as the README's quick start says is checked on the calm run of tests/e2e/test_train_tiny.py;
the Ctrl-C run here trains tiny-bpe, whose dataset its first start prepares."""

import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    TINY,
    assert_user_error,
    kill_tree,
    read_jsonl,
    run_cli,
    snapshot,
    start_train,
    wait_for_step,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_sigterm_checkpoints_and_rerun_resumes(tmp_path):
    """A scheduler's SIGTERM stops the run as Ctrl-C does (one handler; Ctrl-C's code, 130, is checked
    below), with the shell's code for SIGTERM: Ray's own handler, set by ray.init, would exit at once."""
    run_dir, dataset = tmp_path / "r", tmp_path / "bpe"
    args = (
        str(REPO / "recipes" / "tiny-bpe.yaml"),
        f"run.dir={run_dir}",
        f"data.path={dataset}",  # prepared by the first start, from dlc's own sources: a few seconds
        f"data.prepare.sources=[{REPO}/dlc/**/*.py]",
        "data.prepare.tokenizer=bpe:512",
        "learners.count=2",
        "run.max_steps=200",
        "checkpoint.every_steps=1000",
    )
    proc = start_train(*args)
    try:
        wait_for_step(run_dir, 50, proc, timeout_s=300)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=180)
    finally:
        kill_tree(proc)
    assert proc.returncode == 143, stderr[-3000:]
    assert "resume with: dlc train" in stderr and "SIGTERM received" not in stderr
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["status"] == "interrupted" and 50 <= first["steps"] < 200
    stopped_at = {row["id"]: row["step"] for row in first["learners"]}
    assert all(row["data_position"] == row["step"] for row in first["learners"])
    manifest = json.loads((dataset / "manifest.json").read_text())
    prepared_at = (dataset / "manifest.json").stat().st_mtime_ns
    assert manifest["tokenizer"]["spec"] == "bpe:512" and manifest["train"]["tokens"] > 100_000

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
    assert final["status"] == "completed" and [row["step"] for row in final["learners"]] == [200, 200]
    assert all(row["data_position"] == 200 for row in final["learners"])
    assert final["rounds"] > restored["rounds_closed"]
    # The initial loss is the run's, not the resumed model's: a uniform guess over the dataset's tokens.
    assert final["eval_loss_initial"] == first["eval_loss_initial"]
    assert abs(first["eval_loss_initial"] - math.log(manifest["tokenizer"]["vocab_size"])) < 0.1
    # The model took its vocabulary from the dataset, which the second start read as it was.
    assert f"vocab_size: {manifest['tokenizer']['vocab_size']}" in (run_dir / "recipe.yaml").read_text()
    assert (dataset / "manifest.json").stat().st_mtime_ns == prepared_at
    # Bits per byte of the held-out text: the loss per token over the bytes each token stands for.
    per_token = manifest["eval"]["text_bytes"] / manifest["eval"]["tokens"]
    assert final["eval_bpb_final"] == pytest.approx(final["eval_loss_final"] / math.log(2) / per_token, rel=1e-3)
    # Train steps are logged every 50 per learner: after the resume none is repeated.
    for learner in (0, 1):
        steps = [
            m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if m["kind"] == "train" and m["learner"] == learner
        ]
        assert steps == sorted(set(steps)) and steps[-1] == 200


def session_processes(sid: int) -> list[str]:
    """Command lines of the live (not zombie) processes of session `sid`: the driver's and Ray's."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = (Path("/proc") / pid / "stat").read_text()
            cmdline = (Path("/proc") / pid / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:120])
    return found


def test_ctrl_c_pressed_again_and_again_still_ends_cleanly(tmp_path):
    """An impatient user: the second Ctrl-C interrupts at once, and the ones after it cannot cut
    short what must follow (the summary, stopping Ray): no traceback, no process left behind."""
    run_dir = tmp_path / "r"
    proc = start_train(str(TINY), f"run.dir={run_dir}", "learners.count=2", "run.max_steps=1000")
    try:
        wait_for_step(run_dir, 20, proc, timeout_s=300)
        assert len(session_processes(proc.pid)) > 3  # Ray's processes are in the driver's session
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        _, stderr = proc.communicate(timeout=60)
        deadline = time.time() + 15
        while session_processes(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        left = session_processes(proc.pid)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, stderr[-3000:]
    # Whether a Ctrl-C lands in the clean-up (and is answered "still stopping") depends on how long
    # it takes: tests/unit/engine/test_driver.py pins that answer.
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "resume with: dlc train" in stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert left == []


@pytest.mark.untimed
def test_resume_refuses_other_model_and_damaged_checkpoint(tmp_path):
    run_dir = tmp_path / "r"
    base = ("train", str(TINY), f"run.dir={run_dir}", "learners.count=1")
    assert run_cli(*base, "run.max_steps=20").returncode == 0
    learner_ckpt = run_dir / "checkpoints" / "learner-0"
    checkpoints = sorted(learner_ckpt.iterdir())
    summary = (run_dir / "summary.json").read_text()

    other = run_cli(*base, "run.max_steps=40", "model.width=32")
    assert_user_error(other, "holds a checkpoint of a different run", "model.width", "--fresh")
    assert sorted(learner_ckpt.iterdir()) == checkpoints  # nothing destroyed

    for f in (learner_ckpt / "20" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    before = snapshot(run_dir)
    damaged = run_cli(*base, "run.max_steps=40")
    assert_user_error(damaged, "is unreadable", "--fresh")
    # Refused from inside the learner's actor, after the cluster started: still no event, metric,
    # recipe or TensorBoard file was written, and the last summary stands.
    assert snapshot(run_dir) == before
    assert (run_dir / "summary.json").read_text() == summary

    fresh = run_cli(*base, "run.max_steps=10", "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 10
    shutil.rmtree(run_dir)
