"""Self-healing on the real engine: a killed learner comes back, a frozen one is not waited for."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.test_train_e2e import kill_tree, read_jsonl, start_train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def status(run_dir: Path) -> dict:
    for _ in range(50):
        try:
            return json.loads((run_dir / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
    raise AssertionError("no status.json")


def wait_until(predicate, proc, timeout_s: float = 300, what: str = ""):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "driver exited"
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(what)


def test_killed_learner_restarts_copies_a_peer_and_rejoins(tmp_path):
    run_dir = tmp_path / "kill"
    proc = start_train(str(TINY), f"run.dir={run_dir}", "run.max_steps=400", "eval.every_steps=1000")
    try:
        wait_until(lambda: (run_dir / "status.json").exists() and status(run_dir)["step"] >= 80, proc, what="step 80")
        before = {row["id"]: row for row in status(run_dir)["learners"]}
        os.kill(before[2]["pid"], signal.SIGKILL)
        killed_at = time.time()
        back = wait_until(
            lambda: next(
                (
                    r
                    for r in status(run_dir)["learners"]
                    if r["id"] == 2 and r["restarts"] == 1 and r["state"] == "training"
                ),
                None,
            ),
            proc,
            what="learner 2 back",
        )
        during = {row["id"]: row["step"] for row in status(run_dir)["learners"]}
        _, stderr = proc.communicate(timeout=600)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, stderr[-3000:]
    # The others never paused: they kept stepping while learner 2 was down.
    assert all(during[i] > before[i]["step"] + 5 for i in (0, 1, 3))
    events = read_jsonl(run_dir / "events.jsonl")
    died = next(e for e in events if e["kind"] == "learner_died")
    restarted = next(e for e in events if e["kind"] == "learner_restarted")
    rejoined = next(e for e in events if e["kind"] == "learner_rejoined")
    recovered = next(e for e in events if e["kind"] == "learner_recovered")
    assert died["learner"] == restarted["learner"] == rejoined["learner"] == recovered["learner"] == 2
    assert died["t"] >= killed_at - 1 and restarted["pid"] != before[2]["pid"] == died["pid"]
    # It copied a healthy peer's step and data position (peers' positions equal their steps).
    assert rejoined["peer"] in (0, 1, 3) and rejoined["step"] >= before[2]["step"]
    assert rejoined["data_position"] == rejoined["step"] and back["pid"] == restarted["pid"]
    # It pushed again: accepted pushes of learner 2 after the rejoin.
    assert any(e["kind"] == "push_accepted" and e["learner"] == 2 and e["t"] >= rejoined["t"] for e in events)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["restarts"] == {"2": 1}
    row = next(r for r in summary["learners"] if r["id"] == 2)
    assert row["restarts"] == 1 and row["step"] == 400
    assert summary["badput"]["dead"] > 0 and 0 < summary["goodput"] < 1
    buckets = summary["goodput_by_learner"]["2"]
    assert buckets["dead"] + buckets["rejoining"] > 0


def test_frozen_learner_is_not_waited_for_and_contributes_after_thawing(tmp_path):
    run_dir = tmp_path / "stall"
    args = (
        str(TINY),
        f"run.dir={run_dir}",
        "run.max_steps=500",
        "eval.every_steps=1000",
        "syncer.heartbeat_timeout_s=3",
        "syncer.quorum=4",
    )
    proc = start_train(*args)
    pid = None
    try:
        wait_until(lambda: (run_dir / "status.json").exists() and status(run_dir)["step"] >= 60, proc, what="step 60")
        pid = next(r["pid"] for r in status(run_dir)["learners"] if r["id"] == 1)
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        wait_until(
            lambda: next(r for r in status(run_dir)["learners"] if r["id"] == 1)["state"] == "stalled",
            proc,
            timeout_s=60,
            what="shown stalled",
        )
        time.sleep(5)
        os.kill(pid, signal.SIGCONT)
        thawed_at = time.time()
        pid = None
        _, stderr = proc.communicate(timeout=600)
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        kill_tree(proc)
    assert proc.returncode == 0, stderr[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    # With quorum 4, rounds close only because the silent learner stops counting as healthy.
    closed_while_frozen = [e for e in events if e["kind"] == "round_closed" and frozen_at + 4 < e["t"] < thawed_at]
    assert closed_while_frozen and all(1 not in e["contributors"] for e in closed_while_frozen)
    assert any(e["kind"] == "learner_stalled" and e["learner"] == 1 for e in events)
    assert any(e["kind"] == "learner_thawed" and e["learner"] == 1 for e in events)
    after = [e for e in events if e["kind"] == "round_closed" and e["t"] > thawed_at + 2]
    assert any(1 in e["contributors"] for e in after)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["badput"]["stalled"] > 3
