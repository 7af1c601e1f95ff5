"""The syncer under a fake clock: rounds, merge, outer step, delivery, counters, checkpoints."""

import pickle

import numpy as np
import pytest

from dlc.algo import get_algorithm
from dlc.algo.counters import SyncCounters
from dlc.algo.decoupled.messages import MergedFragment, Push
from dlc.algo.decoupled.syncer import IDLE_TICK_S, DecoupledSyncer
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.core.fragments import FragmentPlan
from dlc.run import events
from tests.fakes import FakeClock

SHAPES = {"a": (4, 2), "b": (8,)}  # 16 values; P=2 puts a (8 values) and b (8 values) apart


def make(quorum=1, learners=2, **syncer):
    recipe = Recipe.model_validate(
        {
            "learners": {"count": learners},
            "syncer": {
                "fragments": 2,
                "sync_interval_steps": 4,
                "overlap_steps": 1,
                "quorum": quorum,
                "codec": "none",
                "outer": {"kind": "nesterov", "lr": 1.0, "momentum": 0.0},
                **syncer,
            },
        }
    )
    plan = FragmentPlan.build(SHAPES, 2)
    initial = {"a": np.zeros((4, 2), np.float32), "b": np.zeros(8, np.float32)}
    delivered = []  # merged fragments only
    clock = FakeClock()

    def deliver(m, msg):
        if isinstance(msg, MergedFragment):
            delivered.append((m, msg))
            return msg.payload.nbytes
        return 0

    syncer_ = DecoupledSyncer(recipe, plan, initial, deliver, clock)
    for m in range(learners):
        syncer_.join(m)
    return syncer_, plan, delivered, clock


def push(learner, fragment, delta, seq, steps=4, tokens=400, base=0):
    payload = get_codec("none").encode(np.asarray(delta, np.float32))
    return Push(learner, fragment, base, steps, tokens, seq, payload, sent_at=0.0)


def test_quorum_of_two_waits_then_merges_weighted_mean_and_delivers_to_all():
    syncer, plan, delivered, clock = make(quorum=2, learners=3)
    size = plan.size(0)
    syncer.open_round(0)  # the rounds' schedule is tested in test_decoupled_schedule.py
    syncer.push(push(0, 0, np.ones(size), seq=0, tokens=400, steps=4))
    assert syncer.tick() == 0  # 1 of K=2
    syncer.push(push(1, 0, 3 * np.ones(size), seq=0, tokens=800, steps=4))
    clock.now += 10.0  # past any grace window
    assert syncer.tick() == 1
    # tokens weights: 400 and 800 tokens -> 1/3 and 2/3
    # merged delta = 1/3 * 1 + 2/3 * 3 = 7/3; outer SGD lr 1, no momentum: theta = 0 - 7/3
    np.testing.assert_allclose(syncer.theta[0], -7 / 3, rtol=1e-6)
    assert [m for m, _ in delivered] == [0, 1, 2]  # every member, contributor or not
    assert all(msg.version == 1 and msg.fragment == 0 for _, msg in delivered)
    # Down in bf16 (the default), once per round to each member: 2 bytes a value. Up: fp32 here.
    assert syncer.counters.bytes_down == 3 * size * 2 and syncer.counters.bytes_up == 2 * size * 4
    assert syncer.counters.contributed == {0: 1, 1: 1}
    closed = [e for e in syncer.drain_events() if isinstance(e, events.RoundClosed)]
    assert closed[0].contributors == [0, 1] and closed[0].weights == [0.3333, 0.6667]


def test_round_closes_early_when_every_healthy_learner_pushed():
    syncer, plan, _, clock = make(quorum=1, learners=2, grace_gamma=1.0)
    syncer.book.grace.observe_step(100.0)  # a long grace window: gamma * tau * 100 s
    syncer.open_round(1)
    syncer.push(push(0, 1, np.ones(plan.size(1)), seq=0))
    assert syncer.tick() == 0  # quorum met, waiting inside the grace window for learner 1
    syncer.push(push(1, 1, np.ones(plan.size(1)), seq=0))
    assert syncer.tick() == 1  # all healthy pushed: no need to wait out the window


def test_silent_learner_is_not_waited_for():
    syncer, plan, _, clock = make(quorum=2, learners=2, heartbeat_timeout_s=5.0)
    syncer.open_round(0)
    syncer.push(push(0, 0, np.ones(plan.size(0)), seq=0))
    clock.now += 6.0
    syncer.heartbeat(0)  # learner 1 has been silent for 6 s > 5 s: unhealthy
    assert syncer.healthy() == {0}
    assert syncer.tick() == 1  # quorum falls to the one healthy learner


def test_the_syncers_own_stall_is_no_learners_silence():
    syncer, _, _, clock = make(learners=2, heartbeat_timeout_s=5.0)
    syncer.heartbeat(0), syncer.heartbeat(1)
    clock.now += 4.0
    syncer.heartbeat(0)
    clock.now += 6.0  # the syncer ran none of this time: both learners' heartbeats waited unread
    syncer.excuse(6.0)
    assert syncer.healthy() == {0, 1}  # heard 4 + 6 and 6 s ago, less the 6 s excused
    clock.now += 4.5  # learner 1's excused silence runs out first (it was heard 4 s earlier)
    assert syncer.healthy() == {0}


def test_rejections_are_counted_and_never_merged():
    syncer, plan, _, _ = make()
    size = plan.size(0)
    syncer.open_round(0)
    syncer.push(push(0, 0, np.ones(size), seq=0))
    syncer.push(push(0, 0, np.ones(size), seq=0))  # duplicate seq
    syncer.push(push(1, 0, np.full(size, np.nan), seq=0))  # non-finite
    syncer.push(push(1, 1, np.ones(size + 1), seq=1))  # wrong length
    assert dict(syncer.book.rejections) == {"duplicate": 1, "nonfinite": 1, "malformed": 1}
    syncer.tick()
    np.testing.assert_allclose(syncer.theta[0], -1.0)


def test_flush_closes_rounds_without_quorum_and_state_round_trips():
    syncer, plan, _, _ = make(quorum=2)
    syncer.push(push(0, 1, np.ones(plan.size(1)), seq=0))
    assert syncer.tick() == 0 and syncer.flush() == 1
    tree, meta = syncer.state()
    other, _, _, _ = make(quorum=2)
    other.load(tree, meta)
    assert other.book.versions == (0, 1) and other.counters.rounds_closed == 1
    np.testing.assert_array_equal(other.theta[1], syncer.theta[1])
    flat = other.global_params({"a": np.zeros((4, 2), np.float32), "b": np.zeros(8, np.float32)})
    assert sum(int(np.count_nonzero(v)) for v in flat.values()) == plan.size(1)


def test_a_retired_learner_leaves_the_rounds_and_counts_as_a_model_that_no_longer_moves():
    # Three learners; learner 0 finished its steps: its last push still merges in full, and every
    # later round moves the global model by the movers' share of three, not by their whole mean.
    syncer, plan, delivered, clock = make(quorum=1, learners=3)
    size = plan.size(0)
    records = []
    syncer.journal = records.append
    syncer.open_round(0)
    syncer.push(push(0, 0, 3 * np.ones(size), seq=0))
    syncer.retire(0)  # its barrier returned: the syncer holds that push
    assert 0 not in syncer.members and syncer.retired == {0}
    syncer.push(push(1, 0, np.ones(size), seq=0))
    syncer.push(push(2, 0, 2 * np.ones(size), seq=0))
    assert syncer.tick() == 1  # every member pushed: a retired learner is not waited for
    np.testing.assert_allclose(syncer.theta[0], -2.0)  # mean of 3, 1, 2: a contributor is not discounted
    syncer.open_round(0)
    syncer.push(push(1, 0, np.ones(size), seq=1, base=1))
    across = np.tile([2.0, -2.0], size // 2)  # partly cancelling learner 1's: a spread above 1
    syncer.push(push(2, 0, across, seq=1, base=1))
    delivered.clear()
    assert syncer.tick() == 1
    mean = (np.ones(size) + across) / 2
    np.testing.assert_allclose(syncer.theta[0], -2.0 - mean * 2 / 3, rtol=1e-6)  # the mean, at 2 of 3 learners
    assert [m for m, _ in delivered] == [1, 2]  # nothing goes down to it
    # The spread rose, but its peers' lr factors go down as 1: the feedback was made for every learner's mean.
    assert min(syncer.spread.factors(0)) > 1.1
    assert all(set(msg.lr_factors) == {1.0} for _, msg in delivered)
    closed = [e for e in syncer.drain_events() if isinstance(e, events.RoundClosed)]
    assert [e.retired for e in closed] == [None, [0]]
    # A restarted syncer knows it from the journal or the checkpoint; one that trains again is no longer.
    replayed, _, _, _ = make(quorum=1, learners=3)
    for record in records:
        replayed.replay(pickle.loads(pickle.dumps(record)))
    restored, _, _, _ = make(quorum=1, learners=3)
    restored.load(*syncer.state())
    assert replayed.retired == restored.retired == {0}
    restored.join(0)
    assert restored.retired == set() and 0 in restored.members


@pytest.mark.parametrize("kind", ["nesterov", "delayed_nesterov"])
def test_the_outer_steps_state_survives_the_journal_and_the_checkpoint(kind):
    outer = {"kind": kind, "lr": 0.7, "momentum": 0.9}
    syncer, plan, _, _ = make(outer=outer)
    records = []
    syncer.journal = records.append
    rng = np.random.default_rng(0)
    for seq in range(3):  # three rounds of fragment 0: momentum builds up
        syncer.open_round(0)
        syncer.push(push(0, 0, rng.normal(size=plan.size(0)), seq=seq, base=seq))
        assert syncer.tick() == 1
    # By hand for the first round: buf = g, theta = 0 - 0.7 * (g + 0.9 g) = -1.33 g (nesterov);
    # delayed_nesterov (4 rounds between momentum updates) takes a plain step, -0.7 g.
    first = pickle.loads(pickle.dumps(records[0]))
    g = push(0, 0, np.random.default_rng(0).normal(size=plan.size(0)), 0).payload
    expected = -1.33 if kind == "nesterov" else -0.7
    np.testing.assert_allclose(first["theta"], expected * get_codec("none").decode(g), rtol=1e-5)
    replayed, _, _, _ = make(outer=outer)
    for record in records:  # as a restarted syncer reads its journal, pickled
        replayed.replay(pickle.loads(pickle.dumps(record)))
    restored, _, _, _ = make(outer=outer)
    restored.load(*syncer.state())  # as from a checkpoint
    for other in (replayed, restored):
        for key, value in syncer.outer[0].state().items():
            np.testing.assert_array_equal(other.outer[0].state()[key], value)
    g = rng.normal(size=plan.size(0))
    for each in (syncer, replayed, restored):  # the next round lands on the same values
        each.open_round(0)
        each.push(push(0, 0, g, seq=3, base=3))
        assert each.tick() == 1
    np.testing.assert_array_equal(replayed.theta[0], syncer.theta[0])
    np.testing.assert_array_equal(restored.theta[0], syncer.theta[0])


def test_recipe_rejects_impossible_syncer_settings():
    with pytest.raises(ValueError, match="syncer.quorum=5 but only 4 learners"):
        Recipe.model_validate({"learners": {"count": 4}, "syncer": {"quorum": 5}})
    with pytest.raises(ValueError, match="tau < H"):
        Recipe.model_validate({"syncer": {"overlap_steps": 24, "sync_interval_steps": 24}})


def test_slow_learner_inside_the_grace_window_is_included_beyond_it_is_not():
    # gamma 0.5, tau 1 (overlap_steps), step time 2 s, nothing else observed: window 0.5 * 1 * 2 = 1 s.
    syncer, plan, _, clock = make(quorum=1, learners=3, grace_gamma=0.5)
    syncer.book.grace.step_time_s = 2.0
    size = plan.size(0)
    syncer.open_round(0)
    syncer.push(push(0, 0, np.ones(size), seq=0))  # quorum reached at t = 0
    clock.now = 0.6
    syncer.push(push(1, 0, np.ones(size), seq=0))  # inside the window: joins this round
    assert syncer.tick() == 0  # learner 2 is healthy and has not pushed: wait out the window
    clock.now = 1.01
    assert syncer.tick() == 1
    clock.now = 1.5
    syncer.push(push(2, 0, np.ones(size), seq=0))  # the straggler, beyond the window
    closed = [e for e in syncer.drain_events() if isinstance(e, events.RoundClosed)]
    assert closed[0].contributors == [0, 1]
    assert syncer.book.pending(0) == {2}  # it makes the next round of fragment 0


def test_the_global_step_follows_the_median_learner_and_opens_one_round_per_h_over_p_steps():
    # P = 2, H = 4: a round every 2 global steps, fragments 0, 1, 0, 1, ...
    syncer, _, _, clock = make(learners=3)
    asked = []
    syncer.deliver = lambda m, msg: asked.append((m, msg.fragment, type(msg).__name__)) or 0
    paces = {0: 0.1, 1: 0.1, 2: 0.5}  # learner 2 is five times slower: the median is 10 steps/s
    for tick in range(1, 41):  # 4 s
        clock.now = tick * 0.1
        for m, pace in paces.items():
            syncer.heartbeat(m, int(clock.now / pace + 1e-9))
        syncer.tick()
    # The clock starts at the first tick (0.1 s) and moves once rates are known: 3.9 s at 10 steps/s.
    assert syncer.schedule.global_step == pytest.approx(39.0)
    assert syncer.schedule.next_round == 19
    requests = [a for a in asked if a[2] == "FragmentRequest"]
    assert len(requests) == 19 * 3  # every healthy learner is asked, the slow one too
    assert [f for m, f, _ in requests if m == 0] == [r % 2 for r in range(19)]


def test_the_ticking_thread_sleeps_until_the_next_round_or_grace_deadline():
    # P = 2, H = 4: a round every 2 global steps. Two learners at 10 steps/s.
    syncer, plan, _, clock = make(learners=2, grace_gamma=0.5)
    assert syncer.next_tick_in() == IDLE_TICK_S == 0.1  # nothing measured yet: wake at the idle period
    for t in (0.0, 0.1):
        clock.now = t
        for m in range(2):
            syncer.heartbeat(m, int(t * 10))
        syncer.tick()
    # Global step 1 at 0.1 s: the first round opens at global step 2, at 0.2 s.
    clock.now = 0.15
    assert syncer.next_tick_in() == pytest.approx(0.05)  # 50 ms away, within the idle period
    clock.now = 0.19
    assert syncer.next_tick_in() == pytest.approx(0.01)
    clock.now = 0.21
    assert syncer.next_tick_in() == 0.0  # overdue: tick at once
    syncer.tick()
    assert syncer.book.is_open(0) and syncer.next_tick_in() == IDLE_TICK_S  # the next round is 0.19 s away
    # Quorum (1) from learner 0 starts a grace window of 0.5 * 1 * 0.1 s = 50 ms: it ends at 0.26 s.
    syncer.push(push(0, 0, np.ones(plan.size(0)), seq=0))
    clock.now = 0.25
    assert syncer.next_tick_in() == pytest.approx(0.01)
    syncer.push(push(1, 0, np.ones(plan.size(0)), seq=0))  # every healthy learner answered: close now
    assert syncer.next_tick_in() == 0.0 and syncer.tick() == 1
    assert syncer.next_tick_in() == IDLE_TICK_S


def test_a_round_due_soon_opens_with_a_close_and_its_requests_follow_the_merged_fragment():
    # P = 2, H = 4: a round every 2 global steps. Two learners at 10 steps/s.
    syncer, plan, _, clock = make(learners=2)
    sent = []
    syncer.deliver = lambda m, msg: sent.append((m, type(msg).__name__, msg.fragment)) or 0
    for t in (0.0, 0.1, 0.2):
        clock.now = t
        for m in range(2):
            syncer.heartbeat(m, int(t * 10))
        syncer.tick()
    assert syncer.book.is_open(0) and syncer.schedule.next_round == 1  # opened at global step 2
    # Both answer at global step 2.5: the round closes 1.5 steps before round 1 is due (at 4),
    # more than half the spacing (1 step): round 1 waits for its time.
    clock.now = 0.25
    for m in range(2):
        syncer.push(push(m, 0, np.ones(plan.size(0)), seq=0))
    sent.clear()
    assert syncer.tick() == 1 and syncer.schedule.next_round == 1
    assert sent == [(0, "MergedFragment", 0), (1, "MergedFragment", 0)]
    clock.now = 0.4
    for m in range(2):
        syncer.heartbeat(m, 4)
    syncer.tick()
    assert syncer.book.is_open(1) and syncer.schedule.next_round == 2  # on time, at global step 4
    # Both answer at global step 5.4, less than half the spacing before round 2 (at 6): it opens
    # with the close, and each learner gets its request right behind the merged fragment.
    clock.now = 0.55
    for m in range(2):
        syncer.heartbeat(m, 5)
        syncer.push(push(m, 1, np.ones(plan.size(1)), seq=1))
    sent.clear()
    assert syncer.tick() == 1
    assert syncer.schedule.next_round == 3 and syncer.book.is_open(0)
    assert sent == [
        (0, "MergedFragment", 1),
        (1, "MergedFragment", 1),
        (0, "FragmentRequest", 0),
        (1, "FragmentRequest", 0),
    ]
    # When the global step reaches 6, the round is not opened again.
    clock.now = 0.7
    syncer.tick()
    assert syncer.schedule.global_step > 6 and syncer.schedule.next_round == 3


def test_a_push_sent_at_once_is_its_learners_heartbeat():
    syncer, plan, _, clock = make(learners=2, heartbeat_timeout_s=1.0)
    clock.now = 5.0  # both joined at 0: no longer healthy
    assert syncer.healthy() == set()
    syncer.push(Push(0, 0, 0, 4, 400, 0, get_codec("none").encode(np.ones(plan.size(0))), 0.0, step=40))
    syncer.push(Push(1, 0, 0, 4, 400, 0, get_codec("none").encode(np.ones(plan.size(0))), 0.0))  # re-sent
    assert syncer.healthy() == {0}
    assert syncer.schedule._reports[0].samples[-1] == (5.0, 40) and 1 not in syncer.schedule._reports
    syncer.leave(1)  # its last push, after it left (or an old process's), says nothing of a member
    syncer.push(Push(1, 1, 0, 4, 400, 1, get_codec("none").encode(np.ones(plan.size(1))), 0.0, step=41))
    assert syncer.heartbeats[1] == 0.0  # still its join's


def test_a_learner_that_stops_stepping_no_longer_counts_and_the_clock_goes_on():
    syncer, _, _, clock = make(learners=2, heartbeat_timeout_s=5.0)
    for tick in range(1, 21):
        clock.now = tick * 0.1
        syncer.heartbeat(0, tick)
        syncer.heartbeat(1, min(tick, 5))  # stuck at step 5 from 0.5 s, still heartbeating
        syncer.tick()
    assert syncer.active() == {0, 1}  # standing still for 1.5 s: not yet idle
    for tick in range(21, 81):
        clock.now = tick * 0.1
        syncer.heartbeat(0, tick)
        syncer.heartbeat(1, 5)
        syncer.tick()
    assert syncer.active() == {0} and syncer.healthy() == {0, 1}
    assert syncer.schedule.global_step > 70


def test_int4_downlink_sends_differences_and_feeds_the_error_back():
    syncer, plan, delivered, clock = make(learners=2, down_codec="int4", codec_block_values=4)
    assert plan.size(0) == 8  # two int4 blocks of 4 values, one fp32 scale each
    theta = np.array([0.7, 0.3, -0.14, 0.0] * 2, np.float32)
    syncer.open_round(0)
    syncer.push(push(0, 0, -theta, seq=0))
    syncer.push(push(1, 0, -theta, seq=0))
    assert syncer.tick() == 1  # lr 1, no momentum: theta = 0 - (-theta)
    (_, first), (_, same) = delivered
    assert first is same and first.base_version == 0 and first.payload.codec == "int4"
    # By hand: absmax 0.7 over 7 levels is a step of 0.1; -0.14 rounds to -1 step, -0.1.
    held = [0.7, 0.3, -0.1, 0.0] * 2
    np.testing.assert_allclose(get_codec("int4", 4).decode(first.payload), held, atol=1e-6)
    np.testing.assert_allclose(syncer.downlink.held[0], held, atol=1e-6)
    # The 0.04 int4 lost goes down with the next round of fragment 0, though theta does not move:
    # absmax 0.04 over 7 levels, and -0.04 is exactly -7 steps.
    delivered.clear()
    syncer.open_round(0)
    syncer.push(push(0, 0, np.zeros(8), seq=1, base=1))
    assert syncer.tick() == 1
    second = delivered[0][1]
    assert second.base_version == 1
    np.testing.assert_allclose(get_codec("int4", 4).decode(second.payload), [0, 0, -0.04, 0] * 2, atol=1e-6)
    np.testing.assert_allclose(syncer.downlink.held[0], theta, atol=1e-6)  # the learners now hold theta
    # A restarted learner holds a peer's copy, no version of ours: at once it gets every fragment
    # merged so far whole (fragment 1 never was), then differences like everyone.
    delivered.clear()
    syncer.rejoin(1)
    ((learner, whole),) = delivered
    assert learner == 1 and whole.fragment == 0 and whole.version == 2 and whole.base_version is None
    np.testing.assert_array_equal(get_codec("none").decode(whole.payload), syncer.downlink.held[0])
    delivered.clear()
    syncer.open_round(0)
    syncer.push(push(0, 0, np.zeros(8), seq=2, base=2))
    syncer.tick()
    assert [(m, msg.base_version) for m, msg in delivered] == [(0, 2), (1, 2)]


def test_after_a_syncer_restart_every_learner_gets_each_fragment_whole_first():
    # A live learner registered with a restarted syncer may have copied a peer since it started:
    # even at version 0 its fragments are not the initial parameters, so no difference can start there.
    syncer, plan, delivered, _ = make(learners=1, down_codec="int4", codec_block_values=4)
    syncer.join(0, holds_initial=False)
    assert delivered == []  # nothing merged yet: nothing to send
    syncer.open_round(0)
    syncer.push(push(0, 0, np.ones(plan.size(0)), seq=0))
    syncer.tick()
    assert delivered[0][1].base_version is None  # whole
    delivered.clear()
    syncer.open_round(0)
    syncer.push(push(0, 0, np.ones(plan.size(0)), seq=1, base=1))
    syncer.tick()
    assert delivered[0][1].base_version == 1  # from then on, differences


def test_quorum_holds_when_every_learner_pauses_at_once():
    syncer, plan, _, clock = make(quorum=2, learners=2)
    for tick in range(1, 11):
        clock.now = tick * 0.1
        syncer.heartbeat(0, tick)
        syncer.heartbeat(1, tick)
    for tick in range(11, 81):  # both stand still for 7 s (a checkpoint), still heartbeating
        clock.now = tick * 0.1
        syncer.heartbeat(0, 10)
        syncer.heartbeat(1, 10)
    assert syncer.schedule.stepping({0, 1}, clock.now) == set()
    assert syncer.active() == {0, 1}  # the healthy ones: K = 2 still means two
    syncer.open_round(0)
    syncer.push(push(0, 0, np.ones(plan.size(0)), seq=0))
    for _ in range(20):  # 2 s more of the pause: the round waits for the second learner
        clock.now += 0.1
        syncer.heartbeat(0, 10)
        syncer.heartbeat(1, 10)
        assert syncer.tick() == 0


def test_a_learner_that_steps_slower_than_the_rate_window_keeps_a_rate_and_counts():
    syncer, _, _, clock = make(learners=1)
    for tick in range(0, 81):  # 40 s of heartbeats every 0.5 s; one step every 8 s
        clock.now = tick * 0.5
        syncer.heartbeat(0, int(clock.now // 8))
    assert syncer.schedule.rate({0}) == pytest.approx(1 / 8)
    assert syncer.schedule.stepping({0}, clock.now) == {0}  # 0 s since its last step of 8


def test_a_learner_back_while_a_round_is_open_is_asked_for_the_fragment():
    syncer, _, _, clock = make(learners=2, heartbeat_timeout_s=5.0)
    asked = []
    syncer.deliver = lambda m, msg: asked.append((m, msg.fragment)) or 0
    clock.now = 6.0
    syncer.heartbeat(0)  # learner 1 silent for 6 s: not healthy
    syncer.open_round(1)
    assert asked == [(0, 1)]
    syncer.heartbeat(1)  # back
    syncer.tick()
    assert asked == [(0, 1), (1, 1)]
    syncer.tick()
    assert asked == [(0, 1), (1, 1)]  # once


def test_counters_render_the_status_fields_every_syncer_reports_and_round_trip():
    counters = SyncCounters()
    counters.pushed(2, 100, now=1.0)
    counters.pushed(0, 50, now=3.0)
    counters.accepted += 2
    counters.round_closed([0, 2])
    counters.round_closed([2])
    counters.bytes_down += 30
    # 3 contributions over 2 rounds: 1.5 a round; at t = 4 learner 2 last pushed 3 s ago, learner 0 1 s ago.
    assert counters.status(now=4.0) == {
        "rounds_closed": 2,
        "mean_contributors": 1.5,
        "pushes_accepted": 2,
        "bytes_up": 150,
        "bytes_down": 30,
        "contributed": {"0": 1, "2": 2},
        "last_push_age_s": {"2": 3.0, "0": 1.0},
    }
    restored = SyncCounters()
    restored.load(counters.state())  # a checkpoint keeps the counts, not who pushed when
    assert restored.status(now=4.0) == {**counters.status(now=4.0), "last_push_age_s": {}}


def test_the_syncer_of_algorithm_none_never_asks_a_learner_however_far_they_step():
    recipe = Recipe.model_validate({"algorithm": "none", "learners": {"count": 2}})
    clock = FakeClock()
    sent = []
    initial = {"a": np.zeros((4, 2), np.float32)}
    syncer = get_algorithm("none").syncer(recipe, initial, lambda m, msg: sent.append((m, msg)) or 0, clock)
    for m in range(2):
        syncer.join(m)
    for tick in range(1, 101):  # 10 s at 10 steps/s: many rounds' worth of global steps on a schedule
        clock.now = tick * 0.1
        for m in range(2):
            syncer.heartbeat(m, tick)
        assert syncer.tick() == 0
    assert sent == [] and syncer.schedule.next_round == 0
    assert syncer.active() == {0, 1}  # it still tells who is stepping
    assert syncer.next_tick_in() == IDLE_TICK_S
    status = syncer.status()
    assert status["global_step"] == 0.0 and status["grace_window_s"] == 0.0 and status["versions"] == [0]


def test_lr_factors_go_down_with_every_merge_and_survive_the_journal_and_the_checkpoint():
    syncer, plan, delivered, _ = make(quorum=2, lr_feedback_power=1.0)
    records = []
    syncer.journal = records.append
    a, b = np.zeros(plan.size(0)), np.zeros(plan.size(0))
    a[0], b[1] = 2.0, 2.0  # as long, at right angles: their mean is sqrt(2) times shorter
    syncer.open_round(0)
    syncer.push(push(0, 0, a, seq=0))
    syncer.push(push(1, 0, b, seq=0))
    assert syncer.tick() == 1
    first = 0.8 * 1.0 + 0.2 * np.sqrt(2.0)  # smoothed from 1 with lr_feedback_decay 0.8
    assert [(m, msg.lr_factors) for m, msg in delivered] == [(0, pytest.approx((first,))), (1, pytest.approx((first,)))]
    closed = [e for e in syncer.drain_events() if isinstance(e, events.RoundClosed)]
    assert closed[0].lr_factors == [round(first, 4)]  # in the run log too
    # The plain mean is merged (merge=mean, the default with the feedback): [-1, -1, 0 ...].
    np.testing.assert_allclose(syncer.theta[0][:3], [-1.0, -1.0, 0.0])
    replayed, _, _, _ = make(quorum=2, lr_feedback_power=1.0)
    for record in records:
        replayed.replay(pickle.loads(pickle.dumps(record)))
    restored, _, rejoined, _ = make(quorum=2, lr_feedback_power=1.0)
    restored.load(*syncer.state())
    for other in (replayed, restored):
        assert other.spread.factors(0) == pytest.approx((first,)) and other.spread.factors(1) == (1.0,)
    # A learner that holds no known version gets each fragment whole, with its factors.
    rejoined.clear()
    restored.rejoin(1)
    assert [(msg.fragment, msg.lr_factors) for _, msg in rejoined] == [(0, pytest.approx((first,)))]
    off, _, sent, _ = make(quorum=1, lr_feedback="none")
    off.open_round(0)
    off.push(push(0, 0, a, seq=0))
    assert off.tick() == 1 and all(msg.lr_factors == () for _, msg in sent)


@pytest.mark.parametrize(
    ("index", "value"),
    [(1, 2.0), (0, -1.8)],  # orthogonal: a spread of sqrt(2); undoing each other: 19, counted as sqrt(2)
    ids=["orthogonal", "undoing-each-other"],
)
def test_the_lr_feedback_power_raises_the_smoothed_spread_to_it_and_the_checkpoint_keeps_the_spread(index, value):
    syncer, plan, delivered, _ = make(quorum=2, lr_feedback_power=2.0)
    a, b = np.zeros(plan.size(0)), np.zeros(plan.size(0))
    a[0], b[index] = 2.0, value
    syncer.open_round(0)
    syncer.push(push(0, 0, a, seq=0))
    syncer.push(push(1, 0, b, seq=0))
    assert syncer.tick() == 1
    # Two learners' spread counts up to sqrt(2), so the factor stays within M^(power / 2) = 2.
    spread = 0.8 * 1.0 + 0.2 * np.sqrt(2.0)
    assert [msg.lr_factors for _, msg in delivered] == [pytest.approx((spread**2,))] * 2
    tree, _ = syncer.state()
    np.testing.assert_allclose(tree["spread"]["0"], [spread])  # the power is the recipe's, not state


def test_rda_and_the_lr_feedback_are_refused_together():
    with pytest.raises(ValueError, match="count it twice"):
        Recipe.model_validate({"syncer": {"merge": "rda"}})
    assert Recipe.model_validate({"syncer": {"merge": "rda", "lr_feedback": "none"}}).syncer.merge == "rda"
