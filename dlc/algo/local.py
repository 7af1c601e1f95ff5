"""Decoupled DiLoCo with every learner and the syncer in one process, stepped in turn.

No Ray, no threads, no wall clock: a deterministic twin of the engine for tests and for tuning
the outer optimizer quickly. Messages still pass through `Transport`, so bytes are counted the
same way. Two ways to drive it: `step_all` steps every learner once, in lock-step; `run_until`
plays the learners on a fake clock, each at its own pace from its own start time, and can
freeze one for a while, as the real engine's learners drift apart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dlc.algo import get_algorithm
from dlc.algo.protocol import LearnerSync, Syncer
from dlc.config.schema import Recipe
from dlc.core.evaluate import Evaluator
from dlc.core.learner import Learner
from dlc.core.model import flatten_params, unflatten_params
from dlc.data.plan import DataPlan
from dlc.net.transport import RemoteMethod, Transport


@dataclass(frozen=True)
class _Call:
    """A function of this process where the engine calls an actor's method (`RemoteMethod`):
    `.remote(x)` calls it at once, so the twin's messages still pass through `Transport`."""

    fn: Callable[..., Any]

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


@dataclass(frozen=True)
class _Upstream:
    """The syncer as an algorithm's learner side is handed it (`Algorithm.learner_sync`): its `push`."""

    push: RemoteMethod


class InProcessRun:
    """M learners and one syncer on one fake clock.

    `paces_s[i]` is learner i's step time (default `step_time_s` for all) and `starts_s[i]` when it
    starts stepping (default 0): its k-th step ends at `starts_s[i] + k * paces_s[i]`.
    """

    def __init__(
        self,
        recipe: Recipe,
        data: DataPlan,
        step_time_s: float = 0.1,
        paces_s: Sequence[float] | None = None,
        starts_s: Sequence[float] | None = None,
    ) -> None:
        if recipe.algorithm not in ("decoupled", "none"):
            raise ValueError(f"the in-process twin steps learners in turn; algorithm {recipe.algorithm} blocks")
        algorithm = get_algorithm(recipe.algorithm)
        count = recipe.learners.count
        self.recipe = recipe
        self.now = 0.0  # the twin's clock
        self.step_time_s = step_time_s
        self.paces_s = list(paces_s) if paces_s is not None else [step_time_s] * count
        starts = list(starts_s) if starts_s is not None else [0.0] * count
        if len(self.paces_s) != count or len(starts) != count or min(self.paces_s) <= 0:
            raise ValueError(f"need {count} positive paces and {count} start times")
        self._next_s = [start + pace for start, pace in zip(starts, self.paces_s, strict=True)]
        self._frozen: dict[int, tuple[float, float]] = {}
        self._never = threading.Event()  # the stop a step is given: the twin stops between steps
        self.learners = [Learner(recipe, i, data.streams[i]) for i in range(count)]
        # Host copies: the learners' own arrays are donated to their next step.
        self.initial = flatten_params(self.learners[0].params)
        self.like = unflatten_params(self.initial, self.learners[0].params)
        self.syncs: list[LearnerSync] = []
        self.syncer: Syncer = algorithm.syncer(recipe, self.initial, self._deliver, lambda: self.now)
        upstream = _Upstream(_Call(self.syncer.push))
        for learner in self.learners:
            self.syncs.append(algorithm.learner_sync(recipe, learner, Transport(), upstream))
            self.syncer.join(learner.index)
        self.down = Transport()
        self.evaluator = Evaluator(recipe, self.learners[0].graphdef, data.eval)

    def _deliver(self, learner: int, message: Any) -> int:
        return self.down.send(_Call(self.syncs[learner].receive), message)

    def _step(self, index: int) -> None:
        learner = self.learners[index]
        # One step of the learner's loop as the actor runs it: train, then push and adopt what is due.
        # Nothing here waits on other learners (blocking algorithms are refused above), so `step`
        # is never asked to stop.
        self.syncs[index].step(self._never)
        learner.take_records()  # the twin keeps no per-step log
        self.syncer.heartbeat(index, learner.step)

    def step_all(self) -> None:
        """Every learner takes one step; then the clock moves on by `step_time_s` and the syncer ticks."""
        for index in range(len(self.learners)):
            self._step(index)
        self.now += self.step_time_s
        self.syncer.tick()

    def freeze(self, index: int, from_s: float, until_s: float) -> None:
        """Learner `index` neither steps nor heartbeats between `from_s` and `until_s` (a SIGSTOP)."""
        self._frozen[index] = (from_s, until_s)

    def run_until(self, until_s: float) -> int:
        """Play every learner at its own pace until `until_s`; the syncer ticks whenever time moves on.

        Returns how many steps were taken, all learners together.
        """
        steps = 0
        while True:
            index = min(range(len(self.learners)), key=lambda i: (self._next_s[i], i))
            at = self._next_s[index]
            if at > until_s:
                break
            frozen_from, frozen_until = self._frozen.get(index, (0.0, 0.0))
            if frozen_from <= at < frozen_until:  # the step in progress ends after the thaw
                self._next_s[index] = frozen_until + self.paces_s[index]
                continue
            if at > self.now:  # every step that ended at the old time is in: the syncer acts on them
                self.syncer.tick()
                self.now = at
            self._step(index)
            self._next_s[index] = at + self.paces_s[index]
            steps += 1
        self.syncer.tick()
        self.now = until_s
        self.syncer.tick()
        return steps

    def finish_learner(self, index: int) -> None:
        """Learner `index` ends: its last steps computed, every fragment with progress pushed."""
        self.learners[index].flush()
        self.syncs[index].push_outstanding()

    def finish(self) -> None:
        for index in range(len(self.learners)):
            self.finish_learner(index)
        self.syncer.flush()

    def global_eval(self) -> float:
        flat = self.syncer.global_params(self.initial)
        return self.evaluator(unflatten_params(flat, self.like))[0]

    def learner_eval(self, index: int) -> float:
        return self.evaluator(self.learners[index].params)[0]
