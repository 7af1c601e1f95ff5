"""How the gap to data-parallel forms during a run, and the gradient noise it forms in.

    python bench/dynamics.py [--sizes w32:model.width=32,w48:model.width=48] [--c 10] [--seeds 0,1,2] [--lr 0.00424264]
    python bench/dynamics.py --only data-parallel --H 5 --sizes ...   # the noise scale alone, by size

For each size under bench/quality.py's protocol (c tokens per parameter, the global batch split over
four learners, H = P, warm-up then cosine), each seed trains data-parallel and decoupled M=4 (the
recipe's defaults, learners out of phase) on the in-process twin and evaluates both at `--points`
evenly spaced steps: the global model for M=4, without flushing what the learners hold mid-round.
Along data-parallel's run it also measures the gradient noise scale of McCandlish et al. (2018),
B_simple = tr(Sigma) / |G|^2, in sequences: from K batches of one learner's size b and their mean,
|G|^2 and tr(Sigma) are solved from E|g_B|^2 = |G|^2 + tr(Sigma) / B at B = b and B = K b. A learner's
batch far below B_simple takes steps that are mostly noise; K learners averaging their steps every H
is not one step on K times the batch.

The table gives, at each point, the mean over the seeds of both losses, the paired gap with its
range, B_simple (its estimates summed over the seeds before the ratio is taken) and a learner's
batch against it; a second table gives each size's B_simple over the first and the second half of
the run (one point's estimate scatters by up to 2x). `--only data-parallel` trains data-parallel
alone (B_simple without the gap).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

import runner
from quality import DP, RECIPE, Arm, arm_overrides, parse_sizes, plan_size, save
from runner import say

M4 = Arm("decoupled M=4", out_of_phase=True)
GROUPS = 32  # batches of a learner's size whose mean is the large batch


def noise_terms(gradient: Any, params: Any, stream: Any, small: int) -> tuple[float, float]:
    """(|G|^2, tr Sigma) at `params`, from one draw of GROUPS batches of `small` sequences."""
    import jax
    import numpy as np

    x, y = stream.next_batch()
    total, small_sq = None, 0.0
    for k in range(GROUPS):
        rows = slice(k * small, (k + 1) * small)
        _, grads, norm = gradient(params, x[rows], y[rows])
        small_sq += float(norm) ** 2 / GROUPS
        total = grads if total is None else jax.tree_util.tree_map(np.add, total, grads)
    big_sq = sum(float(np.sum(np.square(np.asarray(g) / GROUPS))) for g in jax.tree_util.tree_leaves(total))
    big = GROUPS * small
    signal = (big * big_sq - small * small_sq) / (big - small)
    trace = (small_sq - big_sq) / (1 / small - 1 / big)
    return signal, trace


def train_dp(overrides: list[str], tokens: int, points: list[int], small: int) -> dict[str, Any]:
    """Data-parallel as bench/twin.py trains it, evaluated and probed for its noise at `points`."""
    from twin import dp_learner

    from dlc.core.evaluate import Evaluator
    from dlc.core.steps import make_grad_step
    from dlc.data.corpus import ByteStream

    recipe, data, learner, steps = dp_learner(str(runner.REPO / RECIPE), overrides, tokens)
    evaluate = Evaluator(recipe, learner.graphdef, data.eval)
    gradient = make_grad_step(learner.graphdef)
    # The probes read lanes of their own, half an epoch away from what the learner trains on.
    probe = ByteStream(data.streams[0], GROUPS * small, recipe.learners.seq_len)
    probe.position = probe.batches_per_epoch // 2
    curve = []
    for step in range(1, steps + 1):
        learner.train_step()
        if step in points:
            learner.flush()
            signal, trace = noise_terms(gradient, learner.params, probe, small)
            curve.append({"step": step, "loss": float(evaluate(learner.params)[0]), "signal": signal, "trace": trace})
    return {"curve": curve}


def train_m4(overrides: list[str], tokens: int, points: list[int]) -> dict[str, Any]:
    """The twin as bench/quality.py trains M=4 (learners out of phase), its global model evaluated
    at `points`, the last after the final flush."""
    from twin import twin_run

    starts = [i / M4.count for i in range(M4.count)]
    run, until = twin_run(str(runner.REPO / RECIPE), overrides, tokens, starts=starts)
    curve = []
    for step in points:
        run.run_until(until if step == points[-1] else step + max(starts))  # every learner took `step` steps
        if step == points[-1]:
            run.finish()
        curve.append({"step": step, "loss": float(run.global_eval())})
    return {"curve": curve}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from dlc.config.load import load_recipe

    base = load_recipe(runner.REPO / RECIPE)
    sizes = parse_sizes(args.sizes)
    small = args.global_batch // 4
    seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
    arms = tuple(arm for arm in (DP, M4) if not args.only or arm.label == args.only)
    data: dict[str, Any] = {
        "meta": {
            **asdict(runner.Provenance.here("python bench/dynamics.py " + shlex.join(sys.argv[1:]))),
            "c": args.c,
            "global_batch": args.global_batch,
            "lr": args.lr,
            "seeds": seeds,
            "sizes": [],
        },
        "runs": [],
    }
    root = Path(args.keep or tempfile.mkdtemp(prefix="dlc-dynamics-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    jobs = {}
    with runner.pool(args.jobs) as pool:
        for size in sizes:
            plan_size(size, args.c, args.global_batch, args.rounds, base.learners.seq_len, H=args.H)
            data["meta"]["sizes"].append(vars(size))
            points = sorted({max(1, round(size.steps * (k + 1) / args.points)) for k in range(args.points)})
            for seed in seeds:
                for arm in arms:
                    overrides = arm_overrides(arm, size, args.global_batch, args.lr, seed)
                    if arm.dp:
                        future = pool.submit(train_dp, overrides, size.tokens, points, small)
                    else:
                        future = pool.submit(train_m4, overrides, size.tokens, points)
                    jobs[future] = (size.name, arm.label, seed)
        say(f"{len(jobs)} trainings in {root}")
        for future in as_completed(jobs):
            size_name, label, seed = jobs[future]
            result = future.result()
            data["runs"].append({"size": size_name, "arm": label, "seed": seed, **result})
            say(f"{size_name} {label} seed {seed}: {result['curve'][-1]['loss']:.4f}")
            save(data, root / "dynamics.json")
    return data


def noise_scale(points: list[dict[str, Any]]) -> float | None:
    """B_simple from the estimates at `points` summed before the ratio is taken; None if either sum
    is at or below 0 (both are differences of noisy estimates: such a sum measured nothing)."""
    signal, trace = sum(p["signal"] for p in points), sum(p["trace"] for p in points)
    return trace / signal if signal > 0 and trace > 0 else None


def by_halves(data: dict[str, Any]) -> str:
    """Each size's noise scale over the first and the second half of its points, and by seed."""
    small = data["meta"]["global_batch"] // 4
    lines = [
        "| size | parameters | B_simple, first half | B_simple, second half (seeds) | a learner's batch / it |",
        "|---|---|---|---|---|",
    ]

    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    for size in data["meta"]["sizes"]:
        curves = sorted(
            (r["seed"], r["curve"]) for r in data["runs"] if r["size"] == size["name"] and r["arm"] == DP.label
        )
        half = len(curves[0][1]) // 2
        first = noise_scale([p for _, c in curves for p in c[:half]])
        second = noise_scale([p for _, c in curves for p in c[half:]])
        seeds = " / ".join(shown(noise_scale(c[half:])) for _, c in curves)
        ratio = "-" if second is None else f"{small / second:.2f}"
        lines.append(f"| {size['name']} | {size['params']:,} | {shown(first)} | {shown(second)} ({seeds}) | {ratio} |")
    return "\n".join(lines) + "\n"


def table(data: dict[str, Any]) -> str:
    meta = data["meta"]
    small = meta["global_batch"] // 4
    lines = [
        "| size | step | data-parallel | M=4 | gap, paired | B_simple (sequences) | a learner's batch / B_simple |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in meta["sizes"]:
        runs = {(r["arm"], r["seed"]): r["curve"] for r in data["runs"] if r["size"] == size["name"]}
        alone = sorted(seed for arm, seed in runs if arm == DP.label)
        paired = [s for s in alone if (M4.label, s) in runs]
        seeds = paired or alone  # data-parallel alone (--only): no gap
        for k, point in enumerate(runs[(DP.label, seeds[0])]):
            dp = [runs[(DP.label, s)][k] for s in seeds]
            if paired:
                m4 = [runs[(M4.label, s)][k]["loss"] for s in paired]
                gaps = [m / runs[(DP.label, s)][k]["loss"] - 1 for m, s in zip(m4, paired, strict=True)]
                gap = (
                    f"{statistics.fmean(m4):.4f} | {statistics.fmean(gaps) * 100:+.2f}% "
                    f"({min(gaps) * 100:+.1f} to {max(gaps) * 100:+.1f})"
                )
            else:
                gap = "- | -"
            scale = noise_scale(dp)
            noise = "- | -" if scale is None else f"{scale:.0f} | {small / scale:.2f}"
            loss = statistics.fmean(d["loss"] for d in dp)
            lines.append(f"| {size['name']} | {point['step']} | {loss:.4f} | {gap} | {noise} |")
    sizes = "; ".join(
        f"{s['name']}: {s['params']:,} parameters, {s['steps']} steps, H = P = {s['H']}" for s in meta["sizes"]
    )
    return (
        f"{meta['c']:g} tokens per parameter, global batch {meta['global_batch']} sequences ({small} a learner), "
        f"inner lr {meta['lr']:g}, seeds {', '.join(map(str, meta['seeds']))}; {sizes}. Eval loss in nats per byte, "
        "the mean over the seeds; M=4's is the global model's (its last point after the final flush).\n\n"
        + "\n".join(lines)
        + "\n\nThe noise scale by size, its estimates summed over the seeds and the points of each half of the run:\n\n"
        + by_halves(data)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="w32:model.width=32,w48:model.width=48")
    ap.add_argument("--c", type=float, default=10.0, help="tokens per parameter at every size")
    ap.add_argument("--rounds", type=int, default=50, help="outer rounds per fragment, at least")
    ap.add_argument("--H", type=int, default=0, help="hold H = P at this at every size (default: by --rounds)")
    ap.add_argument("--global-batch", type=int, default=32, help="sequences per step, all learners together")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lr", type=float, default=0.00424264, help="the inner lr of both arms")
    ap.add_argument("--points", type=int, default=8, help="evaluations along each run")
    ap.add_argument("--only", choices=[DP.label, M4.label], help="train only this arm")
    ap.add_argument("--jobs", type=runner.workers, default=2)
    ap.add_argument("--keep", help="directory for dynamics.json (default: a new temp dir)")
    ap.add_argument("--from-json", help="render the table from a dynamics.json instead of training")
    ap.add_argument("--out", help="record the table here (default bench/RESULTS.md)")
    args = ap.parse_args()
    if args.from_json:
        with runner.refusing_bad_input():  # a file that is missing or not JSON
            data = runner.saved_json(args.from_json)
    else:
        with runner.refusing_bad_input():  # a bad --sizes, --only, --H or --seeds
            data = measure(args)
    text = table(data)
    print(text)
    provenance = runner.Provenance.of(data["meta"])
    runner.record(
        "Quality under the field's protocol: the gap along a run", provenance, text, args.out or runner.RESULTS
    )


if __name__ == "__main__":
    main()
