"""Train a recipe: the library's entry point. `dlc train` only parses options and calls `run`."""

from __future__ import annotations

from typing import Any

from dlc.config.schema import Recipe
from dlc.core.data import load_corpus, split_corpus
from dlc.core.runtime import prepare_compilation_cache
from dlc.engine.driver import Driver, Outcome
from dlc.observe.console import ProgressView
from dlc.run.rundir import RunDir


def run(recipe: Recipe, fresh: bool = False, view: ProgressView | None = None, chaos_plan: Any = None) -> Outcome:
    """Train the recipe until its stop condition, Ctrl-C, or an error; inject `chaos_plan` alongside."""
    view = view or ProgressView(log_every_steps=recipe.run.log_every_steps)
    corpus = load_corpus(recipe.data)
    min_bytes = max(recipe.learners.resolved(i).batch_size for i in range(recipe.learners.count))
    streams = recipe.learners.count + recipe.learners.join_streams
    split = split_corpus(corpus, recipe.data, streams, recipe.run.seed, min_bytes * (recipe.learners.seq_len + 1) * 2)
    # Refused before the run directory is touched.
    cache = prepare_compilation_cache(recipe.run.compile_cache_dir) if recipe.run.compile_cache else None
    rundir, resume = RunDir.prepare(recipe, fresh)
    rundir.event(
        "run_started",
        run_dir=str(rundir.path),
        corpus_bytes=len(corpus),
        eval_bytes=len(split.eval_bytes),
        learners=recipe.learners.count,
        algorithm=recipe.algorithm,
        resumed=resume,
    )
    if cache is not None:
        rundir.event("compile_cache", **cache)
    try:
        return Driver(recipe, rundir, resume, split, view, chaos_plan).run()
    finally:
        rundir.close()
