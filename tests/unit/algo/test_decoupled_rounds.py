"""Round bookkeeping under a fake clock: quorum, grace, rejections, repeated pushes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dlc.algo.decoupled.guards import GraceWindow, NormOutlier, quorum_needed
from dlc.algo.decoupled.messages import Push
from dlc.algo.decoupled.rounds import RoundBook
from dlc.algo.protocol import Reject
from dlc.core.codec import Encoded, get_codec

SIZE = 4


class ClockAt:
    """A fake clock that starts at `now` (10 s unless told), not at 0: seconds move only when a test says so."""

    def __init__(self, now: float = 10.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def push(
    learner: int,
    seq: int,
    value: float | list[float] = 1.0,
    fragment: int = 0,
    base: int = 0,
    steps: int = 4,
    tokens: int = 400,
    sent_at: float = 0.0,
    codec: str = "none",
    incarnation: int = 0,
) -> Push:
    delta = np.broadcast_to(np.asarray(value, dtype=np.float32), (SIZE,))
    payload = get_codec(codec).encode(delta)
    return Push(learner, fragment, base, steps, tokens, seq, payload, sent_at, incarnation)


def book(
    clock: ClockAt,
    quorum: int = 1,
    step_time_s: float | None = 1.0,
    max_staleness: int = 4,
    step_time_from_pushes: bool = False,
) -> RoundBook:
    # gamma 0.5, tau 2, step 1 s and nothing else observed: window 0.5 * 2 * 1 = 1 s.
    grace = GraceWindow(gamma=0.5, tau=2, step_time_s=step_time_s)
    return RoundBook(
        [SIZE, SIZE],
        "none",
        quorum,
        max_staleness,
        grace=grace,
        clock=clock,
        step_time_from_pushes=step_time_from_pushes,
    )


def test_quorum_needed() -> None:
    assert quorum_needed(2, {0, 1, 2, 3}) == 2
    assert quorum_needed(3, {0, 1}) == 2  # fewer healthy than K: all of them
    assert quorum_needed(1, set()) == 1  # never an empty round
    assert quorum_needed(2, set()) == 1


def test_grace_window_arithmetic() -> None:
    grace = GraceWindow(gamma=0.5, tau=2, ema=0.5)
    assert grace.window_s() == 0.0  # no step time seen: close at quorum
    grace.observe_step(1.0)  # first sample taken as is
    assert grace.window_s() == pytest.approx(0.5 * 2 * 1.0)  # 1.0
    grace.observe_quorum(0.2)
    grace.observe_sync(0.4)
    assert grace.window_s() == pytest.approx(0.5 * (2 - 0.2 - 0.4))  # 0.7
    grace.observe_step(2.0)  # EMA: 1 + 0.5 * (2 - 1) = 1.5
    assert grace.window_s() == pytest.approx(0.5 * (3 - 0.6))  # 1.2
    grace.observe_step(100.0)  # clipped to 4 * 1.5 = 6: 1.5 + 0.5 * 4.5 = 3.75
    assert grace.step_time_s == pytest.approx(3.75)
    grace.observe_quorum(50.0)  # quorum takes longer than the whole budget
    assert grace.window_s() == 0.0


def test_quorum_then_grace_window() -> None:
    clock = ClockAt(10.0)
    rounds = book(clock, quorum=2)
    healthy = {0, 1, 2}
    rounds.open(0)  # the syncer asked for fragment 0 at 10.0
    assert rounds.submit(push(0, seq=0)).accepted
    assert not rounds.ready_to_close(0, healthy)  # 1 of 2
    assert rounds.deadline(0, healthy) is None
    clock.now = 10.5
    rounds.submit(push(1, seq=0))
    # Quorum at 10.5, window 1 s: may close at 11.5.
    assert rounds.deadline(0, healthy) == 11.5
    clock.now = 11.4
    assert rounds.closable(healthy) == []
    clock.now = 11.5
    assert rounds.closable(healthy) == [0]
    result = rounds.close(0, healthy)
    assert result.learners == (0, 1)
    assert (result.opened_at, result.quorum_at, result.closed_at) == (10.0, 10.5, 11.5)
    assert result.waited_s == pytest.approx(1.0)
    assert result.version == 1 and rounds.versions == (1, 0)
    assert result.staleness == (0, 0)
    # The close observed a quorum time of 10.5 - 10.0 = 0.5 s.
    assert rounds.grace.quorum_time_s == 0.5


def test_early_close_when_every_healthy_learner_pushed() -> None:
    clock = ClockAt(10.0)
    rounds = book(clock, quorum=2)
    healthy = {0, 1, 2}
    rounds.open(0)
    rounds.submit(push(0, seq=0))
    clock.now = 10.5
    rounds.submit(push(1, seq=0))
    clock.now = 10.8  # before the 11.5 deadline
    rounds.submit(push(2, seq=0))
    assert rounds.deadline(0, healthy) == -math.inf
    assert rounds.ready_to_close(0, healthy)
    assert rounds.close(0).learners == (0, 1, 2)


def test_fewer_healthy_than_quorum() -> None:
    clock = ClockAt()
    rounds = book(clock, quorum=3)
    rounds.open(0)
    rounds.submit(push(0, seq=0))
    # Only learner 0 healthy: quorum min(3, 1) = 1, and everyone healthy has pushed.
    assert rounds.ready_to_close(0, {0})
    # Learners 0 and 1 healthy: quorum 2; 1 has not pushed, however long we wait.
    clock.now += 1000
    assert not rounds.ready_to_close(0, {0, 1})
    # A learner that pushed and then died still counts toward the quorum.
    rounds.submit(push(3, seq=0))
    assert rounds.deadline(0, {0, 1}) == clock.now + 1.0


def test_a_round_closes_only_once_opened_and_counts_answers_from_the_opening() -> None:
    clock = ClockAt(10.0)
    rounds = book(clock, quorum=1)
    rounds.submit(push(0, seq=0))  # came too late for the last round of fragment 0
    rounds.submit(push(1, seq=0))
    clock.now = 20.0
    assert rounds.closable({0, 1}) == [] and rounds.deadline(0, {0, 1}) is None  # not asked for yet
    rounds.open(0)
    assert rounds.is_open(0) and not rounds.is_open(1)
    # Pushes from before the opening do not answer it: otherwise every later round of 0 would
    # close at its opening with pushes one round old.
    assert rounds.deadline(0, {0, 1}) is None
    clock.now = 20.4
    rounds.open(0)  # asked again: the first opening stands
    rounds.submit(push(1, seq=1))  # learner 1's answer supersedes its late push
    assert rounds.deadline(0, {0, 1}) == pytest.approx(21.4)  # quorum 1 at 20.4, window 1 s
    clock.now = 20.5
    rounds.submit(push(0, seq=1))
    assert rounds.closable({0, 1}) == [0]  # everyone healthy answered
    result = rounds.close(0, {0, 1})
    assert (result.opened_at, result.quorum_at) == (20.0, 20.4)
    assert result.steps == (8, 8)  # late push and answer, from one anchor: counters add
    assert not rounds.is_open(0)  # the next round of 0 waits for its own opening


def test_late_push_joins_the_next_round() -> None:
    clock = ClockAt()
    rounds = book(clock)
    rounds.submit(push(0, seq=0))
    assert rounds.close(0).learners == (0,)
    # Learner 1 sent from base 0 but arrives after the round closed (v_0 = 1 now).
    verdict = rounds.submit(push(1, seq=0, value=2.0))
    assert verdict.accepted and not verdict.part
    assert rounds.pending(0) == {1}
    result = rounds.close(0)
    assert result.learners == (1,) and result.staleness == (1,)
    np.testing.assert_array_equal(result.deltas[0], [2.0] * SIZE)


def test_rejection_reasons() -> None:
    clock = ClockAt()
    rounds = book(clock, max_staleness=1)
    assert rounds.submit(push(0, seq=0)).accepted
    cases = [
        (push(0, seq=0), Reject.DUPLICATE),
        (push(0, seq=1, fragment=5), Reject.MALFORMED),
        (push(0, seq=2, steps=0), Reject.MALFORMED),
        (push(0, seq=3, base=1), Reject.MALFORMED),  # base from the future
        (push(0, seq=4, codec="int4"), Reject.MALFORMED),
        (push(0, seq=5, value=np.nan), Reject.NONFINITE),
        (push(0, seq=6, value=[1.0, np.inf, 0.0, 0.0]), Reject.NONFINITE),
    ]
    three_values = get_codec("none").encode(np.ones(3))
    cases.append((Push(0, 0, 0, 4, 400, 7, three_values, 0.0), Reject.MALFORMED))
    for bad, reason in cases:
        verdict = rounds.submit(bad)
        assert (verdict.accepted, verdict.reason) == (False, reason), verdict.detail
    # Two closes make v_0 = 2; a push from base 0 is then 2 > 1 versions behind.
    rounds.close(0)
    rounds.submit(push(1, seq=0, base=1))
    rounds.close(0)
    verdict = rounds.submit(push(2, seq=0, base=0))
    assert verdict.reason == Reject.STALE and "2 versions behind" in verdict.detail
    assert rounds.submit(push(2, seq=1, base=1)).accepted  # 1 behind is fine
    assert rounds.rejections == {
        Reject.DUPLICATE: 1,
        Reject.MALFORMED: 5,
        Reject.NONFINITE: 2,
        Reject.STALE: 1,
    }
    assert rounds.rejections_by_learner[(2, Reject.STALE)] == 1


def test_int4_nonfinite_is_caught_after_decoding() -> None:
    rounds = RoundBook([SIZE], "int4", clock=ClockAt())
    good = push(0, seq=0, codec="int4").payload
    truncated = Encoded("int4", SIZE, good.payload[:1], good.scales, good.block_size)
    verdict = rounds.submit(Push(0, 0, 0, 4, 400, 0, truncated, 0.0))
    assert verdict.reason == Reject.MALFORMED and "cannot decode" in verdict.detail
    verdict = rounds.submit(push(0, seq=1, value=[1.0, np.inf, 0, 0], codec="int4"))
    assert verdict.reason == Reject.NONFINITE
    assert rounds.submit(push(0, seq=2, value=[0.7, -0.35, 0, 0], codec="int4")).accepted
    # absmax 0.7 -> step 0.1; -0.35 / 0.1 lands within half a step of -3.5.
    delta = rounds.close(0).deltas[0]
    np.testing.assert_allclose(delta, [0.7, -0.35, 0, 0], atol=0.05 + 1e-6)


def test_a_finite_delta_too_large_to_square_in_float32_is_not_refused_as_nonfinite() -> None:
    rounds = book(ClockAt())
    for learner in range(5):  # the outlier check's warm-up: norm 2e20 over 4 steps, 5e19 per step
        assert rounds.submit(push(learner, seq=0, value=1e20)).accepted  # 1e40 overflows float32
    verdict = rounds.submit(push(5, seq=0, value=1e20 * 50))  # 50x the median per step: its norm was read
    assert verdict.reason == Reject.NORM_OUTLIER, verdict.detail


def test_norm_outlier_after_warmup() -> None:
    detector = NormOutlier(warmup=5, window=20, z_max=6.0, min_ratio=32.0)
    for norm in [1.0, 1000.0]:
        assert detector.check(norm) is None  # never during warm-up
    detector = NormOutlier(warmup=5)
    for norm in [1.0, 1.1, 0.9, 1.0, 1.05]:
        detector.add(norm)
    # log-norms: median 0; |deviations| = [0, .095, .105, 0, .049], MAD = .049.
    # 6 * 1.4826 * .049 = 0.43 < log 32 = 3.47, so the band is 32x above the median.
    assert detector.check(20.0) is None  # log 20 = 3.00 <= 3.47
    assert detector.check(100.0) is not None  # log 100 = 4.61 > 3.47
    # Small norms are harmless (and normal as the learning rate decays): never rejected.
    assert detector.check(0.01) is None and detector.check(0.0) is None


def test_norm_outlier_follows_a_lasting_shift() -> None:
    # Warm-up pushes are tiny; once training is under way every push is 100x larger.
    detector = NormOutlier(warmup=5, window=20)
    for _ in range(5):
        detector.add(0.01)
    verdicts = []
    for _ in range(12):
        verdicts.append(detector.check(1.0) is None)
        detector.add(1.0)
    # The history starts with 5 log-norms of log 0.01 = -4.6. With k large ones added, the
    # median is -4.6 while k <= 4 (1.0 is 100x > 32x: rejected). At k = 5 the ten entries'
    # median averages -4.6 and 0: 10^-1, and 1.0 is 10x < 32x: accepted, and from then on.
    assert verdicts == [False] * 5 + [True] * 7


def test_norm_outlier_rejection_in_the_book() -> None:
    rounds = book(ClockAt())
    # Norm of [v] * 4 is 2v over 4 steps: five pushes of norm 2.0 (0.5 per step) fill the warm-up.
    for learner in range(5):
        assert rounds.submit(push(learner, seq=0, value=1.0)).accepted
    verdict = rounds.submit(push(5, seq=0, value=50.0))  # 25 per step = 50x the median
    assert verdict.reason == Reject.NORM_OUTLIER
    assert rounds.rejections[Reject.NORM_OUTLIER] == 1
    assert rounds.pending(0) == {0, 1, 2, 3, 4}
    # The same norm over 40 steps is only 5x the median per step: accepted.
    assert rounds.submit(push(6, seq=0, value=50.0, steps=40)).accepted


def test_second_push_from_the_same_anchor_supersedes() -> None:
    clock = ClockAt()
    rounds = book(clock, quorum=2)
    rounds.submit(push(0, seq=0, value=1.0))
    # Still base 0: the delta is measured from the same anchor and contains the first.
    verdict = rounds.submit(push(0, seq=1, value=3.0))
    assert verdict.accepted and verdict.superseded
    assert not rounds.ready_to_close(0, {0, 1})  # still one learner of two
    rounds.submit(push(1, seq=0, value=1.0))
    result = rounds.close(0)
    np.testing.assert_array_equal(result.deltas[0], [3.0] * SIZE)
    # Counters are reset on each send, so they add: 4 + 4 steps, 400 + 400 tokens.
    assert (result.steps, result.tokens) == ((8, 4), (800, 400))
    # Both of learner 0's pushes are merged here, the superseded one inside the other.
    assert result.seqs == (1, 0) and result.merged_seqs == ((0, 1), (0,))


def test_the_merge_history_moves_to_another_book() -> None:
    # What a restarted syncer restores: learner 0's merged seq 0 (base 0), so its cumulative seq 1
    # from the same anchor counts only its new part, 3 - 1.
    rounds = book(ClockAt())
    rounds.submit(push(0, seq=0, value=1.0))
    rounds.close(0)
    restored = RoundBook([SIZE, SIZE], "none", clock=ClockAt(), versions=rounds.versions)
    restored.restore_merged_history(rounds.merged_history())
    assert restored.merged_history(0) == rounds.merged_history(0) and restored.merged_history(1) == {}
    restored.submit(push(0, seq=1, value=3.0))
    np.testing.assert_array_equal(restored.close(0).deltas[0], [2.0] * SIZE)


def test_late_push_from_a_merged_anchor_counts_only_the_new_part() -> None:
    rounds = book(ClockAt())
    rounds.submit(push(0, seq=0, value=1.0))
    rounds.close(0)
    # Learner 0 has not adopted v=1 yet: its next delta, still from anchor 0, holds
    # the merged [1] * 4 plus [2] * 4 of new progress.
    rounds.submit(push(0, seq=2, value=3.0))
    result = rounds.close(0)
    np.testing.assert_array_equal(result.deltas[0], [2.0] * SIZE)
    assert result.staleness == (1,)
    # seq 1 arrives out of order, still from anchor 0: seq 2 already contained it.
    verdict = rounds.submit(push(0, seq=1, value=2.0))
    assert verdict.reason == Reject.DUPLICATE and "older" in verdict.detail


def test_pushes_from_two_anchors_are_merged_together_as_parts() -> None:
    clock = ClockAt(10.0)
    rounds = book(clock, quorum=2)
    rounds.submit(push(1, seq=0))
    rounds.close(0)  # v_0 = 1
    rounds.submit(push(0, seq=0, value=1.0, base=0, steps=3, tokens=300))  # late, from anchor 0
    rounds.open(0)
    verdict = rounds.submit(push(0, seq=1, value=5.0, base=1, steps=4, tokens=400))  # adopted v=1 since
    assert verdict.accepted and verdict.part
    rounds.submit(push(1, seq=1, base=1))
    assert rounds.closable({0, 1}) == [0]  # both answered
    result = rounds.close(0, {0, 1})
    # Independent progress from two starting points: the deltas and the counters add up.
    assert result.learners == (0, 1) and result.seqs == (1, 1)
    np.testing.assert_array_equal(result.deltas[0], [6.0] * SIZE)
    assert (result.steps[0], result.tokens[0], result.staleness[0]) == (7, 700, 1)
    assert rounds.pending(0) == frozenset()  # nothing left behind for the next round


def test_timings_observed_from_pushes_and_sends() -> None:
    clock = ClockAt(10.0)
    rounds = book(clock, step_time_s=None, step_time_from_pushes=True)
    assert rounds.grace.window_s() == 0.0
    rounds.submit(push(0, seq=0, sent_at=100.0))
    rounds.close(0)
    # Same learner and fragment 4 s later over 4 steps: 1 s a step.
    rounds.submit(push(0, seq=1, base=1, steps=4, sent_at=104.0))
    assert rounds.grace.step_time_s == 1.0
    clock.now = 20.0
    rounds.close(0)
    clock.now = 20.3
    rounds.mark_sent(0)  # close -> sent took 0.3 s
    assert rounds.grace.sync_time_s == pytest.approx(0.3)
    # 0.5 * (2 * 1.0 - 0 - 0.3) = 0.85
    assert rounds.grace.window_s() == pytest.approx(0.85)


def test_forget_learner_starts_a_new_incarnation() -> None:
    rounds = book(ClockAt())
    rounds.submit(push(0, seq=5, value=1.0))
    assert rounds.last_seq(0) == 5
    assert rounds.submit(push(0, seq=5, fragment=1)).reason == Reject.DUPLICATE
    # Learner 0 restarts from a peer's state: seqs start again and its deltas, though
    # from the same base version, do not contain its old push (its pushes say it is a new process).
    rounds.forget_learner(0)
    assert rounds.last_seq(0) is None
    verdict = rounds.submit(push(0, seq=0, value=3.0, incarnation=1))
    assert verdict.accepted and verdict.part and not verdict.superseded
    # The new push counts in full, beside the old one: nothing netted against it.
    np.testing.assert_array_equal(rounds.close(0).deltas[0], [4.0] * SIZE)


def test_close_needs_a_push_and_versions_restore() -> None:
    rounds = RoundBook([SIZE, SIZE], "none", clock=ClockAt(), versions=[7, 3])
    assert rounds.versions == (7, 3)
    with pytest.raises(ValueError, match="no pushes"):
        rounds.close(1)
    assert rounds.submit(push(0, seq=0, base=7)).accepted
    assert rounds.close(0).version == 8
