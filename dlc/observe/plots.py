"""`dlc report`, drawing: one PNG per plot, 800 x 450 pixels, from the runs `dlc.observe.runs` read.

Eval loss against tokens and wall time (runs overlaid), train loss per learner (a file per run),
goodput over time with faults marked (runs overlaid), each run's timeline of learner states under
its goodput, and bytes sent beside what data-parallel training would have sent. matplotlib is
imported inside the functions, so `dlc --help` and `dlc status` never load it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from dlc.observe.reader import dp_equivalent_bytes
from dlc.observe.runs import RunData, goodput_series, learner_steps_at
from dlc.observe.timeline import STATES, row_name, row_order
from dlc.units import MIB

FIGSIZE_IN = (8.0, 4.5)
DPI = 100  # every PNG is 800 x 450 pixels
FAULT_STARTS = ("injected", "died")  # chaos.jsonl phases, and events.jsonl's for unplanned deaths
RECOVERIES = ("recovered", "first_push")


def _figure() -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _save(fig: Any, ax: Any, path: Path) -> Path:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=DPI)
    return path


def plot_eval(runs: list[RunData], out: Path) -> list[Path]:
    written = []
    for name, xlabel in (("tokens", "tokens trained (all learners)"), ("time", "wall time (min)")):
        fig, ax = _figure()
        for run in runs:
            x = [m.get("tokens", 0) if name == "tokens" else (m["t"] - run.t0) / 60 for m in run.evals]
            ax.plot(x, [m["eval_loss"] for m in run.evals], marker="o", markersize=3, label=run.label)
        ax.set(xlabel=xlabel, ylabel="eval loss (nats/byte)", title=f"global eval loss against {name}")
        written.append(_save(fig, ax, out / f"eval_loss_vs_{name}.png"))
    return written


def plot_train(run: RunData, out: Path) -> Path:
    fig, ax = _figure()
    for learner, rows in sorted(run.train.items()):
        steps, losses = [m.get("step", 0) for m in rows], [m["loss"] for m in rows]
        ax.plot(steps, losses, marker="o", markersize=3, label=f"learner {learner}")
    if run.evals:
        steps = [m.get("step", 0) for m in run.evals]
        ax.plot(steps, [m["eval_loss"] for m in run.evals], "k--", marker="o", markersize=3, label="global eval")
    ax.set(xlabel="learner step", ylabel="loss (nats/byte)", title=f"{run.label}: train loss per learner")
    return _save(fig, ax, out / f"train_loss_{run.label}.png")


def plot_goodput(runs: list[RunData], out: Path) -> Path:
    fig, ax = _figure()
    ylabels = []
    for run in runs:
        x, y, ylabel = goodput_series(run)
        ylabels.append(ylabel)
        (line,) = ax.plot(x / 60, 100 * y, label=run.label)
        for fault in run.chaos:
            phase, t = fault.get("phase"), fault.get("t")
            if phase in FAULT_STARTS + RECOVERIES and isinstance(t, int | float):
                ax.axvline((t - run.t0) / 60, color=line.get_color(), ls="--" if phase in FAULT_STARTS else ":", lw=1)
                if phase in FAULT_STARTS:
                    what = f"{fault.get('fault')} {fault.get('target', '')}" if phase == "injected" else None
                    _label(ax, (t - run.t0) / 60, what or f"{fault.get('target', '')} {phase}")
        _mark_death(ax, run, line.get_color())
    ylabel = ylabels[0] if len(set(ylabels)) == 1 else "goodput (%; see report.md)"
    ax.set(xlabel="wall time (min)", ylabel=ylabel, title="goodput over time (dashed: fault, dotted: recovered)")
    ax.set_ylim(0, 110)
    return _save(fig, ax, out / "goodput.png")


STATE_COLORS = {
    "starting": "0.75",
    "training": "tab:green",
    "slow": "yellowgreen",
    "stalled": "tab:purple",
    "dead": "0.2",
    "leaving": "tab:brown",
    "preempted": "tab:pink",
    "restarting": "tab:red",
    "rejoining": "tab:orange",
    "spare": "lightsteelblue",
}


def plot_timeline(run: RunData, out: Path) -> Path:
    """The run's goodput over a sliding window above each learner's states: a fault as a dip, and
    the learner it hit going from training to dead, restarting, rejoining and training again."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 2))
    x, y, ylabel = goodput_series(run)
    top.plot(x / 60, 100 * y, color="k", lw=1)
    top.set(ylabel="%", ylim=(0, 110), title=f"{run.label}: {ylabel.removesuffix(' (%)')}; learner states")
    top.grid(alpha=0.3)
    learners = sorted({i.learner for i in run.intervals}, key=row_order)
    for row, learner in enumerate(learners):
        spans = [i for i in run.intervals if i.learner == learner]
        for state in STATES:
            bars = [((i.start - run.t0) / 60, (i.end - i.start) / 60) for i in spans if i.state == state]
            if bars:
                bottom.broken_barh(bars, (row - 0.4, 0.8), color=STATE_COLORS[state])
    bottom.set(xlabel="wall time (min)", yticks=range(len(learners)), yticklabels=[row_name(i) for i in learners])
    bottom.invert_yaxis()
    bottom.grid(alpha=0.3, axis="x")
    shown = [s for s in STATES if any(i.state == s for i in run.intervals)]
    if shown:
        handles = [Patch(color=STATE_COLORS[s], label=s) for s in shown]
        bottom.legend(handles=handles, fontsize=7, ncols=len(shown), loc="upper center", bbox_to_anchor=(0.5, -0.25))
    path = out / f"timeline_{run.label}.png"
    fig.savefig(path, dpi=DPI)
    return path


def _label(ax: Any, x_min: float, text: str) -> None:
    """A fault's name along its line, read bottom to top: close faults do not overwrite each other."""
    ax.annotate(text, (x_min, 108), rotation=90, va="top", ha="right", fontsize=7)


def _mark_death(ax: Any, run: RunData, color: str) -> None:
    """A learner that died without a chaos record: mark its last push."""
    found = re.search(r"learner (\d+) died", str(run.state.get("error") or ""))
    if not found:
        return
    learner = int(found.group(1))
    last = max((t for t, _ in run.steps.get(learner, [])), default=None)
    if last is not None:
        ax.axvline((last - run.t0) / 60, color=color, ls="--", lw=1)
        _label(ax, (last - run.t0) / 60, f"learner {learner} died")


def plot_bytes(runs: list[RunData], out: Path) -> Path:
    fig, ax = _figure()
    for run in runs:
        if not run.sent:
            continue
        times = np.array([t - run.t0 for t, _ in run.sent])
        (line,) = ax.plot(times / 60, np.cumsum([b for _, b in run.sent]) / MIB, label=f"{run.label}: sent")
        dp = dp_equivalent_bytes(run.params, 1)
        if dp and run.steps:
            grid = np.linspace(0.0, float(times.max()), 200)
            dp_mib = learner_steps_at(run, grid) * dp / MIB
            ax.plot(grid / 60, dp_mib, ls="--", color=line.get_color(), label=f"{run.label}: data-parallel")
    ax.set_yscale("log")
    ax.set(xlabel="wall time (min)", ylabel="bytes sent up (MiB, log)", title="bytes sent vs data-parallel (fp32)")
    return _save(fig, ax, out / "bytes_sent.png")
