"""Run directories written by hand for `dlc status` and `dlc report` tests.

One shape (tiny, 4 learners of 16 x 64 bytes per step, with 24 fragments) with round numbers, so the
tests can derive what the views must show:
- every learner at step 100: 100 x 1024 = 102,400 tokens each, 409,600 in all;
- parameters of tiny (width 64, 4 layers, context 64, tied): 219,520, so data-parallel sends
  4 B x 219,520 x 400 learner steps = 351,232,000 B = 334.96 MiB each way;
- the syncer sent 3,512,320 B up (exactly 1/100 of that) and 10,485,760 B (10 MiB) down in 100 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dlc.config.load import dump_recipe, load_recipe
from dlc.run import events
from tests.helpers import TINY

T0 = 1_800_000_000.0  # run start, unix seconds
ELAPSED_S = 100.0
BYTES_UP = 3_512_320
BYTES_DOWN = 10 * 2**20
NOW = T0 + ELAPSED_S + 0.5  # half a second after the fixture's last status.json
NODE_ID = "aaaaaa11" * 7  # the one node's Ray id


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def learner_row(i: int, **fields: Any) -> dict[str, Any]:
    row = {
        "id": i,
        "state": "training",
        "step": 100,
        "tokens": 102_400,
        "tokens_per_s": 1024.0,
        "loss": 3.0 + i / 10,
        "pushes": 100,
        "bytes_sent": BYTES_UP // 4,
        "pid": os.getpid(),  # alive: a running run's learners are live processes
        "last_push_age_s": 0.5,
        "adopt_lag_steps": 2.0 + i // 2,
    }
    return row | fields


def status(state: str = "running", updated_at: float = T0 + ELAPSED_S, **fields: Any) -> dict[str, Any]:
    return {
        "run": "tiny",
        "algorithm": "decoupled",
        "params": 219_520,
        "state": state,
        "updated_at": updated_at,
        "elapsed_s": ELAPSED_S,
        "progress": 0.25,
        "eta_s": 300.0,
        "step": 100.0,
        "tokens": 409_600,
        "tokens_per_s": 4096.0,
        "train_loss": 3.15,
        "eval_loss": 3.1,
        "eval_bpb": 4.472,
        "eval_loss_initial": 5.426,
        "learners": [learner_row(i) for i in range(4)],
        "syncer": {
            "versions": [17] * 24,
            "quorum": 1,
            "healthy": [0, 1, 2, 3],
            "grace_window_s": 0.25,
            "rounds_closed": 400,
            "mean_contributors": 1.5,
            "pushes_accepted": 398,
            "rejections": {"norm_outlier": 2},
            "bytes_up": BYTES_UP,
            "bytes_down": BYTES_DOWN,
        },
    } | fields


def logged() -> list[events.Event]:
    """Start, then for each learner one push per step, and one round closing per push (each learner's
    push merged alone, a version behind: staleness 1); learner 2 has two pushes rejected."""
    out: list[events.Event] = [
        events.RunStarted(
            t=T0,
            run_dir="runs/tiny",
            storage="runs/tiny",
            algorithm="decoupled",
            learners=4,
            data="stdlib",
            tokenizer="bytes",
            train_tokens=1_000_000,
            eval_tokens=50_000,
            eval_bytes_per_token=1.0,
            resumed=False,
        ),
        events.ClusterStarted(
            t=T0 + 1,
            address="embedded",
            driver_node=NODE_ID,
            nodes=[{"node_id": NODE_ID, "ip": "127.0.0.1", "host": "localhost", "head": True}],
        ),
    ]
    out += [
        events.LearnerStarted(
            t=T0 + 10,
            learner=i,
            pid=os.getpid(),
            platform="cpu",
            device_kind="cpu",
            device="cpu",
            node="127.0.0.1",
            node_id=NODE_ID,
            allocator="kept, one arena",
        )
        for i in range(4)
    ]
    versions = [1] * 24  # each fragment's version
    for step in range(1, 101):
        t = T0 + 20 + 0.8 * (step - 1)  # 100 steps from t0+20 s to t0+99.2 s
        p = step % 24
        for i in range(4):
            # 24 fragments: a push carries the 24 steps since its fragment was last sent, its round their tokens.
            version = versions[p]
            out.append(
                events.PushAccepted(
                    t=t,
                    learner=i,
                    fragment=p,
                    seq=step,
                    base_version=version - 1,
                    version=version,
                    bytes=BYTES_UP // 400,
                    steps=24,
                )
            )
            out.append(
                events.RoundClosed(
                    t=t,
                    fragment=p,
                    version=version + 1,
                    contributors=[i],
                    weights=[1.0],
                    tokens=[24 * 1024],
                    seqs=[step],
                    staleness=[1],
                )
            )
            versions[p] += 1
    for t, seq in ((T0 + 50, 38), (T0 + 60, 51)):
        out.append(
            events.PushRejected(
                t=t,
                learner=2,
                fragment=seq % 24,
                seq=seq,
                base_version=2,
                version=3,
                steps=24,
                reason="norm_outlier",
                detail="norm per step 41.2 vs median 3.1: more than 10x larger",
            )
        )
    return out


def metrics() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"t": T0 + 10, "kind": "eval", "step": 0, "tokens": 0, "eval_loss": 5.426}]
    for step, t in ((50, T0 + 59.2), (100, T0 + 99.2)):
        for i in range(4):
            loss = (3.6 if step == 50 else 3.0) + i / 10
            out.append({"t": t, "kind": "train", "learner": i, "step": step, "tokens": step * 1024, "loss": loss})
    out.append({"t": T0 + 99.5, "kind": "eval", "step": 100, "tokens": 409_600, "eval_loss": 3.1, "eval_bpb": 4.472})
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)


def make_run(
    path: Path,
    status_obj: dict[str, Any] | None = None,
    summary: dict[str, Any] | None = None,
    chaos: list[dict[str, Any]] | None = None,
    events_tail: str = "",
) -> Path:
    """A run directory of tiny with 4 learners and the 24 fragments its events are written for;
    `status_obj` defaults to a healthy running one."""
    path.mkdir(parents=True, exist_ok=True)
    shape = ["learners.count=4", "syncer.fragments=24", "syncer.sync_interval_steps=24"]
    recipe = load_recipe(TINY, [*shape, f"run.dir={path}"])
    (path / "recipe.yaml").write_text(dump_recipe(recipe))
    write_jsonl(path / "events.jsonl", [e.record() for e in logged()], events_tail)
    write_jsonl(path / "metrics.jsonl", metrics())
    (path / "status.json").write_text(json.dumps(status() if status_obj is None else status_obj))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    if chaos is not None:
        write_jsonl(path / "chaos.jsonl", chaos)
    return path


def summary(status_name: str = "completed", error: str | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "status": status_name,
        "run": "tiny",
        "algorithm": "decoupled",
        "params": 219_520,
        "wall_s": 200.0,
        "steps": 100.0,
        "tokens_total": 409_600,
        "eval_loss_initial": 5.426,
        "eval_loss_final": 3.1,
        "eval_bpb_final": 4.472,
        "learners": [{"id": i, "step": 100, "tokens": 102_400, "adopt_lag_steps": 2.0 + i // 2} for i in range(4)],
        "rounds": 400,
        "mean_contributors": 1.5,
        "bytes_up": BYTES_UP,
        "bytes_down": BYTES_DOWN,
        "pushes_accepted": 398,
        "pushes_rejected": {"norm_outlier": 2},
        "error": error,
    } | fields


def chaos_entries() -> list[dict[str, Any]]:
    return [
        {"t": T0 + 40, "fault": "kill", "target": "learner 1", "learner": 1, "phase": "injected", "detail": "SIGKILL"},
        {"t": T0 + 41, "fault": "kill", "target": "learner 1", "learner": 1, "phase": "detected", "after_s": 1.5},
        {"t": T0 + 45, "fault": "kill", "target": "learner 1", "learner": 1, "phase": "restarted", "after_s": 5.0},
        {"t": T0 + 60, "fault": "stall", "target": "learner 3", "learner": 3, "phase": "injected", "detail": "SIGSTOP"},
    ]


def finished_run(path: Path, **summary_fields: object) -> Path:
    """A completed run of tiny with a summary and chaos.jsonl (`summary_fields` override the summary's)."""
    st = status("completed", learners=[learner_row(i, state="completed") for i in range(4)])
    return make_run(path, st, summary=summary(**summary_fields), chaos=chaos_entries())
