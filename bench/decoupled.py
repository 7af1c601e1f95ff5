"""Decoupled DiLoCo against its baselines, side by side in one invocation, on the real CLI.

    python bench/decoupled.py [--steps 300] [--repeats 2] [--recipe recipes/tiny.yaml] [--set key=value ...]
                              [--vs 'key=value ...' ...]

Measures, with M learners sharing the machine:
  1. learner throughput with the syncer vs the same learners with no synchronisation
     (`algorithm=none`), runs alternated A/B to spread drift, as a ratio of steady-state
     per-learner tokens/s (compile time excluded); each `--vs 'key=value ...'` adds a run of decoupled
     with those overrides to every repeat (`--vs syncer.channel=ray`: the learners' messages as Ray
     actor calls), reported against the same `none` runs, with the standard error of the
     per-repeat ratios; and the same ratio over only the seconds in which every learner of the run
     trains (from its train records), which the start-up and the end of a short run do not tilt;
     and the CPU of every process of each run over those seconds, per learner step, by where it
     goes (the learners' XLA threads, their other threads, the syncer, the rest: `proc_cpu.py`),
     and the CPU ratio with each run scaled to the machine speed of the `none` run beside it
     (`at_speed_of`), whose repeats agree far more closely than the throughput's (compare changes
     within one invocation: between two it moves more than within one);
  2. bytes a learner sends per inner step vs one fp32 gradient of the model;
  3. final global eval bits per byte of M learners vs one learner at the same total tokens.
Prints a Markdown table and records it, with the command, commit, machine and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import runner
from proc_cpu import PARTS, Sampler  # this folder is on the path of a script in it


def train(recipe: str, run_dir: Path, *overrides: str) -> tuple[dict, Sampler]:
    """Run `dlc train` to its end; its summary, and its processes' CPU sampled meanwhile."""
    finished = runner.train(recipe, run_dir, *overrides, watch=Sampler).check()
    return json.loads((run_dir / "summary.json").read_text()), finished.watcher


Series = list[tuple[float, int, int]]  # one learner's train records: (time, step, tokens), by step


def train_series(run_dir: Path) -> list[Series]:
    """Every learner's train records of the run (metrics.jsonl)."""
    from dlc.run.files import read_jsonl

    records: dict[int, Series] = {}
    for r in read_jsonl(run_dir / "metrics.jsonl")[0]:
        if r.get("kind") == "train":
            records.setdefault(r["learner"], []).append((r["t"], r["step"], r["tokens"]))
    return [sorted(v, key=lambda x: x[1]) for v in records.values()]


def all_training_window(run_dir: Path, series: list[Series], steps: int) -> tuple[float, float]:
    """The seconds in which every learner trains: from the last learner's step steps/5 to the
    first learner's step 9*steps/10. The steady rates of the summary start at each learner's own
    first step, so they also count the seconds in which others were still starting or had
    finished, when it had more of the machine to itself."""
    lo = max(next(t for t, s, _ in v if s >= steps // 5) for v in series)
    hi = min(max(t for t, s, _ in v if s <= steps * 9 // 10) for v in series)
    if hi <= lo:
        raise SystemExit(f"{run_dir}: no time in which every learner trained; raise --steps")
    return lo, hi


def at(v: Series, t: float, field: int) -> float:
    """A learner's step (field 1) or tokens (field 2) at time t, linear between its records."""
    for a, b in itertools.pairwise(v):
        if a[0] <= t <= b[0]:
            return a[field] + (b[field] - a[field]) * (t - a[0]) / (b[0] - a[0])
    raise ValueError(f"no train record around t={t}")


def all_training_rate(series: list[Series], lo: float, hi: float) -> float:
    """Tokens/s per learner between lo and hi (`all_training_window`)."""
    return statistics.mean((at(v, hi, 2) - at(v, lo, 2)) / (hi - lo) for v in series)


def cpu_per_step(series: list[Series], lo: float, hi: float, sampler: Sampler) -> dict[str, float] | None:
    """Milliseconds of CPU per learner step between lo and hi, by part (`proc_cpu.PARTS`) and in all."""
    span = sampler.between(lo, hi)
    if span is None:
        return None
    t0, t1, cpu = span
    steps = sum(at(v, t1, 1) - at(v, t0, 1) for v in series)
    per_step = {part: 1000 * cpu[part] / steps for part in PARTS}
    return {**per_step, "all": sum(per_step.values())}


def ratio_rows(measure: str, rates: dict[str, list[float]]) -> list[str]:
    """A table row per decoupled arm: its mean rate over `none`'s, with each repeat's ratio."""
    rows = []
    for name in rates:
        if name == "none":
            continue
        per_repeat = [d / n for d, n in zip(rates[name], rates["none"], strict=True)]
        mean, none = statistics.mean(rates[name]), statistics.mean(rates["none"])
        rows.append(
            f"| {measure}"
            + ("" if name == "decoupled" else f"; {name.split(', ', 1)[1]}")
            + f" | **{mean / none:.3f}**{spread(per_repeat)} (per repeat: "
            + ", ".join(f"{r:.3f}" for r in per_repeat)
            + f"; {mean:.0f} vs {none:.0f} tok/s per learner) |"
        )
    return rows


def cpu_line(used: dict[str, float]) -> str:
    """`used` (`cpu_per_step`) as "44.31 (learners_xla 39.50, ...)"."""
    return f"{used['all']:.2f} (" + ", ".join(f"{part} {used[part]:.2f}" for part in PARTS) + ")"


def cpu_rows(cpu: dict[str, list[dict[str, float]]], repeats: int) -> list[str]:
    """Rows of CPU per learner step while every learner trains, per arm; for each decoupled arm also
    `none`'s CPU per step over its own (on saturated cores, the throughput ratio) and what it adds
    by part, and a row of the same ratio with each run at the machine speed of its repeat's `none`
    run (`at_speed_of`)."""
    if any(len(runs) != repeats for runs in cpu.values()):
        return []  # not sampled (no /proc), or too short a window in some run
    means = {
        name: {part: statistics.mean(r[part] for r in runs) for part in (*PARTS, "all")} for name, runs in cpu.items()
    }
    rows = []
    for name, used in means.items():
        xla = ", ".join(f"{r['learners_xla']:.1f}" for r in cpu[name])
        row = f"| CPU ms per learner step while every learner trains, {name} | {cpu_line(used)}; XLA's per repeat {xla}"
        if name != "none":
            none = means["none"]
            added = ", ".join(f"{part} {used[part] - none[part]:+.2f}" for part in PARTS)
            row += f"; / `none`: **{none['all'] / used['all']:.3f}** ({added})"
        rows.append(row + " |")
    for name, runs in cpu.items():
        if name == "none":
            continue
        per_repeat = [at_speed_of(n, r) for r, n in zip(runs, cpu["none"], strict=True)]
        rows.append(
            f"| the same ratio at `none`'s machine speed, {name}: each run's CPU scaled by `none`'s XLA CPU per "
            f"step over its own, in its repeat | **{statistics.mean(per_repeat):.3f}**{spread(per_repeat)} "
            "(per repeat: " + ", ".join(f"{x:.3f}" for x in per_repeat) + ") |"
        )
    return rows


def at_speed_of(none: dict[str, float], run: dict[str, float]) -> float:
    """`none`'s CPU per step over `run`'s, with `run`'s first scaled to `none`'s machine speed.

    XLA's threads do the same work a step in both arms, so a run whose XLA took more CPU a step ran
    on a slower machine (this one drifts by several percent within minutes); scaling every part of
    it by `none`'s XLA over its own removes that drift, and leaves the protocol's own cost, which is
    what a change to the protocol moves. What the protocol might cost XLA itself (evicting its data)
    goes with the drift: the raw ratio above keeps it.
    """
    return none["all"] / (run["all"] * none["learners_xla"] / run["learners_xla"])


def spread(ratios: list[float]) -> str:
    """The standard error of the per-repeat ratios as " +- 0.006" (repeats differ more than the runs
    of one repeat: this machine's speed drifts), or nothing with one repeat."""
    if len(ratios) < 2:
        return ""
    return f" +- {statistics.stdev(ratios) / len(ratios) ** 0.5:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="inner steps per learner")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--results", default=str(runner.RESULTS))
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for every run (repeatable)"
    )
    ap.add_argument(
        "--vs",
        action="append",
        default=[],
        metavar="'KEY=VALUE ...'",
        help="another decoupled run with these overrides (space-separated; repeatable)",
    )
    args = ap.parse_args()
    M, S = args.learners, args.steps
    common = [
        *args.set,
        f"learners.count={M}",
        f"run.max_steps={S}",
        f"eval.every_steps={10 * S}",
        f"run.log_every_steps={max(1, S // 30)}",
    ]
    arms = {"none": ["algorithm=none"], "decoupled": ["algorithm=decoupled"]}
    arms.update({f"decoupled, {kv}": ["algorithm=decoupled", *kv.split()] for kv in args.vs})
    rates: dict[str, list[float]] = {name: [] for name in arms}
    together: dict[str, list[float]] = {name: [] for name in arms}  # while every learner trains
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in arms}  # per run: `cpu_per_step`
    decoupled: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for k, name in enumerate(list(arms) if rep % 2 == 0 else list(arms)[::-1]):
                run_dir = Path(tmp) / f"{rep}-{k}"
                summary, sampler = train(args.recipe, run_dir, *common, *arms[name])
                series = train_series(run_dir)
                lo, hi = all_training_window(run_dir, series, S)
                rates[name].append(statistics.mean(x["steady_tokens_per_s"] for x in summary["learners"]))
                together[name].append(all_training_rate(series, lo, hi))
                used = cpu_per_step(series, lo, hi, sampler)
                if used is not None:
                    cpu[name].append(used)
                if name == "decoupled":
                    decoupled.append(summary)
                print(
                    f"{name} run {rep}: {rates[name][-1]:.0f} tok/s per learner, "
                    f"{together[name][-1]:.0f} while every learner trains"
                    + ("" if used is None else "; CPU ms per learner step " + cpu_line(used)),
                    file=sys.stderr,
                )
        single, _ = train(
            args.recipe,
            Path(tmp) / "single",
            *args.set,
            "learners.count=1",
            f"run.max_steps={M * S}",
            f"eval.every_steps={10 * M * S}",
        )

    from dlc.config.load import load_recipe
    from dlc.core.model import build_model, count_params

    params = count_params(build_model(load_recipe(args.recipe, args.set).model, 0)[1])
    first = decoupled[0]
    bytes_per_step = statistics.mean(x["bytes_sent"] / x["step"] for x in first["learners"])
    bpb_m = statistics.mean(x["eval_bpb_final"] for x in decoupled)
    lines = [
        f"{params:,} parameters.",
        "",
        "| measure | value |",
        "|---|---|",
        *ratio_rows(f"learner tokens/s with syncer / without (`algorithm=none`), {M} learners each", rates),
        *ratio_rows(f"the same, while every learner trains (steps {S // 5}-{S * 9 // 10})", together),
        f"| bytes sent per learner step / one fp32 gradient ({4 * params:,} B) | "
        f"**1/{4 * params / bytes_per_step:.0f}** ({bytes_per_step:,.0f} B per step) |",
        f"| final eval bits/byte, {M} learners x {S} steps | {bpb_m:.3f} |",
        f"| final eval bits/byte, 1 learner x {M * S} steps (same tokens) | {single['eval_bpb_final']:.3f} |",
        *cpu_rows(cpu, len(rates["none"])),
        f"| mean contributors per round | {statistics.mean(x['mean_contributors'] for x in decoupled):.2f} |",
        f"| rejected pushes | {[x['pushes_rejected'] for x in decoupled]} |",
    ]
    options = ["--recipe", args.recipe, "--learners", str(M), "--steps", str(S), "--repeats", str(args.repeats)]
    options += [f"--set {shlex.quote(kv)}" for kv in args.set] + [f"--vs {shlex.quote(kv)}" for kv in args.vs]
    title = runner.heading("Decoupled DiLoCo against its baselines", ap, args, ("recipe", "learners", "set", "vs"))
    provenance = runner.Provenance.here(runner.bench_command("decoupled.py", options))
    runner.record(title, provenance, "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
