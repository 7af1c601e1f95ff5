"""`dlc chaos`: attach to a running run and inject faults into it, from a plan and/or rate options.

Thin: parse options into plan overrides, find the run directory, call chaos.controller, render.
The chaos package is imported inside the command so importing this module stays cheap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dlc.cli.tables import print_table
from dlc.errors import UserError

if TYPE_CHECKING:
    from chaos.controller import Report

# Command-line option -> the plan key it overrides.
OPTION_KEYS = {
    "--kill-rate": "kill_per_learner_per_min",
    "--stall-rate": "stall_per_learner_per_min",
    "--stall-for": "stall_for_s",
    "--slow-rate": "slow_per_learner_per_min",
    "--slow-factor": "slow_factor",
    "--slow-for": "slow_for_s",
    "--degrade-link-rate": "degrade_link_per_learner_per_min",
    "--link-factor": "degrade_link_factor",
    "--cut-link-rate": "cut_link_per_learner_per_min",
    "--kill-node-rate": "kill_node_per_min",
    "--preempt-rate": "preempt_per_learner_per_min",
    "--notice-s": "preempt_notice_s",
    "--seed": "seed",
    "--duration": "duration_s",
    "--warmup": "warmup_s",
}


def chaos_command(
    run: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN", help="Run directory (or its name under ./runs). Default: the latest run.", show_default=False
        ),
    ] = None,
    kill_rate: Annotated[
        float | None, typer.Option("--kill-rate", help="SIGKILLs per learner per minute (Poisson).", show_default=False)
    ] = None,
    stall_rate: Annotated[
        float | None,
        typer.Option("--stall-rate", help="Stalls (SIGSTOP) per learner per minute (Poisson).", show_default=False),
    ] = None,
    stall_for: Annotated[
        float | None,
        typer.Option("--stall-for", help="Seconds a stall lasts (default: the plan's, else 10)", show_default=False),
    ] = None,
    slow_rate: Annotated[
        float | None,
        typer.Option("--slow-rate", help="Slow-downs per learner per minute (Poisson).", show_default=False),
    ] = None,
    slow_factor: Annotated[
        float | None,
        typer.Option(
            "--slow-factor",
            help="Step-time multiplier of a slow-down (default: the plan's, else 3)",
            show_default=False,
        ),
    ] = None,
    slow_for: Annotated[
        float | None,
        typer.Option("--slow-for", help="Seconds a slow-down lasts (default: the plan's, else 30)", show_default=False),
    ] = None,
    degrade_link_rate: Annotated[
        float | None,
        typer.Option(
            "--degrade-link-rate", help="Link degradations per learner per minute (Poisson).", show_default=False
        ),
    ] = None,
    link_factor: Annotated[
        float | None,
        typer.Option(
            "--link-factor",
            help="A degraded link's bandwidth is divided, its latency multiplied, by this (default: the plan's, "
            "else 10)",
            show_default=False,
        ),
    ] = None,
    cut_link_rate: Annotated[
        float | None,
        typer.Option("--cut-link-rate", help="Link cuts per learner per minute (Poisson).", show_default=False),
    ] = None,
    kill_node_rate: Annotated[
        float | None,
        typer.Option(
            "--kill-node-rate",
            help="Lost nodes per minute, run-wide (Poisson): every learner on one node killed at once.",
            show_default=False,
        ),
    ] = None,
    preempt_rate: Annotated[
        float | None,
        typer.Option(
            "--preempt-rate",
            help="Preemptions per learner per minute (Poisson): SIGTERM, then SIGKILL after the notice.",
            show_default=False,
        ),
    ] = None,
    notice_s: Annotated[
        float | None,
        typer.Option(
            "--notice-s",
            help="Seconds from a preemption's SIGTERM to its SIGKILL (default: the plan's, else 30)",
            show_default=False,
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
) -> None:
    """Inject faults into a running run until --duration ends or the run finishes (Ctrl-C stops)."""
    from chaos.controller import Controller
    from chaos.plan import load_plan
    from chaos.target import RunDirTarget

    given = {
        "--kill-rate": kill_rate,
        "--stall-rate": stall_rate,
        "--stall-for": stall_for,
        "--slow-rate": slow_rate,
        "--slow-factor": slow_factor,
        "--slow-for": slow_for,
        "--degrade-link-rate": degrade_link_rate,
        "--link-factor": link_factor,
        "--cut-link-rate": cut_link_rate,
        "--kill-node-rate": kill_node_rate,
        "--preempt-rate": preempt_rate,
        "--notice-s": notice_s,
        "--seed": seed,
        "--duration": duration,
        "--warmup": warmup,
    }
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
        raise UserError(
            "nothing to inject: give --kill-rate, --stall-rate, --slow-rate, --degrade-link-rate, --cut-link-rate, "
            "--kill-node-rate or --preempt-rate, or a --plan"
        )
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
