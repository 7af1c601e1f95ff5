"""Loss and bits per byte of a model on the fixed held-out windows."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from dlc.config.schema import Recipe
from dlc.core.model import Params
from dlc.core.steps import make_eval_step
from dlc.data.plan import EvalSource, bits_per_byte, eval_bytes_per_token, eval_windows


class Evaluator:
    def __init__(self, recipe: Recipe, graphdef: nnx.GraphDef, held_out: EvalSource) -> None:
        self.batches = eval_windows(held_out, recipe.eval.batches, recipe.eval.batch_size, recipe.learners.seq_len)
        self.bytes_per_token = eval_bytes_per_token(held_out)
        self._eval_step = make_eval_step(graphdef)

    def __call__(self, params: Params) -> tuple[float, float]:
        """(mean cross-entropy in nats per token, bits per byte of the text)."""
        losses = [self._eval_step(params, x, y) for x, y in self.batches]
        loss = float(np.mean(jax.device_get(losses)))
        return loss, bits_per_byte(loss, self.bytes_per_token)
