"""Chaos schedules: seeded, per-stream Poisson draws at the plan's rates, and the timeline's defaults."""

from __future__ import annotations

import random
from collections import Counter

from chaos.faults import Fault, FaultKind
from chaos.schedule import faults_until, schedule
from tests.helpers import bare_plan


def test_same_seed_same_faults_and_streams_do_not_disturb_each_other():
    plan = bare_plan(kill_per_learner_per_min=1.0, duration_s=600, seed=7)
    first = faults_until(plan, [0, 1, 2, 3], random.Random(7), 600)
    assert first == faults_until(plan, [0, 1, 2, 3], random.Random(7), 600)
    assert first != faults_until(plan, [0, 1, 2, 3], random.Random(8), 600)
    # Adding stalls, or a learner, leaves every existing kill where it was.
    with_stalls = faults_until(bare_plan(kill_per_learner_per_min=1.0, stall_per_learner_per_min=2.0, duration_s=600),
                                   [0, 1, 2, 3], random.Random(7), 600)  # fmt: skip
    assert [f for f in with_stalls if f.kind is FaultKind.KILL] == first
    five = faults_until(plan, [0, 1, 2, 3, 4], random.Random(7), 600)
    assert [f for f in five if f.learner != 4] == first
    assert all(a.at_s <= b.at_s for a, b in zip(first, first[1:], strict=False))


def test_poisson_counts_match_rate_times_duration():
    # 1.5 kills per learner per minute, 4 learners, 600 s after a 60 s warm-up: the count is Poisson
    # with mean 1.5 * 4 * (600 - 60) / 60 = 54 and sd sqrt(54) = 7.3. One seed: within 4 sd, [24, 84].
    plan = bare_plan(kill_per_learner_per_min=1.5, duration_s=600, warmup_s=60)
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
    plan = bare_plan(
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
        Fault(3, FaultKind.SLOW, 2, 9, 2.5),
        Fault(4, FaultKind.SLOW, 3, None, 4.0),  # until the run ends
        Fault(5, FaultKind.STALL, 1, 7, None),
    ]
    # Per run, not per learner: 2/min over 300 s is 10 joins (sd 3.2), 1/min is 5 syncer kills (sd 2.2).
    joins, syncer = (
        [f for f in faults if f.kind is FaultKind.JOIN],
        [f for f in faults if f.kind is FaultKind.KILL_SYNCER],
    )
    assert 0 < len(joins) <= 23 and 0 < len(syncer) <= 14
    assert all(f.learner is None and f.duration_s == 11 for f in joins)


def test_link_faults_are_drawn_at_their_rates_with_the_plans_factor_and_durations():
    # 1 degradation and 0.5 cuts per learner per minute, 4 learners, 540 s after a 60 s warm-up: Poisson
    # counts with means 1 * 4 * 9 = 36 (sd 6) and 0.5 * 4 * 9 = 18 (sd 4.2). One seed: within 4 sd.
    links = {"degrade_link_per_learner_per_min": 1.0, "degrade_link_factor": 8, "degrade_link_for_s": 12,
             "cut_link_per_learner_per_min": 0.5, "cut_link_for_s": 4, "duration_s": 600, "warmup_s": 60}  # fmt: skip
    plan = bare_plan(**links)
    draws = [faults_until(plan, [0, 1, 2, 3], random.Random(seed), 600) for seed in range(40)]
    degrades = [sum(f.kind is FaultKind.DEGRADE_LINK for f in d) for d in draws]
    cuts = [sum(f.kind is FaultKind.CUT_LINK for f in d) for d in draws]
    assert all(12 <= n <= 60 for n in degrades) and all(1 <= n <= 35 for n in cuts)
    # Means of 40 seeds: sd 6 / sqrt(40) = 0.95 and 4.2 / sqrt(40) = 0.67; within 4 sd of 36 and 18.
    assert 32.2 <= sum(degrades) / 40 <= 39.8 and 15.3 <= sum(cuts) / 40 <= 20.7
    faults = draws[0]
    assert {f.learner for f in faults} == {0, 1, 2, 3}
    assert all(60 < f.at_s <= 600 and f.origin == "poisson" for f in faults)
    assert all(
        (f.factor, f.duration_s) == ((8.0, 12.0) if f.kind is FaultKind.DEGRADE_LINK else (None, 4.0)) for f in faults
    )
    # The same seed gives the same faults, and adding link faults leaves every kill where it was.
    assert faults == faults_until(plan, [0, 1, 2, 3], random.Random(0), 600)
    kills = {"kill_per_learner_per_min": 1.0, "duration_s": 600, "warmup_s": 60}
    alone = faults_until(bare_plan(**kills), [0, 1, 2, 3], random.Random(0), 600)
    mixed = faults_until(bare_plan(**links, **{"kill_per_learner_per_min": 1.0}), [0, 1, 2, 3], random.Random(0), 600)
    assert alone and [f for f in mixed if f.kind is FaultKind.KILL] == alone
