"""Quality against data-parallel the way the DiLoCo papers measure it, on the in-process twin.

    python bench/quality.py sizes  [--sizes w32:model.width=32,w64:model.width=64] [--c 10] [--seeds 0,1,2]
    python bench/quality.py ladder [--sizes w32:model.width=32] ...
    python bench/quality.py learners [--counts 1,2,4,8] ...
    python bench/quality.py tokens [--sizes w32:model.width=32] [--cs 10,20,40] ...
    python bench/quality.py --from-json DIR/quality.json

The protocol (arXiv 2503.09799 and 2501.18512, scaled down to 2 cores):
- every size trains c tokens per parameter (`--c`, the same c at every size);
- the global batch is fixed (`--global-batch` sequences, split evenly over the M learners) and H is
  the largest that gives every fragment at least `--rounds` outer rounds (P = H: one fragment
  leaves every step; the run's steps are a multiple of H), or `--H` at every size, as the papers
  hold it (H = 30) while the rounds grow with the size;
- data-parallel trains the same global batch for the same number of steps;
- the inner learning rate is warm-up then cosine, swept per arm and per size over `--lr-points`
  points of a sqrt(2) grid around the recipe's, and the best mean over the seeds is kept;
- every seed is paired: the same initialisation and data order for every arm; the table gives the
  mean of the paired differences to data-parallel, their standard deviation and their range, and
  `sizes` over three sizes or more the slope of the gap per doubling of the parameters, with its
  95% confidence interval;
- the loss is the syncer's global model after the final flush.

`sizes` runs data-parallel, decoupled M=4 (the recipe's defaults), M=1 with the default outer step
(int4, and fp32), blocking DiLoCo M=4 (dlc's algorithm=diloco) and M=1 with a Nesterov momentum of
0.9; `ladder` takes the gap apart from data-parallel to today's decoupled rung by rung (each rung
adds one thing to the one before); `learners` runs M in `--counts` (at several sizes it records
the by-size table); `tokens` runs data-parallel and decoupled M=4 at each tokens per parameter of
`--cs`, H held at `--c`'s (so the rounds grow with the budget); `--arm` adds candidates on top of
the mode's last arm, `--only` trains some of the mode's arms. Each mode records its table in
bench/RESULTS.md; `--cli` also trains an arm's best setting (the last arm's, or `--cli-arm`'s)
at every size through the real `dlc train` for seed 0 and reports how far the twin and the CLI
agree; with `--from-json` it trains only those, beside the twin's runs the file holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(1, str(Path(__file__).resolve().parent))

import runner  # noqa: E402
from runner import say  # noqa: E402

from dlc.config.load import replaced_overrides  # noqa: E402

RECIPE = "recipes/tiny.yaml"
FP32 = ("syncer.codec=none", "syncer.down_codec=none")


@dataclass(frozen=True)
class Arm:
    """One way of training: data-parallel, or the twin with these overrides and learners out of phase."""

    label: str
    overrides: tuple[str, ...] = ()
    count: int = 4
    dp: bool = False
    out_of_phase: bool = False  # learners start a fraction of a step apart: pushes arrive at different times
    note: str = ""


DP = Arm("data-parallel", dp=True, note="one model, the global batch every step")

PLOTS = {
    # In the manual's assets, where docs/concepts/algorithm.md shows them.
    "sizes": runner.REPO / "docs" / "assets" / "quality-sizes.png",
    "learners": runner.REPO / "docs" / "assets" / "quality-sizes.png",  # with several sizes: each M's gap by size
    "tokens": runner.REPO / "docs" / "assets" / "quality-tokens.png",
}

_RDA = ("syncer.merge=rda", "syncer.lr_feedback=none")
# Synchronous: the whole model every H steps, every learner in every round, adopted as merged, fp32.
_SYNC = ("syncer.fragments=1", "syncer.overlap_steps=0", "syncer.quorum=4", "syncer.adopt=replace", *FP32)

M1_FP32 = Arm("M=1, fp32", FP32, count=1, note="one learner, the default outer step, no compression")

SIZES_ARMS = (
    DP,
    Arm("decoupled M=4", note="the recipe's defaults, learners out of phase", out_of_phase=True),
    Arm("decoupled M=1", count=1, note="the default outer step"),
    M1_FP32,
    Arm(
        "blocking DiLoCo M=4",
        (*_SYNC, "syncer.lr_feedback=none"),
        note="the whole model every H steps, every learner in every round, the mean merge and the default outer "
        "step, fp32: dlc's algorithm=diloco",
    ),
    Arm(
        "M=1, Nesterov 0.9",
        ("syncer.outer.kind=nesterov", "syncer.outer.momentum=0.9", "syncer.outer.lr=0.4"),
        count=1,
        note="DiLoCo's outer step, lr 0.4",
    ),
)

# Each rung adds one thing to the rung before it; all but the last merge by RDA, as dlc did before
# the learning-rate feedback (`syncer.lr_feedback`) took its place.
_WHOLE = (*_SYNC, *_RDA)
LADDER_ARMS = (
    DP,
    M1_FP32,
    Arm("synchronous DiLoCo M=4", _WHOLE, note="whole model every H steps, every learner in every round"),
    Arm("+ fragments", _WHOLE[1:], note="P = H: one fragment leaves every step"),
    Arm("+ overlap", _WHOLE[2:], note="tau = 2: adopt two steps after sending"),
    Arm(
        "+ asynchrony",
        ("syncer.adopt=replace", *FP32, *_RDA),
        out_of_phase=True,
        note="K = 1 and the grace window, learners out of phase",
    ),
    Arm("+ int4 up and down", ("syncer.adopt=replace", *_RDA), out_of_phase=True),
    Arm("+ rebase adoption", _RDA, out_of_phase=True, note="merged by RDA"),
    Arm(
        "+ lr feedback",
        (),
        out_of_phase=True,
        note="the mean merge, each tensor's inner lr raised by the learners' spread: today's decoupled defaults",
    ),
)


def learner_arms(counts: list[int]) -> tuple[Arm, ...]:
    return (DP, *(Arm(f"M={m}", count=m, out_of_phase=m > 1) for m in counts))


@dataclass
class Size:
    name: str
    overrides: list[str]
    params: int = 0
    tokens: int = 0
    steps: int = 0
    H: int = 0
    c: float = 0.0  # tokens per parameter


def parse_sizes(text: str) -> list[Size]:
    from dlc.errors import UserError

    sizes = []
    for item in text.split(","):
        name, sep, body = item.partition(":")
        if not sep:
            raise UserError(f"--sizes: {item!r} is not NAME:OVERRIDE[;OVERRIDE...]")
        sizes.append(Size(name, [o for o in body.split(";") if o]))
    return sizes


def plan_size(size: Size, c: float, global_batch: int, min_rounds: int, seq_len: int, H: int = 0) -> None:
    """Tokens, steps and H of a size under the protocol (H as given, where it is)."""
    from dlc.config.load import load_recipe
    from dlc.core.abstract import param_count
    from dlc.errors import UserError

    if H < 0:
        raise UserError(f"--H {H}: H is a number of steps, at least 1 (or 0 for each size's own)")

    size.params = param_count(load_recipe(runner.REPO / RECIPE, size.overrides).model)
    size.c = c
    per_step = global_batch * seq_len
    steps = math.ceil(c * size.params / per_step)
    size.H = H or max(1, min(24, steps // min_rounds))
    size.steps = math.ceil(steps / size.H) * size.H  # a whole number of rounds
    size.tokens = size.steps * per_step


def arm_overrides(arm: Arm, size: Size, global_batch: int, lr: float, seed: int) -> list[str]:
    overrides = [
        *size.overrides,
        f"learners.count={arm.count}",
        f"learners.batch_size={global_batch // arm.count}",
        f"syncer.sync_interval_steps={size.H}",
        f"syncer.fragments={size.H}",
        f"inner.lr={lr}",
        f"inner.warmup_steps={max(1, size.steps // 12)}",
        f"run.seed={seed}",
    ]
    return replaced_overrides(overrides, *arm.overrides)


def train_arm(arm: Arm, overrides: list[str], tokens: int) -> dict[str, Any]:
    from twin import train_dp, train_twin

    recipe = str(runner.REPO / RECIPE)
    if arm.dp:
        return train_dp(recipe, overrides, tokens)
    starts = [i / arm.count for i in range(arm.count)] if arm.out_of_phase else None
    return train_twin(recipe, overrides, tokens, starts=starts)


def swept(meta: dict[str, Any]) -> str:
    """How the inner lr was swept, as the table's notes say it."""
    if meta.get("lrs") and meta["lrs"] != lr_grid(meta["base_lr"], meta["lr_points"]):
        return f"inner lr at {', '.join(f'{lr:g}' for lr in meta['lrs'])} (given)"
    return f"inner lr swept over {meta['lr_points']} points of a sqrt(2) grid around {meta['base_lr']:g}"


def lr_grid(base: float, points: int) -> list[float]:
    offsets = range(-(points // 2), points - points // 2)
    return [round(base * math.sqrt(2) ** k, 8) for k in offsets]


def paired_diffs(values: dict[int, float], reference: dict[int, float]) -> list[float]:
    """Each seed's loss against the reference's of the same seed, as fractions."""
    return [values[seed] / reference[seed] - 1 for seed in sorted(values.keys() & reference.keys())]


def paired(values: dict[int, float], reference: dict[int, float]) -> str:
    """Mean, standard deviation (from three seeds) and range of each seed's loss against the
    reference's of the same seed."""
    diffs = paired_diffs(values, reference)
    if not diffs:
        return "-"
    sd = f"sd {statistics.stdev(diffs) * 100:.2f}; " if len(diffs) > 2 else ""
    spread = f" ({sd}{min(diffs) * 100:+.1f} to {max(diffs) * 100:+.1f})" if len(diffs) > 1 else ""
    return f"{statistics.fmean(diffs) * 100:+.2f}%{spread}"


def trend(data: dict[str, Any]) -> str:
    """Whether an arm's gap grows with the size: the least-squares slope of its seeds' paired gaps
    against log2 of the parameter count, in points per doubling, with its 95% confidence interval
    (Student's t; each seed of each size one point). Sizes mode, over three sizes or more."""
    from scipy import stats  # JAX's own dependency

    if data["meta"]["mode"] != "sizes":
        return ""
    lines = []
    for arm, by_size in arm_gaps(data):
        points = [(math.log2(size["params"]), 100 * gap) for size, gaps in by_size for gap in gaps]
        sizes = len({x for x, _ in points})
        if sizes < 3:
            continue
        fit = stats.linregress(*zip(*points, strict=True))
        half = stats.t.ppf(0.975, len(points) - 2) * fit.stderr
        lines.append(
            f"{arm['label']}: the gap changes by {fit.slope:+.2f} points per doubling of the parameters "
            f"(95% CI {fit.slope - half:+.2f} to {fit.slope + half:+.2f}; {len(points)} paired seeds, {sizes} sizes)"
        )
    return "".join(f"\n{line}.\n" for line in lines)


def arm_gaps(data: dict[str, Any]) -> list[tuple[dict[str, Any], list[tuple[dict[str, Any], list[float]]]]]:
    """Each arm but data-parallel, with its paired gaps (fractions, by seed) at every size where both
    were trained, its best lr against data-parallel's."""
    meta, runs = data["meta"], data["runs"]
    out = []
    for arm in meta["arms"]:
        if arm["dp"]:
            continue
        by_size = [
            (size, paired_diffs(best(runs, size["name"], arm["label"])[1], best(runs, size["name"], DP.label)[1]))
            for size in meta["sizes"]
            if trained(runs, size["name"], arm["label"]) and trained(runs, size["name"], DP.label)
        ]
        out.append((arm, by_size))
    return out


def trained(runs: list[dict[str, Any]], size: str, arm: str) -> bool:
    return any(r["size"] == size and r["arm"] == arm for r in runs)


def best(runs: list[dict[str, Any]], size: str, arm: str) -> tuple[float, dict[int, float]]:
    """The lr with the lowest mean loss over the seeds, and its loss by seed (every seed it has).

    Where some lrs have more seeds than others (more seeds trained at the chosen lr only), the lrs
    are compared on the seeds they all have (each on its own where they share none): a harder
    extra seed must not move the choice."""
    by_lr: dict[float, dict[int, float]] = {}
    for r in runs:
        if r["size"] == size and r["arm"] == arm:
            by_lr.setdefault(r["lr"], {})[r["seed"]] = r["loss"]
    common = set.intersection(*(set(losses) for losses in by_lr.values()))
    lr = min(by_lr, key=lambda k: statistics.fmean(by_lr[k][s] for s in (common or by_lr[k])))
    return lr, by_lr[lr]


def plot(data: dict[str, Any], out: Path) -> None:
    """Each arm's paired gap to data-parallel (its best lr against data-parallel's) against the size,
    or in tokens mode against the tokens per parameter."""
    meta, runs = data["meta"], data["runs"]
    tokens = meta["mode"] == "tokens"
    series: dict[str, list[tuple[float, list[float]]]] = {}
    for arm, by_size in arm_gaps(data):
        for size, gaps in by_size:
            if tokens:  # one line per size and arm: the budgets of one size, H = P as at --c
                label = f"{arm['label']}, {size['params']:,} parameters, H = {size['H']}"
                series.setdefault(label, []).append((size["c"], gaps))
            else:
                series.setdefault(arm["label"], []).append((size["params"], gaps))
    lrs = sorted({r["lr"] for r in runs})
    how = "lr tuned per arm" if len(lrs) > 1 else f"inner lr {lrs[0]:.2g}"
    if tokens:
        title = f"Gap to data-parallel by token budget, {how}"
        runner.gap_plot(series, out, title, "tokens per parameter")
    else:
        Hs = {size["H"] for size in meta["sizes"]}
        held = f", H = {Hs.pop()}" if len(Hs) == 1 else ""
        title = f"Gap to data-parallel, {meta['c']:g} tokens per parameter{held}, {how}"
        runner.gap_plot(series, out, title, "parameters")


def lr_factor(runs: list[dict[str, Any]]) -> str:
    """The learners' mean lr factor over these runs (`syncer.lr_feedback`), and over their last third: blank
    for runs without the feedback, or recorded before the twin measured it."""
    measured = [r for r in runs if r.get("lr_factor") is not None]
    if not measured:
        return ""
    last = statistics.fmean(r["lr_factor_thirds"][-1] for r in measured)
    return f"{statistics.fmean(r['lr_factor'] for r in measured):.2f} ({last:.2f})"


def table(data: dict[str, Any]) -> str:
    meta, runs = data["meta"], data["runs"]
    ladder = meta["mode"] == "ladder"
    head = ["size", "arm", "best inner lr", "eval loss (mean of seeds)", "vs data-parallel, paired"]
    head += ["vs the rung before, paired"] if ladder else []
    head += ["contributors per round", "rounds per fragment", "MiB up", "consecutive outer gradients, cosine"]
    head += ["lr factor, mean (last third)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in meta["sizes"]:
        # Without its data-parallel reference (not trained yet, or left out by --only) a row has no gap.
        dp = best(runs, size["name"], DP.label)[1] if trained(runs, size["name"], DP.label) else None
        before = None
        for arm in meta["arms"]:
            if not trained(runs, size["name"], arm["label"]):
                continue  # not trained (yet): a partial quality.json renders what it holds
            lr, losses = best(runs, size["name"], arm["label"])
            one = [r for r in runs if r["size"] == size["name"] and r["arm"] == arm["label"] and r["lr"] == lr]
            cells = [size["name"], arm["label"], f"{lr:g}", f"{statistics.fmean(losses.values()):.4f}"]
            cells.append("" if arm["dp"] or dp is None else paired(losses, dp))
            if ladder:
                cells.append(paired(losses, before) if before is not None else "")
            if arm["dp"]:
                cells += ["", "", "", "", ""]
            else:
                rounds = statistics.fmean(r["rounds"] / r["fragments"] for r in one)
                mib = statistics.fmean(r["bytes_up"] for r in one) / 2**20
                cosine = statistics.fmean(r["delta_cosine"] for r in one if r["delta_cosine"] is not None)
                cells += [f"{statistics.fmean(r['contributors'] for r in one):.2f}", f"{rounds:.0f}", f"{mib:.1f}"]
                cells.append(f"{cosine:+.2f}")
                cells.append(lr_factor(one))
            lines.append("| " + " | ".join(cells) + " |")
            before = losses
    trained_lrs = {s["name"]: sorted({r["lr"] for r in runs if r["size"] == s["name"]}) for s in meta["sizes"]}
    by_size = len({tuple(lrs) for lrs in trained_lrs.values()}) > 1  # merged sweeps: say each size's lrs
    sizes = "; ".join(
        f"{s['name']}: {s['params']:,} parameters, {s['tokens']:,} tokens, {s['steps']} steps, H = P = {s['H']}"
        + (f", inner lr {', '.join(f'{lr:g}' for lr in trained_lrs[s['name']])}" if by_size else "")
        for s in meta["sizes"]
    )
    notes = "; ".join(f"{a['label']}: {a['note']}" for a in meta["arms"] if a["note"])
    cli = "".join(
        f"\nThrough `dlc train` ({row['arm']}, {row['size']}, seed 0): {row['cli']:.4f} against the twin's "
        f"{row['twin']:.4f} ({100 * (row['cli'] / row['twin'] - 1):+.2f}%).\n"
        for row in data.get("cli", [])
    )
    budget = f"{meta['c']} tokens per parameter"
    if meta["mode"] == "tokens":
        cs = ", ".join(f"{size['c']:g}" for size in meta["sizes"])
        budget = f"{cs} tokens per parameter, H held at {meta['c']:g}'s"
    return (
        f"{budget}, global batch {meta['global_batch']} x {meta['seq_len']} tokens, "
        f"seeds {', '.join(map(str, meta['seeds']))} (paired: the same initialisation and data order in every arm), "
        f"{swept(meta)}, best mean kept. "
        f"{sizes}. Losses are nats per byte of the global model after the final flush; a paired difference is the "
        f"mean over the seeds of each seed's loss against the reference's of the same seed, with their standard "
        f"deviation and range; the "
        f"cosine is between one round's merged outer gradient of a fragment and its round before, averaged; the "
        f"lr factor is what the learning-rate feedback multiplies the learners' lr by, over the parameters "
        f"and the run's rounds.\n\n" + "\n".join(lines) + f"\n\nArms: {notes}.\n" + trend(data) + cli
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", choices=["sizes", "ladder", "learners", "tokens"], default="sizes")
    ap.add_argument("--sizes", default="w32:model.width=32,w64:model.width=64")
    ap.add_argument("--c", type=float, default=10.0, help="tokens per parameter at every size")
    ap.add_argument("--cs", default="10,20,40", help="tokens mode: the tokens per parameter to train")
    ap.add_argument("--rounds", type=int, default=50, help="outer rounds per fragment, at least")
    ap.add_argument(
        "--H",
        type=int,
        default=0,
        help="hold H = P at this at every size (default: each size's largest with --rounds rounds)",
    )
    ap.add_argument("--global-batch", type=int, default=32, help="sequences per step, all learners together")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lr-points", type=int, default=3)
    ap.add_argument("--lr-grid", help="the inner lrs to train, comma-separated, instead of --lr-points' grid")
    ap.add_argument("--counts", default="1,2,4,8", help="learners mode: the M to run")
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        help="one more arm after the mode's, LABEL:KEY=VALUE[;KEY=VALUE...] on the mode's last arm (repeatable)",
    )
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help="train only this arm of the mode's (its label; repeatable), e.g. to sweep one arm's lr further",
    )
    ap.add_argument("--jobs", type=runner.workers, default=2)
    ap.add_argument("--keep", help="directory for quality.json (default: a new temp dir)")
    ap.add_argument(
        "--from-json",
        action="append",
        help="render the table from quality.json files instead of training (repeatable: one mode's sweeps "
        "merged, a later file's run replacing an earlier one's of the same size, arm, lr and seed)",
    )
    ap.add_argument("--cli", action="store_true", help="also train an arm's best setting with `dlc train` (seed 0)")
    ap.add_argument("--cli-arm", help="the arm --cli trains (default: the mode's last); with --from-json, only that")
    ap.add_argument("--out", help="record the table here (default bench/RESULTS.md)")
    ap.add_argument(
        "--plot",
        help="the plot of each arm's gap, with several sizes (default docs/assets/quality-sizes.png; tokens "
        "mode: docs/assets/quality-tokens.png; with --out, beside it: OUT with .png)",
    )
    args = ap.parse_args()
    if args.from_json:
        with runner.refusing_bad_input():  # a file that is missing or not JSON
            data = merge([runner.saved_json(f) for f in args.from_json])
        if args.cli:  # the twin's runs are there: only the CLI's are trained
            if len(args.from_json) > 1:
                print("error: --cli trains beside one quality.json: pass --from-json once", file=sys.stderr)
                raise SystemExit(2)
            data["cli"] = cli_rows(data, args.cli_arm, Path(args.from_json[0]).resolve().parent)
            save(data, Path(args.from_json[0]))
    else:
        with runner.refusing_bad_input():  # a bad --sizes, --arm, --only, --H or list of numbers
            data = measure(args)
    title = {
        "sizes": "by model size",
        "ladder": "the ladder",
        "learners": "by number of learners",
        "tokens": "by tokens per parameter",
    }
    text = table(data)
    mode = data["meta"]["mode"]
    if mode in PLOTS and len(data["meta"]["sizes"]) > 1:
        # A table kept out of bench/RESULTS.md keeps its plot out of the docs too.
        apart = args.out and Path(args.out).resolve() != Path(runner.RESULTS).resolve()
        shown = Path(args.plot or (Path(args.out).with_suffix(".png") if apart else PLOTS[mode])).resolve()
        plot(data, shown)
        where = shown.relative_to(runner.REPO) if shown.is_relative_to(runner.REPO) else shown
        against = "the tokens per parameter" if mode == "tokens" else "the parameter count"
        text += f"\nEach arm's gap against {against} (the range of the seeds as bars): `{where}`.\n"
    print(text)
    meta = data["meta"]
    provenance = runner.Provenance.of(meta)
    several = mode == "learners" and len(meta["sizes"]) > 1  # M at several sizes: the by-size table
    by = title["sizes"] if several else title[mode]
    heading = f"Quality under the field's protocol: {by}"
    runner.record(heading, provenance, text, args.out or runner.RESULTS)


def with_candidates(arms: tuple[Arm, ...], texts: list[str]) -> tuple[Arm, ...]:
    """The mode's arms and one more for each `--arm LABEL:KEY=VALUE[;KEY=VALUE...]`: the mode's last arm
    (today's defaults in most modes) with those overrides on top, each on that arm alone, not on the
    candidate before it."""
    last = arms[-1]
    for text in texts:
        label, _, body = text.partition(":")
        extra = tuple(o for o in body.split(";") if o)
        layered = tuple(replaced_overrides(list(last.overrides), *extra))
        arms = (*arms, Arm(label, layered, last.count, last.dp, last.out_of_phase, body))
        # Which arm it layers on depends on the mode: say it, since that arm's count and overrides come too.
        say(f"arm {label!r}: {last.label!r} ({last.count} learners) with {' '.join(layered) or 'no overrides'}")
    return arms


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from dlc.config.load import load_recipe
    from dlc.errors import UserError

    base = load_recipe(runner.REPO / RECIPE)
    arms = {"sizes": SIZES_ARMS, "ladder": LADDER_ARMS, "tokens": SIZES_ARMS[:2]}.get(args.mode) or learner_arms(
        runner.numbers("--counts", args.counts, int)
    )
    arms = with_candidates(arms, args.arm)
    if args.only:
        unknown = [label for label in args.only if label not in {arm.label for arm in arms}]
        if unknown:
            raise UserError(f"--only {unknown[0]!r}: no such arm; the arms are {[arm.label for arm in arms]}")
        arms = tuple(arm for arm in arms if arm.label in args.only)
    sizes = parse_sizes(args.sizes)
    for size in sizes:
        plan_size(size, args.c, args.global_batch, args.rounds, base.learners.seq_len, H=args.H)
        if args.H and size.steps // size.H < args.rounds:
            raise UserError(
                f"--H {args.H} gives {size.name} {size.steps // size.H} rounds a fragment, fewer than "
                f"--rounds {args.rounds}: lower --H, or raise --c or lower --global-batch"
            )
    if args.mode == "tokens":  # each size at each budget, H as at --c: the rounds grow with the tokens
        budgets = []
        for size in sizes:
            for c in runner.numbers("--cs", args.cs, float):
                budget = Size(f"{size.name} c{c:g}", size.overrides)
                plan_size(budget, c, args.global_batch, args.rounds, base.learners.seq_len, H=size.H)
                budgets.append(budget)
        sizes = budgets
    seeds = runner.numbers("--seeds", args.seeds, int, sign="any")
    given = runner.numbers("--lr-grid", args.lr_grid, float) if args.lr_grid else None
    lrs = given or lr_grid(base.inner.lr, args.lr_points)
    for size in sizes:  # every arm's recipe loads, or the bench stops here with the recipe's error
        for arm in arms:
            load_recipe(runner.REPO / RECIPE, arm_overrides(arm, size, args.global_batch, lrs[0], seeds[0]))
    root = Path(args.keep or tempfile.mkdtemp(prefix="dlc-quality-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    meta = {
        **asdict(runner.Provenance.here("python bench/quality.py " + shlex.join(sys.argv[1:]))),
        "mode": args.mode,
        "c": args.c,
        "global_batch": args.global_batch,
        "seq_len": base.learners.seq_len,
        "seeds": seeds,
        "lr_points": args.lr_points,
        "base_lr": base.inner.lr,
        "lrs": lrs,
        "sizes": [vars(s) for s in sizes],
        "arms": [vars(a) for a in arms],
    }
    data: dict[str, Any] = {"meta": meta, "runs": []}
    jobs = {}
    with runner.pool(args.jobs) as pool:
        for size in sizes:
            for arm in arms:
                for lr in lrs:
                    for seed in seeds:
                        overrides = arm_overrides(arm, size, args.global_batch, lr, seed)
                        key = (size.name, arm.label, lr, seed)
                        jobs[pool.submit(train_arm, arm, overrides, size.tokens)] = key
        say(f"{len(jobs)} trainings in {root}")
        for future in as_completed(jobs):
            size_name, label, lr, seed = jobs[future]
            result = future.result()
            data["runs"].append({"size": size_name, "arm": label, "lr": lr, "seed": seed, **result})
            say(f"{size_name} {label} lr {lr:g} seed {seed}: {result['loss']:.4f} in {result['wall_s']:.0f} s")
            save(data, root / "quality.json")
    if args.cli:
        data["cli"] = cli_rows(data, args.cli_arm, root)
    return data


def merge(sweeps: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from sweeps of one mode trained a piece at a time (another lr, another size): their
    sizes, arms, lrs and `dlc train` rows together; a later sweep's run replaces an earlier one's of the
    same size, arm, lr and seed. Sizes or arms of one name must be the same setting."""
    meta = {**sweeps[0]["meta"], "sizes": [], "arms": [], "lrs": []}
    runs: dict[tuple[str, str, float, int], dict[str, Any]] = {}
    cli: dict[tuple[str, str], dict[str, Any]] = {}  # each size's `dlc train` row, from whichever sweep has it
    for sweep in sweeps:
        if sweep["meta"]["mode"] != meta["mode"]:
            raise SystemExit(f"error: a {sweep['meta']['mode']} sweep cannot join a {meta['mode']} one")
        for key in ("sizes", "arms"):
            for item in sweep["meta"][key]:
                name = "name" if key == "sizes" else "label"
                same = [x for x in meta[key] if x[name] == item[name]]
                if same and same[0] != item:
                    raise SystemExit(f"error: {key[:-1]} {item[name]!r} is not the same setting in every sweep")
                if not same:
                    meta[key].append(item)
        meta["lrs"] = sorted({*meta["lrs"], *sweep["meta"]["lrs"]})
        meta["seeds"] = sorted({*meta["seeds"], *sweep["meta"]["seeds"]})
        for r in sweep["runs"]:
            runs[(r["size"], r["arm"], r["lr"], r["seed"])] = r
        for row in sweep.get("cli", []):
            cli[(row["size"], row["arm"])] = row
    if len(sweeps) > 1:
        meta["command"] = "`, then `".join(s["meta"]["command"] for s in sweeps)
        meta["commit"] = ", ".join(dict.fromkeys(s["meta"]["commit"] for s in sweeps))
    return {**sweeps[-1], "meta": meta, "runs": list(runs.values()), "cli": list(cli.values())}


def save(data: dict[str, Any], path: Path) -> None:
    """Write the sweep's record whole or not at all: a kill mid-write keeps the runs recorded before."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def cli_rows(data: dict[str, Any], label: str | None, root: Path) -> list[dict[str, Any]]:
    """Arm `label`'s best setting (default: the last arm's) at every size, through the real `dlc train`."""
    meta = data["meta"]
    arms = [Arm(**{**a, "overrides": tuple(a["overrides"])}) for a in meta["arms"]]
    chosen = next((a for a in arms if a.label == label), None) if label else arms[-1]
    if chosen is None:
        raise SystemExit(f"--cli-arm {label!r}: no such arm; the arms are {[a.label for a in arms]}")
    sizes = [Size(**s) for s in meta["sizes"]]
    return [cli_row(size, chosen, data, meta["global_batch"], root) for size in sizes]


def cli_row(size: Size, arm: Arm, data: dict[str, Any], global_batch: int, root: Path) -> dict[str, Any]:
    """The arm's best setting, seed 0, through the real `dlc train`: its loss beside the twin's."""
    from compare_tables import read_run

    lr, losses = best(data["runs"], size.name, arm.label)
    overrides = arm_overrides(arm, size, global_batch, lr, 0)
    run_dir = root / f"cli-{size.name}"
    cmd = runner.train_command(RECIPE, run_dir, *overrides, f"run.max_steps={size.steps}", "track=[]", fresh=True)
    done = runner.run(cmd, runner.log_beside(run_dir), timeout_s=3600)
    loss = ((read_run(run_dir).get("summary") or {}).get("eval_loss_final")) if not done.error() else None
    say(f"{size.name} {arm.label} through dlc train: {loss} (twin: {losses[0]:.4f})")
    return {"size": size.name, "arm": arm.label, "cli": loss, "twin": losses[0], "command": shlex.join(cmd)}


if __name__ == "__main__":
    main()
