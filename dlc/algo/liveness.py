"""When every syncer last heard from each learner, and the time it did not run to hear them."""

from __future__ import annotations

from collections.abc import Callable


class HeardFrom:
    """A syncer's record of each learner's last heartbeat; subclasses set `clock` and `heartbeats`."""

    clock: Callable[[], float]
    heartbeats: dict[int, float]  # learner -> when it was last heard from, on `clock`

    def excuse(self, seconds: float) -> None:
        """This syncer did not run for `seconds` (its process starved or paused): the learners'
        messages waited unread meanwhile, so nobody's silence over that time counts."""
        now = self.clock()
        for learner, heard in self.heartbeats.items():
            self.heartbeats[learner] = min(now, heard + seconds)
