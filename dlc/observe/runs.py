"""`dlc report`, reading: each run directory into a `RunData`, and the series the plots derive from it.

Everything comes from the run's files (recipe, events, metrics, chaos, summary or status), read
whole and defensively: a line without a time is skipped, a run that logged less plots less.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlc.observe.reader import device_summary, lifecycle_entry, read_recipe, voided
from dlc.observe.timeline import Interval, learner_intervals, window_for, windowed_goodput
from dlc.run import events
from dlc.run.files import CHAOS_FILE, EVENTS_FILE, METRICS_FILE, STATUS_FILE, SUMMARY_FILE, read_json, read_jsonl


@dataclass
class RunData:
    """What the plots and the table need from one run directory."""

    path: Path
    label: str
    recipe: dict[str, Any]
    state: dict[str, Any]  # summary.json when the run ended, else status.json
    evals: list[dict[str, Any]] = field(default_factory=list)
    train: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    goodput: list[tuple[float, float]] = field(default_factory=list)  # (t, fraction) samples, if logged
    ledger: list[tuple[float, float, float]] = field(default_factory=list)  # (t, productive_s, allocated_s)
    intervals: list[Interval] = field(default_factory=list)  # each learner's states over time
    merged: list[tuple[float, float]] = field(default_factory=list)  # (t, tokens a round merged)
    sent: list[tuple[float, int]] = field(default_factory=list)  # (t, bytes of one push)
    steps: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # learner -> (t, step)
    chaos: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0
    devices: str | None = None  # learners per device, from learner_started events (runs whose rows lack it)
    data: str | None = None  # what it trained on and how it was tokenized, from run_started

    @property
    def params(self) -> int | None:
        params = self.state.get("params")  # recorded by the driver in status.json and summary.json
        return params if isinstance(params, int) and not isinstance(params, bool) else None

    def tokens_per_step(self, learner: int) -> int:
        cfg = self.recipe.get("learners") or {}
        batch = next(
            (o["batch_size"] for o in cfg.get("overrides") or [] if o.get("index") == learner and o.get("batch_size")),
            cfg.get("batch_size", 0),
        )
        return int(batch) * int(cfg.get("seq_len", 0))


def load_run(path: Path, label: str) -> RunData:
    summary, status = read_json(path / SUMMARY_FILE), read_json(path / STATUS_FILE) or {}
    run = RunData(path, label, read_recipe(path), summary or status)
    # Every record written has its `t`: one without (not a run directory's line) is left out.
    logged = [e for e in events.parse_all(read_jsonl(path / EVENTS_FILE)[0]) if e.t is not None]
    metrics, _ = read_jsonl(path / METRICS_FILE)
    run.chaos, _ = read_jsonl(path / CHAOS_FILE)
    if not run.chaos:  # no chaos: deaths and recoveries of learners killed from outside
        run.chaos = [entry for e in logged if (entry := lifecycle_entry(e)) is not None]
    starts = [e.t for e in logged if isinstance(e, events.RunStarted) and e.t is not None]
    stamps = [m["t"] for m in metrics if isinstance(m.get("t"), int | float)]
    started = next((e for e in reversed(logged) if isinstance(e, events.RunStarted) and e.tokenizer), None)
    if started is not None:
        vocab = (run.recipe.get("model") or {}).get("vocab_size")
        run.data = f"{started.data} ({started.tokenizer}" + (f", {vocab:,} tokens)" if vocab else ")")
    run.t0 = min(starts or stamps or [0.0])
    for m in metrics:
        if not isinstance(m.get("t"), int | float):
            continue
        if m.get("kind") == "eval" and isinstance(m.get("eval_loss"), int | float):
            run.evals.append(m)
        elif m.get("kind") == "train" and isinstance(m.get("learner"), int) and isinstance(m.get("loss"), int | float):
            run.train.setdefault(m["learner"], []).append(m)
        elif m.get("kind") == "goodput" and isinstance(m.get("goodput"), int | float):
            run.goodput.append((m["t"], m["goodput"]))
            if isinstance(m.get("productive_s"), int | float) and isinstance(m.get("allocated_s"), int | float):
                run.ledger.append((m["t"], m["productive_s"], m["allocated_s"]))
    started_on = {e.learner: e.device for e in logged if isinstance(e, events.LearnerStarted) and e.device}
    run.devices = device_summary(list(started_on.values()))
    fragments = int((run.recipe.get("syncer") or {}).get("fragments") or 1)
    # The learners' view of what they sent; older logs have only the syncer's (net of lost acceptances).
    sent_kind = events.PushSent if any(isinstance(e, events.PushSent) for e in logged) else events.PushAccepted
    pending: set[int] = set()  # learners started and not yet seen pushing
    # Acceptances and rounds a syncer's death (or a stop) lost: the push is accepted again, the round made again.
    void = voided(logged)
    for i, e in enumerate(logged):
        t = e.t or 0.0
        if isinstance(e, events.RoundClosed) and i not in void:
            # Each fragment's round carries the tokens since that fragment was last sent, so one
            # step's tokens reach P rounds: tokens / P is the progress merged.
            run.merged.append((t, sum(e.tokens) / fragments))
        elif isinstance(e, sent_kind) and i not in void:
            run.sent.append((t, e.bytes))
        elif isinstance(e, events.RunResumed | events.LearnerStopped) and e.step is not None:
            run.steps.setdefault(e.learner, []).append((t, e.step))
        if isinstance(e, events.LearnerStarted):
            pending.add(e.learner)
        elif isinstance(e, events.PushSent | events.PushAccepted | events.PushRejected) and e.learner in pending:
            # A learner's first push marks when it began stepping (compilation comes first), even
            # an acceptance lost later with the syncer.
            pending.discard(e.learner)
            rows = run.steps.setdefault(e.learner, [])
            rows.append((t, rows[-1][1] if rows else 0))
    for learner, records in run.train.items():
        run.steps.setdefault(learner, []).extend((m["t"], int(m.get("step") or 0)) for m in records)
    for rows in run.steps.values():
        rows.sort()
    stamps += [e.t for e in logged if e.t is not None]
    run.intervals = learner_intervals(logged, max(stamps, default=run.t0))
    return run


def labels_for(paths: list[Path]) -> list[str]:
    """Directory names, made unique and safe as file names."""
    labels: list[str] = []
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", path.resolve().name) or "run"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}-{n}", n + 1
        labels.append(label)
    return labels


# -- derived series ----------------------------------------------------------------------------


def merged_share(run: RunData, bins: int = 60, min_width_s: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Tokens merged per second per time bin, as a share of the run's steady rate (90th percentile).

    Without rounds (algorithm none) the tokens the learners trained stand in for merged ones.
    """
    if run.merged:
        times, tokens = np.array([t for t, _ in run.merged]), np.array([x for _, x in run.merged])
    else:
        rows = [(m["t"], i, int(m.get("tokens") or 0)) for i, ms in run.train.items() for m in ms]
        last: dict[int, int] = {}
        times_l, tokens_l = [], []
        for t, i, tok in sorted(rows):
            times_l.append(t)
            tokens_l.append(max(0, tok - last.get(i, 0)))
            last[i] = tok
        times, tokens = np.array(times_l), np.array(tokens_l, dtype=float)
    times = times - run.t0
    if times.size < 2:
        return np.array([]), np.array([])
    width = max(min_width_s, float(times.max()) / bins)  # a few steps per bin, or rates alias
    edges = np.arange(0.0, float(times.max()) + width, width)
    rate = np.histogram(times, bins=edges, weights=tokens)[0] / width
    steady = float(np.percentile(rate, 90))
    return edges[1:], np.minimum(1.0, rate / steady) if steady > 0 else np.zeros_like(rate)


def learner_steps_at(run: RunData, times: np.ndarray) -> np.ndarray:
    """Steps taken by all learners together at each time (since start), interpolated per learner."""
    total = np.zeros_like(times, dtype=float)
    for rows in run.steps.values():
        xs = np.array([t - run.t0 for t, _ in rows])
        ys = np.maximum.accumulate(np.array([float(step) for _, step in rows]))
        total += np.interp(times, xs, ys, left=0.0)
    return total


def goodput_series(run: RunData) -> tuple[np.ndarray, np.ndarray, str]:
    """Goodput over time since start, best first: over a sliding window (runs that log the ledger's
    totals), cumulative (older runs), or tokens merged per second as a share of the steady rate
    (runs that log no goodput); with what it is."""
    if len(run.ledger) >= 2:
        window = window_for(run.ledger[-1][0] - run.t0)
        x, y = windowed_goodput(run.ledger, window)
        return x - run.t0, y, f"goodput over {window:.0f} s (%)"
    if run.goodput:
        x, y = np.array([t - run.t0 for t, _ in run.goodput]), np.array([g for _, g in run.goodput])
        return x, y, "goodput since start (%)"
    x, y = merged_share(run)
    return x, y, "tokens merged/s, % of steady"
