"""The learner's own cost of Decoupled DiLoCo, per step time: one learner, no syncer, no Ray.

    python bench/learner_loop.py [--widths 32,64,128,256] [--steps 200] [--repeats 3]

For each model width (so each step time) one learner process trains the tiny recipe's model
(a) alone (`algorithm=none`), (b) with the decoupled learner protocol in its actor's
configuration (sender thread, deliveries from another thread): every step the "syncer" asks for
one fragment (P = H, the busiest schedule) and delivers a merged fragment as an int4 difference,
so every step pushes one fragment and adopts one, and (c) with only the device side of that:
every step dispatches the extraction of one fragment and the write of another, as the protocol
does, with no threads, messages or bookkeeping. (c) against (a) is what the two jitted functions
cost a step; (b) against (c) is what the threads and messages add. The syncer's own work is not
here. Runs rotate a/b/c; each ratio is against (a) of steady steps per second.
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

import jax  # noqa: E402
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


ARMS = ("none", "decoupled", "device ops")


def run(recipe, steps: int, arm: str) -> float:
    """Steady steps per second over `steps` steps, after 5 warm-up steps."""
    stream = np.frombuffer(bytes(range(256)) * 4096, dtype=np.uint8)
    learner = Learner(recipe, 0, stream)
    sync = None
    if arm != "none":
        sync = get_algorithm("decoupled").learner_sync(recipe, learner, Transport(), type("S", (), {"push": Sink()}))
        sync.compile()
        if arm == "decoupled":
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
        if arm == "device ops":  # what after_step dispatches at P = H: one extraction, one write
            sync.ops.push(learner.params, k % P, sync.anchors[k % P])
            learner.params = sync.ops.write(learner.params, (k + P // 2) % P, sync.anchors[(k + P // 2) % P])
        elif sync is not None:
            thread = threading.Thread(target=deliver, args=(k,))
            thread.start()
            sync.after_step()
            thread.join()
    learner.flush()
    jax.block_until_ready(learner.params)
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
        rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for rep in range(args.repeats):
            for arm in ARMS[rep % 3 :] + ARMS[: rep % 3]:  # each arm first, second and third in turn
                rates[arm].append(run(recipe, args.steps, arm))
        params = count_params(build_model(recipe.model, 0)[1])
        ms = {arm: 1e3 / statistics.median(rates[arm]) for arm in ARMS}
        each = {
            arm: [d / n for d, n in zip(rates[arm], rates["none"], strict=True)] for arm in ("device ops", "decoupled")
        }
        rows.append((width, params, ms, each))
        print(f"width {width}: {rows[-1]}", file=sys.stderr)
    lines = [
        f"### The learner's own cost, per step time ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python bench/learner_loop.py --widths {args.widths} --steps {args.steps} --repeats {args.repeats}` on "
        f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), one XLA thread; "
        "one push and one adoption (int4 difference) every step, no syncer. Step times are medians over repeats; "
        "ratios are steps/s against `none` in the same repeat, their median, then each repeat.",
        "",
        "| width | parameters | step, none (ms) | step, device ops (ms) | step, decoupled (ms) "
        "| device ops / none | decoupled / none |",
        "|---|---|---|---|---|---|---|",
    ]

    def ratios(values: list[float]) -> str:
        return f"**{statistics.median(values):.3f}** ({', '.join(f'{r:.3f}' for r in values)})"

    for width, params, ms, each in rows:
        lines.append(
            f"| {width} | {params:,} | {ms['none']:.1f} | {ms['device ops']:.1f} | {ms['decoupled']:.1f} "
            f"| {ratios(each['device ops'])} | {ratios(each['decoupled'])} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.results, "a") as f:
        f.write("\n" + text)


if __name__ == "__main__":
    main()
