"""Hot spares: learner processes started and compiled beside the learners, idle, holding no data.

With `learners.spares: N` the pool keeps N of them started or starting. A dead learner's slot is
taken over by the readiest one (`take`), which skips the process start and the compilation, and a
new spare is started behind it. Their idle time is filed apart in the ledger (`spare_s`): reserved,
not allocated to any learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from dlc.config.schema import Recipe
from dlc.engine.devices import same_setup
from dlc.observe.goodput import Ledger
from dlc.run import events
from dlc.run.rundir import RunDir


@dataclass
class Spare:
    """A hot spare: a learner process started and compiled, waiting for a slot."""

    name: str
    actor: Any
    requested_at: float  # wall time its process was asked for
    view: dict[str, Any] = field(default_factory=dict)
    poll: Any = None
    ticked_at: float = field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        return self.view.get("phase") == "ready"


class SparePool:
    """The run's hot spares; `make_spare(requested_at)` starts the process of a new one."""

    def __init__(self, recipe: Recipe, rundir: RunDir, make_spare: Callable[[float], Any] | None) -> None:
        self.recipe = recipe
        self.rundir = rundir
        self.make_spare = make_spare
        self.spares: list[Spare] = []
        self.started = 0
        self.failure: str | None = None

    def keep(self) -> None:
        """Start spares until `learners.spares` are started or starting."""
        while self.make_spare is not None and len(self.spares) < self.recipe.learners.spares:
            name = f"s{self.started}"
            self.started += 1
            requested = time.time()
            self.spares.append(Spare(name, self.make_spare(requested), requested, view={"phase": "starting process"}))
            self.rundir.event(events.SpareStarted(spare=name))

    def poll(self) -> None:
        """Take in each spare's answer to its last poll without waiting; replace the dead ones."""
        for spare in list(self.spares):
            if spare.poll is None:
                spare.poll = spare.actor.poll.remote()
            ready, _ = ray.wait([spare.poll], timeout=0)
            if not ready:
                continue
            ref, spare.poll = spare.poll, None
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:
                self.spares.remove(spare)
                self.rundir.event(events.SpareDied(spare=spare.name))
                continue
            was_ready, spare.view = spare.ready, result["snapshot"]
            if result["error"]:
                self.failure = f"hot spare {spare.name} failed:\n{result['error']}"
            if spare.ready and not was_ready:
                self.rundir.event(
                    events.SpareReady(
                        spare=spare.name,
                        after_s=round(time.time() - spare.requested_at, 3),
                        device=spare.view.get("device"),
                        **spare.view["startup"],
                    )
                )
        self.keep()

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "id": s.name,
                "state": "spare",
                "phase": s.view.get("phase"),
                "startup": s.view.get("startup", {}),
                "device": s.view.get("device"),
            }
            for s in self.spares
        ]

    def take(self, index: int) -> Spare | None:
        """The readiest spare (compiled first), taken out of the pool; None if there is none, or if
        learner `index` runs elsewhere than the spares (another device or share: a new process)."""
        if not self.spares or not same_setup(self.recipe, index, None):
            return None
        spare = max(self.spares, key=lambda s: s.ready)
        self.spares.remove(spare)
        return spare

    def file_time(self, ledger: Ledger, now: float) -> None:
        """File each spare's idle time since the last call as reserved."""
        for spare in self.spares:
            ledger.reserve(now - spare.ticked_at)
            spare.ticked_at = now

    def stop(self) -> None:
        for spare in self.spares:  # idle processes: nothing to save
            ray.kill(spare.actor)
        self.spares.clear()
