"""`dlc report`: PNG plots and a Markdown table comparing runs, read from their run directories.

`write_report` reads each run (`dlc.observe.runs`), draws the plots (`dlc.observe.plots`) and
writes report.md: one column per run, one row per figure of merit, the plots below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlc.observe.console import fmt_duration
from dlc.observe.plots import plot_bytes, plot_eval, plot_goodput, plot_timeline, plot_train
from dlc.observe.reader import device_summary, dp_equivalent_bytes, mean_adopt_lag
from dlc.observe.runs import RunData, labels_for, load_run
from dlc.units import MIB

REPORT_FILE = "report.md"


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
        ("data", _fmt(run.data)),
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
        ("merge lag (steps, push to adoption)", _fmt(mean_adopt_lag(s.get("learners") or []), 2)),
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
