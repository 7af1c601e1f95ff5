"""bfloat16 compute trains the same model as float32: one learner of tiny, stepped here without Ray."""

from __future__ import annotations

from dlc.config.load import load_recipe
from dlc.core.evaluate import Evaluator
from dlc.core.learner import Learner
from dlc.data.plan import plan_data
from tests.helpers import TINY

STEPS = 120


def final_eval_loss(*overrides: str) -> float:
    recipe = load_recipe(
        TINY, ["learners.count=1", "learners.batch_size=8", "algorithm=none", f"run.max_steps={STEPS}", *overrides]
    )
    data = plan_data(recipe)
    learner = Learner(recipe, 0, data.streams[0])
    for _ in range(STEPS):
        learner.train_step()
    learner.flush()
    loss, _ = Evaluator(recipe, learner.graphdef, data.eval)(learner.params)
    return loss


def test_a_bfloat16_learner_ends_within_2_percent_of_float32():
    # Llama's blocks: every kind of layer bfloat16 changes (RMSNorm, rotary, SwiGLU, grouped attention).
    # Measured: 2.5254 and 2.5368 (0.45% apart); with GPT's blocks, 2.7243 and 2.7236.
    exact = final_eval_loss("model.arch=llama", "model.num_kv_heads=2")
    low = final_eval_loss("model.arch=llama", "model.num_kv_heads=2", "model.compute_dtype=bfloat16")
    assert exact < 2.9  # it learned: ln 256 = 5.55 at the start
    assert abs(low - exact) / exact < 0.02, (low, exact)
