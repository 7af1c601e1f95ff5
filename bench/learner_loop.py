"""The learner's own cost of Decoupled DiLoCo, per step time: one learner, no syncer, no Ray.

    python bench/learner_loop.py [--widths 32,64,128,256] [--steps 200] [--repeats 3]

For each model width (so each step time) one learner process trains the tiny recipe's model
(a) alone (`algorithm=none`) and (b) with the decoupled learner protocol in its actor's
configuration (sender thread, deliveries from another thread): every step the "syncer" asks for
one fragment (P = H, the busiest schedule) and delivers a merged fragment as an int4 difference,
so every step pushes one fragment and adopts one. The syncer's own work is not here: this is
what the learner pays. Runs alternate a/b; the ratio is b/a of steady steps per second.
Prints a Markdown table and appends it, with the command, date and machine, to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from dlc.algo import get_algorithm  # noqa: E402
from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment  # noqa: E402
from dlc.config.load import load_recipe  # noqa: E402
from dlc.core.codec import get_codec  # noqa: E402
from dlc.core.learner import Learner  # noqa: E402
from dlc.core.model import build_model, count_params  # noqa: E402
from dlc.net.transport import Transport  # noqa: E402


class Sink:
    """The syncer's push method: takes the pushes and drops them."""

    def __init__(self) -> None:
        self.pushes = 0

    def remote(self, message: object) -> None:
        self.pushes += 1


def run(recipe, steps: int, decoupled: bool) -> float:
    """Steady steps per second over `steps` steps, after 5 warm-up steps."""
    stream = np.frombuffer(bytes(range(256)) * 4096, dtype=np.uint8)
    learner = Learner(recipe, 0, stream)
    sync = None
    if decoupled:
        sync = get_algorithm("decoupled").learner_sync(recipe, learner, Transport(), type("S", (), {"push": Sink()}))
        sync.compile()
        sync.start_background()
        codec = get_codec("int4", recipe.syncer.codec_block_values)
        P = sync.plan.num_fragments
        zeros = [codec.encode(np.zeros(sync.plan.size(p), np.float32)) for p in range(P)]
        version = [0] * P
    else:
        learner.compile()

    def deliver(k: int) -> None:  # from another thread, as Ray's delivery thread does
        p = k % P
        sync.receive(FragmentRequest(p, version[p], 0.0))
        version[p] += 1
        sync.receive(MergedFragment(p, version[p], zeros[p], 0.0, base_version=version[p] - 1))

    started = 0.0
    for k in range(steps + 5):
        if k == 5:
            learner.flush()
            started = time.perf_counter()
        learner.train_step()
        if sync is not None:
            thread = threading.Thread(target=deliver, args=(k,))
            thread.start()
            sync.after_step()
            thread.join()
    learner.flush()
    if sync is not None:
        sync.flush_sends()
    return steps / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = ap.parse_args()
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        recipe = load_recipe(REPO / args.recipe, [f"model.width={width}"])
        rates: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(args.repeats):
            for decoupled in (False, True) if rep % 2 == 0 else (True, False):
                rates[decoupled].append(run(recipe, args.steps, decoupled))
        params = count_params(build_model(recipe.model, 0)[1])
        none, ours = statistics.median(rates[False]), statistics.median(rates[True])
        each = [d / n for d, n in zip(rates[True], rates[False], strict=True)]
        rows.append((width, params, 1e3 / none, 1e3 / ours, ours / none, each))
        print(f"width {width}: {rows[-1]}", file=sys.stderr)
    lines = [
        f"### The learner's own cost, per step time ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python bench/learner_loop.py --widths {args.widths} --steps {args.steps} --repeats {args.repeats}` on "
        f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), one XLA thread; "
        "one push and one adoption (int4 difference) every step, no syncer.",
        "",
        "| width | parameters | step, none (ms) | step, decoupled (ms) | steps/s decoupled / none (median) "
        "| per repeat |",
        "|---|---|---|---|---|---|",
    ]
    for width, params, none_ms, ours_ms, ratio, each in rows:
        lines.append(
            f"| {width} | {params:,} | {none_ms:.1f} | {ours_ms:.1f} | **{ratio:.3f}** | "
            f"{', '.join(f'{r:.3f}' for r in each)} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.results, "a") as f:
        f.write("\n" + text)


if __name__ == "__main__":
    main()
