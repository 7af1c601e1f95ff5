"""How fast learners start and come back: no cache, a warm compilation cache, hot spares.

    python bench/startup.py [--recipe recipes/tiny.yaml] [--kills 3] [--gap-s 25] [--repeats 1]

Runs the real CLI once per setting, side by side in one invocation, each with the same kill
schedule (`dlc train --chaos`: learner 1, 2, 3, ... killed every --gap-s seconds once every
learner trains), and reads chaos.jsonl and events.jsonl:
  - kill -> first accepted push of the new incarnation, median over the kills, with its parts
    (detected, process started or spare taken, state copied) and how the new incarnation got its
    compiled functions;
  - run start -> every learner stepping.
Settings: `no cache` (run.compile_cache=false), `cache` (a cache warmed by a run before it),
`cache + 1 spare` (learners.spares=1). Prints a Markdown table and appends it, with the command,
date and machine, to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SETTINGS = (
    ("no cache", ["run.compile_cache=false"]),
    ("cache", []),
    ("cache + 1 spare", ["learners.spares=1"]),
)


def jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a killed process
            out.append(json.loads(line))
    return out


def train(recipe: str, run_dir: Path, plan: Path | None, *overrides: str) -> None:
    cmd = [sys.executable, "-m", "dlc.cli", "train", recipe, f"run.dir={run_dir}", *overrides]
    if plan is not None:
        cmd += ["--chaos", str(plan)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")


def measure(run_dir: Path) -> dict[str, Any]:
    events, chaos = jsonl(run_dir / "events.jsonl"), jsonl(run_dir / "chaos.jsonl")
    started = next(e["t"] for e in events if e["kind"] == "run_started")
    first = [e["t"] for e in events if e["kind"] == "learner_training" and not e.get("incarnation")]
    kills: dict[tuple[int, int], dict[str, float]] = {}
    count: dict[int, int] = {}
    for entry in chaos:
        if entry.get("fault") != "kill":
            continue
        learner = entry["learner"]
        if entry["phase"] == "injected":
            count[learner] = count.get(learner, 0) + 1
        key = (learner, count.get(learner, 0))
        if entry.get("after_s") is not None:
            kills.setdefault(key, {})[entry["phase"]] = entry["after_s"]
    back = [e for e in events if e["kind"] == "learner_training" and e.get("incarnation")]
    done = [k for k in kills.values() if "first_push" in k]

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
    ap.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
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
        train(args.recipe, tmp_path / "warm", None, *common, "run.max_steps=3")  # fills the cache
        for name, overrides in [(n, o) for n, o in SETTINGS if n in chosen]:
            run_dir = tmp_path / name.replace(" ", "-").replace("+", "")
            print(f"{name} ...", file=sys.stderr)
            train(args.recipe, run_dir, plan, *common, *overrides)
            rows.append({"setting": name, **measure(run_dir)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [
        f"### Start-up and rejoin ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python bench/startup.py --recipe {args.recipe} --kills {args.kills} --gap-s {args.gap_s:g} "
        f"--step-s {args.step_s:g}` on {platform.node()} ({os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}). One run per setting, the same kill schedule in each.",
        "",
        "| setting | run start -> all stepping (s) | kill -> first push, median (s) | each kill (s) | "
        "detected | process up / spare taken | state copied | compiled from | compile or load (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {fmt(r['all_stepping_s'])} | **{fmt(r['first_push_s'])}** "
            f"({r['recovered']}/{r['kills']}) | {', '.join(f'{v:g}' for v in r['first_push_all'])} | "
            f"{fmt(r['detected_s'], '.2f')} | {fmt(r['restarted_s'])} | {fmt(r['copied_s'])} | "
            f"{', '.join(r['compiled_from']) or '-'}{' (spare)' if r['spare'] else ''} | {fmt(r['compile_s'], '.2f')} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.results, "a") as f:
        f.write("\n" + text)


if __name__ == "__main__":
    main()
