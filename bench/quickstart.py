"""The quick start on a fresh machine: `dlc train recipes/tiny.yaml` on an empty compilation cache.

    python bench/quickstart.py [--before REV] [--repeats 2]

Times, from the command to every learner stepping, and the share of the whole run that is; with
`--before REV`, the same from a git worktree of REV, run alternately with this checkout's (REV
first), so that the machine's drift falls on both. Each run gets a new, empty cache directory.
Prints a Markdown table and records it, with the command, commit, machine and date, in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import runner


def quick_start(repo: Path, run_dir: Path, cache: Path) -> dict[str, Any]:
    """One quick start from the checkout at `repo`: its start-up seconds and how each learner compiled."""
    cmd = [sys.executable, "-m", "dlc.cli", "train", "recipes/tiny.yaml", f"run.dir={run_dir}"]
    cmd.append(f"run.compile_cache_dir={cache}")
    started = time.time()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT, check=True)  # `-m`: the dlc of `repo`
    wall = time.time() - started
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    training = [e for e in events if e["kind"] == "learner_training" and not e.get("incarnation")]
    stepping = max(e["t"] for e in training) - started
    return {
        "stepping_s": stepping,
        "wall_s": wall,
        "compile_s": max(e.get("compile_s", 0.0) for e in training),
        "compiled_from": sorted(e.get("compiled_from", "?") for e in training),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="a git revision to compare with, run from a worktree of it")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = [("this checkout", runner.REPO)]
        if args.before:
            worktree = Path(tmp) / "before"
            add = ["git", "worktree", "add", "-q", "--detach", str(worktree), args.before]
            subprocess.run(add, cwd=runner.REPO, check=True)
            sides.insert(0, (f"before ({args.before})", worktree))
        try:
            for i in range(args.repeats):
                for name, repo in sides:
                    run_dir = Path(tmp) / f"{name.split()[0]}-{i}"
                    row = quick_start(repo, run_dir, Path(tmp) / f"xla-{name.split()[0]}-{i}")
                    rows.setdefault(name, []).append(row)
                    print(name, json.dumps(row), file=sys.stderr)
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=runner.REPO, check=False)
    lines = [
        f"`dlc train recipes/tiny.yaml` (4 learners, 600 steps), each run on a new, empty compilation cache; "
        f"{args.repeats} runs a side, alternating. Seconds from the command to every learner stepping (each run), "
        "its share of the run's wall time (median), the slowest learner's compile or load (median).",
        "",
        "| code | command -> all stepping (s) | share of the run | slowest compile or load (s) | compiled from |",
        "|---|---|---|---|---|",
    ]
    for name, runs in rows.items():
        share = statistics.median(r["stepping_s"] / r["wall_s"] for r in runs)
        each = ", ".join(f"{r['stepping_s']:.1f}" for r in runs)
        lines.append(
            f"| {name} | {each} | {share:.0%} | "
            f"{statistics.median(r['compile_s'] for r in runs):.1f} | {', '.join(runs[-1]['compiled_from'])} |"
        )
    options = ([f"--before {args.before}"] if args.before else []) + [f"--repeats {args.repeats}"]
    provenance = runner.Provenance.here(runner.bench_command("quickstart.py", options))
    runner.record("Start-up on an empty cache", provenance, "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
