"""Train a recipe: the library's entry point. `dlc train` only parses options and calls `run`."""

from __future__ import annotations

from typing import Any

from dlc.config.schema import Recipe
from dlc.core.compile_cache import prepare_compilation_cache
from dlc.data.plan import ensure_prepared, plan_data, resolve_data
from dlc.engine.driver import Driver, Outcome
from dlc.engine.interrupts import Interrupts
from dlc.engine.syncer.journal import check_journal
from dlc.observe.console import ProgressView
from dlc.observe.trackers import check_trackers, default_trackers
from dlc.plan.memory import check_fits, fragment_plan
from dlc.run import events
from dlc.run.files import syncer_journal_path
from dlc.run.rundir import Claim, RunDir, completed_summary


def run(
    recipe: Recipe,
    fresh: bool = False,
    view: ProgressView | None = None,
    chaos_plan: Any = None,
    ends_process: bool = False,
) -> Outcome:
    """Train the recipe until its stop condition, Ctrl-C, or an error; inject `chaos_plan` alongside.
    `ends_process`: the process ends with the run (the CLI's), and ignores Ctrl-C once it is over.

    Everything that can refuse the start (the data and the model's vocabulary, the memory it needs,
    the trackers, the compilation cache, the run directory and its checkpoints and journal, the
    cluster and its room for the recipe) is checked before the run directory is written. A prepared dataset that
    data.prepare describes and data.path does not hold yet is prepared first.
    """
    from dlc.engine import cluster, devices, placement

    ensure_prepared(recipe)
    recipe, manifest = resolve_data(recipe)  # the vocabulary every process builds its model with
    check_fits(recipe)  # before anything is allocated
    recipe, no_tensorboard = default_trackers(recipe)
    check_trackers(recipe)  # a tracker that cannot start (no package, no server, no W&B login) refuses it here
    if recipe.metrics.port is not None:  # the embedded cluster's (the recipe refuses it with cluster.address)
        cluster.check_metrics_port(recipe.metrics.port)  # Ray's metrics agent installed, the port free
    view = view or ProgressView(log_every_steps=recipe.run.log_every_steps)
    if no_tensorboard:
        view.message(no_tensorboard)
    data = plan_data(recipe, manifest)
    cache = prepare_compilation_cache(recipe.run.compile_cache_dir) if recipe.run.compile_cache else None
    with Claim() as claim:  # one dlc train at a time in the run directory, until this returns
        layout = RunDir.check(recipe, fresh, claim)
        if layout.resume and (summary := completed_summary(layout.path, recipe)) is not None:
            view.message(
                f"{layout.path} has completed this recipe's budget already: nothing to train. To train further "
                "raise run.max_steps (or run.max_tokens, run.max_wall_s); to start over pass --fresh"
            )
            return Outcome("completed", summary, str(layout.path))
        if layout.resume:  # a damaged journal is found here, not by a syncer that has already started
            plan = fragment_plan(recipe)
            check_journal(syncer_journal_path(layout.path), [plan.size(p) for p in range(plan.num_fragments)])
        with Interrupts(final=ends_process) as interrupts:
            try:
                started = cluster.start_cluster(
                    recipe.cluster, recipe.cpus_reserved(), devices.embedded_env(recipe), recipe.metrics.port
                )
                interrupts.claim()
                # Ray would leave an actor asking for what no node has pending forever: refuse it now.
                devices.check_resources(recipe, [n["resources"] for n in cluster.nodes()])
                placement.check(recipe, cluster.nodes(), started["driver_node"])
                # Events are held in memory until every actor has started: written only if the run really starts.
                rundir = RunDir.create(layout, recipe, claim)
                if recipe.metrics.port is not None:
                    view.message(f"Prometheus metrics (ray_dlc_*): http://127.0.0.1:{recipe.metrics.port}/metrics")
            except BaseException:
                interrupts.hold()  # an interrupted start (inside `ray.init`, say) still stops what it started
                cluster.stop_cluster()
                raise
            rundir.event(
                events.RunStarted(
                    run_dir=str(rundir.path),
                    storage=rundir.storage.location,
                    data=recipe.data.path or recipe.data.source,
                    tokenizer=data.tokenizer,
                    train_tokens=data.train_tokens,
                    eval_tokens=data.eval_tokens,
                    eval_bytes_per_token=round(data.bytes_per_token, 4),
                    learners=recipe.learners.count,
                    algorithm=recipe.algorithm,
                    resumed=layout.resume,
                )
            )
            if cache is not None:
                rundir.event(events.CompileCache(**cache))
            try:
                return Driver(recipe, rundir, layout.resume, data, view, chaos_plan, started).run(interrupts)
            finally:
                interrupts.hold()
                cluster.stop_cluster()  # the driver stops it; this covers a driver that failed to start
                rundir.close()
