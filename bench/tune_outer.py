"""Compare outer-optimizer settings with the in-process twin (deterministic, no Ray).

    python bench/tune_outer.py --learners 4 --steps 300 outer_lr=0.7,outer_momentum=0.9 outer_lr=1.0,outer_momentum=0
    python bench/tune_outer.py --set model.width=128 --steps 200 merge=rda   # another model size

Each positional argument is one setting: comma-separated syncer.<key>=<value> overrides.
Prints the global eval loss of each at equal tokens, next to one learner alone.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

from dlc.config.load import load_recipe  # noqa: E402
from dlc.core.evaluate import Evaluator  # noqa: E402
from dlc.core.learner import Learner  # noqa: E402
from dlc.data.corpus import load_corpus, split_corpus
from dlc.data.plan import DataPlan  # noqa: E402
from dlc.engine.local import InProcessRun  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("settings", nargs="*", default=[""])
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="inner steps per learner")
    ap.add_argument("--baseline", action="store_true", help="also train one learner alone on M*steps steps")
    ap.add_argument("--set", action="append", default=[], help="a recipe override for every run, e.g. model.width=128")
    args = ap.parse_args()
    for setting in args.settings:
        overrides = [f"syncer.{kv}" for kv in setting.split(",") if kv]
        recipe = load_recipe(
            args.recipe, [f"learners.count={args.learners}", f"run.max_steps={args.steps}", *args.set, *overrides]
        )
        split = DataPlan.of_bytes(
            split_corpus(load_corpus(recipe.data), recipe.data, args.learners, recipe.run.seed, 4096)
        )
        run = InProcessRun(recipe, split)
        t0 = time.time()
        for _ in range(args.steps):
            run.step_all()
        run.finish()
        status = run.syncer.status()
        print(
            f"{setting or 'defaults':60s} global eval {run.global_eval():.4f}  learner0 {run.learner_eval(0):.4f}"
            f"  rounds {status['rounds_closed']} contributors {status['mean_contributors']}"
            f"  rejected {status['rejections']}  ({time.time() - t0:.0f} s)",
            flush=True,
        )
    if args.baseline:
        recipe = load_recipe(
            args.recipe, ["learners.count=1", f"run.max_steps={args.steps * args.learners}", *args.set]
        )
        split = DataPlan.of_bytes(split_corpus(load_corpus(recipe.data), recipe.data, 1, recipe.run.seed, 4096))
        learner = Learner(recipe, 0, split.streams[0])
        for _ in range(args.steps * args.learners):
            learner.train_step()
        learner.flush()
        loss = Evaluator(recipe, learner.graphdef, split.eval)(learner.params)[0]
        print(f"{'one learner alone, same tokens':60s} eval {loss:.4f}")


if __name__ == "__main__":
    main()
