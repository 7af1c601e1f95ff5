"""The training algorithms side by side, clean and under faults, at equal tokens, on the real CLI.

    python bench/compare.py [--algorithms decoupled,diloco,dp] [--scenarios clean,kills,stragglers,thin]
                            [--repeats 2] [--tokens 1228800] [--target-loss X] [--keep DIR] [--dry-run]
    python bench/compare.py --from-json DIR/compare.json [--target-loss X]

Every scenario x algorithm x repeat trains the recipe to the same token budget with ~8 evals (run.seed
fixed, so model and data are identical; the repeat index seeds the chaos plan), plus one
`algorithm=none` run per repeat of the clean scenario as the throughput reference of every
scenario (a learner that never syncs steps as fast under kills or thin links; under stragglers the
ratio also carries the straggler's own slowness). Time to target
counts from the moment every learner has compiled and trains. Scenarios:
  clean       no faults;
  kills       Poisson SIGKILLs, --kill-rate per learner per minute after a 20 s warm-up;
  stragglers  learner 3 three times slower for the whole run, plus two stalls longer than the
              heartbeat timeout;
  thin        every learner's link to the syncer so thin that one fp32 gradient takes --thin-ratio
              steps to send (a 12B model's bf16 gradient over 5 Gbit/s takes ~20 steps of ~2 s), 30 ms
              latency; runs stop at --max-wall-s, since data-parallel may never reach the budget.
The clean scenario runs first: its `none` run measures the step time the thin link and the stall
times are sized from, and its worst final eval loss is the default target loss. Prints a Markdown
table (goodput, bytes per token, time to target, final eval loss, throughput vs none) and a table of
the paper's claims at our scale (compare_tables.py), and records both, with the command, commit,
machine and date, in bench/RESULTS.md. Every run's summary and the rows are saved in compare.json
next to the runs, from which --from-json re-renders the tables without training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import runner
from compare_tables import (
    SCENARIOS,
    THIN_LATENCY_MS,
    measured_step_s,
    merge_results,
    provenance,
    read_run,
    render,
    title,
)
from runner import say

PACED = ("clean",)  # scenarios that get their own `none` reference run
SLOW_LEARNER = 3  # the straggler in the stragglers scenario (recipes/tiny.yaml has learners 0-3)
SLOW_FACTOR = 3.0
STALL_S = 8.0  # longer than the 5 s heartbeat timeout, so rounds stop waiting for the stalled learner
NO_EVAL_STEPS = 10**9
PROGRESS_EVERY_S = 30.0


# ---------------------------------------------------------------------------------------------
# What to run


def recipe_facts(recipe_path: str) -> dict[str, Any]:
    """Parameter count and tokens per step of the recipe (builds the model: imports JAX)."""
    from dlc.config.load import load_recipe
    from dlc.core.model import build_model, count_params

    recipe = load_recipe(runner.REPO / recipe_path)
    learners = recipe.learners
    return {
        "n_params": count_params(build_model(recipe.model, recipe.run.seed)[1]),
        "learners": learners.count,
        "tokens_per_step": [learners.resolved(i).batch_size * learners.seq_len for i in range(learners.count)],
    }


def thin_mbps(n_params: int, step_s: float, ratio: float) -> float:
    """A link on which one fp32 gradient (8 * 4 * n_params bits) takes `ratio` steps to send."""
    return 8 * 4 * n_params / (ratio * step_s) / 1e6


def overrides_for(scenario: str, algorithm: str, args: argparse.Namespace, facts: dict, sizing: dict) -> list[str]:
    steps = math.ceil(args.tokens / sum(facts["tokens_per_step"]))  # inner steps per learner
    every = NO_EVAL_STEPS if algorithm == "none" else max(1, steps // 8)
    # A variant of an algorithm is named ALGORITHM+LABEL ("decoupled+spares") and set with --set.
    out = [f"algorithm={algorithm.partition('+')[0]}", "run.max_steps=null", f"run.max_tokens={args.tokens}"]
    out += [f"eval.every_steps={every}"]
    out += [item.partition(":")[2] for item in args.set if item.partition(":")[0] == algorithm]
    if scenario == "thin":
        out += [
            f"learners.bandwidth_mbps={sizing['thin_mbps']:.4g}",
            f"learners.latency_ms={THIN_LATENCY_MS:g}",
            f"run.max_wall_s={args.max_wall_s:g}",
        ]
    return out


def plan_for(scenario: str, repeat: int, args: argparse.Namespace, facts: dict, sizing: dict) -> dict | None:
    """The chaos plan of a scenario, as data; None when it injects nothing."""
    if scenario == "kills":
        return {
            "description": f"Poisson kills, {args.kill_rate:g} per learner per minute",
            "seed": repeat,
            "warmup_s": 20,
            "min_gap_s": 5,
            "max_concurrent": 2,
            "in_flight_max_s": 60,
            "allow_below_quorum": True,  # the same faults for every algorithm, whatever its quorum
            "kill_per_learner_per_min": args.kill_rate,
        }
    if scenario == "stragglers":
        # Stalls at a third and two thirds of the expected training time (the chaos clock starts
        # once every learner trains), so they land inside the run whatever the token budget.
        train_s = math.ceil(args.tokens / sum(facts["tokens_per_step"])) * sizing["step_s"]
        stalled = [i for i in range(facts["learners"]) if i != SLOW_LEARNER][-2:]
        return {
            "description": f"learner {SLOW_LEARNER} x{SLOW_FACTOR:g} slower throughout; two {STALL_S:g} s stalls",
            "seed": repeat,
            "warmup_s": 0,
            "min_gap_s": 0,
            "max_concurrent": 3,
            "allow_below_quorum": True,
            "timeline": [
                {"at_s": 0, "fault": "slow", "learner": SLOW_LEARNER, "factor": SLOW_FACTOR, "until_end": True},
                *(
                    {"at_s": round((k + 1) * train_s / 3, 1), "fault": "stall", "learner": i, "duration_s": STALL_S}
                    for k, i in enumerate(stalled)
                ),
            ],
        }
    return None


def command(recipe: str, run_dir: Path, overrides: list[str], plan_file: Path | None) -> list[str]:
    return runner.train_command(recipe, run_dir, *overrides, plan=plan_file, fresh=True)


def check(recipe: str, overrides: list[str], plan: dict | None) -> str | None:
    """Why this run would be refused by the recipe or plan checks, or None."""
    from chaos.plan import plan_from_dict
    from dlc.config.load import load_recipe
    from dlc.errors import UserError

    try:
        load_recipe(runner.REPO / recipe, overrides)
        if plan is not None:
            plan_from_dict(plan)
    except UserError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------------------------
# Running one


def _progress(run_dir: Path) -> str:
    try:
        status = json.loads((run_dir / "status.json").read_text())
        return f", {status['state']}, {status['progress']:.0%} of the budget"
    except (OSError, ValueError, KeyError, TypeError):
        return ", starting"


# ---------------------------------------------------------------------------------------------
# The bench


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument(
        "--algorithms",
        default="decoupled,diloco,dp",
        help="comma-separated: decoupled, diloco, dp, or a variant ALGORITHM+LABEL given its overrides by --set "
        "(e.g. decoupled+spares with --set decoupled+spares:learners.spares=1)",
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated: {', '.join(SCENARIOS)}")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4 * 300 * 16 * 64, help="tokens trained by every run")
    ap.add_argument("--target-loss", type=float, help="default: worst final eval loss of the clean runs")
    ap.add_argument("--kill-rate", type=float, default=0.5, help="kills scenario: kills per learner per minute")
    ap.add_argument("--thin-ratio", type=float, default=20.0, help="thin: steps one fp32 gradient takes to send")
    ap.add_argument("--step-s", type=float, help="inner step time (s); default: measured by the clean none run, or 0.2")
    ap.add_argument("--max-wall-s", type=float, default=600.0, help="thin: stop every run after this many seconds")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="kill a run's process group after this long")
    ap.add_argument(
        "--keep",
        help="directory for the run directories and compare.json (default: a new temp dir, checkpoints deleted)",
    )
    ap.add_argument("--out", help="record the tables here (default bench/RESULTS.md; with --from-json: nowhere)")
    ap.add_argument(
        "--from-json",
        action="append",
        help="re-render the tables from compare.json files instead of training; a later file's runs replace "
        "an earlier one's of the same scenario, algorithm and repeat",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ALGORITHM:KEY=VALUE",
        help="a recipe override for one algorithm's runs only, e.g. decoupled:syncer.quorum=4",
    )
    ap.add_argument("--skip-none", action="store_true", help="no `none` reference runs (give --step-s)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and the thin link, run nothing")
    args = ap.parse_args()
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    if "none" in args.algorithms:
        ap.error("algorithm none always runs as the reference: leave it out of --algorithms")
    args.scenarios = [s for s in SCENARIOS if s in args.scenarios.split(",")]  # clean first: it sizes the rest
    return args


def main() -> None:
    args = parse_args()
    if args.from_json:
        with runner.refusing_bad_input():  # a file that is missing or not JSON
            data = merge_results([runner.saved_json(f) for f in args.from_json])
        text, _ = render(data, args.target_loss)
        if args.out:
            runner.record(title(data["meta"]), provenance(data["meta"]), text, args.out)
        else:
            print(text)
        return
    facts = recipe_facts(args.recipe)
    sizing = {"step_s": args.step_s or 0.2, "step_s_source": "--step-s" if args.step_s else "default"}
    sizing["thin_mbps"] = thin_mbps(facts["n_params"], sizing["step_s"], args.thin_ratio)
    schedule = [
        (s, a, rep)
        for s in args.scenarios
        for rep in range(args.repeats)
        for a in _order(s, args.algorithms, rep, args.skip_none)
    ]
    if args.dry_run:
        dry_run(args, schedule, facts, sizing)
        return
    for scenario, algorithm, rep in schedule:  # refuse a typo now, not an hour in
        overrides = overrides_for(scenario, algorithm, args, facts, sizing)
        problem = check(args.recipe, overrides, plan_for(scenario, rep, args, facts, sizing))
        if problem:
            raise SystemExit(f"{scenario} {algorithm}: {problem}")
    root = Path(args.keep or tempfile.mkdtemp(prefix="dlc-compare-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python bench/compare.py " + shlex.join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "commit": runner.checkout_commit(),
        "machine": runner.this_machine(),
        **{k: getattr(args, k) for k in ("recipe", "algorithms", "scenarios", "repeats", "tokens", "max_wall_s")},
        **{k: getattr(args, k) for k in ("thin_ratio", "kill_rate")},
        "n_params": facts["n_params"],
        **sizing,
    }
    runs: list[dict[str, Any]] = []
    say(f"{len(schedule)} runs, run directories in {root}")
    for n, (scenario, algorithm, rep) in enumerate(schedule, 1):
        label = f"[{n}/{len(schedule)}] {scenario} {algorithm} #{rep}"
        runs.append(run_one(args, scenario, algorithm, rep, root, facts, sizing, label))
        if sizing["step_s_source"] == "default":
            resize(sizing, runs, facts, args.thin_ratio)
        meta |= sizing
        _save(root, meta, runs, args.target_loss)
    text, _ = render({"meta": meta, "runs": runs}, args.target_loss)
    text += f"\nRaw results: `{root / 'compare.json'}` (re-render with `--from-json`).\n"
    runner.record(title(meta), provenance(meta), text, args.out or runner.RESULTS)


def dry_run(args: argparse.Namespace, schedule: list[tuple[str, str, int]], facts: dict, sizing: dict) -> None:
    root = Path(args.keep or "$TMPDIR/dlc-compare-XXXX")
    measured = "" if args.step_s else "; the real run measures it with the clean none run"
    print(
        f"# {len(schedule)} runs; {facts['n_params']:,} parameters; thin link {sizing['thin_mbps']:.4g} Mbit/s "
        f"+ {THIN_LATENCY_MS:g} ms at a step of {sizing['step_s']:g} s ({sizing['step_s_source']}{measured})"
    )
    for scenario, algorithm, rep in schedule:
        run_dir = root / f"{scenario}-{algorithm}-{rep}"
        chaos = plan_for(scenario, rep, args, facts, sizing)
        overrides = overrides_for(scenario, algorithm, args, facts, sizing)
        print(shlex.join(command(args.recipe, run_dir, overrides, run_dir.with_suffix(".yaml") if chaos else None)))
        if chaos:
            print(f"#   plan: {json.dumps(chaos)}")
        problem = check(args.recipe, overrides, chaos)
        if problem:
            print("#   refused today: " + " ".join(problem.split()))


def resize(sizing: dict[str, Any], runs: list[dict[str, Any]], facts: dict, ratio: float) -> None:
    """Size the thin link and the stall times from the step time the clean `none` run measured."""
    ref = next((r for r in runs if (r["scenario"], r["algorithm"]) == ("clean", "none") and r["summary"]), None)
    step_s = measured_step_s(ref["summary"], facts["tokens_per_step"]) if ref else None
    if step_s:
        sizing |= {"step_s": step_s, "step_s_source": "measured by the clean none run"}
        sizing["thin_mbps"] = thin_mbps(facts["n_params"], step_s, ratio)
        say(f"step {step_s:.3f} s: thin link {sizing['thin_mbps']:.4g} Mbit/s")


def run_one(
    args: argparse.Namespace, scenario: str, algorithm: str, rep: int, root: Path, facts: dict, sizing: dict, label: str
) -> dict[str, Any]:
    """Train one scenario x algorithm x repeat; what `read_run` found, with how it was run."""
    run_dir = root / f"{scenario}-{algorithm}-{rep}"
    chaos = plan_for(scenario, rep, args, facts, sizing)
    plan_file = run_dir.with_suffix(".yaml") if chaos else None
    if plan_file:
        import yaml

        plan_file.write_text(yaml.safe_dump(chaos, sort_keys=False))
    cmd = command(args.recipe, run_dir, overrides_for(scenario, algorithm, args, facts, sizing), plan_file)
    say(f"{label}: started")
    started = time.monotonic()
    timeout_s = max(args.timeout_s, args.max_wall_s + 600) if scenario == "thin" else args.timeout_s
    error = runner.run(
        cmd,
        runner.log_beside(run_dir),
        timeout_s=timeout_s,
        progress=lambda elapsed_s: say(f"  {label}: {elapsed_s:.0f} s{_progress(run_dir)}"),
        every_s=PROGRESS_EVERY_S,
    ).error()
    run = {
        "scenario": scenario,
        "algorithm": algorithm,
        "repeat": rep,
        "run_dir": str(run_dir),
        "command": shlex.join(cmd),
        "plan": chaos,
        "error": error,
        **read_run(run_dir),
    }
    if not args.keep:  # the tables never read checkpoints; 32 runs of them fill a small /tmp
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    s = run["summary"] or {}
    say(
        f"{label}: {'FAILED ' + error if error else 'done'} in {time.monotonic() - started:.0f} s; "
        f"goodput {s.get('goodput')}, final eval loss {s.get('eval_loss_final')}, {s.get('tokens_total')} tokens"
    )
    return run


def _order(scenario: str, algorithms: list[str], repeat: int, skip_none: bool = False) -> list[str]:
    """The reference first (the clean one sizes the thin link), then the algorithms, rotated per repeat.

    Only scenarios that change a learner's own pace get their own reference run.
    """
    k = repeat % len(algorithms) if algorithms else 0
    reference = ["none"] if scenario in PACED and not skip_none else []
    return [*reference, *algorithms[k:], *algorithms[:k]]


def _save(root: Path, meta: dict[str, Any], runs: list[dict[str, Any]], target_arg: float | None) -> None:
    """compare.json after every run, so an interrupted bench keeps what it measured."""
    _, rows = render({"meta": meta, "runs": runs}, target_arg)
    tmp = root / ".compare.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "runs": runs, "rows": rows}, indent=1))
    os.replace(tmp, root / "compare.json")


if __name__ == "__main__":
    main()
