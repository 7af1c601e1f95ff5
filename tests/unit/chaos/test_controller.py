"""The chaos controller under a fake clock: guardrails (quorum, warm-up, gaps, faults in flight),
what reaches the target, dry runs, and when it stops.

No Ray and no training: a fake Target records what the controller asks of it.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

from chaos.controller import Controller
from chaos.faults import FaultKind
from chaos.schedule import faults_until
from tests.fakes import FakeTarget, SleepingClock
from tests.helpers import bare_plan, run_plan


def _phases(target: FakeTarget) -> list[tuple[str, int | None, str]]:
    return [(r["fault"], r["learner"], r["phase"]) for r in target.records]


def test_quorum_guardrail_refuses_a_fault_that_would_break_quorum():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=3)
    timeline = [
        {"at_s": 1, "fault": "kill", "learner": 0},  # 4 healthy -> 3: allowed
        {"at_s": 2, "fault": "kill", "learner": 1},  # 3 -> 2 < 3: refused
        {"at_s": 3, "fault": "stall", "learner": 2},  # same: refused
        {"at_s": 4, "fault": "slow", "learner": 3},  # a slow learner still counts: allowed
    ]
    controller = run_plan(bare_plan(timeline=timeline, duration_s=10), target, clock)
    # The status still says learner 0 trains (detection lags), yet it counts as out while its kill is in flight.
    assert target.calls == [("kill", 0), ("slow", 3, 3.0, 30.0)]
    assert controller.report.fired == Counter({FaultKind.KILL: 1, FaultKind.SLOW: 1})
    assert controller.report.refused == Counter({FaultKind.KILL: 1, FaultKind.STALL: 1})
    refused = [r for r in target.records if r["phase"] == "refused"]
    assert all("would leave 2 healthy learner(s), below quorum 3" in r["detail"] for r in refused)

    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=3)
    controller = run_plan(bare_plan(timeline=timeline, duration_s=10, allow_below_quorum=True), target, clock)
    assert (
        controller.report.fired == Counter({FaultKind.KILL: 2, FaultKind.STALL: 1, FaultKind.SLOW: 1})
        and not controller.report.refused
    )


def test_quorum_counts_learners_the_run_reports_down():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=3, quorum=2)
    target.states[1] = "restarting"
    controller = run_plan(bare_plan(timeline=[{"at_s": 1, "fault": "kill", "learner": 0}], duration_s=5), target, clock)
    assert target.calls == [] and controller.report.refused == Counter({FaultKind.KILL: 1})


def test_warmup_refuses_early_timeline_faults_and_poisson_waits_it_out():
    clock = SleepingClock()
    target = FakeTarget(clock)
    plan = bare_plan(warmup_s=10, duration_s=20, timeline=[{"at_s": 5, "fault": "kill", "learner": 0},
                                                            {"at_s": 12, "fault": "kill", "learner": 1}])  # fmt: skip
    controller = run_plan(plan, target, clock)
    assert _phases(target) == [("kill", 0, "refused"), ("kill", 1, "injected")]
    assert "warm-up" in target.records[0]["detail"] and controller.report.fired == Counter({FaultKind.KILL: 1})
    assert all(
        f.at_s > 10 for f in faults_until(bare_plan(warmup_s=10, kill_per_learner_per_min=5), [0], random.Random(), 60)
    )


def test_min_gap_counts_from_the_last_fired_fault():
    clock = SleepingClock()
    target = FakeTarget(clock)
    timeline = [
        {"at_s": 1, "fault": "kill", "learner": 0},
        {"at_s": 5, "fault": "kill", "learner": 1},  # 4 s after: refused
        {"at_s": 9, "fault": "kill", "learner": 2},  # 8 s after the last fired one: refused
        {"at_s": 12, "fault": "kill", "learner": 3},  # 11 s: fired
    ]
    controller = run_plan(bare_plan(min_gap_s=10, timeline=timeline, duration_s=20), target, clock)
    assert [c[1] for c in target.calls] == [0, 3]
    assert controller.report.refused == Counter({FaultKind.KILL: 2}) and "min_gap_s=10" in target.records[1]["detail"]


def test_max_concurrent_counts_a_stall_for_its_duration():
    clock = SleepingClock()
    target = FakeTarget(clock)
    timeline = [
        {"at_s": 1, "fault": "stall", "learner": 0, "duration_s": 10},
        {"at_s": 5, "fault": "slow", "learner": 1},  # the stall is in flight until 11: refused
        {"at_s": 12, "fault": "slow", "learner": 1},  # fired
    ]
    controller = run_plan(bare_plan(max_concurrent=1, timeline=timeline, duration_s=20), target, clock)
    assert target.calls == [("stall", 0, 10.0), ("slow", 1, 3.0, 30.0)]
    assert "1 fault(s) in flight (stall on learner 0), max_concurrent=1" in target.records[1]["detail"]
    assert controller.report.fired == Counter(
        {FaultKind.STALL: 1, FaultKind.SLOW: 1}
    ) and controller.report.refused == Counter({FaultKind.SLOW: 1})


def test_a_kill_is_in_flight_until_its_learner_trains_again():
    clock = SleepingClock()
    target = FakeTarget(clock)
    # Killed at 1; the run notices at 3 and has it back at 8.
    target.script = [(3, 0, "dead"), (4, 0, "restarting"), (8, 0, "training")]
    timeline = [
        {"at_s": 1, "fault": "kill", "learner": 0},
        {"at_s": 2, "fault": "kill", "learner": 1},  # learner 0 still reads "training", but its kill is in flight
        {"at_s": 6, "fault": "kill", "learner": 1},  # learner 0 is restarting
        {"at_s": 9, "fault": "kill", "learner": 1},  # back since 8: fired
    ]
    controller = run_plan(
        bare_plan(max_concurrent=1, in_flight_max_s=30, timeline=timeline, duration_s=20), target, clock
    )
    assert target.calls == [("kill", 0), ("kill", 1)]
    assert controller.report.fired == Counter({FaultKind.KILL: 2}) and controller.report.refused == Counter(
        {FaultKind.KILL: 2}
    )

    # A learner that never shows as down releases the slot after in_flight_max_s.
    clock = SleepingClock()
    target = FakeTarget(clock)
    timeline = [{"at_s": 1, "fault": "kill", "learner": 0}, {"at_s": 15, "fault": "kill", "learner": 1},
                {"at_s": 22, "fault": "kill", "learner": 2}]  # fmt: skip
    controller = run_plan(
        bare_plan(max_concurrent=1, in_flight_max_s=20, timeline=timeline, duration_s=30), target, clock
    )
    assert target.calls == [("kill", 0), ("kill", 2)]

    # A hot spare is back training in a new process between two polls, never seen down: the new
    # process id says the kill is over.
    clock = SleepingClock()
    target = FakeTarget(clock)
    target.pid_script = [(2, 0, 5000)]
    timeline = [{"at_s": 1, "fault": "kill", "learner": 0}, {"at_s": 5, "fault": "kill", "learner": 1}]
    controller = run_plan(
        bare_plan(max_concurrent=1, in_flight_max_s=60, timeline=timeline, duration_s=10), target, clock
    )
    assert target.calls == [("kill", 0), ("kill", 1)] and controller.report.refused == Counter()


def test_faults_on_missing_busy_or_unhealthy_learners_are_refused():
    clock = SleepingClock()
    target = FakeTarget(clock)
    target.states[2] = "stalled"
    timeline = [
        {"at_s": 1, "fault": "kill", "learner": 9},
        {"at_s": 2, "fault": "kill", "learner": 2},
        {"at_s": 3, "fault": "slow", "learner": 1, "until_end": True},
        {"at_s": 4, "fault": "stall", "learner": 1},
    ]
    run_plan(bare_plan(timeline=timeline, duration_s=10), target, clock)
    details = [r["detail"] for r in target.records]
    assert "no learner 9 (learners: 0, 1, 2, 3)" in details[0]
    assert "learner 2 is stalled, not training" in details[1]
    assert "learner 1 already has a slow in flight" in details[3]
    assert target.calls == [("slow", 1, 3.0, None)]


def test_every_kind_reaches_the_target_and_failures_are_recorded():
    clock = SleepingClock()
    target = FakeTarget(clock)
    timeline = [
        {"at_s": 1, "fault": "join", "duration_s": 15},
        {"at_s": 2, "fault": "leave", "learner": 3},
        {"at_s": 3, "fault": "kill_syncer"},
        {"at_s": 4, "fault": "slow", "learner": 0, "factor": 5, "duration_s": 2},
        {"at_s": 5, "fault": "kill", "learner": 1},
    ]
    target.fail_kill = True
    controller = run_plan(bare_plan(timeline=timeline, duration_s=10), target, clock)
    assert target.calls == [("join", 15.0), ("leave", 3), ("kill_syncer",), ("slow", 0, 5.0, 2.0)]
    assert controller.report.counts["failed"] == Counter({FaultKind.KILL: 1})
    failed = target.records[-1]
    assert failed["phase"] == "failed" and "gone" in failed["detail"]
    slow = target.records[3]
    assert slow == {
        "fault": "slow",
        "target": "learner 0",
        "learner": 0,
        "phase": "injected",
        "detail": "step time x5 for 2 s",
        "at_s": 4.0,
        "origin": "timeline",
        "duration_s": 2.0,
        "factor": 5.0,
    }
    assert target.records[2]["target"] == "syncer" and target.records[2]["learner"] is None


def test_link_faults_reach_the_target_and_leave_the_quorum_alone():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=4)  # taking any learner out would break quorum
    timeline = [
        {"at_s": 1, "fault": "degrade_link", "learner": 0, "duration_s": 5},  # in flight until 6
        {"at_s": 2, "fault": "cut_link", "learner": 1},  # cut_link_for_s=10: in flight until 12
        {"at_s": 3, "fault": "kill", "learner": 2},  # 4 healthy -> 3 < 4: refused
        {"at_s": 4, "fault": "degrade_link", "learner": 0},  # learner 0's degradation is in flight: refused
        {"at_s": 7, "fault": "degrade_link", "learner": 0, "factor": 3},  # fired
    ]
    controller = run_plan(bare_plan(timeline=timeline, duration_s=20), target, clock)
    assert target.calls == [("degrade_link", 0, 10.0, 5.0), ("cut_link", 1, 10.0), ("degrade_link", 0, 3.0, 30.0)]
    assert controller.report.fired == Counter({FaultKind.DEGRADE_LINK: 2, FaultKind.CUT_LINK: 1})
    assert controller.report.refused == Counter({FaultKind.KILL: 1, FaultKind.DEGRADE_LINK: 1})
    assert "would leave 3 healthy learner(s), below quorum 4" in target.records[2]["detail"]
    assert "learner 0 already has a degrade_link in flight" in target.records[3]["detail"]
    assert target.records[0]["detail"] == "link bandwidth /10, latency x10 for 5 s"
    assert target.records[0]["factor"] == 10.0 and target.records[0]["duration_s"] == 5.0
    assert target.records[1] == {
        "fault": "cut_link",
        "target": "learner 1",
        "learner": 1,
        "phase": "injected",
        "detail": "link cut for 10 s, messages held until it returns",
        "at_s": 2.0,
        "origin": "timeline",
        "duration_s": 10.0,
    }


def test_fired_counts_match_the_schedule():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=0)
    plan = bare_plan(kill_per_learner_per_min=2, slow_per_learner_per_min=1, slow_for_s=0.01, in_flight_max_s=0.01,
                     duration_s=120, seed=3)  # fmt: skip
    expected = Counter(f.kind for f in faults_until(plan, [0, 1, 2, 3], random.Random(3), 120))
    controller = run_plan(plan, target, clock)
    assert controller.report.fired == expected and not controller.report.refused
    assert Counter(c[0] for c in target.calls) == {k.value: n for k, n in expected.items()}


def test_dry_run_records_and_touches_nothing():
    clock = SleepingClock()
    target = FakeTarget(clock, quorum=3)
    timeline = [{"at_s": 1, "fault": "kill", "learner": 0}, {"at_s": 2, "fault": "stall", "learner": 1},
                {"at_s": 3, "fault": "join"}, {"at_s": 4, "fault": "kill_syncer"}]  # fmt: skip
    controller = run_plan(bare_plan(dry_run=True, timeline=timeline, duration_s=10), target, clock)
    assert target.calls == []
    # Guardrails still judge a dry run: the stall would have broken quorum.
    assert _phases(target) == [("kill", 0, "dry_run"), ("stall", 1, "refused"), ("join", None, "dry_run"),
                               ("kill_syncer", None, "dry_run")]  # fmt: skip
    assert (
        controller.report.counts["dry_run"] == Counter({FaultKind.KILL: 1, FaultKind.JOIN: 1, FaultKind.KILL_SYNCER: 1})
        and not controller.report.fired
    )
    assert target.records[0]["detail"] == "would SIGKILL (pid 1000)"


def test_stops_when_the_run_finishes_or_the_duration_ends():
    clock = SleepingClock()
    target = FakeTarget(clock)
    target.running_until = 5
    controller = run_plan(bare_plan(timeline=[{"at_s": 8, "fault": "kill", "learner": 0}]), target, clock)
    assert target.calls == [] and controller.report.stopped_because == "the run is not running"
    assert clock.now < 6

    clock = SleepingClock()
    target = FakeTarget(clock, quorum=0)
    controller = run_plan(
        bare_plan(kill_per_learner_per_min=6, in_flight_max_s=0.1, duration_s=30, seed=1), target, clock
    )
    # 6/min x 4 learners x 0.5 min = 12 expected: the last one fires before 30 s and nothing follows it.
    last = controller.report.entries[-1]["at_s"]
    assert len(target.calls) > 3 and last <= 30 and clock.now == last
    assert controller.report.stopped_because == "no faults left in the plan"


def test_waits_for_learners_before_the_clock_starts():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=2)
    target.states = {0: "starting", 1: "training"}
    target.script = [(40, 0, "training")]
    run_plan(bare_plan(warmup_s=5, timeline=[{"at_s": 5, "fault": "kill", "learner": 0}], duration_s=10), target, clock)
    assert target.calls == [("kill", 0)] and 45 <= clock.now <= 46


def test_stop_event_ends_a_controller_running_in_a_thread():
    clock = SleepingClock()
    target = FakeTarget(clock)
    target.clock = _RealClock()  # type: ignore[assignment]
    stop = threading.Event()
    controller = Controller(bare_plan(kill_per_learner_per_min=0.01), target, stop=stop, poll_s=0.05)
    thread = threading.Thread(target=controller.run, daemon=True)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()
    stop.set()
    thread.join(timeout=2)
    assert not thread.is_alive() and controller.report.stopped_because == "stopped"


class _RealClock:
    @property
    def now(self) -> float:
        return time.monotonic()


def test_kill_node_takes_every_learner_on_the_node_and_is_in_flight_until_all_are_back():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=2)
    target.nodes = {0: "node-a", 1: "node-b", 2: "node-a", 3: "node-b"}
    # Learners 0 and 2 (node a) die at 2; 0 is back at 6, 2 only at 9.
    target.script = [(2, 0, "dead"), (2, 2, "dead"), (6, 0, "training"), (9, 2, "training")]
    timeline = [
        {"at_s": 1, "fault": "kill_node", "learner": 2},  # 4 healthy -> 2 = quorum: allowed
        {"at_s": 7, "fault": "stall", "learner": 0},  # 0 is back, but its node's loss is in flight (2 is not)
        {"at_s": 10, "fault": "kill", "learner": 0},  # both back: fired
    ]
    controller = run_plan(bare_plan(max_concurrent=5, timeline=timeline, duration_s=20), target, clock)
    assert target.calls == [("kill_node", 2), ("kill", 0)]
    assert controller.report.fired == Counter(
        {FaultKind.KILL_NODE: 1, FaultKind.KILL: 1}
    ) and controller.report.refused == Counter({FaultKind.STALL: 1})
    injected = next(r for r in target.records if r["fault"] == "kill_node")
    assert injected["target"] == "node of learner 2"
    assert injected["detail"] == "SIGKILL every learner on its node: learners 0 (pid 1000), 2 (pid 1002)"
    refused = next(r for r in target.records if r["phase"] == "refused")
    assert refused["detail"] == "learner 0 already has a kill_node in flight"

    # The quorum guardrail counts every learner the lost node takes: 4 healthy, quorum 3, 2 on the node.
    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=3)
    target.nodes = {0: "node-a", 1: "node-b", 2: "node-a", 3: "node-b"}
    plan = bare_plan(timeline=[{"at_s": 1, "fault": "kill_node", "learner": 0}], duration_s=5)
    controller = run_plan(plan, target, clock)
    assert target.calls == [] and "would leave 2 healthy learner(s), below quorum 3" in target.records[0]["detail"]


def test_kill_node_poisson_rate_is_per_run_and_draws_its_learner():
    plan = bare_plan(kill_node_per_min=6, duration_s=120)
    faults = faults_until(plan, [0, 1, 2, 3], random.Random(0), horizon_s=120)
    assert faults and all(f.kind is FaultKind.KILL_NODE for f in faults)
    # About 6 a minute for the run, whatever the number of learners: 12 expected in 120 s.
    assert 4 <= len(faults) <= 24 and len({f.learner for f in faults}) > 1
    assert faults == faults_until(plan, [0, 1, 2, 3], random.Random(0), horizon_s=120)  # seeded
    assert "kill_node 6/min" in plan.summary()


def test_a_preemption_reaches_the_target_with_its_notice_and_is_in_flight_until_its_learner_trains_again():
    clock = SleepingClock()
    target = FakeTarget(clock)
    # Notice at 1: leaving at 2, gone at 3, a new process trains at 9.
    target.script = [(2, 0, "leaving"), (3, 0, "restarting"), (9, 0, "training")]
    timeline = [
        {"at_s": 1, "fault": "preempt", "learner": 0, "notice_s": 12},
        {"at_s": 5, "fault": "kill", "learner": 1},  # learner 0's preemption is in flight
        {"at_s": 10, "fault": "preempt", "learner": 2},  # back since 9: fired, with the plan's notice
    ]
    plan = bare_plan(max_concurrent=1, in_flight_max_s=30, timeline=timeline, duration_s=20, preempt_notice_s=40)
    controller = run_plan(plan, target, clock)
    assert target.calls == [("preempt", 0, 12.0), ("preempt", 2, 40.0)]
    assert controller.report.fired == Counter({FaultKind.PREEMPT: 2})
    first = target.records[0]
    assert first["detail"] == "SIGTERM, SIGKILL after 12 s unless it has left (pid 1000)" and first["notice_s"] == 12


def test_preemptions_are_drawn_per_learner_with_the_plans_notice():
    plan = bare_plan(preempt_per_learner_per_min=1.0, preempt_notice_s=20, duration_s=600, warmup_s=60)
    faults = faults_until(plan, [0, 1, 2, 3], random.Random(0), 600)
    assert {f.learner for f in faults} == {0, 1, 2, 3} and 12 <= len(faults) <= 60
    assert all(f.kind is FaultKind.PREEMPT and f.notice_s == 20 and f.duration_s is None for f in faults)
