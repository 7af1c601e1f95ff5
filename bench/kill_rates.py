"""What failures cost: goodput, rejoin time and quality at several kill rates, at equal tokens.

    python bench/kill_rates.py [--rates 0,1,4] [--tokens 1228800] [--recipe recipes/tiny.yaml]

Each rate (kills per learner per minute, Poisson, seeded) runs the recipe on the real CLI with
a chaos plan, stopping at the same number of trained tokens. Prints a Markdown table (goodput,
badput by bucket, kills, median rejoin time from kill to first accepted push and where it
went, final eval loss) and records it, with the command, commit, machine and date, in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import runner


def train(recipe: str, run_dir: Path, rate: float, tokens: int, seed: int) -> dict:
    """The summary of one run of the recipe to `tokens` trained tokens under `rate` kills."""
    plan = run_dir.parent / f"{run_dir.name}.yaml"
    plan.write_text(
        f"seed: {seed}\nduration_s: 3600\nwarmup_s: 10\nmin_gap_s: 0\nmax_concurrent: 3\n"
        f"kill_per_learner_per_min: {rate}\n"
    )
    overrides = ("run.max_steps=null", f"run.max_tokens={tokens}", "eval.every_steps=100000")
    runner.train(recipe, run_dir, *overrides, plan=plan if rate > 0 else None).check()
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--rates", default="0,1,4", help="kills per learner per minute, comma-separated")
    ap.add_argument("--tokens", type=int, default=4 * 300 * 16 * 64, help="tokens trained by every run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    with runner.refusing_bad_input():  # 0 is a run without kills
        rates = runner.numbers("--rates", args.rates, float, sign="non-negative")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in rates:
            run_dir = Path(tmp) / f"rate-{rate:g}"
            summary = train(args.recipe, run_dir, rate, args.tokens, args.seed)
            kills = [k for k in runner.kill_timings(run_dir) if "first_push" in k]
            rows.append((rate, summary, kills))
            print(f"rate {rate:g}: goodput {summary['goodput']}, {len(kills)} rejoins", file=sys.stderr)

    def median(kills: list[dict[str, float]], key: str) -> str:
        values = [k[key] for k in kills if key in k]
        return f"{statistics.median(values):.1f}" if values else "-"

    lines = [
        f"Every run stops at {args.tokens:,} trained tokens. Rejoin times are medians in seconds after the "
        "kill: detected, process restarted, state copied from a peer (copy itself in brackets), first "
        "accepted push (includes compiling the step).",
        "",
        "| kills / learner / min | kills | goodput | goodput after start-up | startup s | dead s | rejoining s | "
        "wasted s | detected | restarted | state copied (copy) | first push | wall s | final eval loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, s, kills in rows:
        b = s["badput"]
        rows_ = s["goodput_by_learner"].values()
        productive = sum(r["productive"] for r in rows_)
        after_startup = productive / sum(sum(v for k, v in r.items() if k not in ("goodput", "startup")) for r in rows_)
        lines.append(
            f"| {rate:g} | {sum(s.get('restarts', {}).values())} | **{s['goodput']:.3f}** | {after_startup:.3f} | "
            f"{b['startup']:.0f} | "
            f"{b['dead']:.0f} | {b['rejoining']:.1f} | {b['wasted']:.1f} | {median(kills, 'detected')} | "
            f"{median(kills, 'restarted')} | {median(kills, 'state_copied')} ({median(kills, 'copy_s')}) | "
            f"{median(kills, 'first_push')} | {s['wall_s']:.0f} | {s['eval_loss_final']:.4f} |"
        )
    command = runner.bench_command(
        "kill_rates.py",
        ["--recipe", args.recipe, "--rates", args.rates, "--tokens", str(args.tokens)]
        + (["--seed", str(args.seed)] if args.seed else []),
    )
    title = runner.heading("Goodput at several kill rates", ap, args, ("recipe", "rates"))
    runner.record(title, runner.Provenance.here(command), "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
