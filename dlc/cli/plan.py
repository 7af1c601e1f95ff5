"""`dlc simulate` and `dlc bandwidth`: planning instruments, no training involved.

Thin commands: parse options, call dlc.plan.simulate or dlc.plan.bandwidth, render. NumPy, Rich and
matplotlib are imported inside the commands so importing this module stays cheap.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dlc.cli.tables import print_table
from dlc.errors import UserError

if TYPE_CHECKING:
    from dlc.plan.simulate import FailureModel, SweepRow, SystemResult

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_COUNT = re.compile(r"^\s*([-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:e[-+]?\d+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)
_PAPER_SWEEP = "chips=150k,300k,600k,1.2M,2.4M learners=1,2,4,8,16"
_SYSTEM_LABELS = {"dp": "DP, no elasticity", "elastic_dp": "DP, elastic", "decoupled": "decoupled"}


def parse_count(text: str, option: str) -> float:
    """Parse '150k', '1.2M', '5B', '2_400_000' or '1e6'; UserError naming ``option`` otherwise."""
    match = _COUNT.match(text)
    if match is None:
        raise UserError(f"{option}={text!r} is not a count: write e.g. 150k, 1.2M, 5B or 2400000")
    value = float(match.group(1).replace("_", "")) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value):
        raise UserError(f"{option}={text!r} is too large to be a count: write e.g. 150k, 1.2M or 5B")
    if not value > 0:
        raise UserError(f"{option}={text!r} must be positive: write e.g. 150k or 1.2M")
    return value


def format_count(value: float) -> str:
    """1_200_000 -> '1.2M', 150_000 -> '150k'."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:g}"


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
    ax.set_title(f"goodput at {1 / model.mtbi_chip_years:g} failure(s) per chip-year (squares: paper)")
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


def simulate_command(
    chips: Annotated[str, typer.Option(help="Chips in the cluster: 150k, 1.2M, 2400000.")] = "1.2M",
    failures_per_chip_year: Annotated[
        float | None,
        typer.Option(help="Failures of one chip per year; 1 (the paper's) unless this or --mtbi-chip-years is given."),
    ] = None,
    mtbi_chip_years: Annotated[
        float | None, typer.Option(help="Mean time between interruptions of one chip, in years.")
    ] = None,
    chips_per_slice: Annotated[int, typer.Option(help="Chips that a failure takes out together (one slice).")] = 64,
    learners: Annotated[int, typer.Option("--learners", "-M", help="Decoupled learners M.")] = 8,
    quorum: Annotated[int, typer.Option("--quorum", "-K", help="Learners that must be stepping to count as up.")] = 1,
    repair_dist: Annotated[str, typer.Option(help="Repair-time shape: fixed, exponential or lognormal.")] = "lognormal",
    repair_mean_h: Annotated[float, typer.Option(help="Mean time a failed slice is out of service, hours.")] = 4.2,
    repair_sigma: Annotated[float, typer.Option(help="Shape of lognormal repairs (sigma of the log).")] = 1.0,
    pause_on_failure_s: Annotated[float, typer.Option(help="Elastic reconfiguration pause when a slice fails.")] = 11.6,
    pause_on_return_s: Annotated[
        float, typer.Option(help="Elastic reconfiguration pause when a repaired slice rejoins.")
    ] = 8.0,
    dp_restart_s: Annotated[float, typer.Option(help="Plain DP: job restart after any failure, seconds.")] = 71.5,
    dp_spare_ratio: Annotated[
        float, typer.Option(help="Plain DP: idle hot spares, as a multiple of the mean number of slices in repair.")
    ] = 3.0,
    horizon_days: Annotated[float, typer.Option(help="Simulated time, days.")] = 30.0,
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
) -> None:
    """Simulate goodput of plain DP, elastic DP and decoupled training under chip failures."""
    from dlc.plan.simulate import FailureModel, RepairDist

    if failures_per_chip_year is not None and mtbi_chip_years is not None:
        raise UserError("--failures-per-chip-year and --mtbi-chip-years say the same thing: give one of them")
    if failures_per_chip_year is not None and not failures_per_chip_year > 0:
        raise UserError(f"--failures-per-chip-year={failures_per_chip_year} must be positive")
    if repair_dist not in {d.value for d in RepairDist}:
        raise UserError(f"--repair-dist={repair_dist!r} is not one of {', '.join(d.value for d in RepairDist)}")
    if axes and not sweep:
        raise UserError(f"{' '.join(axes)!r} looks like sweep axes: add --sweep, or drop them")
    if mtbi_chip_years is not None:
        mtbi = mtbi_chip_years
    else:
        mtbi = 1.0 / failures_per_chip_year if failures_per_chip_year is not None else 1.0
    model = FailureModel(
        mtbi_chip_years=mtbi,
        chips_per_slice=chips_per_slice,
        repair_dist=RepairDist(repair_dist),
        repair_mean_h=repair_mean_h,
        repair_sigma=repair_sigma,
        pause_on_failure_s=pause_on_failure_s,
        pause_on_return_s=pause_on_return_s,
        dp_restart_s=dp_restart_s,
        dp_spare_ratio=dp_spare_ratio,
        horizon_days=horizon_days,
    )
    model.validate()
    if sweep:
        _report_sweep(axes or [], quorum, model, seed, None if no_plot else plot_file, json_out)
    else:
        _report_one(parse_count(chips, "--chips"), learners, quorum, model, seed, json_out)


def _report_one(chips: float, learners: int, quorum: int, model: FailureModel, seed: int, json_out: bool) -> None:
    """Simulate one cluster size and print goodput and uptime per system."""
    from dlc.plan.simulate import simulate_all

    results = simulate_all(chips, learners, quorum, model, seed)
    if json_out:
        systems = {name: _result_json(r) for name, r in results.items()}
        typer.echo(json.dumps({"systems": systems, "constants": _constants(model, learners, quorum, seed)}))
        return
    labels = {**_SYSTEM_LABELS, "decoupled": f"decoupled M={learners} K={quorum}"}
    rows = [
        [labels[n], f"{100 * r.goodput:.1f}", f"{100 * r.uptime:.1f}", f"{r.failures:,}"] for n, r in results.items()
    ]
    title = (
        f"{format_count(chips)} chips, {1 / model.mtbi_chip_years:g} failure(s)/chip-year, "
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
    title = f"goodput, {1 / model.mtbi_chip_years:g} failure(s)/chip-year, {model.horizon_days:g} simulated days"
    print_table(title, header, table, footer)
    if plot_file is not None:
        typer.echo(f"plot: {plot_file}", err=True)


def _constants(model: FailureModel, learners: int | None, quorum: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(model.as_dict())
    out.update(
        {
            "failures_per_chip_year": 1.0 / model.mtbi_chip_years,
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


def bandwidth_command(
    params: Annotated[str, typer.Option(help="Model parameters: 5B, 1.2B, 350M.")] = "5B",
    step_time_s: Annotated[float, typer.Option(help="Compute time of one inner step, seconds.")] = 1.0,
    sites: Annotated[int, typer.Option(help="Datacentres (sites) joined by the WAN.")] = 2,
    utilisation: Annotated[float, typer.Option(help="Target compute utilisation, a fraction below 1.")] = 0.9,
    bits_per_value: Annotated[float, typer.Option(help="Bits per value that DP and DiLoCo send (16: bf16).")] = 16.0,
    fragments: Annotated[int, typer.Option(help="Fragments P; one is sent every H/P steps.")] = 24,
    inner_steps: Annotated[int, typer.Option("--inner-steps", "-H", help="H: inner steps between syncs.")] = 100,
    tau: Annotated[float, typer.Option(help="Overlap: steps a decoupled fragment may take to come back.")] = 2.0,
    backward_fraction: Annotated[
        float,
        typer.Option(help="Share of a step spent in the backward pass (gradients leave then).", show_default="2/3"),
    ] = 2.0 / 3.0,
    buckets: Annotated[int, typer.Option(help="Gradient buckets per backward pass in the simulation.")] = 32,
    int4_block: Annotated[int, typer.Option(help="int4 values per block scale.")] = 64,
    int4_scale_bits: Annotated[int, typer.Option(help="Bits of one int4 block scale (32: float32).")] = 32,
    json_out: Annotated[bool, typer.Option("--json", help="Print only JSON.")] = False,
    recipe: Annotated[
        Path | None,
        typer.Option(help="Predict the bytes per learner step of `dlc train RECIPE` instead.", show_default=False),
    ] = None,
) -> None:
    """WAN bandwidth per site that DP, blocking DiLoCo and decoupled need to hit a utilisation target."""
    if recipe is not None:
        _recipe_traffic(recipe, json_out)
        return
    from dlc.plan.bandwidth import LinkSetup, plan

    setup = LinkSetup(
        params=parse_count(params, "--params"),
        step_time_s=step_time_s,
        sites=sites,
        utilisation=utilisation,
        bits_per_value=bits_per_value,
        fragments=fragments,
        H=inner_steps,
        tau=tau,
        backward_fraction=backward_fraction,
        buckets=buckets,
        int4_block=int4_block,
        int4_scale_bits=int4_scale_bits,
    )
    rows = plan(setup)
    if json_out:
        out = {
            r.approach: {
                "gbps": round(r.gbps, 4),
                "sim_gbps": round(r.sim_gbps, 4),
                "bits_per_value": r.bits_per_value,
                "gbit_per_step": round(r.gbit_per_step, 4),
            }
            for r in rows
        }
        typer.echo(json.dumps(out))
        return
    table = [
        [r.approach, f"{r.bits_per_value:g}", f"{r.gbps:.3g}", f"{r.sim_gbps:.3g}", f"{r.gbit_per_step:.3g}"]
        for r in rows
    ]
    title = (
        f"{format_count(setup.params)} params, {sites} sites, {step_time_s:g} s steps, "
        f"{100 * utilisation:g}% utilisation, H={inner_steps}, P={fragments}, tau={tau:g}"
    )
    header = ["approach", "bits/value", "closed form(Gbit/s)", "step sim(Gbit/s)", "mean sent(Gbit/step)"]
    print_table(
        title, header, table, "decoupled never waits: it needs the mean rate and each fragment back in tau steps"
    )


def _recipe_traffic(path: Path, json_out: bool) -> None:
    from dlc.config.load import load_recipe
    from dlc.plan.bandwidth import recipe_traffic

    recipe = load_recipe(path)
    traffic = recipe_traffic(recipe)
    if json_out:
        typer.echo(json.dumps({k: round(v, 3) for k, v in traffic.items()}))
        return
    table = [
        ["up (learner -> syncer)", f"{traffic['up_bytes_per_step']:,.1f}"],
        ["down (syncer -> learner)", f"{traffic['down_bytes_per_step']:,.1f}"],
        ["one fp32 gradient", f"{traffic['fp32_gradient_bytes']:,.0f}"],
    ]
    share, total = traffic["up_vs_fp32_gradient"], traffic["total_vs_dp_fp32"]
    note = "nothing is sent"
    if share:
        note = (
            f"up is 1/{1 / share:.0f} of an fp32 gradient per step; up + down is 1/{1 / total:.0f} of what "
            "data-parallel moves (an fp32 gradient up and the model down every step)"
        )
    print_table(
        f"{path}: algorithm {recipe.algorithm}, {traffic['params']:,} parameters",
        ["per learner step", "bytes"],
        table,
        note,
    )
