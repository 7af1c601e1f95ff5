"""What a preemption notice costs: paired runs with and without preemptions, at equal tokens.

    python bench/preemption.py [--rate 1] [--notice-s 10] [--seeds 0,1,2] [--tokens 1228800]

Each seed runs the recipe on the real CLI twice, stopping at the same number of trained tokens: once
with no faults, once under a chaos plan of `preempt` faults (SIGTERM, SIGKILL after the notice;
Poisson, per learner per minute). Prints a Markdown table (preemptions, the progress they lost,
seconds from notice to leaving, the ledger's preempted and wasted seconds, time to push again,
final eval loss of both runs and their paired difference) and records it, with the command, commit,
machine and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import runner


def train(recipe: str, run_dir: Path, rate: float, notice_s: float, tokens: int, seed: int) -> dict:
    """The summary of one run of the recipe to `tokens` trained tokens under `rate` preemptions."""
    plan = run_dir.parent / f"{run_dir.name}.yaml"
    plan.write_text(
        f"seed: {seed}\nduration_s: 3600\nwarmup_s: 10\nmin_gap_s: 0\nmax_concurrent: 2\n"
        f"preempt_per_learner_per_min: {rate}\npreempt_notice_s: {notice_s}\n"
    )
    overrides = (f"run.seed={seed}", "run.max_steps=null", f"run.max_tokens={tokens}", "eval.every_steps=100000")
    runner.train(recipe, run_dir, *overrides, plan=plan if rate > 0 else None).check()
    return json.loads((run_dir / "summary.json").read_text())


def preemptions(run_dir: Path) -> list[dict]:
    from dlc.run.files import read_jsonl

    return [e for e in read_jsonl(run_dir / "events.jsonl")[0] if e.get("kind") == "learner_preempted"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--rate", type=float, default=1.0, help="preemptions per learner per minute")
    ap.add_argument("--notice-s", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--tokens", type=int, default=4 * 300 * 16 * 64, help="tokens trained by every run")
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    with runner.refusing_bad_input():
        seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
    lines = [
        f"Every run stops at {args.tokens:,} trained tokens; `preempt` at {args.rate:g} per learner per minute "
        f"with {args.notice_s:g} s of notice (after a 10 s warm-up, at most 2 at once). Unpushed: steps of "
        "progress a preempted learner had not pushed when it left (the ledger wastes them). Leave: seconds from "
        "its SIGTERM to its progress held by the syncer and its checkpoint written. First push: seconds from "
        "the injection to its replacement's first accepted push, median. Losses: final global eval loss, nats "
        "per byte; the difference is each seed's against its own run without faults.",
        "",
        "| seed | preemptions | SIGKILLed | unpushed steps | leave s, median (max) | preempted s | wasted s | "
        "first push s | goodput, calm / preempted | eval loss, calm | eval loss, preempted | difference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            calm = train(args.recipe, Path(tmp) / f"calm-{seed}", 0.0, args.notice_s, args.tokens, seed)
            run_dir = Path(tmp) / f"preempt-{seed}"
            hit = train(args.recipe, run_dir, args.rate, args.notice_s, args.tokens, seed)
            left = preemptions(run_dir)
            timings = [t for t in runner.kill_timings(run_dir, fault="preempt")]
            injected = len(timings)
            killed = sum(1 for t in timings if "detected" in t)  # its notice ran out: a death
            leave = [e["leave_s"] for e in left]
            first = [t["first_push"] for t in timings if "first_push" in t]
            diff = hit["eval_loss_final"] / calm["eval_loss_final"] - 1
            diffs.append(diff)
            lines.append(
                f"| {seed} | {injected} | {killed} | {sum(e['unpushed_steps'] for e in left):g} | "
                f"{statistics.median(leave):.2f} ({max(leave):.2f}) | {hit['badput']['preempted']:.1f} | "
                f"{hit['badput']['wasted']:.1f} | {statistics.median(first) if first else float('nan'):.1f} | "
                f"{calm['goodput']:.3f} / {hit['goodput']:.3f} | {calm['eval_loss_final']:.4f} | "
                f"{hit['eval_loss_final']:.4f} | {diff:+.2%} |"
                if leave
                else f"| {seed} | {injected} | {killed} | - | - | - | - | - | - | {calm['eval_loss_final']:.4f} | "
                f"{hit['eval_loss_final']:.4f} | {diff:+.2%} |"
            )
            print(f"seed {seed}: {len(left)} left on notice, loss {diff:+.2%}", file=sys.stderr)
    lines.append(
        f"| mean | | | | | | | | | | | {statistics.mean(diffs):+.2%} ({min(diffs):+.2%} to {max(diffs):+.2%}) |"
    )
    command = runner.bench_command(
        "preemption.py",
        ["--recipe", args.recipe, "--rate", f"{args.rate:g}", "--notice-s", f"{args.notice_s:g}", "--seeds",
         args.seeds, "--tokens", str(args.tokens)],
    )  # fmt: skip
    title = runner.heading("Preemption notices", ap, args, ("recipe",))
    runner.record(title, runner.Provenance.here(command), "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
