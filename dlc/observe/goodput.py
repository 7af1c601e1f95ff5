"""The goodput ledger: where each learner's wall time went.

Every tick the driver files each learner's elapsed time under the bucket of its current state.
Progress that never reached the global model (pushes rejected or too stale, steps lost with a
killed process before they were pushed) is moved from `productive` to `wasted` afterwards, at
the learner's step time. Goodput = productive / allocated, where allocated is the sum of all
buckets, so the buckets add up to the wall time by construction.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

BUCKETS = (
    "productive",
    "startup",
    "dead",
    "preempted",
    "stalled",
    "rejoining",
    "waiting",
    "checkpoint",
    "wasted",
)

# Learner states (as the driver shows them) -> bucket.
STATE_BUCKET = {
    "starting": "startup",
    "training": "productive",
    "slow": "productive",
    "dead": "dead",
    "restarting": "dead",
    "leaving": "preempted",  # a preemption notice: handing its progress over
    "preempted": "preempted",  # left; its replacement starts (the driver files that time here too)
    "stalled": "stalled",
    "rejoining": "rejoining",
    "waiting": "waiting",
    "checkpointing": "checkpoint",
}


class Ledger:
    def __init__(self) -> None:
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(BUCKETS, 0.0))
        self.spare_s = 0.0  # hot spares' idle time: reserved, allocated to no learner

    def reserve(self, seconds: float) -> None:
        """File `seconds` of one hot spare's idle time."""
        self.spare_s += max(seconds, 0.0)

    def tick(self, learner: int, state: str, dt: float) -> None:
        """File `dt` seconds under the bucket of `state`; states not allocated (left, finished) are skipped."""
        bucket = STATE_BUCKET.get(state)
        if bucket is not None:
            self.seconds[learner][bucket] += dt

    def waste(self, learner: int, seconds: float) -> None:
        """Move up to `seconds` of productive time to wasted (progress that did not count)."""
        row = self.seconds[learner]
        moved = min(max(seconds, 0.0), row["productive"])
        row["productive"] -= moved
        row["wasted"] += moved

    def goodput(self, learner: int | None = None) -> float | None:
        rows = [self.seconds[learner]] if learner is not None else list(self.seconds.values())
        allocated = sum(sum(row.values()) for row in rows)
        return None if allocated <= 0 else sum(row["productive"] for row in rows) / allocated

    def summary(self) -> dict[str, Any]:
        total = dict.fromkeys(BUCKETS, 0.0)
        for row in self.seconds.values():
            for bucket, value in row.items():
                total[bucket] += value
        return {
            "goodput": _round(self.goodput()),
            "badput_s": {b: round(v, 3) for b, v in total.items() if b != "productive"},
            "productive_s": round(total["productive"], 3),
            "allocated_s": round(sum(total.values()), 3),
            # Spares are reserved hardware too: goodput counting their idle time against the run.
            "spare_s": round(self.spare_s, 3),
            "goodput_with_spares": _round(
                total["productive"] / (sum(total.values()) + self.spare_s) if sum(total.values()) > 0 else None
            ),
            "learners": {
                str(i): {"goodput": _round(self.goodput(i)), **{b: round(v, 3) for b, v in row.items()}}
                for i, row in sorted(self.seconds.items())
            },
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
