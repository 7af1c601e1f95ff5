"""`dlc simulate`: goodput of plain DP, elastic DP and decoupled training under chip failures.

Thin: parse the options into a `FailureModel`, call dlc.plan.simulate, render a table, JSON or a
plot. NumPy, Rich and matplotlib are imported inside the command; the settings model (pydantic) is
needed to build the command's options, so `dlc --help` imports it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dlc.cli.options import format_count, parse_count, takes_settings
from dlc.cli.tables import print_table
from dlc.errors import UserError
from dlc.plan.inputs import FailureModel

if TYPE_CHECKING:
    from dlc.plan.simulate import SweepRow, SystemResult

_PAPER_SWEEP = "chips=150k,300k,600k,1.2M,2.4M learners=1,2,4,8,16"


def _parse_axes(axes: list[str]) -> tuple[list[float], list[int]]:
    """'chips=150k,300k' and 'learners=1,2,4' into value lists (paper grid for a missing axis)."""
    found: dict[str, str] = dict(a.split("=", 1) for a in _PAPER_SWEEP.split())
    for axis in axes:
        key, sep, values = axis.partition("=")
        if not sep or key not in found or not values:
            raise UserError(f"sweep axis {axis!r} is not chips=... or learners=...: write e.g. {_PAPER_SWEEP}")
        found[key] = values
    chips = [parse_count(v, "--sweep chips") for v in found["chips"].split(",")]
    learners: list[int] = []
    for v in found["learners"].split(","):
        if not v.strip().isdigit() or int(v) < 1:
            raise UserError(f"--sweep learners={found['learners']!r}: {v!r} is not a whole number >= 1")
        learners.append(int(v))
    return chips, learners


def _paper_cell(system: str, learners: int, chips: float, model: FailureModel) -> int | None:
    """The paper's figure for this cell, when it has one for these inputs."""
    from dlc.plan.simulate import PAPER_CHIPS, PAPER_GOODPUT_PCT

    if model.mtbi_chip_years != 1.0 or round(chips) not in PAPER_CHIPS:
        return None
    row = PAPER_GOODPUT_PCT.get((system, learners))
    return None if row is None else row[PAPER_CHIPS.index(round(chips))]


def _result_json(r: SystemResult) -> dict[str, float | int]:
    return {"goodput": round(r.goodput, 4), "uptime": round(r.uptime, 4), "failures": r.failures}


def _plot(path: Path, chips: list[float], rows: list[SweepRow], model: FailureModel) -> None:
    """Goodput against chips, one line per system, the paper's figures as open markers."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("--plot-file needs matplotlib: pip install matplotlib, or pass --no-plot") from exc
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        (line,) = ax.plot(chips, [100 * r.goodput for r in row.results], marker="o", label=row.label)
        paper = [(c, _paper_cell(row.system, row.learners, c, model)) for c in chips]
        pts = [(c, p) for c, p in paper if p is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker="s", facecolors="none", edgecolors=line.get_color())
    ax.set_xscale("log")
    ax.set_xticks(chips, [format_count(c) for c in chips])
    ax.minorticks_off()
    ax.set_xlabel("chips")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"goodput at {model.failures_per_chip_year:g} failure(s) per chip-year (squares: paper)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise UserError(f"--plot-file={path}: cannot write it ({exc.strerror}); pick a writable path") from exc
    finally:
        plt.close(fig)


def _run_sweep(chips: list[float], learners: list[int], quorum: int, model: FailureModel, seed: int) -> list[SweepRow]:
    """The sweep, with a progress bar on stderr when it is a terminal."""
    from rich.console import Console
    from rich.progress import Progress

    from dlc.plan.simulate import sweep, sweep_cells

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("simulating", total=sweep_cells(chips, learners))
        return sweep(chips, learners, quorum, model, seed, on_cell=lambda: progress.advance(task))


@takes_settings(FailureModel, after="mtbi_chip_years", skip={"mtbi_chip_years"})
def simulate_command(
    chips: Annotated[str, typer.Option(help="Chips in the cluster: 150k, 1.2M, 2400000.")] = "1.2M",
    learners: Annotated[int, typer.Option("--learners", "-M", help="Decoupled learners M.")] = 8,
    quorum: Annotated[int, typer.Option("--quorum", "-K", help="Learners that must be stepping to count as up.")] = 1,
    failures_per_chip_year: Annotated[
        float | None,
        typer.Option(help="Failures of one chip per year; 1 (the paper's) unless this or --mtbi-chip-years is given."),
    ] = None,
    mtbi_chip_years: Annotated[
        float | None, typer.Option(help=FailureModel.model_fields["mtbi_chip_years"].description)
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same numbers.")] = 0,
    sweep: Annotated[
        bool, typer.Option("--sweep", help=f"Sweep AXES (default: {_PAPER_SWEEP}) and plot goodput against chips.")
    ] = False,
    axes: Annotated[
        list[str] | None, typer.Argument(help="Sweep axes for --sweep, e.g. chips=150k,1.2M learners=1,8.")
    ] = None,
    plot_file: Annotated[Path, typer.Option(help="Where --sweep writes its PNG plot.")] = Path("goodput_vs_chips.png"),
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Do not write the sweep plot.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print only JSON (goodput as a fraction).")] = False,
    **constants: Any,
) -> None:
    """Simulate goodput of plain DP, elastic DP and decoupled training under chip failures."""
    if failures_per_chip_year is not None and mtbi_chip_years is not None:
        raise UserError("--failures-per-chip-year and --mtbi-chip-years say the same thing: give one of them")
    if failures_per_chip_year is not None and not failures_per_chip_year > 0:
        raise UserError(f"--failures-per-chip-year={failures_per_chip_year} must be positive")
    if axes and not sweep:
        raise UserError(f"{' '.join(axes)!r} looks like sweep axes: add --sweep, or drop them")
    if mtbi_chip_years is not None:
        mtbi = mtbi_chip_years
    else:
        mtbi = 1.0 / failures_per_chip_year if failures_per_chip_year is not None else 1.0
    model = FailureModel(mtbi_chip_years=mtbi, **constants)
    if sweep:
        _report_sweep(axes or [], quorum, model, seed, None if no_plot else plot_file, json_out)
    else:
        _report_one(parse_count(chips, "--chips"), learners, quorum, model, seed, json_out)


def _report_one(chips: float, learners: int, quorum: int, model: FailureModel, seed: int, json_out: bool) -> None:
    """Simulate one cluster size and print goodput and uptime per system."""
    from dlc.plan.simulate import LABELS, simulate_all

    results = simulate_all(chips, learners, quorum, model, seed)
    if json_out:
        systems = {name: _result_json(r) for name, r in results.items()}
        typer.echo(json.dumps({"systems": systems, "constants": _constants(model, learners, quorum, seed)}))
        return
    labels = {**LABELS, "decoupled": f"{LABELS['decoupled']} M={learners} K={quorum}"}
    rows = [
        [labels[n], f"{100 * r.goodput:.1f}", f"{100 * r.uptime:.1f}", f"{r.failures:,}"] for n, r in results.items()
    ]
    title = (
        f"{format_count(chips)} chips, {model.failures_per_chip_year:g} failure(s)/chip-year, "
        f"{model.horizon_days:g} simulated days"
    )
    print_table(title, ["system", "goodput(%)", "uptime(%)", "failures"], rows, _constants_line(model))


def _report_sweep(
    axes: list[str], quorum: int, model: FailureModel, seed: int, plot_file: Path | None, json_out: bool
) -> None:
    """Sweep chips x learners, print the paper's layout (paper figures in brackets), plot it."""
    from dlc.plan.simulate import check_shape

    chip_list, learner_list = _parse_axes(axes)
    check_shape(min(chip_list), max(learner_list), quorum, seed)
    start = time.perf_counter()
    rows = _run_sweep(chip_list, learner_list, quorum, model, seed)
    seconds = time.perf_counter() - start
    if plot_file is not None:
        _plot(plot_file, chip_list, rows, model)
    if json_out:
        payload: dict[str, Any] = {
            "chips": chip_list,
            "rows": [
                {
                    "label": r.label,
                    "system": r.system,
                    "learners": r.learners,
                    "goodput": [round(x.goodput, 4) for x in r.results],
                    "uptime": [round(x.uptime, 4) for x in r.results],
                    "paper_goodput_pct": [_paper_cell(r.system, r.learners, c, model) for c in chip_list],
                }
                for r in rows
            ],
            "constants": _constants(model, None, quorum, seed),
            "seconds": round(seconds, 2),
        }
        typer.echo(json.dumps(payload))
        return
    table = []
    for r in rows:
        cells = []
        for c, x in zip(chip_list, r.results, strict=True):
            paper = _paper_cell(r.system, r.learners, c, model)
            cells.append(f"{100 * x.goodput:.1f}" + ("" if paper is None else f" ({paper})"))
        table.append([r.label, *cells])
    header = ["goodput(%) (paper)", *[format_count(c) for c in chip_list]]
    footer = f"{_constants_line(model)}\n{len(table) * len(chip_list)} cells in {seconds:.1f} s"
    title = f"goodput, {model.failures_per_chip_year:g} failure(s)/chip-year, {model.horizon_days:g} simulated days"
    print_table(title, header, table, footer)
    if plot_file is not None:
        typer.echo(f"plot: {plot_file}", err=True)


def _constants(model: FailureModel, learners: int | None, quorum: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json")
    out.update(
        {
            "failures_per_chip_year": model.failures_per_chip_year,
            "repair_fraction": round(model.repair_fraction, 5),
            "dp_spare_fraction": round(model.dp_spare_fraction, 5),
            "quorum": quorum,
            "seed": seed,
        }
    )
    if learners is not None:
        out["learners"] = learners
    return out


def _constants_line(model: FailureModel) -> str:
    m = model
    return (
        f"constants: slice {m.chips_per_slice} chips, repair {m.repair_dist.value} mean {m.repair_mean_h:g} h, "
        f"pause {m.pause_on_failure_s:g} s on failure / {m.pause_on_return_s:g} s on return, "
        f"DP restart {m.dp_restart_s:g} s with {100 * m.dp_spare_fraction:.1f}% of chips as spares"
    )
