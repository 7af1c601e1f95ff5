import pytest

from dlc.observe.goodput import BUCKETS, Ledger


def test_buckets_add_up_and_goodput_by_hand():
    ledger = Ledger()
    # Learner 0: 2 s compiling, 10 s training, 3 s dead, 1 s rejoining, 4 s training = 20 s.
    for state, seconds in [("starting", 2), ("training", 10), ("dead", 3), ("rejoining", 1), ("training", 4)]:
        ledger.tick(0, state, seconds)
    # Its kill lost 1.5 s of steps that were never pushed.
    ledger.waste(0, 1.5)
    # Learner 1: 2 s compiling, 16 s training, 2 s preempted (leaving, its replacement starting), 0 wasted.
    ledger.tick(1, "starting", 2)
    ledger.tick(1, "training", 16)
    ledger.tick(1, "leaving", 0.5)
    ledger.tick(1, "preempted", 1.5)
    summary = ledger.summary()
    row0 = summary["learners"]["0"]
    assert sum(row0[b] for b in BUCKETS) == pytest.approx(20.0)
    # Learner 0 productive: 10 + 4 - 1.5 = 12.5 of 20 -> 0.625; learner 1: 16 / 20 = 0.8.
    assert row0["goodput"] == 0.625 and summary["learners"]["1"]["goodput"] == 0.8
    # Overall: (12.5 + 16) / 40 = 0.7125.
    assert summary["goodput"] == 0.7125
    assert summary["allocated_s"] == 40.0
    assert summary["badput_s"] == {
        "startup": 4.0,
        "dead": 3.0,
        "preempted": 2.0,
        "stalled": 0.0,
        "rejoining": 1.0,
        "waiting": 0.0,
        "checkpoint": 0.0,
        "wasted": 1.5,
    }


def test_states_outside_the_allocation_are_not_counted_and_waste_is_capped():
    ledger = Ledger()
    ledger.tick(2, "left", 100.0)
    ledger.tick(2, "finished", 100.0)
    assert ledger.goodput(2) is None
    ledger.tick(2, "training", 1.0)
    ledger.waste(2, 5.0)  # cannot waste more than was productive
    assert ledger.summary()["learners"]["2"]["wasted"] == 1.0 and ledger.goodput(2) == 0.0
