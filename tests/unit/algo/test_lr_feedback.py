"""The learner's side of syncer.lr_feedback: each tensor's factor from its pieces', staged for the loop.

The syncer's side is tested with the syncer (test_decoupled_syncer.py), the whole loop with the
twin (test_decoupled_learner.py), the factor itself with the merge (test_merge.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from dlc.algo.decoupled.lr_feedback import LeafFactors
from dlc.core.fragments import FragmentPlan


def test_a_learner_gives_each_tensor_its_pieces_factors_by_size_staged_for_the_loop() -> None:
    plan = FragmentPlan.build({"a": (4, 2), "b": (8,)}, 3)  # b whole; a in two pieces of 4 values
    staged = []
    factors = LeafFactors(plan, ["a", "b"], lambda x: staged.append(x) or x)
    assert factors.take() is None  # nothing arrived yet
    factors.offer(1, (2.0,))  # a's first half
    np.testing.assert_allclose(factors.take(), [1.5, 1.0])  # (4 * 2 + 4 * 1) / 8; b untouched
    assert factors.take() is None  # taken once
    factors.offer(2, (1.2,))
    factors.offer(0, (1.4,))
    np.testing.assert_allclose(factors.take(), [1.6, 1.4])  # the newest of each piece
    assert len(staged) == 3  # worked out and placed by the receiving thread, at each arrival
    with pytest.raises(ValueError, match="2 factors for fragment 0's 1 pieces"):
        factors.offer(0, (1.0, 1.0))
    off = LeafFactors(plan, ["a", "b"], on=False)
    off.offer(1, (2.0,))
    off.offer(0, ())
    assert off.take() is None


def test_a_checkpoint_with_factors_resumed_without_the_feedback_steps_at_the_scheduled_lr():
    from dlc.core.learner import Learner
    from dlc.data.plan import plan_data
    from tests.helpers import twin_recipe

    with_feedback = twin_recipe(learners=1)
    learner = Learner(with_feedback, 0, plan_data(with_feedback).streams[0])
    learner.set_leaf_scales(learner.leaf_scales_to_device(np.full(learner.opt_state[-1].scales.shape, 1.5)))
    tree, meta = learner.state_tree(), learner.state_meta()
    for recipe, expected in ((with_feedback, 1.5), (twin_recipe(learners=1, lr_feedback="none"), 1.0)):
        resumed = Learner(recipe, 0, plan_data(recipe).streams[0])
        resumed.load_state(tree, meta)
        assert set(np.asarray(resumed.opt_state[-1].scales).tolist()) == {expected}
