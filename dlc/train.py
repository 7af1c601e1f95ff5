"""`dlc train`: run a recipe to its stop condition, with logs, checkpoints and a live view."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from dlc.checkpoint import Checkpointer
from dlc.data import load_corpus, split_corpus
from dlc.errors import UserError
from dlc.evaluate import Evaluator
from dlc.learner import Learner, StepRecord
from dlc.model import count_params
from dlc.progress import ProgressView
from dlc.recipe import Recipe
from dlc.rundir import RunDir

EXIT_INTERRUPTED = 130


class StopRequest:
    """Turns the first Ctrl-C into a request to stop at the next step boundary.

    A second Ctrl-C interrupts at once (KeyboardInterrupt), for a run that does not react.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


@dataclass
class Outcome:
    """What `run` returns to the CLI."""

    status: str  # completed | interrupted | failed
    summary: dict[str, Any]
    run_dir: str
    exit_code: int = 0
    notes: list[str] = field(default_factory=list)


class Budget:
    """The recipe's stop condition and how far along it the run is (0..1)."""

    def __init__(self, recipe: Recipe) -> None:
        self.max_steps = recipe.run.max_steps
        self.max_tokens = recipe.run.max_tokens
        self.max_wall_s = recipe.run.max_wall_s

    def progress(self, step: int, tokens: int, wall_s: float) -> float:
        fractions = [
            value / limit
            for value, limit in ((step, self.max_steps), (tokens, self.max_tokens), (wall_s, self.max_wall_s))
            if limit
        ]
        return min(1.0, max(fractions))


def run(recipe: Recipe, fresh: bool = False, view: ProgressView | None = None) -> Outcome:
    """Train one learner on the recipe until its stop condition, Ctrl-C, or an error."""
    if recipe.learners.count != 1:
        raise UserError(
            f"learners.count={recipe.learners.count}: this build trains a single learner; set learners.count=1"
        )
    view = view or ProgressView(log_every_steps=recipe.run.log_every_steps)
    corpus = load_corpus(recipe.data)
    min_bytes = recipe.learners.batch_size_of(0) * (recipe.learners.seq_len + 1) * 2
    split = split_corpus(corpus, recipe.data, recipe.learners.count, recipe.run.seed, min_bytes)
    rundir, resume = RunDir.prepare(recipe, fresh)
    try:
        return _train(recipe, rundir, resume, split, len(corpus), view)
    finally:
        rundir.close()


def _train(recipe: Recipe, rundir: RunDir, resume: bool, split: Any, corpus_bytes: int, view: ProgressView) -> Outcome:
    started = time.time()
    learner = Learner(recipe, 0, split.streams[0])
    evaluator = Evaluator(recipe, learner.graphdef, split.eval_bytes)
    checkpointer = Checkpointer(rundir.checkpoint_dir, recipe.checkpoint.keep)
    budget = Budget(recipe)
    prior_wall_s, eval_initial = 0.0, None
    if resume:
        tree, meta = checkpointer.restore(learner.state_tree())
        learner.load_state(tree, meta)
        prior_wall_s, eval_initial = float(meta.get("wall_s", 0.0)), meta.get("eval_loss_initial")
        rundir.event("run_resumed", step=learner.step, tokens=learner.tokens, data_position=learner.stream.position)
        view.message(f"resumed {rundir.path} at step {learner.step} (data position {learner.stream.position})")
    rundir.event(
        "run_started",
        run_dir=str(rundir.path),
        params=count_params(learner.params),
        corpus_bytes=corpus_bytes,
        eval_bytes=len(split.eval_bytes),
        resumed=resume,
    )
    rundir.event("learner_started", learner=0, step=learner.step, pid=_pid())

    def wall_s() -> float:
        return prior_wall_s + time.time() - started

    def save_checkpoint() -> None:
        learner.flush()
        meta = {**learner.state_meta(), "wall_s": wall_s(), "eval_loss_initial": eval_initial}
        checkpointer.save(learner.step, learner.state_tree(), meta)
        rundir.event("checkpoint_saved", step=learner.step, data_position=learner.stream.position)

    state: dict[str, Any] = {"eval_loss": None, "eval_bpb": None, "train_loss": None, "tokens_per_s": 0.0}

    def evaluate() -> None:
        loss, bpb = evaluator(learner.params)
        state.update(eval_loss=loss, eval_bpb=bpb)
        rundir.metric(kind="eval", step=learner.step, tokens=learner.tokens, eval_loss=loss, eval_bpb=bpb)

    if eval_initial is None:
        evaluate()
        eval_initial = state["eval_loss"]

    status, exit_code = "failed", 1
    rate = _Rate()
    session_start_tokens = learner.tokens
    last_status = 0.0
    try:
        with StopRequest() as stop, view:
            while budget.progress(learner.step, learner.tokens, wall_s()) < 1.0 and not stop.requested:
                record = learner.train_step()
                if record is not None:
                    _on_record(record, recipe, rundir, state, rate)
                if learner.step % recipe.eval.every_steps == 0:
                    evaluate()
                if learner.step % recipe.checkpoint.every_steps == 0:
                    save_checkpoint()
                if time.time() - last_status >= recipe.run.status_interval_s:
                    last_status = time.time()
                    snap = _snapshot(recipe, rundir, learner, state, budget, wall_s(), "running")
                    rundir.write_status(snap)
                    view.update(snap)
            record = learner.flush()
            if record is not None:
                _on_record(record, recipe, rundir, state, rate)
            status, exit_code = ("interrupted", EXIT_INTERRUPTED) if stop.requested else ("completed", 0)
            if stop.requested:
                view.message("interrupted: writing a checkpoint")
            else:
                evaluate()
    except KeyboardInterrupt:
        status, exit_code = "interrupted", EXIT_INTERRUPTED
    finally:
        if status in ("completed", "interrupted"):
            save_checkpoint()
        tokens_this_session = learner.tokens - session_start_tokens
        elapsed = time.time() - started
        summary = {
            "status": status,
            "run": recipe.run.name,
            "run_dir": str(rundir.path),
            "wall_s": round(wall_s(), 3),
            "steps": learner.step,
            "tokens_total": learner.tokens,
            "tokens_per_s": round(tokens_this_session / elapsed, 1) if elapsed > 0 else 0.0,
            "params": count_params(learner.params),
            "eval_loss_initial": eval_initial,
            "eval_loss_final": state["eval_loss"],
            "eval_bpb_final": state["eval_bpb"],
            "data_position": learner.stream.position,
        }
        rundir.write_status(_snapshot(recipe, rundir, learner, state, budget, wall_s(), status))
        rundir.write_summary(summary)
        rundir.event("learner_stopped", learner=0, step=learner.step, reason=status)
        rundir.event("run_finished", status=status, step=learner.step, tokens=learner.tokens)
        checkpointer.close()
    return Outcome(status=status, summary=summary, run_dir=str(rundir.path), exit_code=exit_code)


class _Rate:
    """Tokens per second over the last few seconds."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.points: list[tuple[float, int]] = []

    def add(self, tokens: int) -> float:
        now = time.monotonic()
        self.points.append((now, tokens))
        while len(self.points) > 2 and now - self.points[0][0] > self.window_s:
            self.points.pop(0)
        (t0, k0), (t1, k1) = self.points[0], self.points[-1]
        return (k1 - k0) / (t1 - t0) if t1 > t0 else 0.0


def _on_record(record: StepRecord, recipe: Recipe, rundir: RunDir, state: dict[str, Any], rate: _Rate) -> None:
    state["train_loss"] = record.loss
    state["tokens_per_s"] = rate.add(record.tokens)
    if not math.isfinite(record.loss):
        raise FloatingPointError(f"train loss is {record.loss} at step {record.step}: lower inner.lr")
    if record.step % recipe.run.log_every_steps == 0:
        rundir.metric(
            kind="train",
            learner=0,
            step=record.step,
            tokens=record.tokens,
            loss=record.loss,
            grad_norm=record.grad_norm,
            tokens_per_s=state["tokens_per_s"],
        )


def _snapshot(
    recipe: Recipe,
    rundir: RunDir,
    learner: Learner,
    state: dict[str, Any],
    budget: Budget,
    wall_s: float,
    run_state: str,
) -> dict[str, Any]:
    progress = budget.progress(learner.step, learner.tokens, wall_s)
    rate = state["tokens_per_s"]
    eta = None
    if budget.max_tokens and rate > 0:
        eta = max(0.0, (budget.max_tokens - learner.tokens) / rate)
    if budget.max_steps and rate > 0:
        steps_eta = (budget.max_steps - learner.step) * learner.tokens_per_step / rate
        eta = steps_eta if eta is None else min(eta, steps_eta)
    if budget.max_wall_s:
        eta = budget.max_wall_s - wall_s if eta is None else min(eta, budget.max_wall_s - wall_s)
    return {
        "run": recipe.run.name,
        "run_dir": str(rundir.path),
        "state": run_state,
        "updated_at": round(time.time(), 3),
        "elapsed_s": round(wall_s, 3),
        "progress": round(progress, 4),
        "eta_s": None if eta is None else round(max(eta, 0.0), 1),
        "step": learner.step,
        "tokens": learner.tokens,
        "tokens_per_s": round(rate, 1),
        "train_loss": state["train_loss"],
        "eval_loss": state["eval_loss"],
        "eval_bpb": state["eval_bpb"],
        "learners": [
            {
                "id": learner.index,
                "state": "training" if run_state == "running" else run_state,
                "step": learner.step,
                "tokens": learner.tokens,
                "tokens_per_s": round(rate, 1),
                "loss": state["train_loss"],
                "data_position": learner.stream.position,
            }
        ],
    }


def _pid() -> int:
    import os

    return os.getpid()
