"""The `dlc` command line. Thin: parse, load the recipe, call one function.

Heavy modules (JAX, Ray) are imported inside the commands so `dlc --help` stays fast. The commands
live in their own modules and never import this one: it imports them and registers each.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer

from dlc.cli.bandwidth import bandwidth_command
from dlc.cli.chaos import chaos_command
from dlc.cli.evaluate import eval_command
from dlc.cli.export import export_command
from dlc.cli.prepare import prepare_command
from dlc.cli.process import mark_ends_with_command
from dlc.cli.sample import sample_command
from dlc.cli.simulate import simulate_command
from dlc.cli.train import train_command
from dlc.cli.view import report_command, status_command
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


def guarded(command: Callable[..., None]) -> Callable[..., None]:
    """A command whose UserError becomes one line on stderr and exit code 2."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except UserError as exc:
            fail(str(exc))

    return run


app.command("train", context_settings={"allow_extra_args": False})(guarded(train_command))
for _name, _command in (
    ("status", status_command),
    ("report", report_command),
    ("prepare", prepare_command),
    ("sample", sample_command),
    ("eval", eval_command),
    ("export", export_command),
    ("chaos", chaos_command),
    ("simulate", simulate_command),
    ("bandwidth", bandwidth_command),
):
    app.command(_name)(guarded(_command))


def main() -> None:
    mark_ends_with_command()  # this process ends with the command, unlike a caller's CliRunner
    try:
        app()
    except UserError as exc:  # raised outside a command's own handler
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
