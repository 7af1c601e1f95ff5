"""Ray's metrics: dlc's series through `ray.util.metrics`, to the Prometheus endpoint a cluster exports.

They reach what a Ray cluster's operators already scrape, and the Grafana dashboards on it. Every
tracker point becomes a gauge named `dlc_<series>`, which Ray exports as `ray_dlc_<series>` beside
its own series; what the other trackers keep in a series' name goes into a label here: `learner`
(train/loss/learner_2 -> dlc_train_loss{learner="2"}), `bucket` for badput's buckets and `kind` for
event counts (events/learner_died -> dlc_events{kind="learner_died"}, counted since this start of
the run). Every series also carries `run`, the run directory's name. The driver records them; Ray's
metrics agent on the driver's node exports them, about every 10 s.

Turned on by `metrics.port` (the embedded cluster's endpoint; `dlc.engine.cluster.check_metrics_port`
refuses a port in use or a Ray without its metrics agent before anything is written) or by
`metrics.enabled` (a joined cluster's own endpoint). Not one of `track`'s names: the driver hands
it to the run's trackers beside those (`Trackers.open(..., extra=...)`), and the engine, the one
package that talks to Ray, keeps it.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from dlc.observe.trackers.points import TOKENS, Note, Point

PREFIX = "dlc_"
_LABELLED = {("goodput", "badput_s"): "bucket", ("events",): "kind"}  # series whose last part is a label
_GAUGES: dict[str, Any] = {}  # one gauge per name in a process: Ray keeps each name it is given
_LOCK = threading.Lock()


def series(point: str) -> tuple[str, dict[str, str]]:
    """A point's name -> the gauge's name and its labels (beside `run`)."""
    parts = point.split("/")
    labels: dict[str, str] = {}
    if re.fullmatch(r"learner_\d+", parts[-1]):
        labels["learner"] = parts.pop().removeprefix("learner_")
    else:
        for prefix, label in _LABELLED.items():
            if tuple(parts[: len(prefix)]) == prefix and len(parts) == len(prefix) + 1:
                labels[label] = parts.pop()
    return PREFIX + "_".join(re.sub(r"[^A-Za-z0-9_]", "_", part) for part in parts), labels


def _gauge(name: str, label_keys: tuple[str, ...]) -> Any:
    from ray.util.metrics import Gauge

    with _LOCK:
        if name not in _GAUGES:
            _GAUGES[name] = Gauge(name, description=f"dlc: {name.removeprefix(PREFIX)}", tag_keys=label_keys)
        return _GAUGES[name]


class RayMetricsTracker:
    """A tracker (`dlc.observe.trackers.fanout.Tracker`) whose series are Ray gauges of run `run`."""

    name = "metrics"

    def __init__(self, run: str) -> None:
        self.kept: dict[str, Any] = {}  # nothing to go on with: a resumed run sets the same gauges again
        self.run = run

    def log(self, points: list[Point], t: float) -> None:
        for p in points:
            if p.axis == TOKENS:  # eval/loss_vs_tokens: eval/loss again, on another axis
                continue
            name, labels = series(p.name)
            _gauge(name, ("run", *sorted(labels))).set(p.value, tags={"run": self.run, **labels})

    def note(self, note: Note) -> None:
        """Events reach Prometheus as their counts (dlc_events{kind=...}), not as text."""

    def close(self, state: str) -> None:
        """The gauges live as long as the driver: Ray exports their last values until it exits."""
