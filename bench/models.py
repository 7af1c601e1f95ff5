"""A learner's step time and memory for each model family, compute dtype and device count: no syncer, no Ray.

    python bench/models.py [--width 256] [--layers 4] [--seq 256] [--batch 8] [--steps 30]

For gpt and llama blocks (llama with a quarter of the query heads as key/value heads), in float32
and bfloat16, on one device and (llama) on two host devices sharded over fsdp, one fresh process
per arm builds a learner of tiny's recipe at this size, compiles its step, and times `--steps`
steps after two of warm-up: wall ms per step (median of the steps, each waited for) and the
process's peak RSS. Arms run in a shuffled order, one after another. Two host devices share the
same cores as one: that arm shows what sharding costs here, not what a second GPU gains.

On CPU, XLA emulates bfloat16: the table shows what it costs in memory and time here, not what a
GPU gains. Prints a Markdown table and records it, with the command,
commit, machine and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

import runner  # first: it puts this checkout's dlc on the path

ARMS = [
    ("gpt", "float32", 1),
    ("gpt", "bfloat16", 1),
    ("llama", "float32", 1),
    ("llama", "bfloat16", 1),
    ("llama", "float32", 2),
    ("llama", "bfloat16", 2),
]


def measure_here(args: argparse.Namespace) -> dict:
    """One arm, in this process: parameters, ms per step (median), peak RSS in MiB."""
    import resource
    import statistics
    import time

    import jax

    from dlc.config.load import load_recipe
    from dlc.core.learner import Learner
    from dlc.core.model import count_params
    from dlc.data.plan import plan_data
    from tests.helpers import TINY

    overrides = [
        "learners.count=1",
        "algorithm=none",
        f"model.arch={args.arch}",
        f"model.compute_dtype={args.dtype}",
        f"model.width={args.width}",
        f"model.num_layers={args.layers}",
        f"model.num_heads={max(args.width // 64, 1)}",
        f"model.context_len={args.seq}",
        f"learners.seq_len={args.seq}",
        f"learners.batch_size={args.batch}",
        f"learners.devices={args.devices}",
        f"data.block_bytes={max(4096, 2 * args.seq)}",
    ]
    if args.arch == "llama":
        overrides.append(f"model.num_kv_heads={max(args.width // 256, 1)}")
    recipe = load_recipe(TINY, overrides)
    learner = Learner(recipe, 0, plan_data(recipe).streams[0])
    learner.compile()
    times = []
    for i in range(args.steps + 2):
        start = time.perf_counter()
        learner.train_step()
        jax.block_until_ready(learner.params)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return {
        "params": count_params(learner.params),
        "ms": 1000 * statistics.median(times),
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--results", default=str(runner.RESULTS))
    parser.add_argument("--arch", help=argparse.SUPPRESS)  # set for the child process of one arm
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arch:
        print(json.dumps(measure_here(args)))
        return
    arms = ARMS[:]
    random.shuffle(arms)
    rows = {}
    for arch, dtype, devices in arms:
        child = [sys.executable, __file__, *sys.argv[1:], "--arch", arch, "--dtype", dtype, "--devices", str(devices)]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        if devices > 1:  # as dlc gives a learner's process its host devices
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {env.get('XLA_FLAGS', '')}".strip()
        out = subprocess.run(child, capture_output=True, text=True, env=env, check=True, cwd=runner.REPO).stdout
        rows[arch, dtype, devices] = json.loads(out.strip().splitlines()[-1])
        print(arch, dtype, devices, rows[arch, dtype, devices], file=sys.stderr)
    lines = [
        f"One learner, batch {args.batch} x {args.seq} tokens, width {args.width}, {args.layers} blocks "
        "(llama: a quarter of the query heads as key/value heads); wall ms per step, median of "
        f"{args.steps}; peak RSS of the learner's process. On CPU bfloat16 is emulated and host devices share "
        "the cores: no speed claim.",
        "",
        "| arch | compute dtype | devices | parameters | ms per step | vs float32 on 1 device | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arch, dtype, devices in ARMS:
        row, base = rows[arch, dtype, devices], rows[arch, "float32", 1]
        lines.append(
            f"| {arch} | {dtype} | {devices} | {row['params']:,} | {row['ms']:.1f} | {row['ms'] / base['ms']:.2f}x "
            f"| {row['rss_mib']:.0f} |"
        )
    options = [f"--{k} {getattr(args, k)}" for k in ("width", "layers", "seq", "batch", "steps")]
    provenance = runner.Provenance.here(runner.bench_command("models.py", options))
    title = f"Model families, compute dtypes and devices (width {args.width})"
    runner.record(title, provenance, "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
