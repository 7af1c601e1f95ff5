"""Evaluations of the global model during a run: the one it starts from, periodic ones, the final one.

A periodic one comes every `eval.every_steps` mean learner steps.

The periodic ones run off the critical path: the driver starts one and picks its result up on a
later tick, never waiting for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import ray


class Evaluations:
    def __init__(self, every_steps: int, metric: Callable[..., None], initial: float | None = None) -> None:
        self.every_steps = every_steps
        self.metric = metric  # writes one metrics.jsonl line
        self.initial = initial  # a resumed run keeps the loss it started from
        self.loss: float | None = None
        self.bpb: float | None = None
        self.evaluator: Any = None  # the evaluator actor
        self._ref: Any = None  # the evaluation in flight
        self._step, self._tokens = 0.0, 0
        self._next = every_steps

    def first(self, evaluator: Any, params: Any) -> None:
        """Evaluate the model the run starts from (unless the run it resumes did), and wait for it."""
        self.evaluator = evaluator
        if self.initial is None:
            self.initial, bpb = ray.get(evaluator.evaluate.remote(params))
            self.metric(kind="eval", step=0, tokens=0, eval_loss=self.initial, eval_bpb=bpb)

    def poll(self, step: float, tokens: int, params: Callable[[], Any]) -> None:
        """Record an evaluation that finished; start the next when the mean step passes its mark."""
        if self._ref is not None:
            ready, _ = ray.wait([self._ref], timeout=0)
            if not ready:
                return
            ref, self._ref = self._ref, None
            try:
                self.loss, self.bpb = ray.get(ref)
            except ray.exceptions.RayError:  # the syncer died while serving the parameters
                return
            self.metric(
                kind="eval", step=round(self._step, 1), tokens=self._tokens, eval_loss=self.loss, eval_bpb=self.bpb
            )
        if step >= self._next:
            self._next = (int(step) // self.every_steps + 1) * self.every_steps
            self._step, self._tokens = step, tokens
            self._ref = self.evaluator.evaluate.remote(params())

    def final(self, params: Any, step: float, tokens: int) -> None:
        """The end of the run: let the one in flight finish, then evaluate the final model."""
        if self._ref is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(self._ref)
        self.loss, self.bpb = ray.get(self.evaluator.evaluate.remote(params), timeout=300)
        self.metric(kind="eval", step=round(step, 1), tokens=tokens, eval_loss=self.loss, eval_bpb=self.bpb, final=True)
