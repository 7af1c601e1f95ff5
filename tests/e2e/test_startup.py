"""Start-up on the real engine: hot spares take a killed learner's slot, and the compilation cache
lets a later run load what an earlier one compiled."""

import json
import time
from pathlib import Path

import pytest

from tests.helpers import TINY, kill_tree, read_jsonl, run_cli, start_train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _wait_for_event(run_dir: Path, kind: str, proc, timeout_s: float = 240) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        if (run_dir / "events.jsonl").exists():
            found = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == kind]
            if found:
                return found[0]
        time.sleep(0.3)
    raise TimeoutError(f"no {kind} event in {timeout_s} s")


def test_a_hot_spare_takes_a_killed_learners_slot_and_another_starts_behind_it(tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "xla"
    plan = tmp_path / "kill.yaml"
    plan.write_text("seed: 0\nduration_s: 30\nwarmup_s: 0\ntimeline:\n  - {at_s: 0, fault: kill, learner: 1}\n")
    proc = start_train(
        str(TINY),
        f"run.dir={run_dir}",
        "learners.count=3",
        "learners.spares=1",
        "learners.step_time_s=0.2",
        "run.max_steps=130",  # the kill at about step 10, the second spare ready some 25 steps later
        f"run.compile_cache_dir={cache}",
    )
    try:
        ready = _wait_for_event(run_dir, "spare_ready", proc)
        assert ready["spare"] == "s0" and ready["compile_s"] > 0
        status = json.loads((run_dir / "status.json").read_text())
        assert status["spares"] == [] or status["spares"][0]["id"] == "s0"  # written at most a second ago
        chaos = run_cli("chaos", str(run_dir), "--plan", str(plan), timeout=120)
        assert chaos.returncode == 0, chaos.stderr[-2000:]
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    finally:
        kill_tree(proc)
    events = read_jsonl(run_dir / "events.jsonl")
    kinds = [e["kind"] for e in events]
    taken = next(e for e in events if e["kind"] == "spare_taken")
    assert taken == {**taken, "spare": "s0", "learner": 1, "ready": True}
    restarted = next(e for e in events if e["kind"] == "learner_restarted")
    assert restarted["learner"] == 1 and restarted["spare"] is True
    # The spare's first steps: no compilation at take-over (it was compiled before), a copy of a peer.
    training = [e for e in events if e["kind"] == "learner_training" and e["learner"] == 1]
    assert training[-1]["incarnation"] == 1 and training[-1]["spare"] is True and "copy_s" in training[-1]
    assert "learner_recovered" in kinds
    # A new spare was started behind the one taken, and became ready.
    assert [e["spare"] for e in events if e["kind"] == "spare_started"] == ["s0", "s1"]
    assert "s1" in [e["spare"] for e in events if e["kind"] == "spare_ready"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["restarts"] == {"1": 1}
    assert summary["spare_s"] > 0 and summary["goodput_with_spares"] < summary["goodput"]
