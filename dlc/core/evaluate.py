"""Loss and bits per byte of a model on the fixed held-out windows."""

from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx

from dlc.config.schema import Recipe
from dlc.core.data import eval_batches
from dlc.core.model import Params
from dlc.core.steps import make_eval_step


class Evaluator:
    def __init__(self, recipe: Recipe, graphdef: nnx.GraphDef, eval_bytes: np.ndarray) -> None:
        self.batches = eval_batches(eval_bytes, recipe.eval.batches, recipe.eval.batch_size, recipe.learners.seq_len)
        self._eval_step = make_eval_step(graphdef)

    def __call__(self, params: Params) -> tuple[float, float]:
        """(mean cross-entropy in nats per byte, bits per byte)."""
        losses = [self._eval_step(params, x, y) for x, y in self.batches]
        loss = float(np.mean(jax.device_get(losses)))
        return loss, loss / math.log(2)
