"""The `dlc` command line. Thin: parse, load the recipe, call one function.

Heavy modules (JAX, Ray) are imported inside the commands so `dlc --help` stays fast.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from dlc.errors import UserError

app = typer.Typer(
    help="Train neural networks with Decoupled DiLoCo: independent learners, an asynchronous syncer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Train neural networks with Decoupled DiLoCo: independent learners, an asynchronous syncer."""


def fail(message: str) -> NoReturn:
    """Print a user error without a traceback and exit with code 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command(context_settings={"allow_extra_args": False})
def train(
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
    from dlc.config.schema import load_recipe

    try:
        extra = [f"cluster.address={address}"] if address else []
        loaded = load_recipe(recipe, [*(overrides or []), *extra])
        plan = None
        if chaos is not None:
            from chaos.plan import load_plan, resolve_plan_path

            plan = load_plan(resolve_plan_path(chaos))
            plan.check_learners(range(loaded.learners.count))
        from dlc.core.runtime import limit_xla_threads

        limit_xla_threads(loaded.learners.xla_cpu_threads)
        from dlc.engine import driver

        outcome = driver.run(loaded, fresh=fresh, chaos_plan=plan)
    except UserError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("interrupted while starting: nothing was trained", err=True)
        raise typer.Exit(130) from None
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
        args = " ".join([str(recipe), *(o for o in overrides or [] if not o.startswith("run.dir="))])
        typer.echo(f"resume with: dlc train {args} run.dir={outcome.run_dir}", err=True)
    raise typer.Exit(outcome.exit_code)


def guarded(command: Callable[..., None]) -> Callable[..., None]:
    """A command whose UserError becomes one line on stderr and exit code 2."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except UserError as exc:
            fail(str(exc))

    return run


from dlc.cli.chaos import chaos_command  # noqa: E402
from dlc.cli.plan import bandwidth_command, simulate_command  # noqa: E402
from dlc.cli.view import report_command, status_command  # noqa: E402

for _name, _command in (
    ("status", status_command),
    ("report", report_command),
    ("chaos", chaos_command),
    ("simulate", simulate_command),
    ("bandwidth", bandwidth_command),
):
    app.command(_name)(guarded(_command))


def main() -> None:
    try:
        app()
    except UserError as exc:  # raised outside a command's own handler
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
