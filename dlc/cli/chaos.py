"""`dlc chaos`: attach to a running run and inject faults into it, from a plan and/or rate options.

Thin: parse options into plan overrides, find the run directory, call chaos.controller, render. The
fault kinds' options come from their specs (`chaos.faults`, a light import); the rest of the chaos
package is imported inside the command so importing this module stays cheap.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from chaos.faults import FaultKind, Setting
from dlc.cli.options import with_options
from dlc.cli.tables import print_table
from dlc.errors import UserError

if TYPE_CHECKING:
    from chaos.controller import Report

# The fault kinds' options, each overriding a plan key (`chaos.faults`: the specs say which).
FAULT_OPTIONS = {s.option: (slot, s) for kind in FaultKind for slot, s in kind.settings() if s.option}
# Command-line option -> the plan key it overrides.
OPTION_KEYS = {option: s.key for option, (_, s) in FAULT_OPTIONS.items()} | {
    "--seed": "seed",
    "--duration": "duration_s",
    "--warmup": "warmup_s",
}


def _parameter(option: str, slot: str, setting: Setting) -> inspect.Parameter:
    """A rate's option says what it counts; the others say their default too."""
    text = setting.help if slot == "rate" else f"{setting.help} (default: the plan's, else {setting.default:g})"
    return inspect.Parameter(
        _option_name(option),
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[float | None, typer.Option(option, help=text, show_default=False)],
    )


def _option_name(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def _takes_fault_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` one option per fault setting that has one, after RUN; it receives them as `**faults`."""
    generated = [_parameter(option, slot, setting) for option, (slot, setting) in FAULT_OPTIONS.items()]
    return with_options(command, "run", generated, lambda kwargs: command(**kwargs))


@_takes_fault_options
def chaos_command(
    run: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN", help="Run directory (or its name under ./runs). Default: the latest run.", show_default=False
        ),
    ] = None,
    plan: Annotated[
        Path | None,
        typer.Option(
            "--plan",
            help="Plan YAML, or a shipped plan's name: kill_storm, stragglers, heterogeneous, mixed, thin_links.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed of the Poisson draws (default: the plan's, else 0)")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", help="Stop injecting after this many seconds (default: the plan's, else until the run ends)"
        ),
    ] = None,
    warmup: Annotated[
        float | None,
        typer.Option(
            "--warmup",
            help="No fault in the first seconds after every learner trains (default: the plan's, else 20)",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print and record what would be injected; touch nothing.")
    ] = False,
    **faults: float | None,
) -> None:
    """Inject faults into a running run until --duration ends or the run finishes (Ctrl-C stops)."""
    from chaos.controller import Controller
    from chaos.plan import load_plan
    from chaos.target import RunDirTarget

    given = {option: faults.get(_option_name(option)) for option in FAULT_OPTIONS}
    given |= {"--seed": seed, "--duration": duration, "--warmup": warmup}
    for option, value in given.items():
        if isinstance(value, float) and not math.isfinite(value):  # an infinite rate never stops firing
            raise UserError(f"{option}={value} must be a finite number")
    if plan is not None and plan.is_dir():
        raise UserError(f"--plan {str(plan)!r} is a directory: give a plan YAML file, or a shipped plan's name")
    overrides: dict[str, Any] = {OPTION_KEYS[o]: v for o, v in given.items() if v is not None}
    if dry_run:
        overrides["dry_run"] = True
    loaded = load_plan(plan, overrides, {key: option for option, key in OPTION_KEYS.items()})
    if loaded.is_empty():
        rates = [option for option, (slot, _) in FAULT_OPTIONS.items() if slot == "rate"]
        raise UserError(f"nothing to inject: give {', '.join(rates[:-1])} or {rates[-1]}, or a --plan")
    from dlc.run.files import resolve_run

    run_dir = resolve_run(run, live=True)
    target = RunDirTarget(run_dir)
    if not target.running():
        state = target.status().get("state", "unknown")
        raise UserError(f"run {str(run_dir)!r} is not running (state: {state}): there is nothing to break")
    learners = target.learners()
    if learners:
        loaded.check_learners([info.id for info in learners])
    typer.echo(f"chaos on {run_dir}: {loaded.summary()}", err=True)
    if not all(info.healthy for info in learners):
        typer.echo("waiting for every learner to train before the chaos clock starts", err=True)
    controller = Controller(loaded, target, on_record=_print_record)
    try:
        report = controller.run()
    except KeyboardInterrupt:
        report = controller.report
        report.stopped_because = "interrupted (Ctrl-C)"
    _print_report(report, run_dir)


def _print_record(entry: dict[str, Any]) -> None:
    extra = "" if entry["phase"] == "injected" else f" [{entry['phase']}]"
    typer.echo(f"{entry['at_s']:8.1f}s  {entry['fault']:<12} {entry['target']:<11} {entry['detail']}{extra}")


def _print_report(report: Report, run_dir: Path) -> None:
    header = ["fault", "injected", "refused", "dry run", "failed"]
    footer = f"stopped: {report.stopped_because}; every fault is in {run_dir / 'chaos.jsonl'}"
    print_table("faults", header, report.table(), footer)
