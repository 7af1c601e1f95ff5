"""Chaos on the real engine: kills and a preemption, a frozen learner and a syncer kill, what they cost,
and what a cluster's Prometheus sees of them."""

import json
from collections import Counter
from pathlib import Path

import pytest

from dlc.observe.reader import voided
from dlc.run.events import parse
from tests.helpers import STEPS, TINY, MetricsScraper, free_metrics_port, read_jsonl, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def write_plan(path: Path, timeline: list[str], **fields: object) -> Path:
    settings = {"seed": 0, "duration_s": 600, "warmup_s": 0, "min_gap_s": 0, "max_concurrent": 2, **fields}
    lines = [f"{k}: {v}" for k, v in settings.items()]
    path.write_text("\n".join([*lines, "timeline:", *(f"  - {t}" for t in timeline)]) + "\n")
    return path


def test_two_kills_and_a_preemption_heal_and_cost_little(tmp_path, calm_run):
    # Each fault is in flight until its learner trains again, and a restart's start-up is the machine's:
    # 15 s on 2 idle cores, 53 s beside the suite's other worker (17 s to start its process, 24 s to load
    # its compile from the cache). All three may be in flight at once, and the last comes early enough
    # that learner 0, never faulted, still trains when the preempted learner's new process looks for a
    # peer to copy (its 300 steps paced at 0.25 s take 75 s or more).
    plan = write_plan(
        tmp_path / "kills.yaml",
        [
            "{at_s: 5, fault: kill, learner: 1}",
            "{at_s: 15, fault: kill, learner: 2}",
            "{at_s: 25, fault: preempt, learner: 3, notice_s: 20}",
        ],
        max_concurrent=3,
    )
    storm = tmp_path / "storm"
    # Paced: a learner left alone on the cores (its peers dead or restarting) would otherwise finish
    # its 300 steps before the last fault comes (seen: learner 3 at 6 steps/s, done at 48 s).
    paced = "learners.step_time_s=0.25"
    port = free_metrics_port()
    with MetricsScraper(port) as scraped:
        metrics = f"metrics.port={port}"
        result = run_cli(
            "train", str(TINY), f"run.dir={storm}", STEPS, paced, metrics, "--chaos", str(plan), timeout=900
        )
    assert result.returncode == 0, result.stderr[-3000:]
    # Ray's report of each dead worker (which guesses at the OOM killer) stays off the console.
    assert "A worker died" not in result.stdout + result.stderr
    summary = json.loads((storm / "summary.json").read_text())
    events = read_jsonl(storm / "events.jsonl")
    chaos = read_jsonl(storm / "chaos.jsonl")
    # Every fault fired, was seen (a death detected, a preempted learner gone), restarted, copied a peer
    # and pushed again.
    for learner, fault, seen in ((1, "kill", "detected"), (2, "kill", "detected"), (3, "preempt", "left")):
        phases = [e["phase"] for e in chaos if e.get("learner") == learner and e["fault"] == fault]
        assert phases[:1] == ["injected"], phases
        assert {seen, "restarted", "state_copied", "first_push"} <= set(phases), phases
    # The preempted learner pushed every fragment it had moved and left within its notice: nothing of
    # it was lost, and it was no death.
    (preempted,) = [e for e in events if e["kind"] == "learner_preempted"]
    assert preempted["learner"] == 3 and preempted["reason"] == "SIGTERM" and preempted["unpushed_steps"] == 0
    assert preempted["fragments"] > 0 and 0 < preempted["leave_s"] < 20
    assert "learner 3 preempted (SIGTERM)" in result.stdout + result.stderr
    assert sorted(e["learner"] for e in events if e["kind"] == "learner_died") == [1, 2]
    copied = [e for e in events if e["kind"] == "learner_rejoined"]
    assert sorted(e["learner"] for e in copied) == [1, 2, 3] and all(e["peer"] is not None for e in copied)
    # The copy is the peer's step, but the learner goes on from its own place in its own stream:
    # where it was when it went down, not where the peer is in the peer's.
    down = {e["learner"]: e for e in events if e["kind"] in ("learner_died", "learner_preempted")}
    assert all(e["data_position"] == down[e["learner"]]["data_position"] > 0 for e in copied)
    assert all(e["step"] > 0 for e in copied)
    assert summary["status"] == "completed" and summary["restarts"] == {"1": 1, "2": 1, "3": 1}
    # The others never paused: while a learner was down, every other learner that was not itself
    # recovering kept pushing (a learner pushes a fragment every step).
    accepted = [e for e in events if e["kind"] == "push_accepted"]
    recovered = [e for e in events if e["kind"] == "learner_recovered"]
    downs = sorted(down.values(), key=lambda e: e["t"])
    for went in downs:
        back = next(e["t"] for e in recovered if e["learner"] == went["learner"] and e["t"] > went["t"])
        for other in {0, 1, 2, 3} - {went["learner"]}:
            own_downs = [e["t"] for e in downs if e["learner"] == other and e["t"] < went["t"]]
            own_backs = [e["t"] for e in recovered if e["learner"] == other]
            if any(not any(d < u < went["t"] for u in own_backs) for d in own_downs):
                continue  # it was still recovering itself
            pushes = [e for e in accepted if e["learner"] == other and went["t"] <= e["t"] <= back]
            assert pushes, f"learner {other} pushed nothing while learner {went['learner']} was down"
    # Quality: within 5% of the same seed without chaos.
    calm_loss = json.loads((calm_run / "summary.json").read_text())["eval_loss_final"]
    assert summary["eval_loss_final"] <= 1.05 * calm_loss
    # The goodput ledger accounts for each learner's whole allocation, run start to finish, within 1%;
    # the preemption's cost is its own bucket, not a death's.
    start = next(e["t"] for e in events if e["kind"] == "run_started")
    finished = {e["learner"]: e["t"] for e in events if e["kind"] == "learner_finished"}
    for learner, row in summary["goodput_by_learner"].items():
        allocated = sum(v for k, v in row.items() if k != "goodput")
        assert allocated == pytest.approx(finished[int(learner)] - start, rel=0.01)
    by_learner = summary["goodput_by_learner"]
    assert by_learner["3"]["preempted"] > 0 and by_learner["3"]["dead"] == 0 and by_learner["1"]["preempted"] == 0
    assert summary["badput"]["dead"] > 0 and summary["goodput"] < 1
    # What a cluster's Prometheus scrapes, as it went: each learner's tokens, losses and throughput, goodput
    # and its buckets, contributors, bytes and the faults, each present and moving; MFU unknown on a CPU.
    assert f"Prometheus metrics (ray_dlc_*): http://127.0.0.1:{port}/metrics" in result.stdout + result.stderr
    run_label = {"run": storm.name}
    moving = [("ray_dlc_run_tokens", {}), ("ray_dlc_sync_bytes_up", {}), ("ray_dlc_sync_rounds", {})]
    moving += [("ray_dlc_learner_tokens", {"learner": str(i)}) for i in range(4)]
    moving += [("ray_dlc_train_loss", {"learner": str(i)}) for i in range(4)]
    for name, labels in moving:
        values = scraped.values(name, **run_label, **labels)
        assert len(set(values)) >= 2, (name, labels, values)
    present = [
        ("ray_dlc_learner_tokens_per_s", {"learner": "0"}),
        ("ray_dlc_goodput_goodput", {}),
        ("ray_dlc_goodput_badput_s", {"bucket": "dead"}),
        ("ray_dlc_goodput_badput_s", {"bucket": "preempted"}),
        ("ray_dlc_sync_contributors", {}),
        ("ray_dlc_sync_bytes_down", {}),
        ("ray_dlc_eval_loss", {}),
        ("ray_dlc_events", {"kind": "learner_died"}),
        ("ray_dlc_events", {"kind": "learner_preempted"}),
    ]
    for name, labels in present:
        assert scraped.values(name, **run_label, **labels), (name, labels)
    assert max(scraped.values("ray_dlc_events", kind="learner_died", **run_label)) == 2
    assert not scraped.values("ray_dlc_run_mfu") and not scraped.values("ray_dlc_learner_mfu")


def merged_exactly_once(events: list[dict]) -> tuple[int, int]:
    """From the run directory alone: every accepted push was merged in exactly one round, and every
    round each fragment closed (versions 1, 2, ...) is in the log once, net of what a syncer's death
    lost (`push_lost`, `round_lost`, discounted as every reader does). Each acceptance lost was
    accepted again or refused, or its learner died. Returns the pushes merged and the acceptances lost."""
    records = [parse(e) for e in events]
    unread = [e for e, record in zip(events, records, strict=True) if record is None]
    assert unread == [], f"lines that do not read back as their record: {unread[:3]}"
    void = voided([record for record in records if record is not None])
    kept = [e for i, e in enumerate(events) if i not in void]
    closed = [e for e in kept if e["kind"] == "round_closed"]
    merged = Counter((who, e["fragment"], seq) for e in closed for who, seq in e["merged"])
    assert max(merged.values()) == 1, f"merged twice: {[k for k, n in merged.items() if n > 1][:5]}"
    accepted = Counter((e["learner"], e["fragment"], e["seq"]) for e in kept if e["kind"] == "push_accepted")
    assert max(accepted.values()) == 1, f"accepted twice: {[k for k, n in accepted.items() if n > 1][:5]}"
    assert set(accepted) <= set(merged), f"accepted, never merged: {sorted(set(accepted) - set(merged))[:5]}"
    # Merged without a logged acceptance: only by a syncer that died before the driver heard of it,
    # in rounds its successor reported for it.
    replayed = {(who, e["fragment"], seq) for e in closed if e.get("replayed") for who, seq in e["merged"]}
    assert set(merged) - set(accepted) <= replayed
    by_fragment: dict[int, list[int]] = {}
    for e in closed:
        by_fragment.setdefault(e["fragment"], []).append(e["version"])
    for versions in by_fragment.values():
        assert sorted(versions) == list(range(1, len(versions) + 1)), "a round is missing or logged twice"
    lost = [(i, e) for i, e in enumerate(events) if e["kind"] == "push_lost"]
    for i, e in lost:
        assert e["reason"] == "syncer_died", e  # no resume here starts from less than the log holds
        # Said between the death and the restart, before the learners re-send.
        assert [x["kind"] for x in events[:i] if x["kind"].startswith("syncer_")][-1] == "syncer_died"
        after = [x for x in events[i + 1 :] if x.get("learner") == e["learner"]]
        again = [x for x in after if x["kind"] in ("push_accepted", "push_rejected") and x["seq"] == e["seq"]]
        assert again or any(x["kind"] == "learner_died" for x in after), f"lost and never explained: {e}"
    return len(merged), len(lost)


def test_stall_syncer_kill_learner_kill_and_resume_lose_and_double_nothing(tmp_path):
    # Quorum 4 of 4: rounds close while learner 1 is frozen only because its silence makes it
    # unhealthy. Then the syncer is killed and must come back without losing or repeating a merge,
    # then learner 2 dies and rejoins; then the run is resumed for 40 more steps. The syncer is killed
    # 2 s into a freeze of learner 3, before its silence reaches the 3 s heartbeat timeout: no round
    # can close then, so the syncer dies holding the pushes the others sent meanwhile, accepted and
    # merged by no round, whatever the pace of the cores.
    plan = write_plan(
        tmp_path / "plan.yaml",
        [
            "{at_s: 6, fault: stall, learner: 1, duration_s: 7}",
            "{at_s: 14, fault: stall, learner: 3, duration_s: 4}",
            "{at_s: 16, fault: kill_syncer}",
            "{at_s: 28, fault: kill, learner: 2}",
        ],
        allow_below_quorum="true",
    )
    run_dir = tmp_path / "s"
    common = [
        str(TINY),
        f"run.dir={run_dir}",
        "syncer.quorum=4",
        "syncer.heartbeat_timeout_s=3",
        "syncer.checkpoint_interval_s=5",
        # 300 steps take 60 s. The driver restarts the syncer in place (3 to 5 s on 2 cores, the
        # learners training on meanwhile) and the learner kill comes after it, at about step 140: the
        # steps left give the killed learner about 30 s to come back (it took 5 to 6 s here) while
        # its peers still train.
        "learners.step_time_s=0.2",
    ]
    result = run_cli("train", *common, "run.max_steps=300", "--chaos", str(plan), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    chaos = read_jsonl(run_dir / "chaos.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    closed = [e for e in events if e["kind"] == "round_closed"]
    assert [e["fault"] for e in chaos if e["phase"] == "injected"] == ["stall", "stall", "kill_syncer", "kill"]
    # Each went out through the node agent, which says when.
    assert [e["fault"] for e in chaos if e["phase"] == "signalled"] == ["stall", "stall", "kill_syncer", "kill"]
    # The stall: detected by silence, rounds went on without learner 1, which contributes after thawing.
    injected = next(e for e in chaos if e["fault"] == "stall" and e["phase"] == "injected")
    # Frozen from the SIGSTOP, which may land a moment after chaos asked for it.
    frozen_at = next(e["t"] for e in chaos if e["fault"] == "stall" and e["phase"] == "signalled")
    assert frozen_at >= injected["t"]
    stalled = next(e for e in events if e["kind"] == "learner_stalled")
    thawed = next(e for e in events if e["kind"] == "learner_thawed")
    assert stalled["learner"] == thawed["learner"] == 1 and frozen_at < stalled["t"] < thawed["t"]
    # Frozen until SIGCONT, which comes `duration_s` after the SIGSTOP: no earlier than this. The
    # driver notices the thaw at its next poll, after the learner may already have pushed again.
    sigcont_at = frozen_at + injected["duration_s"]
    while_frozen = [e for e in closed if stalled["t"] + 1 < e["t"] < min(thawed["t"], sigcont_at)]
    assert while_frozen and all(1 not in e["contributors"] for e in while_frozen)
    assert any(1 in e["contributors"] for e in closed if e["t"] > thawed["t"] + 2)
    assert summary["badput"]["stalled"] > 2
    # The syncer kill: versions continue from where they were, and the log holds every round the
    # restored syncer holds (the journal is the truth): each fragment's versions 1..restored.
    died = next(e for e in events if e["kind"] == "syncer_died")
    restarted = next(e for e in events if e["kind"] == "syncer_restarted")
    # A round's time is when it closed: the new syncer closes rounds from its start, which comes
    # before the driver logs syncer_restarted; everything closed after the death is the new one's.
    before = [e for e in closed if e["t"] < died["t"]]
    after = [e for e in closed if e["t"] > died["t"]]
    assert before and after and restarted["t"] > died["t"]
    for p, version in enumerate(restarted["versions"]):
        assert sorted(e["version"] for e in before if e["fragment"] == p) == list(range(1, version + 1))
    first_after = {}
    for e in after:
        first_after.setdefault(e["fragment"], e["version"])
    assert all(first_after[p] == restarted["versions"][p] + 1 for p in first_after)
    # The learner kill, after the syncer's: learner 2 came back, at its own place in its own stream.
    learner_died = next(e for e in events if e["kind"] == "learner_died")
    rejoined = next(e for e in events if e["kind"] == "learner_rejoined")
    assert learner_died["learner"] == rejoined["learner"] == 2 and learner_died["t"] > restarted["t"]
    assert rejoined["data_position"] == learner_died["data_position"] > 0
    assert rejoined["step"] < 300, f"learner 2 came back after its peers had finished: {rejoined}"
    assert any(e["kind"] == "learner_recovered" and e["learner"] == 2 for e in events)
    # Pushes the dead syncer had accepted into rounds still open died with it (its journal keeps
    # closed rounds): said once each, they count once, here and in the syncer's own count.
    merged, lost = merged_exactly_once(events)
    assert lost > 0 and summary["pushes_accepted"] == merged
    assert summary["status"] == "completed" and summary["rounds"] == len(closed)
    assert summary["eval_loss_final"] < 0.65 * summary["eval_loss_initial"]

    # Resumed for 40 more steps: the records of both runs together still hold every round once
    # and every accepted push merged once, and every learner went on from where it stopped.
    resumed = run_cli("train", *common, "run.max_steps=340", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = read_jsonl(run_dir / "events.jsonl")
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["pushes_accepted"] == merged_exactly_once(events)[0]
    assert final["status"] == "completed" and [row["step"] for row in final["learners"]] == [340] * 4
    assert final["eval_loss_final"] <= 1.02 * summary["eval_loss_final"]
