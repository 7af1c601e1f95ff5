"""Evaluations of the global model during a run: the one it starts from, periodic ones, the final one.

A periodic one comes every `eval.every_steps` mean learner steps.

All run off the critical path: the driver starts one and picks its result up on a later tick,
never waiting for it; the first compiles the evaluation while the learners compile their steps.
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
        self._ref_initial = False  # ... of the model the run starts from
        self._step, self._tokens = 0.0, 0
        self._next = every_steps

    def first(self, evaluator: Any, params: Any) -> None:
        """Start evaluating the model the run starts from (unless the run it resumes did)."""
        self.evaluator = evaluator
        if self.initial is None:
            self._ref, self._ref_initial = evaluator.evaluate.remote(params), True

    def poll(self, step: float, tokens: int, params: Callable[[], Any]) -> None:
        """Record an evaluation that finished; start the next when the mean step passes its mark."""
        if self._ref is not None:
            ready, _ = ray.wait([self._ref], timeout=0)
            if not ready:
                return
            self._record(self._ref)
        if step >= self._next:
            self._next = (int(step) // self.every_steps + 1) * self.every_steps
            self._step, self._tokens = step, tokens
            self._ref = self.evaluator.evaluate.remote(params())

    def _record(self, ref: Any) -> None:
        """Record the evaluation in flight, which has finished or is waited for."""
        self._ref, initial, self._ref_initial = None, self._ref_initial, False
        try:
            loss, bpb = ray.get(ref)
        except ray.exceptions.RayError:  # the syncer died while serving the parameters
            return
        if initial:
            self.initial = loss
            self.metric(kind="eval", step=0, tokens=0, eval_loss=loss, eval_bpb=bpb)
        else:
            self.loss, self.bpb = loss, bpb
            self.metric(kind="eval", step=round(self._step, 1), tokens=self._tokens, eval_loss=loss, eval_bpb=bpb)

    def settle_initial(self) -> None:
        """Wait for the evaluation of the model the run started from, if it is still in flight."""
        if self._ref_initial:
            self._record(self._ref)

    def final(self, params: Any, step: float, tokens: int) -> None:
        """The end of the run: let the one in flight finish, then evaluate the final model."""
        self.settle_initial()
        if self._ref is not None:  # a periodic one: its figures are superseded by the final one's
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(self._ref)
        self.loss, self.bpb = ray.get(self.evaluator.evaluate.remote(params), timeout=300)
        self.metric(kind="eval", step=round(step, 1), tokens=tokens, eval_loss=self.loss, eval_bpb=self.bpb, final=True)
