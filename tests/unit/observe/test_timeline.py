"""Goodput over a sliding window and learner states over time, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dlc.observe.timeline import SYNCER, Interval, learner_intervals, row_order, window_for, windowed_goodput
from dlc.run import events


def test_a_fault_shows_in_windowed_goodput_where_the_cumulative_figure_hides_it():
    # Four learners, a ledger sample every 5 s: 20 s allocated per 5 s. From 60 s to 70 s one
    # learner is down (15 of 20 s productive), else all 20 s are productive.
    samples, productive, allocated = [], 0.0, 0.0
    for t in range(5, 125, 5):
        allocated += 20.0
        productive += 15.0 if 60 < t <= 70 else 20.0
        samples.append((float(t), productive, allocated))
    times, goodput = windowed_goodput(samples, window_s=10.0)
    by_t = dict(zip(times.tolist(), goodput.tolist(), strict=True))
    # Each point is the 10 s before it: two samples of 20 s allocated.
    assert by_t[50.0] == 1.0
    assert by_t[65.0] == pytest.approx((20 + 15) / 40)  # 55-60 full, 60-65 down
    assert by_t[70.0] == pytest.approx(30 / 40)  # both halves down
    assert by_t[80.0] == 1.0  # healed
    cumulative_at_70 = samples[13][1] / samples[13][2]  # t = 70: 270 of 280 s
    assert cumulative_at_70 == pytest.approx(270 / 280) and cumulative_at_70 > 0.96  # the fault barely moves it
    assert windowed_goodput(samples[:1], 10.0)[0].size == 0


def test_a_resumed_run_starts_a_segment_of_its_own():
    # The resumed run's driver counts from zero again: no window spans the two runs, and a NaN
    # between them leaves the gap blank.
    first = [(0.0, 0.0, 0.0), (10.0, 40.0, 40.0), (20.0, 80.0, 80.0)]
    second = [(100.0, 0.0, 40.0), (110.0, 20.0, 80.0)]
    times, goodput = windowed_goodput(first + second, window_s=10.0)
    assert times.tolist() == [10.0, 20.0, 100.0, 110.0]
    assert goodput[:2].tolist() == [1.0, 1.0] and np.isnan(goodput[2]) and goodput[3] == 0.5


def test_window_grows_with_the_run():
    assert window_for(120.0) == 10.0 and window_for(3000.0) == 100.0


# The records of the event log the states come from, as the engine writes them (the fields the states
# do not depend on are plausible values).


def started(t: float, learner: int) -> events.LearnerStarted:
    return events.LearnerStarted(
        t=t,
        learner=learner,
        pid=1000 + learner,
        platform="cpu",
        device_kind="cpu",
        device="cpu",
        node="127.0.0.1",
        node_id="n1",
        allocator="kept",
    )


def training(t: float, learner: int, incarnation: int = 0, spare: bool = False) -> events.LearnerTraining:
    return events.LearnerTraining(t=t, learner=learner, device="cpu", incarnation=incarnation, spare=spare)


def died(t: float, learner: int) -> events.LearnerDied:
    return events.LearnerDied(t=t, learner=learner, step=int(t), data_position=int(t), pid=1000 + learner)


def restarted(t: float, learner: int, after_s: float) -> events.LearnerRestarted:
    return events.LearnerRestarted(t=t, learner=learner, after_s=after_s, pid=2000 + learner)


def injected(t: float, fault: str, learner: int, phase: str = "injected", **more: object) -> events.Chaos:
    """A chaos.jsonl line's copy; `more`: the line's fields the record does not name."""
    line = {"t": t, "fault": fault, "phase": phase, "target": f"learner {learner}", "learner": learner, **more}
    return events.Chaos.from_record(line)


def test_learner_states_from_the_event_log():
    logged = [
        started(0.0, 0),
        started(0.0, 1),
        training(5.0, 0),
        training(6.0, 1),
        died(20.0, 1),
        restarted(24.0, 1, after_s=4.0),
        # still rejoining: its first step is next
        events.LearnerRejoined(t=25.0, learner=1, peer=0, step=19, data_position=19, copy_s=0.8),
        training(27.0, 1, incarnation=1),
        events.LearnerStalled(t=30.0, learner=0, silent_s=5.0),
        events.LearnerThawed(t=38.0, learner=0, silent_s=13.0),
        events.SyncerDied(t=33.0),
        events.SyncerRestarted(t=36.0, after_s=3.0, resent_pushes=2),
        events.LearnerSlowed(t=40.0, learner=0, factor=3.0, duration_s=10.0),
        events.RoundClosed(  # not a learner's
            t=45.0, fragment=0, version=9, contributors=[0, 1], weights=[0.5, 0.5], tokens=[64, 64], seqs=[8, 6]
        ),
        events.LearnerFinished(t=60.0, learner=1, step=100),
    ]
    assert learner_intervals(logged, end=70.0) == [
        Interval(SYNCER, 33.0, 36.0, "restarting"),
        Interval(0, 0.0, 5.0, "starting"),
        Interval(0, 5.0, 30.0, "training"),
        Interval(0, 30.0, 38.0, "stalled"),
        Interval(0, 38.0, 40.0, "training"),
        Interval(0, 40.0, 50.0, "slow"),
        Interval(0, 50.0, 70.0, "training"),
        Interval(1, 0.0, 6.0, "starting"),
        Interval(1, 6.0, 20.0, "training"),
        Interval(1, 20.0, 24.0, "restarting"),
        Interval(1, 24.0, 27.0, "rejoining"),
        Interval(1, 27.0, 60.0, "training"),
    ]


def test_a_learner_is_dead_from_the_kill_until_the_engine_sees_it_and_stays_dead_if_lost():
    logged = [
        *(started(0.0, i) for i in range(4)),
        *(training(5.0, i) for i in range(4)),
        injected(10.0, "kill", 0),
        died(10.3, 0),
        restarted(14.0, 0, after_s=3.7),
        training(15.0, 0, incarnation=1),
        injected(20.0, "stall", 1, duration_s=10),
        events.LearnerStalled(t=23.0, learner=1, silent_s=3.0),  # the heartbeat timeout: still one interval
        events.LearnerThawed(t=30.0, learner=1, silent_s=10.0),
        injected(25.0, "kill", 3, phase="refused"),  # not carried out
        events.NodeKilled(t=40.0, node="n2", node_id="n2", learners=[2, 3], pids=[1002, 1003]),
        died(40.2, 2),
        events.LearnerLost(t=40.2, learner=2, reason="pinned to n2"),
        died(40.2, 3),
        restarted(45.0, 3, after_s=4.8),
        training(46.0, 3, incarnation=1),
    ]
    intervals = learner_intervals(logged, end=50.0)
    states = {i: [(iv.start, iv.end, iv.state) for iv in intervals if iv.learner == i] for i in range(4)}
    start = [(0.0, 5.0, "starting")]
    assert states[0] == [
        *start,
        (5.0, 10.0, "training"),
        (10.0, 10.3, "dead"),  # killed, not yet seen
        (10.3, 14.0, "restarting"),
        (14.0, 15.0, "rejoining"),
        (15.0, 50.0, "training"),
    ]
    assert states[1] == [*start, (5.0, 20.0, "training"), (20.0, 30.0, "stalled"), (30.0, 50.0, "training")]
    assert states[2] == [*start, (5.0, 40.0, "training"), (40.0, 50.0, "dead")]  # lost with its node
    assert states[3] == [
        *start,
        (5.0, 40.0, "training"),
        (40.0, 40.2, "dead"),
        (40.2, 45.0, "restarting"),
        (45.0, 46.0, "rejoining"),
        (46.0, 50.0, "training"),
    ]


def test_a_stall_too_short_for_the_engine_to_see_ends_when_its_learner_is_resumed():
    """A 4 s stall under the heartbeat timeout leaves no learner_stalled or learner_thawed."""

    def accepted(t: float, learner: int, seq: int) -> events.PushAccepted:
        return events.PushAccepted(
            t=t, learner=learner, fragment=0, seq=seq, base_version=1, version=2, bytes=512, steps=4
        )

    logged = [
        *(started(0.0, i) for i in range(2)),
        *(training(5.0, i) for i in range(2)),
        injected(10.0, "stall", 0, duration_s=4),
        accepted(12.0, 1, seq=3),
        accepted(16.0, 0, seq=3),
        injected(20.0, "stall", 1, duration_s=4),
    ]
    intervals = learner_intervals(logged, end=30.0)
    states = {i: [(iv.start, iv.end, iv.state) for iv in intervals if iv.learner == i] for i in range(2)}
    start = [(0.0, 5.0, "starting"), (5.0, 10.0, "training")]
    assert states[0] == [*start, (10.0, 14.0, "stalled"), (14.0, 30.0, "training")]
    assert states[1] == [
        (0.0, 5.0, "starting"),
        (5.0, 20.0, "training"),
        (20.0, 24.0, "stalled"),
        (24.0, 30.0, "training"),
    ]


def test_a_hot_spare_has_a_row_until_it_takes_a_slot_and_its_replacement_one_after():
    logged = [
        started(0.0, 0),
        events.SpareStarted(t=0.0, spare="s0"),
        training(5.0, 0),
        events.SpareReady(t=8.0, spare="s0", after_s=8.0, device="cpu"),
        died(20.0, 0),
        events.SpareTaken(t=20.5, spare="s0", learner=0, ready=True),
        events.SpareStarted(t=20.5, spare="s1"),
        training(21.0, 0, incarnation=1, spare=True),
        events.SyncerDied(t=25.0),
        events.SyncerRestarted(t=27.0, after_s=2.0, resent_pushes=0),
    ]
    assert learner_intervals(logged, end=30.0) == [
        Interval(SYNCER, 25.0, 27.0, "restarting"),
        Interval(0, 0.0, 5.0, "starting"),
        Interval(0, 5.0, 20.0, "training"),
        Interval(0, 20.0, 21.0, "restarting"),
        Interval(0, 21.0, 30.0, "training"),
        Interval("s0", 0.0, 8.0, "starting"),
        Interval("s0", 8.0, 20.5, "spare"),
        Interval("s1", 20.5, 30.0, "starting"),
    ]
    rows = sorted({i.learner for i in learner_intervals(logged, end=30.0)}, key=row_order)
    assert rows == [0, "s0", "s1", SYNCER]  # the report's rows, top to bottom
    # Spares in the order they started, also past ten of them.
    assert sorted([SYNCER, "s10", 3, "s2", 0, "s1"], key=row_order) == [0, 3, "s1", "s2", "s10", SYNCER]


def test_a_preempted_learner_is_leaving_from_its_notice_then_preempted_until_its_replacement_is_up():
    preempted = events.LearnerPreempted(
        t=12.0,
        learner=1,
        reason="SIGTERM",
        fragments=4,
        leave_s=2.0,
        unpushed_steps=0.0,
        step=10,
        data_position=10,
        pid=1001,
    )
    logged = [
        started(0.0, 0),
        started(0.0, 1),
        training(2.0, 0),
        training(2.0, 1),
        injected(10.0, "preempt", 1, notice_s=30),
        preempted,
        restarted(20.0, 1, after_s=8.0),
        training(22.0, 1, incarnation=1),
        events.NodeDraining(t=30.0, node="127.0.0.1", node_id="n1", learners=[0], deadline_in_s=30.0),
    ]
    assert [i for i in learner_intervals(logged, end=40.0) if i.learner == 1] == [
        Interval(1, 0.0, 2.0, "starting"),
        Interval(1, 2.0, 10.0, "training"),
        Interval(1, 10.0, 12.0, "leaving"),
        Interval(1, 12.0, 20.0, "preempted"),
        Interval(1, 20.0, 22.0, "rejoining"),
        Interval(1, 22.0, 40.0, "training"),
    ]
    assert [i for i in learner_intervals(logged, end=40.0) if i.learner == 0][-1] == Interval(0, 30.0, 40.0, "leaving")
