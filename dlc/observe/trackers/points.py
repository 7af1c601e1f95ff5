"""What the trackers are sent: the run directory's records turned into named points and notes.

One place names every series, so TensorBoard, W&B and MLflow show the same names. Each point
carries its own step and says which axis that step counts: a learner's own steps (train lines),
the learners' mean step (evaluations, status, events), or tokens trained (`eval/loss_vs_tokens`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from dlc.run import events

# The axes a point's step counts (W&B plots each series against its axis, logged beside it).
MEAN_STEP = "step/mean"
TOKENS = "tokens"

# Events that become notes (annotations): faults, recoveries, chaos, the run's start and end.
NOTED: frozenset[type[events.Event]] = frozenset(
    {
        events.RunResumed,
        events.RunFinished,
        events.LearnerDied,
        events.LearnerRestarted,
        events.LearnerRejoined,
        events.LearnerRecovered,
        events.LearnerStalled,
        events.LearnerThawed,
        events.LearnerSlowed,
        events.LearnerJoining,
        events.LearnerLeft,
        events.LearnerLost,
        events.LearnerPreempted,
        events.NodeDraining,
        events.LinkDegraded,
        events.LinkCut,
        events.RestartRetried,
        events.StateCopyRetried,
        events.NodeKilled,
        events.SyncerDied,
        events.SyncerRestarted,
        events.PushLost,  # an acceptance that died with the syncer: the push is accepted again
        events.RoundLost,
        events.MemberLost,
        events.Reconfigure,
        events.Chaos,
        events.ChaosStarted,
        events.ChaosFinished,
        events.ControlIgnored,
    }
)


@dataclass(frozen=True)
class Point:
    """One value of series `name` at `step` of `axis`."""

    name: str
    value: float
    step: int
    axis: str


@dataclass(frozen=True)
class Note:
    """One event worth marking on a tracker's timeline, as a line of text."""

    t: float  # Unix seconds
    step: int  # the learners' mean step when it happened
    kind: str
    text: str


def learner_axis(learner: int) -> str:
    return f"step/learner_{learner}"


def _point(name: str, value: Any, step: float, axis: str) -> list[Point]:
    """A point, or none when the value is missing or not plottable (inf, nan)."""
    if value is None or isinstance(value, bool):
        return []
    try:
        number = float(value)
    except (TypeError, ValueError):
        return []
    return [Point(name, number, round(step), axis)] if math.isfinite(number) else []


def metric_points(record: dict[str, Any]) -> list[Point]:
    """A metrics.jsonl record: train lines per learner at its step, evaluations at the mean step and at tokens.

    Goodput lines are left out: the status snapshots carry the same figures.
    """
    kind = record.get("kind")
    if kind == "train":
        i, step = record["learner"], record["step"]
        axis = learner_axis(i)
        return [
            *_point(f"train/loss/learner_{i}", record.get("loss"), step, axis),
            *_point(f"train/grad_norm/learner_{i}", record.get("grad_norm"), step, axis),
            *_point(f"train/tokens_per_s/learner_{i}", record.get("tokens_per_s"), step, axis),
        ]
    if kind == "eval":
        step, tokens = record["step"], record.get("tokens") or 0
        return [
            *_point("eval/loss", record.get("eval_loss"), step, MEAN_STEP),
            *_point("eval/bits_per_byte", record.get("eval_bpb"), step, MEAN_STEP),
            *_point("eval/loss_vs_tokens", record.get("eval_loss"), tokens, TOKENS),
        ]
    return []


def status_points(snapshot: dict[str, Any]) -> list[Point]:
    """A status.json snapshot: throughput, goodput and its badput buckets, each learner's step, tokens,
    tokens/s and MFU, the syncer's rounds and bytes."""
    step = snapshot.get("step") or 0
    points = [
        *_point("run/tokens", snapshot.get("tokens"), step, MEAN_STEP),
        *_point("run/tokens_per_s", snapshot.get("tokens_per_s"), step, MEAN_STEP),
        *_point("run/mfu", snapshot.get("mfu"), step, MEAN_STEP),
        *_point("run/train_loss", snapshot.get("train_loss"), step, MEAN_STEP),
        *_point("goodput/goodput", snapshot.get("goodput"), step, MEAN_STEP),
    ]
    for bucket, seconds in sorted((snapshot.get("badput") or {}).items()):
        points += _point(f"goodput/badput_s/{bucket}", seconds, step, MEAN_STEP)
    for row in snapshot.get("learners") or []:
        if not isinstance(row.get("id"), int):  # a hot spare's row is named, not numbered
            continue
        i = row["id"]
        for key in ("step", "tokens", "tokens_per_s", "mfu"):
            points += _point(f"learner/{key}/learner_{i}", row.get(key), step, MEAN_STEP)
    syncer = snapshot.get("syncer") or {}
    for key, name in (
        ("bytes_up", "sync/bytes_up"),
        ("bytes_down", "sync/bytes_down"),
        ("rounds_closed", "sync/rounds"),
        ("mean_contributors", "sync/mean_contributors"),
        ("pushes_accepted", "sync/pushes_accepted"),
    ):
        points += _point(name, syncer.get(key), step, MEAN_STEP)
    return points


def _event_step(event: events.Event, mean_step: float) -> float:
    """An event's own step (a learner's, when it names one), else the learners' mean step."""
    step = getattr(event, "step", None)
    return float(step) if isinstance(step, int) else mean_step


class EventCounts:
    """Events as points (contributors of each round, how many of each noted kind) and notes.

    Counts start at zero with each start of the run: a resumed run counts its own events.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def points(self, event: events.Event, mean_step: float) -> list[Point]:
        step = _event_step(event, mean_step)
        if isinstance(event, events.RoundClosed):
            return _point("sync/contributors", len(event.contributors), step, MEAN_STEP)
        if type(event) not in NOTED:
            return []
        self.counts[event.kind] = self.counts.get(event.kind, 0) + 1
        return _point(f"events/{event.kind}", self.counts[event.kind], step, MEAN_STEP)

    @staticmethod
    def note(event: events.Event, mean_step: float) -> Note | None:
        """The event as one line of text (its fields the writer knew), or None for one not noted."""
        if type(event) not in NOTED:
            return None
        fields = {k: v for k, v in event.fields().items() if v is not None}
        detail = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in fields.items())
        step = _event_step(event, mean_step)
        return Note(event.t or 0.0, round(step), event.kind, f"{event.kind} {detail}".strip())
