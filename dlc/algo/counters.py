"""The counters every syncer keeps of its traffic and rounds, and the status fields they render.

The decoupled syncer and the blocking baselines' barrier syncer count the same things the same
way, so the status a dashboard reads (`dlc.observe`) and the checkpoint a restarted syncer loads
name them alike whichever algorithm ran.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SyncCounters:
    """Rounds closed, contributions merged, pushes accepted, bytes each way, and when each learner last pushed."""

    rounds_closed: int = 0
    contributions: int = 0  # contributors summed over every round closed
    accepted: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    contributed: Counter[int] = field(default_factory=Counter)  # rounds each learner took part in
    last_push_at: dict[int, float] = field(default_factory=dict)  # the syncer's clock

    def pushed(self, learner: int, nbytes: int, now: float) -> None:
        """A push of `nbytes` arrived from `learner`, accepted or not."""
        self.bytes_up += nbytes
        self.last_push_at[learner] = now

    def round_closed(self, learners: Iterable[int]) -> None:
        """A round closed with one contribution from each of `learners`."""
        learners = list(learners)
        self.rounds_closed += 1
        self.contributions += len(learners)
        self.contributed.update(learners)

    def status(self, now: float) -> dict[str, Any]:
        """The status fields; learner ids as strings, as they read back from JSON."""
        rounds = self.rounds_closed
        return {
            "rounds_closed": rounds,
            "mean_contributors": round(self.contributions / rounds, 3) if rounds else 0.0,
            "pushes_accepted": self.accepted,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "contributed": {str(k): v for k, v in sorted(self.contributed.items())},
            "last_push_age_s": {str(k): round(now - t, 3) for k, t in self.last_push_at.items()},
        }

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (push times are not: a restarted syncer has heard nobody yet)."""
        return {
            "rounds_closed": self.rounds_closed,
            "contributions": self.contributions,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "accepted": self.accepted,
            "contributed": {str(k): v for k, v in self.contributed.items()},
        }

    def load(self, state: dict[str, Any]) -> None:
        """Take the counts `state` gave back; the push times stay as they are."""
        self.rounds_closed, self.contributions = state["rounds_closed"], state["contributions"]
        self.bytes_up, self.bytes_down, self.accepted = state["bytes_up"], state["bytes_down"], state["accepted"]
        self.contributed = Counter({int(k): v for k, v in state["contributed"].items()})
