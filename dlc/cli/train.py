"""`dlc train`: load the recipe (and a chaos plan), call `dlc.train.run`, print the outcome."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlc.cli.process import ends_with_command
from dlc.errors import UserError

if TYPE_CHECKING:
    from dlc.config.schema import Recipe


def train_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file, e.g. recipes/tiny.yaml.", show_default=False)],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Dotted key=value overrides, e.g. run.dir=/tmp/r1 learners.count=2.", show_default=False),
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Start over even if the run directory holds a checkpoint.")
    ] = False,
    address: Annotated[
        str | None,
        typer.Option("--address", help="Join this Ray cluster (same as cluster.address=...).", show_default=False),
    ] = None,
    chaos: Annotated[
        str | None,
        typer.Option(
            "--chaos",
            help="Run a chaos plan alongside: a YAML file or a shipped plan (kill_storm, ...).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Train a model from a recipe. Resumes when run.dir holds a checkpoint (unless --fresh)."""
    from dlc.config.load import load_recipe
    from dlc.engine.devices import isolate_driver

    isolate_driver()  # before anything imports JAX: the driver never trains, GPUs are the learners'
    try:
        if address and any(o.partition("=")[0] in ("cluster", "cluster.address") for o in overrides or []):
            raise UserError("--address and a cluster.address override both name the cluster: keep one of them")
        extra = [f"cluster.address={address}"] if address else []
        loaded = load_recipe(recipe, [*(overrides or []), *extra])
        plan = None
        if chaos is not None:
            from chaos.plan import load_plan, resolve_plan_path

            if Path(chaos).is_dir():
                raise UserError(f"--chaos {chaos!r} is a directory: give a plan YAML file, or a shipped plan's name")

            plan = load_plan(resolve_plan_path(chaos))
            plan.check_learners(range(loaded.learners.count))
        _prepare_on_first_use(loaded)
        from dlc.core.threads import limit_xla_threads

        learners = loaded.learners
        limit_xla_threads(max(learners.xla_threads(i) for i in [None, *range(learners.count)]))
        from dlc.train import run

        outcome = run(loaded, fresh=fresh, chaos_plan=plan, ends_process=ends_with_command())
    except KeyboardInterrupt as exc:
        from dlc.engine.interrupts import exit_code_of

        code = exit_code_of(exc)
        _end_after_a_cut_start(code)
        raise typer.Exit(code) from None
    summary = outcome.summary
    final, initial = summary.get("eval_loss_final"), summary.get("eval_loss_initial")
    loss = ""
    if final is not None and initial is not None:
        loss = f"; eval loss {initial:.3f} -> {final:.3f} ({summary['eval_bpb_final']:.3f} bits/byte)"
    typer.echo(
        f"{outcome.status}: {summary['tokens_total']:,} tokens in {summary['wall_s']:.1f} s{loss}; "
        f"run dir {outcome.run_dir}",
        err=True,
    )
    if outcome.status == "interrupted":
        # Quoted for a shell: an override like learners.overrides=[{index: 0, devices: 2}] holds spaces.
        kept = [o for o in overrides or [] if not o.startswith("run.dir=")]
        args = shlex.join([str(recipe), *kept, f"run.dir={outcome.resume_dir or outcome.run_dir}"])
        typer.echo(f"resume with: dlc train {args}", err=True)
    raise typer.Exit(outcome.exit_code)


def _end_after_a_cut_start(code: int) -> None:
    """Say so; in a process that ends with this command, end it now, with `code`, ignoring Ctrl-C.

    A Ctrl-C inside `ray.init` leaves Ray's threads half started; the interpreter's teardown then
    frees JAX's modules while one of them still runs, and crashes (seen: a segfault in jaxlib's
    module deallocation, with Ray's error subscriber polling). Ray is stopped and nothing else is
    left to tear down."""
    ends = ends_with_command()
    if ends:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    typer.echo("interrupted while starting: nothing was trained", err=True)
    if ends:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _prepare_on_first_use(recipe: Recipe) -> None:
    """The dataset data.prepare describes, prepared before anything starts, with `dlc prepare`'s progress bar."""
    from dlc.data.plan import ensure_prepared, needs_preparing

    if not needs_preparing(recipe):
        return
    from dlc.cli.prepare import PrepareProgress, summary

    data = recipe.data
    assert data.prepare is not None and data.path is not None
    typer.echo(
        f"{data.path} holds no dataset yet: preparing it from {', '.join(data.prepare.sources)} "
        f"({data.prepare.tokenizer}), once",
        err=True,
    )
    started = time.monotonic()
    with PrepareProgress() as progress:
        manifest = ensure_prepared(recipe, on_progress=progress.update)
    if manifest is not None:
        typer.echo(summary(manifest, Path(data.path), time.monotonic() - started), err=True)
