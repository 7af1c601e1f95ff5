"""Chaos: schedules, guardrails under a fake clock, plan validation, and signals to real processes.

No Ray and no training: a fake Target records what the controller asks of it; the process tests
signal `sleep` children and clean every one of them up, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.controller import Controller
from chaos.faults import Fault, FaultKind
from chaos.plan import Plan, load_plan, plan_from_dict, reference_markdown, shipped_plans
from chaos.schedule import faults_until, schedule
from chaos.target import (
    CHAOS_FILE,
    CONTROL_FILE,
    LearnerInfo,
    ProcessSignals,
    RunDirTarget,
    TargetError,
    append_jsonl,
    read_control,
)
from dlc.cli.chaos import chaos_command, latest_run
from dlc.errors import UserError
from tests.helpers import REPO, FakeClock

K, ST, SL, J, L, KS, DL, CL = (
    FaultKind.KILL,
    FaultKind.STALL,
    FaultKind.SLOW,
    FaultKind.JOIN,
    FaultKind.LEAVE,
    FaultKind.KILL_SYNCER,
    FaultKind.DEGRADE_LINK,
    FaultKind.CUT_LINK,
)


# ---------------------------------------------------------------------------------------------
# Fakes


class SleepingClock(FakeClock):
    """A FakeClock with `sleep`: time moves only when the controller sleeps."""

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, "the controller must never spin without sleeping"
        self.now += seconds
        assert self.now < 10_000, "the controller did not stop"


class FakeTarget:
    """A run of learners whose states follow a script of (at_s, learner, state); records every call."""

    def __init__(self, clock: SleepingClock, learners: int = 4, quorum: int = 1) -> None:
        self.clock = clock
        self.states = {i: "training" for i in range(learners)}
        self.script: list[tuple[float, int, str]] = []
        self.quorum_value = quorum
        self.running_until = math.inf
        self.calls: list[tuple[Any, ...]] = []
        self.records: list[dict[str, Any]] = []
        self.fail_kill = False

    def learners(self) -> list[LearnerInfo]:
        for at, learner, state in self.script:
            if at <= self.clock.now:
                self.states[learner] = state
        self.script = [s for s in self.script if s[0] > self.clock.now]
        return [LearnerInfo(i, 1000 + i, s) for i, s in sorted(self.states.items())]

    def quorum(self) -> int:
        return self.quorum_value

    def running(self) -> bool:
        return self.clock.now < self.running_until

    def kill(self, learner: int) -> None:
        if self.fail_kill:
            raise TargetError(f"process {1000 + learner} is gone")
        self.calls.append(("kill", learner))

    def stall(self, learner: int, seconds: float) -> None:
        self.calls.append(("stall", learner, seconds))

    def slow(self, learner: int, factor: float, seconds: float | None) -> None:
        self.calls.append(("slow", learner, factor, seconds))

    def join(self, seconds: float | None = None) -> None:
        self.calls.append(("join", seconds))

    def leave(self, learner: int) -> None:
        self.calls.append(("leave", learner))

    def kill_syncer(self) -> None:
        self.calls.append(("kill_syncer",))

    def degrade_link(self, learner: int, factor: float, seconds: float) -> None:
        self.calls.append(("degrade_link", learner, factor, seconds))

    def cut_link(self, learner: int, seconds: float) -> None:
        self.calls.append(("cut_link", learner, seconds))

    def record(self, entry: dict[str, Any]) -> None:
        self.records.append(entry)


def _plan(**fields: Any) -> Plan:
    """A plan with no guardrail in the way unless a test sets one."""
    base = {"warmup_s": 0, "min_gap_s": 0, "max_concurrent": 100}
    return plan_from_dict({**base, **fields})


def _run(plan: Plan, target: FakeTarget, clock: SleepingClock) -> Controller:
    controller = Controller(plan, target, clock=clock, sleep=clock.sleep, poll_s=0.5)
    controller.run()
    return controller


def _phases(target: FakeTarget) -> list[tuple[str, int | None, str]]:
    return [(r["fault"], r["learner"], r["phase"]) for r in target.records]


# ---------------------------------------------------------------------------------------------
# Fault kinds and schedules


def test_every_fault_kind_names_its_mechanism():
    values = ["kill", "stall", "slow", "join", "leave", "kill_syncer", "degrade_link", "cut_link"]
    assert [k.value for k in FaultKind] == values
    assert all(k.__doc__ and k.__doc__ != FaultKind.__doc__ for k in FaultKind)
    assert "SIGKILL" in K.__doc__ and "SIGSTOP" in ST.__doc__ and "SIGCONT" in ST.__doc__
    assert "SIGKILL" in KS.__doc__ and "step time" in SL.__doc__
    assert "bandwidth" in DL.__doc__ and "latency" in DL.__doc__ and "queue" in CL.__doc__
    # Link faults act on one learner for a while, and leave it training (the quorum guardrail ignores them).
    assert all(k.needs_learner and k.has_duration and not k.takes_learner_out for k in (DL, CL))
    assert Fault(1, DL, 2, 30, 10).describe() == "link bandwidth /10, latency x10 for 30 s"
    assert Fault(1, CL, 2, 10).describe() == "link cut for 10 s, messages held until it returns"


def test_same_seed_same_faults_and_streams_do_not_disturb_each_other():
    plan = _plan(kill_per_learner_per_min=1.0, duration_s=600, seed=7)
    first = faults_until(plan, [0, 1, 2, 3], random.Random(7), 600)
    assert first == faults_until(plan, [0, 1, 2, 3], random.Random(7), 600)
    assert first != faults_until(plan, [0, 1, 2, 3], random.Random(8), 600)
    # Adding stalls, or a learner, leaves every existing kill where it was.
    with_stalls = faults_until(_plan(kill_per_learner_per_min=1.0, stall_per_learner_per_min=2.0, duration_s=600),
                               [0, 1, 2, 3], random.Random(7), 600)  # fmt: skip
    assert [f for f in with_stalls if f.kind is K] == first
    five = faults_until(plan, [0, 1, 2, 3, 4], random.Random(7), 600)
    assert [f for f in five if f.learner != 4] == first
    assert all(a.at_s <= b.at_s for a, b in zip(first, first[1:], strict=False))


def test_poisson_counts_match_rate_times_duration():
    # 1.5 kills per learner per minute, 4 learners, 600 s after a 60 s warm-up: the count is Poisson
    # with mean 1.5 * 4 * (600 - 60) / 60 = 54 and sd sqrt(54) = 7.3. One seed: within 4 sd, [24, 84].
    plan = _plan(kill_per_learner_per_min=1.5, duration_s=600, warmup_s=60)
    counts = [len(faults_until(plan, [0, 1, 2, 3], random.Random(seed), 600)) for seed in range(40)]
    assert all(24 <= c <= 84 for c in counts)
    # The mean of 40 seeds has sd 7.3 / sqrt(40) = 1.16: within 4 sd of 54 is [49.4, 58.6].
    assert 49.4 <= sum(counts) / len(counts) <= 58.6
    faults = faults_until(plan, [0, 1, 2, 3], random.Random(0), 600)
    assert all(60 < f.at_s <= 600 and f.origin == "poisson" for f in faults)
    # Every learner gets its share: each one's count has mean 13.5, sd 3.7; all within 4 sd.
    per_learner = Counter(f.learner for f in faults)
    assert set(per_learner) == {0, 1, 2, 3} and all(0 <= n <= 28 for n in per_learner.values())


def test_join_and_syncer_rates_are_per_run_and_timeline_defaults_fill_in():
    plan = _plan(
        join_per_min=2.0,
        kill_syncer_per_min=1.0,
        duration_s=300,
        stall_for_s=7,
        slow_factor=2.5,
        slow_for_s=9,
        join_for_s=11,
        timeline=[
            {"at_s": 5, "fault": "stall", "learner": 1},
            {"at_s": 3, "fault": "slow", "learner": 2},
            {"at_s": 4, "fault": "slow", "learner": 3, "until_end": True, "factor": 4},
        ],
    )
    faults = list(schedule(plan, [0, 1, 2, 3], random.Random(0)))
    timeline = [f for f in faults if f.origin == "timeline"]
    assert timeline == [
        Fault(3, SL, 2, 9, 2.5),
        Fault(4, SL, 3, None, 4.0),  # until the run ends
        Fault(5, ST, 1, 7, None),
    ]
    # Per run, not per learner: 2/min over 300 s is 10 joins (sd 3.2), 1/min is 5 syncer kills (sd 2.2).
    joins, syncer = [f for f in faults if f.kind is J], [f for f in faults if f.kind is KS]
    assert 0 < len(joins) <= 23 and 0 < len(syncer) <= 14
    assert all(f.learner is None and f.duration_s == 11 for f in joins)


def test_link_faults_are_drawn_at_their_rates_with_the_plans_factor_and_durations():
    # 1 degradation and 0.5 cuts per learner per minute, 4 learners, 540 s after a 60 s warm-up: Poisson
    # counts with means 1 * 4 * 9 = 36 (sd 6) and 0.5 * 4 * 9 = 18 (sd 4.2). One seed: within 4 sd.
    links = {"degrade_link_per_learner_per_min": 1.0, "degrade_link_factor": 8, "degrade_link_for_s": 12,
             "cut_link_per_learner_per_min": 0.5, "cut_link_for_s": 4, "duration_s": 600, "warmup_s": 60}  # fmt: skip
    plan = _plan(**links)
    draws = [faults_until(plan, [0, 1, 2, 3], random.Random(seed), 600) for seed in range(40)]
    degrades = [sum(f.kind is DL for f in d) for d in draws]
    cuts = [sum(f.kind is CL for f in d) for d in draws]
    assert all(12 <= n <= 60 for n in degrades) and all(1 <= n <= 35 for n in cuts)
    # Means of 40 seeds: sd 6 / sqrt(40) = 0.95 and 4.2 / sqrt(40) = 0.67; within 4 sd of 36 and 18.
    assert 32.2 <= sum(degrades) / 40 <= 39.8 and 15.3 <= sum(cuts) / 40 <= 20.7
    faults = draws[0]
    assert {f.learner for f in faults} == {0, 1, 2, 3}
    assert all(60 < f.at_s <= 600 and f.origin == "poisson" for f in faults)
    assert all((f.factor, f.duration_s) == ((8.0, 12.0) if f.kind is DL else (None, 4.0)) for f in faults)
    # The same seed gives the same faults, and adding link faults leaves every kill where it was.
    assert faults == faults_until(plan, [0, 1, 2, 3], random.Random(0), 600)
    kills = {"kill_per_learner_per_min": 1.0, "duration_s": 600, "warmup_s": 60}
    alone = faults_until(_plan(**kills), [0, 1, 2, 3], random.Random(0), 600)
    mixed = faults_until(_plan(**links, **{"kill_per_learner_per_min": 1.0}), [0, 1, 2, 3], random.Random(0), 600)
    assert alone and [f for f in mixed if f.kind is K] == alone


def test_link_faults_in_a_plan_file_take_the_plans_defaults(tmp_path: Path):
    file = tmp_path / "links.yaml"
    file.write_text(
        "degrade_link_per_learner_per_min: 0.5\ndegrade_link_factor: 6\ndegrade_link_for_s: 25\n"
        "cut_link_per_learner_per_min: 1\ncut_link_for_s: 7\ntimeline:\n"
        "  - {at_s: 1, fault: degrade_link, learner: 0}\n"
        "  - {at_s: 2, fault: degrade_link, learner: 1, factor: 2.5, duration_s: 9}\n"
        "  - {at_s: 3, fault: cut_link, learner: 2}\n"
        "  - {at_s: 4, fault: cut_link, learner: 3, duration_s: 1.5}\n"
    )
    plan = load_plan(file)
    assert [plan.fault_of(e) for e in plan.timeline] == [
        Fault(1, DL, 0, 25, 6),
        Fault(2, DL, 1, 9, 2.5),
        Fault(3, CL, 2, 7, None),
        Fault(4, CL, 3, 1.5, None),
    ]
    assert plan.summary().startswith("degrade_link 0.5/learner/min x6 for 25 s, cut_link 1/learner/min for 7 s")
    defaults = plan_from_dict({})
    assert (defaults.degrade_link_per_learner_per_min, defaults.degrade_link_factor, defaults.degrade_link_for_s,
            defaults.cut_link_per_learner_per_min, defaults.cut_link_for_s) == (0, 10, 30, 0, 10)  # fmt: skip
    assert defaults.fault_of(plan.timeline[0]) == Fault(1, DL, 0, 30, 10)


# ---------------------------------------------------------------------------------------------
# Guardrails


def test_quorum_guardrail_refuses_a_fault_that_would_break_quorum():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=3)
    timeline = [
        {"at_s": 1, "fault": "kill", "learner": 0},  # 4 healthy -> 3: allowed
        {"at_s": 2, "fault": "kill", "learner": 1},  # 3 -> 2 < 3: refused
        {"at_s": 3, "fault": "stall", "learner": 2},  # same: refused
        {"at_s": 4, "fault": "slow", "learner": 3},  # a slow learner still counts: allowed
    ]
    controller = _run(_plan(timeline=timeline, duration_s=10), target, clock)
    # The status still says learner 0 trains (detection lags), yet it counts as out while its kill is in flight.
    assert target.calls == [("kill", 0), ("slow", 3, 3.0, 30.0)]
    assert controller.report.fired == Counter({K: 1, SL: 1})
    assert controller.report.refused == Counter({K: 1, ST: 1})
    refused = [r for r in target.records if r["phase"] == "refused"]
    assert all("would leave 2 healthy learner(s), below quorum 3" in r["detail"] for r in refused)

    clock = SleepingClock()
    target = FakeTarget(clock, learners=4, quorum=3)
    controller = _run(_plan(timeline=timeline, duration_s=10, allow_below_quorum=True), target, clock)
    assert controller.report.fired == Counter({K: 2, ST: 1, SL: 1}) and not controller.report.refused


def test_quorum_counts_learners_the_run_reports_down():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=3, quorum=2)
    target.states[1] = "restarting"
    controller = _run(_plan(timeline=[{"at_s": 1, "fault": "kill", "learner": 0}], duration_s=5), target, clock)
    assert target.calls == [] and controller.report.refused == Counter({K: 1})


def test_warmup_refuses_early_timeline_faults_and_poisson_waits_it_out():
    clock = SleepingClock()
    target = FakeTarget(clock)
    plan = _plan(warmup_s=10, duration_s=20, timeline=[{"at_s": 5, "fault": "kill", "learner": 0},
                                                        {"at_s": 12, "fault": "kill", "learner": 1}])  # fmt: skip
    controller = _run(plan, target, clock)
    assert _phases(target) == [("kill", 0, "refused"), ("kill", 1, "injected")]
    assert "warm-up" in target.records[0]["detail"] and controller.report.fired == Counter({K: 1})
    assert all(
        f.at_s > 10 for f in faults_until(_plan(warmup_s=10, kill_per_learner_per_min=5), [0], random.Random(), 60)
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
    controller = _run(_plan(min_gap_s=10, timeline=timeline, duration_s=20), target, clock)
    assert [c[1] for c in target.calls] == [0, 3]
    assert controller.report.refused == Counter({K: 2}) and "min_gap_s=10" in target.records[1]["detail"]


def test_max_concurrent_counts_a_stall_for_its_duration():
    clock = SleepingClock()
    target = FakeTarget(clock)
    timeline = [
        {"at_s": 1, "fault": "stall", "learner": 0, "duration_s": 10},
        {"at_s": 5, "fault": "slow", "learner": 1},  # the stall is in flight until 11: refused
        {"at_s": 12, "fault": "slow", "learner": 1},  # fired
    ]
    controller = _run(_plan(max_concurrent=1, timeline=timeline, duration_s=20), target, clock)
    assert target.calls == [("stall", 0, 10.0), ("slow", 1, 3.0, 30.0)]
    assert "1 fault(s) in flight (stall on learner 0), max_concurrent=1" in target.records[1]["detail"]
    assert controller.report.fired == Counter({ST: 1, SL: 1}) and controller.report.refused == Counter({SL: 1})


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
    controller = _run(_plan(max_concurrent=1, in_flight_max_s=30, timeline=timeline, duration_s=20), target, clock)
    assert target.calls == [("kill", 0), ("kill", 1)]
    assert controller.report.fired == Counter({K: 2}) and controller.report.refused == Counter({K: 2})

    # A learner that never shows as down releases the slot after in_flight_max_s.
    clock = SleepingClock()
    target = FakeTarget(clock)
    timeline = [{"at_s": 1, "fault": "kill", "learner": 0}, {"at_s": 15, "fault": "kill", "learner": 1},
                {"at_s": 22, "fault": "kill", "learner": 2}]  # fmt: skip
    controller = _run(_plan(max_concurrent=1, in_flight_max_s=20, timeline=timeline, duration_s=30), target, clock)
    assert target.calls == [("kill", 0), ("kill", 2)]


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
    _run(_plan(timeline=timeline, duration_s=10), target, clock)
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
    controller = _run(_plan(timeline=timeline, duration_s=10), target, clock)
    assert target.calls == [("join", 15.0), ("leave", 3), ("kill_syncer",), ("slow", 0, 5.0, 2.0)]
    assert controller.report.counts["failed"] == Counter({K: 1})
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
    controller = _run(_plan(timeline=timeline, duration_s=20), target, clock)
    assert target.calls == [("degrade_link", 0, 10.0, 5.0), ("cut_link", 1, 10.0), ("degrade_link", 0, 3.0, 30.0)]
    assert controller.report.fired == Counter({DL: 2, CL: 1})
    assert controller.report.refused == Counter({K: 1, DL: 1})
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
    plan = _plan(kill_per_learner_per_min=2, slow_per_learner_per_min=1, slow_for_s=0.01, in_flight_max_s=0.01,
                 duration_s=120, seed=3)  # fmt: skip
    expected = Counter(f.kind for f in faults_until(plan, [0, 1, 2, 3], random.Random(3), 120))
    controller = _run(plan, target, clock)
    assert controller.report.fired == expected and not controller.report.refused
    assert Counter(c[0] for c in target.calls) == {k.value: n for k, n in expected.items()}


def test_dry_run_records_and_touches_nothing():
    clock = SleepingClock()
    target = FakeTarget(clock, quorum=3)
    timeline = [{"at_s": 1, "fault": "kill", "learner": 0}, {"at_s": 2, "fault": "stall", "learner": 1},
                {"at_s": 3, "fault": "join"}, {"at_s": 4, "fault": "kill_syncer"}]  # fmt: skip
    controller = _run(_plan(dry_run=True, timeline=timeline, duration_s=10), target, clock)
    assert target.calls == []
    # Guardrails still judge a dry run: the stall would have broken quorum.
    assert _phases(target) == [("kill", 0, "dry_run"), ("stall", 1, "refused"), ("join", None, "dry_run"),
                               ("kill_syncer", None, "dry_run")]  # fmt: skip
    assert controller.report.counts["dry_run"] == Counter({K: 1, J: 1, KS: 1}) and not controller.report.fired
    assert target.records[0]["detail"] == "would SIGKILL (pid 1000)"


def test_stops_when_the_run_finishes_or_the_duration_ends():
    clock = SleepingClock()
    target = FakeTarget(clock)
    target.running_until = 5
    controller = _run(_plan(timeline=[{"at_s": 8, "fault": "kill", "learner": 0}]), target, clock)
    assert target.calls == [] and controller.report.stopped_because == "the run is not running"
    assert clock.now < 6

    clock = SleepingClock()
    target = FakeTarget(clock, quorum=0)
    controller = _run(_plan(kill_per_learner_per_min=6, in_flight_max_s=0.1, duration_s=30, seed=1), target, clock)
    # 6/min x 4 learners x 0.5 min = 12 expected: the last one fires before 30 s and nothing follows it.
    last = controller.report.entries[-1]["at_s"]
    assert len(target.calls) > 3 and last <= 30 and clock.now == last
    assert controller.report.stopped_because == "no faults left in the plan"


def test_waits_for_learners_before_the_clock_starts():
    clock = SleepingClock()
    target = FakeTarget(clock, learners=2)
    target.states = {0: "starting", 1: "training"}
    target.script = [(40, 0, "training")]
    _run(_plan(warmup_s=5, timeline=[{"at_s": 5, "fault": "kill", "learner": 0}], duration_s=10), target, clock)
    assert target.calls == [("kill", 0)] and 45 <= clock.now <= 46


def test_stop_event_ends_a_controller_running_in_a_thread():
    clock = SleepingClock()
    target = FakeTarget(clock)
    target.clock = _RealClock()  # type: ignore[assignment]
    stop = threading.Event()
    controller = Controller(_plan(kill_per_learner_per_min=0.01), target, stop=stop, poll_s=0.05)
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


# ---------------------------------------------------------------------------------------------
# Plans


def _invalid(data: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(UserError) as info:
        plan_from_dict(data, **kw)
    return str(info.value)


def _tl(**entry: Any) -> dict[str, Any]:
    return {"timeline": [entry]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kill_rate": 1}, "unknown key kill_rate: did you mean kill_per_learner_per_min?"),
        ({"warmup_sec": 1}, "unknown key warmup_sec: did you mean warmup_s?"),
        (_tl(at_s=1, fault="kill", lerner=0), "unknown key timeline[0].lerner: did you mean learner?"),
        (_tl(at_s=1, fault="kil", learner=0), "timeline[0].fault: 'kil' is not a fault kind: did you mean kill?"),
        (_tl(at_s=1, fault="kill"), "timeline[0]: kill needs a learner: add learner: N"),
        (_tl(at_s=1, fault="join", learner=1), "join adds a new learner and takes no learner: remove learner: 1"),
        (_tl(at_s=1, fault="kill_syncer", learner=0), "kill_syncer acts on the syncer"),
        (_tl(at_s=1, fault="stall", learner=0, until_end=True), "a stall cannot last until_end"),
        (_tl(at_s=1, fault="kill", learner=0, duration_s=3), "kill is instantaneous and takes no duration_s"),
        (_tl(at_s=1, fault="stall", learner=0, factor=2), "factor is for slow or degrade_link, not stall"),
        (_tl(at_s=1, fault="cut_link", learner=0, factor=2), "factor is for slow or degrade_link, not cut_link"),
        (_tl(at_s=1, fault="degrade_link"), "timeline[0]: degrade_link needs a learner: add learner: N"),
        (_tl(at_s=1, fault="cut_lnk", learner=0), "'cut_lnk' is not a fault kind: did you mean cut_link?"),
        (_tl(at_s=1, fault="degrade_link", learner=0, factor=0.5), "timeline[0].factor=0.5: Input should be greater"),
        (_tl(at_s=1, fault="cut_link", learner=0, until_end=True), "a cut_link cannot last until_end"),
        (_tl(at_s=1, fault="degrade_link", learner=0, until_end=True), "set learners.bandwidth_mbps"),
        ({"degrade_link_factor": 1}, "degrade_link_factor=1: Input should be greater than 1"),
        ({"cut_link_for_s": 0}, "cut_link_for_s=0: Input should be greater than 0"),
        ({"link_factor": 4}, "unknown key link_factor: did you mean degrade_link_factor?"),
        ({"cut_link_rate": 1}, "unknown key cut_link_rate: did you mean cut_link_per_learner_per_min?"),
        ({"timeline": ["kill learner 2"]}, "timeline[0]='kill learner 2' is not a mapping: write it as {at_s: 30"),
        ({"duration_s": 60, **_tl(at_s=90, fault="join")}, "timeline[0].at_s=90 is after duration_s=60"),
        ({"slow_factor": 0.5}, "slow_factor=0.5: Input should be greater than 1"),
        ({"max_concurrent": 0}, "max_concurrent=0: Input should be greater than or equal to 1"),
    ],
)
def test_plan_validation_names_the_field_and_the_fix(data: dict[str, Any], message: str):
    assert message in _invalid(data)


def test_plan_files_overrides_and_option_names(tmp_path: Path):
    file = tmp_path / "p.yaml"
    file.write_text("kill_per_learner_per_min: 0.5\nseed: 4\ntimeline:\n  - {at_s: 30, fault: kill, learner: 2}\n")
    plan = load_plan(file, {"seed": 9, "stall_for_s": 4})
    assert (plan.kill_per_learner_per_min, plan.seed, plan.stall_for_s, plan.timeline[0].learner) == (0.5, 9, 4, 2)
    with pytest.raises(UserError, match=r"--kill-rate=-1: Input should be greater than or equal to 0"):
        load_plan(file, {"kill_per_learner_per_min": -1}, {"kill_per_learner_per_min": "--kill-rate"})
    file.write_text("- kill\n")
    with pytest.raises(UserError, match="must be a mapping"):
        load_plan(file)
    file.write_text("timeline: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_plan(file)
    with pytest.raises(UserError, match=r"not found: .*kill_storm"):
        load_plan(tmp_path / "missing.yaml")
    with pytest.raises(UserError, match=r"timeline\[0\] targets learner 2 but the run's learners are 0, 1"):
        load_plan(None, {"timeline": [{"at_s": 1, "fault": "kill", "learner": 2}]}).check_learners([0, 1])


def test_shipped_plans_load_and_fit_the_tiny_recipe():
    plans = {name: load_plan(name) for name in shipped_plans()}
    assert set(plans) == {"kill_storm", "stragglers", "heterogeneous", "mixed", "thin_links"}
    for plan in plans.values():
        plan.check_learners([0, 1, 2, 3])
        assert plan.description and not plan.is_empty() and not plan.dry_run
    assert plans["kill_storm"].kill_per_learner_per_min > 0
    assert plans["stragglers"].stall_per_learner_per_min > 0 and plans["stragglers"].slow_per_learner_per_min > 0
    hetero = [plans["heterogeneous"].fault_of(e) for e in plans["heterogeneous"].timeline]
    assert hetero and all(f.kind is SL and f.duration_s is None for f in hetero)  # slow for the whole run
    assert {e.fault for e in plans["mixed"].timeline} >= {J, L, KS}
    thin = plans["thin_links"]
    assert {e.fault for e in thin.timeline} == {DL, CL} and thin.degrade_link_factor == 10
    assert thin.degrade_link_per_learner_per_min > 0 and thin.cut_link_per_learner_per_min > 0
    # Its scripted degradation and cut both fire (seed 0), within its guardrails.
    clock = SleepingClock()
    target = FakeTarget(clock)
    _run(thin, target, clock)
    assert ("degrade_link", 1, 10.0, 60.0) in target.calls and ("cut_link", 3, 10.0) in target.calls
    # Firing the heterogeneous plan applies every slow-down at once, within its guardrails.
    clock = SleepingClock()
    target = FakeTarget(clock)
    controller = _run(plans["heterogeneous"], target, clock)
    assert controller.report.fired == Counter({SL: len(hetero)}) and not controller.report.refused


def test_plan_reference_lists_every_field():
    table = reference_markdown()
    assert all(f"| `{name}` |" in table for name in Plan.model_fields)
    assert "| `timeline[].at_s` | `required` |" in table


# ---------------------------------------------------------------------------------------------
# Processes: signals, the stall timer, a run directory


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[Any]]]:
    """Start processes that are killed and reaped at teardown, whatever the test did."""
    procs: list[subprocess.Popen[Any]] = []

    def start(args: list[str], **kw: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(args, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def stray_pids() -> Iterator[list[int]]:
    """Pids of processes started by our children (stall timers); killed at teardown if still there."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    """The process state letter from /proc (R, S, T for stopped, Z, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_process_signals_refuse_pids_that_address_groups_or_ourselves():
    sent: list[tuple[int, int]] = []
    signals = ProcessSignals(send=lambda pid, sig: sent.append((pid, sig)))
    for pid in (0, -1, 1, os.getpid()):
        with pytest.raises(TargetError):
            signals.kill(pid)
    assert sent == []


def test_stall_timer_resumes_the_victim_after_the_controller_dies(spawn, stray_pids):
    victim = spawn(["sleep", "30"])
    code = (
        "import sys, time\n"
        "from chaos.target import ProcessSignals\n"
        "timer = ProcessSignals().stall(int(sys.argv[1]), 1.0)\n"
        "print(timer.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    controller = spawn(
        [sys.executable, "-c", code, str(victim.pid)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    stray_pids.append(int(controller.stdout.readline()))
    stalled_at = time.monotonic()
    assert _wait_for(lambda: _state(victim.pid) == "T", 1.0), "SIGSTOP did not freeze the victim"
    controller.kill()
    controller.wait(timeout=5)
    if time.monotonic() - stalled_at < 0.8:  # the timer has not fired yet: whoever resumes it, it is not the controller
        assert _state(victim.pid) == "T"
    assert _wait_for(lambda: _state(victim.pid) != "T", 4.0), "the victim stayed frozen"
    assert victim.poll() is None


def _write_status(run: Path, learner_pids: dict[int, int], syncer_pid: int | None = None, **extra: Any) -> None:
    status = {
        "state": "running",
        "updated_at": time.time(),
        "learners": [{"id": i, "pid": pid, "state": "training", "step": 3} for i, pid in learner_pids.items()],
        "syncer": {"quorum": 2, "pid": syncer_pid},
        **extra,
    }
    tmp = run / ".status.json.tmp"
    tmp.write_text(json.dumps(status))
    os.replace(tmp, run / "status.json")


def test_run_dir_target_acts_through_the_run_directory(tmp_path: Path, spawn):
    a, b, syncer = spawn(["sleep", "30"]), spawn(["sleep", "30"]), spawn(["sleep", "30"])
    _write_status(tmp_path, {0: a.pid, 1: b.pid}, syncer.pid)
    target = RunDirTarget(tmp_path)
    assert target.learners() == [LearnerInfo(0, a.pid, "training"), LearnerInfo(1, b.pid, "training")]
    assert target.quorum() == 2 and target.running()

    target.stall(1, 0.5)
    assert _wait_for(lambda: _state(b.pid) == "T", 1.0)
    assert _wait_for(lambda: _state(b.pid) != "T", 3.0)
    target.kill(0)
    assert a.wait(timeout=5) == -signal.SIGKILL
    target.kill_syncer()
    assert syncer.wait(timeout=5) == -signal.SIGKILL
    assert b.poll() is None
    with pytest.raises(TargetError, match="no learner 7"):
        target.kill(7)

    target.slow(1, 2.5, 20.0)
    target.join(60.0)
    target.leave(1)
    lines, offset = read_control(tmp_path / CONTROL_FILE, 0)
    assert [(x["op"], x["learner"], x["factor"], x["duration_s"]) for x in lines] == [
        ("slow", 1, 2.5, 20.0),
        ("join", None, None, 60.0),
        ("leave", 1, None, None),
    ]
    assert all(abs(x["t"] - time.time()) < 60 for x in lines)
    assert read_control(tmp_path / CONTROL_FILE, offset) == ([], offset)

    target.record({"fault": "kill", "phase": "injected"})
    target.record({"fault": "stall", "phase": "refused", "t": 5.0})
    recorded = [json.loads(x) for x in (tmp_path / CHAOS_FILE).read_text().splitlines()]
    assert recorded[0]["fault"] == "kill" and recorded[0]["t"] > 1e9 and recorded[1]["t"] == 5.0


def test_run_dir_target_asks_the_driver_to_degrade_or_cut_a_link(tmp_path: Path):
    target = RunDirTarget(tmp_path, clock=lambda: 1234.5)
    target.degrade_link(2, 10.0, 30.0)
    target.cut_link(3, 10.0)
    lines = [json.loads(x) for x in (tmp_path / CONTROL_FILE).read_text().splitlines()]
    assert lines == [
        {"t": 1234.5, "op": "degrade_link", "learner": 2, "factor": 10.0, "duration_s": 30.0},
        {"t": 1234.5, "op": "cut_link", "learner": 3, "duration_s": 10.0},
    ]


def test_run_dir_target_tolerates_missing_stale_and_finished_status(tmp_path: Path):
    target = RunDirTarget(tmp_path)
    assert target.learners() == [] and not target.running()
    (tmp_path / "status.json").write_text(
        json.dumps(
            {"state": "running", "updated_at": time.time(), "learners": [{"id": 0, "pid": 4242, "state": "slow"}]}
        )
    )
    assert target.running() and target.learners() == [LearnerInfo(0, 4242, "slow")]
    assert target.quorum() == 1  # no syncer.quorum and no recipe.yaml: every learner, the safe answer
    (tmp_path / "recipe.yaml").write_text("syncer:\n  quorum: 3\n")
    assert target.quorum() == 3
    with pytest.raises(TargetError, match="syncer's pid"):
        target.kill_syncer()
    (tmp_path / "status.json").write_text('{"state": "runn')  # unreadable: keep the last good reading
    assert target.learners() == [LearnerInfo(0, 4242, "slow")]
    _write_status(tmp_path, {0: 4242}, updated_at=time.time() - 120)
    assert not target.running()  # the driver stopped writing: treat the run as gone
    _write_status(tmp_path, {0: 4242}, state="completed")
    assert not target.running()


def test_read_control_leaves_a_half_written_line_for_later(tmp_path: Path):
    path = tmp_path / CONTROL_FILE
    assert read_control(path, 0) == ([], 0)
    append_jsonl(path, {"op": "slow", "learner": 1})
    with open(path, "a") as f:
        f.write('not json\n{"op": "jo')
    entries, offset = read_control(path, 0)
    assert entries == [{"op": "slow", "learner": 1}] and offset == len(path.read_bytes()) - len('{"op": "jo')
    with open(path, "a") as f:
        f.write('in"}\n')
    assert read_control(path, offset) == ([{"op": "join"}], len(path.read_bytes()))
    path.write_text('{"op": "leave"}\n')  # replaced by a shorter file: start over
    assert read_control(path, 10_000)[0] == [{"op": "leave"}]


def test_dry_run_against_a_run_directory_touches_nothing(tmp_path: Path, spawn):
    victim = spawn(["sleep", "30"])
    _write_status(tmp_path, {0: victim.pid, 1: 4242, 2: 4243})
    clock = SleepingClock()
    plan = _plan(dry_run=True, duration_s=10, timeline=[{"at_s": 1, "fault": "stall", "learner": 0},
                                                        {"at_s": 2, "fault": "slow", "learner": 1}])  # fmt: skip
    report = Controller(plan, RunDirTarget(tmp_path), clock=clock, sleep=clock.sleep).run()
    assert report.counts["dry_run"] == Counter({ST: 1, SL: 1})
    assert _state(victim.pid) != "T" and victim.poll() is None
    assert not (tmp_path / CONTROL_FILE).exists()
    assert [json.loads(x)["phase"] for x in (tmp_path / CHAOS_FILE).read_text().splitlines()] == ["dry_run"] * 2


def test_dry_run_lists_link_faults_and_requests_nothing(tmp_path: Path):
    _write_status(tmp_path, {0: 4242, 1: 4243})
    clock = SleepingClock()
    plan = _plan(dry_run=True, duration_s=10, timeline=[{"at_s": 1, "fault": "degrade_link", "learner": 0},
                                                        {"at_s": 2, "fault": "cut_link", "learner": 1,
                                                         "duration_s": 3}])  # fmt: skip
    report = Controller(plan, RunDirTarget(tmp_path), clock=clock, sleep=clock.sleep).run()
    assert report.counts["dry_run"] == Counter({DL: 1, CL: 1}) and not report.fired
    assert not (tmp_path / CONTROL_FILE).exists()
    recorded = [json.loads(x) for x in (tmp_path / CHAOS_FILE).read_text().splitlines()]
    assert [(r["fault"], r["learner"], r["phase"], r["detail"]) for r in recorded] == [
        ("degrade_link", 0, "dry_run", "would link bandwidth /10, latency x10 for 30 s"),
        ("cut_link", 1, "dry_run", "would link cut for 3 s, messages held until it returns"),
    ]


# ---------------------------------------------------------------------------------------------
# The command


def _args(**kw: Any) -> dict[str, Any]:
    base = dict.fromkeys(
        (
            "run",
            "kill_rate",
            "stall_rate",
            "stall_for",
            "slow_rate",
            "slow_factor",
            "slow_for",
            "degrade_link_rate",
            "link_factor",
            "cut_link_rate",
            "plan",
            "seed",
            "duration",
        )
    )
    return {**base, "dry_run": False, **kw}


def test_chaos_command_dry_run_on_the_latest_run(tmp_path: Path, monkeypatch, capsys, spawn):
    monkeypatch.chdir(tmp_path)
    old, new = tmp_path / "runs" / "old", tmp_path / "runs" / "new"
    victim = spawn(["sleep", "30"])
    for run in (old, new):
        run.mkdir(parents=True)
        _write_status(run, {0: victim.pid, 1: 4242, 2: 4243})
    os.utime(old / "status.json", (time.time() - 100, time.time() - 100))
    assert latest_run() == Path("runs/new")
    plan = tmp_path / "plan.yaml"
    plan.write_text("warmup_s: 0\ntimeline:\n  - {at_s: 0, fault: kill, learner: 0}\n  - {at_s: 0.1, fault: join}\n")
    chaos_command(**_args(plan=plan, dry_run=True, duration=2.0))
    out = capsys.readouterr().out
    assert "kill         learner 0   would SIGKILL" in out and "[dry_run]" in out
    assert out.splitlines()[-2].split() == ["total", "0", "1", "1", "0"]  # the join comes within min_gap_s: refused
    assert victim.poll() is None and not (new / CONTROL_FILE).exists()
    assert len((new / CHAOS_FILE).read_text().splitlines()) == 2 and not (old / CHAOS_FILE).exists()


def test_chaos_command_reports_bad_input(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="nothing to inject"):
        chaos_command(**_args())
    with pytest.raises(UserError, match="no run directory with a status.json under 'runs'"):
        chaos_command(**_args(kill_rate=1.0))
    with pytest.raises(UserError, match=r"--kill-rate=-1.0: Input should be greater than or equal to 0"):
        chaos_command(**_args(kill_rate=-1.0))
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    _write_status(run, {0: 4242, 1: 4243}, state="completed")
    with pytest.raises(UserError, match="is not running \\(state: completed\\)"):
        chaos_command(**_args(run=Path("r1"), kill_rate=1.0))
    with pytest.raises(UserError, match="'nope' is not a run directory"):
        chaos_command(**_args(run=Path("nope"), kill_rate=1.0))
    _write_status(run, {0: 4242, 1: 4243})
    with pytest.raises(UserError, match="targets learner 2"):
        chaos_command(**_args(run=run, plan=REPO / "chaos" / "plans" / "kill_storm.yaml"))


def test_chaos_command_link_flags(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from dlc.cli.app import app

    runner = CliRunner()
    shown = runner.invoke(app, ["chaos", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and all(f in shown.stdout for f in ("--degrade-link-rate", "--link-factor",
                                                                    "--cut-link-rate"))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    bad = runner.invoke(app, ["chaos", "--degrade-link-rate", "1", "--link-factor", "1"])
    assert bad.exit_code == 2 and "--link-factor=1.0: Input should be greater than 1" in bad.stderr
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    _write_status(run, {0: 4242, 1: 4243, 2: 4244})
    plan = tmp_path / "links.yaml"
    plan.write_text(
        "warmup_s: 0\nmin_gap_s: 0\nmax_concurrent: 2\ntimeline:\n  - {at_s: 0, fault: degrade_link, learner: 1}\n"
        "  - {at_s: 0, fault: cut_link, learner: 2, duration_s: 4}\n"
    )
    flags = ["--degrade-link-rate", "0.5", "--link-factor", "4", "--cut-link-rate", "0.25"]
    result = runner.invoke(app, ["chaos", "r1", "--plan", str(plan), *flags, "--duration", "0.3", "--dry-run"])
    assert result.exit_code == 0, result.output
    summary = "degrade_link 0.5/learner/min x4 for 30 s, cut_link 0.25/learner/min for 10 s, 2 timeline fault(s)"
    assert summary in result.stderr
    assert "degrade_link learner 1   would link bandwidth /4, latency x4 for 30 s [dry_run]" in result.stdout
    assert "cut_link     learner 2   would link cut for 4 s, messages held until it returns [dry_run]" in result.stdout
    assert not (run / CONTROL_FILE).exists()
