"""Quality against data-parallel at several model sizes: does decoupled's gap shrink as the model grows?

    python bench/scaling.py [--sizes tiny:model.width=64:2457600,small:model.width=128:3276800]
                            [--seeds 0,1] [--algorithms dp,decoupled,diloco] [--keep DIR]
    python bench/scaling.py --from-json DIR/scaling.json

Every size x seed x algorithm trains recipes/tiny.yaml (4 learners; the default syncer: K = 1) with the
size's overrides to the size's token budget, through the real CLI, with `run.seed` = the seed (the
model's initialisation and the data's order) and ~8 evals. A size is NAME:OVERRIDE[;OVERRIDE...]:TOKENS.
Prints and records in bench/RESULTS.md a table of final eval loss (mean and spread over the seeds) per
algorithm and size, with the gap of decoupled and of DiLoCo to data-parallel, and writes the gap against
the parameter count as a plot (bench/scaling.png). Every run's summary is kept in scaling.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import runner
from compare_tables import read_run
from runner import say

RECIPE = "recipes/tiny.yaml"
DEFAULT_SIZES = (
    "tiny:model.width=64:1228800,"  # 219,520 parameters, 300 steps per learner
    "medium:model.width=96:1638400,"  # 400 steps
    "small:model.width=128:2048000"  # 832,256 parameters (recipes/small.yaml's width), 500 steps
)
PLOT = runner.REPO / "bench" / "scaling.png"


def parse_sizes(text: str) -> list[dict[str, Any]]:
    sizes = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            from dlc.errors import UserError

            raise UserError(f"--sizes {item!r}: give NAME:OVERRIDE[;OVERRIDE...]:TOKENS, comma-separated")
        sizes.append({"name": parts[0], "overrides": [o for o in parts[1].split(";") if o], "tokens": int(parts[2])})
    return sizes


def n_params(overrides: list[str]) -> int:
    from dlc.config.load import load_recipe
    from dlc.core.abstract import param_count

    return param_count(load_recipe(runner.REPO / RECIPE, overrides).model)


def train(size: dict[str, Any], algorithm: str, seed: int, root: Path) -> dict[str, Any]:
    """One run to the size's token budget; what `read_run` found, with how it was run."""
    from dlc.config.load import load_recipe

    recipe = load_recipe(runner.REPO / RECIPE, size["overrides"])
    per_step = (
        sum(recipe.learners.resolved(i).batch_size for i in range(recipe.learners.count)) * recipe.learners.seq_len
    )
    steps = math.ceil(size["tokens"] / per_step)
    run_dir = root / f"{size['name']}-{algorithm}-{seed}"
    overrides = [
        *size["overrides"],
        f"algorithm={algorithm}",
        f"run.seed={seed}",
        "run.max_steps=null",
        f"run.max_tokens={size['tokens']}",
        f"eval.every_steps={max(1, steps // 8)}",
    ]
    cmd = runner.train_command(RECIPE, run_dir, *overrides, fresh=True)
    say(f"{size['name']} {algorithm} seed {seed}: started")
    done = runner.run(cmd, runner.log_beside(run_dir), timeout_s=3600)
    run = {"size": size["name"], "algorithm": algorithm, "seed": seed, "command": shlex.join(cmd), **read_run(run_dir)}
    run["error"] = done.error()
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    loss = (run["summary"] or {}).get("eval_loss_final")
    outcome = run["error"] or "done"
    say(f"{size['name']} {algorithm} seed {seed}: {outcome} in {done.wall_s:.0f} s, final eval loss {loss}")
    return run


def table(data: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table, and one row per size with the gaps (for the plot)."""
    meta, runs = data["meta"], data["runs"]
    algorithms = meta["algorithms"]

    def losses(size: str, algorithm: str) -> list[float]:
        return [
            r["summary"]["eval_loss_final"]
            for r in runs
            if r["size"] == size and r["algorithm"] == algorithm and r["summary"] and not r.get("error")
        ]

    def cell(values: list[float]) -> str:
        if not values:
            return "-"
        spread = f" ({min(values):.4f}-{max(values):.4f})" if len(values) > 1 else ""
        return f"{statistics.fmean(values):.4f}{spread}"

    def gap(values: list[float], reference: list[float]) -> str:
        """Mean relative gap over the seeds (each seed against data-parallel of the same seed), and its range."""
        pairs = [v / r - 1 for v, r in zip(values, reference, strict=False)]
        if not pairs:
            return "-"
        spread = f" ({min(pairs) * 100:+.1f} to {max(pairs) * 100:+.1f})" if len(pairs) > 1 else ""
        return f"{statistics.fmean(pairs) * 100:+.1f}%{spread}"

    head = ["size", "parameters", "tokens", *(f"{a} final eval loss" for a in algorithms)]
    head += [f"{a} vs dp" for a in algorithms if a != "dp"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for size in meta["sizes"]:
        dp = losses(size["name"], "dp")
        cells = [size["name"], f"{size['params']:,}", f"{size['tokens']:,}"]
        cells += [cell(losses(size["name"], a)) for a in algorithms]
        cells += [gap(losses(size["name"], a), dp) for a in algorithms if a != "dp"]
        lines.append("| " + " | ".join(cells) + " |")
        row = {"size": size["name"], "params": size["params"]}
        for a in algorithms:
            if a != "dp" and losses(size["name"], a) and dp:
                row[a] = [v / r - 1 for v, r in zip(losses(size["name"], a), dp, strict=False)]
        rows.append(row)
    seeds = ", ".join(str(s) for s in meta["seeds"])
    text = (
        f"recipes/tiny.yaml's 4 learners at each size; seeds {seeds} (model initialisation and data order); "
        "final eval loss in nats per byte, mean (min-max) over the seeds; the gap to data-parallel is each "
        "seed's against data-parallel of the same seed, mean (range).\n\n" + "\n".join(lines) + "\n"
    )
    return text, rows


def plot(rows: list[dict[str, Any]], algorithms: list[str], out: Path) -> None:
    series = {a: [(r["params"], r[a]) for r in rows if a in r] for a in algorithms if a != "dp"}
    runner.gap_plot(series, out, "Gap to data-parallel at equal tokens", "parameters")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--algorithms", default="dp,decoupled,diloco")
    ap.add_argument("--keep", help="directory for the run directories and scaling.json (default: a new temp dir)")
    ap.add_argument("--from-json", help="re-render the table and plot from a scaling.json instead of training")
    ap.add_argument("--out", help="record the table here (default bench/RESULTS.md)")
    args = ap.parse_args()
    if args.from_json:
        with runner.refusing_bad_input():  # a file that is missing or not JSON
            data = runner.saved_json(args.from_json)
    else:
        with runner.refusing_bad_input():
            seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
            sizes = parse_sizes(args.sizes)
        for size in sizes:
            size["params"] = n_params(size["overrides"])
        algorithms = [a for a in args.algorithms.split(",") if a]
        if "dp" not in algorithms:
            ap.error("the gap is measured against dp: keep it in --algorithms")
        root = Path(args.keep or tempfile.mkdtemp(prefix="dlc-scaling-")).resolve()
        root.mkdir(parents=True, exist_ok=True)
        meta = {
            **asdict(runner.Provenance.here("python bench/scaling.py " + shlex.join(sys.argv[1:]))),
            "sizes": sizes,
            "seeds": seeds,
            "algorithms": algorithms,
        }
        data = {"meta": meta, "runs": []}
        say(f"{len(sizes) * len(meta['seeds']) * len(algorithms)} runs in {root}")
        for size in sizes:
            for seed in meta["seeds"]:
                for algorithm in algorithms:
                    data["runs"].append(train(size, algorithm, seed, root))
                    tmp = root / ".scaling.json.tmp"
                    tmp.write_text(json.dumps(data, indent=1))
                    os.replace(tmp, root / "scaling.json")
    text, rows = table(data)
    plot(rows, data["meta"]["algorithms"], PLOT)
    text += "\nThe plot of the gap against the parameter count: `bench/scaling.png`.\n"
    meta = data["meta"]
    provenance = runner.Provenance.of(meta)
    runner.record("Quality against data-parallel by model size", provenance, text, args.out or runner.RESULTS)


if __name__ == "__main__":
    main()
