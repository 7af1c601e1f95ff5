"""`dlc report`: PNG plots and a Markdown table comparing runs, read from their run directories.

Plots: eval loss against tokens and against wall time (runs overlaid), train loss per learner
(one file per run), goodput over a sliding window with faults marked (runs overlaid), each run's
timeline of learner states under its goodput, bytes sent over time beside what data-parallel
training would have sent. matplotlib is imported inside the plotting functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlc.observe.console import fmt_duration
from dlc.observe.reader import count_params, device_summary, dp_equivalent_bytes, lifecycle_entry, read_recipe
from dlc.observe.timeline import (
    STATES,
    Interval,
    learner_intervals,
    row_name,
    row_order,
    window_for,
    windowed_goodput,
)
from dlc.run.files import CHAOS_FILE, EVENTS_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE, read_json, read_jsonl

FIGSIZE_IN = (8.0, 4.5)
DPI = 100  # every PNG is 800 x 450 pixels
MIB = 2**20
REPORT_FILE = "report.md"
FAULT_STARTS = ("injected", "died")  # chaos.jsonl phases, and events.jsonl's for unplanned deaths
RECOVERIES = ("recovered", "first_push")


@dataclass
class RunData:
    """What the plots and the table need from one run directory."""

    path: Path
    label: str
    recipe: dict[str, Any]
    state: dict[str, Any]  # summary.json when the run ended, else status.json
    evals: list[dict[str, Any]] = field(default_factory=list)
    train: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    goodput: list[tuple[float, float]] = field(default_factory=list)  # (t, fraction) samples, if logged
    ledger: list[tuple[float, float, float]] = field(default_factory=list)  # (t, productive_s, allocated_s)
    intervals: list[Interval] = field(default_factory=list)  # each learner's states over time
    merged: list[tuple[float, float]] = field(default_factory=list)  # (t, tokens a round merged)
    sent: list[tuple[float, int]] = field(default_factory=list)  # (t, bytes of one push)
    steps: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # learner -> (t, step)
    chaos: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0
    devices: str | None = None  # learners per device, from learner_started events (runs whose rows lack it)

    @property
    def params(self) -> int | None:
        return count_params(self.recipe.get("model") or {})

    def tokens_per_step(self, learner: int) -> int:
        cfg = self.recipe.get("learners") or {}
        batch = next(
            (o["batch_size"] for o in cfg.get("overrides") or [] if o.get("index") == learner and o.get("batch_size")),
            cfg.get("batch_size", 0),
        )
        return int(batch) * int(cfg.get("seq_len", 0))


def load_run(path: Path, label: str) -> RunData:
    summary, status = read_json(path / SUMMARY_FILE), read_json(path / STATUS_FILE) or {}
    run = RunData(path, label, read_recipe(path), summary or status)
    events, _ = read_jsonl(path / EVENTS_FILE)
    metrics, _ = read_jsonl(path / METRICS_FILE)
    run.chaos, _ = read_jsonl(path / CHAOS_FILE)
    if not run.chaos:  # no chaos: deaths and recoveries of learners killed from outside
        run.chaos = [entry for e in events if (entry := lifecycle_entry(e)) is not None]
    starts = [e["t"] for e in events if e.get("kind") == "run_started" and isinstance(e.get("t"), int | float)]
    stamps = [m["t"] for m in metrics if isinstance(m.get("t"), int | float)]
    run.t0 = min(starts or stamps or [0.0])
    for m in metrics:
        if not isinstance(m.get("t"), int | float):
            continue
        if m.get("kind") == "eval" and isinstance(m.get("eval_loss"), int | float):
            run.evals.append(m)
        elif m.get("kind") == "train" and isinstance(m.get("learner"), int) and isinstance(m.get("loss"), int | float):
            run.train.setdefault(m["learner"], []).append(m)
        elif m.get("kind") == "goodput" and isinstance(m.get("goodput"), int | float):
            run.goodput.append((m["t"], m["goodput"]))
            if isinstance(m.get("productive_s"), int | float) and isinstance(m.get("allocated_s"), int | float):
                run.ledger.append((m["t"], m["productive_s"], m["allocated_s"]))
    started = {e.get("learner"): e["device"] for e in events if e.get("kind") == "learner_started" and "device" in e}
    run.devices = device_summary(list(started.values()))
    fragments = int((run.recipe.get("syncer") or {}).get("fragments") or 1)
    learner_sent = any(e.get("kind") == "push_sent" for e in events)  # older logs: the learner's view
    pending: set[int] = set()  # learners started and not yet seen pushing
    for e in events:
        kind, t, learner = e.get("kind"), e.get("t"), e.get("learner")
        if not isinstance(t, int | float):
            continue
        if kind == "round_closed":
            # Each fragment's round carries the tokens since that fragment was last sent, so one
            # step's tokens reach P rounds: tokens / P is the progress merged.
            run.merged.append((t, sum(x for x in e.get("tokens") or [] if isinstance(x, int | float)) / fragments))
        elif kind == ("push_sent" if learner_sent else "push_accepted") and isinstance(e.get("bytes"), int):
            run.sent.append((t, e["bytes"]))
        elif kind in ("run_resumed", "learner_stopped") and isinstance(learner, int) and isinstance(e.get("step"), int):
            run.steps.setdefault(learner, []).append((t, e["step"]))
        if kind == "learner_started" and isinstance(learner, int):
            pending.add(learner)
        elif kind in ("push_sent", "push_accepted", "push_rejected") and learner in pending:
            # A learner's first push marks when it began stepping (compilation comes first).
            pending.discard(learner)
            rows = run.steps.setdefault(learner, [])
            rows.append((t, rows[-1][1] if rows else 0))
    for learner, rows in run.train.items():
        run.steps.setdefault(learner, []).extend((m["t"], int(m.get("step") or 0)) for m in rows)
    for rows in run.steps.values():
        rows.sort()
    stamps = [x["t"] for x in [*events, *metrics] if isinstance(x.get("t"), int | float)]
    run.intervals = learner_intervals(events, max(stamps, default=run.t0))
    return run


def labels_for(paths: list[Path]) -> list[str]:
    """Directory names, made unique and safe as file names."""
    labels: list[str] = []
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", path.resolve().name) or "run"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}-{n}", n + 1
        labels.append(label)
    return labels


# -- derived series ----------------------------------------------------------------------------


def merged_share(run: RunData, bins: int = 60, min_width_s: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Tokens merged per second per time bin, as a share of the run's steady rate (90th percentile).

    Without rounds (algorithm none) the tokens the learners trained stand in for merged ones.
    """
    if run.merged:
        times, tokens = np.array([t for t, _ in run.merged]), np.array([x for _, x in run.merged])
    else:
        rows = [(m["t"], i, int(m.get("tokens") or 0)) for i, ms in run.train.items() for m in ms]
        last: dict[int, int] = {}
        times_l, tokens_l = [], []
        for t, i, tok in sorted(rows):
            times_l.append(t)
            tokens_l.append(max(0, tok - last.get(i, 0)))
            last[i] = tok
        times, tokens = np.array(times_l), np.array(tokens_l, dtype=float)
    times = times - run.t0
    if times.size < 2:
        return np.array([]), np.array([])
    width = max(min_width_s, float(times.max()) / bins)  # a few steps per bin, or rates alias
    edges = np.arange(0.0, float(times.max()) + width, width)
    rate = np.histogram(times, bins=edges, weights=tokens)[0] / width
    steady = float(np.percentile(rate, 90))
    return edges[1:], np.minimum(1.0, rate / steady) if steady > 0 else np.zeros_like(rate)


def learner_steps_at(run: RunData, times: np.ndarray) -> np.ndarray:
    """Steps taken by all learners together at each time (since start), interpolated per learner."""
    total = np.zeros_like(times, dtype=float)
    for rows in run.steps.values():
        xs = np.array([t - run.t0 for t, _ in rows])
        ys = np.maximum.accumulate(np.array([float(step) for _, step in rows]))
        total += np.interp(times, xs, ys, left=0.0)
    return total


# -- plots -------------------------------------------------------------------------------------


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


def goodput_series(run: RunData) -> tuple[np.ndarray, np.ndarray, str]:
    """Goodput over time since start, best first: over a sliding window (runs that log the ledger's
    totals), cumulative (older runs), or tokens merged per second as a share of the steady rate
    (runs that log no goodput); with what it is."""
    if len(run.ledger) >= 2:
        window = window_for(run.ledger[-1][0] - run.t0)
        x, y = windowed_goodput(run.ledger, window)
        return x - run.t0, y, f"goodput over {window:.0f} s (%)"
    if run.goodput:
        x, y = np.array([t - run.t0 for t, _ in run.goodput]), np.array([g for _, g in run.goodput])
        return x, y, "goodput since start (%)"
    x, y = merged_share(run)
    return x, y, "tokens merged/s, % of steady"


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


# -- the table ---------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table_rows(run: RunData) -> list[tuple[str, str]]:
    s = run.state
    sync = s.get("syncer") or {}
    up = s.get("bytes_up", sync.get("bytes_up"))
    down = s.get("bytes_down", sync.get("bytes_down", 0))
    steps = sum(int(r.get("step") or 0) for r in s.get("learners") or [])
    dp = dp_equivalent_bytes(run.params, steps)
    rejected = s.get("pushes_rejected", sync.get("rejections")) or {}
    wall, tokens = s.get("wall_s", s.get("elapsed_s")), s.get("tokens_total", s.get("tokens"))
    initial, final = s.get("eval_loss_initial"), s.get("eval_loss_final", s.get("eval_loss"))
    goodput, spared = s.get("goodput"), s.get("goodput_with_spares")
    return [
        ("status", _fmt(s.get("status", s.get("state")))),
        ("algorithm", _fmt(s.get("algorithm"))),
        ("learners", _fmt(len(s.get("learners") or []))),
        ("devices", _fmt(device_summary([r.get("device") for r in s.get("learners") or []]) or run.devices)),
        ("parameters", _fmt(run.params)),
        ("steps (mean per learner)", _fmt(s.get("steps", s.get("step")), 1)),
        ("tokens", _fmt(tokens)),
        ("wall time", fmt_duration(wall)),
        ("throughput (tok/s)", _fmt(tokens / wall if tokens and wall else None, 0)),
        ("eval loss initial", _fmt(initial)),
        ("eval loss final", _fmt(final)),
        ("eval bits/byte final", _fmt(s.get("eval_bpb_final", s.get("eval_bpb")))),
        ("goodput (%)", _fmt(None if goodput is None else 100 * goodput, 1)),
        ("goodput counting hot spares (%)", _fmt(None if spared is None else 100 * spared, 1)),
        ("hot spares idle (s)", _fmt(s.get("spare_s"), 1)),
        ("rounds closed", _fmt(s.get("rounds", sync.get("rounds_closed")))),
        ("contributors/round", _fmt(s.get("mean_contributors", sync.get("mean_contributors")), 2)),
        ("pushes accepted", _fmt(s.get("pushes_accepted", sync.get("pushes_accepted")))),
        ("pushes rejected", _fmt(sum(rejected.values()))),
        ("bytes up (MiB)", _fmt(None if up is None else up / MIB, 2)),
        ("bytes down (MiB)", _fmt(down / MIB, 2)),
        ("data-parallel each way (MiB)", _fmt(None if dp is None else dp / MIB, 2)),
        ("data-parallel / ours up (x)", _fmt(dp / up if dp and up else None, 1)),
        ("data-parallel / ours down (x)", _fmt(dp / down if dp and down else None, 1)),
        ("data-parallel / ours up + down (x)", _fmt(2 * dp / (up + down) if dp and up and down else None, 1)),
        ("faults injected", _fmt(sum(1 for c in run.chaos if c.get("phase") == "injected"))),
        ("error", (str(s.get("error") or "-").splitlines() or ["-"])[0].replace("|", "/")),
    ]


def markdown_table(runs: list[RunData]) -> str:
    rows = [table_rows(run) for run in runs]
    lines = ["| | " + " | ".join(run.label for run in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for k, (name, _) in enumerate(rows[0]):
        lines.append(f"| {name} | " + " | ".join(r[k][1] for r in rows) + " |")
    return "\n".join(lines)


def write_report(paths: list[Path], out: Path) -> list[Path]:
    """Write every plot and report.md into `out`; returns the files written, report.md last."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(path, label) for path, label in zip(paths, labels_for(paths), strict=True)]
    pngs = [
        *plot_eval(runs, out),
        *(plot_train(run, out) for run in runs),
        plot_goodput(runs, out),
        *(plot_timeline(run, out) for run in runs),
        plot_bytes(runs, out),
    ]
    body = ["# dlc report", "", "Runs: " + ", ".join(f"`{run.label}` ({run.path})" for run in runs), ""]
    body += [markdown_table(runs), "", "## Plots", ""] + [f"![{png.stem}]({png.name})" for png in pngs]
    report = out / REPORT_FILE
    report.write_text("\n".join(body) + "\n")
    return [*pngs, report]
