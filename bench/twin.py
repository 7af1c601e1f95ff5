"""Training to a token budget on the in-process twin, and data-parallel's reference, for quality benches.

`train_twin` plays M learners and the syncer of `dlc.algo.local.InProcessRun` (one process, no
Ray, deterministic) until the learners together have trained the budget, flushes every learner's
last progress into the syncer, and evaluates the global model. `train_dp` is data-parallel with the
same global batch and as many steps: one learner stepping the M learners' summed batch (the mean
gradient of the concatenated batches, which is what `algorithm=dp` computes). Both take the recipe
after overrides, so the model's initialisation and the data's order follow `run.seed` the same way.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")


def _with_steps(recipe: Any, steps: int) -> Any:
    return recipe.model_copy(update={"run": recipe.run.model_copy(update={"max_steps": steps})})


def global_batch(recipe: Any) -> int:
    learners = recipe.learners
    return sum(learners.resolved(i).batch_size for i in range(learners.count))


def dp_learner(recipe_path: str, overrides: Sequence[str], tokens: int) -> tuple[Any, Any, Any, int]:
    """Data-parallel's recipe, data and learner: one learner with the M learners' summed batch, for
    ceil(tokens / global batch tokens) steps (the last item)."""
    from dlc.config.load import load_recipe, replaced_overrides
    from dlc.core.learner import Learner
    from dlc.data.corpus import load_corpus, split_corpus
    from dlc.data.plan import DataPlan

    recipe = load_recipe(recipe_path, list(overrides))
    batch = global_batch(recipe)
    steps = math.ceil(tokens / (batch * recipe.learners.seq_len))
    one = replaced_overrides(
        list(overrides), "learners.count=1", "learners.overrides=[]", f"learners.batch_size={batch}"
    )
    recipe = _with_steps(load_recipe(recipe_path, one), steps)
    data = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, 1, recipe.run.seed, 4096))
    return recipe, data, Learner(recipe, 0, data.streams[0]), steps


def train_dp(recipe_path: str, overrides: Sequence[str], tokens: int) -> dict[str, Any]:
    """Data-parallel: one learner with the summed batch, for ceil(tokens / global batch tokens) steps."""
    from dlc.core.evaluate import Evaluator

    t0 = time.monotonic()
    recipe, data, learner, steps = dp_learner(recipe_path, overrides, tokens)
    for _ in range(steps):
        learner.train_step()
    learner.flush()
    loss = Evaluator(recipe, learner.graphdef, data.eval)(learner.params)[0]
    return {"loss": float(loss), "steps": steps, "wall_s": time.monotonic() - t0}


def twin_run(
    recipe_path: str,
    overrides: Sequence[str],
    tokens: int,
    paces: Sequence[float] | None = None,
    starts: Sequence[float] | None = None,
) -> tuple[Any, float]:
    """The twin set up to train `tokens`, each learner at its pace (step times relative to each other,
    default all 1) from its start (in the same unit, default 0): the run, and the time on its clock
    by which the learners together have trained them."""
    from dlc.algo.local import InProcessRun
    from dlc.config.load import load_recipe
    from dlc.data.corpus import load_corpus, split_corpus
    from dlc.data.plan import DataPlan

    recipe = load_recipe(recipe_path, list(overrides))
    learners = recipe.learners
    count = learners.count
    paces = list(paces) if paces is not None else [1.0] * count
    starts = list(starts) if starts is not None else [0.0] * count
    per_step = [learners.resolved(i).batch_size * learners.seq_len for i in range(count)]
    rates = [t / p for t, p in zip(per_step, paces, strict=True)]  # tokens per unit of the twin's clock
    until = tokens / sum(rates) + max(starts)
    steps = math.ceil(until / min(paces))  # the fastest learner's steps: the schedule's length
    recipe = _with_steps(recipe, steps)
    data = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, count, recipe.run.seed, 4096))
    return InProcessRun(recipe, data, paces_s=paces, starts_s=starts), until


def train_twin(
    recipe_path: str,
    overrides: Sequence[str],
    tokens: int,
    paces: Sequence[float] | None = None,
    starts: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The recipe's algorithm on the twin (`twin_run`) until the budget is trained."""
    from dlc.run import events

    t0 = time.monotonic()
    run, until = twin_run(recipe_path, overrides, tokens, paces, starts)
    count = len(run.learners)
    per_step = [learner.tokens_per_step for learner in run.learners]
    cosines = _watch_outer_gradients(run.syncer)
    factors = _watch_factors(run.syncer)
    run.run_until(until)
    run.finish()
    weights: list[list[float]] = [[] for _ in range(count)]  # every round's weight of each learner
    contributors, staleness = [], []
    for event in run.syncer.events:
        if isinstance(event, events.RoundClosed):
            staleness += event.staleness or []
            contributors.append(len(event.contributors))
            given = dict(zip(event.contributors, event.weights, strict=True))
            for learner in range(count):
                weights[learner].append(given.get(learner, 0.0))
    lags = [lag for sync in run.syncs if (lag := sync.adopt_lag_steps()) is not None]
    trained = [learner.step * t for learner, t in zip(run.learners, per_step, strict=True)]
    status = run.syncer.status()
    return {
        "loss": float(run.global_eval()),
        "steps": max(learner.step for learner in run.learners),
        "rounds": status["rounds_closed"],
        "fragments": run.syncer.plan.num_fragments if hasattr(run.syncer, "plan") else 1,
        "contributors": statistics.fmean(contributors) if contributors else 0.0,
        "mean_weight": [statistics.fmean(w) if w else 0.0 for w in weights],
        "token_share": [t / sum(trained) for t in trained],
        # Steps from a push to adopting the merge that holds it: tau on the twin, whose merges never
        # arrive late; the engine's measure of the same is its learners' adopt_lag_steps.
        "adopt_lag": statistics.fmean(lags) if lags else None,
        "discarded": sum(sync.discarded_steps for sync in run.syncs) / sum(lr.step for lr in run.learners),
        "stale": sum(v > 0 for v in staleness) / max(len(staleness), 1),  # merged pushes behind the version
        "bytes_up": status.get("bytes_up", 0),
        # How much one round's merged outer gradient of a fragment points the way of the one before:
        # what an outer momentum adds up (near 0, it mostly extrapolates noise).
        "delta_cosine": statistics.fmean(cosines) if cosines else None,
        **_factor_summary(factors),
        "wall_s": time.monotonic() - t0,
    }


def _watch_outer_gradients(syncer: Any) -> list[float]:
    """Record the cosine between consecutive merged outer gradients of each fragment, as the syncer's
    outer steps see them; the list fills as the run goes."""
    import numpy as np

    cosines: list[float] = []
    last: dict[int, Any] = {}
    for p, outer in enumerate(getattr(syncer, "outer", [])):

        def step(theta: Any, grad: Any, p: int = p, inner: Any = outer.step) -> Any:
            g = np.asarray(grad, dtype=np.float64)
            if p in last:
                norms = float(np.linalg.norm(g) * np.linalg.norm(last[p]))
                if norms > 0:
                    cosines.append(float(g @ last[p]) / norms)
            last[p] = g
            return inner(theta, grad)

        outer.step = step
    return cosines


def _kind(name: str) -> str:
    """A tensor's part of the model, for the factors' summary: embed, attn, mlp or norm (else its name)."""
    for kind in ("embed", "attn", "mlp", "norm"):
        if kind in name:
            return kind
    return name


def _watch_factors(syncer: Any) -> list[dict[str, float]]:
    """Record, after every round the syncer folds into its learning-rate factors (`syncer.lr_feedback`),
    the factor the learners multiply their lr by: its mean over all the parameters and over each part
    of the model (`_kind`), by size. The list fills as the run goes; empty when the feedback is off."""
    import numpy as np

    book = getattr(syncer, "spread", None)
    if book is None or not book.on:
        return []
    plan = book.plan
    # Every piece of every fragment in one flat order, as the book's values concatenate them.
    pieces = [span for p in range(plan.num_fragments) for span in plan.spans(p)]
    size = np.array([span.length for span in pieces], dtype=np.float64)
    kind = np.array([_kind(span.name) for span in pieces])
    masks = {name: kind == name for name in sorted(set(kind.tolist()))}
    trace: list[dict[str, float]] = []
    update = book.update

    def watched(p: int, *args: Any, **kwargs: Any) -> None:
        update(p, *args, **kwargs)
        factor = np.concatenate([np.asarray(book.values[q]) ** book.power for q in range(plan.num_fragments)])
        point = {"all": float(factor @ size / size.sum())}
        for name, mask in masks.items():
            point[name] = float(factor[mask] @ size[mask] / size[mask].sum())
        trace.append(point)

    book.update = watched
    return trace


def _factor_summary(trace: list[dict[str, float]]) -> dict[str, Any]:
    """The learners' mean lr factor over the run and over each third of its rounds, and by part of the
    model over the run ({} without the feedback)."""
    if not trace:
        return {}
    thirds = [trace[i * len(trace) // 3 : (i + 1) * len(trace) // 3] or trace for i in range(3)]
    return {
        "lr_factor": statistics.fmean(point["all"] for point in trace),
        "lr_factor_thirds": [statistics.fmean(point["all"] for point in part) for part in thirds],
        "lr_factor_by_kind": {k: statistics.fmean(point[k] for point in trace) for k in trace[0] if k != "all"},
    }
