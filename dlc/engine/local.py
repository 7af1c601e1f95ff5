"""Decoupled DiLoCo with every learner and the syncer in one process, stepped in turn.

No Ray, no threads, no wall clock: a deterministic twin of the engine for tests and for tuning
the outer optimizer quickly. Messages still pass through `Transport`, so bytes are counted the
same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlc.algo import get_algorithm
from dlc.config.schema import Recipe
from dlc.core.data import Split
from dlc.core.evaluate import Evaluator
from dlc.core.learner import Learner
from dlc.core.model import flatten_params, unflatten_params
from dlc.net.transport import Transport


@dataclass
class Direct:
    """Stands in for a Ray actor method: `.remote(x)` calls the function now."""

    fn: Callable[[Any], Any]

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class InProcessRun:
    """M learners and one syncer; `step_all` advances every learner by one inner step."""

    def __init__(self, recipe: Recipe, split: Split, step_time_s: float = 0.1) -> None:
        if recipe.algorithm not in ("decoupled", "none"):
            raise ValueError(f"the in-process twin steps learners in turn; algorithm {recipe.algorithm} blocks")
        algorithm = get_algorithm(recipe.algorithm)
        self.recipe = recipe
        self.now = 0.0  # the twin's clock: step_all advances it by step_time_s
        self.step_time_s = step_time_s
        self.learners = [Learner(recipe, i, split.streams[i]) for i in range(recipe.learners.count)]
        # Host copies: the learners' own arrays are donated to their next step.
        self.initial = flatten_params(self.learners[0].params)
        self.like = unflatten_params(self.initial, self.learners[0].params)
        self.syncs: list[Any] = []
        self.syncer = algorithm.syncer(recipe, self.initial, self._deliver, lambda: self.now)
        push = Direct(self.syncer.push)
        for learner in self.learners:
            self.syncs.append(algorithm.learner_sync(recipe, learner, Transport(), type("S", (), {"push": push})))
            self.syncer.join(learner.index)
        self.down = Transport()
        self.evaluator = Evaluator(recipe, self.learners[0].graphdef, split.eval_bytes)

    def _deliver(self, learner: int, message: Any) -> int:
        return self.down.send(Direct(self.syncs[learner].receive), message)

    def step_all(self) -> None:
        for learner, sync in zip(self.learners, self.syncs, strict=True):
            learner.train_step()
            learner.take_records()  # the twin keeps no per-step log
            sync.after_step()
            self.syncer.heartbeat(learner.index)
        self.now += self.step_time_s
        self.syncer.tick()

    def finish(self) -> None:
        for learner, sync in zip(self.learners, self.syncs, strict=True):
            learner.flush()
            sync.push_outstanding()
        self.syncer.flush()

    def global_eval(self) -> float:
        flat = self.syncer.global_params(self.initial)
        return self.evaluator(unflatten_params(flat, self.like))[0]

    def learner_eval(self, index: int) -> float:
        return self.evaluator(self.learners[index].params)[0]


def evaluate_flat(evaluator: Evaluator, flat: dict[str, np.ndarray], like: Any) -> float:
    return evaluator(unflatten_params(flat, like))[0]
