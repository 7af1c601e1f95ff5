"""Who makes a round when learners drift apart: the in-process twin on a fake clock, each learner
at its own pace from its own start time (no Ray, deterministic).

Today each learner pushes fragment p on its own step counter, so learners that start a few steps
apart push p at different times and the grace window (about tau step times) cannot gather them:
at K = 1 rounds hold one learner each. These tests pin that behaviour down as the baseline the
syncer-driven schedule (issue 12) must beat; when it lands, the out-of-phase case must reach
>= 0.9 M contributors per round and this file's assertions on it flip.
"""

from __future__ import annotations

from dlc.core.data import load_corpus, split_corpus
from dlc.engine.local import InProcessRun
from tests.helpers import twin_recipe

LEARNERS = 4


def play(until_s: float, starts_s=None, paces_s=None, frozen=None, **syncer) -> InProcessRun:
    recipe = twin_recipe(learners=LEARNERS, **syncer)
    split = split_corpus(load_corpus(recipe.data), recipe.data, LEARNERS, 0, 2048)
    run = InProcessRun(recipe, split, paces_s=paces_s, starts_s=starts_s)
    for learner, (from_s, until) in (frozen or {}).items():
        run.freeze(learner, from_s, until)
    run.run_until(until_s)
    return run


def test_learners_in_phase_share_rounds_and_out_of_phase_ones_do_not():
    # 0.1 s steps; H = P = 4: fragment p is due every 4 steps of each learner's own counter.
    in_phase = play(8.0).syncer.status()
    apart = play(8.0, starts_s=[0.0, 0.73, 1.41, 2.19]).syncer.status()  # 7, 14 and 22 steps behind
    assert in_phase["mean_contributors"] == LEARNERS  # every round merges everyone
    assert apart["mean_contributors"] < 1.5  # today: single-learner rounds (issue 12)
    # Everyone still contributes, one at a time: the rounds are what multiplies.
    assert all(apart["contributed"][str(i)] > 0 for i in range(LEARNERS))
    assert apart["rounds_closed"] > 2.5 * in_phase["rounds_closed"]


def test_a_frozen_learner_is_skipped_and_rounds_go_on_without_it():
    # K = 4: rounds wait for every healthy learner; learner 3, frozen from 2 s to 10 s, stops
    # being healthy after heartbeat_timeout_s (5 s) of silence, and rounds close without it.
    run = play(14.0, frozen={3: (2.0, 10.0)}, quorum=LEARNERS)
    closed = [e for e in run.syncer.drain_events() if e["kind"] == "round_closed"]
    contributors = [set(e["contributors"]) for e in closed]  # in the order the rounds closed
    without = [c for c in contributors if 3 not in c]
    assert without and all(c == {0, 1, 2} for c in without)
    assert {0, 1, 2, 3} in contributors[-5:]  # back in the rounds after the thaw
