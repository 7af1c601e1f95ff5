"""The training algorithms side by side, clean and under faults, at equal tokens, on the real CLI.

    python bench/compare.py [--algorithms decoupled,diloco,dp] [--scenarios clean,kills,stragglers,thin]
                            [--repeats 2] [--tokens 1228800] [--target-loss X] [--keep DIR] [--dry-run]
    python bench/compare.py --from-json DIR/compare.json [--target-loss X]

Every scenario x algorithm x repeat trains the recipe to the same token budget with ~8 evals (run.seed
fixed, so model and data are identical; the repeat index seeds the chaos plan), plus one
`algorithm=none` run per repeat of the clean scenario as the throughput reference of every
scenario (a learner that never syncs steps as fast under kills or thin links; under stragglers the
ratio also carries the straggler's own slowness). Time to target
counts from the moment every learner has compiled and trains. Scenarios:
  clean       no faults;
  kills       Poisson SIGKILLs, --kill-rate per learner per minute after a 20 s warm-up;
  stragglers  learner 3 three times slower for the whole run, plus two stalls longer than the
              heartbeat timeout;
  thin        every learner's link to the syncer so thin that one fp32 gradient takes --thin-ratio
              steps to send (a 12B model's bf16 gradient over 5 Gbit/s takes ~20 steps of ~2 s), 30 ms
              latency; runs stop at --max-wall-s, since data-parallel may never reach the budget.
The clean scenario runs first: its `none` run measures the step time the thin link and the stall
times are sized from, and its worst final eval loss is the default target loss. Prints a Markdown
table (goodput, bytes per token, time to target, final eval loss, throughput vs none) and a table of
the paper's claims at our scale, and appends both, with the command, date and machine, to
bench/RESULTS.md. Every run's summary and the rows are saved in compare.json next to the runs, from
which --from-json re-renders the tables without training.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # else this folder's chaos.py hides the chaos package from `check`
SCENARIOS = ("clean", "kills", "stragglers", "thin")
PACED = ("clean",)  # scenarios that get their own `none` reference run
SLOW_LEARNER = 3  # the straggler in the stragglers scenario (recipes/tiny.yaml has learners 0-3)
SLOW_FACTOR = 3.0
STALL_S = 8.0  # longer than the 5 s heartbeat timeout, so rounds stop waiting for the stalled learner
THIN_LATENCY_MS = 30.0
NO_EVAL_STEPS = 10**9
PROGRESS_EVERY_S = 30.0
_T0 = time.monotonic()


def say(message: str) -> None:
    """A progress line on stderr, stamped with the bench's elapsed time."""
    elapsed = int(time.monotonic() - _T0)
    print(f"[{elapsed // 60:3d}m{elapsed % 60:02d}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# What to run


def recipe_facts(recipe_path: str) -> dict[str, Any]:
    """Parameter count and tokens per step of the recipe (builds the model: imports JAX)."""
    from dlc.config.load import load_recipe
    from dlc.core.model import build_model, count_params

    recipe = load_recipe(REPO / recipe_path)
    learners = recipe.learners
    return {
        "n_params": count_params(build_model(recipe.model, recipe.run.seed)[1]),
        "learners": learners.count,
        "tokens_per_step": [learners.resolved(i).batch_size * learners.seq_len for i in range(learners.count)],
    }


def thin_mbps(n_params: int, step_s: float, ratio: float) -> float:
    """A link on which one fp32 gradient (8 * 4 * n_params bits) takes `ratio` steps to send."""
    return 8 * 4 * n_params / (ratio * step_s) / 1e6


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several benches: later runs replace earlier ones of the same scenario, algorithm, repeat."""
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    for result in results:
        for run in result["runs"]:
            if Path(run["run_dir"], "events.jsonl").exists():  # read again: newer code may read more
                run = {**run, **read_run(Path(run["run_dir"]))}
            runs[(run["scenario"], run["algorithm"], run["repeat"])] = run
    meta = dict(results[0]["meta"])
    if len(results) > 1:
        meta["command"] = "`, then `".join(r["meta"]["command"] for r in results)
    return {"meta": meta, "runs": list(runs.values())}


def overrides_for(scenario: str, algorithm: str, args: argparse.Namespace, facts: dict, sizing: dict) -> list[str]:
    steps = math.ceil(args.tokens / sum(facts["tokens_per_step"]))  # inner steps per learner
    every = NO_EVAL_STEPS if algorithm == "none" else max(1, steps // 8)
    # A variant of an algorithm is named ALGORITHM+LABEL ("decoupled+spares") and set with --set.
    out = [f"algorithm={algorithm.partition('+')[0]}", "run.max_steps=null", f"run.max_tokens={args.tokens}"]
    out += [f"eval.every_steps={every}"]
    out += [item.partition(":")[2] for item in args.set if item.partition(":")[0] == algorithm]
    if scenario == "thin":
        out += [
            f"learners.bandwidth_mbps={sizing['thin_mbps']:.4g}",
            f"learners.latency_ms={THIN_LATENCY_MS:g}",
            f"run.max_wall_s={args.max_wall_s:g}",
        ]
    return out


def plan_for(scenario: str, repeat: int, args: argparse.Namespace, facts: dict, sizing: dict) -> dict | None:
    """The chaos plan of a scenario, as data; None when it injects nothing."""
    if scenario == "kills":
        return {
            "description": f"Poisson kills, {args.kill_rate:g} per learner per minute",
            "seed": repeat,
            "warmup_s": 20,
            "min_gap_s": 5,
            "max_concurrent": 2,
            "in_flight_max_s": 60,
            "allow_below_quorum": True,  # the same faults for every algorithm, whatever its quorum
            "kill_per_learner_per_min": args.kill_rate,
        }
    if scenario == "stragglers":
        # Stalls at a third and two thirds of the expected training time (the chaos clock starts
        # once every learner trains), so they land inside the run whatever the token budget.
        train_s = math.ceil(args.tokens / sum(facts["tokens_per_step"])) * sizing["step_s"]
        stalled = [i for i in range(facts["learners"]) if i != SLOW_LEARNER][-2:]
        return {
            "description": f"learner {SLOW_LEARNER} x{SLOW_FACTOR:g} slower throughout; two {STALL_S:g} s stalls",
            "seed": repeat,
            "warmup_s": 0,
            "min_gap_s": 0,
            "max_concurrent": 3,
            "allow_below_quorum": True,
            "timeline": [
                {"at_s": 0, "fault": "slow", "learner": SLOW_LEARNER, "factor": SLOW_FACTOR, "until_end": True},
                *(
                    {"at_s": round((k + 1) * train_s / 3, 1), "fault": "stall", "learner": i, "duration_s": STALL_S}
                    for k, i in enumerate(stalled)
                ),
            ],
        }
    return None


def command(recipe: str, run_dir: Path, overrides: list[str], plan_file: Path | None) -> list[str]:
    # --fresh: a --keep directory reused from an earlier bench must not resume its checkpoints.
    cmd = [sys.executable, "-m", "dlc.cli", "train", recipe, f"run.dir={run_dir}", *overrides, "--fresh"]
    return cmd + (["--chaos", str(plan_file)] if plan_file else [])


def check(recipe: str, overrides: list[str], plan: dict | None) -> str | None:
    """Why this run would be refused by the recipe or plan checks, or None."""
    from chaos.plan import plan_from_dict
    from dlc.config.load import load_recipe
    from dlc.errors import UserError

    try:
        load_recipe(REPO / recipe, overrides)
        if plan is not None:
            plan_from_dict(plan)
    except UserError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------------------------
# Running one


def train(cmd: list[str], run_dir: Path, timeout_s: float, label: str) -> str | None:
    """Run one training process group to the end; the error, or None. Never leaves it running."""
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    try:
        while True:
            try:
                rc = proc.wait(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    kill_group(proc)
                    return f"timed out after {elapsed:.0f} s (log: {log})"
                say(f"  {label}: {elapsed:.0f} s{_progress(run_dir)}")
    except BaseException:
        kill_group(proc)
        raise
    if rc != 0:
        tail = log.read_text()[-1500:].strip()
        return f"exit code {rc} (log: {log}): ...{tail[-600:]}"
    return None


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the run's process group, then SIGKILL whatever is left of it."""
    for sig, grace_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):  # the leader is gone; the group may not be
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _progress(run_dir: Path) -> str:
    try:
        status = json.loads((run_dir / "status.json").read_text())
        return f", {status['state']}, {status['progress']:.0%} of the budget"
    except (OSError, ValueError, KeyError, TypeError):
        return ", starting"


def read_run(run_dir: Path) -> dict[str, Any]:
    """What the tables need from a finished run directory: summary, eval curve, faults fired."""
    from dlc.run.files import read_jsonl  # a line cut short by a killed process is left out

    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    events = read_jsonl(run_dir / "events.jsonl")[0]
    metrics = read_jsonl(run_dir / "metrics.jsonl")[0]
    # The clock starts when every first learner has compiled and trains: start-up (cluster, process
    # and JAX start, compilation, the initial eval) is the same for every algorithm and would
    # drown the differences in time to target. goodput_after_startup leaves it out the same way.
    begun = [e["t"] for e in events if e.get("kind") == "learner_training" and not e.get("incarnation")]
    started = max(begun) if begun else next((e["t"] for e in events if e.get("kind") == "run_started"), None)
    if started is None:
        started = min((m["t"] for m in events + metrics if "t" in m), default=None)
    evals = [
        [round(m["t"] - started, 3), m.get("tokens"), m["eval_loss"]]
        for m in metrics
        if m.get("kind") == "eval" and m.get("eval_loss") is not None and started is not None
    ]
    fired = next((e.get("fired", {}) for e in reversed(events) if e.get("kind") == "chaos_finished"), {})
    ended = max((e["t"] for e in events if "t" in e), default=None)
    trained_s = round(ended - started, 3) if ended is not None and started is not None else None
    return {"summary": summary, "evals": sorted(evals), "faults_fired": fired, "trained_s": trained_s}


# ---------------------------------------------------------------------------------------------
# Metrics


def after_startup(summary: dict[str, Any]) -> float | None:
    """Productive / (allocated - startup): goodput once every process runs and has compiled. Hot
    spares' idle time (`spare_s`) counts as allocated: it is hardware the run holds."""
    rows = (summary.get("goodput_by_learner") or {}).values()
    productive = sum(r.get("productive", 0.0) for r in rows)
    allocated = sum(v for r in rows for k, v in r.items() if k not in ("goodput", "startup"))
    allocated += summary.get("spare_s") or 0.0
    return productive / allocated if allocated > 0 else None


def steady_rate(summary: dict[str, Any]) -> float | None:
    """Mean learner tokens/s after compiling (learners that never stepped are left out)."""
    rates = [x["steady_tokens_per_s"] for x in summary.get("learners", []) if x.get("steady_tokens_per_s")]
    return statistics.fmean(rates) if rates else None


def measured_step_s(summary: dict[str, Any], tokens_per_step: list[int]) -> float | None:
    """Mean seconds per inner step of a run's learners, from their steady tokens/s."""
    steps = [
        tokens_per_step[x["id"]] / x["steady_tokens_per_s"]
        for x in summary.get("learners", [])
        if x.get("steady_tokens_per_s") and x["id"] < len(tokens_per_step)
    ]
    return statistics.fmean(steps) if steps else None


def row_of(run: dict[str, Any], reference: dict[str, Any] | None, target: float | None) -> dict[str, Any]:
    """One run's numbers; None where the run cannot say."""
    s = run.get("summary")
    row: dict[str, Any] = {k: run[k] for k in ("scenario", "algorithm", "repeat")}
    row["error"] = run.get("error") or (s or {}).get("error")
    if not s:
        return row
    tokens = s.get("tokens_total") or 0
    up, down = s.get("bytes_up") or 0, s.get("bytes_down") or 0
    hit = next(((t, n) for t, n, loss in run["evals"] if target is not None and loss <= target), (None, None))
    reached, tokens_to_target = hit
    trained_s = run.get("trained_s")
    rate = steady_rate(s)
    ref_rate = steady_rate(reference["summary"]) if reference and reference.get("summary") else None
    row |= {
        "goodput": s.get("goodput"),
        "goodput_after_startup": after_startup(s),
        "bytes_per_token": (up + down) / tokens if tokens else None,
        "up_bytes_per_token": up / tokens if tokens else None,
        "time_to_target_s": reached,
        "wall_s": s.get("wall_s"),
        "trained_s": trained_s,  # from the moment every learner trained to the end
        "tokens_to_target": tokens_to_target,
        "train_tokens_per_s": tokens / trained_s if tokens and trained_s else None,
        "final_eval_loss": s.get("eval_loss_final"),
        "tokens": tokens,
        "steady_tokens_per_s": rate,
        "throughput_vs_none": rate / ref_rate if rate and ref_rate else None,
        "faults": sum(run.get("faults_fired", {}).values()),
    }
    return row


def default_target(runs: list[dict[str, Any]]) -> float | None:
    """The worst final eval loss among the clean runs, rounded up to 2 decimals."""
    finals = [
        r["summary"]["eval_loss_final"]
        for r in runs
        if r["scenario"] == "clean" and r["algorithm"] != "none" and (r.get("summary") or {}).get("eval_loss_final")
    ]
    return math.ceil(max(finals) * 100 - 1e-9) / 100 if finals else None


def compute_rows(runs: list[dict[str, Any]], target: float | None) -> list[dict[str, Any]]:
    refs = {(r["scenario"], r["repeat"]): r for r in runs if r["algorithm"] == "none"}
    # Kills and thin links change nothing for learners that never synchronise: the clean run is their reference.
    return [row_of(r, refs.get((r["scenario"], r["repeat"])) or refs.get(("clean", r["repeat"])), target) for r in runs]


# ---------------------------------------------------------------------------------------------
# Tables


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = _values(rows, key)
    return statistics.fmean(values) if values else None


def _cell(rows: list[dict[str, Any]], key: str, fmt: str, spread: bool = False) -> str:
    values = _values(rows, key)
    if not values:
        return "-"
    text = format(statistics.fmean(values), fmt)
    low, high = format(min(values), fmt), format(max(values), fmt)
    if spread and low != high:
        text += f" ({low}-{high})"
    return text


def _time_cell(rows: list[dict[str, Any]]) -> str:
    done = [r for r in rows if r.get("wall_s") is not None]
    if not done:
        return "-"
    times = _values(done, "time_to_target_s")
    if len(times) == len(done):
        return _cell(done, "time_to_target_s", ".0f", spread=True)
    missed = min(r.get("trained_s") or r["wall_s"] for r in done if r.get("time_to_target_s") is None)
    return f"> {missed:.0f} (never reached)" + (f", {len(times)}/{len(done)} reached" if times else "")


def main_table(rows: list[dict[str, Any]], scenarios: list[str], algorithms: list[str]) -> list[str]:
    lines = [
        "| scenario | algorithm | goodput (min-max) | goodput after start-up | bytes/token | up bytes/token | "
        "time to target (s) | final eval loss | tokens | throughput vs none | faults fired |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for algorithm in [*algorithms, "none"]:
            group = [r for r in rows if r["scenario"] == scenario and r["algorithm"] == algorithm]
            if not group:
                continue
            ok = [r for r in group if r.get("tokens") is not None]
            failed = len(group) - len(ok)
            name = algorithm + (" (reference)" if algorithm == "none" else "")
            name += f" ({failed}/{len(group)} failed)" if failed else ""
            versus = (
                f"1 ({_cell(ok, 'steady_tokens_per_s', '.0f')} tok/s)"
                if algorithm == "none"
                else _cell(ok, "throughput_vs_none", ".3f")
            )
            lines.append(
                f"| {scenario} | {name} | **{_cell(ok, 'goodput', '.3f', spread=True)}** | "
                f"{_cell(ok, 'goodput_after_startup', '.3f')} | {_cell(ok, 'bytes_per_token', ',.1f')} | "
                f"{_cell(ok, 'up_bytes_per_token', ',.1f')} | {_time_cell(ok) if algorithm != 'none' else '-'} | "
                f"{_cell(ok, 'final_eval_loss', '.4f', spread=True)} | {_cell(ok, 'tokens', ',.0f')} | {versus} | "
                f"{_cell(ok, 'faults', '.2g')} |"
            )
    return lines


def claims_table(rows: list[dict[str, Any]]) -> list[str]:
    """The paper's claims, scaled to this machine: measured, target, met."""

    def mean(scenario: str, algorithm: str, key: str) -> float | None:
        return _mean([r for r in rows if r["scenario"] == scenario and r["algorithm"] == algorithm], key)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def rel(a: float | None, b: float | None) -> float | None:
        return None if (q := ratio(a, b)) is None else q - 1

    # Thin link: dp's time to target over decoupled's; a lower bound when a dp run never reached it.
    thin_dp = [r for r in rows if r["scenario"] == "thin" and r["algorithm"] == "dp" and r.get("trained_s")]
    missed = [r["trained_s"] for r in thin_dp if r.get("time_to_target_s") is None]
    dp_time = min(missed) if missed else _mean(thin_dp, "time_to_target_s")
    speedup = ratio(dp_time, mean("thin", "decoupled", "time_to_target_s"))
    # A thin link changes dp's speed, not its arithmetic: it needs as many tokens as clean dp did,
    # at the token rate it managed on the thin link.
    projected = ratio(
        ratio(mean("clean", "dp", "tokens_to_target"), mean("thin", "dp", "train_tokens_per_s")),
        mean("thin", "decoupled", "time_to_target_s"),
    )
    dp_clean_loss = mean("clean", "dp", "final_eval_loss")
    claims = [  # name, measured, comparison, bound, format
        ("kills: decoupled goodput after start-up", mean("kills", "decoupled", "goodput_after_startup"), ">=", 0.9,
         "{:.2f}"),
        ("kills: dp goodput after start-up", mean("kills", "dp", "goodput_after_startup"), "<=", 0.6, "{:.2f}"),
        ("clean: bytes/token, dp / decoupled",
         ratio(mean("clean", "dp", "bytes_per_token"), mean("clean", "decoupled", "bytes_per_token")), ">=", 100,
         "{:.0f}x"),
        ("thin link: time to target, dp / decoupled", speedup, ">=", 10, ("> " if missed else "") + "{:.1f}x"),
        ("thin link: dp projected time to target / decoupled", projected, ">=", 10, "{:.1f}x"),
        ("quality, clean: decoupled final eval loss vs dp",
         rel(mean("clean", "decoupled", "final_eval_loss"), dp_clean_loss), "<=", 0.02, "{:+.1%}"),
        ("quality, kills: decoupled final eval loss vs dp clean",
         rel(mean("kills", "decoupled", "final_eval_loss"), dp_clean_loss), "<=", 0.03, "{:+.1%}"),
        ("overhead, clean: decoupled throughput / none", mean("clean", "decoupled", "throughput_vs_none"), ">=",
         0.95, "{:.3f}"),
    ]  # fmt: skip
    lines = ["| claim (paper, at our scale) | measured | target | met |", "|---|---|---|---|"]
    for name, value, op, bound, fmt in claims:
        target = f"{op} {fmt.removeprefix('> ').format(bound)}"
        if value is None:
            lines.append(f"| {name} | - | {target} | - |")
            continue
        met = value >= bound if op == ">=" else value <= bound
        verdict = "yes" if met else "not shown (a lower bound)" if fmt.startswith("> ") else "no"
        lines.append(f"| {name} | {fmt.format(value)} | {target} | {verdict} |")
    return lines


def render(data: dict[str, Any], target_arg: float | None) -> tuple[str, list[dict[str, Any]]]:
    meta, runs = data["meta"], data["runs"]
    target = target_arg if target_arg is not None else default_target(runs)
    how = (
        "--target-loss"
        if target_arg is not None
        else "the worst final eval loss of the clean runs, rounded up"
        if target is not None
        else "none: no clean run finished and no --target-loss"
    )
    rows = compute_rows(runs, target)
    order = [s for s in SCENARIOS if s in meta["scenarios"]]
    thin = (
        f"; thin link {meta['thin_mbps']:.3g} Mbit/s + {THIN_LATENCY_MS:g} ms "
        f"(one fp32 gradient = {meta['thin_ratio']:g} steps)"
        if "thin" in order
        else ""
    )
    lines = [
        f"### Algorithms side by side ({meta['date']})",
        "",
        f"`{meta['command']}` on {meta['machine']}. {meta['n_params']:,} parameters; every run stops at "
        f"{meta['tokens']:,} trained tokens (thin: or at {meta['max_wall_s']:g} s); {meta['repeats']} repeat(s), "
        f"the repeat index seeding the chaos plan. Step time {meta['step_s']:.3f} s ({meta['step_s_source']})"
        f"{thin}. Target eval loss **{'-' if target is None else f'{target:.2f}'}** ({how}). "
        "Goodput after start-up leaves out cluster start and compilation; throughput vs none is mean learner "
        "steady tokens/s over the clean `none` run of the same repeat (evals run beside the algorithms, not "
        "beside `none`). Time to target counts from the moment every learner trains.",
        "",
        *main_table(rows, order, meta["algorithms"]),
        "",
        *claims_table(rows),
        "",
    ]
    errors = [f"- {r['scenario']} {r['algorithm']} #{r['repeat']}: {r['error']}" for r in rows if r.get("error")]
    if errors:
        lines += ["Failed runs:", "", *errors, ""]
    return "\n".join(lines), rows


# ---------------------------------------------------------------------------------------------
# The bench


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument(
        "--algorithms",
        default="decoupled,diloco,dp",
        help="comma-separated: decoupled, diloco, dp, or a variant ALGORITHM+LABEL given its overrides by --set "
        "(e.g. decoupled+spares with --set decoupled+spares:learners.spares=1)",
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated: {', '.join(SCENARIOS)}")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4 * 300 * 16 * 64, help="tokens trained by every run")
    ap.add_argument("--target-loss", type=float, help="default: worst final eval loss of the clean runs")
    ap.add_argument("--kill-rate", type=float, default=0.5, help="kills scenario: kills per learner per minute")
    ap.add_argument("--thin-ratio", type=float, default=20.0, help="thin: steps one fp32 gradient takes to send")
    ap.add_argument("--step-s", type=float, help="inner step time (s); default: measured by the clean none run, or 0.2")
    ap.add_argument("--max-wall-s", type=float, default=600.0, help="thin: stop every run after this many seconds")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="kill a run's process group after this long")
    ap.add_argument(
        "--keep",
        help="directory for the run directories and compare.json (default: a new temp dir, checkpoints deleted)",
    )
    ap.add_argument("--out", help="append the tables here (default bench/RESULTS.md; with --from-json: nowhere)")
    ap.add_argument(
        "--from-json",
        action="append",
        help="re-render the tables from compare.json files instead of training; a later file's runs replace "
        "an earlier one's of the same scenario, algorithm and repeat",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ALGORITHM:KEY=VALUE",
        help="a recipe override for one algorithm's runs only, e.g. decoupled:syncer.quorum=4",
    )
    ap.add_argument("--skip-none", action="store_true", help="no `none` reference runs (give --step-s)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and the thin link, run nothing")
    args = ap.parse_args()
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    if "none" in args.algorithms:
        ap.error("algorithm none always runs as the reference: leave it out of --algorithms")
    args.scenarios = [s for s in SCENARIOS if s in args.scenarios.split(",")]  # clean first: it sizes the rest
    return args


def main() -> None:
    args = parse_args()
    if args.from_json:
        text, _ = render(merge_results([json.loads(Path(f).read_text()) for f in args.from_json]), args.target_loss)
        print(text)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")
        return
    facts = recipe_facts(args.recipe)
    sizing = {"step_s": args.step_s or 0.2, "step_s_source": "--step-s" if args.step_s else "default"}
    sizing["thin_mbps"] = thin_mbps(facts["n_params"], sizing["step_s"], args.thin_ratio)
    schedule = [
        (s, a, rep)
        for s in args.scenarios
        for rep in range(args.repeats)
        for a in _order(s, args.algorithms, rep, args.skip_none)
    ]
    if args.dry_run:
        dry_run(args, schedule, facts, sizing)
        return
    for scenario, algorithm, rep in schedule:  # refuse a typo now, not an hour in
        overrides = overrides_for(scenario, algorithm, args, facts, sizing)
        problem = check(args.recipe, overrides, plan_for(scenario, rep, args, facts, sizing))
        if problem:
            raise SystemExit(f"{scenario} {algorithm}: {problem}")
    root = Path(args.keep or tempfile.mkdtemp(prefix="dlc-compare-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python bench/compare.py " + shlex.join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({platform.platform()}, {os.cpu_count()} CPUs)",
        **{k: getattr(args, k) for k in ("recipe", "algorithms", "scenarios", "repeats", "tokens", "max_wall_s")},
        **{k: getattr(args, k) for k in ("thin_ratio", "kill_rate")},
        "n_params": facts["n_params"],
        **sizing,
    }
    runs: list[dict[str, Any]] = []
    say(f"{len(schedule)} runs, run directories in {root}")
    for n, (scenario, algorithm, rep) in enumerate(schedule, 1):
        label = f"[{n}/{len(schedule)}] {scenario} {algorithm} #{rep}"
        runs.append(run_one(args, scenario, algorithm, rep, root, facts, sizing, label))
        if sizing["step_s_source"] == "default":
            resize(sizing, runs, facts, args.thin_ratio)
        meta |= sizing
        _save(root, meta, runs, args.target_loss)
    text, _ = render({"meta": meta, "runs": runs}, args.target_loss)
    text += f"\nRaw results: `{root / 'compare.json'}` (re-render with `--from-json`).\n"
    print(text)
    with open(args.out or REPO / "bench" / "RESULTS.md", "a") as f:
        f.write(text + "\n")


def dry_run(args: argparse.Namespace, schedule: list[tuple[str, str, int]], facts: dict, sizing: dict) -> None:
    root = Path(args.keep or "$TMPDIR/dlc-compare-XXXX")
    measured = "" if args.step_s else "; the real run measures it with the clean none run"
    print(
        f"# {len(schedule)} runs; {facts['n_params']:,} parameters; thin link {sizing['thin_mbps']:.4g} Mbit/s "
        f"+ {THIN_LATENCY_MS:g} ms at a step of {sizing['step_s']:g} s ({sizing['step_s_source']}{measured})"
    )
    for scenario, algorithm, rep in schedule:
        run_dir = root / f"{scenario}-{algorithm}-{rep}"
        chaos = plan_for(scenario, rep, args, facts, sizing)
        overrides = overrides_for(scenario, algorithm, args, facts, sizing)
        print(shlex.join(command(args.recipe, run_dir, overrides, run_dir.with_suffix(".yaml") if chaos else None)))
        if chaos:
            print(f"#   plan: {json.dumps(chaos)}")
        problem = check(args.recipe, overrides, chaos)
        if problem:
            print("#   refused today: " + " ".join(problem.split()))


def resize(sizing: dict[str, Any], runs: list[dict[str, Any]], facts: dict, ratio: float) -> None:
    """Size the thin link and the stall times from the step time the clean `none` run measured."""
    ref = next((r for r in runs if (r["scenario"], r["algorithm"]) == ("clean", "none") and r["summary"]), None)
    step_s = measured_step_s(ref["summary"], facts["tokens_per_step"]) if ref else None
    if step_s:
        sizing |= {"step_s": step_s, "step_s_source": "measured by the clean none run"}
        sizing["thin_mbps"] = thin_mbps(facts["n_params"], step_s, ratio)
        say(f"step {step_s:.3f} s: thin link {sizing['thin_mbps']:.4g} Mbit/s")


def run_one(
    args: argparse.Namespace, scenario: str, algorithm: str, rep: int, root: Path, facts: dict, sizing: dict, label: str
) -> dict[str, Any]:
    """Train one scenario x algorithm x repeat; what `read_run` found, with how it was run."""
    run_dir = root / f"{scenario}-{algorithm}-{rep}"
    chaos = plan_for(scenario, rep, args, facts, sizing)
    plan_file = run_dir.with_suffix(".yaml") if chaos else None
    if plan_file:
        import yaml

        plan_file.write_text(yaml.safe_dump(chaos, sort_keys=False))
    cmd = command(args.recipe, run_dir, overrides_for(scenario, algorithm, args, facts, sizing), plan_file)
    say(f"{label}: started")
    started = time.monotonic()
    timeout_s = max(args.timeout_s, args.max_wall_s + 600) if scenario == "thin" else args.timeout_s
    error = train(cmd, run_dir, timeout_s, label)
    run = {
        "scenario": scenario,
        "algorithm": algorithm,
        "repeat": rep,
        "run_dir": str(run_dir),
        "command": shlex.join(cmd),
        "plan": chaos,
        "error": error,
        **read_run(run_dir),
    }
    if not args.keep:  # the tables never read checkpoints; 32 runs of them fill a small /tmp
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    s = run["summary"] or {}
    say(
        f"{label}: {'FAILED ' + error if error else 'done'} in {time.monotonic() - started:.0f} s; "
        f"goodput {s.get('goodput')}, final eval loss {s.get('eval_loss_final')}, {s.get('tokens_total')} tokens"
    )
    return run


def _order(scenario: str, algorithms: list[str], repeat: int, skip_none: bool = False) -> list[str]:
    """The reference first (the clean one sizes the thin link), then the algorithms, rotated per repeat.

    Only scenarios that change a learner's own pace get their own reference run.
    """
    k = repeat % len(algorithms) if algorithms else 0
    reference = ["none"] if scenario in PACED and not skip_none else []
    return [*reference, *algorithms[k:], *algorithms[:k]]


def _save(root: Path, meta: dict[str, Any], runs: list[dict[str, Any]], target_arg: float | None) -> None:
    """compare.json after every run, so an interrupted bench keeps what it measured."""
    _, rows = render({"meta": meta, "runs": runs}, target_arg)
    tmp = root / ".compare.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "runs": runs, "rows": rows}, indent=1))
    os.replace(tmp, root / "compare.json")


if __name__ == "__main__":
    main()
