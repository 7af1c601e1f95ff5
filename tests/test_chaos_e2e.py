"""Chaos on the real engine: a kill storm and a syncer kill, and what they cost."""

import json
from pathlib import Path

import pytest

from tests.conftest import TINY, run_cli
from tests.test_train_e2e import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS = "run.max_steps=300"


def write_plan(path: Path, timeline: list[str], **fields: object) -> Path:
    lines = [
        f"{k}: {v}"
        for k, v in {"seed": 0, "duration_s": 600, "warmup_s": 0, "min_gap_s": 0, "max_concurrent": 2, **fields}.items()
    ]
    path.write_text("\n".join([*lines, "timeline:", *(f"  - {t}" for t in timeline)]) + "\n")
    return path


def test_three_kills_heal_and_cost_little(tmp_path):
    plan = write_plan(
        tmp_path / "kills.yaml",
        [
            "{at_s: 10, fault: kill, learner: 1}",
            "{at_s: 30, fault: kill, learner: 2}",
            "{at_s: 50, fault: kill, learner: 3}",
        ],
    )
    calm, storm = tmp_path / "calm", tmp_path / "storm"
    assert run_cli("train", str(TINY), f"run.dir={calm}", STEPS, timeout=900).returncode == 0
    result = run_cli("train", str(TINY), f"run.dir={storm}", STEPS, "--chaos", str(plan), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((storm / "summary.json").read_text())
    events = read_jsonl(storm / "events.jsonl")
    chaos = read_jsonl(storm / "chaos.jsonl")
    # Every kill fired, was detected, restarted, copied a peer and pushed again.
    for learner in (1, 2, 3):
        phases = [e["phase"] for e in chaos if e.get("learner") == learner and e["fault"] == "kill"]
        assert phases[:1] == ["injected"], phases
        assert {"detected", "restarted", "state_copied", "first_push"} <= set(phases), phases
    copied = [e for e in events if e["kind"] == "learner_rejoined"]
    assert sorted(e["learner"] for e in copied) == [1, 2, 3] and all(e["peer"] is not None for e in copied)
    assert summary["status"] == "completed" and summary["restarts"] == {"1": 1, "2": 1, "3": 1}
    # Quality: within 5% of the same seed without chaos.
    calm_loss = json.loads((calm / "summary.json").read_text())["eval_loss_final"]
    assert summary["eval_loss_final"] <= 1.05 * calm_loss
    # The goodput ledger accounts for each learner's whole allocation, run start to finish, within 1%.
    start = next(e["t"] for e in events if e["kind"] == "run_started")
    finished = {e["learner"]: e["t"] for e in events if e["kind"] == "learner_finished"}
    for learner, row in summary["goodput_by_learner"].items():
        allocated = sum(v for k, v in row.items() if k != "goodput")
        assert allocated == pytest.approx(finished[int(learner)] - start, rel=0.01)
    assert summary["badput"]["dead"] > 0 and summary["goodput"] < 1


def test_syncer_kill_loses_and_duplicates_nothing(tmp_path):
    plan = write_plan(tmp_path / "syncer.yaml", ["{at_s: 20, fault: kill_syncer}"])
    run_dir = tmp_path / "s"
    result = run_cli(
        "train",
        str(TINY),
        f"run.dir={run_dir}",
        STEPS,
        "syncer.checkpoint_interval_s=5",
        "--chaos",
        str(plan),
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    restarted = next(e for e in events if e["kind"] == "syncer_restarted")
    died = next(e for e in events if e["kind"] == "syncer_died")
    closed = [e for e in events if e["kind"] == "round_closed"]
    before = [e for e in closed if e["t"] < died["t"]]
    after = [e for e in closed if e["t"] > restarted["t"]]
    assert before and after
    # Versions continue from where they were: the restored syncer holds every round the log saw
    # (and possibly a last one whose event was still in the dead syncer's buffer), and the next
    # round of each fragment follows its restored version.
    last_before = {}
    for e in before:
        last_before[e["fragment"]] = e["version"]
    assert all(restarted["versions"][p] >= v for p, v in last_before.items())
    assert sum(restarted["versions"][p] - v for p, v in last_before.items()) <= 2
    first_after = {}
    for e in after:
        first_after.setdefault(e["fragment"], e["version"])
    assert all(first_after[p] == restarted["versions"][p] + 1 for p in first_after)
    # No push is merged twice: (learner, seq) pairs are unique across the whole run.
    merged = [(learner, seq) for e in closed for learner, seq in zip(e["contributors"], e["seqs"], strict=True)]
    assert len(merged) == len(set(merged))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] >= len(closed)
    assert summary["eval_loss_final"] < 0.65 * summary["eval_loss_initial"]
