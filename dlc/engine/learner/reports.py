"""What a learner actor has to tell the driver, queued between two of the driver's polls.

The driver never waits on an actor: it polls, and takes everything queued since its last poll.
The loop thread queues each step's events (a checkpoint saved, training begun) and turns the
learner's step records into `train` metrics, one every `run.log_every_steps` steps; the stop
queues the final pushes. One lock keeps the queues and the snapshot a poll takes consistent with
each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dlc.run import events

if TYPE_CHECKING:
    from dlc.core.learner import StepRecord


class Reports:
    """A learner's queued events and train metrics, and its last loss."""

    def __init__(self, log_every_steps: int) -> None:
        self.lock = threading.Lock()  # held by a poll while it takes the queues and the snapshot beside them
        self.events: list[events.Event] = []
        self.metrics: list[dict[str, Any]] = []
        self.loss: float | None = None
        self._every = log_every_steps

    def add(self, happened: list[events.Event]) -> None:
        with self.lock:
            self.events.extend(happened)

    def log(self, index: int | None, take_records: Callable[[], list[StepRecord]], rate: float) -> None:
        """Queue the `train` metrics of the records `take_records` hands over (learner `index`'s), at
        the `rate` in tokens per second the loop measures now."""
        with self.lock:
            for record in take_records():
                self.loss = record.loss
                if record.step % self._every == 0:
                    self.metrics.append(
                        {
                            "kind": "train",
                            "learner": index,
                            "step": record.step,
                            "tokens": record.tokens,
                            "loss": record.loss,
                            "grad_norm": record.grad_norm,
                            "tokens_per_s": round(rate, 1),
                        }
                    )

    def take(self) -> tuple[list[events.Event], list[dict[str, Any]]]:
        """The events and metrics queued since the last call; the caller holds `lock`."""
        happened, self.events = self.events, []
        metrics, self.metrics = self.metrics, []
        return happened, metrics
