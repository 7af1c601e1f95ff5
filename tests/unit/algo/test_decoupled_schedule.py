"""Who makes a round when learners drift apart: the in-process twin on a fake clock, each learner
at its own pace from its own start time (no Ray, deterministic).

The syncer owns the schedule: it asks every healthy learner for fragment p when p's round comes
up, and each answers at its next step boundary. So learners that start apart or step at different
speeds still share rounds. (Before the schedule moved to the syncer, each learner pushed p on its
own step counter, and learners 7, 14 and 22 steps apart made rounds of 1.38 learners at K = 1.)
"""

from __future__ import annotations

import pytest

from dlc.algo.decoupled.schedule import Schedule
from dlc.algo.local import InProcessRun
from dlc.data.corpus import load_corpus, split_corpus
from dlc.data.plan import DataPlan
from dlc.run import events
from tests.helpers import twin_recipe

LEARNERS = 4
APART = [0.0, 0.73, 1.41, 2.19]  # 7, 14 and 22 steps of 0.1 s behind the first


def make(starts_s=None, paces_s=None, **syncer) -> InProcessRun:
    recipe = twin_recipe(learners=LEARNERS, **syncer)
    split = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, LEARNERS, 0, 2048))
    return InProcessRun(recipe, split, paces_s=paces_s, starts_s=starts_s)


def rounds_between(run: InProcessRun, from_s: float, until_s: float) -> list[set[int]]:
    """Contributors of each round closed between `from_s` and `until_s`, in order."""
    run.run_until(from_s)
    run.syncer.drain_events()
    run.run_until(until_s)
    return [set(e.contributors) for e in run.syncer.drain_events() if isinstance(e, events.RoundClosed)]


def mean(xs) -> float:
    return sum(xs) / len(xs)


def test_learners_out_of_phase_share_rounds_as_learners_in_phase_do():
    # 0.1 s steps; H = P = 4: one round every global step. Counted once every learner trains.
    in_phase = rounds_between(make(), 3.0, 8.0)
    apart = rounds_between(make(starts_s=APART), 3.0, 8.0)
    assert mean([len(c) for c in in_phase]) >= 0.9 * LEARNERS
    assert mean([len(c) for c in apart]) >= 0.9 * LEARNERS
    # One round per global step, as many apart as in phase: nobody's counter multiplies them.
    assert abs(len(apart) - len(in_phase)) <= 2 and 45 <= len(in_phase) <= 52


def test_a_learner_20_percent_slower_lands_in_nearly_every_round_with_a_fair_weight():
    run = make(starts_s=APART, paces_s=[0.1, 0.1, 0.1, 0.12])
    run.run_until(3.0)
    run.syncer.drain_events()
    run.run_until(10.0)
    closed = [e for e in run.syncer.drain_events() if isinstance(e, events.RoundClosed)]
    with_slow = [e for e in closed if 3 in e.contributors]
    assert len(with_slow) >= 0.9 * len(closed)
    # Same batch size for all: tokens^2/steps weighs each by the tokens it brings (fewer steps a
    # round for the slow one, more when a late push rides along), never one vote per learner.
    for e in with_slow:
        per_token = [w / t for w, t in zip(e.weights, e.tokens, strict=True)]
        assert max(per_token) == pytest.approx(min(per_token), rel=0.02)
    assert len({tuple(e.tokens) for e in with_slow}) > 1  # and the slow one's tokens differ


def test_a_frozen_learner_is_skipped_and_rounds_go_on_without_it():
    # K = 4: rounds wait for every active learner; learner 3, frozen from 2 s to 10 s, stops being
    # healthy after heartbeat_timeout_s (5 s) of silence, and rounds close without it.
    run = make(quorum=LEARNERS)
    run.freeze(3, 2.0, 10.0)
    run.run_until(14.0)
    contributors = [set(e.contributors) for e in run.syncer.drain_events() if isinstance(e, events.RoundClosed)]
    without = [c for c in contributors if 3 not in c]
    assert without and all(c == {0, 1, 2} for c in without)
    assert len(without) >= 20  # the frozen learner never held the others up for long
    assert all(c == {0, 1, 2, 3} for c in contributors[-10:])  # back in every round after the thaw


def test_a_frozen_learner_does_not_slow_the_global_step():
    frozen = make()
    frozen.freeze(3, 1.0, 6.0)
    frozen.run_until(6.0)
    calm = make()
    calm.run_until(6.0)
    assert frozen.syncer.schedule.global_step >= 0.95 * calm.syncer.schedule.global_step


def rounds_by_global_step(fragments: int, interval: int, steps: int) -> dict[int, list[int]]:
    """The fragments whose rounds open at each global step, one learner at one step a second."""
    schedule = Schedule(fragments, interval)
    schedule.report(0, 0, -1.0)
    schedule.report(0, 1, 0.0)
    schedule.advance(0.0, {0})
    opened = {}
    for t in range(1, steps + 1):
        schedule.report(0, t + 1, float(t))
        opened[t] = schedule.advance(float(t), {0})
    return opened


def test_the_clock_staggers_fragments_one_every_h_over_p_steps():
    # P = H = 4: one fragment every global step.
    assert list(rounds_by_global_step(4, 4, 9).values()) == [[0], [1], [2], [3], [0], [1], [2], [3], [0]]
    # P = 2, H = 8: one fragment every 4 steps.
    assert {t: f for t, f in rounds_by_global_step(2, 8, 16).items() if f} == {4: [0], 8: [1], 12: [0], 16: [1]}
    # P = 8, H = 4: two fragments a step.
    assert list(rounds_by_global_step(8, 4, 5).values()) == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1]]


@pytest.mark.parametrize(("fragments", "interval"), [(3, 8), (5, 5), (7, 3)])
def test_every_fragment_comes_up_once_per_h_global_steps(fragments: int, interval: int) -> None:
    opened = rounds_by_global_step(fragments, interval, 3 * interval)
    for start in range(1, 2 * interval):
        window = [p for t in range(start, start + interval) for p in opened[t]]
        assert sorted(window) == list(range(fragments))


def test_a_report_overtaken_by_a_newer_one_is_ignored_and_a_new_process_starts_from_forget():
    schedule = Schedule(4, 4)
    for t, step in [(0.0, 10), (0.1, 11), (0.2, 12)]:
        schedule.report(0, step, t)
    schedule.report(0, 11, 0.25)  # a heartbeat that a push reporting step 12 overtook
    assert schedule.rate([0]) == pytest.approx(10.0) and schedule.stepping([0], 0.3) == {0}
    schedule.forget(0)  # a restarted learner, at the step of the peer it copied
    schedule.report(0, 3, 1.0)
    schedule.report(0, 4, 1.1)
    assert schedule.rate([0]) == pytest.approx(10.0)
