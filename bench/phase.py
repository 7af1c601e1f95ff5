"""Rounds and quality when learners drift apart, on the in-process twin (deterministic, no Ray).

    python bench/phase.py --steps 300 --apart 0,7,14,22 --quorums 1,4

Learners step at the recipe's pace on a fake clock; `--apart` says how many steps behind the
first each learner starts (the real engine's learners start seconds apart and drift). Every
setting runs in phase and apart; each prints the mean contributors per round, the rounds closed
and the global eval loss once every learner has trained `--steps` steps (and, with `--eval-at`,
when the first learner reaches that step). As the engine's learners do, each learner stops at
`--steps`, pushes what it holds and retires (the syncer counts it as a learner whose model no
longer moves): learners that start apart end apart, and every one trains the same tokens.

    python bench/phase.py --steps 1075 --apart 0,20,40,60 --quorums 1 --seeds 0,1,2 model.width=64 \
        learners.batch_size=8 syncer.sync_interval_steps=5 syncer.fragments=5 inner.warmup_steps=89 \
        learners.join_streams=0
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import runner  # noqa: E402  (first: it puts this checkout's dlc on the path)

from dlc.algo.local import InProcessRun  # noqa: E402
from dlc.config.load import load_recipe  # noqa: E402
from dlc.data.corpus import load_corpus, split_corpus
from dlc.data.plan import DataPlan  # noqa: E402

STEP_S = 0.1  # the twin's step time: only ratios to it matter (grace window, heartbeats)


class StepsEach(InProcessRun):
    """The twin whose learners each stop after `run.max_steps` steps, push what they hold and retire."""

    def _step(self, index: int) -> None:
        learner = self.learners[index]
        if learner.step < self.recipe.run.max_steps:
            super()._step(index)
            if learner.step == self.recipe.run.max_steps:
                self.finish_learner(index)
                self.syncer.retire(index)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--steps", type=int, default=300, help="inner steps per learner")
    ap.add_argument("--apart", default="0,7,14,22", help="steps each learner starts behind the first")
    ap.add_argument("--quorums", default="1,4", help="syncer.quorum values to run")
    ap.add_argument("--seeds", default="0", help="run.seed values to run, each in phase and apart")
    ap.add_argument("--eval-at", type=int, default=None, help="also evaluate the global model at this step")
    ap.add_argument("overrides", nargs="*", help="recipe key=value overrides")
    args = ap.parse_args()
    with runner.refusing_bad_input():
        behind = runner.numbers("--apart", args.apart, int, sign="non-negative")
        quorums = runner.numbers("--quorums", args.quorums, int)
        seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
    print(f"recipe {args.recipe} {' '.join(args.overrides)}; {len(behind)} learners, {args.steps} steps each")
    at = f"eval @{args.eval_at}" if args.eval_at is not None else ""
    print(f"{'setting':34s} {'contributors/round':>18s} {'rounds':>7s} {at:>12s} {'global eval':>12s} {'time':>6s}")
    settings = [(quorum, seed) for quorum in quorums for seed in seeds]
    for quorum, seed in settings:
        for label, offsets in (("in phase", [0] * len(behind)), ("apart " + args.apart, behind)):
            recipe = load_recipe(
                args.recipe,
                [
                    f"learners.count={len(behind)}",
                    f"run.max_steps={args.steps}",
                    f"syncer.quorum={quorum}",
                    f"run.seed={seed}",
                    *args.overrides,
                ],
            )
            split = DataPlan.of_bytes(
                split_corpus(load_corpus(recipe.data), recipe.data, len(behind), recipe.run.seed, 4096)
            )
            t0 = time.time()
            run = StepsEach(recipe, split, step_time_s=STEP_S, starts_s=[b * STEP_S for b in offsets])
            midway = ""
            if args.eval_at is not None:  # the first learner's step (the others' lag it by their offsets)
                run.run_until(args.eval_at * STEP_S + 1e-6)
                midway = f"{run.global_eval():.4f}"
            run.run_until((args.steps + max(offsets)) * STEP_S + 1e-6)  # the last learner's last step
            run.finish()
            status = run.syncer.status()
            print(
                f"{f'K={quorum}, seed {seed}, {label}':34s} {status['mean_contributors']:18.2f} "
                f"{status['rounds_closed']:7d} {midway:>12s} {run.global_eval():12.4f} {time.time() - t0:5.0f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
