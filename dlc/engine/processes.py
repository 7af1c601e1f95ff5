"""The run's Ray processes as the driver makes them: the syncer, the evaluator, learners and hot spares.

Each gets its device and environment from `devices` and its node from `placement`, and the node
agents (`agent`) wait beside them for chaos's signals. One recipe makes all of them, so a syncer
started again after a death is made exactly as the first one was.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray

from dlc.config.schema import Recipe
from dlc.engine import devices
from dlc.engine.learner.actor import LearnerActor
from dlc.engine.placement import Placement
from dlc.engine.supervision.agent import Agents
from dlc.engine.syncer.actor import SyncerActor
from dlc.engine.syncer.evaluator import EvaluatorActor
from dlc.errors import UserError
from dlc.run.rundir import RunDir


class Processes:
    """Makes the run's actors; holds the placement they share and the node agents."""

    def __init__(self, recipe: Recipe, rundir: RunDir, driver_node: str) -> None:
        self.recipe = recipe
        self.recipe_json = recipe.model_dump(mode="json")
        self.run_dir = str(rundir.path.absolute())  # workers on other nodes do not share our working directory
        self.storage = {"location": rundir.storage.location, "token": rundir.storage_token}
        self.inherited = devices.inherited_env(recipe.cluster)
        self.placement = Placement(recipe, driver_node)
        self.agents = Agents()

    def syncer(self) -> Any:
        options = {**devices.syncer_setup(self.recipe).ray_options(self.inherited), **self.placement.syncer()}
        return SyncerActor.options(**options).remote(self.recipe_json, self.run_dir, self.storage)

    def evaluator(self, held_out: Any) -> Any:
        options = {**devices.evaluator_setup(self.recipe).ray_options(self.inherited), **self.placement.evaluator()}
        return EvaluatorActor.options(**options).remote(self.recipe_json, ray.put(held_out))

    def learner(self, index: int, stream: Any, syncer: Any, incarnation: int = 0) -> Any:
        """Learner `index` reading `stream` (an ObjectRef) and pushing to `syncer`, as its `incarnation`-th process."""
        return LearnerActor.options(**self._learner_options(index)).remote(
            self.recipe_json, index, stream, self.storage, syncer, incarnation, time.time()
        )

    def spare(self, requested_at: float, syncer: Any) -> Any:
        """A hot spare, on the learners' defaults; `requested_at` is when its process was asked for."""
        return LearnerActor.options(**self._learner_options(None)).remote(
            self.recipe_json, None, None, self.storage, syncer, 0, requested_at
        )

    def _learner_options(self, index: int | None) -> dict[str, Any]:
        return {
            **devices.learner_setup(self.recipe, index).ray_options(self.inherited),
            **self.placement.learner(index),
        }

    def release(self) -> None:
        """Give back the placement group and the node agents (before the cluster goes, if it is ours)."""
        with contextlib.suppress(ray.exceptions.RayError):
            self.agents.stop()
            self.placement.close()


def storage_usable(errors: list[str | None]) -> None:
    """UserError with the first process that cannot use the run's storage (it names its node)."""
    problem = next((e for e in errors if e), None)
    if problem is not None:
        raise UserError(problem)
