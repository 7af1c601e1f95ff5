"""What `model.remat=block` saves and costs: the planner's activation bytes against XLA's own count.

    python bench/remat.py [--width 256] [--layers 12] [--seq 256] [--batch 8] [--steps 10]

For each arch (gpt, llama) the gradient step of a model of that size is compiled without and with
remat. Memory: the planner's activation bytes for the batch (`dlc.core.abstract.activation_bytes`,
what `dlc train` checks against the machine before it starts), XLA's temporary buffers of the
compiled step (`memory_analysis().temp_size_in_bytes`: the activations the backward pass keeps and
the scratch of the step, counted by the compiler that allocates them), and how far the step's first
run raises the RSS of a fresh process that holds only it, sampled every millisecond. Time: wall ms a step, the median of
`--steps`, the two arms interleaved. Loss: the first step's, both arms on the same
parameters and batch. Prints a Markdown table and records it, with the command, commit, machine
and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import jax
import numpy as np
import runner

from dlc.config.workload import ModelConfig
from dlc.core.abstract import activation_bytes
from dlc.core.model import build_model, count_params
from dlc.core.steps import make_grad_step

ARMS = ("none", "block")


def peak_growth_mib(cfg: ModelConfig, seq: int, batch: int) -> float:
    """In a fresh process holding only the compiled step: its RSS, sampled every millisecond while the
    step runs, at its highest, less its RSS before (compiling peaks higher than running: the process's
    own peak RSS cannot tell the step's)."""
    script = (
        "import sys, threading, time, jax, numpy as np, psutil\n"
        "from dlc.config.workload import ModelConfig\n"
        "from dlc.core.model import build_model\n"
        "from dlc.core.steps import make_grad_step\n"
        "cfg = ModelConfig.model_validate_json(sys.argv[1]); seq, batch = int(sys.argv[2]), int(sys.argv[3])\n"
        "x = jax.numpy.asarray(np.random.default_rng(0).integers(0, 256, (batch, seq)), jax.numpy.int32)\n"
        "graphdef, params = build_model(cfg, 0)\n"
        "step = make_grad_step(graphdef).lower(params, x, x).compile()\n"
        "me, done, peak = psutil.Process(), threading.Event(), [0]\n"
        "def sample():\n"
        "    while not done.is_set():\n"
        "        peak[0] = max(peak[0], me.memory_info().rss); time.sleep(0.001)\n"
        "before = me.memory_info().rss\n"
        "sampler = threading.Thread(target=sample); sampler.start()\n"
        "jax.block_until_ready(step(params, x, x)); done.set(); sampler.join()\n"
        "print((peak[0] - before) / 2**20)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, cfg.model_dump_json(), str(seq), str(batch)],
        capture_output=True, text=True, check=True, cwd=runner.REPO,
    )  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def measure(cfg: ModelConfig, seq: int, batch: int, steps: int) -> dict[str, dict[str, float]]:
    x = jax.numpy.asarray(np.random.default_rng(0).integers(0, 256, (batch, seq)), jax.numpy.int32)
    out: dict[str, dict[str, float]] = {}
    compiled, params = {}, None
    for remat in ARMS:
        arm = cfg.model_copy(update={"remat": remat})
        graphdef, params = build_model(arm, 0)
        step = make_grad_step(graphdef)
        compiled[remat] = step.lower(params, x, x).compile()
        loss = float(compiled[remat](params, x, x)[0])
        out[remat] = {
            "planner": activation_bytes(arm, seq) * batch,
            "xla": compiled[remat].memory_analysis().temp_size_in_bytes,
            "rss": peak_growth_mib(arm, seq, batch),
            "loss": loss,
            "params": count_params(params),
            "ms": [],
        }
    for _ in range(steps):
        for remat in ARMS:
            started = time.perf_counter()
            jax.block_until_ready(compiled[remat](params, x, x))
            out[remat]["ms"].append((time.perf_counter() - started) * 1e3)
    for remat in ARMS:
        out[remat]["ms"] = statistics.median(out[remat]["ms"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    mib = 2**20
    lines = [
        f"Width {args.width}, {args.layers} blocks, batch {args.batch} x {args.seq} tokens, float32 on the CPU. "
        "Activations: the planner's bytes for the batch, XLA's temporary buffers of the compiled gradient step, "
        "and how far running it raises a fresh process's RSS (sampled every ms); wall ms a step, the median of "
        f"{args.steps}, the arms interleaved; the first step's loss.",
        "",
        "| arch | parameters | remat | planner (MiB) | XLA temporaries (MiB) | peak RSS growth (MiB) | ms a step "
        "| loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for arch in ("gpt", "llama"):
        cfg = ModelConfig(
            arch=arch, width=args.width, num_layers=args.layers, num_heads=max(4, args.width // 64),
            context_len=args.seq,
        )  # fmt: skip
        got = measure(cfg, args.seq, args.batch, args.steps)
        for remat in ARMS:
            m = got[remat]
            lines.append(
                f"| {arch} | {m['params']:,} | {remat} | {m['planner'] / mib:.1f} | {m['xla'] / mib:.1f} | "
                f"{m['rss']:.1f} | {m['ms']:.1f} | {m['loss']:.6f} |"
            )
        none, block = got["none"], got["block"]
        ratios.append(
            f"{arch}: planner {block['planner'] / none['planner']:.2f}x, XLA {block['xla'] / none['xla']:.2f}x, "
            f"peak RSS growth {block['rss'] / none['rss']:.2f}x, "
            f"time {block['ms'] / none['ms']:.2f}x, loss difference {abs(block['loss'] - none['loss']):.1e}"
        )
    lines += ["", "remat=block against none: " + "; ".join(ratios) + "."]
    print("\n".join(lines), file=sys.stderr)
    options = ["--width", str(args.width), "--layers", str(args.layers), "--seq", str(args.seq), "--batch",
               str(args.batch), "--steps", str(args.steps)]  # fmt: skip
    command = runner.bench_command("remat.py", options)
    title = runner.heading("Recomputing activations (model.remat)", ap, args, ())
    runner.record(title, runner.Provenance.here(command), "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
