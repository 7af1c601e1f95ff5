"""What a checkpoint costs the learner's loop: a write in the background against one that blocks it.

    python bench/checkpoint_stall.py [--width 256] [--layers 4] [--rounds 8] [--every 20]

One learner (no syncer, no Ray) trains the tiny recipe's model at the given size, saving its
checkpoint (its parameters, AdamW state and the decoupled protocol's anchors, as a learner's
interval save does) every `--every` steps. Rounds alternate, in shuffled order, between a save that
blocks the loop until the files are written (`wait=True`, what every save did before) and one that
returns once orbax has copied the arrays (`wait=False`, the loop's interval saves now). Wall time of
each step, save included: the step that saved, the step after it (the write still going on beside
it), and the median of the others. Prints a Markdown table and records it, with the command, commit,
machine and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax  # noqa: E402
import numpy as np  # noqa: E402
import runner

from dlc.algo import get_algorithm  # noqa: E402
from dlc.config.load import load_recipe  # noqa: E402
from dlc.core.learner import Learner  # noqa: E402
from dlc.core.model import count_params  # noqa: E402
from dlc.engine.learner.checkpoints import LearnerCheckpoints  # noqa: E402
from dlc.net.transport import Transport  # noqa: E402

ARMS = ("blocking", "background")


class Sink:
    def remote(self, message: object) -> None:
        pass


def measure(recipe, directory: Path, rounds: int, every: int) -> tuple[int, int, dict[str, dict[str, list[float]]]]:
    stream = np.frombuffer(bytes(range(256)) * 4096, dtype=np.uint8)
    learner = Learner(recipe, 0, stream)
    sync = get_algorithm("decoupled").learner_sync(recipe, learner, Transport(), type("S", (), {"push": Sink()}))
    sync.compile()
    store = LearnerCheckpoints(directory, 2, learner, sync)
    for _ in range(every):  # compiled and warm before anything is timed
        learner.train_step()
    store.save(wait=True)
    bytes_saved = sum(x.nbytes for x in jax.tree.leaves(store.tree()))
    times: dict[str, dict[str, list[float]]] = {arm: {"save": [], "next": [], "other": []} for arm in ARMS}
    order = list(ARMS)
    for r in range(rounds):
        random.Random(r).shuffle(order)
        for arm in order:
            for k in range(every + 1):
                started = time.perf_counter()
                learner.train_step()
                learner.flush()
                if k == every - 1:
                    store.save(wait=arm == "blocking")
                seconds = time.perf_counter() - started
                kind = "save" if k == every - 1 else "next" if k == every else "other"
                times[arm][kind].append(seconds)
            store._store.wait()  # the next arm starts with no write in flight
    store.close()
    return count_params(learner.params), bytes_saved, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--every", type=int, default=20, help="steps between checkpoints")
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    recipe = load_recipe(runner.REPO / args.recipe, [f"model.width={args.width}", f"model.num_layers={args.layers}"])
    with tempfile.TemporaryDirectory() as tmp:
        params, size, times = measure(recipe, Path(tmp) / "ck", args.rounds, args.every)
    med = {arm: {kind: statistics.median(v) * 1e3 for kind, v in t.items()} for arm, t in times.items()}
    lines = [
        f"One learner, {params:,} parameters ({size / 2**20:.0f} MiB a checkpoint: parameters, AdamW state, "
        f"anchors), a checkpoint every {args.every} steps, {args.rounds} rounds of each arm, interleaved. Wall ms "
        "a step, medians; the ratio is the step that saved over the other steps of its arm.",
        "",
        "| save | other steps (ms) | the step that saved (ms) | the step after it (ms) | saving step / others |",
        "|---|---|---|---|---|",
    ]
    for arm in ARMS:
        m = med[arm]
        lines.append(
            f"| {arm} | {m['other']:.1f} | {m['save']:.1f} | {m['next']:.1f} | **{m['save'] / m['other']:.2f}x** |"
        )
    print("\n".join(lines), file=sys.stderr)
    command = runner.bench_command(
        "checkpoint_stall.py",
        ["--width", str(args.width), "--layers", str(args.layers), "--rounds", str(args.rounds), "--every",
         str(args.every)],
    )  # fmt: skip
    title = runner.heading("Checkpoints in the background", ap, args, ("recipe",))
    runner.record(title, runner.Provenance.here(command), "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
