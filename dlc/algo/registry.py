"""The registry of training algorithms, chosen once from `recipe.algorithm`.

An algorithm supplies the learner's side of synchronisation (its `step` is one step of the
learner's loop: train, and send or receive what is due) and the syncer; the loops in `engine`
never ask which algorithm they run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dlc.config.schema import Recipe
from dlc.core.fragments import FragmentPlan, shapes_of

if TYPE_CHECKING:  # the driver consults the registry without importing JAX
    from dlc.core.learner import Learner
    from dlc.net.transport import Transport


class LearnerSync(Protocol):
    pushes: int
    adopted: int
    waiting_s: float  # time the loop spent blocked on the network or on other learners
    idle: Callable[[], None] | None  # called now and then while blocked

    def step(self, stop: threading.Event) -> list[dict[str, Any]]: ...
    def receive(self, message: Any) -> None: ...
    def push_outstanding(self) -> int: ...
    def unpushed_steps(self) -> float: ...
    def reconnect(self, push: Any) -> int: ...
    def state(self) -> tuple[dict[str, Any], dict[str, Any]]: ...
    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None: ...
    def rebase_on_global(self, fragments: list[np.ndarray], versions: list[int]) -> None: ...
    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None: ...
    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None: ...
    def peer_view(self) -> tuple[list[np.ndarray], list[int]]: ...


@dataclass(frozen=True)
class Algorithm:
    name: str
    learner_sync: Callable[[Recipe, Learner, Transport, Any], LearnerSync]
    syncer: Callable[[Recipe, dict[str, np.ndarray], Callable[..., int], Callable[[], float]], Any]
    global_model: bool = True  # False: there is nothing global to evaluate


class NoSync:
    """Learner side of `none`: never sends anything."""

    pushes = 0
    adopted = 0
    waiting_s = 0.0
    idle = None

    def __init__(self, recipe: Recipe, learner: Learner, *args: Any) -> None:
        self.learner = learner

    def step(self, stop: threading.Event) -> list[dict[str, Any]]:
        self.learner.train_step()
        return []

    def after_step(self) -> list[dict[str, Any]]:
        return []

    def receive(self, message: Any) -> None:
        raise AssertionError("algorithm none delivers no messages")

    def push_outstanding(self) -> int:
        return 0

    def unpushed_steps(self) -> float:
        return 0.0

    def reconnect(self, push: Any) -> int:
        return 0

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        pass

    def rebase_on_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass

    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass

    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass

    def peer_view(self) -> tuple[list[np.ndarray], list[int]]:
        return [], []


def fragment_plan(recipe: Recipe, shapes: dict[str, tuple[int, ...]]) -> FragmentPlan:
    return FragmentPlan.build(shapes, recipe.syncer.fragments)


def _decoupled_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.decoupled.learner import DecoupledLearnerSync
    from dlc.core.model import flatten_params

    plan = fragment_plan(recipe, shapes_of(flatten_params(learner.params)))
    return DecoupledLearnerSync(recipe, learner, plan, transport, syncer.push)


def _decoupled_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Any:
    from dlc.algo.decoupled.syncer import Syncer

    return Syncer(recipe, fragment_plan(recipe, shapes_of(initial)), initial, deliver, clock)


def _null_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Any:
    from dlc.algo.decoupled.syncer import Syncer

    # One fragment, never pushed to: versions stay 0 and no round ever closes.
    return Syncer(recipe, FragmentPlan.build(shapes_of(initial), 1), initial, deliver, clock)


def _barrier_syncer(combiner: str) -> Callable[..., Any]:
    def make(
        recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
    ) -> Any:
        from dlc.algo.blocking.syncer import AdamWStep, BarrierSyncer, OuterStep

        if combiner == "adamw":  # dp: gradients up and the model down in dp_codec, weighted as one batch
            codec = recipe.blocking.dp_codec
            return BarrierSyncer(recipe, initial, deliver, clock, AdamWStep, codec, codec, "tokens")
        sync = recipe.syncer
        return BarrierSyncer(recipe, initial, deliver, clock, OuterStep, sync.codec, sync.down_codec, sync.weighting)

    return make


def _dp_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.blocking.learner import DataParallelSync

    return DataParallelSync(recipe, learner, transport, syncer)


def _diloco_learner(recipe: Recipe, learner: Learner, transport: Transport, syncer: Any) -> LearnerSync:
    from dlc.algo.blocking.learner import BlockingDiLoCoSync

    return BlockingDiLoCoSync(recipe, learner, transport, syncer)


ALGORITHMS: dict[str, Algorithm] = {
    "decoupled": Algorithm("decoupled", _decoupled_learner, _decoupled_syncer),
    # Blocking baselines: every step (dp) or every H steps (diloco) all learners send and wait.
    "dp": Algorithm("dp", _dp_learner, _barrier_syncer("adamw")),
    "diloco": Algorithm("diloco", _diloco_learner, _barrier_syncer("outer")),
    # Independent learners, no synchronisation: the baseline for overhead measurements.
    "none": Algorithm("none", NoSync, _null_syncer, global_model=False),
}


def get_algorithm(name: str) -> Algorithm:
    return ALGORITHMS[name]
