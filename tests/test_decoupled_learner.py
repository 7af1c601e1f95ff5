"""The learner's protocol, driven by the in-process twin of the engine (no Ray, fake clock)."""

import numpy as np
import pytest

from dlc.algo.decoupled.learner import SentRecord
from dlc.algo.decoupled.messages import MergedFragment
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.core.data import load_corpus, split_corpus
from dlc.engine.local import InProcessRun
from tests.helpers import twin_recipe


def make_run(recipe: Recipe) -> InProcessRun:
    split = split_corpus(load_corpus(recipe.data), recipe.data, recipe.learners.count, 0, 2048)
    return InProcessRun(recipe, split)


def test_two_learners_contribute_merge_and_learn():
    run = make_run(twin_recipe(learners=2, outer_lr=1.0, outer_momentum=0.0))
    initial = run.global_eval()
    for _ in range(40):
        run.step_all()
    run.finish()
    status = run.syncer.status()
    # 40 steps, H=4, P=4: fragment p is due at steps p+1, p+5, ...: 10 pushes each = 40;
    # fragments 0..2 last went at steps 37..39, so finish() sends their 3 leftovers: 43.
    assert [s.pushes for s in run.syncs] == [43, 43]
    assert status["pushes_accepted"] == 86 and status["rejections"] == {}
    assert status["contributed"]["0"] > 0 and status["contributed"]["1"] > 0
    assert status["mean_contributors"] > 1.0  # rounds merged both learners
    assert run.global_eval() < initial - 0.5


def test_bytes_per_push_match_the_codec():
    run = make_run(twin_recipe(learners=2, codec="int4", codec_block_values=64))
    for _ in range(8):
        run.step_all()
    plan = run.syncs[0].plan
    codec = get_codec("int4", 64)
    # 8 steps, H=4, P=4: every fragment pushed twice per learner.
    expected = 2 * sum(codec.encoded_nbytes(plan.size(p)) for p in range(4))
    # By hand for one fragment of n values: ceil(n/2) payload bytes + 4 * ceil(n/64) scale bytes.
    n = plan.size(0)
    assert codec.encoded_nbytes(n) == -(-n // 2) + 4 * -(-n // 64)
    assert [s.transport.bytes_sent for s in run.syncs] == [expected, expected]
    assert run.syncer.bytes_up == 2 * expected


@pytest.mark.parametrize("mode", ["replace", "mix", "rebase"])
def test_adopt_modes_by_hand(mode):
    run = make_run(twin_recipe(learners=1, adopt=mode, mix_alpha=0.25))
    sync = run.syncs[0]
    p = 0
    size = sync.plan.size(p)
    s = np.full(size, 1.0, np.float32)  # theta[p] when sent
    sync.scatter(p, s)
    sync.sent[p] = SentRecord(step=sync.learner.step, theta=s.copy())
    sync.scatter(p, s + 0.5)  # local progress d = 0.5 while the fragment was in flight
    G = np.full(size, 3.0, np.float32)
    sync.adopt(MergedFragment(p, 1, get_codec("none").encode(G), 0.0))
    expected = {"replace": 3.0, "mix": 0.25 * 1.5 + 0.75 * 3.0, "rebase": 3.0 + 0.5}[mode]
    np.testing.assert_allclose(sync.gather(p), expected, rtol=1e-6)
    np.testing.assert_allclose(sync.anchors[p], 3.0)  # the anchor is the global value
    assert sync.versions[p] == 1


def test_merged_fragment_waits_tau_steps_after_its_push():
    run = make_run(twin_recipe(learners=1, overlap_steps=2, sync_interval_steps=4))
    sync = run.syncs[0]
    learner = sync.learner
    for _ in range(4):  # step 4: fragment 3 is due (phase ceil(4*4/4) = 4)
        learner.train_step()
        sync.after_step()
    assert 3 in sync.sent and sync.sent[3].step == 4
    G = np.zeros(sync.plan.size(3), np.float32)
    sync.receive(MergedFragment(3, 5, get_codec("none").encode(G), 0.0))
    learner.train_step()
    sync.after_step()  # step 5 < 4 + tau: still waiting
    assert sync.versions[3] == 0 and 3 in sync.waiting
    learner.train_step()
    sync.after_step()  # step 6 = 4 + tau: adopted
    assert sync.versions[3] == 5 and not sync.waiting
    np.testing.assert_array_equal(sync.gather(3), G)


def test_bandwidth_prediction_equals_bytes_sent():
    from dlc.plan.bandwidth import recipe_traffic

    recipe = twin_recipe(learners=2, sync_interval_steps=4)
    predicted = recipe_traffic(recipe)
    run = make_run(recipe)
    for _ in range(8):  # two full periods of H = 4: every fragment sent exactly twice
        run.step_all()
    for sync in run.syncs:
        assert sync.transport.bytes_sent / 8 == pytest.approx(predicted["up_bytes_per_step"])
    # Down: one round per fragment per period, each delivered to both learners.
    assert run.down.bytes_sent / 8 / 2 == pytest.approx(predicted["down_bytes_per_step"])


def test_restored_learner_does_not_recompile_as_it_adopts_fragments(tmp_path):
    # orbax restores device-committed arrays; adopted fragments are written back uncommitted.
    # jit compiles each mix anew, so a restored learner must hold plain uncommitted arrays.
    from dlc.run.checkpoint import Checkpointer

    run = make_run(twin_recipe(learners=2))
    for _ in range(6):
        run.step_all()
    sync = run.syncs[0]
    checkpointer = Checkpointer(tmp_path / "ck", keep=1)
    sync.learner.flush()
    checkpointer.save(sync.learner.step, sync.learner.state_tree(), sync.learner.state_meta())
    tree, meta = checkpointer.restore(sync.learner.state_tree())
    sync.learner.load_state(tree, meta)
    for _ in range(12):  # every step adopts and writes back a fragment somewhere
        run.step_all()
    # One compilation for fresh state; none more however the fragments were written.
    assert sync.learner._train_step._cache_size() == 1


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
