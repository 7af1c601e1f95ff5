"""Goodput over a sliding window and learner states over time, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dlc.observe.timeline import SYNCER, Interval, learner_intervals, row_order, window_for, windowed_goodput


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


def test_learner_states_from_the_event_log():
    events = [
        {"t": 0.0, "kind": "learner_started", "learner": 0},
        {"t": 0.0, "kind": "learner_started", "learner": 1},
        {"t": 5.0, "kind": "learner_training", "learner": 0},
        {"t": 6.0, "kind": "learner_training", "learner": 1},
        {"t": 20.0, "kind": "learner_died", "learner": 1},
        {"t": 24.0, "kind": "learner_restarted", "learner": 1},
        {"t": 25.0, "kind": "learner_rejoined", "learner": 1},  # still rejoining: its first step is next
        {"t": 27.0, "kind": "learner_training", "learner": 1},
        {"t": 30.0, "kind": "learner_stalled", "learner": 0},
        {"t": 38.0, "kind": "learner_thawed", "learner": 0},
        {"t": 33.0, "kind": "syncer_died"},
        {"t": 36.0, "kind": "syncer_restarted", "after_s": 3.0},
        {"t": 40.0, "kind": "learner_slowed", "learner": 0, "factor": 3, "duration_s": 10},
        {"t": 45.0, "kind": "round_closed", "fragment": 0},  # not a learner's
        {"t": 60.0, "kind": "learner_finished", "learner": 1},
    ]
    assert learner_intervals(events, end=70.0) == [
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
    events = [
        *({"t": 0.0, "kind": "learner_started", "learner": i} for i in range(4)),
        *({"t": 5.0, "kind": "learner_training", "learner": i} for i in range(4)),
        {"t": 10.0, "kind": "chaos", "phase": "injected", "fault": "kill", "learner": 0},
        {"t": 10.3, "kind": "learner_died", "learner": 0},
        {"t": 14.0, "kind": "learner_restarted", "learner": 0},
        {"t": 15.0, "kind": "learner_training", "learner": 0},
        {"t": 20.0, "kind": "chaos", "phase": "injected", "fault": "stall", "learner": 1},
        {"t": 23.0, "kind": "learner_stalled", "learner": 1},  # the heartbeat timeout: still one interval
        {"t": 30.0, "kind": "learner_thawed", "learner": 1},
        {"t": 25.0, "kind": "chaos", "phase": "refused", "fault": "kill", "learner": 3},  # not carried out
        {"t": 40.0, "kind": "node_killed", "node": "n2", "learners": [2, 3]},
        {"t": 40.2, "kind": "learner_died", "learner": 2},
        {"t": 40.2, "kind": "learner_lost", "learner": 2, "reason": "pinned to n2"},
        {"t": 40.2, "kind": "learner_died", "learner": 3},
        {"t": 45.0, "kind": "learner_restarted", "learner": 3},
        {"t": 46.0, "kind": "learner_training", "learner": 3},
    ]
    intervals = learner_intervals(events, end=50.0)
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
    events = [
        *({"t": 0.0, "kind": "learner_started", "learner": i} for i in range(2)),
        *({"t": 5.0, "kind": "learner_training", "learner": i} for i in range(2)),
        {"t": 10.0, "kind": "chaos", "phase": "injected", "fault": "stall", "learner": 0, "duration_s": 4},
        {"t": 12.0, "kind": "push_accepted", "learner": 1},
        {"t": 16.0, "kind": "push_accepted", "learner": 0},
        {"t": 20.0, "kind": "chaos", "phase": "injected", "fault": "stall", "learner": 1, "duration_s": 4},
    ]
    intervals = learner_intervals(events, end=30.0)
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
    events = [
        {"t": 0.0, "kind": "learner_started", "learner": 0},
        {"t": 0.0, "kind": "spare_started", "spare": "s0"},
        {"t": 5.0, "kind": "learner_training", "learner": 0},
        {"t": 8.0, "kind": "spare_ready", "spare": "s0", "after_s": 8.0},
        {"t": 20.0, "kind": "learner_died", "learner": 0},
        {"t": 20.5, "kind": "spare_taken", "spare": "s0", "learner": 0, "ready": True},
        {"t": 20.5, "kind": "spare_started", "spare": "s1"},
        {"t": 21.0, "kind": "learner_training", "learner": 0},
        {"t": 25.0, "kind": "syncer_died"},
        {"t": 27.0, "kind": "syncer_restarted"},
    ]
    assert learner_intervals(events, end=30.0) == [
        Interval(SYNCER, 25.0, 27.0, "restarting"),
        Interval(0, 0.0, 5.0, "starting"),
        Interval(0, 5.0, 20.0, "training"),
        Interval(0, 20.0, 21.0, "restarting"),
        Interval(0, 21.0, 30.0, "training"),
        Interval("s0", 0.0, 8.0, "starting"),
        Interval("s0", 8.0, 20.5, "spare"),
        Interval("s1", 20.5, 30.0, "starting"),
    ]
    rows = sorted({i.learner for i in learner_intervals(events, end=30.0)}, key=row_order)
    assert rows == [0, "s0", "s1", SYNCER]  # the report's rows, top to bottom
    # Spares in the order they started, also past ten of them.
    assert sorted([SYNCER, "s10", 3, "s2", 0, "s1"], key=row_order) == [0, 3, "s1", "s2", "s10", SYNCER]


def test_a_preempted_learner_is_leaving_from_its_notice_then_preempted_until_its_replacement_is_up():
    events = [
        {"t": 0.0, "kind": "learner_started", "learner": 0},
        {"t": 0.0, "kind": "learner_started", "learner": 1},
        {"t": 2.0, "kind": "learner_training", "learner": 0},
        {"t": 2.0, "kind": "learner_training", "learner": 1},
        {"t": 10.0, "kind": "chaos", "fault": "preempt", "learner": 1, "phase": "injected", "notice_s": 30},
        {"t": 12.0, "kind": "learner_preempted", "learner": 1},
        {"t": 20.0, "kind": "learner_restarted", "learner": 1},
        {"t": 22.0, "kind": "learner_training", "learner": 1},
        {"t": 30.0, "kind": "node_draining", "learners": [0]},
    ]
    assert [i for i in learner_intervals(events, end=40.0) if i.learner == 1] == [
        Interval(1, 0.0, 2.0, "starting"),
        Interval(1, 2.0, 10.0, "training"),
        Interval(1, 10.0, 12.0, "leaving"),
        Interval(1, 12.0, 20.0, "preempted"),
        Interval(1, 20.0, 22.0, "rejoining"),
        Interval(1, 22.0, 40.0, "training"),
    ]
    assert [i for i in learner_intervals(events, end=40.0) if i.learner == 0][-1] == Interval(0, 30.0, 40.0, "leaving")
