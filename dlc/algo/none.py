"""`algorithm: none`: independent learners that never synchronise (the overhead baseline)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dlc.config.schema import Recipe
from dlc.core.fragments import FragmentPlan, shapes_of
from dlc.run import events

if TYPE_CHECKING:
    from dlc.core.learner import Learner


class NoSync:
    """Learner side of `none`: never sends anything."""

    pushes = 0
    adopted = 0
    discarded_steps = 0.0
    seq = 0
    incarnation = 0
    waiting_s = 0.0
    idle: Callable[[], object] | None = None
    beat_at = float("-inf")

    def __init__(self, recipe: Recipe, learner: Learner, *args: Any) -> None:
        self.learner = learner

    def step(self, stop: threading.Event) -> list[events.Event]:
        self.learner.train_step()
        return []

    def after_step(self) -> list[events.Event]:
        return []

    def receive(self, message: Any) -> None:
        raise AssertionError("algorithm none delivers no messages")

    def compile(self) -> None:
        self.learner.compile()

    def start_background(self) -> None:
        """Nothing runs off the loop's thread here."""

    def push_outstanding(self) -> list[events.Event]:
        return []

    def adopt_lag_steps(self) -> float | None:
        return None  # nothing is ever merged

    def unpushed_steps(self) -> float:
        return 0.0

    def reconnect(self, push: Any) -> int:
        return 0

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        pass

    def resume_from_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass

    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass

    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass

    def peer_view(self) -> tuple[list[np.ndarray], list[int]]:
        return [], []


def null_syncer(
    recipe: Recipe, initial: dict[str, np.ndarray], deliver: Callable[..., int], clock: Callable[[], float]
) -> Any:
    """The decoupled syncer with one fragment that nobody pushes to: versions stay 0, no round closes."""
    from dlc.algo.decoupled.schedule import NoRounds
    from dlc.algo.decoupled.syncer import DecoupledSyncer

    plan = FragmentPlan.build(shapes_of(initial), 1)
    return DecoupledSyncer(recipe, plan, initial, deliver, clock, NoRounds.from_recipe(recipe, 1))
