"""The learner's protocol, driven by the in-process twin of the engine (no Ray, fake clock)."""

import dataclasses
import threading

import jax
import numpy as np
import pytest

from dlc.algo.decoupled.learner import SentRecord
from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment
from dlc.algo.local import InProcessRun
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.data.corpus import load_corpus, split_corpus
from dlc.data.plan import DataPlan
from dlc.run import events
from tests.fakes import Direct
from tests.helpers import twin_recipe


def make_run(recipe: Recipe) -> InProcessRun:
    split = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, recipe.learners.count, 0, 2048))
    return InProcessRun(recipe, split)


def test_two_learners_contribute_merge_and_learn():
    run = make_run(twin_recipe(learners=2, outer_lr=1.0, outer_momentum=0.0))
    initial = run.global_eval()
    for _ in range(40):
        run.step_all()
    # The syncer's clock starts once it has two step reports from a learner; from then on one
    # round per global step (H = P = 4), each asking both learners, each answered a step later.
    # The last round opened with the last close, a rounding error before its global step
    # (`EARLY_OPEN`): the learners read its requests at their next step.
    assert run.syncer.schedule.global_step == pytest.approx(39.0)
    assert run.syncer.schedule.next_round == 39
    assert 35 <= run.syncer.counters.rounds_closed <= 38
    assert run.syncer.requests_sent == 2 * 39
    assert [s.requests for s in run.syncs] == [38, 38]
    run.finish()
    status = run.syncer.status()
    assert status["rejections"] == {} and status["pushes_accepted"] == sum(s.pushes for s in run.syncs)
    assert status["mean_contributors"] >= 1.9  # rounds merged both learners
    assert run.global_eval() < initial - 0.5


def test_learners_fed_the_same_data_in_step_train_exactly_as_one():
    # Two learners that see the same batches from the same start push the same outer gradients:
    # weighting, merging (RDA), int4 both ways with each learner's error feedback, adoption and the
    # round book must then give exactly one learner's run.
    def trained(count: int) -> tuple[float, list[int]]:
        recipe = twin_recipe(learners=count)
        split = split_corpus(load_corpus(recipe.data), recipe.data, 2, 0, 2048)
        data = dataclasses.replace(DataPlan.of_bytes(split), streams=(split.streams[0],) * count)
        run = InProcessRun(recipe, data)
        for _ in range(24):  # six rounds of each fragment
            run.step_all()
        run.finish()
        return run.global_eval(), [run.syncer.status()["rounds_closed"], *(s.pushes for s in run.syncs)]

    one, two = trained(1), trained(2)
    assert two[0] == pytest.approx(one[0], rel=1e-6, abs=0)
    assert two[1] == [one[1][0]] + one[1][1:] * 2  # as many rounds; each learner pushed as often


def test_bytes_per_push_match_the_codec():
    run = make_run(twin_recipe(learners=2, codec="int4", codec_block_values=64))
    for _ in range(12):
        run.step_all()
    plan = run.syncs[0].plan
    codec = get_codec("int4", 64)
    pushed = [e for e in run.syncer.drain_events() if isinstance(e, events.PushAccepted)]
    assert len(pushed) >= 16
    # By hand for one fragment of n values: ceil(n/2) payload bytes + 4 * ceil(n/64) scale bytes.
    n = plan.size(0)
    assert codec.encoded_nbytes(n) == -(-n // 2) + 4 * -(-n // 64)
    for learner in (0, 1):
        expected = sum(codec.encoded_nbytes(plan.size(e.fragment)) for e in pushed if e.learner == learner)
        assert run.syncs[learner].transport.bytes_sent == expected
        assert all(e.bytes == codec.encoded_nbytes(plan.size(e.fragment)) for e in pushed)
    assert run.syncer.counters.bytes_up == sum(s.transport.bytes_sent for s in run.syncs)


@pytest.mark.parametrize("mode", ["replace", "mix", "rebase"])
def test_adopt_modes_by_hand(mode):
    run = make_run(twin_recipe(learners=1, adopt=mode, mix_alpha=0.25))
    sync = run.syncs[0]
    p = 0
    size = sync.plan.size(p)
    s = np.full(size, 1.0, np.float32)  # theta[p] when sent
    sync.scatter(p, s)
    sync.sent[p] = [SentRecord(step=sync.learner.step, theta=sync.ops.to_device(p, s), seq=0)]
    sync.merged_mine[(p, 1)] = 0  # version 1 merged that push
    sync.scatter(p, s + 0.5)  # local progress d = 0.5 while the fragment was in flight
    sync.steps_since[p] = 3  # ... made in three steps
    sync.unsent_steps[p] = 3.0
    G = np.full(size, 3.0, np.float32)
    sync.adopt(p, 1, G)
    expected = {"replace": 3.0, "mix": 0.25 * 1.5 + 0.75 * 3.0, "rebase": 3.0 + 0.5}[mode]
    np.testing.assert_allclose(sync.gather(p), expected, rtol=1e-6)
    # The progress thrown away, in whole-model steps: the three steps on p, by p's share of the model
    # and by the share of them the mode drops (the goodput ledger files it as wasted).
    dropped = {"replace": 1.0, "mix": 0.75, "rebase": 0.0}[mode]
    share = size / sync.plan.total_size
    assert sync.discarded_steps == pytest.approx(dropped * 3 * share)
    np.testing.assert_allclose(sync.ops.to_host(p, sync.anchors[p]), 3.0)  # the anchor is the global value
    assert sync.versions[p] == 1
    # A second adoption with nothing pushed in between drops a share of what the first one left,
    # never the same steps twice: mix keeps alpha of them each time; rebase, with no push in flight
    # to rebase on, replaces what it kept.
    sync.adopt(p, 2, np.full(size, 4.0, np.float32))
    total = {"replace": 1.0, "mix": 0.75 + 0.25 * 0.75, "rebase": 1.0}[mode]
    assert sync.discarded_steps == pytest.approx(total * 3 * share)


def one_rebasing_learner():
    """The learner side of a one-learner twin that adopts by rebase, with fp32 codecs."""
    return make_run(twin_recipe(learners=1, adopt="rebase", codec="none")).syncs[0]


def test_a_rebase_keeps_what_the_version_does_not_hold_and_sends_nothing_twice():
    sync = one_rebasing_learner()
    p, size, anchor = 0, sync.plan.size(0), sync.gather(0)
    s = anchor + 1.0  # theta[p] when pushed (seq 0, from version 0)
    sync.sent[p] = [SentRecord(step=sync.learner.step, theta=sync.ops.to_device(p, s), seq=0, steps=2, tokens=20)]
    sync.scatter(p, s + 0.5)  # progress made since
    G1, G2 = np.full(size, 3.0, np.float32), np.full(size, 5.0, np.float32)
    # Version 1 merged other learners' pushes, not this one (it arrived late): all progress since the
    # anchor stays, and the push in flight moves with the parameters.
    sync.adopt(p, 1, G1)
    np.testing.assert_allclose(sync.gather(p), G1 + 1.5, rtol=1e-6)
    [flying] = sync.sent[p]
    np.testing.assert_allclose(sync.ops.to_host(p, flying.theta), G1 + 1.0, rtol=1e-6)
    # The next push counts from the one in flight: it carries the 0.5 of progress made since, once.
    payload, scales, _ = sync.ops.push(sync.learner.params, p, sync.counts_from[p])
    delta = get_codec("none").decode(sync.ops.encoded(p, payload, scales))
    np.testing.assert_allclose(delta, -0.5, rtol=1e-5)
    # Version 2 merged the late push: the rebase is on it, and nothing is left in flight.
    sync.merged_mine[(p, 2)] = 0
    sync.adopt(p, 2, G2)
    np.testing.assert_allclose(sync.gather(p), G2 + 0.5, rtol=1e-6)
    assert p not in sync.sent and p not in sync.counts_from
    # A push too stale for the syncer to take gives its steps and tokens back to the next one.
    stale = SentRecord(
        step=sync.learner.step, theta=sync.ops.to_device(p, G2), seq=1, base_version=2, steps=3, tokens=30
    )
    sync.sent[p] = [stale]
    sync.steps_since[p] = sync.tokens_since[p] = 0
    sync.adopt(p, 2 + sync.max_staleness + 1, np.full(size, 7.0, np.float32))
    assert p not in sync.sent and (sync.steps_since[p], sync.tokens_since[p]) == (3, 30)


def test_a_push_refused_as_stale_is_sent_again_with_the_next_although_a_later_one_is_in_flight():
    sync = one_rebasing_learner()
    p, size, anchor = 0, sync.plan.size(0), sync.gather(0)
    # Two pushes in flight: the first from version 0 (it moved 1.0 from the anchor), the second from
    # version 1 (0.5 further, counted from the first); 0.5 more progress made since.
    older = SentRecord(step=0, theta=sync.ops.to_device(p, anchor + 1.0), seq=0, base_version=0, steps=2, tokens=20)
    newer = SentRecord(step=1, theta=sync.ops.to_device(p, anchor + 1.5), seq=1, base_version=1, steps=1, tokens=10)
    sync.sent[p] = [older, newer]
    sync.scatter(p, anchor + 2.0)
    sync.steps_since[p] = sync.tokens_since[p] = 0
    # A version that merged neither, one past the staleness the syncer accepts for the first push
    # (so it was refused) and within it for the second (so it is still in flight).
    G = np.full(size, 3.0, np.float32)
    sync.adopt(p, sync.max_staleness + 1, G)
    np.testing.assert_allclose(sync.gather(p), G + 2.0, rtol=1e-6)  # all progress stays
    [flying] = sync.sent[p]
    assert flying.seq == 1 and (sync.steps_since[p], sync.tokens_since[p]) == (2, 20)
    # The refused push's 1.0 goes with the next push, beside the 0.5 made since the second: what the
    # syncer takes in the end (the second's 0.5 and this 1.5) is all the learner's progress, once.
    payload, scales, _ = sync.ops.push(sync.learner.params, p, sync.counts_from[p])
    delta = get_codec("none").decode(sync.ops.encoded(p, payload, scales))
    np.testing.assert_allclose(delta, -1.5, rtol=1e-5)


def test_one_learner_syncing_every_step_trains_as_data_parallel():
    # H = 1: the fragment is asked for again before its last merge is back, so two pushes are in
    # flight at once. One learner with fp32 codecs must still end where it would alone.
    recipe = twin_recipe(
        learners=1, fragments=1, sync_interval_steps=1, overlap_steps=0, codec="none", down_codec="none"
    )
    run = make_run(recipe)
    alone = make_run(twin_recipe(learners=1)).learners[0]
    for _ in range(30):
        run.step_all()
        alone.train_step()
    run.finish()
    alone.flush()
    assert run.syncer.status()["rejections"] == {}
    assert run.global_eval() == pytest.approx(run.evaluator(alone.params)[0], abs=1e-4)


def test_a_request_is_answered_at_the_next_step_and_the_merge_waits_tau_steps():
    run = make_run(twin_recipe(learners=1, overlap_steps=2, sync_interval_steps=4, adopt="replace"))
    sync = run.syncs[0]
    learner = sync.learner
    for _ in range(3):
        learner.train_step()
        sync.after_step()
    assert sync.pushes == 0  # nobody asked
    sync.receive(FragmentRequest(3, 0, 0.0))
    learner.train_step()
    sync.after_step()  # step 4 answers the request
    assert sync.pushes == 1 and [r.step for r in sync.sent[3]] == [4]
    G = np.zeros(sync.plan.size(3), np.float32)
    sync.receive(MergedFragment(3, 5, get_codec("none").encode(G), 0.0))
    learner.train_step()
    sync.after_step()  # step 5 < 4 + tau: still waiting
    assert sync.versions[3] == 0 and 3 in sync.waiting
    learner.train_step()
    sync.after_step()  # step 6 = 4 + tau: adopted
    assert sync.versions[3] == 5 and not sync.waiting
    np.testing.assert_array_equal(sync.gather(3), G)
    assert sync.steps_since[3] == 0  # replaced: the steps since the push were thrown away with it


def test_the_merge_lag_is_tau_when_merges_are_on_time_and_counts_each_step_one_is_late():
    run = make_run(twin_recipe(learners=1, overlap_steps=2, sync_interval_steps=4, codec="none", down_codec="none"))
    sync = run.syncs[0]
    learner = sync.learner

    def step() -> None:
        learner.train_step()
        sync.after_step()

    assert sync.adopt_lag_steps() is None  # nothing adopted yet
    G = np.zeros(sync.plan.size(3), np.float32)
    sync.receive(FragmentRequest(3, 0, 0.0))
    step()  # step 1 pushes seq 0
    sync.receive(MergedFragment(3, 1, get_codec("none").encode(G), 0.0, merged=((0, 0),)))
    step()
    step()  # step 3 = 1 + tau: adopted on time
    assert sync.versions[3] == 1 and sync.adopt_lag_steps() == 2
    sync.receive(FragmentRequest(3, 1, 0.0))
    step()  # step 4 pushes seq 1; its merge arrives only after step 8
    for _ in range(4):
        step()
    sync.receive(MergedFragment(3, 2, get_codec("none").encode(G), 0.0, merged=((0, 1),)))
    step()  # step 9: adopted five steps after the push
    assert sync.versions[3] == 2 and sync.adopt_lag_steps() == (2 + 5) / 2
    # A version that merged none of its pushes is no measure of the lag.
    sync.receive(MergedFragment(3, 3, get_codec("none").encode(G), 0.0))
    step()
    assert sync.versions[3] == 3 and sync.adopt_lag_steps() == 3.5


def test_on_the_twin_every_merge_is_adopted_tau_steps_after_its_push():
    run = make_run(twin_recipe(learners=2, overlap_steps=2, fragments=4, sync_interval_steps=4))
    for _ in range(24):
        run.step_all()
    assert [sync.adopt_lag_steps() for sync in run.syncs] == [2, 2]


def test_a_push_sent_at_once_carries_the_step_as_a_heartbeat_and_a_re_send_does_not():
    run = make_run(twin_recipe(learners=1))
    sync, learner = run.syncs[0], run.syncs[0].learner
    got = []
    sync._push = Direct(got.append)
    sync.receive(FragmentRequest(0, 0, 0.0))
    learner.train_step()
    sync.after_step()
    assert got[-1].step == learner.step == 1 and sync.beat_at > float("-inf")
    assert [p.step for p in sync.unacked.values()] == [None]  # kept to re-send: says nothing of then
    sync.reconnect(Direct(got.append))
    assert got[-1].seq == got[0].seq and got[-1].step is None
    sync.transport.impair(0, 0.5, 60.0)  # an impaired link delivers late: no heartbeat
    sync.receive(FragmentRequest(1, 0, 0.0))
    learner.train_step()
    sync.after_step()
    assert sync.transport.drain(timeout_s=10)
    assert got[-1].fragment == 1 and got[-1].step is None


def test_differences_sent_down_resolve_in_version_order_against_the_held_value():
    run = make_run(twin_recipe(learners=1, down_codec="int4"))
    sync = run.syncs[0]
    p = 1
    base = sync.received.held[p][1]
    codec = get_codec("int4", 64)
    d1, d2 = np.full(base.size, 0.5, np.float32), np.full(base.size, -0.25, np.float32)
    v1 = base + codec.decode(codec.encode(d1))
    # Version 2 arrives before version 1 (its base): it waits, then both resolve in order.
    sync.receive(MergedFragment(p, 2, codec.encode(d2), 0.0, base_version=1))
    sync.learner.train_step()
    sync.after_step()
    assert sync.versions[p] == 0 and 1 in sync.received.parked[p]
    sync.receive(MergedFragment(p, 1, codec.encode(d1), 0.0, base_version=0))
    sync.learner.train_step()
    sync.after_step()
    assert sync.versions[p] == 2 and not sync.received.parked[p]
    np.testing.assert_allclose(sync.gather(p), v1 + codec.decode(codec.encode(d2)), rtol=1e-6)
    # A copy from a peer holds no known version: differences wait until a whole value comes.
    sync.adopt_peer(*sync.peer_view())
    assert sync.received.held[p] is None
    sync.receive(MergedFragment(p, 3, codec.encode(d1), 0.0, base_version=2))
    sync.receive(MergedFragment(p, 3, get_codec("none").encode(np.ones(base.size, np.float32)), 0.0))
    sync.learner.train_step()
    sync.after_step()
    assert sync.versions[p] == 3
    np.testing.assert_array_equal(sync.gather(p), 1.0)
    # An older whole value that overtook nothing newer is dropped: what is held never goes back.
    sync.receive(MergedFragment(p, 2, get_codec("none").encode(np.zeros(base.size, np.float32)), 0.0))
    sync.learner.train_step()
    sync.after_step()
    assert sync.received.held[p][0] == 3 and sync.versions[p] == 3


def test_bandwidth_prediction_equals_bytes_sent():
    from dlc.plan.bandwidth import recipe_traffic

    recipe = twin_recipe(learners=2, sync_interval_steps=4, down_codec="bf16")
    predicted = recipe_traffic(recipe)
    run = make_run(recipe)
    for _ in range(4):  # the syncer's clock starts
        run.step_all()
    up, down = [s.transport.bytes_sent for s in run.syncs], run.down.bytes_sent
    for _ in range(16):  # four periods of H = 4: every fragment asked for and sent back four times
        run.step_all()
    for sync, before in zip(run.syncs, up, strict=True):
        assert (sync.transport.bytes_sent - before) / 16 == pytest.approx(predicted["up_bytes_per_step"])
    # Down: one round per fragment per period, each delivered once to both learners.
    assert (run.down.bytes_sent - down) / 16 / 2 == pytest.approx(predicted["down_bytes_per_step"])


def test_each_function_compiles_once_through_adoptions_restores_and_copies(tmp_path):
    # A jitted function compiles anew for every mix of committed and uncommitted inputs it sees
    # (orbax restores committed arrays, host values are uncommitted): a learner that restores a
    # checkpoint, copies a peer or takes the global fragments must not compile anything again.
    from dlc.core.compile_cache import CompileLog
    from dlc.run.checkpoint import Checkpointer

    log = CompileLog(cached=False)
    try:
        run = make_run(twin_recipe(learners=2))
        for _ in range(8):  # every step pushes and adopts fragments: both functions run
            run.step_all()
        assert sum(s.adopted for s in run.syncs) > 0 and sum(s.pushes for s in run.syncs) > 0
        compiled = dict(log.compiled)
        groups = run.syncs[0].ops.groups  # fragments of one make-up share a pair of functions
        assert compiled.get("jit(train_step)") == 2, compiled  # once for each of the two learners
        for name in ("extract", "swap"):
            assert compiled.get(f"jit({name})") == 2 * groups, compiled  # each pair once a learner
        sync, peer = run.syncs
        checkpointer = Checkpointer(tmp_path / "ck", keep=1)
        sync.learner.flush()
        checkpointer.save(sync.learner.step, sync.learner.state_tree(), sync.learner.state_meta())
        tree, meta = checkpointer.restore(sync.learner.state_tree())
        sync.learner.load_state(tree, meta)  # a restart from its checkpoint
        for _ in range(6):
            run.step_all()
        peer.learner.flush()
        sync.learner.load_state(jax.device_get(peer.learner.state_tree()), peer.learner.state_meta())
        sync.adopt_peer(*peer.peer_view())  # a rejoin: a copy of a healthy peer
        for _ in range(6):
            run.step_all()
        sync.adopt_global(run.syncer.global_fragments(), run.syncer.versions())  # no peer: the global model
        for _ in range(6):
            run.step_all()
        assert dict(log.compiled) == compiled
    finally:
        log.close()


def test_every_step_record_reaches_the_loop_whoever_flushed():
    run = make_run(twin_recipe(learners=1))
    learner = run.learners[0]
    learner.train_step()
    learner.train_step()  # finishes step 1
    learner.flush()  # a checkpoint or a state copy flushes step 2 in between
    learner.train_step()
    learner.flush()  # the end of the run flushes step 3
    assert [r.step for r in learner.take_records()] == [1, 2, 3]
    assert learner.take_records() == []


class HeldLink:
    """A push method whose sends hang until released: a slow link, or a syncer that does not answer."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self.entered = threading.Event()
        self.received: list = []

    def remote(self, message):
        self.entered.set()
        assert self.release.wait(60), "the test never released the link"
        self.received.append(message)


def _steps_in_thread(sync, steps: int, timeout_s: float = 120) -> None:
    """Run `steps` loop steps (train + after_step) in a thread; fail if they do not all finish."""
    import threading

    done = threading.Event()

    def loop() -> None:
        for _ in range(steps):
            sync.learner.train_step()
            sync.after_step()
        done.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        import faulthandler
        import sys

        faulthandler.dump_traceback(sys.stderr)
        raise AssertionError("the step loop waited on the link")


def _background_sync(run: InProcessRun, push):
    """Learner 0 of `run` with its own protocol state, pushing to `push`, sending and receiving on
    threads as the engine's learners do (`start_background`)."""
    from dlc.net.transport import Transport

    sync = type(run.syncs[0])(run.recipe, run.learners[0], run.syncs[0].plan, Transport(), push, _traffic(run.recipe))
    sync.compile()
    sync.start_background()
    return sync


def test_the_loop_steps_on_while_a_push_is_held_and_an_adoption_arrives():
    run = make_run(twin_recipe(learners=1))
    link = HeldLink()
    sync = _background_sync(run, link)
    p = 2
    sync.receive(FragmentRequest(p, 0, 0.0))
    _steps_in_thread(sync, 1)
    assert link.entered.wait(30)  # the sender thread is inside the held send
    # While it hangs there: ten more steps, another request answered, a merged fragment adopted.
    sync.receive(FragmentRequest(p + 1, 0, 0.0))
    G = np.full(sync.plan.size(p), 0.5, np.float32)
    sync.receive(MergedFragment(p, 1, get_codec("none").encode(G), 0.0))  # from "another thread"
    _steps_in_thread(sync, 10)
    assert sync.pushes == 2 and not link.received  # both dispatched, neither sent yet
    assert sync.versions[p] == 1
    np.testing.assert_allclose(sync.gather(p), 0.5, atol=0.05)  # adopted, then a few steps trained on
    link.release.set()
    sync.flush_sends()
    assert [m.fragment for m in link.received] == [p, p + 1]
    assert [m.seq for m in link.received] == [0, 1]
    assert [m.steps for m in link.received] == [1, 2]  # counted when dispatched, not when sent


def test_a_merge_that_arrives_after_its_boundary_but_before_the_next_dispatch_is_adopted_in_its_slot():
    run = make_run(twin_recipe(learners=1, overlap_steps=2, codec="none", down_codec="none"))
    learner = run.learners[0]
    sync = _background_sync(run, Direct(lambda push: None))
    never = threading.Event()
    p = 2
    sync.receive(FragmentRequest(p, 0, 0.0))
    sync.step(never)  # step 1 pushes seq 0
    sync.step(never)
    sync.step(never)  # boundary 3 = 1 + tau: the merge is due and missing; step 3 is in flight
    assert learner.step == 3 and sync.versions[p] == 0
    sync.flush_sends()
    G = np.full(sync.plan.size(p), 0.5, np.float32)
    sync.receive(MergedFragment(p, 1, get_codec("none").encode(G), 0.0, merged=((0, 0),)))
    sync.step(never)  # waits for step 3, adopts, then dispatches step 4 on the merged value
    assert sync.versions[p] == 1 and sync.adopt_lag_steps() == 2  # the slot a timely merge has
    learner.flush()
    np.testing.assert_allclose(sync.gather(p), 0.5, atol=0.05)  # one step trained on it
    assert [r.step for r in learner.take_records()] == [1, 2, 3, 4]  # every step recorded once
    # A boundary where nothing falls due neither waits nor adopts: a merge of a fragment this
    # learner did not push waits for the next boundary, as before.
    sync.receive(MergedFragment(p + 1, 1, get_codec("none").encode(np.zeros(sync.plan.size(p + 1), np.float32)), 0.0))
    assert sync._last_call() == [] and sync.versions[p + 1] == 0


def test_with_no_overlap_a_boundary_never_waits_for_the_step_in_flight():
    run = make_run(twin_recipe(learners=1, overlap_steps=0))
    learner = run.learners[0]
    sync = _background_sync(run, Direct(lambda push: None))
    sync.receive(FragmentRequest(1, 0, 0.0))
    sync.step(threading.Event())  # pushes at step 1; its merge is due at once and cannot be here
    assert sync.sent[1] and learner._pending is not None
    assert sync._last_call() == [] and learner._pending is not None  # step 1 still in flight
    sync.flush_sends()


def _traffic(recipe):
    from dlc.algo import get_algorithm

    return get_algorithm("decoupled").traffic(recipe)


def test_a_resumed_learner_continues_from_the_global_model_and_undoes_no_merge():
    # Learner 0 checkpoints, the run goes on merging, then learner 0 is resumed from that checkpoint.
    # Its first push must carry only what it learns from now on: if it kept its old parameters with
    # the global fragments as anchors, `anchor - theta` would undo every merge since its checkpoint.
    run = make_run(twin_recipe(learners=2, outer_lr=1.0, outer_momentum=0.0))
    for _ in range(8):
        run.step_all()
    sync = run.syncs[0]
    sync.learner.flush()
    tree, meta = jax.device_get(sync.learner.state_tree()), sync.learner.state_meta()
    sync_tree, sync_meta = sync.state()
    for _ in range(16):
        run.step_all()
    sync.learner.load_state(tree, meta)
    sync.load(sync_tree, sync_meta)
    fragments, versions = run.syncer.global_fragments(), run.syncer.versions()
    behind = [float(np.linalg.norm(f - sync.gather(p))) for p, f in enumerate(fragments)]
    assert min(behind) > 0  # its checkpoint is behind the global model on every fragment
    sync.resume_from_global(fragments, versions)
    assert sync.learner.step == meta["step"] and sync.versions == versions  # its own step, the global clock
    for p, fragment in enumerate(fragments):
        np.testing.assert_array_equal(sync.gather(p), fragment)  # the global model, ...
        np.testing.assert_array_equal(sync.ops.to_host(p, sync.anchors[p]), fragment)  # ... nothing to push yet
    assert sync.unpushed_steps() == 0


def test_weights_follow_the_tokens_behind_each_push_with_unequal_batches():
    """Learner 0 steps batches four times learner 1's at the same pace: over the run, its mean weight
    in the rounds is its share of the tokens (4/5), not 16/17 as tokens^2/steps would give it."""
    raw = twin_recipe(learners=2).model_dump()
    raw["learners"]["overrides"] = [{"index": 0, "batch_size": 4 * raw["learners"]["batch_size"]}]
    run = make_run(Recipe.model_validate(raw))
    for _ in range(16):
        run.step_all()
    run.finish()
    weights = np.zeros(2)
    rounds = [e for e in run.syncer.drain_events() if isinstance(e, events.RoundClosed)]
    assert len(rounds) >= 10
    for event in rounds:
        for learner, weight in zip(event.contributors, event.weights, strict=True):
            weights[learner] += weight / len(rounds)
    tokens = np.array([learner.tokens for learner in run.learners], dtype=float)
    np.testing.assert_allclose(weights, tokens / tokens.sum(), rtol=0.10)


def test_each_learner_steps_each_tensor_by_the_syncers_factor_for_it():
    from dlc.algo.decoupled.lr_feedback import LeafFactors
    from dlc.core.fragment_ops import leaf_names
    from dlc.core.steps import LeafScales

    run = make_run(twin_recipe(learners=2))  # lr_feedback=spread, merge=mean: the defaults
    for _ in range(11):  # three rounds of each fragment
        run.step_all()
    expected = LeafFactors(run.syncs[0].plan, leaf_names(run.syncs[0].learner.params))
    for p in range(run.syncer.plan.num_fragments):
        expected.offer(p, run.syncer.spread.factors(p))
    factors = expected.take()
    run.step_all()  # the learners take what came down with the merges at their next step
    # Two learners on different data: their deltas partly cancel, every spread above 1, below sqrt(2),
    # every factor the spread to the recipe's power.
    power = run.syncer.spread.power
    assert factors is not None and factors.min() > 1.0 and factors.max() < np.sqrt(2.0) ** power
    for sync in run.syncs:  # what each learner's optimizer multiplies its steps by, tensor by tensor
        np.testing.assert_allclose(np.asarray(sync.learner.opt_state[-1].scales), factors, rtol=1e-6)
    run.finish()
    off = make_run(twin_recipe(learners=2, lr_feedback="none"))
    for _ in range(6):
        off.step_all()
    assert off.syncer.counters.rounds_closed > 0
    for sync in off.syncs:  # the factors are still there, and stay 1
        assert isinstance(sync.learner.opt_state[-1], LeafScales)
        assert np.asarray(sync.learner.opt_state[-1].scales).tolist() == [1.0] * len(factors)
