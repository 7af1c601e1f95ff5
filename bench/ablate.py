"""Syncer settings against each other on the in-process twin, several seeds, at equal tokens.

    python bench/ablate.py --set model.width=128 --tokens 1228800 --seeds 0,1 \\
        default adopt=rebase "mix:adopt=mix" "H12:sync_interval_steps=12,fragments=12"
    python bench/ablate.py --batches 64,16,16,16 default weighting=tokens_squared_per_step

Each positional argument is one setting, `LABEL:KEY=VALUE,...` or just `KEY=VALUE,...` (the label is
then the overrides); a key that does not start with a recipe section is a `syncer.` key
(`outer.lr=0.7` is `syncer.outer.lr=0.7`); `default` runs the recipe as it is.
Every setting x seed trains M learners of the twin (`dlc.algo.local.InProcessRun`: one process, no
Ray, deterministic) to the same token budget, the learners each at its own pace (`--paces`, step
times relative to each other: unequal paces make pushes stale), and reports the global model's eval
loss, its gap to data-parallel (one learner stepping the learners' summed batch for as many steps, the
same seed), each learner's mean merge weight against its share of the tokens, and the share of inner
steps that adoptions discarded. `--jobs` runs that many trainings at once, one XLA thread each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import runner  # noqa: E402

DP = "data-parallel"
SECTIONS = ("run", "model", "data", "learners", "inner", "syncer", "blocking", "eval", "checkpoint", "algorithm")


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
            from dlc.errors import UserError

            raise UserError(f"setting {text!r}: {kv!r} is not KEY=VALUE")
        overrides.append(f"{key if key.split('.')[0] in SECTIONS else 'syncer.' + key}={value}")
    return label, overrides


def train_one(
    recipe_path: str, overrides: list[str], paces: list[float] | None, tokens: int, dp: bool
) -> dict[str, Any]:
    """One training of the twin (or, with `dp`, of data-parallel with the summed batch); its results."""
    from twin import train_dp, train_twin

    return train_dp(recipe_path, overrides, tokens) if dp else train_twin(recipe_path, overrides, tokens, paces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("settings", nargs="+")
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--set", action="append", default=[], help="a recipe override for every run")
    ap.add_argument("--tokens", type=int, default=4 * 600 * 16 * 64, help="tokens every run trains")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--paces", help="comma-separated step times, one per learner (default: all equal)")
    ap.add_argument("--batches", help="comma-separated batch sizes, one per learner (default: the recipe's)")
    ap.add_argument("--jobs", type=runner.workers, default=2)
    ap.add_argument("--no-dp", action="store_true", help="skip the data-parallel reference")
    args = ap.parse_args()
    with runner.refusing_bad_input():
        batches = runner.numbers("--batches", args.batches, int) if args.batches else None
        # Without --paces every learner of each setting steps at one pace, whatever count the setting gives.
        paces = runner.numbers("--paces", args.paces, float) if args.paces else None
        seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
        settings = [parse_setting(s) for s in args.settings]

    from dlc.config.load import replaced_overrides

    base = list(args.set)
    if batches:
        entries = ",".join(f"{{index: {i}, batch_size: {b}}}" for i, b in enumerate(batches))
        base.append(f"learners.overrides=[{entries}]")
    jobs: dict[tuple[str, int], Any] = {}
    with runner.pool(args.jobs) as pool:
        for seed in seeds:
            if not args.no_dp:
                jobs[DP, seed] = pool.submit(
                    train_one, args.recipe, replaced_overrides(base, f"run.seed={seed}"), paces, args.tokens, True
                )
            for label, overrides in settings:
                over = replaced_overrides(base, *overrides, f"run.seed={seed}")
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
    print(f"\n{args.tokens:,} tokens; seeds {args.seeds}; paces {paces or 'all equal'}; overrides {base}\n")
    columns = ["eval loss per seed", "mean", "vs first", "vs data-parallel", "mean merge weight / token share"]
    print(f"| setting | {' | '.join(columns)} | discarded steps | stale pushes |")
    print("|---|---|---|---|---|---|---|---|")
    if dp is not None:
        print(f"| {DP} | {' / '.join(f'{x:.4f}' for x in losses(DP))} | {dp:.4f} | | | | | |")
    for label, _ in settings:
        mean = statistics.fmean(losses(label))
        runs = [results[label, s] for s in seeds]
        fair = [
            statistics.fmean(r["mean_weight"][i] / r["token_share"][i] for r in runs)
            for i in range(len(runs[0]["mean_weight"]))
        ]
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
