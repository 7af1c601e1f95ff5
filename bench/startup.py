"""How fast learners start and come back: no cache, a warm compilation cache, hot spares.

    python bench/startup.py [--recipe recipes/tiny.yaml] [--kills 3] [--gap-s 25] [--settings cache]

Runs the real CLI once per setting, side by side in one invocation, each with the same kill
schedule (`dlc train --chaos`: learner 1, 2, 3, ... killed every --gap-s seconds once every
learner trains), and reads chaos.jsonl and events.jsonl:
  - kill -> first accepted push of the new incarnation, median over the kills, with its parts
    (detected, process started or spare taken, state copied) and how the new incarnation got its
    compiled functions;
  - run start -> every learner stepping.
Settings: `no cache` (run.compile_cache=false), `empty cache` (the cache on, in a new and empty
directory: a fresh machine's first run, where learners that compile the same take turns), `cache`
(a cache warmed by a run before it), `cache + 1 spare` (learners.spares=1). Prints a Markdown
table and records it, with the command, commit, machine and date, in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import runner

SETTINGS = (
    ("no cache", ["run.compile_cache=false"]),
    ("empty cache", []),  # a new, empty cache directory: a fresh machine's first run
    ("cache", []),
    ("cache + 1 spare", ["learners.spares=1"]),
)


def measure(run_dir: Path) -> dict[str, Any]:
    from dlc.run.files import EVENTS_FILE, read_jsonl

    events = read_jsonl(run_dir / EVENTS_FILE)[0]
    started = next(e["t"] for e in events if e["kind"] == "run_started")
    first = [e["t"] for e in events if e["kind"] == "learner_training" and not e.get("incarnation")]
    kills = runner.kill_timings(run_dir)
    back = [e for e in events if e["kind"] == "learner_training" and e.get("incarnation")]
    done = [k for k in kills if "first_push" in k]

    def median(phase: str) -> float | None:
        values = [k[phase] for k in done if phase in k]
        return statistics.median(values) if values else None

    return {
        "all_stepping_s": max(first) - started if first else None,
        "kills": len(kills),
        "recovered": len(done),
        "first_push_s": median("first_push"),
        "first_push_all": sorted(round(k["first_push"], 2) for k in done),
        "detected_s": median("detected"),
        "restarted_s": median("restarted"),
        "copied_s": median("state_copied"),
        "compiled_from": sorted({e.get("compiled_from", "?") for e in back}),
        "compile_s": statistics.median([e["compile_s"] for e in back if "compile_s" in e]) if back else None,
        "spare": sum(1 for e in back if e.get("spare")),
    }


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/tiny.yaml")
    ap.add_argument("--kills", type=int, default=3, help="kills per run, on learners 1, 2, ... in turn")
    ap.add_argument("--gap-s", type=float, default=25.0, help="seconds between kills")
    ap.add_argument("--step-s", type=float, default=0.25, help="learners.step_time_s (pace) of every run")
    ap.add_argument("--settings", default=",".join(name for name, _ in SETTINGS), help="which settings to run")
    ap.add_argument("--keep", help="keep the run directories here (default: a temporary directory)")
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    chosen = args.settings.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(args.keep or tmp)
        tmp_path.mkdir(parents=True, exist_ok=True)
        cache = tmp_path / "xla"
        plan = tmp_path / "kills.yaml"
        # The first kill waits for every learner to train (warm-up), the rest follow every gap.
        timeline = [
            f"  - {{at_s: {args.gap_s * (k + 1):g}, fault: kill, learner: {1 + k % 3}}}" for k in range(args.kills)
        ]
        plan.write_text("seed: 0\nwarmup_s: 0\nmin_gap_s: 0\ntimeline:\n" + "\n".join(timeline) + "\n")
        steps = int((args.gap_s * (args.kills + 2)) / args.step_s)
        common = [f"learners.step_time_s={args.step_s}", f"run.max_steps={steps}", f"run.compile_cache_dir={cache}"]
        runner.train(args.recipe, tmp_path / "warm", *common, "run.max_steps=3").check()  # fills the cache
        for name, overrides in [(n, o) for n, o in SETTINGS if n in chosen]:
            run_dir = tmp_path / name.replace(" ", "-").replace("+", "")
            print(f"{name} ...", file=sys.stderr)
            if name == "empty cache":
                overrides = [*overrides, f"run.compile_cache_dir={tmp_path / 'xla-empty'}"]
            finished = runner.train(args.recipe, run_dir, *common, *overrides, plan=plan).check()
            rows.append({"setting": name, "wall_s": finished.wall_s, **measure(run_dir)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [
        f"One run per setting, the same kill schedule in each: learners 1, 2, 3, ... killed every {args.gap_s:g} s "
        "once every learner trains. The columns after the median are medians too, each counted from the kill.",
        "",
        "| setting | run start -> all stepping (s) | share of the run | kill -> first push, median (s) | "
        "each kill (s) | detected | process up / spare taken | state copied | compiled from | compile or load (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = r["all_stepping_s"] / r["wall_s"] if r["all_stepping_s"] and r["wall_s"] else None
        lines.append(
            f"| {r['setting']} | {fmt(r['all_stepping_s'])} | {fmt(share, '.0%')} | **{fmt(r['first_push_s'])}** "
            f"({r['recovered']}/{r['kills']}) | {', '.join(f'{v:g}' for v in r['first_push_all'])} | "
            f"{fmt(r['detected_s'], '.2f')} | {fmt(r['restarted_s'])} | {fmt(r['copied_s'])} | "
            f"{', '.join(r['compiled_from']) or '-'}{' (spare)' if r['spare'] else ''} | {fmt(r['compile_s'], '.2f')} |"
        )
    options = ["--recipe", args.recipe, "--kills", str(args.kills), "--gap-s", f"{args.gap_s:g}"]
    options += ["--step-s", f"{args.step_s:g}"]
    options += ["--settings", shlex.quote(args.settings)] if args.settings != ap.get_default("settings") else []
    title = runner.heading("Start-up and rejoin", ap, args, ("recipe", "settings"))
    provenance = runner.Provenance.here(runner.bench_command("startup.py", options))
    runner.record(title, provenance, "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
