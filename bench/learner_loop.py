"""The learner's own cost of Decoupled DiLoCo, per step: one learner, no syncer, no Ray.

    taskset -c 0 python bench/learner_loop.py [--widths 32,64,128,256] [--blocks 40] [--block-steps 20]

For each model width (so each step time) one learner process trains the tiny recipe's model in
three ways, in blocks of steps whose order is shuffled every round:
  none        the step alone (`algorithm=none`);
  device ops  the step, and after it what the protocol dispatches at P = H (the busiest
              schedule): the jitted extraction of one fragment and the jitted write of another,
              with no threads, messages or bookkeeping;
  decoupled   the learner protocol in its actor's configuration (sender thread, deliveries from
              another thread): every step the "syncer" asks for one fragment and delivers a merged
              one as an int4 difference, so every step pushes one fragment and adopts one.
device ops - none is what the two jitted functions cost a step; decoupled - device ops is what the
threads, messages and bookkeeping add. The syncer's own work is not here.

Each block is timed in CPU seconds of the whole process (all its threads), which is what a
learner takes from a machine whose cores are all busy; run it on one core (`taskset -c 0`) so
that the threads compete for it as they do there. Blocks of one round run back to back, so the
machine's drift (large here: whole runs of one arm differ by 10% from one minute to the next)
cancels in the per-round differences, of which the table gives the median.
Prints a Markdown table and records it, with the command, commit, machine and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import statistics
import sys
import threading
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import runner  # noqa: E402  (first: it puts this checkout's dlc on the path)

from dlc.core.allocator import ARENA_VAR, keep_freed_memory  # noqa: E402

if ARENA_VAR not in os.environ:  # glibc reads it only at start: start again with one arena, as learners do
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, ARENA_VAR: "1"})
keep_freed_memory()  # as every learner process does (`start_backend`)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dlc.algo import get_algorithm  # noqa: E402
from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment  # noqa: E402
from dlc.config.load import load_recipe  # noqa: E402
from dlc.core.codec import get_codec  # noqa: E402
from dlc.core.learner import Learner  # noqa: E402
from dlc.core.model import count_params  # noqa: E402
from dlc.net.transport import Transport  # noqa: E402

ARMS = ("none", "device ops", "decoupled")


class Sink:
    """The syncer's push method: drops the pushes."""

    def remote(self, message: object) -> None:
        pass


def measure(recipe, blocks: int, block_steps: int, seed: int = 0) -> tuple[int, dict[str, list[float]]]:
    """The model's parameter count, and CPU ms per step of every block of each arm."""
    stream = np.frombuffer(bytes(range(256)) * 4096, dtype=np.uint8)
    learner = Learner(recipe, 0, stream)
    sync = get_algorithm("decoupled").learner_sync(recipe, learner, Transport(), type("S", (), {"push": Sink()}))
    sync.compile()
    sync.start_background()
    codec = get_codec("int4", recipe.syncer.codec_block_values)
    P = sync.plan.num_fragments
    zeros = [codec.encode(np.zeros(sync.plan.size(p), np.float32)) for p in range(P)]
    version = [0] * P

    deliveries: queue.Queue[int] = queue.Queue()

    def deliver() -> None:  # one thread, woken by each step, as the channel's reader thread is
        while True:
            p = deliveries.get() % P
            sync.receive(FragmentRequest(p, version[p], 0.0))
            version[p] += 1
            sync.receive(MergedFragment(p, version[p], zeros[p], 0.0, base_version=version[p] - 1))
            deliveries.task_done()

    threading.Thread(target=deliver, name="deliver", daemon=True).start()

    def step(arm: str, k: int) -> None:
        learner.train_step()
        if arm == "device ops":  # what after_step dispatches at P = H
            q = (k + P // 2) % P
            sync.ops.push(learner.params, k % P, sync.anchors[k % P])
            learner.params = sync.ops.write(learner.params, q, sync.anchors[q])
        elif arm == "decoupled":
            deliveries.put(k)
            sync.after_step()
            deliveries.join()

    def settle() -> None:  # nothing of the previous block left in flight
        learner.flush()
        sync.flush_sends()
        jax.block_until_ready(learner.params)

    cpu_ms: dict[str, list[float]] = {arm: [] for arm in ARMS}
    order, k = list(ARMS), 0
    shuffle = random.Random(seed).shuffle
    for _ in range(blocks):
        shuffle(order)
        for arm in order:
            for _ in range(2):  # the pipeline refilled with this arm's work
                step(arm, k)
                k += 1
            started = time.process_time()
            for _ in range(block_steps):
                step(arm, k)
                k += 1
            settle()
            cpu_ms[arm].append((time.process_time() - started) * 1e3 / block_steps)
    return count_params(learner.params), cpu_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--blocks", type=int, default=40, help="rounds of one block per arm")
    ap.add_argument("--block-steps", type=int, default=20, help="timed steps per block")
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    with runner.refusing_bad_input():
        widths = runner.numbers("--widths", args.widths, int)
    rows = []
    for width in widths:
        recipe = load_recipe(runner.REPO / args.recipe, [f"model.width={width}"])
        params, cpu_ms = measure(recipe, args.blocks, args.block_steps)
        none = statistics.median(cpu_ms["none"])
        extra = {
            arm: statistics.median(a - n for a, n in zip(cpu_ms[arm], cpu_ms["none"], strict=True)) for arm in ARMS[1:]
        }
        rows.append((width, params, none, extra))
        print(f"width {width}: {rows[-1]}", file=sys.stderr)
    pinned = len(os.sched_getaffinity(0))
    lines = [
        f"{pinned} of the machine's CPUs allowed, one XLA thread; one push and one adoption (int4 difference) "
        "every step, no syncer. CPU ms per step of the whole process; the extra cost of an arm is the median "
        "over rounds of its block minus the `none` block of the same round.",
        "",
        "| width | parameters | step, none (CPU ms) | + device ops (ms) | + decoupled (ms) "
        "| steps per CPU second, device ops / none | decoupled / none |",
        "|---|---|---|---|---|---|---|",
    ]
    for width, params, none, extra in rows:
        lines.append(
            f"| {width} | {params:,} | {none:.1f} | {extra['device ops']:+.2f} | {extra['decoupled']:+.2f} "
            f"| **{none / (none + extra['device ops']):.3f}** | **{none / (none + extra['decoupled']):.3f}** |"
        )
    options = ["--widths", args.widths, "--blocks", str(args.blocks), "--block-steps", str(args.block_steps)]
    command = ("taskset -c 0 " if pinned == 1 else "") + runner.bench_command("learner_loop.py", options)
    title = runner.heading("The learner's own cost, per step", ap, args, ("recipe", "widths"))
    runner.record(title, runner.Provenance.here(command), "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
