"""Syncer settings against each other on the in-process twin, several seeds, at equal tokens.

    python bench/ablate.py --set model.width=128 --tokens 1228800 --seeds 0,1 \\
        default adopt=rebase "mix:adopt=mix" "H12:sync_interval_steps=12,fragments=12"
    python bench/ablate.py --batches 64,16,16,16 default weighting=tokens_squared_per_step

Each positional argument is one setting, `LABEL:KEY=VALUE,...` or just `KEY=VALUE,...` (the label is
then the overrides); a key without a dot is a `syncer.` key; `default` runs the recipe as it is.
Every setting x seed trains M learners of the twin (`dlc.engine.local.InProcessRun`: one process, no
Ray, deterministic) to the same token budget, the learners each at its own pace (`--paces`, step
times relative to each other: unequal paces make pushes stale), and reports the global model's eval
loss, its gap to data-parallel (one learner stepping the learners' summed batch for as many steps, the
same seed), each learner's mean merge weight against its share of the tokens, and the share of inner
steps that adoptions discarded. `--jobs` runs that many trainings at once, one XLA thread each.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

DP = "data-parallel"


def parse_setting(text: str) -> tuple[str, list[str]]:
    label, sep, body = text.partition(":")
    if not sep:
        label, body = text, text
    if body == "default":
        return label, []
    overrides = []
    for kv in body.split(","):
        key, eq, value = kv.partition("=")
        if not eq:
            raise SystemExit(f"setting {text!r}: {kv!r} is not KEY=VALUE")
        overrides.append(f"{key if '.' in key else 'syncer.' + key}={value}")
    return label, overrides


def train_one(recipe_path: str, overrides: list[str], paces: list[float], tokens: int, dp: bool) -> dict[str, Any]:
    """One training of the twin (or, with `dp`, of one learner with the summed batch); its results."""
    from dlc.config.load import load_recipe
    from dlc.core.evaluate import Evaluator
    from dlc.core.learner import Learner
    from dlc.data.corpus import load_corpus, split_corpus
    from dlc.data.plan import DataPlan
    from dlc.engine.local import InProcessRun

    t0 = time.monotonic()
    recipe = load_recipe(recipe_path, overrides)
    learners = recipe.learners
    per_step = [learners.resolved(i).batch_size * learners.seq_len for i in range(learners.count)]
    rates = [t / p for t, p in zip(per_step, paces, strict=True)]  # tokens per unit of the twin's clock
    until = tokens / sum(rates)
    steps = math.ceil(until / min(paces))  # the fastest learner's steps: the schedule's length
    if dp:
        batch = sum(learners.resolved(i).batch_size for i in range(learners.count))
        dp_steps = math.ceil(tokens / (batch * learners.seq_len))
        recipe = load_recipe(
            recipe_path, [*overrides, "learners.count=1", "learners.overrides=[]", f"learners.batch_size={batch}"]
        )
        recipe = recipe.model_copy(update={"run": recipe.run.model_copy(update={"max_steps": dp_steps})})
        data = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, 1, recipe.run.seed, 4096))
        learner = Learner(recipe, 0, data.streams[0])
        for _ in range(dp_steps):
            learner.train_step()
        learner.flush()
        loss = Evaluator(recipe, learner.graphdef, data.eval)(learner.params)[0]
        return {"loss": float(loss), "wall_s": time.monotonic() - t0}
    recipe = recipe.model_copy(update={"run": recipe.run.model_copy(update={"max_steps": steps})})
    data = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, learners.count, recipe.run.seed, 4096))
    run = InProcessRun(recipe, data, paces_s=paces)
    run.run_until(until)
    run.finish()
    weights = [[] for _ in range(learners.count)]  # every round's weight of each learner, 0 when it sent nothing
    staleness = []
    for event in run.syncer.events:
        if event["kind"] == "round_closed":
            staleness += event["staleness"]
            given = dict(zip(event["contributors"], event["weights"], strict=True))
            for learner in range(learners.count):
                weights[learner].append(given.get(learner, 0.0))
    trained = [learner.step * t for learner, t in zip(run.learners, per_step, strict=True)]
    discarded = sum(sync.discarded_steps for sync in run.syncs)
    return {
        "loss": float(run.global_eval()),
        "mean_weight": [statistics.fmean(w) if w else 0.0 for w in weights],
        "token_share": [t / sum(trained) for t in trained],
        "discarded": discarded / sum(learner.step for learner in run.learners),
        "rounds": run.syncer.status()["rounds_closed"],
        "stale": sum(v > 0 for v in staleness) / max(len(staleness), 1),  # merged pushes behind the version
        "wall_s": time.monotonic() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("settings", nargs="+")
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--set", action="append", default=[], help="a recipe override for every run")
    ap.add_argument("--tokens", type=int, default=4 * 600 * 16 * 64, help="tokens every run trains")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--paces", help="comma-separated step times, one per learner (default: all equal)")
    ap.add_argument("--batches", help="comma-separated batch sizes, one per learner (default: the recipe's)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-dp", action="store_true", help="skip the data-parallel reference")
    args = ap.parse_args()

    from dlc.config.load import load_recipe

    base = list(args.set)
    count = load_recipe(args.recipe, base).learners.count
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
        entries = ",".join(f"{{index: {i}, batch_size: {b}}}" for i, b in enumerate(batches))
        base.append(f"learners.overrides=[{entries}]")
    paces = [float(p) for p in args.paces.split(",")] if args.paces else [1.0] * count
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = [parse_setting(s) for s in args.settings]
    jobs: dict[tuple[str, int], Any] = {}
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        for seed in seeds:
            if not args.no_dp:
                jobs[DP, seed] = pool.submit(
                    train_one, args.recipe, [*base, f"run.seed={seed}"], paces, args.tokens, True
                )
            for label, overrides in settings:
                over = [*base, *overrides, f"run.seed={seed}"]
                jobs[label, seed] = pool.submit(train_one, args.recipe, over, paces, args.tokens, False)
        keys = {future: key for key, future in jobs.items()}
        results = {}
        for future in as_completed(keys):  # each as it ends: an hour-long ablation shows its progress
            results[keys[future]] = future.result()
            print(f"{keys[future][0]:40s} seed {keys[future][1]}: {results[keys[future]]}", file=sys.stderr, flush=True)

    def losses(label: str) -> list[float]:
        return [results[label, s]["loss"] for s in seeds]

    reference = statistics.fmean(losses(settings[0][0]))
    dp = statistics.fmean(losses(DP)) if not args.no_dp else None
    print(f"\n{args.tokens:,} tokens; seeds {args.seeds}; paces {paces}; overrides {base}\n")
    columns = ["eval loss per seed", "mean", "vs first", "vs data-parallel", "mean merge weight / token share"]
    print(f"| setting | {' | '.join(columns)} | discarded steps | stale pushes |")
    print("|---|---|---|---|---|---|---|---|")
    if dp is not None:
        print(f"| {DP} | {' / '.join(f'{x:.4f}' for x in losses(DP))} | {dp:.4f} | | | | | |")
    for label, _ in settings:
        mean = statistics.fmean(losses(label))
        runs = [results[label, s] for s in seeds]
        fair = [statistics.fmean(r["mean_weight"][i] / r["token_share"][i] for r in runs) for i in range(count)]
        discarded = statistics.fmean(r["discarded"] for r in runs)
        stale = statistics.fmean(r["stale"] for r in runs)
        vs_dp = f"{(mean / dp - 1) * 100:+.1f}%" if dp is not None else ""
        print(
            f"| {label} | {' / '.join(f'{x:.4f}' for x in losses(label))} | {mean:.4f} | "
            f"{(mean / reference - 1) * 100:+.2f}% | {vs_dp} | {' '.join(f'{f:.2f}' for f in fair)} | "
            f"{discarded:.1%} | {stale:.1%} |"
        )


if __name__ == "__main__":
    main()
