"""`dlc status` and `dlc report`: views of run directories, no connection to a cluster needed.

Rich views and matplotlib are imported inside the commands so importing this module stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dlc.errors import UserError


def status_command(
    run: Annotated[
        Path | None,
        typer.Argument(help="Run directory. Default: the most recently updated run under ./runs.", show_default=False),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON and exit.")] = False,
) -> None:
    """Watch a run: learners, syncer, losses, faults. Reads only the run directory; q or Ctrl-C quits."""
    from dlc.observe.reader import RunReader
    from dlc.run.files import resolve_run

    path = resolve_run(run)
    if json_out:
        typer.echo(json.dumps(RunReader(path).snapshot(), indent=1))
        return
    from dlc.observe.dashboard import show

    show(path, once=once)


def report_command(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories to compare. Default: the latest run under ./runs.", show_default=False),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to write the PNGs and report.md. Default: RUN/report for one run, else ./report."
        ),
    ] = None,
) -> None:
    """Plot runs (eval loss, train loss per learner, goodput, bytes sent) and write a Markdown summary."""
    from dlc.run.files import resolve_run

    paths = [resolve_run(run) for run in runs] if runs else [resolve_run(None)]
    if len({p.resolve() for p in paths}) < len(paths):
        raise UserError("the same run directory is given twice: name each run once")
    target = out or (paths[0] / "report" if len(paths) == 1 else Path("report"))
    if target.exists() and not target.is_dir():
        raise UserError(f"--out {str(target)!r} exists and is not a directory: choose another --out")
    from dlc.run.rundir import ensure_writable_dir

    ensure_writable_dir(target, "--out")  # before the plots are drawn, not when the first is saved
    from dlc.observe.report import write_report

    written = write_report(paths, target)
    for path in written:
        typer.echo(str(path))
