"""The registry of training algorithms, chosen once from `recipe.algorithm`.

An algorithm supplies the learner's side of synchronisation, the syncer, and its traffic (see
`dlc.algo.protocol`); the engine's loops never ask which algorithm they run. Importing the
registry imports neither JAX nor an algorithm's implementation: the factories import lazily.

- decoupled/: Decoupled DiLoCo (fragments, rounds on a quorum and a grace window, no waiting);
- blocking/: the baselines that wait, dp (every step) and diloco (every H steps);
- none.py: independent learners, the overhead baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dlc.algo.protocol import LearnerSync, Syncer, Traffic
from dlc.config.schema import Recipe
from dlc.core.fragments import FragmentPlan, shapes_of

if TYPE_CHECKING:  # the driver consults the registry without importing JAX
    from dlc.core.learner import Learner
    from dlc.net.transport import Transport

MakeLearnerSync = Callable[[Recipe, "Learner", "Transport", Any], LearnerSync]
MakeSyncer = Callable[[Recipe, dict[str, np.ndarray], Callable[..., int], Callable[[], float]], Syncer]


@dataclass(frozen=True)
class Algorithm:
    name: str
    learner_sync: MakeLearnerSync
    syncer: MakeSyncer
    traffic: Callable[[Recipe], Traffic]
    global_model: bool = True  # False: there is nothing global to evaluate


# -- decoupled ---------------------------------------------------------------------------------


def _decoupled_traffic(recipe: Recipe) -> Traffic:
    sync = recipe.syncer
    return Traffic(sync.fragments, sync.sync_interval_steps, sync.codec, sync.down_codec)


def _decoupled_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.decoupled.learner import DecoupledLearnerSync
    from dlc.core.model import flatten_params

    traffic = _decoupled_traffic(recipe)
    plan = FragmentPlan.build(shapes_of(flatten_params(learner.params)), traffic.fragments)
    return DecoupledLearnerSync(recipe, learner, plan, transport, syncer.push, traffic)


def _decoupled_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Syncer:
    from dlc.algo.decoupled.syncer import DecoupledSyncer

    plan = FragmentPlan.build(shapes_of(initial), _decoupled_traffic(recipe).fragments)
    return DecoupledSyncer(recipe, plan, initial, deliver, clock)


# -- blocking baselines: every step (dp) or every H steps (diloco) all learners send and wait ---


def _dp_traffic(recipe: Recipe) -> Traffic:
    # Gradients up and the model down, whole, every step.
    return Traffic(1, 1, recipe.blocking.dp_codec, recipe.blocking.dp_codec)


def _diloco_traffic(recipe: Recipe) -> Traffic:
    sync = recipe.syncer
    # The whole model goes down as values: differences from the learner's version (int8/int4) are
    # the decoupled syncer's; blocking DiLoCo sends those recipes' models in bf16.
    down = sync.down_codec if sync.down_codec in ("none", "bf16") else "bf16"
    return Traffic(1, sync.sync_interval_steps, sync.codec, down)


def _dp_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.blocking.learner import DataParallelSync

    return DataParallelSync(recipe, learner, transport, syncer, _dp_traffic(recipe))


def _diloco_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.blocking.learner import BlockingDiLoCoSync

    return BlockingDiLoCoSync(recipe, learner, transport, syncer, _diloco_traffic(recipe))


def _dp_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Syncer:
    from dlc.algo.blocking.syncer import AdamWStep, BarrierSyncer

    t = _dp_traffic(recipe)  # weighted as one batch: the mean gradient of the concatenated batches
    return BarrierSyncer(recipe, initial, deliver, clock, AdamWStep, t.up_codec, t.down_codec, "tokens")


def _diloco_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Syncer:
    from dlc.algo.blocking.syncer import BarrierSyncer, OuterStep

    t = _diloco_traffic(recipe)
    return BarrierSyncer(recipe, initial, deliver, clock, OuterStep, t.up_codec, t.down_codec, recipe.syncer.weighting)


# -- none --------------------------------------------------------------------------------------


def _none_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.none import NoSync

    return NoSync(recipe, learner)


def _none_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Syncer:
    from dlc.algo.none import null_syncer

    return null_syncer(recipe, initial, deliver, clock)


ALGORITHMS: dict[str, Algorithm] = {
    "decoupled": Algorithm("decoupled", _decoupled_learner, _decoupled_syncer, _decoupled_traffic),
    "dp": Algorithm("dp", _dp_learner, _dp_syncer, _dp_traffic),
    "diloco": Algorithm("diloco", _diloco_learner, _diloco_syncer, _diloco_traffic),
    "none": Algorithm(
        "none", _none_learner, _none_syncer, lambda recipe: Traffic(1, 1, "none", "none", sends=False), False
    ),
}


def get_algorithm(name: str) -> Algorithm:
    return ALGORITHMS[name]
