"""What a compare.py run measured: each run's numbers, and the tables of them.

`read_run` reads what the tables need from a finished run directory; `render` turns the runs of
one bench (or of several, `merge_results`) into the Markdown that compare.py prints and records:
one row per scenario and algorithm, means over repeats, and the paper's claims scaled to this
machine. Nothing here trains; `python bench/compare.py --from-json` renders saved runs again.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import runner

SCENARIOS = ("clean", "kills", "stragglers", "thin")  # in the order they run: clean sizes the rest
THIN_LATENCY_MS = 30.0


# ---------------------------------------------------------------------------------------------
# Reading runs


def read_run(run_dir: Path) -> dict[str, Any]:
    """What the tables need from a finished run directory: summary, eval curve, faults fired."""
    from dlc.run.files import EVENTS_FILE, METRICS_FILE, SUMMARY_FILE, read_jsonl  # cut lines are left out

    summary_file = run_dir / SUMMARY_FILE
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    events = read_jsonl(run_dir / EVENTS_FILE)[0]
    metrics = read_jsonl(run_dir / METRICS_FILE)[0]
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


def title(meta: dict[str, Any]) -> str:
    """The heading of a bench's tables in RESULTS.md: the scenarios and algorithms it ran."""
    order = [s for s in SCENARIOS if s in meta["scenarios"]]
    return f"Algorithms side by side: {', '.join(order)} ({', '.join(meta['algorithms'])})"


def provenance(meta: dict[str, Any]) -> runner.Provenance:
    """Where and when the bench ran (a compare.json from before commits were saved says so)."""
    commit = meta.get("commit", "unknown (not saved in compare.json)")
    return runner.Provenance(meta["command"], commit, meta["machine"], meta["date"])


def render(data: dict[str, Any], target_arg: float | None) -> tuple[str, list[dict[str, Any]]]:
    """The tables' Markdown (without heading and provenance: `title`, `provenance`), and the rows."""
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
        f"{meta['n_params']:,} parameters; every run stops at "
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
